"""The paper's experiment: policies × seeds on one trace, in parallel processes.

Source: the paper's evaluation as the artifact runs it (docs/simulator.md, "One run"). One run =
one seed's node tie order and
tuned pod stream (``gpushare.sim.workload``) through ``gpushare.sim.engine.simulate``: the
paper's ideal run, or with ``like_cluster`` one placed as kube-scheduler + ``gpushare extender``
would (``gpushare.sim.engine.LikeCluster``; its policy built as the extender builds it,
``gpushare.core.learned.node_local_context``).
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from gpushare.core.fragmentation import TargetWorkload
from gpushare.core.learned import node_local_context
from gpushare.core.model import Node, PodRequest
from gpushare.core.policies import Policy, PolicyContext, make_policy
from gpushare.sim.engine import LikeCluster, simulate
from gpushare.sim.metrics import Curves, bin_by_arrived
from gpushare.sim.workload import make_run

PAPER_SEEDS = tuple(range(42, 52))
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RunResult:
    """One (policy, seed) run: binned curves, pods submitted/placed, failures by pod kind,
    the empty cluster's fragmentation (% of capacity, before any pod) and the wall time of
    the placement loop in seconds."""

    policy: str
    seed: int
    curves: Curves
    pods: int
    placed: int
    failed_by_kind: dict[str, int]
    seconds: float
    empty_frag_amount_pct: float


def result_digest(result: RunResult) -> str:
    """sha256 of everything a run reports but its wall time: the repr of ``(curves, placed,
    failed_by_kind, empty_frag_amount_pct)`` followed by the bytes of the three curve arrays
    (numpy's repr rounds to 8 digits; the bytes do not). Equal digests: the same curves, bit
    for bit, and the same placements counts (``bench/openb_digests.py``)."""
    value = (result.curves, result.placed, result.failed_by_kind, result.empty_frag_amount_pct)
    hashed = hashlib.sha256(repr(value).encode())
    curves = result.curves
    for array in (curves.unallocated_pct, curves.frag_amount_pct, curves.frag_rate_pct):
        hashed.update(array.tobytes())
    return hashed.hexdigest()


def policy_context(
    nodes: Sequence[Node], pods: Sequence[PodRequest], seed: int, gpu_unit: int = 1000
) -> PolicyContext:
    """The context every policy of a run gets: M from the original pods (docs/simulator.md, "One
    run", step 2), all
    their shapes, the nodes, the largest node's CPU and GPU total, and a seeded random source."""
    return PolicyContext(
        workload=TargetWorkload.from_pods(pods),
        rng=random.Random(seed),
        max_node_cpu_milli=max((n.cpu_milli or 0) for n in nodes),
        max_node_gpu=max(sum(g.capacity for g in n.gpus) for n in nodes),
        gpu_unit=gpu_unit,
        all_shapes=TargetWorkload.from_pods(pods, coverage=1.0),
        cluster=tuple(nodes),
    )


def run_one(
    nodes: Sequence[Node],
    pods: Sequence[PodRequest],
    policy_name: str,
    seed: int,
    *,
    tune_ratio: float = 1.3,
    max_percent: int = 130,
    like_cluster: bool = False,
) -> RunResult:
    """One run of ``policy_name`` with ``seed`` (module doc); ``like_cluster``: placed as the
    cluster would (``LikeCluster(seed)``, M learned online)."""
    setup = make_run(nodes, pods, seed, tune_ratio)
    context = policy_context(nodes, pods, seed)
    assert context.workload is not None
    policy = run_policy(policy_name, context, like_cluster=like_cluster)
    started = time.perf_counter()
    record = simulate(
        nodes,
        setup.stream,
        policy,
        tie_rank=setup.tie_rank,
        workload=context.workload,
        gpu_unit=context.gpu_unit,
        like_cluster=LikeCluster(seed) if like_cluster else None,
    )
    seconds = time.perf_counter() - started
    capacity = float(sum(gpu.capacity for node in nodes for gpu in node.gpus))
    return RunResult(
        policy=policy_name,
        seed=seed,
        curves=bin_by_arrived(record, capacity, max_percent),
        pods=len(setup.stream),
        placed=record.placed,
        failed_by_kind=record.failed_by_kind,
        seconds=seconds,
        empty_frag_amount_pct=100.0 * float(record.fragmentation[0]) / capacity,
    )


def run_policy(name: str, context: PolicyContext, *, like_cluster: bool = False) -> Policy:
    """Policy ``name`` for a run: on the whole ``context`` (the paper's simulator), or, with
    ``like_cluster``, as the extender builds it: M and one whole GPU only
    (``node_local_context``)."""
    if like_cluster:
        assert context.workload is not None
        return make_policy(name, node_local_context(context.workload, context.gpu_unit))
    return make_policy(name, context)


def run_experiment(
    nodes: Sequence[Node],
    pods: Sequence[PodRequest],
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    tune_ratio: float = 1.3,
    jobs: int | None = None,
    on_done: Callable[[RunResult], None] | None = None,
    like_cluster: bool = False,
) -> list[RunResult]:
    """Every (policy, seed) run, ``jobs`` processes at a time (default: all cores; 1 runs in
    this process). ``on_done`` is called as each run finishes. Results in (policy, seed) order.
    ``like_cluster``: every run placed as the cluster would (``run_one``)."""
    calls = [
        partial(
            run_one, nodes, pods, policy, seed, tune_ratio=tune_ratio, like_cluster=like_cluster
        )
        for policy in policies
        for seed in seeds
    ]
    return run_in_processes(calls, jobs=jobs, on_done=on_done)


def run_in_processes(
    calls: Sequence[Callable[[], T]],
    *,
    jobs: int | None = None,
    on_done: Callable[[T], None] | None = None,
) -> list[T]:
    """``calls`` (picklable: module-level functions or partials of them), ``jobs`` processes at
    a time (default: all cores; 1 runs in this process); ``on_done`` as each one finishes.
    Results in the order of ``calls``."""
    workers = max(1, min(jobs or os.cpu_count() or 1, len(calls)))
    if workers == 1:
        results = []
        for call in calls:
            result = call()
            results.append(result)
            if on_done is not None:
                on_done(result)
        return results
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(call): i for i, call in enumerate(calls)}
        done: dict[int, T] = {}
        for future in as_completed(futures):
            result = future.result()
            done[futures[future]] = result
            if on_done is not None:
                on_done(result)
    return [done[i] for i in range(len(calls))]
