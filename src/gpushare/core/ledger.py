"""The ledger: which pod holds how much of which GPU, per node, committed or assumed.

A pure, synchronous book of allocations (no I/O, no threads, no global clock). The extender
derives it from the API server (docs/design.md, "Source of truth"): allocations seen on bound
pods are *committed* with ``apply``; allocations the extender has decided but not yet seen come
back are *assumed* with ``assume`` and expire ``assume_ttl_s`` seconds later unless ``apply``
confirms them.
Assumed allocations count in every free/fit computation exactly like committed ones.

The ledger guards the "no overcommit, ever" contract for GPUs, in both dimensions: an
``apply``/``assume`` that would put any GPU's memory above its capacity or its compute above one
GPU (``GPU_COMPUTE_MILLI``), take a GPU whole that holds anything, put anything on a GPU held
whole, name an unknown node or GPU index, or land new units on an unhealthy GPU is rejected,
and a rejected call leaves the ledger exactly as it was. CPU and memory
are recorded (they show in ``state``) but not enforced here: ``gpushare.core.fit.check_fit``
checks them before a decision, and kube-scheduler owns them on a cluster.

All amounts are unit-free integers in the node's own unit (docs/design.md, "Units").
Expected outcomes are ``LedgerResult`` values; exceptions are raised only for programming
errors (a malformed ``Allocation``, asking the state of a node the ledger does not know).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from gpushare.core.fit import describe_free_per_gpu
from gpushare.core.model import GPU_COMPUTE_MILLI, Allocation, Node, NodeState

__all__ = [
    "Ledger",
    "LedgerOutcome",
    "LedgerResult",
    "Violation",
    "ViolationKind",
]


class LedgerOutcome(enum.StrEnum):
    """What an ``apply``/``assume`` did; the first four are successes, the rest rejections.

    The texts are fixed; the numbers live in ``LedgerResult`` fields.
    """

    APPLIED = "applied"
    ASSUMED = "assumed"
    CONFIRMED = "assumed allocation confirmed"
    UNCHANGED = "identical allocation already recorded"
    UNKNOWN_NODE = "unknown node"
    UNKNOWN_GPU = "node has no such GPU"
    CONFLICT = "pod already holds a different allocation"
    INSUFFICIENT_GPU = "not enough free on the GPU"
    INSUFFICIENT_COMPUTE = "not enough compute free on the GPU"
    GPU_IN_USE = "GPU holds something; a whole GPU must hold nothing"
    HELD_WHOLE = "GPU is held whole by another pod"
    UNHEALTHY_GPU = "GPU is unhealthy"

    @property
    def ok(self) -> bool:
        """True for the outcomes that leave the allocation recorded."""
        return self in _SUCCESSES


_SUCCESSES = frozenset(
    {
        LedgerOutcome.APPLIED,
        LedgerOutcome.ASSUMED,
        LedgerOutcome.CONFIRMED,
        LedgerOutcome.UNCHANGED,
    }
)


@dataclass(frozen=True, slots=True)
class LedgerResult:
    """Outcome of ``Ledger.apply`` / ``Ledger.assume``.

    ``gpu_index`` is the device index of the GPU that refused (``None`` when no single GPU did);
    ``requested`` is what the allocation asked on that GPU and ``available`` what was free there
    (node units). ``free_per_gpu``/``capacity_per_gpu``, for a rejection, are the node's GPUs in
    position order (an unhealthy GPU shows 0 free), as the call found and left them; empty for
    an unknown node and for a success (the ledger records every bound pod it is handed: the
    numbers are only ever read to say why one was refused).
    ``existing`` is the allocation already recorded for the pod on ``CONFLICT``/``UNCHANGED``.
    """

    outcome: LedgerOutcome
    pod: str
    node: str
    gpu_index: int | None = None
    requested: int = 0
    available: int | None = None
    free_per_gpu: tuple[int, ...] = ()
    capacity_per_gpu: tuple[int, ...] = ()
    existing: Allocation | None = None

    @property
    def ok(self) -> bool:
        """True when the allocation is recorded (newly or already)."""
        return self.outcome.ok

    def describe(self) -> str:
        """One line for people: the outcome followed by its numbers."""
        parts = [f"pod {self.pod} on node {self.node}: {self.outcome}"]
        if self.ok:
            return parts[0]
        if self.gpu_index is not None:
            parts.append(f"GPU {self.gpu_index}")
            parts.append(f"requested {self.requested}")
        if self.available is not None:
            parts.append(f"available {self.available}")
        if self.free_per_gpu:
            parts.append(describe_free_per_gpu(self.free_per_gpu, self.capacity_per_gpu))
        return "; ".join(parts)


class ViolationKind(enum.StrEnum):
    """What ``Ledger.check_invariants`` found wrong with one GPU."""

    OVER_CAPACITY = "GPU used above its capacity"
    COMPUTE_OVER_CAPACITY = "GPU compute used above one GPU"
    WHOLE_SHARED = "GPU held whole shared with another pod"
    UNKNOWN_GPU = "allocation names a GPU the node does not have"
    UNKNOWN_NODE = "allocation names a node the ledger does not know"


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant on GPU ``gpu_index`` (device index) of ``node``.

    ``used`` sums committed and assumed units there; ``capacity`` is the GPU's capacity (0 when
    the GPU or node is unknown); for ``COMPUTE_OVER_CAPACITY`` both are ``compute_milli`` (the
    capacity ``GPU_COMPUTE_MILLI``). ``pods`` are the pods with units on that GPU, sorted.
    """

    kind: ViolationKind
    node: str
    gpu_index: int
    used: int
    capacity: int
    pods: tuple[str, ...]


@dataclass(slots=True)
class _Entry:
    allocation: Allocation
    expires_at: float | None  # None: committed; else clock() value at which it expires


@dataclass(slots=True)
class _NodeBook:
    node: Node | None
    entries: dict[str, _Entry]
    gpu_used: dict[int, int]  # by device index, committed + assumed
    cpu_used_milli: int = 0
    memory_used_mib: int = 0
    gpu_compute_used: dict[int, int] = field(default_factory=dict)  # by device index
    whole_holders: dict[int, int] = field(default_factory=dict)  # by device index: how many


class Ledger:
    """GPU allocations per node, committed or assumed; see the module docstring.

    ``clock`` returns seconds (monotonic is best; only differences matter);
    ``assume_ttl_s`` is how long an assumed allocation lives unless confirmed (>= 0).
    Not thread-safe: callers serialise access (the extender holds one lock around it).
    """

    def __init__(self, clock: Callable[[], float], assume_ttl_s: float) -> None:
        if assume_ttl_s < 0:
            raise ValueError(f"assume_ttl_s must be >= 0, got {assume_ttl_s}")
        self._clock = clock
        self._assume_ttl_s = assume_ttl_s
        self._books: dict[str, _NodeBook] = {}
        self._pods: dict[str, str] = {}  # pod key -> node name

    # -- nodes -------------------------------------------------------------------------------

    def upsert_node(self, node: Node) -> None:
        """Add ``node`` or replace its description (GPUs, health, capacity, CPU, memory).

        Allocations already recorded on the node stay recorded, even on GPUs that became
        unhealthy or disappeared (``check_invariants`` reports the latter).
        """
        book = self._books.get(node.name)
        if book is None:
            self._books[node.name] = _NodeBook(node=node, entries={}, gpu_used={})
        else:
            book.node = node

    def remove_node(self, name: str) -> None:
        """Forget node ``name``'s description; its allocations stay recorded until released.

        Keeping them means a node that comes back under the same name still counts them.
        Removing an unknown node does nothing.
        """
        book = self._books.get(name)
        if book is None:
            return
        if book.entries:
            book.node = None
        else:
            del self._books[name]

    def node_names(self) -> tuple[str, ...]:
        """Names of the nodes the ledger knows (described by ``upsert_node``), sorted."""
        return tuple(sorted(name for name, book in self._books.items() if book.node is not None))

    # -- recording ---------------------------------------------------------------------------

    def apply(self, allocation: Allocation, *, allow_unhealthy: bool = False) -> LedgerResult:
        """Record ``allocation`` as committed (the pod is seen bound with it).

        Outcomes: ``APPLIED`` (new), ``CONFIRMED`` (it was assumed, now committed; counted once),
        ``UNCHANGED`` (already committed, identical), or a rejection: ``CONFLICT`` (the pod holds
        a different allocation), ``UNKNOWN_NODE``, ``UNKNOWN_GPU``, ``UNHEALTHY_GPU``,
        ``INSUFFICIENT_GPU`` (some GPU would go above capacity). A rejection changes nothing.

        ``allow_unhealthy`` admits new units on unhealthy GPUs (capacity still enforced): for
        rebuilding from pods that already run there. Raises ``ValueError`` when ``allocation``
        is malformed (negative amounts, a GPU index twice in one container).
        """
        return self._record(allocation, assumed=False, allow_unhealthy=allow_unhealthy)

    def assume(self, allocation: Allocation) -> LedgerResult:
        """Record ``allocation`` as assumed, expiring at ``clock() + assume_ttl_s``.

        Outcomes: ``ASSUMED``, ``UNCHANGED`` (the identical allocation is already recorded,
        assumed or committed; its state and deadline are kept), or the rejections of ``apply``.
        Raises ``ValueError`` when ``allocation`` is malformed.
        """
        return self._record(allocation, assumed=True, allow_unhealthy=False)

    def release(self, pod_key: str) -> Allocation | None:
        """Drop pod ``pod_key``'s allocation, assumed or committed; ``None`` when it has none."""
        node_name = self._pods.get(pod_key)
        if node_name is None:
            return None
        return self._drop(pod_key, node_name)

    def expire(self) -> list[Allocation]:
        """Drop the assumed allocations whose deadline ``clock()`` has reached.

        Returns them, earliest deadline first (pod key on ties). Committed ones never expire.
        """
        now = self._clock()
        due = sorted(
            (entry.expires_at, pod)
            for book in self._books.values()
            for pod, entry in book.entries.items()
            if entry.expires_at is not None and entry.expires_at <= now
        )
        return [self._drop(pod, self._pods[pod]) for _, pod in due]

    # -- reading -----------------------------------------------------------------------------

    def state(self, node_name: str) -> NodeState:
        """The node with everything recorded on it (committed + assumed).

        ``gpu_used`` is per GPU position of the node; units on GPU indices the node no longer
        has are left out (``check_invariants`` reports them). Raises ``KeyError`` for a node the
        ledger does not know.
        """
        book = self._books.get(node_name)
        if book is None or book.node is None:
            raise KeyError(f"ledger knows no node {node_name!r}")
        node = book.node
        compute, whole = book.gpu_compute_used, book.whole_holders
        return NodeState(
            node=node,
            gpu_used=tuple(book.gpu_used.get(gpu.index, 0) for gpu in node.gpus),
            cpu_used_milli=book.cpu_used_milli,
            memory_used_mib=book.memory_used_mib,
            gpu_compute_used=tuple(compute.get(g.index, 0) for g in node.gpus) if compute else (),
            gpu_whole=tuple(g.index in whole for g in node.gpus) if whole else (),
        )

    def units_off_node(self, node_name: str) -> int:
        """Units recorded on GPU indices that node ``node_name`` no longer has (it shrank under
        them; ``check_invariants`` reports them); 0 for a node with none, known or not. From
        the running totals: O(GPUs), not O(allocations)."""
        book = self._books.get(node_name)
        if book is None or not book.gpu_used:
            return 0
        gpus = book.node.gpus if book.node is not None else ()
        return sum(book.gpu_used.values()) - sum(book.gpu_used.get(g.index, 0) for g in gpus)

    def allocations(self, node_name: str) -> tuple[Allocation, ...]:
        """Allocations recorded on ``node_name`` (committed + assumed), sorted by pod key.

        Empty for a node with none, known or not.
        """
        book = self._books.get(node_name)
        if book is None:
            return ()
        return tuple(book.entries[pod].allocation for pod in sorted(book.entries))

    def allocation(self, pod_key: str) -> Allocation | None:
        """Pod ``pod_key``'s allocation, assumed or committed, or ``None``."""
        entry = self._entry(pod_key)
        return None if entry is None else entry.allocation

    def is_assumed(self, pod_key: str) -> bool:
        """True when pod ``pod_key`` holds an assumed (not yet confirmed) allocation."""
        entry = self._entry(pod_key)
        return entry is not None and entry.expires_at is not None

    def expires_at(self, pod_key: str) -> float | None:
        """The clock value at which pod ``pod_key``'s assumed allocation expires, else ``None``."""
        entry = self._entry(pod_key)
        return None if entry is None else entry.expires_at

    def check_invariants(self) -> list[Violation]:
        """Every broken invariant, sorted by node and GPU index; empty when all is well.

        Checked: each GPU's used sum (committed + assumed) is at most its capacity, and its
        compute at most one GPU; a GPU held whole holds no other pod; allocations name only GPU
        indices of known nodes. Recomputed from the entries, not the running totals that
        ``apply``/``assume`` check, so a bug in those shows here. Allocations can otherwise
        break only the capacity and index checks, when a node shrinks or disappears under them
        (``upsert_node``/``remove_node``).
        """
        violations: list[Violation] = []
        for node_name in sorted(self._books):
            book = self._books[node_name]
            # Recomputed from the entries, independently of the running totals.
            used: dict[int, int] = {}
            compute: dict[int, int] = {}
            whole: set[int] = set()
            pods_on: dict[int, list[str]] = {}
            holding: dict[int, int] = {}  # pods that hold something there (memory, compute)
            for pod, entry in book.entries.items():
                per_gpu_compute = entry.allocation.per_gpu_compute()
                for index, amount in entry.allocation.per_gpu().items():
                    used[index] = used.get(index, 0) + amount
                    pods_on.setdefault(index, []).append(pod)
                    if amount or per_gpu_compute.get(index):
                        holding[index] = holding.get(index, 0) + 1
                for index, amount in per_gpu_compute.items():
                    compute[index] = compute.get(index, 0) + amount
                whole |= entry.allocation.whole_gpus()
            capacities = {} if book.node is None else {g.index: g.capacity for g in book.node.gpus}
            for index in sorted(used):
                broken: list[tuple[ViolationKind, int, int]] = []  # (kind, used, capacity)
                if book.node is None:
                    broken.append((ViolationKind.UNKNOWN_NODE, used[index], 0))
                elif index not in capacities:
                    broken.append((ViolationKind.UNKNOWN_GPU, used[index], 0))
                else:
                    if used[index] > capacities[index]:
                        broken.append((ViolationKind.OVER_CAPACITY, used[index], capacities[index]))
                    if compute.get(index, 0) > GPU_COMPUTE_MILLI:
                        broken.append(
                            (ViolationKind.COMPUTE_OVER_CAPACITY, compute[index], GPU_COMPUTE_MILLI)
                        )
                    if index in whole and holding.get(index, 0) > 1:
                        broken.append((ViolationKind.WHOLE_SHARED, used[index], capacities[index]))
                pods = tuple(sorted(pods_on[index]))
                violations.extend(
                    Violation(kind, node_name, index, amount, capacity, pods)
                    for kind, amount, capacity in broken
                )
        return violations

    # -- internals ---------------------------------------------------------------------------

    def _entry(self, pod_key: str) -> _Entry | None:
        node_name = self._pods.get(pod_key)
        if node_name is None:
            return None
        return self._books[node_name].entries[pod_key]

    def _record(
        self, allocation: Allocation, *, assumed: bool, allow_unhealthy: bool
    ) -> LedgerResult:
        _validate(allocation)
        existing = self._entry(allocation.pod)
        book = self._books.get(allocation.node)
        if existing is not None:
            if existing.allocation != allocation:
                return _refusal(LedgerOutcome.CONFLICT, allocation, book, existing=existing)
            if assumed or existing.expires_at is None:
                return _success(LedgerOutcome.UNCHANGED, allocation, existing)
            existing.expires_at = None
            return _success(LedgerOutcome.CONFIRMED, allocation, existing)
        node = None if book is None else book.node
        if book is None or node is None:
            return _refusal(LedgerOutcome.UNKNOWN_NODE, allocation, book)
        gpus = node.by_index
        amounts = allocation.per_gpu()
        per_gpu = sorted(amounts.items()) if len(amounts) > 1 else list(amounts.items())
        for index, amount in per_gpu:
            if index not in gpus:
                return _refusal(LedgerOutcome.UNKNOWN_GPU, allocation, book, index, amount)
        compute = allocation.per_gpu_compute()
        whole = allocation.whole_gpus()
        for index, amount in per_gpu:
            gpu = gpus[index]
            used = book.gpu_used.get(index, 0)
            compute_used = book.gpu_compute_used.get(index, 0)
            asked = compute.get(index, 0) if compute else 0
            if not gpu.healthy and not allow_unhealthy:
                return _refusal(LedgerOutcome.UNHEALTHY_GPU, allocation, book, index, amount, 0)
            if book.whole_holders.get(index):
                return _refusal(LedgerOutcome.HELD_WHOLE, allocation, book, index, amount, 0)
            free = gpu.capacity - used
            if index in whole and (used or compute_used):
                return _refusal(LedgerOutcome.GPU_IN_USE, allocation, book, index, amount, free)
            if amount > free:
                return _refusal(
                    LedgerOutcome.INSUFFICIENT_GPU, allocation, book, index, amount, free
                )
            if asked > GPU_COMPUTE_MILLI - compute_used:
                return _refusal(
                    LedgerOutcome.INSUFFICIENT_COMPUTE, allocation, book, index, asked,
                    GPU_COMPUTE_MILLI - compute_used,
                )  # fmt: skip
        expires_at = self._clock() + self._assume_ttl_s if assumed else None
        book.entries[allocation.pod] = _Entry(allocation, expires_at)
        self._pods[allocation.pod] = allocation.node
        _add(book.gpu_used, amounts, 1)  # _count, with what was computed above
        if compute:
            _add(book.gpu_compute_used, compute, 1)
        if whole:
            _add(book.whole_holders, dict.fromkeys(whole, 1), 1)
        book.cpu_used_milli += allocation.cpu_milli
        book.memory_used_mib += allocation.memory_mib
        outcome = LedgerOutcome.ASSUMED if assumed else LedgerOutcome.APPLIED
        return _success(outcome, allocation, None)

    def _drop(self, pod_key: str, node_name: str) -> Allocation:
        del self._pods[pod_key]
        book = self._books[node_name]
        entry = book.entries.pop(pod_key)
        self._count(book, entry.allocation, -1)
        if book.node is None and not book.entries:
            del self._books[node_name]
        return entry.allocation

    def _count(self, book: _NodeBook, allocation: Allocation, sign: int) -> None:
        _add(book.gpu_used, allocation.per_gpu(), sign)
        _add(book.gpu_compute_used, allocation.per_gpu_compute(), sign)
        _add(book.whole_holders, dict.fromkeys(allocation.whole_gpus(), 1), sign)
        book.cpu_used_milli += sign * allocation.cpu_milli
        book.memory_used_mib += sign * allocation.memory_mib


def _success(
    outcome: LedgerOutcome, allocation: Allocation, existing: _Entry | None
) -> LedgerResult:
    """The ``LedgerResult`` of a call that left ``allocation`` recorded."""
    held = None if existing is None else existing.allocation
    return LedgerResult(outcome, allocation.pod, allocation.node, existing=held)


def _refusal(  # noqa: PLR0917 (one call per refusal of _record, all positional)
    outcome: LedgerOutcome,
    allocation: Allocation,
    book: _NodeBook | None,
    gpu_index: int | None = None,
    requested: int = 0,
    available: int | None = None,
    existing: _Entry | None = None,
) -> LedgerResult:
    """The ``LedgerResult`` of a call that refused ``allocation``, with the node's free and
    capacity per GPU as the call found and left them (``book``: the node's book, if any)."""
    free: tuple[int, ...] = ()
    capacity: tuple[int, ...] = ()
    node = None if book is None else book.node
    if book is not None and node is not None:
        units, holders = book.gpu_used, book.whole_holders
        free = tuple(  # NodeState.gpu_free, without building one
            gpu.capacity - units.get(gpu.index, 0)
            if gpu.healthy and (not holders or gpu.index not in holders)
            else 0
            for gpu in node.gpus
        )
        capacity = node.capacities
    held = None if existing is None else existing.allocation
    return LedgerResult(
        outcome, allocation.pod, allocation.node, gpu_index, requested, available, free,
        capacity, held,
    )  # fmt: skip


def _add(totals: dict[int, int], amounts: dict[int, int], sign: int) -> None:
    """``totals`` (by GPU index) plus ``sign`` × ``amounts``; zero totals are dropped."""
    for index, amount in amounts.items():
        total = totals.get(index, 0) + sign * amount
        if total:
            totals[index] = total
        else:
            totals.pop(index, None)


def _validate(allocation: Allocation) -> None:
    """Raise ``ValueError`` for an allocation no correct caller builds."""
    problems: list[str] = []
    if allocation.cpu_milli < 0 or allocation.memory_mib < 0:
        problems.append(
            f"negative cpu_milli {allocation.cpu_milli} or memory_mib {allocation.memory_mib}"
        )
    for container in allocation.containers:
        if container.gpu_share < 0:
            problems.append(f"container {container.container}: gpu_share {container.gpu_share}")
        if not 0 <= container.compute_milli <= GPU_COMPUTE_MILLI:
            problems.append(
                f"container {container.container}: compute_milli {container.compute_milli}"
            )
        if len(set(container.gpu_indices)) != len(container.gpu_indices):
            problems.append(
                f"container {container.container}: GPU index repeated in {container.gpu_indices}"
            )
        if any(index < 0 for index in container.gpu_indices):
            problems.append(
                f"container {container.container}: negative GPU index in {container.gpu_indices}"
            )
    if problems:
        raise ValueError(
            f"malformed allocation for pod {allocation.pod} on node {allocation.node}: "
            + "; ".join(problems)
        )
