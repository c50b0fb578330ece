"""The handshake state recorded on a pod (``gpushare.core.handshake``). Pure; no I/O.

The extender writes the allocation at bind (``ALIYUN_COM_GPU_MEM_ASSIGNED: "false"``, package
doc). The device plugin answers kubelet's Allocate once per GPU container and records, after
each answer:

* ``gpushare.io/assigned-containers``: how many GPU containers (in ``spec.containers`` order)
  have been given their GPUs, a decimal integer;
* ``ALIYUN_COM_GPU_MEM_ASSIGNED``: ``"true"`` once all of them have (Alibaba's meaning: the
  device plugin has assigned the pod), ``"false"`` before.

A pod with a recorded allocation and ``ASSIGNED`` not ``"true"`` is *pending*: a
``PendingPod`` whose ``done`` is the count above.
"""

from __future__ import annotations

from gpushare.core.ask import PodAsk
from gpushare.core.handshake import PendingPod, pending_pod_of
from gpushare.core.model import Allocation
from gpushare.kube.codec.common import (
    ALIYUN_ASSIGNED,
    CodecError,
    Json,
    annotations_of,
    pod_key,
)
from gpushare.kube.codec.pods import (
    AlibabaAnnotations,
    alibaba_annotations,
    pod_allocation,
    pod_request,
)

__all__ = ["ASSIGNED_CONTAINERS", "handshake_annotations", "pending_of", "pending_pod"]

ASSIGNED_CONTAINERS = "gpushare.io/assigned-containers"


class _Unread:
    """The default of ``pending_pod``'s ``allocation``: not read by the caller."""


UNREAD = _Unread()


def pending_pod(pod: Json, allocation: Allocation | _Unread | None = UNREAD) -> PendingPod | None:
    """The handshake state of ``pod`` (module doc), or ``None`` when it records no allocation
    or every GPU container has been given its GPUs. ``allocation`` is ``pod_allocation(pod)``
    when the caller has it already (it is not read again). The steps' units and the Allocate
    resource come from the pod's request (``pod_request``), as the extender's do at bind.
    ``CodecError`` on garbage."""
    alibaba = alibaba_annotations(pod)
    if alibaba.assigned:
        return None
    if isinstance(allocation, _Unread):
        allocation = pod_allocation(pod)
    if allocation is None or not allocation.containers:
        return None
    key = pod_key(pod)
    return _pending(key, pod_request(pod), annotations_of(pod, f"pod {key}"), allocation, alibaba)


def pending_of(
    key: str,
    request: PodAsk,
    annotations: Json,
    allocation: Allocation | None,
    alibaba: AlibabaAnnotations,
) -> PendingPod | None:
    """``pending_pod`` of the pod ``key`` from what the caller has read: its ``request``
    (``pod_request``), ``metadata.annotations`` (values checked to be strings),
    ``allocation`` (``pod_allocation``) and ``alibaba`` annotations. ``CodecError`` on
    garbage."""
    if alibaba.assigned or allocation is None or not allocation.containers:
        return None
    return _pending(key, request, annotations, allocation, alibaba)


def _pending(
    key: str,
    request: PodAsk,
    annotations: Json,
    allocation: Allocation,
    alibaba: AlibabaAnnotations,
) -> PendingPod:
    """The pending pod of ``request`` with ``allocation``, its progress read from
    ``annotations``."""
    raw = annotations.get(ASSIGNED_CONTAINERS, "0")
    steps = len(request.gpu_containers)
    if not (raw.isascii() and raw.isdigit() and int(raw) <= steps):
        raise CodecError(
            f"pod {key}", f"annotation {ASSIGNED_CONTAINERS}", raw, "not a count of its GPU "
            "containers", f"a decimal integer 0..{steps}",
        )  # fmt: skip
    try:
        return pending_pod_of(allocation, request, alibaba.assume_time_ns or 0, int(raw))
    except ValueError as error:  # pod_allocation checks names; kept for a clear message
        names = [c.name for c in request.gpu_containers]
        raise CodecError(f"pod {key}", "containers", names, str(error), "") from None


def handshake_annotations(pod: PendingPod, done: int) -> dict[str, str]:
    """The annotations recording that ``done`` GPU containers of ``pod`` have their GPUs."""
    if not 0 <= done <= len(pod.steps):
        raise ValueError(f"pod {pod.key}: done {done} outside 0..{len(pod.steps)}")
    return {
        ASSIGNED_CONTAINERS: str(done),
        ALIYUN_ASSIGNED: "true" if done == len(pod.steps) else "false",
    }
