"""``kubectl inspect gpushare`` / ``gpushare inspect`` without a cluster: how it finds the
kubeconfig, and the one-line errors (no configuration, unreachable server, forbidden, no GPU-share
nodes, unknown node). The real kubectl runs it against the control plane in
``tests/cluster/test_inspect_kubectl.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from gpushare.cli import inspect as inspect_cli
from gpushare.cli.inspect import (
    NO_GPUSHARE_NODES,
    NO_KUBECONFIG,
    Duration,
    api_error_message,
    find_kubeconfig,
    inspect,
)
from gpushare.cli.main import main
from gpushare.kube.codec import PLACEMENT, MemoryUnit, node_info
from gpushare.kube.errors import ApiCallError, Failure
from gpushare.kube.snapshot import ClusterObjects
from gpushare.testing.controlplane import unverified_kubeconfig
from gpushare.testing.extender import node_json, plain_node_json, pod_json
from gpushare.testing.pods import bound_gpu_pod

HOSTNAME = "kubernetes.io/hostname"

UNREACHABLE = "https://127.0.0.1:1"


@pytest.fixture(autouse=True)
def no_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No ``$KUBECONFIG``, an empty home, not in a pod, no proxies."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in (
        "KUBECONFIG",
        "KUBERNETES_SERVICE_HOST",
        "KUBERNETES_SERVICE_PORT",
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
    ):
        monkeypatch.delenv(name, raising=False)
    return home


def kubeconfig(path: Path, server: str = UNREACHABLE, context: str = "test") -> Path:
    return unverified_kubeconfig(path, server, context=context)


def run(*args: str) -> Result:
    return CliRunner().invoke(inspect, list(args), prog_name="kubectl inspect gpushare")


def one_error_line(result: Result) -> str:
    """The single ``Error: ...`` line the command printed (and it failed with status 1)."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    assert result.stdout == ""
    return lines[0].removeprefix("Error: ")


# ---- finding the configuration ---------------------------------------------------------------


def test_no_kubeconfig_anywhere() -> None:
    assert one_error_line(run()) == NO_KUBECONFIG
    assert NO_KUBECONFIG == "no kubeconfig found: set KUBECONFIG or use --kubeconfig"


def test_kubeconfig_variable_naming_no_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/a:/nonexistent/b")
    message = one_error_line(run())
    assert message.startswith(NO_KUBECONFIG)
    assert "/nonexistent/a:/nonexistent/b" in message


def test_missing_kubeconfig_option(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    assert one_error_line(run("--kubeconfig", str(missing))) == (
        f"no kubeconfig found at {missing} (--kubeconfig)"
    )


def test_kubeconfig_precedence(
    tmp_path: Path, no_cluster: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home_config = no_cluster / ".kube" / "config"
    home_config.parent.mkdir()
    kubeconfig(home_config)
    assert find_kubeconfig(None).path == home_config
    listed = kubeconfig(tmp_path / "listed.yaml")
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'absent.yaml'}:{listed}")
    assert find_kubeconfig(None).path == listed
    explicit = kubeconfig(tmp_path / "explicit.yaml")
    assert find_kubeconfig(explicit).path == explicit


def test_unknown_context(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "k.yaml")
    message = one_error_line(run("--kubeconfig", str(path), "--context", "other"))
    assert message.startswith(f"kubeconfig {path}: ")
    assert "other" in message


def test_garbage_kubeconfig(tmp_path: Path) -> None:
    path = tmp_path / "k.yaml"
    path.write_text("clusters: [unclosed\n")
    assert one_error_line(run("--kubeconfig", str(path))).startswith(f"kubeconfig {path}: ")


# ---- the API server ----------------------------------------------------------------------------


def test_unreachable_server_names_the_url(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "k.yaml")
    message = one_error_line(run("--kubeconfig", str(path), "--request-timeout", "2s"))
    assert message.startswith(f"cannot reach the API server at {UNREACHABLE}: ")


def test_kubeconfig_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kubectl hands its plugins ``$KUBECONFIG``; the command uses it."""
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "k.yaml", "https://127.0.0.1:2")))
    message = one_error_line(run("--request-timeout", "2"))
    assert message.startswith("cannot reach the API server at https://127.0.0.1:2: ")


def forbidden(what: str, code: int = 403) -> ApiCallError:
    detail = f'Forbidden: {what} is forbidden: User "system:serviceaccount:ns:sa" cannot list'
    return ApiCallError(f"LIST {what}", Failure.FORBIDDEN, detail, status_code=code)


def test_forbidden_names_the_resource_and_the_rule() -> None:
    server = "https://k8s.example:6443"
    assert api_error_message(forbidden("nodes"), server) == (
        'forbidden: cannot list nodes; needs the RBAC rule apiGroups [""], resources [nodes], '
        "verbs [list] in a ClusterRole (HTTP 403): Forbidden: nodes is forbidden: User "
        '"system:serviceaccount:ns:sa" cannot list'
    )
    pods = api_error_message(forbidden("pods"), server)
    assert pods.startswith(
        'forbidden: cannot list pods (all namespaces); needs the RBAC rule apiGroups [""], '
        "resources [pods], verbs [list] in a ClusterRole (HTTP 403)"
    )
    in_ns = api_error_message(
        ApiCallError("LIST pods in ml", Failure.FORBIDDEN, "no", status_code=403), server, "ml"
    )
    assert in_ns.startswith(
        "forbidden: cannot list pods in namespace ml; needs the RBAC rule "
        'apiGroups [""], resources [pods], verbs [list] in a ClusterRole, or a Role in namespace ml'
    )
    unauthorized = api_error_message(forbidden("nodes", 401), server)
    assert unauthorized.startswith(f"the API server at {server} rejected the credentials (HTTP 401")
    other = ApiCallError("LIST nodes", Failure.SERVER, "Internal error", status_code=500)
    assert api_error_message(other, server) == (
        f"{server}: LIST nodes: server error (HTTP 500): Internal error"
    )


# ---- what the cluster holds ----------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """A kubeconfig in ``$KUBECONFIG`` and ``read_cluster`` answering with the nodes put in the
    returned list (no pods)."""
    nodes: list[dict[str, Any]] = []

    async def fake_read_cluster(
        client: object, *, namespace: str | None = None, holds: tuple[str, str] | None = None
    ) -> ClusterObjects:
        return ClusterObjects(tuple(nodes), ())

    monkeypatch.setattr(inspect_cli, "read_cluster", fake_read_cluster)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "k.yaml")))
    return nodes


def test_no_gpushare_nodes(cluster: list[dict[str, Any]]) -> None:
    assert one_error_line(run()) == NO_GPUSHARE_NODES
    cluster.append(plain_node_json("cpu-only"))
    unlabelled = node_json("unlabelled", [16])
    unlabelled["metadata"]["labels"] = {}
    cluster.append(unlabelled)
    assert one_error_line(run()) == (
        "no node is labelled gpushare=true with GPUs; is the device plugin running?"
    )


def test_unreadable_nodes_are_named(cluster: list[dict[str, Any]]) -> None:
    broken = node_json("broken", [16])
    broken["metadata"]["annotations"]["gpushare.io/gpu-inventory"] = "{"
    cluster.extend([broken, broken | {"metadata": {**broken["metadata"], "name": "broken-2"}}])
    message = one_error_line(run())
    assert message.startswith(f"{NO_GPUSHARE_NODES} Unreadable: node broken: ")
    assert message.endswith("(+1 more)")


def test_node_argument(cluster: list[dict[str, Any]]) -> None:
    cluster.extend([node_json("gpu-1", [16, 16], unit=MemoryUnit.GIB), plain_node_json("cpu-only")])
    assert one_error_line(run("nope")) == "node nope not found"
    result = run("gpu-1")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1].split()[2:] == ["0/16", "0/16", "0/32"]
    # A node that is not a GPU-share node is shown with the reason (the report's rule).
    result = run("cpu-only", "-d")
    assert result.exit_code == 0, result.output
    assert "not a GPU-share node (no label gpushare=true)" in result.stdout


def test_json_output(cluster: list[dict[str, Any]]) -> None:
    cluster.append(node_json("gpu-1", [16, 16], unit=MemoryUnit.GIB))
    result = run("-o", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [(n["name"], n["total"], n["unit"]) for n in document["nodes"]] == [("gpu-1", 32, "GiB")]
    assert result.stdout.startswith('{\n  "node": null,')


# ---- one pod (--pod) -----------------------------------------------------------------------------

WHY = (
    "gpushare: pod team-a/placed bound to node gpu-1: container main on GPU 0 (4 GiB each); "
    "policy binpack; scores 0-10 of the 2 node(s) it fits: gpu-1 10, gpu-2 0"
)


@pytest.fixture
def with_pods(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster of two 8 GiB nodes: gpu-1 full with a pod the extender placed (and explained),
    a pod the default scheduler bound to gpu-2 without a GPU, and a pod pinned to gpu-1."""
    gpu_1 = node_json("gpu-1", [8], unit=MemoryUnit.GIB)
    placed = bound_gpu_pod("team-a", "placed", node_info(gpu_1).node, [("main", (0,), 8)],
                           assume_ns=1).to_dict()  # fmt: skip
    placed["metadata"]["annotations"][PLACEMENT] = WHY
    pods = (
        placed,
        pod_json("stray", 4, namespace="team-a", node="gpu-2", scheduler=None),
        pod_json("pinned", 4, namespace="team-a", node_selector={HOSTNAME: "gpu-1"}),
    )
    nodes = (gpu_1, node_json("gpu-2", [8], unit=MemoryUnit.GIB))

    async def fake_read_cluster(
        client: object, *, namespace: str | None = None, holds: tuple[str, str] | None = None
    ) -> ClusterObjects:
        return ClusterObjects(nodes, pods)

    monkeypatch.setattr(inspect_cli, "read_cluster", fake_read_cluster)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "k.yaml")))


@pytest.mark.parametrize(
    ("pod", "lines"),
    [
        pytest.param("team-a/placed", ["NODE: gpu-1", f"WHY HERE: {WHY}"],
                     id="a-placed-pod-says-why-it-went-there-from-the-extenders-record"),
        pytest.param("team-a/stray", ["NODE: gpu-2", "WARNING: pod team-a/stray on node "
                                      "gpu-2 asks GPU memory but was placed by scheduler "
                                      "'default-scheduler', bypassing gpushare"],
                     id="a-pod-that-bypassed-gpushare-is-a-warning"),
        pytest.param("team-a/pinned", ["STATE: pending", "WAITS: fits nowhere it may go "
                                       "(1 of 2 node(s) ruled out by nodeSelector)"],
                     id="a-pending-pod-waits-only-for-the-nodes-it-may-go-to"),
    ],
)  # fmt: skip
def test_one_pod(with_pods: None, pod: str, lines: list[str]) -> None:
    result = run("--pod", pod)
    assert result.exit_code == 0, result.output
    shown = [" ".join(line.split()) for line in result.stdout.splitlines()]
    for line in lines:
        assert any(row.startswith(line) for row in shown), (line, shown)


def test_one_pod_errors(with_pods: None) -> None:
    assert one_error_line(run("--pod", "team-a/nope")) == (
        "pod team-a/nope not found among the pods asking GPU memory"
    )
    result = run("--pod", "no-namespace")
    assert result.exit_code == 2
    assert "'no-namespace' is not NAMESPACE/NAME" in result.output
    document = json.loads(run("--pod", "team-a/placed", "-o", "json").stdout)
    assert (document["node"], document["placement"]) == ("gpu-1", WHY)


def test_summary_warns_of_pods_that_bypassed_gpushare(with_pods: None) -> None:
    result = run()
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "WARNING: GPU pods placed without gpushare's scheduler" in text
    rows = [" ".join(line.split()) for line in text.splitlines()]
    assert "team-a stray gpu-2 default-scheduler" in rows
    assert "set spec.schedulerName: gpushare-scheduler and recreate them" in rows
    bypassed = json.loads(run("-o", "json").stdout)["bypassed"]
    assert [(b["name"], b["scheduler"], b["use"]) for b in bypassed] == [
        ("stray", "default-scheduler", "gpushare-scheduler")
    ]


# ---- options ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"), [("10", 10.0), ("2s", 2.0), ("500ms", 0.5), ("2m", 120.0), ("1h", 3600.0)]
)
def test_request_timeout_durations(text: str, seconds: float) -> None:
    assert Duration().convert(text, None, None) == seconds


@pytest.mark.parametrize("text", ["0", "0s", "soon", "-1", "5d"])
def test_bad_request_timeout(text: str) -> None:
    with pytest.raises(click.BadParameter):
        Duration().convert(text, None, None)
    result = run("--request-timeout", text)
    assert result.exit_code == 2
    assert "--request-timeout" in result.output


def test_bad_output_format() -> None:
    result = run("-o", "yaml")
    assert result.exit_code == 2
    assert "'yaml' is not one of 'table', 'json'" in result.output


def test_help_as_a_kubectl_plugin_and_a_gpushare_command() -> None:
    result = run("--help")
    assert result.exit_code == 0
    assert result.output.startswith("Usage: kubectl inspect gpushare [OPTIONS] [NODE]")
    for option in ("-d, --details", "-o, --output", "--kubeconfig", "--context", "-n, --namespace"):
        assert option in result.output
    assert "--request-timeout" in result.output
    result = CliRunner().invoke(main, ["inspect", "--help"])
    assert result.exit_code == 0
    assert "Usage: main inspect [OPTIONS] [NODE]" in result.output
