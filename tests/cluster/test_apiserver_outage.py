"""The API server goes away mid-burst (docs/design.md, "Failure semantics"): kube-apiserver is
stopped for 30 s and started again, and etcd is compacted meanwhile, so every watch resumed from
before the outage gets 410 Gone.

Two extender processes with leader election (``gpushare.testing.failover``) schedule GPU pods on
10 kwok nodes through kube-scheduler; the device plugin's view of one node's pods
(``gpushare.kube.nodepods.NodePods``, what Allocate reads) runs beside them. Half the pods are
created and partly bound; then the API server stops. Proved:

* ``/readyz`` of every replica turns 503 while the API server is away (caches stale) and 200
  again after it is back, by itself; the device plugin's cache is stale meanwhile and fresh after;
* the remaining pods are created and scheduled after the restart; at the end, from the pods'
  annotations alone: no GPU over capacity, no pod with two allocations, every Pending pod fits
  nowhere; every pod bound before the outage kept its placement (nothing lost);
* every replica's ``/inspect`` equals the annotations (its ledger recovered through the relist);
  the device plugin's cache holds exactly the pods bound to its node.

The module runs on a control plane of its own: after an outage and a compaction kwok (the
kubelet stand-in) was seen to leave a pod bound in the next module Pending (1 run in 3), and the
session's other tests should not inherit a cluster that an outage test has shaken.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from lightkube import Client

from gpushare.kube.client import connect
from gpushare.kube.nodepods import NodePods
from gpushare.testing.controlplane import Binaries, ControlPlane, ControlPlaneError, wait_for
from gpushare.testing.failover import FailoverPlan, Replica, replicated_extenders, workload
from gpushare.testing.live_extender import http_get
from gpushare.testing.outcome import Outcome, Spec, judge, make_pod, read_outcome

pytestmark = pytest.mark.cluster

PLAN = FailoverPlan(nodes=10, pods=120, replicas=2, kills=0, name="outage")
NODES = {f"outage-n{i:03d}": [PLAN.gpu_gib] * PLAN.gpus_per_node for i in range(PLAN.nodes)}
SPECS = workload(PLAN.pods, PLAN.seed)
BY_NAME = {s.name: s for s in SPECS}
OUTAGE_S = 30.0
WATCHED_NODE = "outage-n000"


class DevicePluginView:
    """The device plugin's ``NodePods`` on its own event loop in a thread."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.pods: NodePods | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        client = connect(self.kubeconfig, trust_env=False)
        self.pods = NodePods(client, WATCHED_NODE)
        self.pods.start()
        await self.pods.wait_synced(30)
        self._ready.set()
        while not self._stop.is_set():
            await asyncio.sleep(0.05)
        await self.pods.stop()
        await client.close()

    def __enter__(self) -> DevicePluginView:
        self._thread.start()
        assert self._ready.wait(30), "NodePods did not sync"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def names(self) -> set[str]:
        assert self.pods is not None
        return {p["metadata"]["name"] for p in self.pods.pods()}


def create_pods(kube: Client, specs: list[Spec]) -> None:
    for spec in specs:
        pod = make_pod(
            spec,
            namespace=PLAN.name,
            scheduler_name=f"gpushare-{PLAN.name}",
            node_selector={"gpushare.io/test-group": PLAN.name},
        )
        kube.create(pod)


def readyz(replica: Replica) -> int:
    return http_get(f"http://127.0.0.1:{replica.port}/readyz", timeout_s=2)[0]


def inspect_placements(replica: Replica) -> dict[str, dict[tuple[str, int], int]]:
    status, report = http_get(f"http://127.0.0.1:{replica.port}/gpushare-scheduler/inspect")
    assert status == 200, report
    placements: dict[str, dict[tuple[str, int], int]] = {}
    for node in report["nodes"]:
        for dev in node["devs"]:
            for pod in dev["pods"]:
                if pod["namespace"] == PLAN.name:
                    placement = placements.setdefault(pod["name"], {})
                    placement[node["name"], dev["id"]] = pod["usedGPU"]
    return placements


@dataclass
class Run:
    before: Outcome
    final: Outcome
    stale_seen: dict[str, float]
    recovered_after_s: float
    plugin_stale_seen: bool
    plugin_names: set[str]
    inspect: list[dict[str, dict[tuple[str, int], int]]]


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """This module's own control plane (overrides the session's)."""
    logs = tmp_path_factory.mktemp("outage-controlplane-logs")
    with ControlPlane(Binaries.locate(), log_dir=logs) as plane:
        yield plane


@pytest.fixture(scope="module")
def run(control_plane: ControlPlane) -> Iterator[Run]:
    with replicated_extenders(control_plane, PLAN, print) as (kube, replicas, _, namespace):
        kubeconfig = replicas[0].kubeconfig
        with DevicePluginView(kubeconfig) as plugin:
            half = len(SPECS) // 2
            create_pods(kube, SPECS[:half])
            wait_for(
                "a third of the first half bound",
                lambda: (
                    len(read_outcome(kube, namespace, BY_NAME, NODES).bound) >= half // 3 or None
                ),
                60,
            )
            before = read_outcome(kube, namespace, BY_NAME, NODES)
            stale_seen: dict[str, float] = {}
            plugin_stale = False
            with control_plane.apiserver_down():
                stopped = time.monotonic()
                compacted = False
                while time.monotonic() - stopped < OUTAGE_S:
                    for replica in replicas:
                        if replica.identity not in stale_seen and readyz(replica) == 503:
                            stale_seen[replica.identity] = time.monotonic() - stopped
                    plugin_stale = plugin_stale or bool(plugin.pods and plugin.pods.stale)
                    if not compacted and time.monotonic() - stopped > OUTAGE_S / 2:
                        print("etcd compacted at revision", control_plane.compact_etcd())
                        compacted = True
                    time.sleep(0.2)
            restarted = time.monotonic()
            wait_for(
                "every replica ready again",
                lambda: all(readyz(r) == 200 for r in replicas) or None,
                60,
            )
            recovered = time.monotonic() - restarted
            print(f"stale after {stale_seen}; ready again {recovered:.2f}s after the restart")
            create_pods(kube, SPECS[half:])

            last: list[str] = []

            def settled() -> bool | None:
                outcome = read_outcome(kube, namespace, BY_NAME, NODES)
                seen = len(outcome.bound) + len(outcome.pending)
                last[:] = [
                    f"{len(outcome.bound)} bound, {len(outcome.pending)} Pending of {len(SPECS)}"
                ]
                if seen != len(SPECS):
                    return None
                last[:] = judge(outcome, BY_NAME, NODES)[:5]
                if last:
                    return None
                for r in replicas:
                    ledger = inspect_placements(r)
                    if ledger != outcome.bound:
                        names = sorted(set(ledger) | set(outcome.bound))
                        differ = [(n, ledger.get(n), outcome.bound.get(n)) for n in names]
                        differ = [d for d in differ if d[1] != d[2]][:5]
                        last[:] = [f"{r.identity}'s /inspect differs: {differ}"]
                        return None
                return True

            try:
                wait_for("every pod bound or fitting nowhere, ledgers confirmed", settled, 120)
            except ControlPlaneError as error:
                raise ControlPlaneError(f"{error}; last seen: {last}") from error
            final = read_outcome(kube, namespace, BY_NAME, NODES)
            on_node = {n for n, p in final.bound.items() if any(k[0] == WATCHED_NODE for k in p)}
            wait_for("the device plugin's cache", lambda: plugin.names() == on_node or None, 30)
            yield Run(
                before,
                final,
                stale_seen,
                recovered,
                plugin_stale,
                plugin.names(),
                [inspect_placements(r) for r in replicas],
            )


def test_readyz_is_503_while_the_api_server_is_away_and_200_after(run: Run) -> None:
    assert len(run.stale_seen) == PLAN.replicas, run.stale_seen
    assert max(run.stale_seen.values()) < 10.0
    assert run.recovered_after_s < 30.0


def test_the_device_plugin_cache_went_stale_and_recovered(run: Run) -> None:
    assert run.plugin_stale_seen
    on_node = {n for n, p in run.final.bound.items() if any(k[0] == WATCHED_NODE for k in p)}
    assert run.plugin_names == on_node


def test_no_overcommit_no_double_allocation_nothing_lost(run: Run) -> None:
    assert judge(run.final, BY_NAME, NODES) == []
    assert len(run.final.bound) > len(run.before.bound)
    for name, placement in run.before.bound.items():
        assert run.final.bound.get(name) == placement, name


def test_every_replica_ledger_equals_the_annotations(run: Run) -> None:
    for placements in run.inspect:
        assert placements == run.final.bound
