"""Plain fields of Kubernetes objects that every component reads: an object's name and
namespace, a pod's UID, node, phase, whether it is finished or being deleted, its container
IDs, an annotation, a condition and the resource names its containers ask, and what
preemption reads (priority, preemption policy, start time, labels); a node's labels and
InternalIP. Pure; no I/O.

These readers are lenient: a field that is missing, or of the wrong JSON type, reads as empty
(``""``, ``None``, ``False``, ``{}``) and nothing raises, because they serve caches, watches and
reports that must keep going over any object the API server sends. The readers that must refuse
garbage (``pod_request``, ``pod_allocation``, ``node_info``, ``pod_key``) raise ``CodecError``.
Field names and meanings: the Kubernetes API reference (``ObjectMeta``, ``PodSpec``,
``PodStatus``, ``NodeStatus``) and docs/interfaces.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from gpushare.kube.codec.common import GPUSHARE_LABEL, Json

__all__ = [
    "TERMINAL_PHASES",
    "PodCondition",
    "is_gpushare_node",
    "node_internal_ip",
    "node_labels",
    "object_labels",
    "object_name",
    "object_namespace",
    "phase_finished",
    "pod_annotation",
    "pod_condition",
    "pod_container_names",
    "pod_deleting",
    "pod_deletion_timestamp",
    "pod_finished",
    "pod_node_name",
    "pod_phase",
    "pod_preempts",
    "pod_priority",
    "pod_resource_names",
    "pod_started_s",
    "pod_uid",
]

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
"""The pod phases in which every container has terminated for good (Kubernetes "Pod
Lifecycle", pod phase): a pod in one holds no GPU any more and is counted nowhere."""

_CONTAINER_STATUSES = ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses")


def _dig(obj: object, *keys: str) -> object:
    """``obj[k1][k2]...``, or ``None`` where a level is missing or not an object."""
    value = obj
    for key in keys:
        if type(value) is not dict and not isinstance(value, Mapping):  # dict: no ABC check
            return None
        value = value.get(key)
    return value


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def object_name(obj: Json) -> str:
    """``metadata.name``, or ``""``."""
    return _text(_dig(obj, "metadata", "name"))


def object_namespace(obj: Json) -> str:
    """``metadata.namespace``, or ``""`` (cluster-scoped, or absent: no default is applied)."""
    return _text(_dig(obj, "metadata", "namespace"))


def pod_uid(pod: Json) -> str:
    """``metadata.uid``, or ``""``."""
    return _text(_dig(pod, "metadata", "uid"))


def pod_node_name(pod: Json) -> str:
    """``spec.nodeName``, or ``""`` when the pod is not bound."""
    return _text(_dig(pod, "spec", "nodeName"))


def pod_phase(pod: Json) -> str:
    """``status.phase`` (``Pending``, ``Running``, ``Succeeded``, ``Failed``, ``Unknown``), or
    ``""``."""
    return _text(_dig(pod, "status", "phase"))


def phase_finished(phase: object) -> bool:
    """Whether ``status.phase`` ``phase`` is one of ``TERMINAL_PHASES`` (``Succeeded`` or
    ``Failed``): the pod holds nothing any more. The one rule every component uses for
    "finished" (``pod_finished`` of a whole pod; readers that hold the phase already)."""
    return isinstance(phase, str) and phase in TERMINAL_PHASES


def pod_finished(pod: Json) -> bool:
    """Whether the pod is finished (``phase_finished`` of its ``status.phase``)."""
    return phase_finished(pod_phase(pod))


def pod_deletion_timestamp(pod: Json) -> str:
    """``metadata.deletionTimestamp`` (RFC 3339), or ``""`` when the pod is not being deleted."""
    return _text(_dig(pod, "metadata", "deletionTimestamp"))


def pod_deleting(pod: Json) -> bool:
    """Whether ``metadata.deletionTimestamp`` is set: the pod is being deleted (its containers
    may still run through their grace period, but it is not started anew)."""
    return bool(pod_deletion_timestamp(pod))


def pod_priority(pod: Json) -> int:
    """``spec.priority`` (set by the API server's Priority admission from
    ``priorityClassName``), or 0 when absent or not an integer (kube-scheduler's
    ``corev1helpers.PodPriority`` reads an absent priority as 0)."""
    value = _dig(pod, "spec", "priority")
    return value if type(value) is int else 0


def pod_preempts(pod: Json) -> bool:
    """Whether the pod may preempt others: ``spec.preemptionPolicy`` is not ``Never`` (absent
    means ``PreemptLowerPriority``)."""
    return _dig(pod, "spec", "preemptionPolicy") != "Never"


def pod_started_s(pod: Json) -> float | None:
    """``status.startTime`` (RFC 3339, set by kubelet when it accepts the pod) as seconds since
    the Unix epoch, or ``None`` when absent or unreadable (the pod has lost no work)."""
    value = _dig(pod, "status", "startTime")
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def object_labels(obj: Json) -> Mapping[str, str]:
    """``metadata.labels`` (``{}`` when missing or not an object)."""
    labels = _dig(obj, "metadata", "labels")
    return labels if isinstance(labels, Mapping) else {}


def pod_annotation(pod: Json, key: str) -> str | None:
    """``metadata.annotations[key]`` when it is a string, else ``None``."""
    value = _dig(pod, "metadata", "annotations", key)
    return value if isinstance(value, str) else None


def pod_container_names(pod: Json) -> dict[str, str]:
    """Container names by container ID, from ``status.containerStatuses`` and the init and
    ephemeral ones; the ID without its ``<runtime>://`` prefix (``containerd://abc`` → ``abc``).
    Entries without an ID (not started yet) are left out."""
    names: dict[str, str] = {}
    for kind in _CONTAINER_STATUSES:
        entries = _dig(pod, "status", kind)
        for entry in entries if isinstance(entries, list) else ():
            ident, name = _dig(entry, "containerID"), _dig(entry, "name")
            if isinstance(ident, str) and ident and isinstance(name, str):
                names[ident.rpartition("://")[2]] = name
    return names


@dataclass(frozen=True, slots=True)
class PodCondition:
    """One entry of ``status.conditions`` (``PodCondition``): each field ``""`` when missing or
    not a string. ``last_transition`` is the RFC 3339 time as written."""

    status: str
    reason: str
    message: str
    last_transition: str


def pod_condition(pod: Json, kind: str) -> PodCondition | None:
    """The pod's first ``status.conditions`` entry of type ``kind`` (``PodScheduled``,
    ``Ready``, ...), or ``None``."""
    entries = _dig(pod, "status", "conditions")
    for entry in entries if isinstance(entries, list) else ():
        if _dig(entry, "type") == kind:
            return PodCondition(
                _text(_dig(entry, "status")),
                _text(_dig(entry, "reason")),
                _text(_dig(entry, "message")),
                _text(_dig(entry, "lastTransitionTime")),
            )
    return None


def pod_resource_names(pod: Json) -> frozenset[str]:
    """Every resource name in the ``limits`` or ``requests`` of the pod's containers and init
    containers."""
    names: set[str] = set()
    for kind in ("containers", "initContainers"):
        containers = _dig(pod, "spec", kind)
        for container in containers if isinstance(containers, list) else ():
            for field in ("limits", "requests"):
                amounts = _dig(container, "resources", field)
                if isinstance(amounts, Mapping):
                    names.update(k for k in amounts if isinstance(k, str))
    return frozenset(names)


def node_labels(node: Json) -> Mapping[str, str]:
    """A node's ``metadata.labels`` (``{}`` when missing or not an object)."""
    return object_labels(node)


def is_gpushare_node(node: Json) -> bool:
    """Whether a node carries the label ``gpushare=true`` (docs/design.md, "Node modes")."""
    return node_labels(node).get(GPUSHARE_LABEL) == "true"


def node_internal_ip(node: Json) -> str | None:
    """The first ``InternalIP`` in ``status.addresses``, or ``None``."""
    addresses = _dig(node, "status", "addresses")
    for item in addresses if isinstance(addresses, list) else ():
        if _dig(item, "type") == "InternalIP":
            address = _dig(item, "address")
            if isinstance(address, str) and address:
                return address
    return None
