"""``kubectl inspect gpushare`` through the real kubectl against the real control plane.

kubectl (built by ``make controlplane`` from the same Kubernetes release as the API server) finds
the ``kubectl-inspect-gpushare`` console script on ``PATH`` (the venv's ``bin`` first) and runs
it, passing ``KUBECONFIG`` on. Two kwok GPU-share nodes (4 × 22 GiB and 7 × 11 GiB, GPU 6 of
the latter unhealthy: 165 GiB), a 1 GiB pod bound to GPU 1 of the first one, and a pod asking
30 GiB that no scheduler places:

* the summary has a row per node with its GPUs, ``1/88`` and ``0/77``, the unhealthy GPU
  marked, the cluster total ``1/165``, and the pending pod with its reason; ``-d`` shows the
  pod on its GPU;
* ``-o json`` parses; a NODE argument shows that node alone; an unknown one is a one-line error;
* a ServiceAccount that may list nodes but not pods gets the one-line forbidden message naming
  the rule it lacks, with kubectl passing the plugin's exit status on.

The nodes have names of their own (the control plane is shared with the other cluster tests)
and are deleted afterwards. No other GPU-share node may exist meanwhile: the cluster totals are
checked exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule
from lightkube.resources.core_v1 import Namespace, Node, Pod

from gpushare.core.model import Gpu as CoreGpu
from gpushare.core.model import Node as CoreNode
from gpushare.kube.codec import GPU_MEM, GPUSHARE_LABEL
from gpushare.testing.controlplane import Binaries, ControlPlane
from gpushare.testing.nodes import DEFAULT_MODEL, FakeGpu, create_nodes, delete_nodes, gpu_node
from gpushare.testing.pods import bound_gpu_pod

pytestmark = pytest.mark.cluster

PLUGIN = "kubectl-inspect-gpushare"
VENV_BIN = Path(sys.executable).parent
SUFFIX = f"{os.getpid()}-{int(time.time())}"
BIG, SMALL = f"inspect-big-{SUFFIX}", f"inspect-small-{SUFFIX}"
NAMESPACE = f"inspect-{SUFFIX}"
POD = "train-0"
PENDING = "too-big"


@dataclass(frozen=True)
class Cluster:
    plane: ControlPlane
    home: Path


@pytest.fixture(scope="module")
def cluster(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """The two GPU nodes and the bound 1 GiB pod; deleted afterwards."""
    assert (VENV_BIN / PLUGIN).is_file(), (
        f"{VENV_BIN / PLUGIN} is missing: reinstall gpushare (pip install -e '.[test]')"
    )
    with control_plane.client() as kube:
        others = [
            n.metadata.name
            for n in kube.list(Node, labels={GPUSHARE_LABEL: "true"})
            if n.metadata is not None
        ]
        assert others == [], f"GPU-share nodes left over by other tests: {others}"
        kube.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
        try:
            small = [FakeGpu(i, 11, healthy=i != 6) for i in range(7)]
            create_nodes(kube, [gpu_node(BIG, [22] * 4), gpu_node(SMALL, small)])
            core = CoreNode(BIG, tuple(CoreGpu(i, DEFAULT_MODEL, 22) for i in range(4)))
            kube.create(
                bound_gpu_pod(NAMESPACE, POD, core, [("main", (1,), 1)], assume_ns=time.time_ns())
            )
            kube.create(pending_pod())
            yield Cluster(control_plane, tmp_path_factory.mktemp("kubectl-home"))
        finally:
            delete_nodes(kube, [BIG, SMALL])
            kube.delete(Namespace, NAMESPACE)


def pending_pod() -> Pod:
    """A pod asking 30 GiB on one GPU that stays Pending (its scheduler does not exist)."""
    return Pod(
        metadata=ObjectMeta(name=PENDING, namespace=NAMESPACE),
        spec=PodSpec(
            schedulerName="no-such-scheduler",
            containers=[
                Container(
                    name="main",
                    image="registry.invalid/gpushare/test:0",
                    resources=ResourceRequirements(limits={GPU_MEM: "30"}),
                )
            ],
        ),
    )


def kubectl(
    cluster: Cluster, *args: str, kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The real kubectl, with the venv's ``bin`` first on ``PATH`` and ``KUBECONFIG`` set."""
    env = {
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(cluster.home),
        "KUBECONFIG": str(kubeconfig or cluster.plane.kubeconfig),
        "LANG": "C.UTF-8",
    }
    return subprocess.run(
        [str(Binaries.locate().path("kubectl")), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def inspect_ok(cluster: Cluster, *args: str) -> str:
    done = kubectl(cluster, "inspect", "gpushare", *args)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.stderr == ""
    return done.stdout


def row(output: str, name: str) -> list[str]:
    """The whitespace-separated cells of the line that starts with node ``name``."""
    lines = [line.split() for line in output.splitlines() if line.split()[:1] == [name]]
    assert len(lines) == 1, output
    return lines[0]


def test_kubectl_finds_the_plugin(cluster: Cluster) -> None:
    done = kubectl(cluster, "plugin", "list")
    assert str(VENV_BIN / PLUGIN) in done.stdout, done.stdout + done.stderr


def test_summary(cluster: Cluster) -> None:
    output = inspect_ok(cluster)
    lines = output.splitlines()
    assert lines[0].split() == [
        "NAME", "IPADDRESS", *(f"GPU{i}(Allocated/Total)" for i in range(7)), "GPU", "Memory(GiB)"
    ]  # fmt: skip
    assert row(output, BIG)[2:] == ["0/22", "1/22", "0/22", "0/22", "-", "-", "-", "1/88"]
    assert row(output, SMALL)[2:] == [*["0/11"] * 6, "0/11", "(unhealthy)", "0/77"]
    cluster_line = lines.index("Allocated/Total GPU Memory In Cluster:")
    assert lines[cluster_line + 1] == "1/165 (0%)"
    assert lines[cluster_line + 2 : cluster_line + 4] == [
        "Unhealthy/Total GPU Memory In Cluster:",
        "11/165 (6%)",
    ]
    pending = [line.split() for line in lines if PENDING in line]
    assert pending[0][:3] == [NAMESPACE, PENDING, "30"], output


def test_detail_shows_the_pod(cluster: Cluster) -> None:
    output = inspect_ok(cluster, "-d")
    assert BIG in output
    assert SMALL in output
    pods = [line.split() for line in output.splitlines() if line.startswith(POD)]
    assert pods == [[POD, NAMESPACE, "0", "1", "0", "0", "starting"]], output
    assert "UNHEALTHY:  GPU6" in output
    assert "Allocated/Total GPU Memory In Cluster:  1/165 (0%)" in output
    assert f"{NAMESPACE}/{PENDING}  asks 30" in output


def test_json(cluster: Cluster) -> None:
    document: dict[str, Any] = json.loads(inspect_ok(cluster, "-o", "json"))
    nodes = {n["name"]: n for n in document["nodes"]}
    assert set(nodes) == {BIG, SMALL}
    assert nodes[BIG]["allocated"] == 1
    assert nodes[BIG]["total"] == 88
    assert nodes[SMALL]["total"] == 77
    assert [p["name"] for p in nodes[BIG]["pods"]] == [POD]
    assert [g["healthy"] for g in nodes[SMALL]["gpus"]] == [True] * 6 + [False]
    assert [(p["name"], p["total"]) for p in document["pending"]] == [(PENDING, 30)]
    assert document["totals"] == [
        {"unit": "GiB", "allocated": 1, "total": 165, "percent": 0, "unhealthy": 11, "nodes": 2}
    ]


def test_node_argument(cluster: Cluster) -> None:
    output = inspect_ok(cluster, SMALL)
    assert SMALL in output
    assert BIG not in output
    assert row(output, SMALL)[-1] == "0/77"
    assert "1/165" not in output
    done = kubectl(cluster, "inspect", "gpushare", f"no-such-node-{SUFFIX}")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == f"Error: node no-such-node-{SUFFIX} not found\n"


def test_namespace_limits_the_pods(cluster: Cluster) -> None:
    assert POD in inspect_ok(cluster, "-d", "-n", NAMESPACE)
    assert POD not in inspect_ok(cluster, "-d", "-n", "default")


def test_forbidden_names_the_missing_rule(cluster: Cluster) -> None:
    kubeconfig = cluster.plane.service_account_kubeconfig(
        "inspect-no-pods",
        NAMESPACE,
        [PolicyRule(apiGroups=[""], resources=["nodes"], verbs=["list"])],
    )
    done = kubectl(cluster, "inspect", "gpushare", kubeconfig=kubeconfig)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        'Error: forbidden: cannot list pods (all namespaces); needs the RBAC rule apiGroups [""], '
        "resources [pods], verbs [list] in a ClusterRole (HTTP 403): "
    )
    assert f"system:serviceaccount:{NAMESPACE}:inspect-no-pods" in lines[0]


def test_unreachable_through_kubectl(cluster: Cluster, tmp_path: Path) -> None:
    text = cluster.plane.kubeconfig.read_text()
    dead = tmp_path / "dead.kubeconfig"
    dead.write_text(text.replace(cluster.plane.server, "https://127.0.0.1:1"))
    done = kubectl(cluster, "inspect", "gpushare", "--request-timeout", "2s", kubeconfig=dead)
    assert done.returncode == 1
    assert done.stderr.startswith("Error: cannot reach the API server at https://127.0.0.1:1: ")
    assert len(done.stderr.splitlines()) == 1
