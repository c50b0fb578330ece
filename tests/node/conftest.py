"""Real-node tier: one real node (containerd, kubelet, kube-proxy) on a control plane with
kube-controller-manager, and gpushare's extender and device plugin as processes, per session.

Everything comes from ``make test`` (``make controlplane`` builds kubelet and kube-proxy with
the control plane; ``scripts/install-node-runtime.sh`` installs containerd, runc, the CNI
plugins and busybox-static). Missing prerequisites are an error, never a skip. The node takes
the machine-wide lock ``/run/gpushare-node.lock``: a second run on the machine waits.
When a test fails, the tail of the node's and gpushare's logs is attached to its report.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
from collections.abc import Generator, Iterator

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Namespace, ServiceAccount

from gpushare.testing.controlplane import Binaries, ControlPlane, wait_for
from gpushare.testing.native import build_share_library
from gpushare.testing.node import RealNode, node_cluster
from gpushare.testing.node.gpu import GpuStack, delete_pods

_names = itertools.count()
log = logging.getLogger(__name__)


@pytest.fixture(scope="session")
def real_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, RealNode]]:
    """The control plane and its one Ready real node; torn down completely at the end."""
    binaries = Binaries.locate()
    log_dir = tmp_path_factory.mktemp("node-logs")
    with node_cluster(binaries, log_dir=log_dir) as (plane, node):
        yield plane, node


@pytest.fixture(scope="session")
def gpu_stack(
    real_node: tuple[ControlPlane, RealNode], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GpuStack]:
    """gpushare's extender and device plugin (2 fake 16 GiB GPUs) and their kube-scheduler;
    the plugin also serves the Tencent and HAMi dialects (``tests/node/test_node_dialects.py``;
    the Alibaba pods' tests see no difference) and gives shared containers the share-view
    library (``tests/node/test_node_share_view.py``)."""
    plane, node = real_node
    library = build_share_library(tmp_path_factory.mktemp("share-view"))
    stack = GpuStack(plane, node, dialects=("tencent", "hami"), share_library=library)
    with stack.running():
        yield stack


@pytest.fixture
def kube(real_node: tuple[ControlPlane, RealNode]) -> Iterator[Client]:
    """A client of the control plane, whose processes must be running; containerd and kubelet
    are started again first if an earlier test failed while they were stopped."""
    plane, node = real_node
    plane.check_running()
    if started := node.revive():
        log.warning("started again for this test (an earlier one left them stopped): %s", started)
    with plane.client() as client:
        yield client


@pytest.fixture
def namespace(kube: Client) -> Iterator[str]:
    """A fresh namespace (its ``default`` ServiceAccount made by kube-controller-manager);
    its Deployments and pods are deleted, and waited for, at the end so GPUs are free."""
    name = f"node-{next(_names)}"
    kube.create(Namespace(metadata=ObjectMeta(name=name)))
    wait_for(
        f"ServiceAccount {name}/default",
        lambda: _exists(kube, ServiceAccount, "default", name) or None,
        30.0,
    )
    yield name
    for deployment in kube.list(Deployment, namespace=name):
        if deployment.metadata and deployment.metadata.name:
            kube.delete(Deployment, deployment.metadata.name, namespace=name)
    delete_pods(kube, name)
    with contextlib.suppress(ApiError):
        kube.delete(Namespace, name)


def _exists(kube: Client, kind: type[ServiceAccount], name: str, namespace: str) -> bool:
    try:
        kube.get(kind, name, namespace=namespace)
    except ApiError:
        return False
    return True


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The real-node demo (``test_demo_real_node.py``) first: it starts a real node of its own,
    which needs the machine-wide lock that the session's ``real_node`` holds until the end."""
    items.sort(key=lambda item: item.path.name != "test_demo_real_node.py")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        funcargs = getattr(item, "funcargs", {})
        real = funcargs.get("real_node")
        if isinstance(real, tuple):
            plane, node = real
            for name, text in {**plane.logs(30), **node.logs(60)}.items():
                report.sections.append((f"real node: {name} (last lines)", text))
        stack = funcargs.get("gpu_stack")
        if isinstance(stack, GpuStack):
            for proc in (stack.extender, stack.plugin):
                report.sections.append((f"gpushare: {proc.name} (last lines)", proc.log_tail(60)))
    return report


@pytest.fixture(autouse=True)
def _collect_garbage() -> Iterator[None]:
    """Collect garbage after each test: a resource it leaked (an unclosed socket, transport or
    file, a ResourceWarning that ``filterwarnings = error`` fails) is then reported by its own
    teardown, not by whichever later test the garbage collector happened to run in."""
    yield
    gc.collect()
