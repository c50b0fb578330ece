"""What kubelet's ``NodePrepareResources`` gives a claim: its allocation read and checked, and the
CDI spec that hands its containers their GPU and share. Pure; no I/O.

kubelet names a claim (namespace, name, UID); the driver reads the ResourceClaim from the API
server and takes from ``status.allocation.devices.results`` the results of its own driver
(others are another driver's to prepare). Each must name this node's pool (the node name) and
one of its devices (``gpu-<index>``); its ``consumedCapacity`` says the share: ``memory`` in the
node's unit (a quantity such as ``8Gi``), ``cores`` in percent (absent: none). The claim's UID
must be the one kubelet named (a claim deleted and made again under the same name is another
claim). Anything else refuses the claim with a ``ClaimError`` naming the value, the place and
what is accepted: kubelet then reports the pod's start as failed, with that text.

The CDI spec (``cdi_spec``, CDI 0.6.0; kind ``gpushare.io/gpu``) has one device per claim,
named by the claim's UID, whose container edits set, for the claim's GPUs in index order, the
variables the device plugin gives an ``aliyun.com/gpu-mem`` container (Alibaba's names and
formats, ``gpushare.deviceplugin.allocate``):

* ``NVIDIA_VISIBLE_DEVICES``: the GPU UUIDs;
* ``ALIYUN_COM_GPU_MEM_IDX``: the GPU indices;
* ``ALIYUN_COM_GPU_MEM_POD`` and ``ALIYUN_COM_GPU_MEM_CONTAINER``: the claim's memory in all
  (units of the node);
* ``ALIYUN_COM_GPU_MEM_DEV``: the whole memory of the first GPU;
* ``GPUSHARE_CORES_PERCENT``: the compute share of each GPU, when the claim asks one;
* with ``mps`` (the node's GPUs run CUDA MPS): ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (each GPU's
  share in MiB, by CUDA ordinal) and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, by the device
  plugin's rule (``gpushare.deviceplugin.allocate.mps_envs``: the compute share when asked,
  else the memory share of the GPU; the largest over the claim's GPUs);
* with ``isolation`` (the node's share backend and view, ``gpushare.deviceplugin.isolation``),
  for a share of a GPU (a claim that takes less than a whole GPU): the same edits as Allocate
  gives (the share-view library's ``GPUSHARE_SHARE_MIB`` and read-only mounts,
  ``GPUSHARE_SHARE_ENFORCE``, ``NVIDIA_GPU_MEMORY_LIMIT``/``_REQUEST``); when the node requires
  an enforced share and has none, the claim is refused (``ClaimError``) naming what is missing.

The claim's GPUs themselves (device nodes, driver libraries and binaries) come as the device
plugin gives them (``gpushare.deviceplugin.cdi``, ``--cdi``): :func:`device_cdi_ids` adds to
each allocated device's CDI IDs its GPU's device in the NVIDIA container toolkit's spec
(``nvidia.com/gpu=<uuid>``) or in gpushare's (``gpushare.io/nvidia-gpu=<uuid>``), so that the
node needs no NVIDIA runtime as its default runtime; the claim's own device (its environment)
stays on the first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpushare.core.handshake import Step
from gpushare.deviceplugin.allocate import mps_envs
from gpushare.deviceplugin.cdi import CdiError, GpuCdi
from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.deviceplugin.isolation import NodeIsolation
from gpushare.kube.codec import MemoryUnit
from gpushare.kube.codec.dra import ClaimError, allocated_devices, text_field

__all__ = [
    "CDI_KIND",
    "CDI_VERSION",
    "ClaimError",
    "PreparedClaim",
    "PreparedDevice",
    "cdi_device_id",
    "cdi_spec",
    "device_cdi_ids",
    "prepared_claim",
]

CDI_KIND = "gpushare.io/gpu"
"""The CDI kind of gpushare's devices (``vendor/class``)."""
CDI_VERSION = "0.6.0"
"""The CDI specification version of the specs written (containerd 2.x and CRI-O read it)."""

Json = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One allocation result of this driver: the ``request`` it serves, the ``gpu``, the share
    (``memory_units`` of the node's unit, ``cores_percent``) and the scheduler's ``share_id``
    (``""`` when none)."""

    request: str
    gpu: PhysicalGpu
    memory_units: int
    cores_percent: int
    share_id: str


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    """A claim ``namespace/name`` (``uid``) and its devices on this node, in allocation
    order."""

    namespace: str
    name: str
    uid: str
    devices: tuple[PreparedDevice, ...]


def prepared_claim(
    claim: Json,
    *,
    uid: str,
    driver: str,
    node: str,
    gpus: Sequence[PhysicalGpu],
    unit: MemoryUnit,
) -> PreparedClaim:
    """The devices this driver prepares for ResourceClaim ``claim`` (JSON as the API server
    returns it) on ``node`` with ``gpus`` (module doc; the results read by
    ``gpushare.kube.codec.dra.allocated_devices``). ``ClaimError`` when the claim is not the
    one kubelet named (``uid``), is not allocated, or an allocation result of ``driver`` names
    another node's pool, an unknown device or a share that cannot be read."""
    meta = claim.get("metadata")
    if not isinstance(meta, Mapping):
        raise ClaimError("metadata: not an object")
    namespace = text_field(meta.get("namespace"), "metadata.namespace", "a namespace")
    name = text_field(meta.get("name"), "metadata.name", "a name")
    if meta.get("uid") != uid:
        raise ClaimError(
            f"claim {namespace}/{name}: metadata.uid={meta.get('uid')!r}, kubelet asked for "
            f"{uid!r} (the claim was made again; kubelet will ask again)"
        )
    by_index = {gpu.index: gpu for gpu in gpus}
    found = allocated_devices(claim, driver=driver, node=node, indices=by_index, unit=unit)
    devices = tuple(
        PreparedDevice(
            d.request,
            by_index[d.index],
            by_index[d.index].units(unit) if d.memory_units is None else d.memory_units,
            d.cores_percent,
            d.share_id,
        )
        for d in found
    )
    return PreparedClaim(namespace, name, uid, devices)


def _mps_limits(claim: PreparedClaim, unit: MemoryUnit) -> dict[str, str]:
    """The MPS variables of ``claim`` (module doc), GPUs in index order as CUDA numbers them."""
    limits: list[str] = []
    percent = 1
    by_gpu = sorted(claim.devices, key=lambda d: d.gpu.index)
    for ordinal, device in enumerate(by_gpu):
        step = Step(claim.name, (device.gpu.index,), device.memory_units, device.cores_percent * 10)
        one = mps_envs(step, [device.gpu], unit)
        limits.append(f"{ordinal}={device.memory_units * unit.mib}M")
        percent = max(percent, int(one["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]))
    return {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": ",".join(limits),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(percent),
    }


def cdi_device_id(claim_uid: str) -> str:
    """The CDI device ID of a claim's device: ``gpushare.io/gpu=<claim UID>``."""
    return f"{CDI_KIND}={claim_uid}"


def device_cdi_ids(claim: PreparedClaim, gpu_cdi: GpuCdi | None) -> list[list[str]]:
    """The CDI device IDs of each of ``claim``'s devices, in order (module doc): the claim's
    own (:func:`cdi_device_id`) on the first, then each device's GPU in ``gpu_cdi``
    (``None``: none). ``ClaimError`` naming the claim and the spec when ``gpu_cdi`` lacks a
    GPU (a stale spec)."""
    found: list[list[str]] = []
    for i, device in enumerate(claim.devices):
        ids = [cdi_device_id(claim.uid)] if i == 0 else []
        if gpu_cdi is not None:
            try:
                ids += gpu_cdi.ids([(device.gpu.index, device.gpu.uuid)])
            except CdiError as error:
                raise ClaimError(f"claim {claim.namespace}/{claim.name}: {error}") from None
        found.append(ids)
    return found


def cdi_spec(
    claim: PreparedClaim,
    unit: MemoryUnit,
    *,
    mps: bool = False,
    isolation: NodeIsolation | None = None,
) -> dict[str, Any]:
    """The CDI spec of ``claim`` (module doc): one device named by the claim's UID, with the MPS
    limits when ``mps`` and the share's edits with ``isolation``; an empty ``devices`` list
    when the claim has none of this driver's devices. ``ClaimError`` when the node requires
    an enforced share it does not have."""
    if not claim.devices:
        return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": []}
    gpus = sorted({d.gpu.index: d.gpu for d in claim.devices}.values(), key=lambda g: g.index)
    total = sum(d.memory_units for d in claim.devices)
    env = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(g.uuid for g in gpus),
        "ALIYUN_COM_GPU_MEM_IDX": ",".join(str(g.index) for g in gpus),
        "ALIYUN_COM_GPU_MEM_POD": str(total),
        "ALIYUN_COM_GPU_MEM_CONTAINER": str(total),
        "ALIYUN_COM_GPU_MEM_DEV": str(gpus[0].units(unit)),
    }
    cores = max(d.cores_percent for d in claim.devices)
    if cores:
        env["GPUSHARE_CORES_PERCENT"] = str(cores)
    if mps:
        env.update(_mps_limits(claim, unit))
    edits: dict[str, Any] = {}
    shared = [d for d in claim.devices if d.memory_units < d.gpu.units(unit)]
    if isolation is not None and shared:
        refusal = isolation.refusal()
        if refusal:
            raise ClaimError(f"claim {claim.namespace}/{claim.name}: {refusal}")
        by_gpu = sorted(claim.devices, key=lambda d: d.gpu.index)
        share = isolation.edits([(d.gpu.uuid, d.memory_units * unit.mib) for d in by_gpu])
        env.update(share.envs)
        if share.mounts:
            edits["mounts"] = [
                {
                    "hostPath": m.host_path,
                    "containerPath": m.container_path,
                    "options": ["ro", "nosuid", "nodev", "bind"],
                }
                for m in share.mounts
            ]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [
            {
                "name": claim.uid,
                "containerEdits": {
                    "env": [f"{key}={value}" for key, value in env.items()],
                    **edits,
                },
            }
        ],
    }
