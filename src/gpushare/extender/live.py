"""The extender on a real cluster: API-server caches, binder and events wired to the HTTP app.

:class:`LiveExtender` puts the parts together on one event loop:

* a :class:`~gpushare.kube.cache.ClusterCache` (list+watch of every Node and of the pods that
  ask ``aliyun.com/gpu-mem``) feeding an :class:`~gpushare.extender.state.ExtenderState`
  through a :class:`~gpushare.extender.feed.StateFeeder`, which marks the state synced once
  nodes and then pods are listed (``/readyz`` 503 → 200), and leaves a ``Warning`` Event on each
  bound pod the ledger skips (``ApiEventSink.skipped``);
* the starlette app of :func:`~gpushare.extender.app.create_app` with an
  :class:`~gpushare.extender.apiserver.ApiBinder` and an
  :class:`~gpushare.extender.apiserver.ApiEventSink` on the same lightkube client;
* a :class:`~gpushare.extender.requeue.Requeuer` that requeues in kube-scheduler the pods the
  filter refused everywhere once a node's GPU view or holds change;
* :class:`~gpushare.extender.stranded.StrandedPods`, which says on a pod that kube-scheduler
  will not retry it as nodes grow (docs/interfaces.md, Pitfalls: 31);
* :class:`~gpushare.extender.bypassed.BypassedPods`, which says on a GPU pod that another
  scheduler placed without a GPU (``GPUPodBypassedScheduler``) and counts such pods;
* a uvicorn ``Server`` that serves the app while the cache runs; the HTTP port opens at once
  (health checks answer during the initial list).

:meth:`LiveExtender.run` returns after :meth:`LiveExtender.request_stop` (or SIGINT/SIGTERM when
uvicorn runs in the main thread): the server drains, the cache stops. The client belongs to the
caller (``gpushare.kube.client.connect``); :func:`serve` runs the extender, then closes it.
RBAC needed by the client's identity: ``gpushare.extender.rbac.cluster_rules`` (nodes and pods
list/watch, ``pods`` get, ``pods/binding`` create, ``events`` create, ``pods/status`` patch; with
preemption, the default, ``pods/eviction`` create, ``poddisruptionbudgets`` list/watch and
``subjectaccessreviews`` create), ``configmaps`` get/list/watch/patch on the holds ConfigMaps
(``gpushare.kube.holds.rbac_rules``), and with leader election ``leases`` get/create/update.

**Preemption** (``options.preemption``, ``gpushare.extender.preemption``): the cache also
watches PodDisruptionBudgets and the holds ConfigMaps; the ``Preemptor`` answers ``preempt``,
acts only while this replica decides, evicts through the Eviction API and keeps its holds in
those ConfigMaps, so that a new leader finds them after its relist.

**Several replicas** (``options.leader_election``): once its caches have synced a replica
campaigns for the Lease (``gpushare.kube.lease``); it decides only while it leads and has
relisted nodes and pods after acquiring (``gpushare.extender.leadership``); its binds are
bounded by the Lease. Followers forward the verbs to the leader (``gpushare.extender.forward``).
On stop it releases the Lease after the server has drained. ``/readyz`` is 200 only while the
caches are synced and fresh (not ``stale``), on leader and followers alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import socket
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry, Gauge

from gpushare.core.skipped import SkippedPod
from gpushare.extender.apiserver import (
    EVENT_BURST,
    EVENT_QPS,
    ApiBinder,
    ApiEventSink,
    EventRate,
)
from gpushare.extender.app import DEFAULT_PORT, DEFAULT_PREFIX, create_app
from gpushare.extender.bypassed import BypassedPods
from gpushare.extender.callers import ClientAuth
from gpushare.extender.dra import DraScorer
from gpushare.extender.feed import StateFeeder
from gpushare.extender.forward import (
    DEFAULT_PEER_PORT,
    LEADER_URL_ANNOTATION,
    LeaderForwarder,
    PeerTls,
    leader_url,
)
from gpushare.extender.holds import BudgetBook, HoldBook
from gpushare.extender.holdwriters import HoldWriterCheck
from gpushare.extender.leadership import LeaderBinder, Leadership
from gpushare.extender.limits import RequestLimits, uvicorn_settings
from gpushare.extender.preemption import PreemptionOptions, Preemptor
from gpushare.extender.requeue import RequeueOptions, Requeuer
from gpushare.extender.scoring import DEFAULT_GPU_UNIT, DEFAULT_POLICY, extender_policy
from gpushare.extender.state import (
    DEFAULT_ASSUME_TTL_S,
    DEFAULT_HANDSHAKE_TIMEOUT_S,
    ExtenderState,
)
from gpushare.extender.stranded import StrandedPods
from gpushare.extender.tlsreload import TlsReloader
from gpushare.extender.workload import WORKLOAD_POLICIES, WorkloadTracker, live_policy
from gpushare.kube.binder import PodBinder
from gpushare.kube.cache import ClusterCache
from gpushare.kube.client import AsyncClient
from gpushare.kube.codec import Json, pod_uid
from gpushare.kube.codec.dra import DRIVER as DRA_DRIVER
from gpushare.kube.dracache import DraCache
from gpushare.kube.events import REPORTING_COMPONENT, EventRecorder
from gpushare.kube.evictions import Evictor
from gpushare.kube.holds import DEFAULT_HOLDS, HOLD_SHARDS, HoldsRef, HoldStore
from gpushare.kube.lease import LeaderElector, LeaseConfig
from gpushare.kube.peers import PeerPods
from gpushare.kube.podreader import PodReader
from gpushare.kube.requeue import PodRequeuer
from gpushare.kube.watch import Backoff
from gpushare.kube.writers import foreign_writers

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LiveOptions:
    """How the live extender serves and decides.

    ``host``/``port``/``prefix``: where it listens; ``policy`` and ``gpu_unit``: placement
    (``create_app``; ``gpu_unit`` ``None``: derived from the node inventory,
    ``gpushare.extender.workload``); ``assume_ttl_s``: life of an assumed allocation;
    ``handshake_timeout_s``: how long a bound pod not yet started pins equal pods
    (``ExtenderState``); ``bind_timeout_s``: bound on one bind (below kube-scheduler's
    ``httpTimeout``); ``event_timeout_s``: bound on one Event; ``event_qps``/``event_burst``:
    the rate of ``GPUAssigned`` Events (``gpushare.extender.apiserver.EventRate``);
    ``instance``: ``reportingInstance`` of the Events (default: ``$POD_NAME``, else the host
    name); ``access_log``: uvicorn's access log; ``backoff``/``watch_timeout_s``: the cache's
    retry pacing and watch length; ``graceful_shutdown_s``: how long open requests may finish on
    stop; ``tls_cert``/``tls_key``: serve HTTPS with this certificate and key (PEM);
    ``tls_client_ca``: the CA that signs the verbs' callers' client certificates (mutual TLS;
    ``gpushare.extender.callers``), ``tls_client_auth`` whether a verb without one is refused
    (``required``) or served and counted (``optional``);
    ``limits``: request body size, read timeouts and the connection cap
    (``gpushare.extender.limits``).
    ``leader_election``: the Lease to campaign for (``None``: a single replica that always
    decides); ``rebuild_timeout_s``: bound on the relist of a new leader; ``forward_timeout_s``:
    bound on a request a follower forwards to the leader; ``advertise_address``: the address
    followers reach this replica at (default ``$POD_IP``, else 127.0.0.1), published on the
    Lease. ``peer_port``/``peer_ca``/``peer_server_name``: with TLS and leader election, the
    peer listener followers forward to (mutual TLS against the release CA ``peer_ca``, the
    leader's certificate checked for ``peer_server_name``: ``gpushare.extender.forward``);
    ``peer_selector``: the labels of the replica pods a leader URL must point at (``None``: not
    checked). ``tls_reload_s``: how often the TLS files are looked at for a renewal
    (``gpushare.extender.tlsreload``). ``preemption``: GPU-aware preemption (``None``: off;
    ``preempt`` then keeps kube-scheduler's choice); ``holds_configmap``: where its holds are
    kept, ``(namespace, name)`` of the first of ``hold_shards`` ConfigMaps
    (``gpushare.kube.holds.HoldsRef``); ``hold_writers_interval_s``: how often the extender asks
    who else may write them (``gpushare.extender.holdwriters``). ``requeue``: how the pods the
    filter refused everywhere are requeued in kube-scheduler when a node changes
    (``gpushare.extender.requeue``).
    ``dra_scoring``: score nodes for DRA claim pods on ``P/dra/prioritize`` from the slices of
    ``dra_driver`` and every claim (``gpushare.extender.dra``; RBAC ``resourceslices`` and
    ``resourceclaims`` ``list``/``watch``).
    """

    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    prefix: str = DEFAULT_PREFIX
    policy: str = DEFAULT_POLICY
    gpu_unit: int | None = None
    assume_ttl_s: float = DEFAULT_ASSUME_TTL_S
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S
    bind_timeout_s: float = 20.0
    event_timeout_s: float = 5.0
    event_qps: float = EVENT_QPS
    event_burst: int = EVENT_BURST
    instance: str | None = None
    access_log: bool = False
    backoff: Backoff | None = None
    watch_timeout_s: int = 300
    graceful_shutdown_s: int = 5
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    tls_client_auth: ClientAuth = ClientAuth.REQUIRED
    limits: RequestLimits = field(default_factory=RequestLimits)
    leader_election: LeaseConfig | None = None
    rebuild_timeout_s: float = 30.0
    forward_timeout_s: float = 25.0
    advertise_address: str | None = None
    peer_port: int = DEFAULT_PEER_PORT
    peer_ca: Path | None = None
    peer_server_name: str | None = None
    peer_selector: dict[str, str] | None = None
    tls_reload_s: float = 30.0
    preemption: PreemptionOptions | None = field(default_factory=PreemptionOptions)
    holds_configmap: tuple[str, str] = DEFAULT_HOLDS
    hold_shards: int = HOLD_SHARDS
    hold_writers_interval_s: float = 600.0
    requeue: RequeueOptions = field(default_factory=RequeueOptions)
    dra_scoring: bool = False
    dra_driver: str = DRA_DRIVER


def tls_problems(cert: Path | None, key: Path | None, client_ca: Path | None) -> list[str]:
    """Every problem with a TLS configuration (empty: fine; nothing given: plain HTTP)."""
    problems: list[str] = []
    if cert is None and key is not None:
        problems.append("--tls-key needs --tls-cert")
    if cert is not None and key is None:
        problems.append("--tls-cert needs --tls-key")
    if client_ca is not None and (cert is None or key is None):
        problems.append("--tls-client-ca needs --tls-cert and --tls-key")
    for flag, path in (("--tls-cert", cert), ("--tls-key", key), ("--tls-client-ca", client_ca)):
        if path is None:
            continue
        if not path.exists():
            problems.append(f"{flag} {path}: no such file")
        elif not path.is_file():
            problems.append(f"{flag} {path}: not a file")
        else:
            try:
                with path.open("rb") as handle:
                    handle.read(1)
            except OSError as error:
                problems.append(f"{flag} {path}: cannot be read ({error.strerror or error})")
    if not problems and cert is not None and key is not None:
        try:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(cert, key)
            if client_ca is not None:
                context.load_verify_locations(cafile=client_ca)
        except (ssl.SSLError, OSError) as error:
            problems.append(f"TLS files rejected: {error}")
    return problems


def uvicorn_tls(cert: Path | None, key: Path | None, client_ca: Path | None) -> dict[str, Any]:
    """The ``uvicorn.Config`` keyword arguments for this TLS configuration (none: HTTP). With
    ``client_ca`` a client certificate is asked for and, when presented, verified against it
    in the handshake, but not required there: the verbs require it, the probes do not
    (``gpushare.extender.callers``; the app's ``client_auth``)."""
    if cert is None or key is None:
        return {}
    tls: dict[str, Any] = {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
    if client_ca is not None:
        tls["ssl_ca_certs"] = str(client_ca)
        tls["ssl_cert_reqs"] = ssl.CERT_OPTIONAL
    return tls


class LiveExtender:
    """The extender on the API server behind ``client`` (module doc). Build it on any thread;
    :meth:`run` it on the event loop that is to own the state."""

    def __init__(self, client: AsyncClient, options: LiveOptions | None = None) -> None:
        self.options = options = options or LiveOptions()
        self.state = ExtenderState(
            assume_ttl_s=options.assume_ttl_s, handshake_timeout_s=options.handshake_timeout_s
        )
        preempting = options.preemption is not None
        self.holds_ref = HoldsRef(*options.holds_configmap, options.hold_shards)
        self.cache = ClusterCache(
            client,
            backoff=options.backoff,
            watch_timeout_s=options.watch_timeout_s,
            budgets=preempting,
            holds=(self.holds_ref.namespace, self.holds_ref.names) if preempting else None,
        )
        self.registry = CollectorRegistry()
        Gauge(
            "gpushare_extender_leader",
            "1 while this replica decides (it leads, or runs without leader election), else 0.",
            registry=self.registry,
        ).set_function(lambda: 1.0 if self._deciding() else 0.0)
        self.requeuer = Requeuer(
            PodRequeuer(client).requeue,
            self.state.cluster.pod,
            deciding=self._deciding,
            waiting=lambda key: self.holds.of(key) is not None,
            options=options.requeue,
            registry=self.registry,
        )
        self.feeder = StateFeeder(
            self.state,
            on_skip=self._on_skip,
            on_node_change=self.requeuer.changed,
            on_release=self.requeuer.released,
        )
        self.feeder.attach(self.cache)
        self.holds = HoldBook(
            self.state.cluster.touch,
            freed=self.requeuer.changed,
            max_life_s=(options.preemption or PreemptionOptions()).hold_max_s,
        )
        self.budgets = BudgetBook()
        self.cache.on_holds(self.holds.on_change)
        self.cache.on_budget(self.budgets.on_change)
        self.events = ApiEventSink(
            EventRecorder(
                client,
                component=REPORTING_COMPONENT,
                instance=options.instance or os.environ.get("POD_NAME") or socket.gethostname(),
            ),
            timeout_s=options.event_timeout_s,
            rate=EventRate(options.event_qps, options.event_burst),
        )
        self.stranded = StrandedPods(self.events, deciding=self._deciding, registry=self.registry)
        self.cache.on_pod(self.stranded.on_pod)
        self.bypassed = BypassedPods(self.events, deciding=self._deciding, registry=self.registry)
        self.cache.on_pod(self.bypassed.on_pod)
        self.binder = ApiBinder(PodBinder(client), timeout_s=options.bind_timeout_s)
        self.elector: LeaderElector | None = None
        self.leadership: Leadership | None = None
        self.forwarder: LeaderForwarder | None = None
        self.peer_tls: PeerTls | None = None
        self.peer_server: uvicorn.Server | None = None
        if options.leader_election is not None:
            election = options.leader_election
            if options.tls_cert is not None and options.tls_key is not None:
                if options.peer_ca is None or not options.peer_server_name:
                    raise ValueError(
                        "leader election with TLS needs peer_ca and peer_server_name (the "
                        "release CA and the DNS name every replica's certificate carries)"
                    )
                self.peer_tls = PeerTls(
                    options.tls_cert, options.tls_key, options.peer_ca, options.peer_server_name
                )
            if LEADER_URL_ANNOTATION not in election.holder_annotations:
                address = options.advertise_address or os.environ.get("POD_IP") or "127.0.0.1"
                url = (
                    leader_url("https", address, options.peer_port)
                    if self.peer_tls is not None
                    else leader_url("http", address, options.port)
                )
                annotations = {**election.holder_annotations, LEADER_URL_ANNOTATION: url}
                election = dataclasses.replace(election, holder_annotations=annotations)
            self.elector = LeaderElector(client, election)
            self.leadership = Leadership(self.elector, self._rebuild)
            peers = (
                PeerPods(client, election.namespace, options.peer_selector)
                if options.peer_selector
                else None
            )
            self.forwarder = LeaderForwarder(
                self.leadership,
                timeout_s=options.forward_timeout_s,
                tls=self.peer_tls,
                peers=peers,
            )
        self.preemptor: Preemptor | None = None
        self.hold_writers: HoldWriterCheck | None = None
        if options.preemption is not None:
            ref = self.holds_ref
            self.hold_writers = HoldWriterCheck(
                functools.partial(foreign_writers, client, ref.namespace, ref.names),
                f"ConfigMaps {ref.namespace}/{ref.name} (and its {ref.shards - 1} shards)"
                if ref.shards > 1
                else f"ConfigMap {ref.namespace}/{ref.name}",
                self.registry,
                interval_s=options.hold_writers_interval_s,
            )
            self.preemptor = Preemptor(
                self.state,
                self.holds,
                self.budgets,
                evictor=Evictor(client),
                store=HoldStore(client, ref.namespace, ref.name, ref.shards),
                events=self.events,
                reader=PodReader(client),
                deciding=self._deciding,
                options=options.preemption,
                registry=self.registry,
            )
        self.workload: WorkloadTracker | None = None
        if options.policy in WORKLOAD_POLICIES:
            self.workload = WorkloadTracker(
                options.gpu_unit, gpu_capacities=self.state.cluster.gpu_capacities
            )
            self.cache.on_pod(self.workload.on_pod)
        self.dra_cache: DraCache | None = None
        dra: DraScorer | None = None
        if options.dra_scoring:
            self.dra_cache = DraCache(
                client, options.dra_driver, watch_timeout_s=options.watch_timeout_s
            )
            chosen = live_policy(options.policy, options.gpu_unit, self.workload)
            dra = DraScorer(
                self.dra_cache,
                extender_policy(chosen, gpu_unit=options.gpu_unit or DEFAULT_GPU_UNIT)
                if isinstance(chosen, str)
                else chosen,
            )
        self.app = create_app(
            self.state,
            prefix=options.prefix,
            policy=live_policy(options.policy, options.gpu_unit, self.workload),
            binder=self.binder
            if self.leadership is None
            else LeaderBinder(self.binder, self.leadership),
            events=self.events,
            gpu_unit=options.gpu_unit or DEFAULT_GPU_UNIT,
            limits=options.limits,
            divert=self.forwarder.divert if self.forwarder is not None else None,
            readiness=self._ready,
            registry=self.registry,
            preemptor=self.preemptor,
            requeuer=self.requeuer,
            dra=dra,
            client_auth=options.tls_client_auth if options.tls_client_ca is not None else None,
        )
        self.server = uvicorn.Server(
            uvicorn.Config(
                self.app,
                host=options.host,
                port=options.port,
                lifespan="on",
                ws="none",
                log_config=None,
                access_log=options.access_log,
                timeout_graceful_shutdown=options.graceful_shutdown_s,
                **uvicorn_settings(options.limits),
                **uvicorn_tls(options.tls_cert, options.tls_key, options.tls_client_ca),
            )
        )
        self.reloaders: list[TlsReloader] = []
        if options.tls_cert is not None and options.tls_key is not None:
            client_cas = [options.tls_client_ca] if options.tls_client_ca is not None else []
            self.reloaders.append(
                TlsReloader(
                    options.tls_cert, options.tls_key, client_cas,
                    contexts=lambda: _contexts(self.server), interval_s=options.tls_reload_s,
                )
            )  # fmt: skip
        if self.peer_tls is not None:
            self.peer_server = uvicorn.Server(
                uvicorn.Config(
                    self.app,
                    host=options.host,
                    port=options.peer_port,
                    lifespan="off",
                    ws="none",
                    log_config=None,
                    access_log=options.access_log,
                    timeout_graceful_shutdown=options.graceful_shutdown_s,
                    **uvicorn_settings(options.limits),
                    **self.peer_tls.server_settings(),
                )
            )
            forwarder = self.forwarder
            assert forwarder is not None
            peer_server = self.peer_server
            self.reloaders.append(
                TlsReloader(
                    self.peer_tls.cert, self.peer_tls.key, [self.peer_tls.ca],
                    contexts=lambda: _contexts(peer_server), on_change=forwarder.reload_tls,
                    interval_s=options.tls_reload_s,
                )
            )  # fmt: skip

    def _on_skip(self, skipped: SkippedPod, pod: Json | None) -> None:
        """A Warning Event on a pod the ledger skipped (called on the loop, by the feeder)."""
        self.events.skipped(skipped, pod_uid(pod) if pod is not None else "")

    @property
    def started(self) -> bool:
        """True once the HTTP server listens."""
        return bool(self.server.started)

    def request_stop(self) -> None:
        """Ask :meth:`run` to finish (from any thread): the server stops within ~0.1 s."""
        self.server.should_exit = True
        if self.peer_server is not None:
            self.peer_server.should_exit = True

    async def run(self, sockets: list[socket.socket] | None = None) -> None:
        """Serve until stopped; on already bound ``sockets`` when given (tests), else on
        ``options.host``/``port``. Raises the cache's error if it failed before syncing."""
        self.cache.start()
        if self.dra_cache is not None:
            self.dra_cache.start()
        sync = asyncio.create_task(self._sync(), name="gpushare-extender-sync")
        side = [asyncio.create_task(r.run(), name="gpushare-tls-reload") for r in self.reloaders]
        if self.hold_writers is not None:
            side.append(asyncio.create_task(self.hold_writers.run(), name="gpushare-holds-check"))
        if self.peer_server is not None:
            side.append(asyncio.create_task(self.peer_server.serve(), name="gpushare-peer"))
        try:
            await self.server.serve(sockets=sockets)
        finally:
            if self.peer_server is not None:
                self.peer_server.should_exit = True
            for task in side:
                if task.get_name() != "gpushare-peer":
                    task.cancel()
            await asyncio.gather(*side, return_exceptions=True)
            await _close_remaining(self.server, self.peer_server)
            sync.cancel()
            try:
                with contextlib.suppress(asyncio.CancelledError):
                    await sync  # re-raises the cache's failure, if that is why we stop
            finally:
                try:
                    if self.leadership is not None and self.elector is not None:
                        await self.leadership.stop()
                        await self.elector.release()  # the server has drained: hand over
                    if self.forwarder is not None:
                        await self.forwarder.aclose()
                finally:
                    await self.events.drain()  # each bounded by event_timeout_s
                    await self.cache.stop()
                    if self.dra_cache is not None:
                        await self.dra_cache.stop()

    def _deciding(self) -> bool:
        """Whether this replica may act (evict, write holds): always for a single replica,
        while it leads and has rebuilt with leader election."""
        return self.leadership is None or self.leadership.deciding()

    def _ready(self) -> bool:
        """``/readyz`` beyond ``state.cluster.synced``: fresh caches (followers too: they
        forward)."""
        return not self.cache.stale

    async def _rebuild(self) -> None:
        """A new leader's ledger: relist nodes and pods (the list starts after the Lease was
        taken), bounded by ``rebuild_timeout_s``."""
        async with asyncio.timeout(self.options.rebuild_timeout_s):
            await self.cache.relist()

    async def _sync(self) -> None:
        try:
            await self.feeder.mark_when_synced(self.cache)
        except Exception:
            log.exception("the cluster cache failed before it synced; stopping")
            self.request_stop()
            raise
        if self.elector is not None:
            await self.elector.run()  # campaigns until stopped (cancelled with this task)


def _contexts(server: uvicorn.Server) -> list[ssl.SSLContext]:
    """The SSL context a started uvicorn server serves with (none before it started)."""
    context = getattr(server.config, "ssl", None)
    return [context] if isinstance(context, ssl.SSLContext) else []


async def _close_remaining(*servers: uvicorn.Server | None) -> None:
    """Close the connections ``servers`` still hold once they have stopped: uvicorn cancels
    the requests still running after ``graceful_shutdown_s`` but leaves their connections open
    (the client gets a reset instead of a hang; a loop that goes on, as in tests, keeps no
    socket behind)."""
    closed = 0
    for server in servers:
        if server is None:
            continue
        for connection in list(server.server_state.connections):
            transport = getattr(connection, "transport", None)
            if isinstance(transport, asyncio.Transport) and not transport.is_closing():
                transport.abort()
                closed += 1
    if closed:
        log.info("closed %d connection(s) still open after the graceful shutdown", closed)
        await asyncio.sleep(0)  # the transports' close callbacks run now


async def serve(client: AsyncClient, options: LiveOptions) -> None:
    """Run a :class:`LiveExtender` on ``client`` until it is stopped, then close ``client``."""
    try:
        await LiveExtender(client, options).run()
    finally:
        await client.close()
