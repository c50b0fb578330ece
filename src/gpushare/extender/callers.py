"""Who may call the extender's verbs: kube-scheduler, authenticated by its client certificate.

The verbs (``filter``, ``prioritize``, ``bind``, ``preempt``, ``dra/prioritize``) place pods;
``filter`` and ``preempt`` may lead to evictions. With ``--tls-client-ca`` the extender serves
them only to a caller that presented, in its TLS handshake, a certificate that CA signed
(kube-scheduler's ``tlsConfig.certFile``/``keyFile``; the chart generates and wires both sides:
docs/install.md, "TLS"). The rest of the port (``/healthz``, ``/readyz``, ``/metrics``,
``/inspect``) asks for no certificate, so that kubelet's probes and Prometheus reach it: the TLS
listener asks for a client certificate without requiring one (``ssl.CERT_OPTIONAL``: a
certificate presented is verified in the handshake, which fails for any other CA), and the app
checks per request whether one was verified. A NetworkPolicy is a second wall, not the first:
it holds only where the CNI enforces it.

uvicorn does not tell an ASGI app about the TLS connection. :func:`with_tls_extension` adds the
ASGI TLS extension (``scope["extensions"]["tls"]``: ``client_cert_chain``, ``client_cert_name``,
``client_cert_error``, ``server_cert``, ``tls_version``, ``cipher_suite``; "ASGI TLS Extension",
asgiref's specs) for every request of one connection; the extender's h11 protocol
(``gpushare.extender.limits.guarded_h11``) installs it as each connection is made. Without it
no request carries a certificate, so a required check refuses every verb (it fails closed).

:class:`CallerCheck` answers a verb from a caller without a certificate: under
:attr:`ClientAuth.REQUIRED` with **401** and ``{"Error": ...}`` naming what is missing (the
request counts in ``gpushare_extender_requests_total`` with outcome ``unauthenticated``); under
:attr:`ClientAuth.OPTIONAL` (moving an existing scheduler over to client certificates) the verb
is served. Either way it is counted in
``gpushare_extender_unauthenticated_requests_total{verb, action}`` (``refused``, ``served``)
and logged as a warning at most once a minute, with the peer and how many since.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from starlette.requests import Request

__all__ = [
    "UNAUTHENTICATED",
    "CallerCheck",
    "ClientAuth",
    "caller_certificate",
    "with_tls_extension",
]

log = logging.getLogger(__name__)

UNAUTHENTICATED = "unauthenticated"
"""The ``outcome`` of a verb refused for want of a client certificate (401)."""
LOG_INTERVAL_S = 60.0
"""Unauthenticated callers are logged at most this often (seconds)."""

Asgi = Callable[[Any, Any, Any], Any]


class ClientAuth(enum.StrEnum):
    """What the verbs ask of a caller (module doc)."""

    REQUIRED = "required"
    """A verified client certificate, or 401."""
    OPTIONAL = "optional"
    """Served either way; callers without one are counted and logged."""


def _rfc4514(subject: tuple[tuple[tuple[str, str], ...], ...]) -> str:
    """``getpeercert()``'s ``subject`` as an RFC 4514 string (last RDN first)."""
    names = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU",
             "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST"}  # fmt: skip
    parts = []
    for rdn in reversed(subject):
        parts.append("+".join(f"{names.get(k, k)}={v}" for k, v in rdn))
    return ",".join(parts)


def _tls_of(transport: asyncio.BaseTransport) -> dict[str, Any] | None:
    """The TLS extension's fields for ``transport`` (``None``: not a TLS connection)."""
    ssl_object = transport.get_extra_info("ssl_object")
    if not isinstance(ssl_object, ssl.SSLObject | ssl.SSLSocket):
        return None
    chain: list[str] = []
    name: str | None = None
    der = ssl_object.getpeercert(binary_form=True)
    if der:  # only a certificate the handshake verified gets here (CERT_OPTIONAL/REQUIRED)
        chain.append(ssl.DER_cert_to_PEM_cert(der))
        parsed = ssl_object.getpeercert()
        subject = parsed.get("subject") if parsed else None
        name = _rfc4514(subject) if subject else ""  # type: ignore[arg-type]
    return {
        "server_cert": None,
        "client_cert_chain": chain,
        "client_cert_name": name,
        "client_cert_error": None,
        "tls_version": None,
        "cipher_suite": None,
    }


def with_tls_extension(app: Asgi, transport: asyncio.BaseTransport) -> Asgi:
    """``app`` with the TLS extension of ``transport``'s connection added to each request's
    scope (module doc); ``app`` itself on a connection without TLS."""
    tls = _tls_of(transport)
    if tls is None:
        return app

    async def app_with_tls(scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            scope = {**scope, "extensions": {**(scope.get("extensions") or {}), "tls": tls}}
        await app(scope, receive, send)

    return app_with_tls


def caller_certificate(scope: Mapping[str, Any]) -> str | None:
    """The subject (RFC 4514) of the client certificate verified on the request's connection,
    or ``None`` when it presented none (or the server did not say: see the module doc)."""
    tls = (scope.get("extensions") or {}).get("tls")
    if not isinstance(tls, Mapping) or not tls.get("client_cert_chain"):
        return None
    name = tls.get("client_cert_name")
    return name if isinstance(name, str) else ""


class CallerCheck:
    """Checks the caller of each verb under ``mode`` (module doc), counting on ``registry``;
    ``verbs``: the verbs to make the series for up front; ``clock``: monotonic seconds, for
    the log's pace."""

    ACTIONS = ("refused", "served")

    def __init__(
        self,
        mode: ClientAuth,
        registry: CollectorRegistry,
        verbs: tuple[str, ...] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.mode = mode
        self._clock = clock
        self._logged_s = -float("inf")
        self._quiet = 0
        self.unauthenticated = Counter(
            "gpushare_extender_unauthenticated_requests",
            "Verb requests whose caller presented no client certificate, by verb and what was "
            "done (refused with 401, or served under --tls-client-auth=optional).",
            ["verb", "action"],
            registry=registry,
        )
        for verb in verbs:
            for action in self.ACTIONS:
                self.unauthenticated.labels(verb, action)

    def refuses(self, verb: str, request: Request) -> str | None:
        """``None`` when ``request`` may call ``verb``; else the text of its 401. Without a
        certificate under ``OPTIONAL`` the verb is allowed (``None``) and the caller logged."""
        if caller_certificate(request.scope) is not None:
            return None
        peer = f"{request.client.host}:{request.client.port}" if request.client else "?"
        served = self.mode is ClientAuth.OPTIONAL
        self.unauthenticated.labels(verb, self.ACTIONS[served]).inc()
        self._log(verb, peer, served)
        if served:
            return None
        return (
            f"gpushare: {verb} needs a client certificate signed by the extender's client CA "
            "(--tls-client-ca); the caller presented none (kube-scheduler: tlsConfig.certFile "
            'and keyFile of its extender entry; docs/install.md, "TLS")'
        )

    def _log(self, verb: str, peer: str, served: bool) -> None:
        now = self._clock()
        if now - self._logged_s < LOG_INTERVAL_S:
            self._quiet += 1
            return
        quiet, self._quiet, self._logged_s = self._quiet, 0, now
        more = f"; {quiet} more without one in the last minute" if quiet else ""
        what = "served (--tls-client-auth=optional)" if served else "refused (401)"
        log.warning("%s from %s without a client certificate: %s%s", verb, peer, what, more)
