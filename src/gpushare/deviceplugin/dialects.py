"""The request dialects' resources on the node (docs/compute.md): what the device plugin
advertises to kubelet for each dialect an operator enables (``--dialects``), how kubelet's
Allocate on that resource is matched to a pending pod, and what the container gets.

One process, one socket per resource (kubelet takes one resource per registration), each
registered with kubelet:

* ``tencent``: ``tencent.com/vcuda-core``, 100 devices per GPU (gpu-manager: 100 = one GPU),
  Allocate matched by the container's vcuda-core (compute share in hundredths; 100·k for k
  whole GPUs); and ``tencent.com/vcuda-memory``, one device per 256 MiB block
  (gpu-manager's ``MemoryBlockSize``), Allocate answered empty as gpu-manager's
  ``vmemory.sock`` answers (``pkg/server/vmemory.go``).
* ``hami``: ``nvidia.com/gpu``, the split count of devices per GPU (HAMi's
  ``deviceSplitCount``, default 10), Allocate matched by the container's GPU count.

Each pod is matched on its dialect's Allocate resource (``kube.codec.dialects.
ALLOCATE_RESOURCE``) by the units its spec names there (``Step.units``, read by ``pod_request``
as the extender reads them), so the extender's handshake rule keeps apart exactly the pods
this plugin could not tell apart.

Not served: the gpu-manager fork's ``nvidia.com/vcuda-memory`` counts 1 MiB blocks, one
kubelet device each (81,920 per 80 GiB card): one GPU of 80 GiB alone needs about 5 MB of
ListAndWatch, over kubelet's 4 MiB message limit (``check_message_size``), and kubelet
checkpoints every device. Its pods are placed by the extender and cannot start here; the docs
say to rewrite them as Tencent's (``tencent.com/*``, 256 MiB blocks).

``aliyun.com/gpu-mem`` itself is described the same way (``GPU_MEM_DIALECT``): one device per
memory unit, Allocate matched by memory units, Alibaba's variables (``alibaba_envs``).

Environment (no vcuda or HAMi-core hook library is shipped, so nothing in the container limits
memory or compute by itself):

* every container: ``NVIDIA_VISIBLE_DEVICES`` (the GPU UUIDs, as gpu-manager and HAMi give);
* ``hami``: ``CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m`` per visible GPU and
  ``CUDA_DEVICE_SM_LIMIT`` (the compute share in %, 0 when none is asked), HAMi's names
  (``pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go``), read only by HAMi-core;
* ``tencent``: nothing more. gpu-manager also sets ``LD_LIBRARY_PATH=/usr/local/nvidia/lib64``
  and mounts its vcuda driver copy there and ``/etc/vcuda/<pod-uid>``; without that library the
  variable would point at nothing, so it is not set;
* with ``--mps``: ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``
  from the compute share (``gpushare.deviceplugin.allocate.mps_envs``), for every dialect.

Pure, apart from the dataclasses' callables; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpushare.core.handshake import Step
from gpushare.deviceplugin.inventory import DevicesPerGpu, PhysicalGpu
from gpushare.kube.codec import GPU_MEM, CodecError, Json, MemoryUnit
from gpushare.kube.codec.dialects import (
    HAMI_GPU,
    TENCENT_BLOCK_MIB,
    TENCENT_CORE,
    TENCENT_CORE_LIMIT,
    TENCENT_MEMORY,
    vcuda_core_limit,
)

__all__ = [
    "DEFAULT_SPLIT_COUNT",
    "DIALECTS",
    "GPU_MEM_DIALECT",
    "HAMI",
    "TENCENT",
    "AllocateDialect",
    "DialectResource",
    "DialectsError",
    "alibaba_envs",
    "parse_dialects",
    "resources_for",
]

TENCENT = "tencent"
HAMI = "hami"
DIALECTS = (TENCENT, HAMI)
"""The dialects ``--dialects`` accepts."""
DEFAULT_SPLIT_COUNT = 10
"""HAMi's ``deviceSplitCount`` default: ``nvidia.com/gpu`` devices per GPU."""
MAX_SPLIT_COUNT = 1000
VCUDA_CORE_PER_GPU = 100
"""gpu-manager: 100 ``vcuda-core`` units are one GPU."""


class DialectsError(ValueError):
    """A ``--dialects`` or ``--split-count`` value that cannot be used."""


def parse_dialects(text: str) -> tuple[str, ...]:
    """The dialects in ``text`` (comma-separated, case-insensitive, empty: none), in
    ``DIALECTS`` order. ``DialectsError`` names the value and the accepted ones."""
    names = {part.strip().lower() for part in text.split(",") if part.strip()}
    unknown = sorted(names - set(DIALECTS))
    if unknown:
        raise DialectsError(
            f"--dialects {text!r}: unknown dialect {', '.join(unknown)}; accepted: "
            f"{', '.join(DIALECTS)} (comma-separated), or empty for none. The gpu-manager "
            "fork's nvidia.com/vcuda-* is not served (1 MiB devices: docs/deviceplugin.md)"
        )
    return tuple(d for d in DIALECTS if d in names)


def _containers_naming(pod: Json, resource: str) -> list[str]:
    """The names of ``pod``'s containers naming ``resource`` in their limits or requests."""
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, dict) else None
    names = []
    for container in containers if isinstance(containers, list) else ():
        if not isinstance(container, dict):
            continue
        resources = container.get("resources")
        if not isinstance(resources, dict):
            continue
        asked = {
            *(resources.get("limits") or {}),
            *(resources.get("requests") or {}),
        }
        if resource in asked:
            names.append(str(container.get("name")))
    return names


EnvsOf = Callable[[Step, int, Sequence[PhysicalGpu], MemoryUnit], dict[str, str]]
"""The environment of a matched step: (step, the memory units the pod is given in all, the
step's GPUs in its order, the node's unit) → variables."""


@dataclass(frozen=True, slots=True)
class AllocateDialect:
    """How Allocate on ``resource`` is matched and answered (``HandshakeAllocator``); the
    device IDs kubelet passes for a step are ``Step.units``.

    ``envs``: the step's variables besides the MPS ones; ``belongs``: whether a pod is
    matched on this resource (the pods of the other resources never are);
    ``every_container``: a pod counts only when all its GPU containers name ``resource`` (else
    its steps could not be told from kubelet's calls); ``in_memory_units``: kubelet's device
    IDs count memory units of the node (an error names the unit);
    ``ceiling``: the MPS cap in % a pod may burst to, read from the pod (Tencent's
    ``tencent.com/vcuda-core-limit``, ``soft_limit_percent``), ``None``: no ceiling.
    """

    resource: str
    envs: EnvsOf
    every_container: bool = False
    in_memory_units: bool = False
    ceiling: Callable[[Json], int | None] | None = None

    def belongs(self, pod: Json) -> bool:
        """``pod`` names ``resource`` in a container."""
        return bool(_containers_naming(pod, self.resource))

    def missing(self, pod: Json, gpu_containers: Sequence[str]) -> list[str]:
        """The GPU containers of ``pod`` that do not name ``resource`` (kubelet never calls
        Allocate for them on it)."""
        if not self.every_container:
            return []
        naming = set(_containers_naming(pod, self.resource))
        return [name for name in gpu_containers if name not in naming]


def visible_devices(gpus: Sequence[PhysicalGpu]) -> dict[str, str]:
    """``NVIDIA_VISIBLE_DEVICES``: the UUIDs of the step's GPUs ``gpus``."""
    return {"NVIDIA_VISIBLE_DEVICES": ",".join(g.uuid for g in gpus)}


def alibaba_envs(
    step: Step, pod_units: int, chosen: Sequence[PhysicalGpu], unit: MemoryUnit
) -> dict[str, str]:
    """Alibaba's variables for ``step`` on its GPUs ``chosen``, without MPS
    (``gpushare.deviceplugin.allocate`` module doc)."""
    return {
        "NVIDIA_VISIBLE_DEVICES": ",".join(g.uuid for g in chosen),
        "ALIYUN_COM_GPU_MEM_IDX": ",".join(str(g.index) for g in chosen),
        "ALIYUN_COM_GPU_MEM_POD": str(pod_units),
        "ALIYUN_COM_GPU_MEM_CONTAINER": str(step.given_units),
        "ALIYUN_COM_GPU_MEM_DEV": str(chosen[0].units(unit)),
    }


def tencent_envs(
    step: Step, pod_units: int, gpus: Sequence[PhysicalGpu], unit: MemoryUnit
) -> dict[str, str]:
    """What a Tencent container gets (module doc): the visible GPUs."""
    del step, pod_units, unit
    return visible_devices(gpus)


def hami_envs(
    step: Step, pod_units: int, gpus: Sequence[PhysicalGpu], unit: MemoryUnit
) -> dict[str, str]:
    """What a HAMi container gets (module doc): the visible GPUs, HAMi's memory limit per GPU
    (MiB, ``m`` suffix) and SM limit (% of each GPU, 0 without a compute share)."""
    del pod_units
    envs = visible_devices(gpus)
    share_mib = step.share * unit.mib
    for ordinal in range(len(gpus)):
        envs[f"CUDA_DEVICE_MEMORY_LIMIT_{ordinal}"] = f"{share_mib}m"
    envs["CUDA_DEVICE_SM_LIMIT"] = str(math.ceil(step.compute_milli / 10))
    return envs


def soft_limit_percent(pod: Json) -> int | None:
    """``tencent.com/vcuda-core-limit`` of ``pod`` in % (``min(n, 100)``), ``None`` when not
    set or unreadable (the extender refuses an unreadable one at filter)."""
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    if not isinstance(annotations, Mapping) or TENCENT_CORE_LIMIT not in annotations:
        return None
    try:
        return vcuda_core_limit(annotations, "pod")
    except CodecError:
        return None


GPU_MEM_DIALECT = AllocateDialect(GPU_MEM, alibaba_envs, in_memory_units=True)
"""Alibaba's ``aliyun.com/gpu-mem``: memory units, the Alibaba variables (the default of
``HandshakeAllocator``)."""
TENCENT_CORE_DIALECT = AllocateDialect(TENCENT_CORE, tencent_envs, ceiling=soft_limit_percent)
HAMI_GPU_DIALECT = AllocateDialect(HAMI_GPU, hami_envs, every_container=True)


@dataclass(frozen=True, slots=True)
class DialectResource:
    """One resource the plugin serves (a dialect's, or ``aliyun.com/gpu-mem``): its socket
    file, its devices per GPU (``None``: one per memory unit), and how its Allocate is
    answered (``allocate``; ``None``: an empty answer per container)."""

    resource: str
    socket_name: str
    per_gpu: DevicesPerGpu | None
    allocate: AllocateDialect | None


def _vcuda_core(gpu: PhysicalGpu) -> int:
    del gpu
    return VCUDA_CORE_PER_GPU


def _vcuda_memory(gpu: PhysicalGpu) -> int:
    return gpu.memory_mib // TENCENT_BLOCK_MIB


def resources_for(
    dialects: Sequence[str], split_count: int = DEFAULT_SPLIT_COUNT
) -> tuple[DialectResource, ...]:
    """The resources served for ``dialects`` (``parse_dialects``); ``split_count`` is
    ``nvidia.com/gpu`` devices per GPU, 1 to 1000 (``DialectsError`` otherwise)."""
    if not 1 <= split_count <= MAX_SPLIT_COUNT:
        raise DialectsError(
            f"--split-count {split_count}: accepted 1 to {MAX_SPLIT_COUNT} nvidia.com/gpu "
            "devices per GPU (HAMi's deviceSplitCount, default 10)"
        )
    served: list[DialectResource] = []
    if TENCENT in dialects:
        served += [
            DialectResource(
                TENCENT_CORE, "gpushare-vcuda-core.sock", _vcuda_core, TENCENT_CORE_DIALECT
            ),
            DialectResource(TENCENT_MEMORY, "gpushare-vcuda-memory.sock", _vcuda_memory, None),
        ]
    if HAMI in dialects:

        def split(gpu: PhysicalGpu) -> int:
            del gpu
            return split_count

        served.append(
            DialectResource(HAMI_GPU, "gpushare-nvidia-gpu.sock", split, HAMI_GPU_DIALECT)
        )
    return tuple(served)
