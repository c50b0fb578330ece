"""Everything gpushare reads from one Pod, read once (``pod_record``). Pure; no I/O.

A caller that needs what a pod asks, Alibaba's annotations, the recorded allocation and the
handshake state (the inspect report, the extender's ledger rebuild) would read the pod's
metadata, annotations and spec four times through ``pod_request``, ``alibaba_annotations``,
``pod_allocation`` and ``pending_pod``. ``pod_record`` reads them once and hands them to the
same readers' bodies (``request_of``, ``alibaba_of``, ``allocation_of``, ``pending_of``).

Two paths, one answer. ``fast_pod_record`` serves the common, well-formed pod: plain ``dict``
and ``str`` objects where JSON decoding makes them, every part readable. Anything else (another
``Mapping`` type, a ``str`` subclass, garbage anywhere) gives ``None`` and the full path, the
four public readers one after the other, gives the answer: the same values, or the
``CodecError`` the first of them raises. ``tests/test_kube_codec_record.py`` holds both paths
to that on a table of good and bad pods.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpushare.core.ask import PodAsk
from gpushare.core.handshake import PendingPod
from gpushare.core.model import Allocation
from gpushare.kube.codec.common import CodecError, Json, annotations_of
from gpushare.kube.codec.fields import pod_node_name
from gpushare.kube.codec.handshake import pending_of
from gpushare.kube.codec.pods import (
    AlibabaAnnotations,
    alibaba_annotations,
    alibaba_of,
    allocation_of,
    pod_allocation,
    pod_request,
    request_of,
)

__all__ = ["PodRecord", "fast_pod_record", "pod_record"]


@dataclass(frozen=True, slots=True)
class PodRecord:
    """What one Pod object says: its ``key`` (``namespace/name``), the node it is ``bound``
    to (``spec.nodeName``; ``None``: not bound), what it asks (``request``: ``pod_request``),
    Alibaba's annotations (``alibaba``), the recorded ``allocation`` (``pod_allocation``) and,
    for a bound pod, its handshake state (``pending``: ``pending_pod``; ``None`` for a pod that
    is not bound)."""

    key: str
    bound: str | None
    request: PodAsk
    alibaba: AlibabaAnnotations
    allocation: Allocation | None
    pending: PendingPod | None


def pod_record(pod: Json) -> PodRecord:
    """``pod`` read once (module doc): ``fast_pod_record``, else the full path. Raises the
    ``CodecError`` that the first of ``pod_request``, ``alibaba_annotations``,
    ``pod_allocation`` and (bound pods) ``pending_pod`` raises, in that order."""
    record = fast_pod_record(pod)
    if record is not None:
        return record
    request = pod_request(pod)
    alibaba = alibaba_annotations(pod)
    allocation = pod_allocation(pod)
    bound = pod_node_name(pod) or None  # pod_allocation refused a nodeName not a string
    pending = None
    if bound is not None:  # pending_pod's work with the request already read
        annotations = annotations_of(pod, f"pod {request.key}")
        pending = pending_of(request.key, request, annotations, allocation, alibaba)
    return PodRecord(request.key, bound, request, alibaba, allocation, pending)


def fast_pod_record(pod: object) -> PodRecord | None:
    """``pod_record(pod)`` for a well-formed pod of plain ``dict``/``list``/``str`` JSON,
    reading its metadata, annotations and spec once; ``None`` for anything else (another
    ``Mapping`` or ``str`` type, or any part ``pod_record`` would refuse), for the full path to
    read or refuse. Never raises ``CodecError``."""
    if type(pod) is not dict:
        return None
    meta, spec = pod.get("metadata"), pod.get("spec")
    if type(meta) is not dict or type(spec) is not dict:
        return None
    name, namespace = meta.get("name"), meta.get("namespace") or "default"
    if type(name) is not str or not name or type(namespace) is not str:
        return None
    annotations = meta.get("annotations")
    if annotations is None:
        annotations = {}
    elif type(annotations) is not dict:
        return None
    for value in annotations.values():
        if type(value) is not str:
            return None
    bound = spec.get("nodeName") or None
    if bound is not None and type(bound) is not str:
        return None
    key = f"{namespace}/{name}"
    try:
        request = request_of(key, spec, annotations)
        alibaba = alibaba_of(key, annotations)
        allocation = allocation_of(key, annotations, bound, request, alibaba)
        pending = (
            None if bound is None else pending_of(key, request, annotations, allocation, alibaba)
        )
    except CodecError:
        return None
    return PodRecord(key, bound, request, alibaba, allocation, pending)
