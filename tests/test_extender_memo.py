"""The scheduler's memoised filter/prioritize answers equal a fresh scheduler's, always.

The scheduler keeps each node's verdict and policy value per pod shape until the node's
``version`` changes (``gpushare.extender.memo.NodeShapeCache``). A random sequence of binds,
releases, node removals and resizes, unknown and repeated node names, windows over the nodes
that differ from request to request (as kube-scheduler's rotate), and a cache so small that it
keeps emptying itself, must never make a long-lived scheduler answer differently from one built
just now.
"""

from __future__ import annotations

import json
import random
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.core.model import Allocation, ContainerAllocation
from gpushare.extender import memo
from gpushare.extender.bindapi import UnwiredBinder
from gpushare.extender.scheduler import Scheduler
from gpushare.extender.scoring import extender_policy
from gpushare.extender.state import ExtenderState
from gpushare.extender.wire import ExtenderArgs, decode, encode
from gpushare.kube.codec import MemoryUnit, allocation_annotations
from gpushare.testing.extender import node_json, pod_json

NODES = [f"n{i}" for i in range(8)]


@pytest.mark.parametrize("policy", ["binpack", "spread", "fgd"])
@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_memoised_answers_equal_a_fresh_schedulers(policy: str, seed: int) -> None:
    rng = random.Random(seed)
    state = ExtenderState()
    state.cluster.mark_synced()
    for name in NODES:
        state.upsert_node(node_json(name, [16] * 4, unit=MemoryUnit.GIB))
    with patch.object(memo, "CACHE_LIMIT", 6), patch.object(memo, "SHAPE_LIMIT", 2):
        long_lived = Scheduler(state, extender_policy(policy), UnwiredBinder())
    bound = 0
    for _ in range(150):
        roll = rng.random()
        if roll < 0.35:
            info = state.cluster.node(rng.choice(NODES))
            if info is None:
                continue
            gpu = rng.randrange(len(info.node.gpus))
            share = rng.choice([1, 2, 4, 8])
            allocation = Allocation(
                f"b/p{bound}", info.node.name, (ContainerAllocation("main", (gpu,), share),)
            )
            notes = allocation_annotations(allocation, info.node, now_ns=0, unit=MemoryUnit.GIB)
            state.observe_pod(
                pod_json(f"p{bound}", share, namespace="b", node=info.node.name, annotations=notes)
            )
            bound += 1
        elif roll < 0.5 and bound:
            state.forget_pod(f"b/p{rng.randrange(bound)}")
        elif roll < 0.55:
            state.remove_node(rng.choice(NODES))
        elif roll < 0.6:
            gpus = [rng.choice([8, 16])] * rng.choice([2, 4])
            state.upsert_node(node_json(rng.choice(NODES), gpus, unit=MemoryUnit.GIB))
        else:
            window = rng.random()
            if window < 0.4:
                names = [*NODES, "ghost"]
            elif window < 0.8:  # kube-scheduler's window, rotating over the nodes
                start = rng.randrange(len(NODES))
                names = [*NODES, *NODES][start : start + 5]
            else:
                names = rng.sample([*NODES, "ghost"], 5)
            if rng.random() < 0.1:
                names = names + names[:2]
            pending = pod_json("pending", rng.choice([4, 12, 20]), namespace="b")
            body = json.dumps({"Pod": pending, "Nodes": None, "NodeNames": names}).encode()
            fresh = Scheduler(state, extender_policy(policy), UnwiredBinder())
            for verb in ("filter", "prioritize"):
                memoised = getattr(long_lived, verb)(decode(body, ExtenderArgs, verb))
                expected = getattr(fresh, verb)(decode(body, ExtenderArgs, verb))
                assert encode(memoised) == encode(expected), (verb, names)
