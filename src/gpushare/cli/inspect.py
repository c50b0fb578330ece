"""``kubectl inspect gpushare`` (console script ``kubectl-inspect-gpushare``) and
``gpushare inspect``: GPU memory per node and GPU, read straight from the API server.

Installed on ``PATH`` as ``kubectl-inspect-gpushare``, kubectl runs it as ``kubectl inspect
gpushare [args]`` (kubectl's plugin lookup), passing the arguments and the environment on
unchanged. It lists the nodes and the pods asking ``aliyun.com/gpu-mem`` itself (RBAC: ``nodes``
``list``, ``pods`` ``list``), so it works while the scheduler extender is down.

The kubeconfig is found as kubectl finds it: ``--kubeconfig``, else the first existing file of
``$KUBECONFIG`` (a ``:``-separated list), else ``~/.kube/config``, else the pod's in-cluster
service account. Every failure is one line on stderr (``Error: ...``) and exit status 1:

* no configuration: ``no kubeconfig found: set KUBECONFIG or use --kubeconfig`` (with the
  variable's value when ``$KUBECONFIG`` names no existing file); ``--kubeconfig`` naming no
  file: ``no kubeconfig found at PATH (--kubeconfig)``; a bad file or an unknown context:
  ``kubeconfig PATH: <lightkube's message>``;
* the API server unreachable (refused, timeout, TLS): ``cannot reach the API server at URL:
  <cause>``; credentials refused: ``the API server at URL rejected the credentials (HTTP 401
  Unauthorized); ...``;
* RBAC: ``forbidden: cannot list pods (all namespaces); needs the RBAC rule apiGroups [""],
  resources [pods], verbs [list] in a ClusterRole (HTTP 403): <the server's message>`` (nodes
  alike; with ``-n NS``: ``pods in namespace NS`` and ``..., or a Role in namespace NS``);
* no GPU-share node: ``no node is labelled gpushare=true with GPUs; is the device plugin
  running?`` (followed by the first unreadable node, if any); an unknown NODE: ``node NAME not
  found``. A NODE that exists but is not a GPU-share node is shown, with the reason.

``-n NS`` reads only that namespace's pods, so the usage shown counts only those pods.
``--pod NAMESPACE/NAME`` shows one GPU pod (``gpushare.inspect.render.render_pod``): its GPUs
and why it went there (its ``gpushare.io/placement`` annotation, the extender's explanation at
bind), why it waits, or that it bypassed gpushare; a name that is not ``NAMESPACE/NAME`` is a
usage error, a pod not among those asking GPU memory ``pod NS/NAME not found ...``.
``--preemption-holds NAMESPACE/NAME`` is the first of the extender's holds ConfigMaps (GPUs
kept for preemptors; docs/usage.md, "Priorities and preemption"); its shards are found from
it (``gpushare.kube.snapshot``); when they cannot be read the report says so among its
problems and goes on without holds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from gpushare.cli.inspectweb import DEFAULT_WEB_PORT, ReportError, serve_gpu_map
from gpushare.core.preemption import Hold
from gpushare.inspect.gcpause import gc_paused
from gpushare.inspect.render import render_detail, render_pod, render_summary, report_json
from gpushare.inspect.report import Report, Snapshot, build_report
from gpushare.kube.client import ConfigError, KubeconfigError, connect
from gpushare.kube.codec import (
    GPUSHARE_LABEL,
    PLACEMENT,
    object_name,
    object_namespace,
    pod_annotation,
    pod_node_name,
)
from gpushare.kube.codec.preemption import holds_of
from gpushare.kube.errors import ApiCallError, Failure, KubeError
from gpushare.kube.holds import DEFAULT_HOLDS, parse_holds_ref
from gpushare.kube.snapshot import LIST_NODES, ClusterObjects, read_cluster, server_url
from gpushare.kube.watch import JsonObject

__all__ = [
    "NO_GPUSHARE_NODES",
    "NO_KUBECONFIG",
    "InspectError",
    "api_error_message",
    "inspect",
    "kubectl_main",
]

PROG_NAME = "kubectl inspect gpushare"
NO_KUBECONFIG = "no kubeconfig found: set KUBECONFIG or use --kubeconfig"
NO_GPUSHARE_NODES = (
    f"no node is labelled {GPUSHARE_LABEL}=true with GPUs; is the device plugin running?"
)
DEFAULT_TIMEOUT_S = 10.0
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*$")
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class InspectError(click.ClickException):
    """A one-line failure of the inspect command (``Error: <message>``, exit status 1)."""


class Duration(click.ParamType[float]):
    """Seconds as kubectl's ``--request-timeout`` writes them: ``5``, ``5s``, ``500ms``, ``2m``,
    ``1h``; must be > 0."""

    name = "duration"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, int | float):
            seconds = float(value)
        else:
            match = _DURATION.match(str(value))
            if match is None:
                self.fail(f"{value!r} is not a duration like 10, 10s, 500ms or 2m", param, ctx)
            seconds = float(match.group(1)) * _SECONDS[match.group(2) or "s"]
        if seconds <= 0:
            self.fail(f"{value!r}: the timeout must be > 0", param, ctx)
        return seconds


# ---- the kubeconfig ----------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Where the cluster configuration comes from: a file, or the in-cluster service account."""

    path: Path | None


def find_kubeconfig(kubeconfig: Path | None) -> Source:
    """The configuration kubectl would use (module doc); ``InspectError`` when a named file is
    missing."""
    if kubeconfig is not None:
        if not kubeconfig.is_file():
            raise InspectError(f"no kubeconfig found at {kubeconfig} (--kubeconfig)")
        return Source(kubeconfig)
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        for entry in listed:
            path = Path(entry).expanduser()
            if path.is_file():
                return Source(path)
        raise InspectError(f"{NO_KUBECONFIG} (KUBECONFIG={os.environ['KUBECONFIG']} names no file)")
    home = Path("~/.kube/config").expanduser()
    if home.is_file():
        return Source(home)
    return Source(None)


# ---- errors --------------------------------------------------------------------------------


def _rbac_rule(resource: str, namespace: str | None) -> str:
    scope = (
        "in a ClusterRole"
        if namespace is None or resource == "nodes"
        else f"in a ClusterRole, or a Role in namespace {namespace}"
    )
    return f'apiGroups [""], resources [{resource}], verbs [list] {scope}'


def api_error_message(error: KubeError, server: str, namespace: str | None = None) -> str:
    """The one-line message for a failed list against ``server`` (the module doc lists them)."""
    what = error.what if isinstance(error, ApiCallError) else str(error)
    detail = error.detail if isinstance(error, ApiCallError) else str(error)
    resource = "nodes" if what == LIST_NODES else "pods"
    where = "" if resource == "nodes" or namespace is None else f" in namespace {namespace}"
    scope = " (all namespaces)" if resource == "pods" and namespace is None else ""
    if error.failure is Failure.UNREACHABLE:
        return f"cannot reach the API server at {server}: {detail}"
    if error.failure is Failure.FORBIDDEN and error.status_code == 401:
        return (
            f"the API server at {server} rejected the credentials (HTTP 401 Unauthorized); "
            f"check the kubeconfig's user (expired token or certificate?): {detail}"
        )
    if error.failure is Failure.FORBIDDEN:
        return (
            f"forbidden: cannot list {resource}{where}{scope}; "
            f"needs the RBAC rule {_rbac_rule(resource, namespace)} (HTTP 403): {detail}"
        )
    return f"{server}: {error}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


# ---- reading and checking ------------------------------------------------------------------


async def _read(
    source: Source,
    context: str | None,
    namespace: str | None,
    timeout_s: float,
    holds: tuple[str, str] | None = None,
) -> ClusterObjects:
    try:
        client = connect(source.path, context=context, timeout_s=timeout_s)
    except KubeconfigError as error:
        raise InspectError(_one_line(str(error))) from error
    except ConfigError as error:
        if source.path is None:
            raise InspectError(NO_KUBECONFIG) from error
        raise InspectError(_one_line(f"kubeconfig {source.path}: {error}")) from error
    except Exception as error:  # unreadable YAML, bad certificate files, ...
        where = f"kubeconfig {source.path}" if source.path else "in-cluster configuration"
        raise InspectError(_one_line(f"{where}: {type(error).__name__}: {error}")) from error
    server = server_url(client)
    try:
        return await read_cluster(client, namespace=namespace, holds=holds)
    except KubeError as error:
        raise InspectError(_one_line(api_error_message(error, server, namespace))) from error
    finally:
        await client.close()


def _node_names(nodes: tuple[dict[str, Any], ...]) -> set[str]:
    return {object_name(obj) for obj in nodes} - {""}


def _no_gpushare_nodes(problems: tuple[str, ...]) -> InspectError:
    if not problems:
        return InspectError(NO_GPUSHARE_NODES)
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return InspectError(_one_line(f"{NO_GPUSHARE_NODES} Unreadable: {problems[0]}{more}"))


# ---- the command ---------------------------------------------------------------------------


@click.command("inspect")
@click.argument("node", required=False)
@click.option(
    "-d", "--details", is_flag=True, help="Per-GPU detail: every GPU of every node and its pods."
)
@click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="Output format.",
)
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster service account).",
)
@click.option("--context", help="Context of the kubeconfig (default: its current context).")
@click.option(
    "-n",
    "--namespace",
    help="Only pods of this namespace (default: all); usage then counts only those pods.",
)
@click.option(
    "--request-timeout",
    "timeout_s",
    type=Duration(),
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    help="Limit for each API request: 10, 10s, 500ms, 2m.",
)
@click.option(
    "--preemption-holds",
    "holds_ref",
    default="/".join(DEFAULT_HOLDS),
    show_default=True,
    help="NAMESPACE/NAME of the first of the extender's preemption holds ConfigMaps (the "
    "chart's: <release namespace>/<fullname>-preemption-holds; its shards are found from it).",
)
@click.option(
    "--pod",
    "pod_ref",
    metavar="NAMESPACE/NAME",
    help="One GPU pod: its node and GPUs and why it went there (the policy and the best "
    "nodes' scores the extender recorded at bind), why it waits, or that it bypassed gpushare.",
)
@click.option(
    "--web",
    is_flag=True,
    help="Serve the GPU map, a live page of the same report, on 127.0.0.1 (open the printed "
    "URL in a browser; Ctrl-C stops it).",
)
@click.option(
    "--web-port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_WEB_PORT,
    show_default=True,
    help="Port of --web on 127.0.0.1 (0: any free port).",
)
def inspect(
    *,
    node: str | None,
    details: bool,
    output: str,
    kubeconfig: Path | None,
    context: str | None,
    namespace: str | None,
    timeout_s: float,
    holds_ref: str,
    pod_ref: str | None,
    web: bool,
    web_port: int,
) -> None:
    """Show GPU memory per node and GPU: allocated/total, pending pods, unhealthy GPUs.

    NODE limits the view to one node. Reads the API server directly (nodes and pods list),
    so it works while the scheduler extender is down. --web serves the same report as a live
    page (the GPU map) on 127.0.0.1.
    """
    try:
        holds_configmap = parse_holds_ref(holds_ref)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--preemption-holds") from None
    source = find_kubeconfig(kubeconfig)
    if web:

        async def read_report() -> dict[str, Any]:
            try:
                objects = await _read(source, context, namespace, timeout_s, holds_configmap)
                with gc_paused():
                    return report_json(_report(objects, node, pod_rows=True))
            except click.ClickException as error:
                raise ReportError(error.format_message()) from None

        serve_gpu_map(read_report, web_port)
        return
    pod_key = _pod_key(pod_ref) if pod_ref is not None else None
    objects = asyncio.run(_read(source, context, namespace, timeout_s, holds_configmap))
    if pod_key is not None:
        click.echo(_one_pod(objects, pod_key, output).rstrip("\n"))
        return
    with gc_paused():
        report = _report(objects, node, pod_rows=details or output == "json")
        try:
            if output == "json":
                text = json.dumps(report_json(report), indent=2)
            else:
                text = (render_detail if details else render_summary)(report).rstrip("\n")
        except Exception as error:
            raise _bug(error) from error
    click.echo(text)


def _pod_key(ref: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` of ``--pod``; ``click.BadParameter`` otherwise."""
    namespace, _, name = ref.partition("/")
    if not namespace or not name or "/" in name:
        raise click.BadParameter(
            f"{ref!r} is not NAMESPACE/NAME (e.g. team-a/train-0)", param_hint="--pod"
        )
    return namespace, name


def _one_pod(objects: ClusterObjects, key: tuple[str, str], output: str) -> str:
    """The ``--pod`` view of pod ``key`` (``render_pod``, or its JSON); ``InspectError`` when
    no pod asking GPU memory has that name."""
    found = [obj for obj in objects.pods if (object_namespace(obj), object_name(obj)) == key]
    if not found:
        raise InspectError(f"pod {key[0]}/{key[1]} not found among the pods asking GPU memory")
    obj = found[0]
    placement = pod_annotation(obj, PLACEMENT) or ""
    report = _report(objects, pod_node_name(obj) or None, pod_rows=True, require_gpushare=False)
    try:
        text = render_pod(report, *key, placement)
    except KeyError:
        raise InspectError(f"pod {key[0]}/{key[1]} holds no GPU and is not pending") from None
    if output == "table":
        return text
    bypassed = [p.describe() for p in report.bypassed if (p.namespace, p.name) == key]
    pending = [p.reason for p in report.pending if (p.namespace, p.name) == key]
    data = {
        "namespace": key[0],
        "name": key[1],
        "node": pod_node_name(obj) or None,
        "placement": placement or None,
        "pending": pending[0] if pending else None,
        "bypassed": bypassed[0] if bypassed else None,
    }
    return json.dumps(data, indent=2)


def _holds(configmaps: Sequence[JsonObject]) -> tuple[tuple[Hold, ...], list[str]]:
    """The holds of every shard's ConfigMap (a preemptor found twice: its latest hold, as the
    extender counts it, ``gpushare.extender.holds``) and the entries refused."""
    found: dict[str, Hold] = {}
    refused: list[str] = []
    for configmap in configmaps:
        holds, problems = holds_of(configmap)
        refused.extend(problems)
        for hold in holds:
            seen = found.get(hold.pod)
            if seen is None or hold.created_s > seen.created_s:
                found[hold.pod] = hold
    return tuple(found[key] for key in sorted(found)), refused


def _report(
    objects: ClusterObjects, node: str | None, *, pod_rows: bool, require_gpushare: bool = True
) -> Report:
    """The report of ``objects`` (``node``: only that node; ``pod_rows``: with each node's
    pods, which the summary table does not show). ``InspectError`` for an unknown node, no
    GPU-share node, or a bug (one line, never a traceback)."""
    if node is not None and node not in _node_names(objects.nodes):
        raise InspectError(f"node {node} not found")
    try:
        holds, refused = _holds(objects.holds)
        snapshot = Snapshot(nodes=objects.nodes, pods=objects.pods, holds=holds)
        report = build_report(snapshot, node=node, pod_rows=pod_rows, now_s=time.time())
        notes = [*refused, *([objects.holds_problem] if objects.holds_problem else [])]
        if notes:
            report = dataclasses.replace(report, problems=(*report.problems, *notes))
    except Exception as error:  # a bug, not the cluster: still one line, never a traceback
        raise _bug(error) from error
    if require_gpushare and node is None and not any(n.gpushare for n in report.nodes):
        raise _no_gpushare_nodes(report.problems)
    return report


def _bug(error: Exception) -> InspectError:
    return InspectError(
        _one_line(f"cannot build the report (a gpushare bug): {type(error).__name__}: {error}")
    )


def kubectl_main() -> None:
    """The ``kubectl-inspect-gpushare`` console script (``kubectl inspect gpushare``)."""
    inspect.main(prog_name=PROG_NAME)
