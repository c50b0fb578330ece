"""The extender's HTTP service: a starlette app over a ``Scheduler`` (thin transport).

Routes (kube-scheduler POSTs ``<urlPrefix>/<verb>``: docs/interfaces.md, "Transport"; Alibaba's
URL layout, ``pkg/routes/routes.go``), ``P`` the prefix (default ``/gpushare-scheduler``):

=========================  =======================================================================
``POST P/filter``          ``ExtenderArgs`` → ``ExtenderFilterResult``
``POST P/prioritize``      ``ExtenderArgs`` → ``[HostPriority]`` (integers 0–10)
``POST P/bind``            ``ExtenderBindingArgs`` → ``ExtenderBindingResult``
``POST P/preempt``         ``ExtenderPreemptionArgs`` → ``ExtenderPreemptionResult``
                           (``gpushare.extender.preemption``; without a preemptor every
                           candidate is kept as kube-scheduler chose it)
``POST P/dra/prioritize``  ``ExtenderArgs`` → ``[HostPriority]`` for DRA claim pods, with ``dra``
                           (``gpushare.extender.dra``)
``GET P/inspect[/node]``   allocation report (``gpushare.extender.report``); 404 for an unknown node
``GET /healthz``           200 while the process serves
``GET /readyz``            200 once the state has synced (and ``readiness()``, if given), else 503
``GET /version``           ``{"version": ...}``
``GET /metrics``           Prometheus text exposition (``gpushare.extender.metrics``)
=========================  =======================================================================

With ``client_auth`` (``--tls-client-ca``) the verbs need a caller that presented a verified
client certificate: without one, **401** (``ClientAuth.REQUIRED``) before the body is read
(``gpushare.extender.callers``); the other routes need none.

A body that is not JSON or not of the verb's shape gets **400** with ``{"Error": "<what>"}``; one
larger than ``limits.max_body_bytes`` **413**, one not complete within ``limits.body_timeout_s``
**408**, both closing the connection (``gpushare.extender.limits``).
A pod or node the codec cannot read is reported in the result (``Error``, or per node), with
HTTP 200 so that kube-scheduler shows the text. An unexpected exception in filter or bind is an
``Error`` text too (logged with its traceback); in prioritize it is a 500. Handlers are
``async`` and run on the event loop, where every state change happens (``ExtenderState``).
Each POST is counted and timed by verb and outcome (``ok``; ``held``: a filter ``Error`` for a
pod the handshake rule holds, ``outcomes.held_error``; ``error``: another ``Error`` text or a
500; ``bad_request``: a 400, or a client that disconnected before the end of its body, which
is logged as one line without a traceback; ``unauthenticated``: a 401) in ``ExtenderMetrics``,
on the given ``CollectorRegistry`` or a fresh one (never the global default registry).
A background task expires assumed allocations every ``expire_interval_s`` seconds.

With several replicas, ``divert(request, body)`` may answer a verb instead of this replica's
scheduler (``Diverted``): a follower forwards it to the leader or refuses it
(``gpushare.extender.forward``); ``None`` lets this replica decide. Diverted requests are
counted with outcome ``forwarded`` (the leader answered) or ``refused`` (no leader to forward
to).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from gpushare import __version__
from gpushare.core.policies import Policy
from gpushare.core.preemption import Hold
from gpushare.extender.bindapi import Binder, EventSink, UnwiredBinder
from gpushare.extender.callers import UNAUTHENTICATED, CallerCheck, ClientAuth
from gpushare.extender.dra import DraScorer, candidate_names
from gpushare.extender.limits import LimitError, RequestLimits, read_body
from gpushare.extender.metrics import DRA_VERB, VERBS, ExtenderMetrics
from gpushare.extender.outcomes import outcome_of
from gpushare.extender.preemption import Preemptor
from gpushare.extender.report import cluster_report, node_report
from gpushare.extender.requeue import Requeuer
from gpushare.extender.scheduler import Scheduler
from gpushare.extender.scoring import DEFAULT_POLICY, extender_policy
from gpushare.extender.state import ExtenderState
from gpushare.extender.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    MetaPod,
    MetaVictims,
    RequestError,
    decode,
    encode,
)
from gpushare.inspect.gcpause import gc_paused
from gpushare.inspect.report import SnapshotReader
from gpushare.kube.codec import pod_uid

DEFAULT_PREFIX = "/gpushare-scheduler"
DEFAULT_PORT = 12345
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Diverted:
    """A verb answered by ``create_app``'s ``divert`` hook instead of this replica's scheduler:
    the ``response`` to send, and whether the leader gave it (``forwarded``) or this replica
    refused the verb (no leader to forward to)."""

    response: Response
    forwarded: bool


def _json(value: object, status: int = 200) -> Response:
    return Response(encode(value), status_code=status, media_type="application/json")


def error_response(status: int, text: str, *, close: bool = False) -> Response:
    """``{"Error": text}`` with HTTP ``status``; ``close``: also ``Connection: close``."""
    response = _json({"Error": text}, status)
    if close:  # the rest of the body is not read: the connection cannot be reused
        response.headers["Connection"] = "close"
    return response


def _peer(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client else "?"


async def _expire_forever(
    state: ExtenderState, interval_s: float, requeuer: Requeuer | None
) -> None:
    while True:
        await asyncio.sleep(interval_s)
        for allocation in state.reservations.expire():
            log.info("assumed allocation of pod %s on %s expired", allocation.pod, allocation.node)
            if requeuer is not None:
                requeuer.changed(allocation.node)


def _as_scheduler_chose(args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult:
    """The ``preempt`` answer of an extender without preemption: every candidate with the
    victims kube-scheduler chose (nodes without victims left out)."""
    kept: dict[str, MetaVictims] = {}
    for node, meta in (args.node_name_to_meta_victims or {}).items():
        if meta is not None and meta.pods:
            kept[node] = MetaVictims(list(meta.pods), meta.num_pdb_violations)
    for node, victims in (args.node_name_to_victims or {}).items():
        pods = [MetaPod(pod_uid(p)) for p in (victims.pods if victims is not None else None) or ()]
        if pods and node not in kept and victims is not None:
            kept[node] = MetaVictims(pods, victims.num_pdb_violations)
    return ExtenderPreemptionResult(kept)


def create_app(
    state: ExtenderState,
    *,
    prefix: str = DEFAULT_PREFIX,
    policy: Policy | str = DEFAULT_POLICY,
    binder: Binder | None = None,
    events: EventSink | None = None,
    gpu_unit: int = 16,
    expire_interval_s: float | None = 1.0,
    clock_ns: Callable[[], int] = time.time_ns,
    version: str = __version__,
    registry: CollectorRegistry | None = None,
    nodes_from_requests: bool = False,
    limits: RequestLimits | None = None,
    divert: Callable[[Request, bytes], Awaitable[Diverted | None]] | None = None,
    readiness: Callable[[], bool] | None = None,
    preemptor: Preemptor | None = None,
    requeuer: Requeuer | None = None,
    dra: DraScorer | None = None,
    client_auth: ClientAuth | None = None,
) -> Starlette:
    """The extender app over ``state``.

    ``policy`` is a policy or its registry name (``gpu_unit``: one whole GPU in the node unit,
    for ``fgd``/``fgd-cpu``); ``binder`` creates Bindings (default: ``UnwiredBinder``, which
    refuses); ``events`` records bind outcomes; ``expire_interval_s`` ``None`` turns the expiry
    task off (tests call ``state.reservations.expire()``); ``registry`` holds the metrics
    (default: a fresh ``CollectorRegistry``); ``nodes_from_requests``: let ``Nodes`` requests
    add or change nodes (``--in-memory`` only; never with an API server, see
    ``gpushare.extender.scheduler``); ``limits``: the request body's size and read time
    (``gpushare.extender.limits``; the connection-level bounds are the server's,
    ``uvicorn_settings``); ``divert`` (forward or
    refuse a verb) and ``readiness`` (more conditions for ``/readyz``) are the leader-election
    hooks; ``preemptor``: GPU-aware preemption (``gpushare.extender.preemption``: the
    ``preempt`` verb, holds in filter, prioritize and bind, and its loop, run while the app
    serves); ``requeuer``: requeue the pods the filter refused everywhere when a node changes
    (``gpushare.extender.requeue``; its loop runs while the app serves); ``dra``: score nodes
    for DRA claim pods on ``P/dra/prioritize`` (``gpushare.extender.dra``); ``client_auth``: what
    the verbs ask of their caller (``gpushare.extender.callers``; ``None``: nothing, the
    server has no client CA). The ``Scheduler`` is ``app.state.scheduler``, the
    ``ExtenderMetrics`` ``app.state.metrics``.
    """
    limits = limits or RequestLimits()
    chosen = extender_policy(policy, gpu_unit=gpu_unit) if isinstance(policy, str) else policy
    scheduler = Scheduler(
        state,
        chosen,
        binder or UnwiredBinder(),
        events=events,
        clock_ns=clock_ns,
        nodes_from_requests=nodes_from_requests,
        preemptor=preemptor,
        on_refused=requeuer.refused if requeuer is not None else None,
    )
    metrics = ExtenderMetrics(state, registry)
    callers = CallerCheck(client_auth, metrics.registry, VERBS) if client_auth is not None else None
    base = "/" + prefix.strip("/") if prefix.strip("/") else ""

    def guarded(
        verb: str,
        handle: Callable[[bytes], Awaitable[object]],
        internal: Callable[[str], object] | None,
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            started = time.perf_counter()
            outcome = "error"
            try:
                refusal = callers.refuses(verb, request) if callers is not None else None
                if refusal is not None:
                    outcome = UNAUTHENTICATED
                    return error_response(401, refusal)
                try:
                    body = await read_body(request.receive, request.scope["headers"], limits)
                except LimitError as rejected:
                    outcome = "bad_request"
                    log.info("%s from %s: %s", verb, _peer(request), rejected.text)
                    return error_response(rejected.status, rejected.text, close=True)
                except ClientDisconnect:  # nobody is left to answer: one line, no traceback
                    outcome = "bad_request"
                    log.info(
                        "%s from %s: the client disconnected before sending the whole body "
                        "(pod unknown: the body was not complete)",
                        verb,
                        _peer(request),
                    )
                    return error_response(
                        400, f"client disconnected before the end of the {verb} body"
                    )
                diverted = await divert(request, body) if divert is not None else None
                if diverted is not None:
                    outcome = "forwarded" if diverted.forwarded else "refused"
                    return diverted.response
                try:
                    result = await handle(body)
                except RequestError as error:
                    outcome = "bad_request"
                    return error_response(400, str(error))
                except Exception as error:
                    log.exception("%s failed", verb)
                    text = f"gpushare internal error in {verb}: {error!r}"
                    return error_response(500, text) if internal is None else _json(internal(text))
                outcome = outcome_of(getattr(result, "error", ""))
                return _json(result)
            finally:
                metrics.observe(verb, outcome, time.perf_counter() - started)

        return endpoint

    async def filter_(body: bytes) -> object:
        return scheduler.filter(decode(body, ExtenderArgs, "filter"))

    async def prioritize(body: bytes) -> object:
        return scheduler.prioritize(decode(body, ExtenderArgs, "prioritize"))

    async def dra_prioritize(body: bytes) -> object:
        args = decode(body, ExtenderArgs, "prioritize")
        assert dra is not None
        return await dra.prioritize(args.pod, candidate_names(args))

    async def bind(body: bytes) -> object:
        return await scheduler.bind(decode(body, ExtenderBindingArgs, "bind"))

    async def preempt(body: bytes) -> object:
        args = decode(body, ExtenderPreemptionArgs, "preempt")
        if preemptor is not None:
            return await preemptor.preempt(args)
        return _as_scheduler_chose(args)

    reader = SnapshotReader()  # pods and nodes read for /inspect, kept: a request reads changes

    def holds() -> list[Hold]:
        return preemptor.holds.all() if preemptor is not None else []

    async def inspect_all(request: Request) -> Response:
        with gc_paused():
            return _json(cluster_report(state, reader, holds=holds(), now_s=time.time()))

    async def inspect_node(request: Request) -> Response:
        name = request.path_params["node"]
        info = state.cluster.node(name)
        if info is None or not info.gpushare:
            return error_response(404, f"no GPU-share node {name!r}")
        with gc_paused():
            return _json(node_report(state, info, holds=holds(), now_s=time.time()))

    async def healthz(request: Request) -> Response:
        return _json({"status": "ok"})

    async def readyz(request: Request) -> Response:
        ready = state.cluster.synced and (readiness is None or readiness())
        return _json({"ready": ready}, 200 if ready else 503)

    async def version_(request: Request) -> Response:
        return _json({"version": version})

    async def metrics_(request: Request) -> Response:
        content, media_type = metrics.exposition()
        return Response(content, media_type=media_type)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        tasks = []
        if expire_interval_s:
            tasks.append(asyncio.create_task(_expire_forever(state, expire_interval_s, requeuer)))
        if preemptor is not None:
            tasks.append(asyncio.create_task(preemptor.run(), name="gpushare-preemption"))
        if requeuer is not None:
            tasks.append(asyncio.create_task(requeuer.run(), name="gpushare-requeue"))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if preemptor is not None:
                await preemptor.drain()

    routes = [
        Route(
            f"{base}/filter",
            guarded("filter", filter_, lambda t: ExtenderFilterResult(error=t)),
            methods=["POST"],
        ),
        Route(f"{base}/prioritize", guarded("prioritize", prioritize, None), methods=["POST"]),
        Route(
            f"{base}/bind",
            guarded("bind", bind, lambda t: ExtenderBindingResult(error=t)),
            methods=["POST"],
        ),
        Route(f"{base}/preempt", guarded("preempt", preempt, None), methods=["POST"]),
        *(
            [
                Route(
                    f"{base}/dra/prioritize",
                    guarded(DRA_VERB, dra_prioritize, None),
                    methods=["POST"],
                )
            ]
            if dra is not None
            else []
        ),
        Route(f"{base}/inspect", inspect_all, methods=["GET"]),
        Route(f"{base}/inspect/{{node}}", inspect_node, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/version", version_, methods=["GET"]),
        Route("/metrics", metrics_, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.scheduler = scheduler
    app.state.metrics = metrics
    return app
