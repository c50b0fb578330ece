"""``fgd-spare``: ``fgd-cpu``'s tie-break, except that GPU pods get no credit on an untouched
node with two GPUs or more (docs/simulator.md, "Below saturation")."""

from __future__ import annotations

import pytest

from gpushare.core.fragmentation import TargetWorkload, TaskShape
from gpushare.core.model import ContainerRequest, NodeState, PodRequest
from gpushare.core.placement import Placer
from gpushare.core.policies import PolicyContext, make_policy
from gpushare.core.policies.fgd_cpu import FgdCpuPolicy, node_type
from gpushare.core.policies.fgd_spare import FgdSparePolicy, cpu_pressure
from gpushare.testing.core import gpu_node

WORKLOAD = TargetWorkload((TaskShape(8000, 500, 1), TaskShape(8000, 1000, 1)), (0.5, 0.5))
CONTEXT = PolicyContext(workload=WORKLOAD)
SHARE = PodRequest("share", (ContainerRequest("main", 500),), cpu_milli=8000)
CPU_ONLY = PodRequest("cpu", (ContainerRequest("main", 0, 0),), cpu_milli=8000)
EIGHT = gpu_node((1000,) * 8, name="eight", model="G2", cpu_milli=96_000)
ONE = gpu_node((1000,), name="one", model="T4", cpu_milli=32_000)
COMPUTE_IN_USE = NodeState(EIGHT, (0,) * 8, gpu_compute_used=(100,) + (0,) * 7)

# (case, node state, pod, spared: tie-break 0 instead of fgd-cpu's)
CASES = [
    ("an untouched 8-GPU node is spared", NodeState.empty(EIGHT), SHARE, True),
    ("an 8-GPU node in use is not", NodeState(EIGHT, (500,) + (0,) * 7), SHARE, False),
    ("a node with compute in use is in use", COMPUTE_IN_USE, SHARE, False),
    ("an untouched 1-GPU node is not: no multi-GPU pod fits it", NodeState.empty(ONE), SHARE,
     False),
    ("a CPU-only pod is never held back", NodeState.empty(EIGHT), CPU_ONLY, False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("state", "pod", "spared"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_the_tie_break_spares_untouched_multi_gpu_nodes(
    state: NodeState, pod: PodRequest, spared: bool
) -> None:
    ours, cpu = FgdSparePolicy(CONTEXT), FgdCpuPolicy(CONTEXT)
    expected = 0.0 if spared else cpu.tie_break(state, pod)
    assert ours.tie_break(state, pod) == expected
    assert ours.score(state, pod) == make_policy("fgd", CONTEXT).score(state, pod)
    assert ours.choose_gpus(state, pod) == cpu.choose_gpus(state, pod)


def test_among_untouched_nodes_the_node_order_decides_not_cpu() -> None:
    """The openb failure this policy fixes: two untouched 8-GPU nodes FGD scores alike.
    fgd-cpu sends a 16-vCPU pod to the 128-vCPU node whatever the order (the host an 8-GPU pod
    asking 120 vCPU needs); fgd-spare leaves it to the node order, as FGD does."""
    rich = NodeState.empty(gpu_node((1000,) * 8, name="rich", cpu_milli=128_000))
    lean = NodeState.empty(gpu_node((1000,) * 8, name="lean", cpu_milli=64_000))
    request = PodRequest("p", (ContainerRequest("main", 500),), cpu_milli=16_000)
    for order, first in (((0, 1), "rich"), ((1, 0), "lean")):
        cpu = Placer([rich, lean], FgdCpuPolicy(CONTEXT), order).decide(request)
        spare = Placer([rich, lean], FgdSparePolicy(CONTEXT), order).decide(request)
        assert cpu is not None
        assert spare is not None
        assert (cpu.allocation.node, spare.allocation.node) == ("rich", first)


def test_it_is_registered() -> None:
    assert make_policy("fgd-spare", CONTEXT).name == "fgd-spare"


# ---- rules 2-4: what the cluster and its whole workload tell (simulator context) -------------

G2 = gpu_node((1000,) * 8, name="g2", model="G2", cpu_milli=96_000)
V100 = gpu_node((1000,) * 8, name="v100", model="V100", cpu_milli=96_000)
G3 = gpu_node((1000,) * 8, name="g3", model="G2", cpu_milli=128_000)
CLUSTER = (G2,) * 6 + (V100, G3)  # 64 GPUs: V100 and G3 hold 8 each


def context(*shapes: tuple[TaskShape, float]) -> PolicyContext:
    """The simulator's context: M, and every shape weighted, over ``CLUSTER``."""
    all_shapes = TargetWorkload(tuple(s for s, _ in shapes), tuple(w for _, w in shapes))
    return PolicyContext(workload=WORKLOAD, all_shapes=all_shapes, cluster=CLUSTER)


PINNED = TaskShape(8000, 1000, 1, frozenset({"V100"}))
EIGHT_BIG = TaskShape(120_000, 1000, 8)
SMALL = TaskShape(2000, 500, 1)  # light on CPU: the workloads below are not CPU-bound
CPU_POD = TaskShape(8000, 0, 0)
V100_USED = NodeState(V100, (500,) + (0,) * 7)
G3_USED = NodeState(G3, (500,) + (0,) * 7)

# (case, context, state, pod, spared: tie-break 0 instead of fgd-cpu's)
RULE_CASES = [
    ("rule 2: a pinned model's nodes are reserved even for a rare pinned shape",
     context((SMALL, 0.99), (PINNED, 0.01)), V100_USED, SHARE, True),
    ("rule 2: without pinned shapes they are not",
     context((SMALL, 1.0)), V100_USED, SHARE, False),
    ("rule 3: CPU-only pods spare untouched hosts of a scarce multi-GPU shape",
     context((SMALL, 0.9), (EIGHT_BIG, 0.05), (CPU_POD, 0.05)), NodeState.empty(G3), CPU_ONLY,
     True),
    ("rule 3: once the host is in use they do not",
     context((SMALL, 0.9), (EIGHT_BIG, 0.05), (CPU_POD, 0.05)), G3_USED, CPU_ONLY, False),
    ("rule 3: other untouched nodes take CPU-only pods as fgd-cpu places them",
     context((SMALL, 0.9), (EIGHT_BIG, 0.05), (CPU_POD, 0.05)), NodeState.empty(G2), CPU_ONLY,
     False),
    ("rule 4: a CPU-bound workload (more of the CPU than of the GPU) is FGD's order",
     context((TaskShape(60_000, 500, 1), 1.0)), G3_USED, SHARE, True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("ctx", "state", "pod", "spared"), [c[1:] for c in RULE_CASES], ids=[c[0] for c in RULE_CASES]
)
def test_the_tie_break_spares_what_scarce_shapes_need(
    ctx: PolicyContext, state: NodeState, pod: PodRequest, spared: bool
) -> None:
    ours, cpu = FgdSparePolicy(ctx), FgdCpuPolicy(ctx)
    if spared:
        assert cpu.tie_break(state, pod) > 0  # the case is one where fgd-cpu would steer
    expected = 0.0 if spared else cpu.tie_break(state, pod)
    assert ours.tie_break(state, pod) == expected


def test_cpu_pressure_is_the_cpu_share_over_the_gpu_share() -> None:
    """One shape of 60 vCPU and half a GPU asks 60/800 of the cluster's CPU per copy
    (6 × 96 + 96 + 128 = 800 vCPU) and 0.5/64 of its GPU: pressure 9.6, CPU-bound."""
    pressure = cpu_pressure(CLUSTER, TargetWorkload((TaskShape(60_000, 500, 1),), (1.0,)))
    assert pressure == pytest.approx((60 / 800) / (0.5 / 64))
    assert cpu_pressure((gpu_node((1000,)),), TargetWorkload((SMALL,), (1.0,))) is None  # no CPU


def test_it_reserves_scarce_hosts_at_a_lower_ratio_than_fgd_cpu() -> None:
    """The 120-vCPU 8-GPU shape's only hosts (G3, 1/8 of the GPUs) are asked for 1.6 % of the
    demand: above 0.05 × 1/8 (``SPARE_RESERVE_RATIO``), below 0.25 × 1/8 (``RESERVE_RATIO``).
    fgd-spare reserves G3 from other GPU pods; fgd-cpu does not."""
    ctx = context((SMALL, 0.999), (EIGHT_BIG, 0.001))
    ours, cpu = FgdSparePolicy(ctx), FgdCpuPolicy(ctx)
    assert node_type(G3) in ours.reserved
    assert node_type(G3) not in cpu.reserved
    assert cpu.tie_break(G3_USED, SHARE) > 0
    assert ours.tie_break(G3_USED, SHARE) == 0.0
