"""Pure translation between Kubernetes JSON (plain dicts) and ``gpushare.core`` types. No I/O.

Pods → ``PodRequest`` (what a pod asks), pod annotations ↔ ``Allocation`` (what it got), nodes →
``NodeInfo`` (its GPUs). Everything is in the node's own memory unit (docs/design.md, "Units").

**How a pod asks** (per container in ``spec.containers``; init containers are not placed, and
one that asks ``aliyun.com/gpu-mem`` or ``aliyun.com/gpu-count`` makes the pod unreadable: the
filter refuses it with ``INIT_CONTAINER_REFUSAL``, because a real kubelet would call Allocate
for it on a GPU nobody placed):

* ``resources.limits["aliyun.com/gpu-mem"]`` (or ``requests``; equal when both are set): the
  container's GPU memory **in total** over its GPUs, a whole Kubernetes quantity (``"8"``,
  ``"1k"``). Keeping the total makes kube-scheduler's node sum and the kubelet's unit count right.
* Several GPUs: the pod annotation ``gpushare.io/gpu-count`` — ``"2"`` (every GPU container) or
  JSON ``{"main": 2}`` (by container name) — or ``aliyun.com/gpu-count`` in the container's
  ``limits``. The container then gets total ÷ count on each of count distinct GPUs (the total
  must divide evenly). Beware: a node advertises ``aliyun.com/gpu-count`` in its capacity, so
  kube-scheduler and the kubelet also *count* that limit against the node's GPUs — the sum of
  ``aliyun.com/gpu-count`` limits over a node's pods stays at most its GPU count. The annotation
  has no such side effect and is the recommended form; when both are set they must agree.
* Allowed GPU models: the pod annotation ``gpushare.io/gpu-models`` — ``"A100,V100"`` (every
  GPU container) or JSON ``{"main": ["A100"]}``. Absent: any model.
* Whole GPUs: the pod annotation ``gpushare.io/exclusive`` — ``"true"`` (every ``gpu-mem``
  container) or JSON ``{"main": true}``: the container takes its GPU count of GPUs nobody uses.
* Other systems' dialects (``dialects``): gpu-manager's ``tencent.com/vcuda-core`` and
  ``vcuda-memory``, its fork's ``nvidia.com/vcuda-*``, HAMi's ``nvidia.com/gpu``, ``gpumem``,
  ``gpumem-percentage``, ``gpucores``, Alibaba cloud's ``aliyun.com/gpu-core.percentage``.
  Memory they write in MiB or percent stays so (``pod_request`` returns a
  ``gpushare.core.ask.PodAsk``; ``ContainerAsk.memory_basis``) until ``resolve`` puts it in
  one node's unit. A pod whose GPU containers use two dialects is
  refused. docs/compute.md.

**What a pod got** (written at bind, read back on every watch event and on restart):

* Alibaba gpushare's annotations, same keys and formats as its ``pkg/utils/pod.go``
  (``PatchPodAnnotationSpec``) and its device plugin's ``pkg/gpu/nvidia/podutils.go``:
  ``ALIYUN_COM_GPU_MEM_IDX`` the GPU index, ``ALIYUN_COM_GPU_MEM_POD`` the pod's total gpu-mem,
  ``ALIYUN_COM_GPU_MEM_DEV`` the GPU's whole memory (all decimal integers in the node unit),
  ``ALIYUN_COM_GPU_MEM_ASSIGNED`` ``"false"`` at bind (the device plugin sets ``"true"``),
  ``ALIYUN_COM_GPU_MEM_ASSUME_TIME`` nanoseconds since the Unix epoch, decimal. IDX and DEV
  name one GPU, so they are written only when the whole pod sits on one GPU (their meaning is
  never changed); POD, ASSIGNED and ASSUME_TIME always.
* ``gpushare.io/allocation``: JSON ``{"node": "n3", "unit": "MiB", "containers": [{"name":
  "main", "gpus": [0, 1], "share": 8}]}`` (``share`` per GPU; optional ``"compute"``,
  compute_milli per GPU, and ``"whole": true``, GPUs held whole; absent: 0 and false).
  Authoritative when present; pods with only Alibaba's annotations (bound by Alibaba's
  extender) are read from those.

**Nodes**: a GPU-share (memory-shared) node is one labelled ``gpushare=true`` (docs/design.md,
"Node modes"; Alibaba's device plugin runs only there) that publishes GPUs. Its GPUs come from
the ``gpushare.io/gpu-inventory`` annotation (``gpushare.testing.nodes`` documents it) when
present; else Alibaba's fallback, ``status.capacity`` ``aliyun.com/gpu-mem`` ÷
``aliyun.com/gpu-count`` per GPU (integer division, all healthy, unit unknown). A node without
the label, or with neither, is not a GPU-share node (``NodeInfo.refusal`` says why); an
unlabelled node's GPUs are still read, so pods already on it keep counting. CPU and memory are
left to kube-scheduler (``None``).

**Plain fields** (``fields``): names, a pod's UID, node, phase, "finished" (``Succeeded`` or
``Failed``, ``TERMINAL_PHASES``: the one place that rule is written), "being deleted", container
IDs, a node's label and InternalIP. These readers are lenient (a missing field reads as empty).

**Read once** (``record``): ``pod_record`` gives what a pod asks, its Alibaba annotations, its
allocation and its handshake state in one read (the inspect report, the extender's ledger
rebuild), through a fast path for well-formed pods that answers exactly as the readers above.

Garbage raises ``CodecError`` naming the object, the key, the value and what is accepted.
"""

from gpushare.kube.codec.common import (
    ALIYUN_ASSIGNED,
    ALIYUN_ASSUME_TIME,
    ALIYUN_DEV,
    ALIYUN_IDX,
    ALIYUN_KEYS,
    ALIYUN_POD,
    ALLOCATION,
    GPU_COUNT,
    GPU_COUNT_ANNOTATION,
    GPU_MEM,
    GPU_MODELS_ANNOTATION,
    GPUSHARE_LABEL,
    INVENTORY,
    PLACEMENT,
    CodecError,
    Json,
    MemoryUnit,
    parse_quantity,
    pod_key,
    whole_quantity,
)
from gpushare.kube.codec.fields import (
    TERMINAL_PHASES,
    PodCondition,
    is_gpushare_node,
    node_internal_ip,
    node_labels,
    object_labels,
    object_name,
    object_namespace,
    phase_finished,
    pod_annotation,
    pod_condition,
    pod_container_names,
    pod_deleting,
    pod_deletion_timestamp,
    pod_finished,
    pod_node_name,
    pod_phase,
    pod_preempts,
    pod_priority,
    pod_resource_names,
    pod_started_s,
    pod_uid,
)
from gpushare.kube.codec.inventory import InventoryGpu, inventory_annotation
from gpushare.kube.codec.nodes import NodeInfo, node_info
from gpushare.kube.codec.pods import (
    AlibabaAnnotations,
    alibaba_annotations,
    allocation_annotations,
    bound_copy,
    pod_allocation,
    pod_request,
)
from gpushare.kube.codec.record import PodRecord, fast_pod_record, pod_record

__all__ = [
    "ALIYUN_ASSIGNED",
    "ALIYUN_ASSUME_TIME",
    "ALIYUN_DEV",
    "ALIYUN_IDX",
    "ALIYUN_KEYS",
    "ALIYUN_POD",
    "ALLOCATION",
    "GPUSHARE_LABEL",
    "GPU_COUNT",
    "GPU_COUNT_ANNOTATION",
    "GPU_MEM",
    "GPU_MODELS_ANNOTATION",
    "INVENTORY",
    "PLACEMENT",
    "TERMINAL_PHASES",
    "AlibabaAnnotations",
    "CodecError",
    "InventoryGpu",
    "Json",
    "MemoryUnit",
    "NodeInfo",
    "PodCondition",
    "PodRecord",
    "alibaba_annotations",
    "allocation_annotations",
    "bound_copy",
    "fast_pod_record",
    "inventory_annotation",
    "is_gpushare_node",
    "node_info",
    "node_internal_ip",
    "node_labels",
    "object_labels",
    "object_name",
    "object_namespace",
    "parse_quantity",
    "phase_finished",
    "pod_allocation",
    "pod_annotation",
    "pod_condition",
    "pod_container_names",
    "pod_deleting",
    "pod_deletion_timestamp",
    "pod_finished",
    "pod_key",
    "pod_node_name",
    "pod_phase",
    "pod_preempts",
    "pod_priority",
    "pod_record",
    "pod_request",
    "pod_resource_names",
    "pod_started_s",
    "pod_uid",
    "whole_quantity",
]
