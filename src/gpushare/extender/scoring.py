"""Policies for the extender, and their node half mapped to kube-scheduler's integer 0–10.

**Mapping.** ``prioritize`` ranks the candidates the scheduler sent for one pod. A policy's raw
scores have policy-specific ranges (binpack and spread floats in [0, 100], FGD integers 0–100,
random [0, 1)), so they are normalised over the candidates: with ``lo``/``hi`` the lowest and
highest value, a node scores ⌊10 · (v − lo) / (hi − lo)⌋ — only the policy's best node(s) get
10, the worst get 0 — and 10 when all are equal (no preference). Nodes the pod does not fit
(or the extender does not know) get 0. Integers only: kube-scheduler cannot decode ``7.0`` as
its ``int64`` and would drop the whole answer (docs/interfaces.md, Pitfalls: 5).

**Tie-breaks.** A policy with a ``tie_break`` (``fgd-cpu``, ``fgd-spare``: integer FGD score
s, CPU-aware tie-break t in 0–100) is ranked on v = s + t / 101, which orders nodes exactly by
(s, t) as ``gpushare.core.placement.Placer`` does: t only separates nodes of equal s, and when
every candidate ties on s (frequent with FGD), t spreads them over 0–10.

``policy_value``, ``to_priorities`` and ``TIE_BREAK_SCALE`` live in the pure core
(``gpushare.core.extenderscore``, re-exported here), where the simulator's cluster-like runs
use them too.

**Context.** ``fgd``, ``fgd-cpu`` and ``fgd-spare`` need a target workload M and one whole GPU
in the node unit. ``extender_policy`` takes them as arguments; ``default_workload`` is a
placeholder M (¼, ½ and 1 GPU, and 2 whole GPUs, equally likely) until M is derived from the
cluster's pods.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpushare.core.extenderscore import TIE_BREAK_SCALE, policy_value, to_priorities
from gpushare.core.fragmentation import TargetWorkload, TaskShape
from gpushare.core.learned import node_local_context
from gpushare.core.policies import Policy, make_policy

__all__ = [
    "DEFAULT_GPU_UNIT",
    "DEFAULT_POLICY",
    "TIE_BREAK_SCALE",
    "default_workload",
    "derived_gpu_unit",
    "extender_policy",
    "policy_value",
    "to_priorities",
]

DEFAULT_POLICY = "fgd-spare"
"""The extender's policy when none is named (docs/simulator.md: never behind FGD's curve on
the openb traces, ahead at saturation)."""

DEFAULT_GPU_UNIT = 16
"""One whole GPU until nodes are known: a 16 GiB GPU in GiB (Alibaba's T4/V100 clusters)."""


def derived_gpu_unit(capacities: Mapping[int, int], fallback: int = DEFAULT_GPU_UNIT) -> int:
    """One whole GPU in the node unit, from ``capacities`` (GPU capacity → how many GPUs have
    it, ``ExtenderState.gpu_capacities``): the capacity most GPUs have (the larger on a tie),
    so that FGD's "whole GPU" is the cluster's typical GPU with nothing configured; at least 4
    (``default_workload`` needs quarters); ``fallback`` when no GPU is known."""
    known = [(count, capacity) for capacity, count in capacities.items() if count > 0]
    if not known:
        return fallback
    return max(4, max(known)[1])


def default_workload(gpu_unit: int) -> TargetWorkload:
    """A placeholder M: ¼, ½ and 1 GPU and 2 whole GPUs, equally likely (module doc)."""
    if gpu_unit < 4:
        raise ValueError(f"gpu_unit must be >= 4 node units, got {gpu_unit}")
    shapes = (
        TaskShape(0, gpu_unit // 4, 1),
        TaskShape(0, gpu_unit // 2, 1),
        TaskShape(0, gpu_unit, 1),
        TaskShape(0, gpu_unit, 2),
    )
    return TargetWorkload(shapes, (0.25,) * 4)


def extender_policy(
    name: str, *, gpu_unit: int = 16, workload: TargetWorkload | None = None
) -> Policy:
    """Policy ``name`` for the extender; ``gpu_unit`` is one whole GPU in the node unit (FGD's
    normalisation). ``KeyError`` naming the accepted names for an unknown name."""
    return make_policy(name, node_local_context(workload or default_workload(gpu_unit), gpu_unit))
