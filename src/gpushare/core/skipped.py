"""Skipped pods: what a bound pod holds when its allocation cannot be recorded. Pure; no I/O.

A pod bound to a node holds *something* there even when its allocation cannot be recorded as
it is, so its GPUs are never taken as free on a guess. The extender
(``ExtenderState``: its ledger refused or could not read the allocation) and the inspect report
(``gpushare.inspect.report``, read from a snapshot of pods) both charge such a pod with this
module's rule, so ``kubectl inspect gpushare`` gives the extender's verdict for the pods that
wait behind it (``tests/test_inspect_agreement.py``):

=====================================  ============================================================
the pod's allocation                   what it is charged with
=====================================  ============================================================
cannot be read (``CodecError``: e.g.   the **whole node** (``unreadable``): every GPU is charged
``ALIYUN_COM_GPU_MEM_POD`` negative    the largest capacity of the node, so the node takes no new
or not a number, garbage JSON)         GPU pods until the pod is fixed, finishes or goes (which
                                       GPU and how much are unknown)
names a GPU index the node lacks       its amount on **every** GPU of the node (it may be on any;
(index 7 on a 2-GPU node)              ``refused``)
does not fit (50 GiB on a 40 GiB       its amounts on the GPUs it names (``refused``): the GPU is
GPU, or a GPU already full)            then over capacity, free is negative and it takes no pods
=====================================  ============================================================

The compute a refused allocation records (``compute_milli``, 1000 for a GPU held whole) is
charged the same way as its memory (``compute_charges``): on the GPUs it names, or on every GPU
for an index the node lacks; so no compute share is placed above 1000 beside a skipped pod.
A whole-node block needs no compute: no GPU of the node has memory free.

Units a *recorded* allocation holds on a GPU index the node no longer has (the node shrank
under it) are charged to every GPU too (``charged``). Amounts are in the node's unit.

Which bound pods are recorded is the ledger's to say (``gpushare.core.ledger.Ledger.apply``,
unhealthy GPUs allowed: a bound pod holds them whatever their health); ``record_bound`` is
that rule for one pod, and ``refused_by`` turns the ledger's refusal into the skipped pod:
the extender's watch and the inspect report both count with them.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace

from gpushare.core.ledger import Ledger, LedgerResult
from gpushare.core.model import Allocation, Node, NodeState

__all__ = [
    "SkipKind",
    "SkippedPod",
    "charged",
    "held",
    "record_bound",
    "refused",
    "refused_by",
    "unreadable",
]


class SkipKind(enum.StrEnum):
    """Why a bound pod's allocation is not recorded (module doc)."""

    UNREADABLE = "allocation cannot be read"
    UNKNOWN_GPU = "allocation names a GPU the node does not have"
    OVER_CAPACITY = "allocation does not fit the GPU"


@dataclass(frozen=True, slots=True)
class SkippedPod:
    """A pod bound to ``node`` whose allocation is not recorded (``kind``, ``reason``: one line
    naming the values). ``charges`` are the units it is counted with, by GPU device index (node
    unit); ``whole_node``: it blocks every GPU of the node instead."""

    pod: str
    node: str
    kind: SkipKind
    reason: str
    charges: tuple[tuple[int, int], ...] = ()
    whole_node: bool = False
    missing: tuple[tuple[int, int], ...] = ()
    """(GPU index, units) the allocation names that the node does not have."""
    compute_charges: tuple[tuple[int, int], ...] = ()
    """(GPU index, compute_milli) it is counted with besides (module doc)."""

    def describe(self) -> str:
        """``pod ns/p on node n: <kind>: <reason>; counted as <charges>`` (with ``, <n>
        compute_milli on GPU <i>`` for its compute)."""
        if self.whole_node:
            held = "every GPU of the node blocked"
        else:
            held = ", ".join(
                [f"{amount} on GPU {index}" for index, amount in self.charges]
                + [f"{milli} compute_milli on GPU {i}" for i, milli in self.compute_charges]
            )
        return f"pod {self.pod} on node {self.node}: {self.kind}: {self.reason}; counted as {held}"


def unreadable(pod: str, node: str, reason: str) -> SkippedPod:
    """Pod ``pod`` (``namespace/name``) bound to ``node`` whose allocation cannot be read:
    it blocks the whole node. ``reason`` is the decoder's one-line error; a leading
    ``"pod <pod>: "`` is dropped (the description names the pod)."""
    line = " ".join(reason.split()).removeprefix(f"pod {pod}: ")
    return SkippedPod(pod, node, SkipKind.UNREADABLE, line, whole_node=True)


def refused(allocation: Allocation, node: Node, reason: str) -> SkippedPod:
    """``allocation`` (of a pod bound to ``node``) that cannot be recorded as it is: its
    amounts on GPU indices ``node`` has are charged there, those on indices it lacks to every
    GPU of the node (``missing`` names them). ``kind`` is ``UNKNOWN_GPU`` when an index is
    missing, else ``OVER_CAPACITY``; ``reason`` says why, with the numbers."""
    indices = [gpu.index for gpu in node.gpus]
    per_gpu = allocation.per_gpu()
    missing = tuple(sorted((i, a) for i, a in per_gpu.items() if i not in indices))
    kind = SkipKind.UNKNOWN_GPU if missing else SkipKind.OVER_CAPACITY
    return SkippedPod(
        allocation.pod,
        allocation.node,
        kind,
        reason,
        _spread(per_gpu, indices),
        missing=missing,
        compute_charges=_spread(allocation.per_gpu_compute(), indices),
    )


def refused_by(allocation: Allocation, node: Node, result: LedgerResult) -> SkippedPod:
    """``refused`` with the ledger's rejection ``result`` of ``allocation`` as the reason (its
    ``describe`` without the leading ``pod ... on node ...:``)."""
    reason = result.describe().partition(f" on node {allocation.node}: ")[2]
    return refused(allocation, node, reason)


def record_bound(ledger: Ledger, allocation: Allocation, node: Node) -> SkippedPod | None:
    """Record the ``allocation`` of a pod bound to ``node`` in ``ledger`` (which knows the
    node): ``Ledger.apply`` with unhealthy GPUs allowed; ``None`` when recorded, else the
    skipped pod it is charged as (``refused_by``; the ledger unchanged)."""
    result = ledger.apply(allocation, allow_unhealthy=True)
    return None if result.ok else refused_by(allocation, node, result)


def _spread(amounts: dict[int, int], indices: list[int]) -> tuple[tuple[int, int], ...]:
    """``amounts`` by GPU index, charged on that GPU when the node has it, else on every GPU
    of the node (``indices``: it may be on any); the non-zero charges in index order."""
    charges = dict.fromkeys(indices, 0)
    for index, amount in amounts.items():
        for target in [index] if index in charges else indices:
            charges[target] += amount
    return tuple((i, a) for i, a in charges.items() if a)


def held(node: Node, skipped: Iterable[SkippedPod], *, compute: bool = False) -> tuple[int, ...]:
    """Units ``skipped`` pods are charged with on each GPU of ``node`` (position order), or
    with ``compute`` their ``compute_milli``; whole-node blocks are left out (they are not
    memory: ``charged`` counts them)."""
    totals = {gpu.index: 0 for gpu in node.gpus}
    for pod in skipped:
        for index, amount in pod.compute_charges if compute else pod.charges:
            if index in totals:
                totals[index] += amount
    return tuple(totals[gpu.index] for gpu in node.gpus)


def charged(state: NodeState, skipped: Iterable[SkippedPod], units_off_node: int = 0) -> NodeState:
    """``state`` plus what the ``skipped`` pods of its node are charged with (module doc):
    their ``charges`` and ``compute_charges``, the ``units_off_node`` that recorded
    allocations (those counted in ``state``) hold on GPU indices the node lacks
    (``Ledger.units_off_node``) on every GPU, and for a whole-node block the largest GPU
    capacity on every GPU; the compute held and the GPUs held whole stay counted. ``state``
    itself when nothing is charged."""
    pods = list(skipped)
    if not pods and not units_off_node:
        return state  # the common case, on every node state rebuilt: nothing to add
    gpus = state.node.gpus
    extra = held(state.node, pods)
    compute = held(state.node, pods, compute=True)
    everywhere = units_off_node
    if any(pod.whole_node for pod in pods):
        everywhere += max((gpu.capacity for gpu in gpus), default=0)
    if not everywhere and not any(extra) and not any(compute):
        return state
    used = tuple(u + e + everywhere for u, e in zip(state.gpu_used, extra, strict=True))
    if not any(compute):
        return replace(state, gpu_used=used)  # every other field kept, whatever it gains
    compute_used = tuple(u + c for u, c in zip(state.gpu_compute_used, compute, strict=True))
    return replace(state, gpu_used=used, gpu_compute_used=compute_used)
