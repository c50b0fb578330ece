"""Reading a pod's node constraints (``gpushare.core.affinity.NodeConstraints``):
``spec.nodeSelector`` and ``spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuring
Execution.nodeSelectorTerms`` (``matchExpressions``, ``matchFields``), as the API server
stores them. Garbage raises ``CodecError`` naming the pod, the key and what is accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpushare.core.affinity import NodeConstraints, Operator, Requirement, Term
from gpushare.kube.codec.common import CodecError
from gpushare.kube.codec.fields import object_name, object_namespace

__all__ = ["pod_node_constraints"]

_TERMS = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
_REQUIREMENT = "{key, operator: In|NotIn|Exists|DoesNotExist|Gt|Lt, values: [string]}"


def pod_node_constraints(pod: Mapping[str, Any]) -> NodeConstraints:
    """The nodes ``pod`` may go to by its ``nodeSelector`` and required node affinity
    (module doc); ``CodecError`` when either cannot be read."""
    subject = f"pod {object_namespace(pod)}/{object_name(pod)}"
    spec = pod.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    raw = spec.get("nodeSelector") or {}
    if not isinstance(raw, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise CodecError(subject, "spec.nodeSelector", raw, "not a map of strings", "{k: v}")
    selector = tuple(sorted(raw.items()))
    affinity = spec.get("affinity")
    node = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = (
        node.get("requiredDuringSchedulingIgnoredDuringExecution")
        if isinstance(node, Mapping)
        else None
    )
    if required is None:
        return NodeConstraints(selector)
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    if not isinstance(terms, list):
        raise CodecError(
            subject, f"{_TERMS}.nodeSelectorTerms", terms, "not a list", "[{matchExpressions}]"
        )
    return NodeConstraints(selector, tuple(_term(subject, i, t) for i, t in enumerate(terms)))


def _term(subject: str, index: int, term: object) -> Term:
    where = f"{_TERMS}.nodeSelectorTerms[{index}]"
    if not isinstance(term, Mapping):
        raise CodecError(subject, where, term, "not an object", "{matchExpressions, matchFields}")
    return Term(
        _requirements(subject, f"{where}.matchExpressions", term.get("matchExpressions")),
        _requirements(subject, f"{where}.matchFields", term.get("matchFields")),
    )


def _requirements(subject: str, where: str, items: object) -> tuple[Requirement, ...]:
    if items is None:
        return ()
    if not isinstance(items, list):
        raise CodecError(subject, where, items, "not a list", f"[{_REQUIREMENT}]")
    found = []
    for i, item in enumerate(items):
        values = item.get("values") or [] if isinstance(item, Mapping) else None
        if (
            not isinstance(item, Mapping)
            or not isinstance(item.get("key"), str)
            or item.get("operator") not in set(Operator)
            or not isinstance(values, list)
            or not all(isinstance(v, str) for v in values)
        ):
            raise CodecError(subject, f"{where}[{i}]", item, "not a requirement", _REQUIREMENT)
        found.append(Requirement(item["key"], Operator(item["operator"]), tuple(values)))
    return tuple(found)
