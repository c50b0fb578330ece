"""The extender's parts are small objects with public names.

* No module imports another module's private name (``from gpushare.x import _y``); scanned over
  the whole package, ``gpushare.sim.trace`` and ``gpushare.testing`` excepted (not yet done).
* A policy's optional members are declared on protocols (``TieBreaking``, ``Generational``)
  and read with ``tie_break_of`` / ``generational``, never with ``getattr``.
* The bind verb owns its locks: ``PodLocks`` runs one pod's binds one at a time and forgets a
  pod's lock once nobody holds or awaits it; ``LoopLock`` is one lock per event loop.
* ``NodeShapeCache`` answers only at the node version it was given, and stays bounded.
* ``ExtenderState``'s ledger face: ``ledger_state`` leaves out what skipped pods are charged
  with (``schedulable_state`` counts it), ``allocation``/``allocations``/``allocation_count``.
"""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

import gpushare
from gpushare.core.policies import Policy, generational, tie_break_of
from gpushare.extender.binding import LoopLock, PodLocks
from gpushare.extender.memo import NodeShapeCache
from gpushare.extender.scoring import extender_policy
from gpushare.extender.state import ExtenderState
from gpushare.extender.workload import AdaptiveFgd, WorkloadTracker
from gpushare.kube.codec import ALIYUN_ASSIGNED, ALIYUN_IDX, ALIYUN_POD, MemoryUnit
from gpushare.testing.extender import node_json, pod_json

PACKAGE = Path(gpushare.__file__).parent
NOT_YET = ("sim/trace/", "testing/", "deviceplugin/_proto/")
"""Left out: ``sim.trace`` and ``testing`` still import private names across modules (beyond
the extender, not cleaned up yet); ``_proto`` is generated."""


def sources() -> list[tuple[str, ast.Module]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if not where.startswith(NOT_YET):
            found.append((where, ast.parse(path.read_text(), where)))
    return found


def test_no_module_imports_another_modules_private_name() -> None:
    private = [
        f"{where}: from {node.module} import {alias.name}"
        for where, tree in sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpushare")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]
    assert private == []


def test_no_policy_member_is_looked_up_with_getattr() -> None:
    lookups = [
        f"{where}:{node.lineno}"
        for where, tree in sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr")
        and len(node.args) > 1
        and isinstance(node.args[1], ast.Constant)
        and node.args[1].value in ("tie_break", "generation")
    ]
    assert lookups == []


def adaptive(name: str) -> Policy:
    return AdaptiveFgd(name, WorkloadTracker(16))


POLICIES = [
    # name, policy, has a tie-break, has a generation
    ("binpack", lambda: extender_policy("binpack"), False, False),
    ("fgd", lambda: extender_policy("fgd"), False, False),
    ("fgd-cpu", lambda: extender_policy("fgd-cpu"), True, False),
    ("fgd on the cluster's workload", lambda: adaptive("fgd"), True, True),
    ("fgd-cpu on the cluster's workload", lambda: adaptive("fgd-cpu"), True, True),
]


@pytest.mark.parametrize(
    ("name", "build", "tie_break", "generation"), POLICIES, ids=[case[0] for case in POLICIES]
)
def test_optional_policy_members_come_from_their_protocols(
    name: str, build: Callable[[], Policy], tie_break: bool, generation: bool
) -> None:
    policy = build()
    assert (tie_break_of(policy) is not None) is tie_break, name
    versioned = generational(policy)
    assert (versioned is not None) is generation, name
    if versioned is not None:
        assert isinstance(versioned.generation, int)


def test_pod_locks_serialise_one_pod_and_are_forgotten_when_free() -> None:
    locks = PodLocks()
    trace: list[str] = []
    gate = asyncio.Event()

    async def bind(key: str, tag: str) -> None:
        async with locks.hold(key):
            trace.append(f"{tag} in")
            await gate.wait()
            trace.append(f"{tag} out")

    async def main() -> tuple[int, list[str]]:
        work = asyncio.gather(bind("ns/a", "a1"), bind("ns/a", "a2"), bind("ns/b", "b"))
        for _ in range(5):  # every bind reaches its lock
            await asyncio.sleep(0)
        held, inside = len(locks), list(trace)
        gate.set()
        await work
        return held, inside

    held, inside = asyncio.run(main())
    assert held == 2  # ns/a (held and awaited) and ns/b
    assert inside == ["a1 in", "b in"]  # two pods side by side; a2 waits for a1
    assert trace.index("a1 out") < trace.index("a2 in")
    assert len(locks) == 0


def test_loop_lock_is_one_lock_per_event_loop() -> None:
    lock = LoopLock()

    async def twice() -> tuple[asyncio.Lock, asyncio.Lock]:
        return lock.lock(), lock.lock()

    first, again = asyncio.run(twice())
    later, _ = asyncio.run(twice())
    assert first is again
    assert later is not first


def test_node_shape_cache_answers_at_its_version_only_and_stays_bounded() -> None:
    cache: NodeShapeCache[float] = NodeShapeCache(limit=2)
    cache.put("n1", ("shape",), 3, 0.0)
    assert cache.get("n1", ("shape",), 3) == 0.0  # a falsy value is still a hit
    assert cache.get("n1", ("shape",), 4) is None  # the node changed since
    assert cache.get("n2", ("shape",), 3) is None
    for version in range(3):
        cache.put(f"m{version}", ("shape",), version, 1.0)
    assert cache.get("n1", ("shape",), 3) is None  # emptied past the limit


def test_the_ledger_face_tells_recorded_from_counted() -> None:
    state = ExtenderState()
    state.upsert_node(node_json("n", [40, 40], unit=MemoryUnit.GIB))
    recorded = {ALIYUN_ASSIGNED: "true", ALIYUN_IDX: "0", ALIYUN_POD: "8"}
    lost = {ALIYUN_ASSIGNED: "true", ALIYUN_IDX: "7", ALIYUN_POD: "4"}  # no GPU 7: skipped
    state.observe_pod(pod_json("a", 8, node="n", annotations=recorded, uid="uid-a"))
    state.observe_pod(pod_json("lost", 4, node="n", annotations=lost, uid="uid-lost"))
    assert state.reservations.ledger_state("n").gpu_used == (8, 0)
    node_state = state.schedulable_state("n")
    assert node_state is not None
    assert node_state.gpu_used == (12, 4)  # the skipped pod is counted on every GPU
    assert [a.pod for a in state.reservations.allocations("n")] == ["default/a"]
    assert state.reservations.allocation_count() == 1
    assert state.reservations.allocation("default/lost") is None
    assert not state.reservations.is_assumed("default/a")
    assert state.reservations.ledger_violations() == []
