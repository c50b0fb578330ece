"""The device plugin end to end: ``gpushare device-plugin`` as a process, a kubelet stand-in,
the real kube-scheduler and ``gpushare extender`` on the real control plane.

* The plugin (``--fake-gpus 2x16GiB:T4``, a ServiceAccount with exactly the documented rules)
  serves, registers with the kubelet stand-in (``gpushare.testing.kubelet.FakeKubelet``) and
  publishes the inventory and ``aliyun.com/gpu-count`` on a bare kwok node labelled
  ``gpushare=true``; the stand-in's device list becomes the node's ``aliyun.com/gpu-mem`` as
  kubelet's node-status sync would make it.
* kube-scheduler with the extender binds GPU pods to that node. The test then admits them as
  kubelet does, in an order other than the binding order, one Allocate per GPU container: each
  container gets exactly the GPU(s) its pod's annotations name, with the UUIDs the node's
  inventory publishes, and each pod ends marked assigned. Two equal pods bound together, a pod
  placed once they have started, and a two-container pod.
* The node's configuration (ConfigMap ``gpushare-node-config``, docs/node-config.md), changed
  while everything runs: memory held back and a GPU excluded reach kubelet's device list and the
  inventory; a bad entry is a Warning Event naming the node and the key and changes nothing; a
  ``whole``-only node makes kube-scheduler refuse a shared pod with the extender's reason until
  the node serves ``both`` again; a change that would take memory from a running pod waits for
  it (Warning Event) and applies once the pod is gone.
* A kubelet restart: the plugin registers again on a new socket with the same devices.
* SIGTERM: the plugin stops and removes its socket.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule
from lightkube.resources.core_v1 import ConfigMap, Event, Namespace, Node, Pod
from prometheus_client.parser import text_string_to_metric_families

from gpushare.core.serves import Serves
from gpushare.extender.live import LiveOptions
from gpushare.kube import nodeconfig, nodepods, nodes, unhealthy
from gpushare.kube.codec import (
    ALIYUN_ASSIGNED,
    ALIYUN_IDX,
    ALLOCATION,
    GPU_COUNT,
    GPU_COUNT_ANNOTATION,
    GPU_MEM,
    GPUSHARE_LABEL,
    INVENTORY,
    node_info,
)
from gpushare.kube.watch import Backoff
from gpushare.testing.controlplane import (
    ControlPlane,
    ManagedProcess,
    free_ports,
    gpushare_argv,
    wait_for,
)
from gpushare.testing.kubelet import KubeletThread
from gpushare.testing.live_extender import extender_with_scheduler
from gpushare.testing.nodes import create_nodes, delete_nodes, plain_node

pytestmark = pytest.mark.cluster

SCHEDULER_NAME = "gpushare-dp"
SOCKET = "aliyungpushare.sock"
WAIT_S = 30.0
_names = itertools.count()
PLUGIN_RULES = [
    PolicyRule(
        apiGroups=list(r["apiGroups"]), resources=list(r["resources"]), verbs=list(r["verbs"])
    )
    for r in (
        *nodes.RBAC_RULES,
        *nodepods.RBAC_RULES,
        *unhealthy.RBAC_RULES,
        *nodeconfig.RBAC_RULES,
    )
]


@dataclass
class Cluster:
    """One test's world: its node and namespace, and the kubelet stand-in."""

    node: str
    namespace: str
    kubelet: KubeletThread
    metrics_url: str
    node_config: str  # the name of this test's node-config ConfigMap (in kube-system)


def gpu_pod(
    namespace: str, name: str, containers: dict[str, int], gpu_count: dict[str, int] | None = None
) -> Pod:
    annotations = {GPU_COUNT_ANNOTATION: json.dumps(gpu_count)} if gpu_count else None
    return Pod(
        metadata=ObjectMeta(name=name, namespace=namespace, annotations=annotations),
        spec=PodSpec(
            schedulerName=SCHEDULER_NAME,
            containers=[
                Container(
                    name=c,
                    image="registry.invalid/gpushare/e2e:0",
                    resources=ResourceRequirements(limits={GPU_MEM: str(units)}),
                )
                for c, units in containers.items()
            ],
        ),
    )


def bound(kube: Client, namespace: str, name: str) -> Pod:
    def probe() -> Pod | None:
        pod = kube.get(Pod, name, namespace=namespace)
        return pod if pod.spec is not None and pod.spec.nodeName else None

    return wait_for(f"pod {name} bound", probe, WAIT_S)


def annotations_of(pod: Pod) -> dict[str, str]:
    return dict((pod.metadata.annotations if pod.metadata else None) or {})


@pytest.fixture
def handshake_timeout_s() -> float:
    """The extender's ``--handshake-timeout``; a test overrides it by parametrizing."""
    return LiveOptions().handshake_timeout_s


@pytest.fixture
def cluster(
    control_plane: ControlPlane, kube: Client, tmp_path: Path, handshake_timeout_s: float
) -> Iterator[Cluster]:
    """The node, the kubelet stand-in, the plugin process, the extender and a kube-scheduler."""
    socket_dir = Path(tempfile.mkdtemp(prefix="gpushare-e2e-", dir="/tmp"))
    suffix = f"{next(_names)}-{int(time.time())}"
    node, namespace = f"dp-e2e-node-{suffix}", f"dp-e2e-{suffix}"
    with contextlib.ExitStack() as stack:
        create_nodes(kube, [plain_node(node, labels={GPUSHARE_LABEL: "true"})])
        stack.callback(delete_nodes, kube, [node])
        kube.create(Namespace(metadata=ObjectMeta(name=namespace)))
        stack.callback(_delete_pods, kube, namespace)
        kubelet = stack.enter_context(KubeletThread(socket_dir))
        kubeconfig = control_plane.service_account_kubeconfig(
            "gpushare-device-plugin-e2e", "kube-system", PLUGIN_RULES
        )
        argv = gpushare_argv("device-plugin", "--node-name", node, "--fake-gpus", "2x16GiB:T4")
        argv += ["--device-plugin-dir", str(socket_dir), "--kubeconfig", str(kubeconfig)]
        (metrics_port,) = free_ports(1)
        argv += ["--metrics-port", str(metrics_port)]
        node_config = f"node-config-{suffix}"
        argv += ["--node-config-namespace", "kube-system", "--node-config-name", node_config]
        plugin = ManagedProcess("gpushare-device-plugin", argv, tmp_path).start()
        stack.callback(plugin.stop)
        kubelet.call(kubelet.kubelet.wait_for_devices(GPU_MEM, lambda v: v.capacity == 32, WAIT_S))
        kubelet.sync_node_status(kube, node)  # kubelet's node-status sync
        options = LiveOptions(
            policy="binpack",  # the expected GPUs are binpack's (the default is fgd-spare)
            backoff=Backoff(initial_s=0.05, max_s=0.5),
            access_log=False,
            handshake_timeout_s=handshake_timeout_s,
        )
        stack.enter_context(
            extender_with_scheduler(
                control_plane, control_plane.kubeconfig, options, SCHEDULER_NAME
            )
        )
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        yield Cluster(node, namespace, kubelet, metrics_url, node_config)
        plugin.stop()
        log = plugin.log_path.read_text()
        assert not (socket_dir / SOCKET).exists(), log
        assert "device plugin stopped" in log, log


def _delete_pods(kube: Client, namespace: str) -> None:
    for pod in kube.list(Pod, namespace=namespace):
        if pod.metadata is not None and pod.metadata.name:
            kube.delete(Pod, pod.metadata.name, namespace=namespace, grace_period=0)
    kube.delete(Namespace, namespace)


def admit(cluster: Cluster, kube: Client, name: str) -> list[dict[str, str]]:
    """Admit pod ``name`` as kubelet does: one Allocate per GPU container, in spec order."""
    kubelet = cluster.kubelet
    pod = kube.get(Pod, name, namespace=cluster.namespace)
    assert pod.spec is not None
    answers = []
    for container in pod.spec.containers:
        limits = (container.resources.limits if container.resources else None) or {}
        units = int(limits[GPU_MEM])
        response = kubelet.call(kubelet.kubelet.allocate(GPU_MEM, size=units))
        answers.append(dict(response.container_responses[0].envs))
    return answers


def test_pods_bound_by_the_extender_get_their_own_gpus_from_allocate(
    cluster: Cluster, kube: Client
) -> None:
    ns = cluster.namespace
    node = kube.get(Node, cluster.node)
    info = node_info(node.to_dict())
    assert (info.unit, [g.capacity for g in info.node.gpus]) == ("GiB", [16, 16])
    assert node.status is not None
    assert node.status.capacity is not None
    assert node.status.capacity[GPU_COUNT] == "2"
    assert INVENTORY in annotations_of(node)  # type: ignore[arg-type]
    uuids = info.uuids

    def check(name: str, answers: list[dict[str, str]]) -> None:
        pod = kube.get(Pod, name, namespace=ns)
        recorded = json.loads(annotations_of(pod)[ALLOCATION])
        for answer, container in zip(answers, recorded["containers"], strict=True):
            gpus = container["gpus"]
            assert answer["ALIYUN_COM_GPU_MEM_IDX"] == ",".join(map(str, gpus)), name
            assert answer["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids[g] for g in gpus), name
            assert answer["ALIYUN_COM_GPU_MEM_CONTAINER"] == str(container["share"] * len(gpus))

    # Two equal pods bound together: the extender puts them on the same GPU, so whichever
    # kubelet admits first is right. Admitted here in the reverse of creation order.
    kube.create(gpu_pod(ns, "a", {"main": 4}))
    kube.create(gpu_pod(ns, "b", {"main": 4}))
    gpu_a = annotations_of(bound(kube, ns, "a"))[ALIYUN_IDX]
    assert annotations_of(bound(kube, ns, "b"))[ALIYUN_IDX] == gpu_a
    check("b", admit(cluster, kube, "b"))
    check("a", admit(cluster, kube, "a"))
    # Once they have started, a pod of 12 goes where it fits (binpack: the other GPU).
    kube.create(gpu_pod(ns, "c", {"main": 12}))
    bound(kube, ns, "c")
    check("c", admit(cluster, kube, "c"))
    assert annotations_of(kube.get(Pod, "c", namespace=ns))[ALIYUN_IDX] != gpu_a
    # A two-container pod (one container on both GPUs) next to a pending pod that asks as much
    # first as its second container does.
    kube.create(gpu_pod(ns, "m", {"x": 1, "y": 2}, gpu_count={"y": 2}))
    kube.create(gpu_pod(ns, "d", {"main": 2}))
    bound(kube, ns, "m")
    bound(kube, ns, "d")
    check("m", admit(cluster, kube, "m"))
    check("d", admit(cluster, kube, "d"))
    # Every pod is marked assigned. (Of two equal pods, the device plugin marks the oldest
    # first, whichever kubelet admitted: they are interchangeable.)
    for name in "abcmd":
        pod = kube.get(Pod, name, namespace=ns)
        assert annotations_of(pod)[ALIYUN_ASSIGNED] == "true", name
    # The plugin's /metrics counted the six Allocate calls.
    with urllib.request.urlopen(cluster.metrics_url, timeout=10) as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    allocations = families["gpushare_device_plugin_allocate_requests"].samples
    assert {s.labels["outcome"]: s.value for s in allocations if s.name.endswith("_total")} == {
        "ok": 6.0,
        "rejected": 0.0,
        "error": 0.0,
    }


def test_a_pod_held_by_the_handshake_rule_is_placed_once_the_equal_pod_starts(
    cluster: Cluster, kube: Client
) -> None:
    """Two 10 GiB pods on 2 x 16 GiB: the second must share the first one's GPU while that one
    is pending, which does not fit, so it waits (Warning FailedScheduling naming the rule). Once
    kubelet has admitted the first, kube-scheduler retries and the second lands on the other
    GPU."""
    ns = cluster.namespace
    kube.create(gpu_pod(ns, "first", {"main": 10}))
    first = annotations_of(bound(kube, ns, "first"))[ALIYUN_IDX]
    kube.create(gpu_pod(ns, "second", {"main": 10}))

    def refused() -> bool | None:
        events = kube.list(Event, namespace=ns, fields={"involvedObject.name": "second"})
        return any("awaits its device-plugin start" in (e.message or "") for e in events) or None

    wait_for("second refused by the handshake rule", refused, WAIT_S)
    assert not kube.get(Pod, "second", namespace=ns).spec.nodeName  # type: ignore[union-attr]
    admit(cluster, kube, "first")
    started = time.monotonic()
    second = annotations_of(bound(kube, ns, "second"))[ALIYUN_IDX]
    waited_s = time.monotonic() - started
    print(f"second pod bound {waited_s:.1f} s after the first was admitted")
    assert second != first
    assert admit(cluster, kube, "second")[0]["ALIYUN_COM_GPU_MEM_IDX"] == second


@pytest.mark.parametrize("handshake_timeout_s", [8.0])
def test_a_held_pod_is_placed_when_the_pin_expires_with_no_event(
    cluster: Cluster, kube: Client
) -> None:
    """As above, but the first pod is never admitted (a kubelet that never starts it): its pin
    ends after ``--handshake-timeout`` (8 s here) with no cluster event at all. The held pod's
    filter answered with an ``Error`` (``outcomes.held_error``), so kube-scheduler retries it on
    its backoff (at most 10 s) and places it once the pin is gone; answered with
    ``FailedNodes`` alone it would wait for the scheduler's 5-minute flush."""
    ns = cluster.namespace
    kube.create(gpu_pod(ns, "first", {"main": 10}))
    first = annotations_of(bound(kube, ns, "first"))[ALIYUN_IDX]
    started = time.monotonic()
    kube.create(gpu_pod(ns, "second", {"main": 10}))

    def held() -> bool | None:
        events = kube.list(Event, namespace=ns, fields={"involvedObject.name": "second"})
        return any("held by the handshake rule" in (e.message or "") for e in events) or None

    wait_for("second held by the handshake rule", held, WAIT_S)
    second = annotations_of(bound(kube, ns, "second"))[ALIYUN_IDX]
    print(f"second pod bound {time.monotonic() - started:.1f} s after the first was bound")
    assert second != first


def test_gpus_marked_in_alibabas_unhealthy_configmap_take_no_pods_until_unmarked(
    cluster: Cluster, kube: Client
) -> None:
    """Alibaba's ``kube-system/unhealthy-gpu-<node>`` (``data.gpus``): the plugin marks the
    listed GPU unhealthy in ListAndWatch and in the node's inventory, so the extender places a
    pod on the other GPU; a value it cannot read is a Warning Event on the node and leaves the
    mark; deleting the ConfigMap brings the GPU back."""
    name = f"unhealthy-gpu-{cluster.node}"
    kubelet = cluster.kubelet

    def gpu_health() -> tuple[bool, ...]:
        return tuple(g.healthy for g in node_info(kube.get(Node, cluster.node).to_dict()).node.gpus)

    def healthy_units() -> int:
        view = kubelet.kubelet.resource(GPU_MEM)
        assert view is not None
        return view.allocatable

    kube.create(
        ConfigMap(metadata=ObjectMeta(name=name, namespace="kube-system"), data={"gpus": "0"})
    )
    try:
        wait_for("GPU 0 unhealthy in the inventory", lambda: gpu_health() == (False, True) or None)
        wait_for("kubelet sees 16 healthy units", lambda: healthy_units() == 16 or None)
        kube.create(gpu_pod(cluster.namespace, "marked", {"main": 4}))
        assert annotations_of(bound(kube, cluster.namespace, "marked"))[ALIYUN_IDX] == "1"

        kube.patch(ConfigMap, name, {"data": {"gpus": "zero"}}, namespace="kube-system")

        def warned() -> bool | None:
            events = kube.list(
                Event, namespace="default", fields={"involvedObject.name": cluster.node}
            )
            return any(e.reason == "UnhealthyGpuConfigInvalid" and "'zero'" in (e.message or "")
                       for e in events) or None  # fmt: skip

        wait_for("a Warning Event naming the value", warned)
        assert gpu_health() == (False, True)  # the last good marks stay
    finally:
        kube.delete(ConfigMap, name, namespace="kube-system")
    wait_for("GPU 0 healthy again", lambda: gpu_health() == (True, True) or None)
    wait_for("kubelet sees 32 healthy units", lambda: healthy_units() == 32 or None)


def node_events(kube: Client, node: str, reason: str) -> list[str]:
    """The messages of the Events on node ``node`` with ``reason``."""
    events = kube.list(Event, namespace="default", fields={"involvedObject.name": node})
    return [e.message or "" for e in events if e.reason == reason]


def scrape(url: str) -> dict[str, float]:
    """``/metrics``: sample name → value (the node label is the plugin's own)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        families = text_string_to_metric_families(response.read().decode())
        return {s.name: s.value for f in families for s in f.samples}


def set_node_config(kube: Client, cluster: Cluster, text: str) -> None:
    """Create or replace this test's node-config ConfigMap with ``config.yaml`` = ``text``."""
    body = ConfigMap(
        metadata=ObjectMeta(name=cluster.node_config, namespace="kube-system"),
        data={"config.yaml": text},
    )
    if any(
        (c.metadata.name if c.metadata else None) == cluster.node_config
        for c in kube.list(ConfigMap, namespace="kube-system")
    ):
        kube.replace(body)
    else:
        kube.create(body)


def test_node_config_changes_reach_kubelet_the_inventory_and_the_scheduler_without_a_restart(
    cluster: Cluster, kube: Client
) -> None:
    """2 x 16 GiB. 4 GiB held back and GPU 1 excluded: kubelet sees 12 devices, the inventory
    one GPU of 12 GiB. A bad entry: a Warning Event naming the node and the key, the gauge at 1,
    nothing changes. ``serves: whole``: a shared pod is refused by kube-scheduler with the
    extender's reason; ``both`` again: it is placed. Source of the rules: docs/node-config.md."""
    kubelet = cluster.kubelet.kubelet

    def inventory() -> tuple[tuple[tuple[int, int], ...], Serves]:
        info = node_info(kube.get(Node, cluster.node).to_dict())
        return tuple((g.index, g.capacity) for g in info.node.gpus), info.serves

    def capacity() -> int:
        view = kubelet.resource(GPU_MEM)
        return -1 if view is None else view.capacity

    try:
        set_node_config(
            kube, cluster, f"nodes:\n- name: {cluster.node}\n  reservedMemory: 4GiB\n"
            "  excludeGpus: [1]\n",
        )  # fmt: skip
        wait_for("12 GiB of GPU 0 only", lambda: inventory() == (((0, 12),), Serves.BOTH) or None)
        wait_for("kubelet sees 12 devices", lambda: capacity() == 12 or None)
        wait_for(
            "a Normal Event saying what applies",
            lambda: node_events(kube, cluster.node, "NodeConfigApplied") or None,
        )

        set_node_config(kube, cluster, f"nodes:\n- name: {cluster.node}\n  reservedMemory: 120%\n")

        def warned() -> list[str] | None:
            return node_events(kube, cluster.node, "NodeConfigInvalid") or None

        (message, *_) = wait_for("a Warning Event naming node and key", warned)
        assert f"node {cluster.node}: configmap kube-system/{cluster.node_config}: " in message
        assert "nodes[0].reservedMemory='120%'" in message
        assert "the configuration in force stays" in message
        metrics = scrape(cluster.metrics_url)
        assert metrics["gpushare_device_plugin_node_config_invalid"] == 1.0
        assert inventory() == (((0, 12),), Serves.BOTH)  # the last good one stays
        assert capacity() == 12

        set_node_config(kube, cluster, f"nodes:\n- name: {cluster.node}\n  serves: whole\n")
        whole_only = (((0, 16), (1, 16)), Serves.WHOLE)
        wait_for("both GPUs back, whole only", lambda: inventory() == whole_only or None)
        wait_for("kubelet sees 32 devices", lambda: capacity() == 32 or None)
        assert scrape(cluster.metrics_url)["gpushare_device_plugin_node_config_invalid"] == 0.0
        kubelet_sync = cluster.kubelet
        kubelet_sync.sync_node_status(kube, cluster.node)
        kube.create(gpu_pod(cluster.namespace, "shared", {"main": 4}))

        def refused() -> bool | None:
            events = kube.list(
                Event, namespace=cluster.namespace, fields={"involvedObject.name": "shared"}
            )
            # The filter's refusal (bind would refuse too, but as a bind error).
            reason = (
                "nodes are available: 1 gpushare: the node serves whole GPUs only (node config "
                "serves=whole); container(s) main ask a share of a GPU"
            )
            found = [
                e for e in events if e.reason == "FailedScheduling" and reason in (e.message or "")
            ]
            return bool(found) or None

        wait_for(
            "kube-scheduler refuses the shared pod with the extender's reason", refused, WAIT_S
        )
        assert not kube.get(Pod, "shared", namespace=cluster.namespace).spec.nodeName  # type: ignore[union-attr]
    finally:
        kube.delete(ConfigMap, cluster.node_config, namespace="kube-system")
    # No ConfigMap: the flags (both kinds, every GPU whole): the pod is placed.
    wait_for("serves both again", lambda: inventory() == (((0, 16), (1, 16)), Serves.BOTH) or None)
    bound(kube, cluster.namespace, "shared")


def test_a_node_config_change_that_would_take_memory_from_a_pod_waits_for_it(
    cluster: Cluster, kube: Client
) -> None:
    """A pod holds 12 GiB of one GPU; holding back 8 GiB per GPU would leave 8: the change
    waits (Warning Event naming the GPU and the pod, gauge at 1, inventory unchanged) and
    applies once the pod is gone (the plugin retries every 10 s)."""
    ns = cluster.namespace
    kube.create(gpu_pod(ns, "big", {"main": 12}))
    gpu = int(annotations_of(bound(kube, ns, "big"))[ALIYUN_IDX])
    admit(cluster, kube, "big")

    def capacities() -> tuple[int, ...]:
        return tuple(
            g.capacity for g in node_info(kube.get(Node, cluster.node).to_dict()).node.gpus
        )

    try:
        set_node_config(kube, cluster, "defaults: {reservedMemory: 8GiB}\n")

        def deferred() -> list[str] | None:
            return node_events(kube, cluster.node, "NodeConfigDeferred") or None

        (message, *_) = wait_for("a Warning Event saying why the change waits", deferred)
        assert f"GPU {gpu} would advertise 8 GiB but pods hold 12 ({ns}/big)" in message, message
        assert scrape(cluster.metrics_url)["gpushare_device_plugin_node_config_deferred"] == 1.0
        assert capacities() == (16, 16)
        kube.delete(Pod, "big", namespace=ns, grace_period=0)
        wait_for("8 GiB per GPU once the pod is gone", lambda: capacities() == (8, 8) or None)
        assert scrape(cluster.metrics_url)["gpushare_device_plugin_node_config_deferred"] == 0.0
    finally:
        kube.delete(ConfigMap, cluster.node_config, namespace="kube-system")
    wait_for("16 GiB per GPU again", lambda: capacities() == (16, 16) or None)


def test_kubelet_restart_makes_the_plugin_register_again(cluster: Cluster, kube: Client) -> None:
    kubelet = cluster.kubelet.kubelet
    before = kubelet.resource(GPU_MEM)
    assert before is not None
    ids = sorted(before.ids)
    registrations = len(kubelet.registrations)
    cluster.kubelet.call(kubelet.restart())
    after = cluster.kubelet.call(
        kubelet.wait_for_devices(
            GPU_MEM, lambda v: v.registration >= registrations and v.capacity == 32, WAIT_S
        )
    )
    assert sorted(after.ids) == ids
    time.sleep(0.1)
    assert len(kubelet.registrations) == registrations + 1
