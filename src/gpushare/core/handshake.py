"""The device-plugin handshake (docs/design.md, "The handshake"): which pod a kubelet Allocate call
is for, and the placement rule that makes the answer exact in any admission order.

kubelet admits a pod by calling Allocate once per GPU container and extended resource, in
``spec.containers`` order, each call with the device IDs it chose and nothing else: no pod, no
container (docs/interfaces.md, "Allocate" and Pitfalls: 13). All the device plugin learns is which
resource is called and how many units the container asks of it. A pod is matched on one resource,
its *Allocate resource* (``PendingPod.resource``: empty for ``aliyun.com/gpu-mem``, Alibaba's and
gpushare's pods; a dialect's own for the others, ``gpushare.kube.codec.dialects``). An Allocate
*step* is one call on it: a GPU container, the units kubelet passes (``Step.units``: the container's
amount of that resource, e.g. share × GPU count of memory units, or ``tencent.com/vcuda-core``) and
the answer the extender decided (the GPU indices and the share on each).

**The rule** (the extender keeps it; :func:`pin`). On one node, among the *pending* pods (bound
by the extender, not yet started by the device plugin), two pods whose first step asks the same
number of units of the same Allocate resource get the same answers, step for step: same
shares, same GPUs. A new pod whose first step asks as many units of the same resource as a
pending pod's either takes exactly that pod's GPUs (when it asks the same in every dimension
and they still fit) or waits until that pod has started. Equal pending pods are then
interchangeable, so whichever of them kubelet admits first, the answer is the one the extender
recorded for it. Pods on different resources never pin each other: the device plugin tells
them apart by the resource called.

**Matching** (the device plugin; :func:`match_allocate`), for a call asking ``units``:

1. a pod in progress (some of its steps answered: kubelet admits one pod at a time, all its
   containers in a row) whose next step asks ``units``;
2. otherwise the pending pods whose first step asks ``units``. By the rule their answers are
   identical, so any of them is right; the oldest (assume time, then name) is taken, which
   makes the choice deterministic;
3. pending pods that ask ``units`` first but were given different GPUs (the rule was bypassed:
   pins expired while kubelet was down, or another scheduler bound them) are ``AMBIGUOUS``:
   the plugin refuses rather than risk giving a container another pod's GPU. No pod asking
   ``units`` is ``NO_CANDIDATE``.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpushare.core.ask import ContainerAsk, PodAsk
from gpushare.core.fit import FitResult, FitStatus, Reason, check_fit
from gpushare.core.model import (
    GPU_COMPUTE_MILLI,
    Allocation,
    ContainerAllocation,
    ContainerRequest,
    NodeState,
    PodRequest,
)

__all__ = [
    "GPUSHARE_SCHEDULER",
    "NO_ASSIGNMENT",
    "Match",
    "MatchStatus",
    "PendingPod",
    "Pin",
    "PinStatus",
    "Step",
    "apply_pin",
    "forced_fit",
    "handshake_fit",
    "handshake_verdict",
    "match_allocate",
    "pending_pod_of",
    "pin",
    "steps_of",
    "waiting",
]


@dataclass(frozen=True, slots=True)
class Step:
    """One Allocate call of a pod: GPU container ``container`` gets ``share`` memory units on
    each of ``gpu_indices``; kubelet passes ``kubelet_units`` device IDs of the pod's Allocate
    resource (``None``: share × number of GPUs, memory units). ``compute_milli`` (thousandths
    of each GPU, 0: not asked) and ``exclusive`` (the GPUs are held whole) are the recorded
    compute, for the MPS limits."""

    container: str
    gpu_indices: tuple[int, ...]
    share: int
    compute_milli: int = 0
    exclusive: bool = False
    kubelet_units: int | None = None

    @property
    def units(self) -> int:
        """Device IDs (units) kubelet passes for this container: ``kubelet_units``, else
        ``given_units``."""
        return self.given_units if self.kubelet_units is None else self.kubelet_units

    @property
    def given_units(self) -> int:
        """Memory units the container is given: share × number of GPUs."""
        return self.share * len(self.gpu_indices)

    @property
    def answer(self) -> tuple[tuple[int, ...], int]:
        """What the container is given: (GPU indices, share per GPU)."""
        return self.gpu_indices, self.share


@dataclass(frozen=True, slots=True)
class PendingPod:
    """A pod bound to the node whose GPU containers are not all started yet.

    ``steps`` in Allocate order; ``done`` of them already answered; ``assume_time_ns`` the
    extender's ``ALIYUN_COM_GPU_MEM_ASSUME_TIME`` (nanoseconds since the Unix epoch);
    ``resource`` the pod's Allocate resource (module doc; empty: the node's memory resource).
    """

    key: str
    steps: tuple[Step, ...]
    assume_time_ns: int = 0
    done: int = 0
    resource: str = ""

    @property
    def next_step(self) -> Step | None:
        """The step kubelet asks next, or ``None`` when every step is answered."""
        return self.steps[self.done] if self.done < len(self.steps) else None

    @property
    def answers(self) -> tuple[tuple[tuple[int, ...], int], ...]:
        """Every step's answer, in order: equal for interchangeable pods."""
        return tuple(step.answer for step in self.steps)

    @property
    def first_units(self) -> int:
        """Units of the first step (0 for a pod without steps)."""
        return self.steps[0].units if self.steps else 0


def steps_of(
    allocation: Allocation, containers: Sequence[ContainerRequest | ContainerAsk]
) -> tuple[Step, ...]:
    """The steps of ``allocation`` for the pod's GPU ``containers`` (``PodRequest.
    gpu_containers`` or ``PodAsk.gpu_containers``, in spec order), each with the units kubelet
    passes for it (``allocate_units``). ``ValueError`` when the containers' names and the
    allocation's differ."""
    by_name = {c.container: c for c in allocation.containers}
    order = [c.name for c in containers]
    if sorted(by_name) != sorted(order) or len(order) != len(set(order)):
        raise ValueError(
            f"pod {allocation.pod}: GPU containers {order} do not match the allocation's "
            f"{sorted(by_name)}"
        )
    return tuple(
        Step(
            c.name,
            by_name[c.name].gpu_indices,
            by_name[c.name].gpu_share,
            by_name[c.name].compute_milli,
            by_name[c.name].exclusive,
            c.allocate_units,
        )
        for c in containers
    )


def pending_pod_of(
    allocation: Allocation, request: PodRequest | PodAsk, assume_time_ns: int, done: int = 0
) -> PendingPod:
    """The pending pod of ``request`` (the pod's request or ask) with ``allocation``
    (``steps_of``), ``done`` steps answered; its ``resource`` is the first GPU container's
    Allocate resource (a pod asks in one dialect). ``ValueError`` as ``steps_of``."""
    containers = request.gpu_containers
    resource = containers[0].allocate_resource if containers else ""
    return PendingPod(
        allocation.pod, steps_of(allocation, containers), assume_time_ns, done, resource
    )


class MatchStatus(enum.StrEnum):
    """Outcome of :func:`match_allocate`."""

    MATCHED = "matched"
    NO_CANDIDATE = "no-candidate"
    AMBIGUOUS = "ambiguous"


@dataclass(frozen=True, slots=True)
class Match:
    """Which pod and step an Allocate asking ``units`` is for (``MATCHED``), or why none.
    ``candidates`` are the pods that were pending, for the error message."""

    status: MatchStatus
    units: int
    pod: PendingPod | None = None
    step: Step | None = None
    candidates: tuple[PendingPod, ...] = ()

    def describe(self) -> str:
        """One line for people: what was asked and what was pending."""
        if self.status is MatchStatus.MATCHED and self.pod is not None and self.step:
            return (
                f"{self.units} unit(s) matched pod {self.pod.key} container "
                f"{self.step.container} (GPU {','.join(map(str, self.step.gpu_indices))})"
            )
        pending = "; ".join(_describe_pending(pod) for pod in self.candidates) or "none"
        if self.status is MatchStatus.AMBIGUOUS:
            return (
                f"{self.units} unit(s) asked, and several pending pods ask that many with "
                f"different GPUs, so the pod cannot be told apart: {pending}"
            )
        return f"no pending pod asks {self.units} unit(s) next; pending: {pending}"

    def refusal(self) -> str:
        """Why the container being admitted gets nothing, for the pod being admitted (kubelet
        puts it in that pod's status, which its owner reads): what *this* pod lacks and what
        to do, never the other pods pending on the node (other tenants': ``describe`` names
        them, for the device plugin's log). kubelet's Allocate call names no pod, so the
        text speaks of "this pod" without its name. Fixed texts, the units in them."""
        if self.status is MatchStatus.MATCHED:
            return self.describe()
        if self.status is MatchStatus.AMBIGUOUS:
            others = max(len(self.candidates) - 1, 1)
            return (
                f"this pod cannot be told apart from {others} other pending pod(s) that ask "
                f"{self.units} unit(s) first and were given other GPUs (placed without the "
                "handshake rule: by another scheduler, or after the extender's pins expired "
                "while kubelet was down); delete and recreate this pod"
            )
        return (
            f"{NO_ASSIGNMENT} for a container asking {self.units} unit(s): this pod was not "
            "placed by gpushare's scheduler extender (another scheduler placed it, or "
            "spec.nodeName was set by hand); set spec.schedulerName to the scheduler wired "
            f"to gpushare (the chart's: {GPUSHARE_SCHEDULER}) and recreate the pod"
        )


NO_ASSIGNMENT = "no GPU assignment from gpushare's scheduler"
"""The fixed part of the refusal of a pod that gpushare's extender did not place."""
GPUSHARE_SCHEDULER = "gpushare-scheduler"
"""The ``schedulerName`` of the Helm chart's second scheduler, the one wired to the extender
(``deploy/helm/gpushare``, ``scheduler.second``)."""


def _describe_pending(pod: PendingPod) -> str:
    step = pod.next_step
    if step is None:
        return f"{pod.key} (all started)"
    return (
        f"{pod.key} container {step.container} asks {step.units} on GPU "
        f"{','.join(map(str, step.gpu_indices))}"
    )


def _age_order(pod: PendingPod) -> tuple[int, str]:
    return pod.assume_time_ns, pod.key


def match_allocate(units: int, pending: Sequence[PendingPod]) -> Match:
    """The pod and step an Allocate asking ``units`` device IDs is for (module doc, "Matching").

    ``pending``: the node's pods with unanswered steps whose Allocate resource is the one
    called (the caller keeps the others out). Deterministic: the same inputs in any order give
    the same match.
    """
    candidates = tuple(sorted((p for p in pending if p.next_step is not None), key=_age_order))
    started = [p for p in candidates if p.done and p.steps[p.done].units == units]
    if started:
        pod = started[0]
        return Match(MatchStatus.MATCHED, units, pod, pod.steps[pod.done], candidates)
    fresh = [p for p in candidates if not p.done and p.steps[0].units == units]
    if not fresh:
        return Match(MatchStatus.NO_CANDIDATE, units, candidates=candidates)
    if len({p.answers for p in fresh}) > 1:
        return Match(MatchStatus.AMBIGUOUS, units, candidates=tuple(fresh))
    return Match(MatchStatus.MATCHED, units, fresh[0], fresh[0].steps[0], candidates)


class PinStatus(enum.StrEnum):
    """Outcome of :func:`pin`."""

    FREE = "free"
    FORCED = "forced"
    WAIT = "wait"


@dataclass(frozen=True, slots=True)
class Pin:
    """What the rule allows a new pod on a node: any GPUs (``FREE``), exactly ``assignment``
    (``FORCED``, the GPUs of the pending pod ``blocker``), or nothing until ``blocker`` has
    started (``WAIT``)."""

    status: PinStatus
    assignment: tuple[ContainerAllocation, ...] = ()
    blocker: PendingPod | None = None

    def describe(self) -> str:
        """Why a ``WAIT`` or ``FORCED`` pin, naming the pending pod."""
        if self.blocker is None:
            return "no pending pod asks as much first"
        return (
            f"pod {self.blocker.key}, which asks as much first, is bound here and not yet "
            f"started by the device plugin (handshake)"
        )


def pin(pod: PodRequest, pending: Sequence[PendingPod]) -> Pin:
    """The rule (module doc) for ``pod`` on a node whose pending pods are ``pending``.

    Only pods not yet started count (``done == 0``); a pod without GPU containers is ``FREE``.
    """
    containers = pod.gpu_containers
    if not containers:
        return Pin(PinStatus.FREE)
    resource, first = containers[0].allocate_resource, containers[0].allocate_units
    blockers = sorted(
        (
            p
            for p in pending
            if not p.done and p.key != pod.key and p.resource == resource
            and p.first_units == first
        ),
        key=_age_order,
    )  # fmt: skip
    if not blockers:
        return Pin(PinStatus.FREE)
    blocker = blockers[0]
    # Equal means equal in every dimension: a pod asking other memory, compute, GPUs or whole
    # GPUs than the blocker's recorded steps waits; one asking the same takes its GPUs.
    asked = tuple(_asked(c) for c in containers)
    given = tuple(_given(s) for s in blocker.steps)
    if asked != given or any(b.answers != blocker.answers for b in blockers):
        return Pin(PinStatus.WAIT, blocker=blocker)
    assignment = tuple(
        ContainerAllocation(c.name, s.gpu_indices, s.share, s.compute_milli, s.exclusive)
        for c, s in zip(containers, blocker.steps, strict=True)
    )
    return Pin(PinStatus.FORCED, assignment, blocker)


def _asked(c: ContainerRequest) -> tuple[int, int, int, bool, int]:
    """A container's ask, as ``_given`` writes a step's: whole GPUs by count alone."""
    if c.exclusive:
        return 0, c.gpu_count, 0, True, c.allocate_units
    return c.gpu_share, c.gpu_count, c.compute_milli, False, c.allocate_units


def _given(s: Step) -> tuple[int, int, int, bool, int]:
    if s.exclusive:  # the step records the GPUs' capacity and all their compute
        return 0, len(s.gpu_indices), 0, True, s.units
    return s.share, len(s.gpu_indices), s.compute_milli, False, s.units


def waiting(state: NodeState, pod: PodRequest) -> FitResult:
    """The ``DOES_NOT_FIT_NOW`` result of a ``WAIT`` pin (``Reason.HANDSHAKE``)."""
    first = pod.gpu_containers[0] if pod.gpu_containers else None
    return FitResult(
        FitStatus.DOES_NOT_FIT_NOW, Reason.HANDSHAKE, first.total if first else 0,
        state.gpu_free, state.node.capacities, first.name if first else None,
    )  # fmt: skip


def forced_fit(
    state: NodeState, pod: PodRequest, assignment: Sequence[ContainerAllocation]
) -> FitResult:
    """Whether ``pod`` fits ``state`` with exactly ``assignment``: every GPU healthy, of a model
    each container allows, with enough free memory for all the shares put on it and enough
    free compute for the compute they ask (none on a GPU held whole). ``FITS`` carries the
    assignment; otherwise ``DOES_NOT_FIT_NOW`` with the numbers of the first GPU short."""
    position = {gpu.index: p for p, gpu in enumerate(state.node.gpus)}
    allows = {c.name: c for c in pod.gpu_containers}
    needed: dict[int, int] = {}
    compute: dict[int, int] = {}
    for container in assignment:
        if container.compute_milli or container.exclusive:
            milli = GPU_COMPUTE_MILLI if container.exclusive else container.compute_milli
            for index in container.gpu_indices:
                compute[index] = compute.get(index, 0) + milli
        request = allows[container.container]
        for index in container.gpu_indices:
            p = position.get(index)
            if p is None or not request.allows_at(p, state.node.gpus[p].model):
                return FitResult(
                    FitStatus.DOES_NOT_FIT_NOW, Reason.MODEL_EXCLUDED, container.gpu_share,
                    state.gpu_free, state.node.capacities, container.container,
                )  # fmt: skip
            needed[index] = needed.get(index, 0) + container.gpu_share
    for index, amount in needed.items():
        free = state.gpu_free[position[index]]
        if amount > free:
            return FitResult(
                FitStatus.DOES_NOT_FIT_NOW, Reason.INSUFFICIENT_GPU, amount,
                state.gpu_free, state.node.capacities, available=free,
            )  # fmt: skip
    compute_free = state.gpu_compute_free if compute else ()
    for index, milli in compute.items():
        p = position[index]
        if milli > compute_free[p]:
            return FitResult(
                FitStatus.DOES_NOT_FIT_NOW, Reason.INSUFFICIENT_COMPUTE, milli,
                state.gpu_free, state.node.capacities, available=compute_free[p],
                compute_free_per_gpu=compute_free,
            )  # fmt: skip
    return FitResult(
        FitStatus.FITS, Reason.FITS, free_per_gpu=state.gpu_free,
        capacity_per_gpu=state.node.capacities, assignment=tuple(assignment),
    )  # fmt: skip


def apply_pin(state: NodeState, pod: PodRequest, result: FitResult, rule: Pin) -> FitResult:
    """``result`` (``check_fit`` of ``pod`` on ``state``) under ``rule``. Only a pod that fits
    is held by the rule: one that must wait does not fit now (``Reason.HANDSHAKE``); one pinned
    to an equal pending pod's GPUs fits only there (``FitResult.assignment`` says where), else
    ``Reason.HANDSHAKE``. A pod that does not fit anyway keeps its own reason: the rule is not
    what holds it back."""
    if not result.fits or rule.status is PinStatus.FREE:
        return result
    if rule.status is PinStatus.WAIT:
        return waiting(state, pod)
    forced = forced_fit(state, pod, rule.assignment)
    return forced if forced.fits else replace(forced, reason=Reason.HANDSHAKE)


def handshake_verdict(
    state: NodeState,
    pod: PodRequest,
    pending: Sequence[PendingPod],
    plain: FitResult | None = None,
) -> tuple[FitResult, Pin]:
    """The one verdict on ``pod`` and ``state`` (already without the pod's own allocation:
    ``NodeState.without``) under the handshake rule for the node's ``pending`` pods: the fit
    (``apply_pin`` of ``check_fit``; ``plain`` is that ``check_fit`` when the caller has it
    cached) and the rule that applied (``Pin.describe`` names the pending pod). The extender's
    filter, prioritize and bind and the inspect report all call it, so they give one reason."""
    result = plain if plain is not None else check_fit(state, pod)
    if not pending or not result.fits:
        return result, Pin(PinStatus.FREE)
    rule = pin(pod, pending)
    return apply_pin(state, pod, result, rule), rule


def handshake_fit(
    state: NodeState,
    pod: PodRequest,
    pending: Sequence[PendingPod],
    plain: FitResult | None = None,
) -> FitResult:
    """The fit of ``handshake_verdict`` alone."""
    return handshake_verdict(state, pod, pending, plain)[0]
