"""The extender's prioritize answer: a policy's values for one pod mapped to kube-scheduler's
integer extender priorities 0–10, and how kube-scheduler adds them to its own scores.

Pure; the extender (``gpushare.extender.scoring``, which re-exports ``policy_value``,
``to_priorities`` and ``TIE_BREAK_SCALE``) answers kube-scheduler with them, and the simulator's
cluster-like runs (``gpushare.sim.engine``) rank GPU pods' nodes with them.

**Mapping** (docs/extender.md): with ``lo``/``hi`` the lowest and highest value over the nodes
the pod fits, a node scores ⌊10 · (v − lo) / (hi − lo)⌋ (only the best get 10, the worst 0),
10 when all are equal; nodes the pod does not fit get 0. A policy with a tie-break ranks on
v = score + tie-break / 101 (``TIE_BREAK_SCALE``), which orders nodes exactly as
``gpushare.core.placement.Placer`` does.

**In kube-scheduler** (v1.37.1, ``pkg/scheduler/schedule_one.go``, ``prioritizeNodes``): an
extender's priority is multiplied by its weight and by ``MaxNodeScore / MaxExtenderPriority``
(100 / 10) and added to the score plugins' total (``extender_score``).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

from gpushare.core.model import NodeState, PodRequest
from gpushare.core.policies.base import Policy, TieBreak

MIN_PRIORITY = 0
"""The lowest extender priority (``extenderv1.MinExtenderPriority``)."""

MAX_PRIORITY = 10
"""The highest extender priority (``extenderv1.MaxExtenderPriority``)."""

TIE_BREAK_SCALE = 101.0
"""t / 101 < 1 for t in 0..100: a tie-break never outweighs one point of the primary score."""

K = TypeVar("K", bound=Hashable)


def policy_value(
    policy: Policy, state: NodeState, pod: PodRequest, *, tie_break: TieBreak | None
) -> float:
    """The value ranked by prioritize (module doc); ``tie_break`` is the policy's
    (``gpushare.core.policies.tie_break_of``, resolved once by the caller). Precondition:
    ``pod`` fits ``state``."""
    value = policy.score(state, pod)
    if tie_break is not None:
        value += tie_break(state, pod) / TIE_BREAK_SCALE
    return value


def to_priorities(values: Mapping[K, float], candidates: Sequence[K]) -> dict[K, int]:
    """Integer 0–10 per candidate from ``values`` (only the nodes the pod fits; module doc)."""
    scores = dict.fromkeys(candidates, MIN_PRIORITY)
    finite = {name: v for name, v in values.items() if math.isfinite(v)}
    if not finite:
        return scores
    lo, hi = min(finite.values()), max(finite.values())
    if hi == lo:
        scores.update(dict.fromkeys(finite, MAX_PRIORITY))
        return scores
    span, floor = hi - lo, math.floor
    # ⌊10·(v − lo)/(hi − lo)⌋, kept within 0..10 against rounding at v == hi.
    scores.update(
        (name, min(MAX_PRIORITY, floor(MAX_PRIORITY * (value - lo) / span)))
        for name, value in finite.items()
    )
    return scores


def extender_score(priority: int, weight: int, max_node_score: int = 100) -> int:
    """What an extender's ``priority`` adds to a node's total in kube-scheduler:
    ``priority · weight · (max_node_score / MAX_PRIORITY)`` (integer division, as Go's)."""
    return priority * weight * (max_node_score // MAX_PRIORITY)
