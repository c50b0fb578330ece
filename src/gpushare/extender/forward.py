"""Followers forward filter, prioritize, bind and preempt to the leader — to a leader they have
verified, over a hop that authenticates both ends.

Every warm replica is ready and behind the Service; only the leader decides
(``gpushare.extender.leadership``). A follower that receives a verb sends the same body to the
leader and returns its answer. Why forwarding rather than not-ready followers: a
PodDisruptionBudget counts *ready* pods, so with never-ready followers the leader could never
be evicted (node drains would block), and a new leader would wait for readiness probes and
endpoint propagation before the first request reached it; with forwarding the Service keeps
every replica and a new leader answers as soon as it has rebuilt (docs/install.md, "High
availability").

**Where the leader is.** The leader publishes its address on the Lease (annotation
:data:`LEADER_URL_ANNOTATION`). The Lease is not trusted: whoever may ``update`` leases in the
namespace can rewrite it. So a follower forwards only when

1. the URL is exactly ``https://<IP address>:<port>`` (no name, user, path, query or fragment;
   ``http://`` only when this replica serves plain HTTP itself, which docs/install.md calls
   unsafe): ``parse_leader_url``;
2. the address is a pod IP of a replica (``PeerAddresses``: the pods of the release namespace
   that carry the extender's labels, ``--peer-selector``), when the replica knows its peers;
3. with TLS (``PeerTls``, the chart's default), the leader's certificate verifies against the
   release CA (``--peer-ca``) for the Service's DNS name every replica's certificate carries
   (``--peer-server-name``; the address is only where to connect), and the follower presents
   its own certificate: the leader's peer listener (``--peer-port``) requires one the release
   CA signed (mutual TLS).

Anything else is refused, saying why (the Lease, the URL as it was written, bounded, and what is
wrong with it) and logged once per distinct reason: kube-scheduler then retries the pod. No pod
body ever leaves for an address that failed a check.

When there is no leader to forward to (the Lease is free or expired, the leader is this
replica still rebuilding, the leader does not answer, or the request was already forwarded
once: header :data:`FORWARDED_HEADER`), the verb is refused too: filter, bind and preempt
answer ``Error`` (kube-scheduler retries the pod), prioritize a 503 (kube-scheduler ignores
it); refusals carry ``Connection: close``.
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx2
from starlette.requests import Request
from starlette.responses import Response

from gpushare.extender.app import Diverted, error_response
from gpushare.extender.leadership import Leadership
from gpushare.kube.transport import closing_transport

log = logging.getLogger(__name__)

LEADER_URL_ANNOTATION = "gpushare.io/leader-url"
"""Lease annotation: the leader's base URL, ``scheme://address:port``."""
FORWARDED_HEADER = "X-Gpushare-Forwarded-By"
"""Request header of a forwarded verb: the forwarding replica's identity (never re-forwarded)."""
DEFAULT_PEER_PORT = 12346
"""The port of the peer listener (the forward hop's mutual TLS; ``--peer-port``)."""
_URL_SHOWN = 80


def leader_url(scheme: str, pod_ip: str, port: int) -> str:
    """``scheme://pod_ip:port`` (IPv6 addresses in brackets)."""
    host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
    return f"{scheme}://{host}:{port}"


def parse_leader_url(text: str, *, https: bool) -> tuple[str, int] | str:
    """The (IP address, port) of a Lease's leader URL, or why it is refused (module doc, 1):
    ``https://<IP>:<port>`` exactly (``http`` instead when ``https`` is false)."""
    scheme = "https" if https else "http"
    wanted = f"not {scheme}://<pod IP>:<port> with nothing more"
    if len(text) > 200:
        return f"{len(text)} characters: {wanted}"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        return f"cannot be read as a URL: {wanted}"
    if parts.scheme != scheme:
        return f"scheme {parts.scheme or 'none'}: {wanted}"
    if parts.username is not None or parts.password is not None:
        return f"carries a user: {wanted}"
    if parts.path or parts.query or parts.fragment or text.endswith(("?", "#")):
        return f"carries a path, query or fragment: {wanted}"
    host = parts.hostname or ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return f"host {host or 'none'} is not an IP address: {wanted}"
    if port is None or not 0 < port < 65536:
        return f"no port: {wanted}"
    return str(address), port


@dataclass(frozen=True, slots=True)
class PeerTls:
    """TLS between replicas: this replica's certificate and key (the serving pair, which the
    chart's CA signs for both server and client use), the release CA that signed every
    replica's, and the DNS name every replica's certificate carries (the Service's)."""

    cert: Path
    key: Path
    ca: Path
    server_name: str

    def client_context(self) -> ssl.SSLContext:
        """The follower's side: verify the leader against ``ca`` and present our pair."""
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(self.cert, self.key)
        return context

    def server_settings(self) -> dict[str, Any]:
        """The leader's peer listener (``uvicorn.Config`` keywords): our pair, and a client
        certificate that ``ca`` signed required."""
        return {
            "ssl_certfile": str(self.cert),
            "ssl_keyfile": str(self.key),
            "ssl_ca_certs": str(self.ca),
            "ssl_cert_reqs": ssl.CERT_REQUIRED,
        }


class PeerAddresses(Protocol):
    """Whether an address is a replica's pod IP (``gpushare.kube.peers.PeerPods``)."""

    async def known(self, address: str) -> bool:
        """True when ``address`` is the pod IP of a replica; raises on API trouble."""
        ...

    def describe(self) -> str:
        """The pods counted as replicas, for a refusal (``namespace ns, labels a=b``)."""
        ...


class LeaderForwarder:
    """The ``divert`` hook of ``create_app`` for one replica (module doc). ``timeout_s`` bounds
    one forwarded request (keep it below kube-scheduler's ``httpTimeout``); ``tls``: verify the
    leader and authenticate to it (``None``: plain HTTP, the unsafe mode); ``peers``: the
    replicas' pod IPs a leader URL must name (``None``: not checked, only where replicas are
    not pods, e.g. tests)."""

    def __init__(
        self,
        leadership: Leadership,
        *,
        timeout_s: float = 25.0,
        tls: PeerTls | None = None,
        peers: PeerAddresses | None = None,
    ) -> None:
        self.leadership = leadership
        self.tls = tls
        self.peers = peers
        self._timeout_s = timeout_s
        self._refusals: set[str] = set()
        self._client = self._make_client()

    def _make_client(self) -> httpx2.AsyncClient:
        verify = self.tls.client_context() if self.tls is not None else True
        return httpx2.AsyncClient(
            timeout=httpx2.Timeout(self._timeout_s, connect=min(self._timeout_s, 2.0)),
            transport=closing_transport(verify),
            trust_env=False,
        )

    async def reload_tls(self) -> None:
        """Read this replica's pair and the CA again (they were renewed): new connections
        use them."""
        old, self._client = self._client, self._make_client()
        await old.aclose()

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()

    def target(self) -> str | None:
        """The leader's base URL as the Lease gives it when another replica holds the Lease,
        else ``None`` (not checked yet: ``divert`` does)."""
        elector = self.leadership.elector
        record = elector.observed
        if record is None or not record.holder or record.holder == elector.config.identity:
            return None
        if self.leadership.elector.is_leader():
            return None
        return record.annotations.get(LEADER_URL_ANNOTATION) or None

    async def _checked(self, target: str) -> tuple[str, int] | str:
        """(address, port) of a leader URL that passes the checks, or why not (module doc)."""
        parsed = parse_leader_url(target, https=self.tls is not None)
        if isinstance(parsed, str):
            return parsed
        if self.peers is not None:
            try:
                known = await self.peers.known(parsed[0])
            except Exception as error:
                return f"the replicas' pod IPs cannot be read ({error}); not forwarding"
            if not known:
                return f"{parsed[0]} is not the IP of a replica pod ({self.peers.describe()})"
        return parsed

    async def divert(self, request: Request, body: bytes) -> Diverted | None:
        """``None`` when this replica decides; else the leader's answer (``forwarded``) or a
        refusal (the app counts each under its own outcome)."""
        if self.leadership.deciding():
            return None
        refusal = self.leadership.refusal() or "not deciding"
        target = self.target()
        if request.headers.get(FORWARDED_HEADER):
            shown = request.headers[FORWARDED_HEADER][:_URL_SHOWN]
            refusal += f"; forwarded by {shown}, not forwarding again"
        elif target is not None:
            checked = await self._checked(target)
            if isinstance(checked, str):
                refusal += "; " + self._refused_lease(target, checked)
            else:
                answer = await self._forward(request, body, checked)
                if isinstance(answer, Response):
                    return Diverted(answer, forwarded=True)
                refusal += "; " + self._refused_lease(target, answer)
        return Diverted(_refused(request, refusal), forwarded=False)

    def _refused_lease(self, target: str, why: str) -> str:
        config = self.leadership.elector.config
        shown = target if len(target) <= _URL_SHOWN else target[: _URL_SHOWN - 3] + "..."
        text = (
            f"the Lease {config.namespace}/{config.name} names leader URL {shown!r} "
            f"(annotation {LEADER_URL_ANNOTATION}): {why}; refused"
        )
        if text not in self._refusals:
            if len(self._refusals) < 100:
                self._refusals.add(text)
            log.warning("not forwarding to the leader: %s", text)
        return text

    async def _forward(
        self, request: Request, body: bytes, where: tuple[str, int]
    ) -> Response | str:
        """The leader's answer, or why there is none."""
        address, port = where
        base = leader_url("https" if self.tls is not None else "http", address, port)
        extensions: Mapping[str, Any] = (
            {"sni_hostname": self.tls.server_name} if self.tls is not None else {}
        )
        identity = self.leadership.elector.config.identity
        try:
            answer = await self._client.post(
                base + request.url.path,
                content=body,
                headers={"Content-Type": "application/json", FORWARDED_HEADER: identity},
                extensions=dict(extensions),
            )
        except httpx2.ConnectError as error:
            return f"its server failed TLS verification or did not answer ({error})"
        except httpx2.HTTPError as error:
            return f"its server did not answer ({error!r})"
        return Response(
            answer.content,
            status_code=answer.status_code,
            media_type=answer.headers.get("content-type", "application/json"),
        )


def _refused(request: Request, text: str) -> Response:
    """Filter/bind/preempt: HTTP 200 with ``Error``; prioritize: 503. Both close the
    connection."""
    status = 503 if request.url.path.endswith("/prioritize") else 200
    return error_response(status, text, close=True)
