"""Which nodes a pod may go to by its own constraints: ``spec.nodeSelector`` and the required
node affinity (``requiredDuringSchedulingIgnoredDuringExecution``). Pure.

kube-scheduler's NodeAffinity plugin keeps a node when every ``nodeSelector`` pair is among
its labels **and**, when the pod has required node affinity, at least one of its
``nodeSelectorTerms`` matches; a term matches when all its ``matchExpressions`` hold on the
labels and all its ``matchFields`` on the node's fields (only ``metadata.name`` exists). The
operators are those of ``k8s.io/component-helpers/scheduling/corev1/nodeaffinity``: ``In``,
``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt`` and ``Lt`` (integers); a term with no
requirement matches nothing, as there. Taints and tolerations are not read here (the
``gpushare inspect`` pending reason does not honour them; docs/inspect.md).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["NodeConstraints", "Operator", "Requirement", "Term"]


class Operator(enum.StrEnum):
    """A node selector requirement's operator."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GT = "Gt"
    LT = "Lt"


@dataclass(frozen=True, slots=True)
class Requirement:
    """``key`` ``operator`` ``values``, on a node's labels or fields."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def holds(self, found: Mapping[str, str]) -> bool:
        """Whether the requirement holds on ``found`` (labels or fields)."""
        value = found.get(self.key)
        match self.operator:
            case Operator.IN:
                return value is not None and value in self.values
            case Operator.NOT_IN:
                return value is None or value not in self.values
            case Operator.EXISTS:
                return value is not None
            case Operator.DOES_NOT_EXIST:
                return value is None
            case _:
                return _compare(self.operator, value, self.values)


def _compare(operator: Operator, value: str | None, values: tuple[str, ...]) -> bool:
    """``Gt``/``Lt``: the label and the one value both integers, compared."""
    if value is None or len(values) != 1:
        return False
    try:
        have, bound = int(value), int(values[0])
    except ValueError:
        return False
    return have > bound if operator is Operator.GT else have < bound


@dataclass(frozen=True, slots=True)
class Term:
    """One ``nodeSelectorTerm``: every expression on the labels, every field requirement on
    the fields (``metadata.name``); an empty term matches no node."""

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        """Whether node ``name`` with ``labels`` matches the term."""
        if not (self.expressions or self.fields):
            return False
        node_fields = {"metadata.name": name}
        return all(r.holds(labels) for r in self.expressions) and all(
            r.holds(node_fields) for r in self.fields
        )


@dataclass(frozen=True, slots=True)
class NodeConstraints:
    """A pod's ``nodeSelector`` (``selector``: label pairs) and required node affinity
    (``terms``, any of which must match; ``None``: the pod has none)."""

    selector: tuple[tuple[str, str], ...] = ()
    terms: tuple[Term, ...] | None = None

    @property
    def any(self) -> bool:
        """Whether the pod constrains its nodes at all."""
        return bool(self.selector) or self.terms is not None

    def describe(self) -> str:
        """What constrains the pod: ``nodeSelector``, ``required node affinity`` or both."""
        parts = (["nodeSelector"] if self.selector else []) + (
            ["required node affinity"] if self.terms is not None else []
        )
        return " and ".join(parts) or "nothing"

    def allows(self, name: str, labels: Mapping[str, str]) -> bool:
        """Whether node ``name`` with ``labels`` is one the pod may go to (module doc)."""
        if any(labels.get(key) != value for key, value in self.selector):
            return False
        return self.terms is None or any(term.matches(name, labels) for term in self.terms)
