"""The benchmarks' extender state builder (``gpushare.testing.extender.populated_state``)
builds what it says."""

from __future__ import annotations

import pytest

from gpushare.kube.codec import ALIYUN_ASSIGNED
from gpushare.testing.extender import populated_state


@pytest.mark.parametrize("started", [True, False], ids=["started", "not started"])
def test_populated_state_spreads_pods_round_robin_over_nodes_and_gpus(started: bool) -> None:
    state, names = populated_state(2, 4, pending=1, started=started, gpus_per_node=2)
    assert names == ["node-0000", "node-0001"]
    assert state.cluster.synced
    # pod i: node i % 2, GPU (i // 2) % 2, 1 + (i // 2) % 2 GiB.
    assert state.reservations.ledger_state("node-0000").gpu_used == (1, 2)  # pod-0, pod-2
    assert state.reservations.ledger_state("node-0001").gpu_used == (1, 2)  # pod-1, pod-3
    assert [g.capacity for g in state.reservations.ledger_state("node-0000").node.gpus] == [16, 16]
    bound = state.cluster.pod("bench/pod-3")
    assert bound is not None
    assert bound["metadata"]["annotations"][ALIYUN_ASSIGNED] == ("true" if started else "false")
    pending = state.cluster.pod("bench/pending-0")
    assert pending is not None
    assert not pending["spec"].get("nodeName")
