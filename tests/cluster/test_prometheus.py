"""The Grafana dashboard and the alert rules, evaluated by a real Prometheus on a cluster that
schedules pods.

The world: two kwok GPU nodes (one GPU unhealthy in its inventory), the live extender
(``gpushare.extender.live``) and a kube-scheduler that calls it; GPU pods scheduled through them,
and one pod bound by someone else with an allocation nobody can read (skipped by the ledger).
The device plugin's series for the first node come from its own metrics code
(``DevicePluginMetrics``) over ``FakeNvml`` (no GPU here: the NVML stand-in sets used memory,
utilisation and one compute process per GPU, one process mapped to a scheduled pod through a
``/proc`` of the test's own), GPU 1 unhealthy, an MPS daemon that answers, served over HTTP as
the daemon serves it. Prometheus (Debian's) scrapes
both every second and loads ``deploy/helm/gpushare/alerts/gpushare-alerts.yaml``. Proved:

* both targets are up;
* every query of ``deploy/helm/gpushare/dashboards/gpushare-dashboard.json`` (``$node`` = all,
  ``$__rate_interval`` = 1m) is accepted by Prometheus and returns series, each carrying every
  label its legend names; the ``node`` variable lists the nodes;
* every alert rule evaluates without error, and every series a rule reads is scraped; the
  unhealthy-GPU alert is pending for the device plugin's unhealthy GPU and no other.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from lightkube import Client
from lightkube.resources.core_v1 import Pod

from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.deviceplugin.metrics import DevicePluginMetrics, pods_by_uid, serve_metrics
from gpushare.deviceplugin.nodeconfig import NodeConfigMetrics
from gpushare.kube.codec import ALLOCATION
from gpushare.testing.controlplane import REPO_ROOT, ControlPlane, wait_for
from gpushare.testing.live_extender import t4_cluster_with_extender
from gpushare.testing.nodes import fake_gpu_uuid
from gpushare.testing.nvml import FakeDevice, FakeNvml
from gpushare.testing.outcome import Ask, Spec, make_pod
from gpushare.testing.prometheus import Prometheus

pytestmark = pytest.mark.cluster

NAMESPACE = "prom"
SCHEDULER_NAME = "gpushare-prom"
NODES = ("prom-n1", "prom-n2")
GIB = 1 << 30
DASHBOARD = REPO_ROOT / "deploy" / "helm" / "gpushare" / "dashboards" / "gpushare-dashboard.json"
ALERTS = REPO_ROOT / "deploy" / "helm" / "gpushare" / "alerts" / "gpushare-alerts.yaml"
PLUGIN_NODE = NODES[0]


@dataclass
class World:
    prometheus: Prometheus
    kube: Client


def dashboard_targets() -> list[tuple[str, str, str]]:
    """(panel title, expr, legendFormat) of every query of the dashboard."""
    document = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"], target.get("legendFormat", ""))
        for panel in document["panels"]
        for target in panel.get("targets", ())
    ]


def concrete(expr: str) -> str:
    """The query as Grafana sends it with every node selected and a 1-minute rate window."""
    return expr.replace("$node", ".*").replace("$__rate_interval", "1m")


def plugin_metrics(tmp_path: Path, kube: Client) -> DevicePluginMetrics:
    """The device plugin's series for ``PLUGIN_NODE`` over ``FakeNvml`` (module doc)."""
    devices = [FakeDevice(fake_gpu_uuid(PLUGIN_NODE, i), i, "Tesla T4", 16 * GIB) for i in range(2)]
    nvml = FakeNvml(devices)
    nvml.init()
    gpus = [
        PhysicalGpu(i, d.uuid, d.minor, "Tesla T4", 16 * 1024, healthy=i == 0)
        for i, d in enumerate(devices)
    ]  # GPU 1 unhealthy (an XID, say)
    for index in range(2):
        nvml.set_memory_used(index, (3 + index) * GIB)
        nvml.set_utilization(index, 40 + index)
    pods = [p.to_dict() for p in kube.list(Pod, namespace=NAMESPACE)]
    placed = next(p for p in pods if p["spec"].get("nodeName") == PLUGIN_NODE)
    uid = placed["metadata"]["uid"]
    proc_root = tmp_path / "proc"
    (proc_root / "4242").mkdir(parents=True)
    (proc_root / "4242" / "cgroup").write_text(f"0::/kubepods/besteffort/pod{uid}/c0ffee\n")
    nvml.set_processes(0, [(4242, 2 * GIB)])
    nvml.set_processes(1, [(4343, GIB)])  # a process of no known pod
    metrics = DevicePluginMetrics(
        PLUGIN_NODE, lambda: gpus, nvml=nvml, pods=lambda: pods_by_uid(pods), proc_root=proc_root
    )
    metrics.observe_registration()
    metrics.observe_allocate("ok", 0.004)
    metrics.observe_allocate("rejected", 0.002)
    metrics.watch_mps(lambda: True)
    NodeConfigMetrics(metrics.registry, PLUGIN_NODE)  # as the daemon does, on the same registry
    return metrics


@pytest.fixture(scope="module")
def world(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp_path = tmp_path_factory.mktemp("prometheus")
    with contextlib.ExitStack() as stack:
        kube, extender = stack.enter_context(
            t4_cluster_with_extender(
                control_plane, NODES, NAMESPACE, "gpushare-extender-prom", SCHEDULER_NAME
            )
        )
        for i, (node, gib) in enumerate([(NODES[0], 4), (NODES[0], 8), (NODES[1], 6)]):
            spec = Spec(f"p{i}", (Ask("main", 1, gib),))
            selector = {"kubernetes.io/hostname": node}
            kube.create(make_pod(spec, namespace=NAMESPACE, scheduler_name=SCHEDULER_NAME,
                                 node_selector=selector))  # fmt: skip
        for i in range(3):
            wait_for(f"p{i} bound", functools.partial(_bound, kube, f"p{i}"))
        # A pod bound by someone else with an allocation nobody can read: skipped by the ledger.
        garbled = make_pod(Spec("garbled", (Ask("main", 1, 2),)), namespace=NAMESPACE,
                           scheduler_name=SCHEDULER_NAME, node_selector={})  # fmt: skip
        assert garbled.spec is not None
        assert garbled.metadata is not None
        garbled.spec.nodeName = NODES[1]
        garbled.metadata.annotations = {ALLOCATION: "{not json"}
        kube.create(garbled)
        plugin = asyncio.run(serve_metrics(plugin_metrics(tmp_path, kube).registry, "127.0.0.1", 0))
        stack.callback(lambda: asyncio.run(plugin.close()))
        jobs = {
            "gpushare-extender": [extender.url + "/metrics"],
            "gpushare-device-plugin": [f"http://127.0.0.1:{plugin.port}/metrics"],
        }
        prometheus = stack.enter_context(Prometheus(tmp_path / "prom", jobs, rule_files=[ALERTS]))
        # Rates need two samples in their window; a few scrapes and an evaluation of every rule.
        wait_for("every target up, scraped, every rule evaluated", lambda: _settled(prometheus), 60)
        yield World(prometheus, kube)


def _settled(prometheus: Prometheus) -> bool | None:
    """Both targets up and scraped at least 4 times (rates need two samples in their window),
    every rule evaluated once."""
    targets = prometheus.targets()
    up = len(targets) == 2 and all(t["health"] == "up" for t in targets)
    scraped = up and bool(prometheus.query("count_over_time(up[1m]) >= 4"))
    evaluated = all(r.get("lastEvaluation", "").startswith("20") for r in prometheus.rules())
    return (scraped and evaluated) or None


def _bound(kube: Client, name: str) -> bool | None:
    pod = kube.get(Pod, name, namespace=NAMESPACE)
    return bool(pod.spec is not None and pod.spec.nodeName) or None


def test_both_targets_are_up(world: World) -> None:
    targets = {t["labels"]["job"]: t for t in world.prometheus.targets()}
    assert set(targets) == {"gpushare-extender", "gpushare-device-plugin"}
    for job, target in targets.items():
        assert target["health"] == "up", (job, target["lastError"])


@pytest.mark.parametrize(
    ("title", "expr", "legend"),
    dashboard_targets(),
    ids=[t[0] + ": " + t[2] for t in dashboard_targets()],
)
def test_every_dashboard_query_returns_series_with_its_legend_labels(
    world: World, title: str, expr: str, legend: str
) -> None:
    series = world.prometheus.query(concrete(expr))
    assert series, f"{title}: {concrete(expr)} returned nothing"
    for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", legend):
        missing = [s["metric"] for s in series if label not in s["metric"]]
        assert not missing, f"{title}: series without {label!r}: {missing}"


def test_the_node_variable_lists_the_nodes(world: World) -> None:
    document = json.loads(DASHBOARD.read_text())
    (variable,) = [v for v in document["templating"]["list"] if v["name"] == "node"]
    match = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["definition"])
    assert match is not None, variable["definition"]
    metric, label = match.groups()
    assert world.prometheus.label_values(label, metric) == sorted(NODES)


def test_every_alert_rule_evaluates_and_reads_scraped_series(world: World) -> None:
    loaded = world.prometheus.rules()
    shipped = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    assert sorted(r["name"] for r in loaded) == sorted(r["alert"] for r in shipped)
    for rule in loaded:
        assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
    scraped = set(world.prometheus.label_values("__name__"))
    for rule in shipped:
        read = set(re.findall(r"\b(gpushare_[a-z_]+)", rule["expr"]))
        assert read <= scraped, (rule["alert"], sorted(read - scraped))


def test_the_unhealthy_gpu_alert_is_pending_for_the_sick_gpu_only(world: World) -> None:
    series = world.prometheus.query('ALERTS{alertname="GpushareGpuUnhealthy"}')
    found = {(s["metric"]["node"], s["metric"]["gpu"], s["metric"]["alertstate"]) for s in series}
    assert found == {(PLUGIN_NODE, "1", "pending")}  # ``for: 5m``: pending this early
