"""Followers forward filter, prioritize and bind to the leader.

Every warm replica is ready and behind the Service; only the leader decides
(``gpushare.extender.leadership``). A follower that receives a verb sends the same body to
the leader's address, which the leader publishes on the Lease (annotation
:data:`LEADER_URL_ANNOTATION`, e.g. ``http://10.1.2.3:12345``, from ``$POD_IP``), and returns the
leader's answer unchanged. Why forwarding rather than not-ready followers: a
PodDisruptionBudget counts *ready* pods, so with never-ready followers the leader could never
be evicted (node drains would block), and a new leader would wait for readiness probes and
endpoint propagation before the first request reached it; with forwarding the Service keeps
every replica and a new leader answers as soon as it has rebuilt (docs/install.md, "High
availability").

When there is no leader to forward to (the Lease is free or expired, the leader is this
replica still rebuilding, the leader does not answer, or the request was already forwarded
once: header :data:`FORWARDED_HEADER`), the verb is refused: filter and bind answer ``Error``
(kube-scheduler retries the pod), prioritize a 503 (kube-scheduler ignores it); refusals carry
``Connection: close``. With TLS the follower speaks HTTPS to the leader and presents its own
certificate and key (the leader's certificate is not verified against the pod IP, which it
does not name; mutual TLS still authenticates the follower).
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

import httpx2
from starlette.requests import Request
from starlette.responses import Response

from gpushare.extender.app import Diverted, error_response
from gpushare.extender.leadership import Leadership

log = logging.getLogger(__name__)

LEADER_URL_ANNOTATION = "gpushare.io/leader-url"
"""Lease annotation: the leader's base URL, ``scheme://address:port``."""
FORWARDED_HEADER = "X-Gpushare-Forwarded-By"
"""Request header of a forwarded verb: the forwarding replica's identity (never re-forwarded)."""


def leader_url(scheme: str, pod_ip: str, port: int) -> str:
    """``scheme://pod_ip:port`` (IPv6 addresses in brackets)."""
    host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
    return f"{scheme}://{host}:{port}"


class LeaderForwarder:
    """The ``divert`` hook of ``create_app`` for one replica (module doc). ``timeout_s`` bounds
    one forwarded request (keep it below kube-scheduler's ``httpTimeout``)."""

    def __init__(
        self,
        leadership: Leadership,
        *,
        timeout_s: float = 25.0,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
    ) -> None:
        self.leadership = leadership
        verify: ssl.SSLContext | bool = True
        if tls_cert and tls_key:
            # The leader's certificate names the Service, not its pod IP: not verified (docs).
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            context.load_cert_chain(tls_cert, tls_key)
            verify = context
        self._client = httpx2.AsyncClient(
            timeout=httpx2.Timeout(timeout_s, connect=min(timeout_s, 2.0)),
            verify=verify,
            trust_env=False,
        )

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()

    def target(self) -> str | None:
        """The leader's base URL when another replica holds the Lease, else ``None``."""
        elector = self.leadership.elector
        record = elector.observed
        if record is None or not record.holder or record.holder == elector.config.identity:
            return None
        if self.leadership.elector.is_leader():
            return None
        return record.annotations.get(LEADER_URL_ANNOTATION) or None

    async def divert(self, request: Request, body: bytes) -> Diverted | None:
        """``None`` when this replica decides; else the leader's answer (``forwarded``) or a
        refusal (the app counts each under its own outcome)."""
        if self.leadership.deciding():
            return None
        refusal = self.leadership.refusal() or "not deciding"
        target = self.target()
        if request.headers.get(FORWARDED_HEADER):
            refusal += f"; forwarded by {request.headers[FORWARDED_HEADER]}, not forwarding again"
        elif target is not None:
            identity = self.leadership.elector.config.identity
            try:
                answer = await self._client.post(
                    target + request.url.path,
                    content=body,
                    headers={"Content-Type": "application/json", FORWARDED_HEADER: identity},
                )
            except httpx2.HTTPError as error:
                refusal += f"; the leader at {target} did not answer: {error!r}"
            else:
                response = Response(
                    answer.content,
                    status_code=answer.status_code,
                    media_type=answer.headers.get("content-type", "application/json"),
                )
                return Diverted(response, forwarded=True)
        return Diverted(_refused(request, refusal), forwarded=False)


def _refused(request: Request, text: str) -> Response:
    """Filter/bind: HTTP 200 with ``Error``; prioritize: 503. Both close the connection."""
    status = 503 if request.url.path.endswith("/prioritize") else 200
    return error_response(status, text, close=True)
