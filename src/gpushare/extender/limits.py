"""Bounds on what one client can make the extender hold: body size, read time, connections.

Without them a 100 MB body was read and decoded, slow connections stayed
open indefinitely and a half-sent request line was never closed. ``RequestLimits`` holds the
numbers (``gpushare extender`` flags; docs/extender.md, "Limits", says how they are sized):

==========================  ===============================================================
``max_body_bytes``          a body above it gets **413** (at once when ``Content-Length``
                            says so, else as soon as the bytes read pass it); 8 MiB
``head_timeout_s``          a connection that has not sent a whole request head (request
                            line and headers) this long after it opened, or after it
                            started a new one, is closed; 10 s
``body_timeout_s``          a body not complete this long after its head gets **408**; 10 s
``keep_alive_timeout_s``    an idle connection between requests is closed (uvicorn's
                            ``timeout_keep_alive``); 120 s, above the 90 s after which
                            kube-scheduler closes an idle connection itself (below)
``max_connections``         a connection opened while this many are open is closed at once,
                            and uvicorn answers 503 past it (``limit_concurrency``); 1,000
``max_head_bytes``          a request head above it gets 400 (h11's
                            ``max_incomplete_event_size``, uvicorn's
                            ``h11_max_incomplete_event_size``); 64 KiB
==========================  ===============================================================

Where uvicorn has a setting it is used (``uvicorn_settings``); the head timeout and the hard
connection cap are a small subclass of uvicorn's h11 protocol (``guarded_h11``, which also
tells the app of each connection's TLS client certificate: ``gpushare.extender.callers``), the
body bounds a reader of ASGI ``receive`` (``read_body``) that raises ``LimitError``, which the
app answers with its status and ``Connection: close``. 408 and 413 responses name the limit
and the flag that sets it.

Why the keep-alive outlasts the client's: kube-scheduler's extender client (client-go's
``SetTransportDefaults`` on Go's ``http.Transport``, ``IdleConnTimeout`` 90 s) reuses idle
connections. A server that closes one first races a request the client sends on it at that
moment; Go retries only requests it knows were not sent or are idempotent, so a filter, bind or
preempt POST caught in the race fails with "connection reset by peer" (seen under load, a
preemption then waited for kube-scheduler's next attempt). Closing idle connections after the
client does leaves the close to the client, which never races itself.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import h11
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.utils import get_remote_addr

from gpushare.extender.callers import with_tls_extension

log = logging.getLogger(__name__)

MIB = 1 << 20
DEFAULT_MAX_BODY_BYTES = 8 * MIB
"""A pod (etcd stores at most 1.5 MiB of it; as JSON up to ~3 MiB) plus 5,000 ``NodeNames``
of at most 253 bytes each (1.3 MB), with headroom: docs/extender.md, "Limits"."""


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """The bounds (module doc); ``None`` for a bound turns it off (tests only)."""

    max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES
    head_timeout_s: float | None = 10.0
    body_timeout_s: float | None = 10.0
    keep_alive_timeout_s: int = 120
    max_connections: int | None = 1000
    max_head_bytes: int = 64 * 1024

    def problems(self) -> list[str]:
        """Every bound that is out of range (empty: fine)."""
        found = []
        for name, value in (
            ("max_body_bytes", self.max_body_bytes),
            ("head_timeout_s", self.head_timeout_s),
            ("body_timeout_s", self.body_timeout_s),
            ("max_connections", self.max_connections),
        ):
            if value is not None and value <= 0:
                found.append(f"{name} must be > 0, got {value}")
        if self.keep_alive_timeout_s < 1:
            found.append(f"keep_alive_timeout_s must be >= 1, got {self.keep_alive_timeout_s}")
        if self.max_head_bytes < 1024:
            found.append(f"max_head_bytes must be >= 1024, got {self.max_head_bytes}")
        return found


class LimitError(Exception):
    """A request body broke a bound: answer ``status`` with ``text`` and close the connection."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


Message = dict[str, Any]


class BodyLimits:
    """Wraps an ASGI ``receive`` so that the body is bounded by ``limits`` (module doc).

    ``check_length(headers)`` raises ``LimitError`` (413) when ``Content-Length`` is over
    the limit; ``receive()`` raises it (413 or 408) when the bytes or the time run out.
    """

    def __init__(self, receive: Any, limits: RequestLimits, clock: Any = time.monotonic) -> None:
        self._receive = receive
        self._limits = limits
        self._clock = clock
        self._deadline = (
            math.inf if limits.body_timeout_s is None else clock() + limits.body_timeout_s
        )
        self._received = 0

    def too_large(self, size: str) -> LimitError:
        limit = self._limits.max_body_bytes
        return LimitError(
            413,
            f"request body {size} is larger than the extender accepts ({limit} bytes; "
            "gpushare extender --max-request-body-mib)",
        )

    def check_length(self, headers: list[tuple[bytes, bytes]]) -> None:
        """413 at once when the declared ``Content-Length`` is over the limit."""
        limit = self._limits.max_body_bytes
        for name, value in headers:
            if name == b"content-length" and limit is not None:
                try:
                    declared = int(value)
                except ValueError:
                    return  # h11 has refused such a request already
                if declared > limit:
                    raise self.too_large(f"of {declared} bytes (Content-Length)")

    async def receive(self) -> Message:
        """The next ASGI message, within the body's deadline and size."""
        remaining = self._deadline - self._clock()
        try:
            async with asyncio.timeout(None if math.isinf(remaining) else max(remaining, 0)):
                message: Message = await self._receive()
        except TimeoutError:
            raise LimitError(
                408,
                f"request body not complete within {self._limits.body_timeout_s:g}s "
                f"({self._received} bytes received; gpushare extender --request-body-timeout)",
            ) from None
        if message.get("type") == "http.request":
            self._received += len(message.get("body", b""))
            limit = self._limits.max_body_bytes
            if limit is not None and self._received > limit:
                raise self.too_large(f"of more than {limit} bytes")
            if not message.get("more_body", False):
                self._deadline = math.inf
        return message


async def read_body(
    receive: Any, headers: list[tuple[bytes, bytes]], limits: RequestLimits
) -> bytes:
    """The whole request body from ASGI ``receive``, bounded by ``limits``: ``LimitError``
    (413, 408) past them, ``ClientDisconnect`` when the client goes first."""
    guard = BodyLimits(receive, limits)
    guard.check_length(headers)
    chunks: list[bytes] = []
    while True:
        message = await guard.receive()
        kind = message.get("type")
        if kind == "http.request":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(chunks)
        elif kind == "http.disconnect":
            raise ClientDisconnect()


def guarded_h11(limits: RequestLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the head timeout and the hard connection cap of
    ``limits`` (module doc)."""

    class GuardedH11Protocol(H11Protocol):
        """``H11Protocol`` that closes connections slow to send a request head, and those
        opened past ``max_connections``."""

        _head_timer: asyncio.TimerHandle | None = None
        _refused = 0
        _refused_logged_at = -math.inf

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            cap = limits.max_connections
            if cap is not None and len(self.connections) >= cap:
                cls = type(self)
                cls._refused += 1
                now = time.monotonic()
                if now - cls._refused_logged_at >= 30.0:
                    peer = get_remote_addr(transport)
                    log.warning(
                        "connection from %s closed: %d connections open (--max-connections); "
                        "%d refused so far",
                        f"{peer[0]}:{peer[1]}" if peer else "?",
                        len(self.connections),
                        cls._refused,
                    )
                    cls._refused_logged_at = now
                transport.abort()
                return
            super().connection_made(transport)
            self.app = with_tls_extension(self.app, transport)
            self._arm_head_timer()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is h11.IDLE:
                self._arm_head_timer()  # a head begun (or awaited) on a kept-alive connection
            else:
                self._cancel_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_timer()
            if self.transport is None:
                return  # refused in connection_made: nothing was set up
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            if limits.head_timeout_s is None or self._head_timer is not None:
                return
            if self.timeout_keep_alive_task is not None:
                return  # idle between requests: uvicorn's keep-alive timeout closes it
            self._head_timer = self.loop.call_later(limits.head_timeout_s, self._head_expired)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_expired(self) -> None:
            self._head_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            peer = f"{self.client[0]}:{self.client[1]}" if self.client else "?"
            log.info(
                "connection from %s closed: no complete request head within %gs "
                "(--request-head-timeout)",
                peer,
                limits.head_timeout_s,
            )
            self.transport.close()

    return GuardedH11Protocol


def uvicorn_settings(limits: RequestLimits) -> dict[str, Any]:
    """The ``uvicorn.Config`` keyword arguments that apply ``limits``."""
    return {
        "http": guarded_h11(limits),
        "limit_concurrency": limits.max_connections,
        "timeout_keep_alive": limits.keep_alive_timeout_s,
        "h11_max_incomplete_event_size": limits.max_head_bytes,
    }
