"""The request dialects of the systems gpushare replaces, read into one shape (``GpuAsk``).
Pure; no I/O. ``pod_request`` reads every container through ``container_ask`` when it names one
of ``DIALECT_NAMES``.

A container asks for GPU in one dialect; each dialect's own rules apply, and a request its own
system refuses is refused here with that system's rule in the message. Sources: each system's
own code and documentation, named with its dialect below.

* **Tencent gpu-manager** (tkestack, ``pkg/types/types.go``, ``pkg/services/allocator/nvidia/
  allocator.go``): ``tencent.com/vcuda-core`` in hundredths of a GPU and
  ``tencent.com/vcuda-memory`` in blocks of 256 MiB. 1–99 shares one GPU and needs a non-zero
  vcuda-memory ("that cores or memory is zero is not permitted in share mode"); 100 is one whole
  GPU; above 100 only multiples of 100, whole GPUs. With vcuda-core ≥ 100 the memory hook is
  off, so vcuda-memory is ignored. The fork ``coldzerofear/gpu-manager`` writes
  ``nvidia.com/vcuda-core``/``nvidia.com/vcuda-memory`` with 1 MiB blocks.
* **HAMi** (``docs/config.md``: ``defaultMem``, ``defaultCores``, ``defaultGPUNum``):
  ``nvidia.com/gpu`` GPUs, each shared; ``nvidia.com/gpumem`` MiB per GPU or
  ``nvidia.com/gpumem-percentage`` % of each GPU's memory (neither: 100 %, HAMi's
  ``defaultMem: 0``; both: the MiB, which HAMi reads first); ``nvidia.com/gpucores`` % of each
  GPU, 0–100 (0: any GPU with the memory; 100: the whole GPU, exclusively). gpumem or gpucores
  without ``nvidia.com/gpu`` asks one GPU (HAMi's webhook adds ``defaultGPUNum: 1``).
* **Alibaba's cloud** adds ``aliyun.com/gpu-core.percentage`` (1–100 % of the GPU's compute)
  next to ``aliyun.com/gpu-mem``; the memory stays ``pod_request``'s.

Resources of two dialects in one container are refused: nothing says how to add them up.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from gpushare.core.ask import MIB_BASIS, PERCENT_BASIS
from gpushare.core.model import GPU_COMPUTE_MILLI
from gpushare.kube.codec.common import GPU_MEM, CodecError

TENCENT_CORE = "tencent.com/vcuda-core"
TENCENT_MEMORY = "tencent.com/vcuda-memory"
TENCENT_CORE_LIMIT = "tencent.com/vcuda-core-limit"
FORK_CORE = "nvidia.com/vcuda-core"
FORK_MEMORY = "nvidia.com/vcuda-memory"
HAMI_GPU = "nvidia.com/gpu"
HAMI_MEMORY = "nvidia.com/gpumem"
HAMI_MEMORY_PERCENT = "nvidia.com/gpumem-percentage"
HAMI_CORES = "nvidia.com/gpucores"
ALIYUN_CORE_PERCENT = "aliyun.com/gpu-core.percentage"
HAMI_USE_TYPE = "nvidia.com/use-gputype"
HAMI_NOUSE_TYPE = "nvidia.com/nouse-gputype"
HAMI_USE_UUID = "nvidia.com/use-gpuuuid"
HAMI_NOUSE_UUID = "nvidia.com/nouse-gpuuuid"
HAMI_SELECTION = (HAMI_USE_TYPE, HAMI_NOUSE_TYPE, HAMI_USE_UUID, HAMI_NOUSE_UUID)
"""HAMi's pod annotations choosing and avoiding GPUs for every GPU container of the pod,
comma-separated: types (substrings of the GPU model, any case: ``"A100,V100"``) and UUIDs
(exact, ``"GPU-8a1e..."``); read by ``pod_request`` into ``ContainerAsk.gpu_types``,
``excluded_gpu_types``, ``gpu_uuids`` and ``excluded_gpu_uuids``, resolved per node
(``gpushare.core.resolve``). HAMi's ``hami.io/gpu-scheduler-policy`` and
``hami.io/node-scheduler-policy`` are preferences and are ignored: gpushare's policy places."""
TENCENT_BLOCK_MIB = 256
"""One ``tencent.com/vcuda-memory`` unit (gpu-manager's ``MemoryBlockSize``, 256 MiB)."""


class Dialect(enum.StrEnum):
    """Whose resource names a container uses."""

    ALIBABA = "Alibaba gpushare"
    TENCENT = "Tencent gpu-manager"
    TENCENT_FORK = "gpu-manager fork (nvidia.com/vcuda-*)"
    HAMI = "HAMi"


class MemoryBasis(enum.StrEnum):
    """What ``GpuAsk.memory`` counts: the node's own unit (Alibaba's gpu-mem), MiB, or percent
    of the GPU's memory; the extender turns it into the node's unit."""

    NODE_UNITS = "units of the node"
    MIB = MIB_BASIS
    PERCENT = PERCENT_BASIS


DIALECT_RESOURCES: Mapping[Dialect, frozenset[str]] = {
    Dialect.ALIBABA: frozenset({GPU_MEM, ALIYUN_CORE_PERCENT}),
    Dialect.TENCENT: frozenset({TENCENT_CORE, TENCENT_MEMORY}),
    Dialect.TENCENT_FORK: frozenset({FORK_CORE, FORK_MEMORY}),
    Dialect.HAMI: frozenset({HAMI_GPU, HAMI_MEMORY, HAMI_MEMORY_PERCENT, HAMI_CORES}),
}
"""The resource names of each dialect (Alibaba's ``aliyun.com/gpu-count`` is read with
``gpu-mem`` by ``pod_request``)."""
DIALECT_NAMES: frozenset[str] = frozenset().union(*DIALECT_RESOURCES.values()) - {GPU_MEM}
"""Every resource name this module reads that is not Alibaba's plain ``aliyun.com/gpu-mem``:
a container naming one of them is read here."""
ADVERTISED_NAMES: frozenset[str] = frozenset({TENCENT_CORE, TENCENT_MEMORY, HAMI_GPU})
"""The dialect resources gpushare's device plugin advertises (``--dialects``): kubelet counts
them per node, so kube-scheduler checks them against the node's allocatable as kubelet will
(``ignoredByScheduler: false``), which also bounds HAMi's containers per GPU by the plugin's
``--split-count``. The others (memory and compute written beside them) are the extender's
alone (``ignoredByScheduler: true``): docs/compute.md, "What an operator configures"."""
UNADVERTISED_NAMES: frozenset[str] = DIALECT_NAMES - ADVERTISED_NAMES
"""The dialect resources no node advertises (``ignoredByScheduler: true``): HAMi's memory and
cores, the Tencent fork's, Alibaba's ``aliyun.com/gpu-core.percentage``. kube-scheduler's
queueing hint for node changes still counts them (docs/interfaces.md, Pitfalls: 31)."""


ALLOCATE_RESOURCE: Mapping[Dialect, str] = {
    Dialect.ALIBABA: "",
    Dialect.TENCENT: TENCENT_CORE,
    Dialect.TENCENT_FORK: FORK_CORE,
    Dialect.HAMI: HAMI_GPU,
}
"""The resource whose kubelet Allocate call a dialect's device plugin tells pods apart by
(``gpushare.core.handshake``; ``ContainerRequest.allocate_resource``): Alibaba's and
gpushare's ``aliyun.com/gpu-mem`` by memory units (empty: the core's default), gpu-manager's by
``vcuda-core`` (its ``vcore`` server picks the GPUs; ``vmemory`` answers empty), HAMi's by
``nvidia.com/gpu``."""


@dataclass(frozen=True, slots=True)
class GpuAsk:
    """What one container asks, whatever its dialect: on each of ``gpu_count`` GPUs,
    ``memory`` (in ``memory_basis``) and ``compute_milli`` (thousandths of the GPU; 0: not
    bounded), or with ``exclusive`` whole GPUs (``memory`` and ``compute_milli`` then 0);
    ``kubelet_units``: the container's amount of its dialect's ``ALLOCATE_RESOURCE`` (what
    kubelet passes to Allocate there; 0 when the container does not name it)."""

    dialect: Dialect
    gpu_count: int
    memory: int
    memory_basis: MemoryBasis
    compute_milli: int = 0
    exclusive: bool = False
    kubelet_units: int = 0

    @property
    def allocate_resource(self) -> str:
        """The dialect's ``ALLOCATE_RESOURCE``."""
        return ALLOCATE_RESOURCE[self.dialect]


def container_ask(asked: Mapping[str, int], subject: str) -> GpuAsk | None:
    """The ``GpuAsk`` of a container from ``asked`` (resource name → whole amount, the
    container's limits or requests already read as quantities), or ``None`` when it asks no
    GPU resource of a dialect this module reads (Alibaba's plain ``gpu-mem`` is
    ``pod_request``'s). ``CodecError`` naming ``subject``, the resource, the value and the
    source system's rule for a request that system refuses, or for two dialects at once."""
    used = {d for d, names in DIALECT_RESOURCES.items() if names & asked.keys()}
    if len(used) > 1:
        names = sorted(asked.keys() & set().union(*(DIALECT_RESOURCES[d] for d in used)))
        raise CodecError(
            subject, ", ".join(names), {n: asked[n] for n in names},
            f"mixes {' and '.join(sorted(used))} resources",
            "one dialect per container",
        )  # fmt: skip
    if not used:
        return None
    dialect = used.pop()
    if dialect in _VCUDA:
        return _tencent(asked, subject, _VCUDA[dialect])
    if dialect is Dialect.HAMI:
        return _hami(asked, subject)
    return _alibaba_core(asked, subject)


@dataclass(frozen=True, slots=True)
class _VcudaNames:
    """gpu-manager's resource names and memory block, upstream or the fork's."""

    dialect: Dialect
    core: str
    memory: str
    block_mib: int


_VCUDA = {
    Dialect.TENCENT: _VcudaNames(Dialect.TENCENT, TENCENT_CORE, TENCENT_MEMORY, TENCENT_BLOCK_MIB),
    Dialect.TENCENT_FORK: _VcudaNames(Dialect.TENCENT_FORK, FORK_CORE, FORK_MEMORY, 1),
}


def _tencent(asked: Mapping[str, int], subject: str, names: _VcudaNames) -> GpuAsk | None:
    core_name, memory_name, dialect = names.core, names.memory, names.dialect
    core, memory = asked.get(core_name, 0), asked.get(memory_name, 0)
    share_rule = f"{core_name} 1-99 with {memory_name} > 0, or 100, 200, ... (whole GPUs)"
    if not core:
        if memory:
            raise CodecError(
                subject, memory_name, memory, f"without {core_name} (gpu-manager allocates by "
                "vcuda-core; cores or memory zero is not permitted in share mode)", share_rule,
            )  # fmt: skip
        return None
    if core < 100:
        if not memory:
            raise CodecError(
                subject, core_name, core, f"a share (below 100) needs {memory_name} > 0 "
                "(cores or memory zero is not permitted in share mode)", share_rule,
            )  # fmt: skip
        return GpuAsk(
            dialect, 1, memory * names.block_mib, MemoryBasis.MIB, core * 10, kubelet_units=core
        )
    if core % 100:
        raise CodecError(
            subject, core_name, core, "above 100 only multiples of 100 (whole GPUs)", share_rule
        )
    return GpuAsk(dialect, core // 100, 0, MemoryBasis.MIB, exclusive=True, kubelet_units=core)


def _hami(asked: Mapping[str, int], subject: str) -> GpuAsk | None:
    count = asked.get(HAMI_GPU)
    memory_mib = asked.get(HAMI_MEMORY, 0)
    percent = asked.get(HAMI_MEMORY_PERCENT, 0)
    cores = asked.get(HAMI_CORES, 0)
    if count == 0:
        if memory_mib or percent or cores:
            raise CodecError(
                subject, HAMI_GPU, 0, "0 GPUs with GPU memory or cores asked",
                f"{HAMI_GPU} >= 1 (or absent: one GPU)",
            )  # fmt: skip
        return None
    if percent > 100:
        raise CodecError(
            subject, HAMI_MEMORY_PERCENT, percent, "above 100 %", "0-100 (% of each GPU)"
        )
    if cores > 100:
        raise CodecError(subject, HAMI_CORES, cores, "above 100 %", "0-100 (% of each GPU)")
    gpus = count if count is not None else 1
    named = count or 0  # kubelet calls nvidia.com/gpu's Allocate only when the spec names it
    if cores == 100:  # HAMi: "it will use an entire GPU card exclusively"
        return GpuAsk(Dialect.HAMI, gpus, 0, MemoryBasis.MIB, exclusive=True, kubelet_units=named)
    compute_milli = cores * GPU_COMPUTE_MILLI // 100
    if memory_mib:  # HAMi reads the MiB first
        return GpuAsk(Dialect.HAMI, gpus, memory_mib, MemoryBasis.MIB, compute_milli, False, named)
    return GpuAsk(
        Dialect.HAMI, gpus, percent or 100, MemoryBasis.PERCENT, compute_milli, False, named
    )


def _alibaba_core(asked: Mapping[str, int], subject: str) -> GpuAsk | None:
    percent = asked.get(ALIYUN_CORE_PERCENT)
    if percent is None:
        return None
    rule = f"1-100 (% of the GPU's compute), with {GPU_MEM}"
    if not 1 <= percent <= 100:
        raise CodecError(subject, ALIYUN_CORE_PERCENT, percent, "not 1-100", rule)
    if not asked.get(GPU_MEM):
        raise CodecError(subject, ALIYUN_CORE_PERCENT, percent, f"without {GPU_MEM}", rule)
    return GpuAsk(
        Dialect.ALIBABA, 1, asked[GPU_MEM], MemoryBasis.NODE_UNITS, percent * 10,
        kubelet_units=asked[GPU_MEM],
    )  # fmt: skip


def vcuda_core_limit(annotations: Mapping[str, str], subject: str) -> int | None:
    """Tencent's pod annotation ``tencent.com/vcuda-core-limit``: the soft compute cap a
    shared container may burst to, in hundredths of a GPU, at most 100 (gpu-manager's
    ``virtual-manager/manager.go``: ``limit = min(n, 100)``, hard limit off); ``None`` when
    absent. ``CodecError`` for a value that is not a whole number 1-100 and above."""
    raw = annotations.get(TENCENT_CORE_LIMIT)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or int(raw) == 0:
        raise CodecError(
            subject, f"annotation {TENCENT_CORE_LIMIT}", raw, "not a whole number > 0",
            "hundredths of a GPU, e.g. \"50\" (values above 100 count as 100)",
        )  # fmt: skip
    return min(int(raw), 100)
