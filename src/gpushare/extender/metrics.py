"""The extender's Prometheus metrics (``GET /metrics``), on an explicit ``CollectorRegistry``.

Series (Prometheus naming: snake case, ``_total`` counters, units in the names):

===========================================  =========  =================  =========================
series                                       type       labels             meaning
===========================================  =========  =================  =========================
gpushare_extender_requests_total             counter    verb, outcome      requests handled: verb
                                                                           filter / prioritize /
                                                                           bind / preempt /
                                                                           dra_prioritize;
                                                                           outcome ok, held
                                                                           (a filter waiting on the
                                                                           handshake rule), error
                                                                           (another Error text or
                                                                           a 5xx), bad_request
                                                                           (400),
                                                                           unauthenticated (401:
                                                                           no client
                                                                           certificate);
                                                                           with leader election
                                                                           forwarded (to the
                                                                           leader), refused (no
                                                                           leader to forward to)
gpushare_extender_request_duration_seconds   histogram  verb               handling time, 0.5 ms to
                                                                           10 s buckets
gpushare_gpu_memory_capacity_bytes           gauge      node, gpu, model   the GPU's memory
gpushare_gpu_memory_allocated_bytes          gauge      node, gpu, model   allocated on the GPU:
                                                                           committed + assumed
gpushare_gpu_memory_pending_bytes            gauge      node, gpu, model   part of it held by
                                                                           starting pods: bound,
                                                                           not yet started by the
                                                                           device plugin
gpushare_gpu_healthy                         gauge      node, gpu, model   1 healthy, 0 takes no
                                                                           new pods
gpushare_gpu_pods                            gauge      node, gpu, model   pods holding memory on
                                                                           the GPU
gpushare_gpu_compute_allocated_ratio         gauge      node, gpu, model   compute allocated on the
                                                                           GPU, in GPUs (0 to 1):
                                                                           committed + assumed
gpushare_gpu_held_whole                      gauge      node, gpu, model   1 when a pod holds the
                                                                           GPU whole, else 0
gpushare_extender_synced                     gauge                         1 once the caches synced
gpushare_extender_skipped_pods               gauge      node, kind         bound pods the ledger
                                                                           could not record, now
gpushare_extender_skipped_pods_recorded      counter    kind               times a pod was skipped
_total                                                                     (anew or changed)
===========================================  =========  =================  =========================

``kind`` is ``SkipKind``'s text (``allocation cannot be read``, ``allocation names a GPU the
node does not have``, ``allocation does not fit the GPU``); skipped pods are counted on their
node conservatively (``gpushare.extender.state``, "Skipped pods") and their charges are part
of ``gpushare_gpu_memory_allocated_bytes``; a whole-node block is not (it is no memory).

``gpu`` is the device index on the node, ``model`` the product name (``""`` when unknown). Only
GPU-share nodes (``NodeInfo.gpushare``) are exported.

**Bytes.** The ledger counts in the node's unit (``NodeInfo.unit``); the gauges convert: ``GiB``
is 2^30 bytes, ``MiB`` 2^20. A node without a unit (Alibaba's fallback, capacity only, no
``gpushare.io/gpu-inventory``) is taken to count in **GiB**, the default unit of Alibaba's
device plugin and of gpushare's: a ``MiB`` node publishing no inventory is over-reported 1024
times, which the device plugin's own ``gpushare_device_plugin_gpu_memory_capacity_bytes`` shows.

**Compute and whole GPUs** (docs/compute.md). ``gpushare_gpu_compute_allocated_ratio`` is the
ledger's ``compute_milli`` on the GPU over 1,000 (``GPU_COMPUTE_MILLI``): 0.5 for a
``tencent.com/vcuda-core: 50`` pod, 1 for a GPU held whole; pods that ask no compute (every
``aliyun.com/gpu-mem`` pod) add nothing, so a cluster of Alibaba pods reads 0 everywhere.
``gpushare_gpu_held_whole`` is 1 on a GPU a whole-GPU container holds (Tencent ``vcuda-core``
≥ 100, HAMi ``gpucores: 100``, ``gpushare.io/exclusive``); per node,
``sum by (node) (gpushare_gpu_held_whole)``. Such a GPU also reads its whole memory in
``gpushare_gpu_memory_allocated_bytes``. The compute gauge is the ledger's: a skipped pod's
compute charge (``gpushare.core.skipped``) is in the fit, not in the gauge.

**Starting** (the series keeps its name). ``gpushare_gpu_memory_pending_bytes`` is the memory
of *starting* pods (``kubectl inspect gpushare``'s ``STATE`` ``starting``;
Alibaba's "assumed, not assigned"): the GPU containers of pods bound to the node that the
device plugin has not answered yet (``ALIYUN_COM_GPU_MEM_ASSIGNED`` not ``"true"``), from
``Reservations.pending(node)``. It counts only pods within the handshake timeout
(``handshake_timeout_s``; always 0 with the pin rule off); a pod stuck longer is still in
``allocated``. It is *not* the ledger's *assumed* (bound by this extender, not yet seen bound
by its watch: "committed + assumed" above), which lasts milliseconds and is not exported on its
own.

The per-GPU gauges and ``synced`` are computed at scrape time from the ``ExtenderState`` (its
ledger), so nothing has to be kept in sync by hand. No global default registry is used: each
``ExtenderMetrics`` owns (or is given) its registry.

**At scale** (5,000 nodes × 8 GPUs is 280,000 per-GPU samples) the per-GPU gauges are
not built as prometheus-client metric objects on every scrape, which took 2.2–3.1 s on the event
loop and stalled filter. ``GpuSeries`` keeps each node's sample lines, in prometheus-client's
text format (labels sorted, values by its ``floatToGoString``), and renders a node again only
when its ``ExtenderState.version`` changed; a scrape joins the kept lines. A pending pod past the
handshake timeout leaves ``gpushare_gpu_memory_pending_bytes`` at the next ``expire`` (which
bumps the node), not at the exact second. The request, sync and skipped-pod series stay
prometheus-client's (``StateCollector``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from gpushare.core.model import GPU_COMPUTE_MILLI, Gpu
from gpushare.core.skipped import SkipKind
from gpushare.extender.state import ExtenderState
from gpushare.kube.codec import MemoryUnit, NodeInfo

__all__ = [
    "DRA_VERB",
    "DURATION_BUCKETS",
    "OUTCOMES",
    "VERBS",
    "ExtenderMetrics",
    "GpuSeries",
    "StateCollector",
    "gpu_samples",
    "unit_bytes",
]

DRA_VERB = "dra_prioritize"
"""The verb label of ``P/dra/prioritize`` (``gpushare.extender.dra``)."""
VERBS = ("filter", "prioritize", "bind", "preempt", DRA_VERB)
OUTCOMES = ("ok", "error", "bad_request")
# Handling is sub-millisecond to tens of milliseconds (1,000 nodes x 8 GPUs); bind waits on the
# API server, hence the long tail.
DURATION_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


def unit_bytes(unit: MemoryUnit | None) -> int:
    """Bytes in one of the node's units (``NodeInfo.unit``); GiB when the unit is unknown
    (module doc)."""
    return (unit or MemoryUnit.GIB).mib * 2**20


GPU_FAMILIES: tuple[tuple[str, str], ...] = (
    ("gpushare_gpu_memory_capacity_bytes", "GPU memory of a shared GPU, in bytes."),
    (
        "gpushare_gpu_memory_allocated_bytes",
        "GPU memory allocated on a shared GPU, in bytes: committed (seen bound) and assumed "
        "(just bound by the extender, not yet seen bound).",
    ),
    (
        "gpushare_gpu_memory_pending_bytes",
        "GPU memory held by starting pods on a shared GPU (bound, not yet started by the device "
        "plugin; kubectl inspect gpushare STATE starting), in bytes.",
    ),
    ("gpushare_gpu_healthy", "1 when a shared GPU is healthy, 0 when it takes no new pods."),
    ("gpushare_gpu_pods", "Pods holding an allocation on a shared GPU."),
    (
        "gpushare_gpu_compute_allocated_ratio",
        "Compute allocated on a shared GPU, in GPUs (0 to 1): committed (seen bound) and "
        "assumed (just bound by the extender, not yet seen bound).",
    ),
    ("gpushare_gpu_held_whole", "1 when a pod holds a shared GPU whole, else 0."),
)
"""The per-GPU gauges (name, help), labelled ``node``, ``gpu``, ``model``, in exposition order."""


_value_text: Callable[[float], str] = floatToGoString
"""A sample value as prometheus-client writes it (``+Inf``, Go's exponent form)."""


def _label(value: str) -> str:
    """A label value escaped as the text format wants it (backslash, quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class GpuSeries:
    """The per-GPU gauges of ``GPU_FAMILIES`` as exposition text, each node's lines kept until
    its ``ExtenderState.version`` changes (module doc, "At scale")."""

    def __init__(self, state: ExtenderState) -> None:
        self._state = state
        self._lines: dict[str, tuple[int, tuple[str, ...]]] = {}
        self.renders = 0
        """Node renders so far (a scrape renders only the nodes that changed)."""

    def exposition(self) -> str:
        """Every family's ``# HELP``/``# TYPE`` and the samples of every GPU-share node (in node
        name order); nodes gone since the last call are forgotten."""
        state = self._state
        kept: dict[str, tuple[int, tuple[str, ...]]] = {}
        parts: list[list[str]] = [[] for _ in GPU_FAMILIES]
        for info in state.cluster.nodes():
            if not info.gpushare:
                continue
            name = info.node.name
            version = state.cluster.version(name)
            lines = self._lines.get(name)
            if lines is None or lines[0] != version:
                lines = (version, self._render(info))
                self.renders += 1
            kept[name] = lines
            for family, text in zip(parts, lines[1], strict=True):
                family.append(text)
        self._lines = kept
        out: list[str] = []
        for (name, text), samples in zip(GPU_FAMILIES, parts, strict=True):
            out.append(f"# HELP {name} {text}\n# TYPE {name} gauge\n")
            out.extend(samples)
        return "".join(out)

    def _render(self, info: NodeInfo) -> tuple[str, ...]:
        """One node's sample lines, one string per family."""
        lines: list[list[str]] = [[] for _ in GPU_FAMILIES]
        node_label = _label(info.node.name)
        for gpu, values in gpu_samples(self._state, info):
            model = _label(gpu.model or "")
            labels = f'{{gpu="{gpu.index}",model="{model}",node="{node_label}"}} '
            for family, (name, _), value in zip(lines, GPU_FAMILIES, values, strict=True):
                family.append(f"{name}{labels}{_value_text(value)}\n")
        return tuple("".join(family) for family in lines)


def gpu_samples(state: ExtenderState, info: NodeInfo) -> list[tuple[Gpu, tuple[float, ...]]]:
    """Each GPU of node ``info`` with its values of ``GPU_FAMILIES``, in that order: capacity
    and allocated bytes (the skipped pods' charges in), pending bytes, healthy, pods, compute
    in GPUs, held whole (module doc)."""
    node = info.node
    scale = unit_bytes(info.unit)
    used = state.reservations.used_with_skipped(node.name)
    held = state.reservations.ledger_state(node.name)
    holders: dict[int, int] = {}
    for allocation in state.reservations.allocations(node.name):
        for index, amount in allocation.per_gpu().items():
            if amount:
                holders[index] = holders.get(index, 0) + 1
    waiting: dict[int, int] = {}
    for pod in state.reservations.pending(node.name):
        for step in pod.steps[pod.done :]:
            for index in step.gpu_indices:
                waiting[index] = waiting.get(index, 0) + step.share
    return [
        (
            gpu,
            (
                float(gpu.capacity * scale),
                float(used[position] * scale),
                float(waiting.get(gpu.index, 0) * scale),
                1.0 if gpu.healthy else 0.0,
                float(holders.get(gpu.index, 0)),
                held.gpu_compute_used[position] / GPU_COMPUTE_MILLI,
                1.0 if held.gpu_whole[position] else 0.0,
            ),
        )
        for position, gpu in enumerate(node.gpus)
    ]


class StateCollector(Collector):
    """The sync flag and the skipped pods, read at scrape time (the per-GPU gauges are
    ``GpuSeries``)."""

    def __init__(self, state: ExtenderState) -> None:
        self._state = state

    def describe(self) -> Iterable[Metric]:
        return [self._synced()]

    def collect(self) -> Iterable[Metric]:
        synced = self._synced()
        synced.add_metric([], 1.0 if self._state.cluster.synced else 0.0)
        skipped = GaugeMetricFamily(
            "gpushare_extender_skipped_pods",
            "Bound GPU pods the ledger could not record (counted conservatively), by node and why.",
            labels=["node", "kind"],
        )
        current: dict[tuple[str, str], int] = {}
        for skip in self._state.reservations.skipped():
            current[(skip.node, str(skip.kind))] = current.get((skip.node, str(skip.kind)), 0) + 1
        for (node_name, kind), count in sorted(current.items()):
            skipped.add_metric([node_name, kind], float(count))
        recorded = CounterMetricFamily(
            "gpushare_extender_skipped_pods_recorded",
            "Times a bound GPU pod was skipped by the ledger (anew or changed), by why.",
            labels=["kind"],
        )
        for skip_kind in SkipKind:
            recorded.add_metric(
                [str(skip_kind)], float(self._state.reservations.skips_recorded.get(skip_kind, 0))
            )
        return [synced, skipped, recorded]

    @staticmethod
    def _synced() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "gpushare_extender_synced",
            "1 once the extender's node and pod caches have synced, else 0.",
        )


class ExtenderMetrics:
    """The extender's metrics on ``registry`` (a fresh ``CollectorRegistry`` when not given)."""

    def __init__(self, state: ExtenderState, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.requests = Counter(
            "gpushare_extender_requests",
            "Extender requests handled, by verb and outcome.",
            ["verb", "outcome"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "gpushare_extender_request_duration_seconds",
            "Time to handle an extender request, by verb.",
            ["verb"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        for verb in VERBS:
            self.duration.labels(verb)
            for outcome in OUTCOMES:
                self.requests.labels(verb, outcome)
        self.registry.register(StateCollector(state))
        self.gpus = GpuSeries(state)

    def observe(self, verb: str, outcome: str, seconds: float) -> None:
        """One handled request."""
        self.requests.labels(verb, outcome).inc()
        self.duration.labels(verb).observe(seconds)

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition (the registry's, then ``GpuSeries``') and its content type."""
        return generate_latest(self.registry) + self.gpus.exposition().encode(), CONTENT_TYPE_LATEST
