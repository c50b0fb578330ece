"""``gpushare extender``: serve the scheduler extender with uvicorn.

By default it runs on the cluster (``gpushare.extender.live``): ``--kubeconfig PATH`` and
``--context``, or without them the pod's service account, ``$KUBECONFIG`` or
``~/.kube/config``. Nodes and GPU pods come from list+watch, binds create ``pods/binding``,
each bind leaves an Event on its pod, and ``/readyz`` answers 200 once nodes and pods are
listed.

``--in-memory`` is a test and benchmark mode without an API server: nodes come from
``--nodes FILE`` (a NodeList or a list of Node objects, as ``kubectl get nodes -o json``
prints) and from ``Nodes`` requests (``nodeCacheCapable: false``); nothing can bind
(``UnwiredBinder``), so kube-scheduler must not use it.

It listens on ``--host`` (127.0.0.1 by default: nothing but the machine itself reaches it; the
chart passes the pod's IP, ``--host=$(POD_IP)`` from ``status.podIP``) and ``--port``.

``--tls-cert FILE --tls-key FILE`` serve HTTPS (PEM files); ``--tls-client-ca FILE`` also
requires every caller of a verb (filter, prioritize, bind, preempt) to present a certificate
signed by that CA: without one it gets 401 (``--tls-client-auth=required``, the default) or is
served, counted and logged (``optional``, while moving a scheduler over); probes and
``/metrics`` need none (``gpushare.extender.callers``). The files are checked at start-up: one
error lists every problem. Without ``--tls-client-ca`` anyone who reaches the port may call
the verbs, and a warning says so at start.

``--max-request-body-mib``, ``--request-head-timeout``, ``--request-body-timeout``,
``--keep-alive-timeout`` and ``--max-connections`` bound what one client can make the extender
hold (``gpushare.extender.limits``; docs/extender.md, "Limits").
``--preemption`` (on by default) answers kube-scheduler's ``preempt`` verb with GPU-correct
victims, preempts itself where kube-scheduler cannot see GPUs, and holds the freed GPUs for
the preemptor (``gpushare.extender.preemption``; docs/usage.md, "Priorities and preemption"):
``--preemption-holds NAMESPACE/NAME`` is the first of the ``--preemption-hold-shards``
ConfigMaps its holds are kept in (``gpushare.kube.holds``),
``--preemption-wait`` how long it waits for kube-scheduler's call, ``--preemption-hold-max``
how long a hold may last.
With ``--leader-elect`` and TLS, followers forward to the leader's peer listener
(``--peer-port``, mutual TLS): they verify its certificate against ``--peer-ca`` (the release
CA) for ``--peer-server-name`` (the DNS name every replica's certificate carries) and, with
``--peer-selector``, that the Lease's address is a replica pod's IP
(``gpushare.extender.forward``). Renewed certificate files are loaded without a restart
(``--tls-reload-interval``).
``--leader-elect`` runs one of several replicas: only the holder of the Lease
(``--leader-elect-resource-namespace/-name``) decides; the others forward the verbs to it
(``gpushare.cli.leader``; docs/install.md, "High availability").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from pathlib import Path

import click
import uvicorn

from gpushare.cli.leader import leader_election_options
from gpushare.cli.options import connect_or_exit, kube_options, log_level_option, setup_logging
from gpushare.core.policies import policy_names
from gpushare.extender import DEFAULT_PORT, DEFAULT_PREFIX, ExtenderState, create_app
from gpushare.extender.apiserver import EVENT_BURST, EVENT_QPS
from gpushare.extender.callers import ClientAuth
from gpushare.extender.forward import DEFAULT_PEER_PORT
from gpushare.extender.holds import HoldBook
from gpushare.extender.limits import (
    DEFAULT_MAX_BODY_BYTES,
    MIB,
    RequestLimits,
    uvicorn_settings,
)
from gpushare.extender.live import LiveOptions, serve, tls_problems, uvicorn_tls
from gpushare.extender.preemption import PreemptionOptions, Preemptor
from gpushare.extender.reservations import DEFAULT_ASSUME_TTL_S, DEFAULT_HANDSHAKE_TIMEOUT_S
from gpushare.extender.scoring import DEFAULT_GPU_UNIT, DEFAULT_POLICY
from gpushare.extender.workload import live_policy
from gpushare.kube.codec import CodecError
from gpushare.kube.holds import DEFAULT_HOLDS, HOLD_SHARDS, MAX_HOLD_SHARDS, parse_holds_ref
from gpushare.kube.lease import LeaseConfig
from gpushare.kube.peers import parse_selector

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
"""``--host``: loopback, so that a bare ``gpushare extender`` is reachable from nowhere else
(the extender must not listen on every interface by default)."""


def build_state(
    nodes_file: Path | None,
    assume_ttl_s: float,
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
) -> ExtenderState:
    """The ``--in-memory`` state: synced, with the nodes of ``nodes_file`` (``ClickException``
    naming the file and the problem when it cannot be read)."""
    state = ExtenderState(assume_ttl_s=assume_ttl_s, handshake_timeout_s=handshake_timeout_s)
    if nodes_file is not None:
        try:
            document = json.loads(nodes_file.read_text(encoding="utf-8"))
            items = document.get("items") if isinstance(document, dict) else document
            if not isinstance(items, list):
                raise ValueError("expected a NodeList or a JSON list of Node objects")
            for item in items:
                if not isinstance(item, dict):
                    raise ValueError(f"not a Node object: {item!r:.80}")
                state.upsert_node(item)
        except (OSError, ValueError, CodecError) as error:
            raise click.ClickException(f"--nodes {nodes_file}: {error}") from error
    state.cluster.mark_synced()
    return state


@click.command()
@click.option(
    "--host",
    default=DEFAULT_HOST,
    show_default=True,
    help="Address to listen on. Loopback by default: in a pod, pass the pod's IP (the chart sets "
    "--host=$(POD_IP) from status.podIP); 0.0.0.0 listens on every interface.",
)
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--prefix", default=DEFAULT_PREFIX, show_default=True, help="URL prefix of the verbs."
)
@click.option(
    "--policy",
    type=click.Choice(policy_names()),
    default=DEFAULT_POLICY,
    show_default=True,
    help="Placement policy: node half for prioritize, GPU half for bind "
    "(docs/simulator.md compares them).",
)
@click.option(
    "--gpu-unit",
    type=click.IntRange(min=4),
    default=None,
    help="One whole GPU in the nodes' memory unit (fgd, fgd-cpu, fgd-spare). Default: derived "
    "from the node inventory, the capacity most GPUs have (16 until a GPU node is known).",
)
@click.option(
    "--assume-ttl",
    "assume_ttl_s",
    type=click.FloatRange(min=0),
    default=DEFAULT_ASSUME_TTL_S,
    show_default=True,
    help="Seconds an assumed allocation lives unless the pod is seen bound.",
)
@click.option(
    "--handshake-timeout",
    "handshake_timeout_s",
    type=click.FloatRange(min=0),
    default=DEFAULT_HANDSHAKE_TIMEOUT_S,
    show_default=True,
    help="Seconds a bound pod not yet started by the device plugin keeps equal pods on its "
    "GPUs (docs/deviceplugin.md, 'The handshake'); 0 turns this off (only for clusters without "
    "kubelets, e.g. kwok).",
)
@click.option(
    "--bind-timeout",
    "bind_timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=20.0,
    show_default=True,
    help="Seconds one bind may take; keep it below kube-scheduler's httpTimeout.",
)
@click.option(
    "--event-qps",
    "event_qps",
    type=click.FloatRange(min=0),
    default=EVENT_QPS,
    show_default=True,
    help="GPUAssigned Events a second, sustained; more are dropped (counted, logged) and the "
    "allocation stays in the pod's annotations. 0: no limit. Warnings are never dropped.",
)
@click.option(
    "--event-burst",
    "event_burst",
    type=click.IntRange(min=1),
    default=EVENT_BURST,
    show_default=True,
    help="GPUAssigned Events at once after a quiet spell (with --event-qps).",
)
@kube_options
@click.option(
    "--in-memory",
    is_flag=True,
    help="Test/benchmark mode: no API server, nodes from --nodes and Nodes requests, no binds.",
)
@click.option(
    "--nodes",
    "nodes_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="JSON NodeList to preload (--in-memory only).",
)
@click.option(
    "--tls-cert",
    type=click.Path(path_type=Path),
    help="Serve HTTPS with this PEM certificate (chain); needs --tls-key.",
)
@click.option("--tls-key", type=click.Path(path_type=Path), help="PEM private key of --tls-cert.")
@click.option(
    "--tls-client-ca",
    type=click.Path(path_type=Path),
    help="Require the verbs' callers to present a client certificate signed by this PEM CA "
    "(mutual TLS; probes and /metrics need none).",
)
@click.option(
    "--tls-client-auth",
    type=click.Choice([m.value for m in ClientAuth]),
    default=ClientAuth.REQUIRED.value,
    show_default=True,
    help="With --tls-client-ca: refuse a verb without a client certificate (401), or serve it "
    "and count it (optional: while moving a scheduler over to client certificates).",
)
@click.option(
    "--peer-port",
    type=click.IntRange(1, 65535),
    default=DEFAULT_PEER_PORT,
    show_default=True,
    help="With --leader-elect and TLS: the port followers forward to (mutual TLS, --peer-ca).",
)
@click.option(
    "--peer-ca",
    type=click.Path(path_type=Path),
    help="With --leader-elect and TLS: the CA that signed every replica's certificate (the "
    "chart's ca.crt); the leader is verified against it and requires it of followers.",
)
@click.option(
    "--peer-server-name",
    help="With --leader-elect and TLS: the DNS name every replica's certificate carries (the "
    "Service's, e.g. gpushare-extender.kube-system.svc); the leader's is checked for it.",
)
@click.option(
    "--peer-selector",
    help="With --leader-elect: labels of the replica pods, label=value[,...]; a follower "
    "forwards only to an address that is one of their pod IPs. The chart sets it.",
)
@click.option(
    "--tls-reload-interval",
    "tls_reload_s",
    type=click.FloatRange(min=1),
    default=30.0,
    show_default=True,
    help="Seconds between looks at the TLS files: a renewed certificate is loaded in place.",
)
@click.option(
    "--max-request-body-mib",
    "max_request_body_mib",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_MAX_BODY_BYTES / MIB,
    show_default=True,
    help="Largest request body accepted, in MiB (413 above it). The default fits a pod plus "
    "5,000 NodeNames; with nodeCacheCapable: false allow ~16 KiB per node "
    "(docs/extender.md, 'Limits').",
)
@click.option(
    "--request-head-timeout",
    "request_head_timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=RequestLimits().head_timeout_s,
    show_default=True,
    help="Seconds a connection may take to send a whole request line and headers.",
)
@click.option(
    "--request-body-timeout",
    "request_body_timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=RequestLimits().body_timeout_s,
    show_default=True,
    help="Seconds a request body may take after its headers (408 past it).",
)
@click.option(
    "--keep-alive-timeout",
    "keep_alive_timeout_s",
    type=click.IntRange(min=1),
    default=RequestLimits().keep_alive_timeout_s,
    show_default=True,
    help="Seconds an idle connection stays open between requests.",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    default=RequestLimits().max_connections,
    show_default=True,
    help="Open connections at most; one more is closed at once.",
)
@click.option(
    "--preemption/--no-preemption",
    default=True,
    show_default=True,
    help="GPU-aware preemption: answer kube-scheduler's preempt verb with the pods to evict on "
    "the right GPU, preempt where kube-scheduler sees no victims, hold freed GPUs for the "
    "preemptor (docs/usage.md, 'Priorities and preemption').",
)
@click.option(
    "--preemption-holds",
    "holds_ref",
    default="/".join(DEFAULT_HOLDS),
    show_default=True,
    help="NAMESPACE/NAME of the ConfigMap the leader keeps preemption holds in, the first of "
    "--preemption-hold-shards (the others NAME-1, NAME-2, ...; the chart creates them; only "
    "the extender may write them).",
)
@click.option(
    "--preemption-hold-shards",
    "hold_shards",
    type=click.IntRange(1, MAX_HOLD_SHARDS),
    default=HOLD_SHARDS,
    show_default=True,
    help="ConfigMaps the preemption holds are spread over, so that each write stays small "
    "while many preemptors wait at once (every replica and the chart must agree).",
)
@click.option(
    "--preemption-wait",
    "preemption_wait_s",
    type=click.FloatRange(min=0),
    default=PreemptionOptions().wait_s,
    show_default=True,
    help="Seconds to wait for kube-scheduler's preempt call after a filter found no node, "
    "before the extender preempts itself.",
)
@click.option(
    "--dra-scoring/--no-dra-scoring",
    default=False,
    show_default=True,
    help="Also score nodes for DRA claim pods (POST <prefix>/dra/prioritize) from gpushare's "
    "ResourceSlices and every ResourceClaim (needs list/watch on both; kube-scheduler calls it "
    "as a second extender without managedResources: docs/dra.md).",
)
@click.option(
    "--preemption-hold-max",
    "preemption_hold_max_s",
    type=click.FloatRange(min=1),
    default=PreemptionOptions().hold_max_s,
    show_default=True,
    help="Seconds GPUs are held for a preemptor at most (normally: its victims' longest "
    "grace period plus 30 s).",
)
@leader_election_options
@log_level_option
def extender(
    *,
    host: str,
    port: int,
    prefix: str,
    policy: str,
    gpu_unit: int | None,
    assume_ttl_s: float,
    handshake_timeout_s: float,
    bind_timeout_s: float,
    event_qps: float,
    event_burst: int,
    kubeconfig: Path | None,
    context: str | None,
    in_memory: bool,
    nodes_file: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_client_ca: Path | None,
    tls_client_auth: str,
    peer_port: int,
    peer_ca: Path | None,
    peer_server_name: str | None,
    peer_selector: str | None,
    tls_reload_s: float,
    max_request_body_mib: float,
    request_head_timeout_s: float,
    request_body_timeout_s: float,
    keep_alive_timeout_s: int,
    max_connections: int,
    preemption: bool,
    holds_ref: str,
    hold_shards: int,
    preemption_wait_s: float,
    preemption_hold_max_s: float,
    dra_scoring: bool,
    leader_election: LeaseConfig | None,
    log_level: str,
) -> None:
    """Serve the scheduler extender (filter, prioritize, bind, inspect) for kube-scheduler."""
    if in_memory and (kubeconfig is not None or context is not None):
        raise click.UsageError("--in-memory takes no --kubeconfig or --context")
    if nodes_file is not None and not in_memory:
        raise click.UsageError("--nodes needs --in-memory (on a cluster, nodes come from the API)")
    if in_memory and leader_election is not None:
        raise click.UsageError("--in-memory takes no --leader-elect (there is no API server)")
    if in_memory and dra_scoring:
        raise click.UsageError(
            "--in-memory takes no --dra-scoring (slices and claims come from the API server)"
        )
    problems = tls_problems(tls_cert, tls_key, tls_client_ca)
    if leader_election is not None and tls_cert is not None:
        if peer_ca is None or not peer_server_name:
            problems.append(
                "--leader-elect with TLS needs --peer-ca and --peer-server-name (followers verify "
                "the leader and authenticate to it; the chart passes both)"
            )
        elif not peer_ca.is_file():
            problems.append(f"--peer-ca {peer_ca}: no such file")
    if problems:
        raise click.UsageError("bad TLS configuration:\n  " + "\n  ".join(problems))
    try:
        selector = parse_selector(peer_selector) if peer_selector else None
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--peer-selector") from None
    tls = uvicorn_tls(tls_cert, tls_key, tls_client_ca)
    try:
        holds_configmap = parse_holds_ref(holds_ref)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--preemption-holds") from None
    preemption_options = (
        PreemptionOptions(wait_s=preemption_wait_s, hold_max_s=preemption_hold_max_s)
        if preemption
        else None
    )
    limits = RequestLimits(
        max_body_bytes=int(max_request_body_mib * MIB),
        head_timeout_s=request_head_timeout_s,
        body_timeout_s=request_body_timeout_s,
        keep_alive_timeout_s=keep_alive_timeout_s,
        max_connections=max_connections,
    )
    setup_logging(log_level)
    client_auth = ClientAuth(tls_client_auth) if tls_client_ca is not None else None
    if client_auth is None:
        log.warning(
            "no --tls-client-ca: anyone who reaches port %d may call filter, bind and preempt "
            '(docs/install.md, "TLS")',
            port,
        )
    if in_memory:
        state = build_state(nodes_file, assume_ttl_s, handshake_timeout_s)
        app = create_app(
            state,
            prefix=prefix,
            policy=live_policy(policy, gpu_unit, gpu_capacities=state.cluster.gpu_capacities),
            gpu_unit=gpu_unit or DEFAULT_GPU_UNIT,
            nodes_from_requests=True,
            limits=limits,
            preemptor=(
                Preemptor(
                    state,
                    HoldBook(state.cluster.touch, max_life_s=preemption_options.hold_max_s),
                    options=preemption_options,
                )
                if preemption_options is not None
                else None
            ),
            client_auth=client_auth,
        )
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_config=None,
            ws="none",
            **uvicorn_settings(limits),
            **tls,
        )
        return
    options = LiveOptions(
        host=host,
        port=port,
        prefix=prefix,
        policy=policy,
        gpu_unit=gpu_unit,
        assume_ttl_s=assume_ttl_s,
        handshake_timeout_s=handshake_timeout_s,
        bind_timeout_s=bind_timeout_s,
        event_qps=event_qps,
        event_burst=event_burst,
        tls_cert=tls_cert,
        tls_key=tls_key,
        tls_client_ca=tls_client_ca,
        tls_client_auth=ClientAuth(tls_client_auth),
        limits=limits,
        leader_election=leader_election,
        peer_port=peer_port,
        peer_ca=peer_ca,
        peer_server_name=peer_server_name,
        peer_selector=selector,
        tls_reload_s=tls_reload_s,
        preemption=preemption_options,
        holds_configmap=holds_configmap,
        hold_shards=hold_shards,
        dra_scoring=dra_scoring,
    )
    client = connect_or_exit(kubeconfig, context)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(client, options))
