"""``held_error``: the filter's ``Error`` for a pod the device-plugin handshake rule holds, so
that kube-scheduler retries it with backoff rather than waiting for a cluster event that may
have raced past the extender's watch (``gpushare.extender.outcomes``). Which nodes the rule
held (``Verdict.held``, not the reason's text) is the scheduler's part, held to it reason by
reason in ``tests/test_inspect_agreement.py``."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpushare.core.fit import Reason
from gpushare.extender import outcomes
from gpushare.extender.outcomes import held_error, outcome_of

WAITS = f"gpushare: {Reason.HANDSHAKE}; container main; requested 4"
PREFIX = f"{outcomes.HELD}: "


@dataclass(frozen=True)
class Case:
    id: str
    passed: list[str]
    held: dict[str, str]  # the nodes the rule refused (``Verdict.held``), with their reasons
    error: str


CASES = [
    Case("nothing held: no error", [], {}, ""),
    Case("a node passes: the pod is placed there, no error", ["a"], {"b": WAITS}, ""),
    Case("held on the only node: an error naming it", [], {"a": WAITS}, f"{PREFIX}a: {WAITS}"),
    Case("held on five nodes: names three and counts the rest",
         [], dict.fromkeys("abcde", WAITS),
         f"{PREFIX}a: {WAITS}; b: {WAITS}; c: {WAITS}; and 2 more nodes"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_held_error(case: Case) -> None:
    assert held_error(case.passed, case.held) == case.error


@pytest.mark.parametrize(
    ("error", "outcome"),
    [("", "ok"), (f"{PREFIX}a: {WAITS}", "held"), ("gpushare: pod x: bad request", "error")],
    ids=["no error is ok", "a handshake hold is held, not an error", "any other text is error"],
)
def test_outcome_label(error: str, outcome: str) -> None:
    assert outcome_of(error) == outcome
