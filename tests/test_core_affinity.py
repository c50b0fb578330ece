"""Which nodes a pod may go to by its nodeSelector and required node affinity
(gpushare.core.affinity), as kube-scheduler's NodeAffinity plugin decides it."""

from __future__ import annotations

import pytest

from gpushare.core.affinity import NodeConstraints, Operator, Requirement, Term

LABELS = {"kubernetes.io/hostname": "n1", "zone": "a", "gpus": "4"}


def term(*requirements: tuple[str, Operator, tuple[str, ...]]) -> Term:
    return Term(tuple(Requirement(*r) for r in requirements))


@pytest.mark.parametrize(
    ("constraints", "allowed"),
    [
        pytest.param(NodeConstraints(), True, id="no-constraint-allows-any-node"),
        pytest.param(NodeConstraints((("zone", "a"),)), True, id="selector-matching-label"),
        pytest.param(NodeConstraints((("zone", "a"), ("kubernetes.io/hostname", "n2"))), False,
                     id="every-selector-pair-must-match"),
        pytest.param(NodeConstraints(terms=()), False, id="required-affinity-with-no-term-none"),
        pytest.param(NodeConstraints(terms=(Term(),)), False, id="an-empty-term-matches-nothing"),
        pytest.param(NodeConstraints(terms=(term(("zone", Operator.IN, ("b",))),
                                            term(("zone", Operator.IN, ("a", "c"))))), True,
                     id="terms-are-ored"),
        pytest.param(NodeConstraints(terms=(term(("zone", Operator.IN, ("a",)),
                                                 ("gpus", Operator.GT, ("4",))),)), False,
                     id="expressions-of-a-term-are-anded-gt-is-strict"),
        pytest.param(NodeConstraints(terms=(term(("gpus", Operator.LT, ("8",))),)), True,
                     id="lt-compares-integers"),
        pytest.param(NodeConstraints(terms=(term(("gpus", Operator.GT, ("x",))),)), False,
                     id="gt-with-a-non-integer-never-matches"),
        pytest.param(NodeConstraints(terms=(term(("zone", Operator.NOT_IN, ("b",)),
                                                 ("spot", Operator.DOES_NOT_EXIST, ())),)), True,
                     id="not-in-and-does-not-exist"),
        pytest.param(NodeConstraints(terms=(term(("spot", Operator.EXISTS, ())),)), False,
                     id="exists-needs-the-label"),
        pytest.param(NodeConstraints(terms=(Term(fields=(Requirement(
            "metadata.name", Operator.IN, ("n1",)),)),)), True,
                     id="match-fields-on-the-node-name"),
    ],
)  # fmt: skip
def test_allows(constraints: NodeConstraints, allowed: bool) -> None:
    assert constraints.allows("n1", LABELS) is allowed
