"""``fgd-spare``: ``fgd-cpu``'s tie-break, except that GPU pods get no credit on an untouched
node with two GPUs or more (docs/simulator.md, "Below saturation")."""

from __future__ import annotations

import pytest

from gpushare.core.fragmentation import TargetWorkload, TaskShape
from gpushare.core.model import ContainerRequest, NodeState, PodRequest
from gpushare.core.placement import Placer
from gpushare.core.policies import PolicyContext, make_policy
from gpushare.core.policies.fgd_cpu import FgdCpuPolicy
from gpushare.core.policies.fgd_spare import FgdSparePolicy
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
