"""``gpushare.kube`` against the real API server: the cache, the binder, events.

* The cache (with a ServiceAccount that may only get/list/watch nodes and pods) lists what
  exists, then sees pods and nodes come, change and go through its watches; only
  ``aliyun.com/gpu-mem`` pods are kept; nodes come before pods; ``synced`` is set.
* Cut connections (every open watch fails, new requests are refused for a while): the cache
  resumes its watches from the last resourceVersion and the server replays what was missed,
  deletions included.
* A watch that expires (410 Gone, as an ``ERROR`` event or as an HTTP status; injected in the
  real stream because a young cluster serves any old resourceVersion): the cache relists and
  reports what changed in the gap, including a pod deleted meanwhile.
* The binder (a ServiceAccount with pods get, pods/binding create, events create) writes
  the annotations and binds; a second bind fails as ``ALREADY_BOUND`` and changes nothing;
  concurrent binds of one pod to different nodes: exactly one wins and the pod carries the
  winner's annotations; a missing or recreated pod is ``NOT_FOUND``; missing RBAC is
  ``FORBIDDEN``.
* Events on a pod are visible through the API with the reporting component.

Every wait is on a change notification or an API condition, with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule
from lightkube.resources.core_v1 import Event, Namespace, Node, Pod
from lightkube.types import PatchType

from gpushare.kube.binder import BindResult, PodBinder
from gpushare.kube.cache import ClusterCache
from gpushare.kube.client import connect
from gpushare.kube.codec import GPU_MEM
from gpushare.kube.errors import BindError, BindStage, Failure
from gpushare.kube.events import REPORTING_COMPONENT, EventRecorder, EventType
from gpushare.kube.refs import PodRef
from gpushare.kube.watch import Action, Backoff, Change
from gpushare.testing.controlplane import ControlPlane
from gpushare.testing.faults import FaultyTransport
from gpushare.testing.nodes import create_nodes, delete_nodes, gpu_node, plain_node

pytestmark = pytest.mark.cluster

T = TypeVar("T")
NO_SCHEDULER = "gpushare-test-nobody"  # no scheduler has this name: pods stay Pending
FAST = Backoff(initial_s=0.02, max_s=0.2)
WAIT_S = 30.0
_names = itertools.count()

READ_RULES = [
    PolicyRule(apiGroups=[""], resources=["nodes", "pods"], verbs=["get", "list", "watch"]),
]
BINDER_RULES = [
    PolicyRule(apiGroups=[""], resources=["pods"], verbs=["get"]),
    PolicyRule(apiGroups=[""], resources=["pods/binding"], verbs=["create"]),
    PolicyRule(apiGroups=[""], resources=["events"], verbs=["create"]),
]


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def make_pod(name: str, namespace: str, gpu_mem: int | None) -> Pod:
    limits = {"cpu": "100m", "memory": "64Mi"}
    if gpu_mem is not None:
        limits[GPU_MEM] = str(gpu_mem)
    return Pod(
        metadata=ObjectMeta(name=name, namespace=namespace),
        spec=PodSpec(
            schedulerName=NO_SCHEDULER,
            containers=[
                Container(
                    name="main",
                    image="registry.invalid/gpushare/kube-adapter:0",
                    resources=ResourceRequirements(limits=limits),
                )
            ],
        ),
    )


@contextlib.asynccontextmanager
async def async_client(
    plane: ControlPlane, kubeconfig: Path | None = None, transport: FaultyTransport | None = None
) -> AsyncIterator[AsyncClient]:
    """``gpushare.kube.client.connect``'s client, or one over ``transport`` (faults)."""
    if transport is None:
        client = connect(kubeconfig or plane.kubeconfig, trust_env=False)
    else:
        config = KubeConfig.from_file(kubeconfig or plane.kubeconfig)
        client = AsyncClient(config, trust_env=False, transport=transport)
    try:
        yield client
    finally:
        await client.close()


class Changes:
    """A cache listener that keeps every change; :meth:`wait_for` waits for a matching one."""

    def __init__(self) -> None:
        self.seen: list[Change] = []
        self._new = asyncio.Event()

    def __call__(self, change: Change) -> None:
        self.seen.append(change)
        self._new.set()

    async def wait_for(self, what: str, predicate: Callable[[Change], bool]) -> Change:
        checked = 0
        try:
            async with asyncio.timeout(WAIT_S):
                while True:
                    for change in self.seen[checked:]:
                        if predicate(change):
                            return change
                    checked = len(self.seen)
                    self._new.clear()
                    await self._new.wait()
        except TimeoutError:
            seen = [(c.action.value, c.key) for c in self.seen]
            raise AssertionError(f"no change {what} within {WAIT_S}s; seen: {seen}") from None

    def upsert(self, key: str) -> Callable[[Change], bool]:
        return lambda c: c.action is Action.UPSERT and c.key == key

    def delete(self, key: str) -> Callable[[Change], bool]:
        return lambda c: c.action is Action.DELETE and c.key == key


@pytest.fixture
def namespace(kube: Client) -> Iterator[str]:
    """A fresh namespace; its pods are deleted afterwards (the namespace stays Terminating:
    no kube-controller-manager here)."""
    name = f"kube-adapter-{next(_names)}"
    kube.create(Namespace(metadata=ObjectMeta(name=name)))
    yield name
    for pod in kube.list(Pod, namespace=name):
        assert pod.metadata is not None
        assert pod.metadata.name is not None
        with contextlib.suppress(ApiError):
            kube.delete(Pod, pod.metadata.name, namespace=name, grace_period=0)
    kube.delete(Namespace, name)


@pytest.fixture
def gpu_nodes(kube: Client) -> Iterator[list[str]]:
    """Two 2 x 16 GiB GPU-share kwok nodes and one CPU-only node (in that order)."""
    names = [f"ka-gpu-{next(_names)}", f"ka-gpu-{next(_names)}", f"ka-cpu-{next(_names)}"]
    create_nodes(kube, [gpu_node(names[0], [16, 16]), gpu_node(names[1], [16, 16])])
    create_nodes(kube, [plain_node(names[2])])
    yield names
    delete_nodes(kube, names)


# ---- the cache -----------------------------------------------------------------------------


def test_cache_lists_then_watches(
    control_plane: ControlPlane, kube: Client, namespace: str, gpu_nodes: list[str]
) -> None:
    gpu0, _gpu1, cpu = gpu_nodes
    kube.create(make_pod("listed-gpu", namespace, gpu_mem=4))
    kube.create(make_pod("listed-cpu", namespace, gpu_mem=None))
    reader = control_plane.service_account_kubeconfig("cache-reader", namespace, READ_RULES)

    async def scenario() -> None:
        async with (
            async_client(control_plane) as admin,
            async_client(control_plane, reader) as client,
        ):
            cache = ClusterCache(client, backoff=FAST)
            nodes, pods = Changes(), Changes()
            order: list[str] = []
            cache.on_node(nodes)
            cache.on_pod(pods)
            cache.on_node(lambda c: order.append("node"))
            cache.on_pod(lambda c: order.append("pod"))
            assert not cache.synced
            async with cache:
                await cache.wait_synced(WAIT_S)
                assert cache.synced
                # The lists: every node (GPU-share ones flagged), only gpu-mem pods.
                assert {gpu0, cpu} <= set(cache.nodes())
                assert gpu0 in cache.gpushare_nodes()
                assert cpu not in cache.gpushare_nodes()
                listed = cache.pod(namespace, "listed-gpu")
                assert listed is not None
                assert listed["spec"]["containers"][0]["resources"]["limits"][GPU_MEM] == "4"
                assert cache.pod(namespace, "listed-cpu") is None
                assert order.index("pod") > max(i for i, o in enumerate(order) if o == "node")

                # The watches: a new pod, a pod that finished, a deleted pod.
                await admin.create(make_pod("watched-gpu", namespace, gpu_mem=8))
                await admin.create(make_pod("watched-cpu", namespace, gpu_mem=None))
                added = await pods.wait_for(
                    "watched-gpu added", pods.upsert(f"{namespace}/watched-gpu")
                )
                assert not added.released
                await admin.patch(
                    Pod.Status,
                    "listed-gpu",
                    {"status": {"phase": "Succeeded"}},
                    namespace=namespace,
                    patch_type=PatchType.MERGE,
                )
                finished = await pods.wait_for(
                    "listed-gpu Succeeded",
                    lambda c: c.key == f"{namespace}/listed-gpu" and c.released,
                )
                assert finished.action is Action.UPSERT
                assert finished.previous is not None
                await admin.delete(Pod, "watched-gpu", namespace=namespace, grace_period=0)
                gone = await pods.wait_for(
                    "watched-gpu deleted", pods.delete(f"{namespace}/watched-gpu")
                )
                assert gone.released
                assert cache.pod(namespace, "watched-gpu") is None

                # Nodes: a new GPU-share node appears flagged, then goes.
                extra = f"ka-gpu-{next(_names)}"
                await admin.create(gpu_node(extra, [8]))
                await nodes.wait_for(f"{extra} added", nodes.upsert(extra))
                assert extra in cache.gpushare_nodes()
                await admin.delete(Node, extra)
                await nodes.wait_for(f"{extra} deleted", nodes.delete(extra))
                assert extra not in cache.nodes()

                stats = cache.stats
            assert all("watched-cpu" not in c.key and "listed-cpu" not in c.key for c in pods.seen)
            assert (stats.nodes.lists, stats.pods.lists) == (1, 1)
            assert stats.pods.errors == 0, stats.pods.last_error

    run(scenario())


@pytest.mark.parametrize(
    "expiry",
    [None, "event", "status"],
    ids=["disconnect-resumes", "expired-event-relists", "expired-status-relists"],
)
def test_cache_recovers_from_a_broken_watch(
    control_plane: ControlPlane, kube: Client, namespace: str, expiry: str | None
) -> None:
    kube.create(make_pod("doomed", namespace, gpu_mem=2))
    kube.create(make_pod("survivor", namespace, gpu_mem=2))
    transport = FaultyTransport.for_control_plane(control_plane)

    async def scenario() -> None:
        async with (
            async_client(control_plane) as admin,
            async_client(control_plane, transport=transport) as client,
        ):
            cache = ClusterCache(client, backoff=FAST)
            pods = Changes()
            cache.on_pod(pods)
            async with cache:
                await cache.wait_synced(WAIT_S)
                assert cache.pod(namespace, "doomed") is not None
                # Cut the connection; change things while the cache cannot see.
                transport.go_down()
                async with asyncio.timeout(WAIT_S):
                    await transport.refused.wait()
                await admin.delete(Pod, "doomed", namespace=namespace, grace_period=0)
                await admin.create(make_pod("born-in-the-gap", namespace, gpu_mem=2))
                if expiry == "event":
                    transport.expire_next_watch("pods", form="event")
                elif expiry == "status":
                    transport.expire_next_watch("pods", form="status")
                transport.come_back()

                await pods.wait_for("born-in-the-gap", pods.upsert(f"{namespace}/born-in-the-gap"))
                gone = await pods.wait_for("doomed deleted", pods.delete(f"{namespace}/doomed"))
                assert gone.released
                assert cache.pod(namespace, "doomed") is None
                assert cache.pod(namespace, "survivor") is not None
                # After the recovery the watch works again.
                await admin.create(make_pod("after", namespace, gpu_mem=2))
                await pods.wait_for("after", pods.upsert(f"{namespace}/after"))
                stats = cache.stats.pods

            survivor_changes = [c for c in pods.seen if c.key == f"{namespace}/survivor"]
            assert len(survivor_changes) == 1, "an unchanged pod is reported once, relist or not"
            assert stats.errors >= 1
            if expiry is None:
                # The first failure resumes the watch; failing again (the transport stays down)
                # makes the cache stale, and it recovers with one whole list.
                assert stats.rewatches >= 1
                assert (stats.lists, stats.expired) == (2, 0)
            else:
                assert transport.expired_watches == 1
                assert stats.expired == 1
                assert stats.relists >= 1

    run(scenario())


# ---- the binder and events -------------------------------------------------------------------


def _pod_ref(kube: Client, namespace: str, name: str) -> PodRef:
    pod = kube.create(make_pod(name, namespace, gpu_mem=8))
    assert pod.metadata is not None
    assert pod.metadata.uid is not None
    return PodRef(namespace=namespace, name=name, uid=pod.metadata.uid)


def test_binder_annotates_binds_and_refuses_a_second_bind(
    control_plane: ControlPlane, kube: Client, namespace: str, gpu_nodes: list[str]
) -> None:
    gpu0, gpu1, _cpu = gpu_nodes
    ref = _pod_ref(kube, namespace, "bind-me")
    binder_config = control_plane.service_account_kubeconfig("binder", namespace, BINDER_RULES)
    first = {"ALIYUN_COM_GPU_MEM_IDX": "1", "ALIYUN_COM_GPU_MEM_POD": "8"}
    second = {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "8"}

    async def scenario() -> tuple[BindError, BindError]:
        async with async_client(control_plane, binder_config) as client:
            binder = PodBinder(client)
            result = await binder.bind(ref, gpu0, first)
            assert (result.node, dict(result.annotations)) == (gpu0, first)
            errors = []
            for node in (gpu0, gpu1):
                with pytest.raises(BindError) as caught:
                    await binder.bind(ref, node, second)
                errors.append(caught.value)
            return errors[0], errors[1]

    again, elsewhere = run(scenario())
    pod = kube.get(Pod, "bind-me", namespace=namespace)
    assert pod.spec is not None
    assert pod.metadata is not None
    assert pod.status is not None
    assert pod.spec.nodeName == gpu0
    annotations = pod.metadata.annotations or {}
    assert {k: annotations.get(k) for k in first} == first, "a refused bind must not re-annotate"
    conditions = {c.type: c.status for c in pod.status.conditions or []}
    assert conditions.get("PodScheduled") == "True"
    for error in (again, elsewhere):
        assert error.failure is Failure.ALREADY_BOUND
        assert not error.temporary
        assert error.stage is BindStage.READ
        assert error.bound_node == gpu0
        assert error.observed_pod is not None
        assert f"already bound to node {gpu0}" in str(error)
        assert ref.key in str(error)


def test_concurrent_binds_of_one_pod_have_one_winner(
    control_plane: ControlPlane, kube: Client, namespace: str, gpu_nodes: list[str]
) -> None:
    gpu0, gpu1, _cpu = gpu_nodes
    refs = [_pod_ref(kube, namespace, f"contended-{i}") for i in range(3)]

    async def scenario() -> list[list[BindResult | BaseException]]:
        async with async_client(control_plane) as client:
            binder = PodBinder(client)
            outcomes = []
            for ref in refs:
                attempts = [
                    binder.bind(ref, node, {"gpushare.io/test-binder": f"{i}:{node}"})
                    for i, node in enumerate([gpu0, gpu1, gpu0, gpu1])
                ]
                outcomes.append(list(await asyncio.gather(*attempts, return_exceptions=True)))
            return outcomes

    for ref, outcome in zip(refs, run(scenario()), strict=True):
        winners = [o for o in outcome if not isinstance(o, BaseException)]
        losers = [o for o in outcome if isinstance(o, BaseException)]
        assert len(winners) == 1, outcome
        assert all(isinstance(e, BindError) for e in losers), losers
        assert all(
            e.failure in (Failure.ALREADY_BOUND, Failure.CONFLICT)
            for e in losers
            if isinstance(e, BindError)
        )
        pod = kube.get(Pod, ref.name, namespace=namespace)
        assert pod.spec is not None
        assert pod.metadata is not None
        marker = (pod.metadata.annotations or {})["gpushare.io/test-binder"]
        assert marker.endswith(f":{pod.spec.nodeName}"), "annotations and node from one bind"


def test_binder_errors(
    control_plane: ControlPlane, kube: Client, namespace: str, gpu_nodes: list[str]
) -> None:
    gpu0 = gpu_nodes[0]
    recreated = _pod_ref(kube, namespace, "recreated")
    kube.delete(Pod, "recreated", namespace=namespace, grace_period=0)
    fresh = _pod_ref(kube, namespace, "recreated")
    unbindable = _pod_ref(kube, namespace, "unbindable")
    no_binding = control_plane.service_account_kubeconfig(
        "annotate-only",
        namespace,
        [PolicyRule(apiGroups=[""], resources=["pods"], verbs=["get", "patch"])],
    )

    async def scenario() -> dict[str, BindError]:
        errors: dict[str, BindError] = {}
        async with (
            async_client(control_plane) as admin,
            async_client(control_plane, no_binding) as limited,
        ):
            cases = {
                "missing": (admin, PodRef(namespace, "no-such-pod", "0000"), gpu0),
                "recreated": (admin, recreated, gpu0),
                "forbidden": (limited, unbindable, gpu0),
            }
            for case, (client, ref, node) in cases.items():
                with pytest.raises(BindError) as caught:
                    await PodBinder(client).bind(ref, node, {"gpushare.io/test": case})
                errors[case] = caught.value
        return errors

    errors = run(scenario())
    assert errors["missing"].failure is Failure.NOT_FOUND
    assert errors["missing"].status_code == 404
    assert errors["recreated"].failure is Failure.NOT_FOUND
    assert fresh.uid in str(errors["recreated"])
    assert errors["forbidden"].failure is Failure.FORBIDDEN
    assert errors["forbidden"].stage is BindStage.BIND
    assert errors["forbidden"].status_code == 403
    assert not any(e.temporary for e in errors.values())
    # The recreated pod was not touched; the unbindable one stays unbound.
    pod = kube.get(Pod, "recreated", namespace=namespace)
    assert pod.metadata is not None
    assert "gpushare.io/test" not in (pod.metadata.annotations or {})
    pod = kube.get(Pod, "unbindable", namespace=namespace)
    assert pod.spec is not None
    assert not pod.spec.nodeName


def test_events_on_a_pod(control_plane: ControlPlane, kube: Client, namespace: str) -> None:
    ref = _pod_ref(kube, namespace, "eventful")
    recorder_config = control_plane.service_account_kubeconfig("recorder", namespace, BINDER_RULES)

    async def scenario() -> list[str]:
        async with async_client(control_plane, recorder_config) as client:
            recorder = EventRecorder(client, instance="extender-0")
            return [
                await recorder.pod_event(ref, "GPUAssigned", "GPU 1 (8 of 16 GiB) on node n1"),
                await recorder.pod_event(ref, "FailedBinding", "x" * 5000, type=EventType.WARNING),
            ]

    names = run(scenario())
    events = {
        e.metadata.name: e
        for e in kube.list(Event, namespace=namespace, fields={"involvedObject.name": "eventful"})
        if e.metadata is not None
    }
    assert set(names) <= set(events)
    assigned, failed = (events[n] for n in names)
    assert (assigned.reason, assigned.type) == ("GPUAssigned", "Normal")
    assert assigned.message == "GPU 1 (8 of 16 GiB) on node n1"
    assert assigned.reportingComponent == REPORTING_COMPONENT
    assert assigned.reportingInstance == "extender-0"
    assert assigned.source is not None
    assert assigned.source.component == REPORTING_COMPONENT
    assert assigned.involvedObject.uid == ref.uid
    assert assigned.involvedObject.kind == "Pod"
    assert (failed.reason, failed.type) == ("FailedBinding", "Warning")
    assert failed.message is not None
    assert len(failed.message) == 1024
