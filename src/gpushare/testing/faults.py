"""Network faults between a lightkube ``AsyncClient`` and the real test API server.

:class:`FaultyTransport` wraps the real httpx2 transport of an ``AsyncClient`` and passes every
request through to kube-apiserver, except when a test asks for a fault:

* :meth:`~FaultyTransport.go_down` cuts the connection: every open watch stream fails at once
  with ``httpx2.ReadError`` (as when the server or the network drops it), and every new
  request fails with ``httpx2.ConnectError`` until :meth:`~FaultyTransport.come_back`.
  :attr:`~FaultyTransport.refused` is set whenever a request is refused, so a test can wait
  until the client has noticed and retried. A request whose caller is cancelled goes on to
  its response, which is then closed (:meth:`~FaultyTransport.handle_async_request`).
* :meth:`~FaultyTransport.expire_next_watch` answers the next watch request on a resource with
  410 Gone, in either of the two forms kube-apiserver uses: an ``ERROR`` watch event carrying
  an ``Expired`` ``Status`` in a 200 stream (``form="event"``), or an HTTP 410 reply
  (``form="status"``). A young test cluster serves any old resourceVersion from its watch
  cache, so a real 410 cannot be provoked quickly; this one has the server's exact shape.
* :meth:`~FaultyTransport.hold_watches` holds back what the watches of a resource receive
  until :meth:`~FaultyTransport.release_watches`, then delivers it in order: a watch that lags
  the API server (and the other clients' informers), as a busy client's does.

Test-only (asyncio; one event loop).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from typing import Literal, Self

import httpx2

from gpushare.kube.transport import closing_transport
from gpushare.testing.controlplane import ControlPlane

__all__ = ["FaultyTransport"]

ExpiryForm = Literal["event", "status"]


def _expired_status(resource_version: str) -> dict[str, object]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"too old resource version: {resource_version} (injected by the test)",
        "reason": "Expired",
        "code": 410,
    }


def _retrieve(task: asyncio.Future[bytes | None]) -> None:
    """Mark a read's outcome as seen: a read abandoned when the stream broke may still fail."""
    if not task.cancelled():
        task.exception()


class _BreakableStream(httpx2.AsyncByteStream):
    """A response body that fails with ``ReadError`` as soon as ``broken`` is set, and holds
    back each chunk while ``flowing`` is clear.

    The read in flight when it breaks is not cancelled (a cancelled read could leave its
    socket half closed, found unclosed by a later test's garbage collection): it is left to
    end when the consumer closes the response (:meth:`aclose` closes the connection under it,
    then waits for it), as a cut connection ends for a real client."""

    def __init__(
        self, inner: httpx2.AsyncByteStream, broken: asyncio.Event, flowing: asyncio.Event
    ) -> None:
        self._inner = inner
        self._broken = broken
        self._flowing = flowing
        self._abandoned: asyncio.Future[bytes | None] | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = aiter(self._inner)

        async def next_chunk() -> bytes | None:
            try:
                return await anext(chunks)
            except StopAsyncIteration:
                return None

        broken = asyncio.ensure_future(self._broken.wait())
        chunk: asyncio.Future[bytes | None] | None = None
        try:
            while True:
                chunk = asyncio.ensure_future(next_chunk())
                chunk.add_done_callback(_retrieve)
                await asyncio.wait({chunk, broken}, return_when=asyncio.FIRST_COMPLETED)
                if not chunk.done():
                    self._abandoned, chunk = chunk, None
                    raise httpx2.ReadError("connection to the API server cut by the test")
                data = chunk.result()
                if data is None:
                    return
                await self._flowing.wait()  # held back (hold_watches) until released
                yield data
        finally:
            broken.cancel()
            if chunk is not None and not chunk.done():  # the consumer itself was cancelled
                chunk.cancel()
                await asyncio.wait({chunk})

    async def aclose(self) -> None:
        await self._inner.aclose()
        if self._abandoned is not None:  # its connection is closed now: the read ends
            await asyncio.wait({self._abandoned}, timeout=10)


class FaultyTransport(httpx2.AsyncBaseTransport):
    """A pass-through transport with injectable faults (see the module docstring)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner
        self._down = False
        self._broken = asyncio.Event()
        self._expire: dict[str, ExpiryForm] = {}
        self._flowing: dict[str, asyncio.Event] = {}
        self.refused = asyncio.Event()
        """Set each time a request is refused while down; clear it to wait for the next."""
        self.expired_watches = 0
        """How many watch requests were answered with an injected 410."""
        self._abandoned: set[asyncio.Future[httpx2.Response]] = set()

    @classmethod
    def for_control_plane(cls, plane: ControlPlane, *, client_certificate: bool = True) -> Self:
        """Over a real transport trusting ``plane``'s CA, presenting the admin certificate
        unless ``client_certificate`` is false (for token-authenticated clients)."""
        if client_certificate:
            context = plane.credentials.admin_ssl_context()
        else:
            context = ssl.create_default_context(cafile=str(plane.credentials.ca_cert))
        return cls(closing_transport(context))

    # ---- faults ------------------------------------------------------------------------

    def go_down(self) -> None:
        """Break every open stream now and refuse new requests until :meth:`come_back`."""
        self._down = True
        self._broken.set()

    def come_back(self) -> None:
        """Let requests through again."""
        self._down = False
        self._broken = asyncio.Event()

    def expire_next_watch(self, resource: str, form: ExpiryForm = "event") -> None:
        """Answer the next watch of ``resource`` (plural, e.g. ``"pods"``) with 410 Gone."""
        self._expire[resource] = form

    def hold_watches(self, resource: str) -> None:
        """Hold back what every watch of ``resource`` (plural) receives, open or opened later,
        until :meth:`release_watches`."""
        self._flowing_of(resource).clear()

    def release_watches(self, resource: str) -> None:
        """Deliver what the watches of ``resource`` received meanwhile, and go on."""
        self._flowing_of(resource).set()

    def _flowing_of(self, resource: str) -> asyncio.Event:
        flowing = self._flowing.get(resource)
        if flowing is None:
            flowing = self._flowing[resource] = asyncio.Event()
            flowing.set()
        return flowing

    # ---- transport ---------------------------------------------------------------------

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """The request through the faults, to kube-apiserver. A caller cancelled before the
        response arrives (a cache stopped while it reconnects) does not cancel the request
        under it: cancelled in its TLS handshake, httpcore2 would leave the new connection
        open (its ``start_tls`` closes the stream on ``Exception``, not on cancellation), a
        ``ResourceWarning`` at the next garbage collection. The request finishes on its own
        and its response is closed (:meth:`aclose` waits for them)."""
        answer = asyncio.ensure_future(self._handle(request))
        try:
            return await asyncio.shield(answer)
        except asyncio.CancelledError:
            self._abandoned.add(answer)
            raise

    async def _handle(self, request: httpx2.Request) -> httpx2.Response:
        if self._down:
            self.refused.set()
            raise httpx2.ConnectError("API server unreachable (cut by the test)", request=request)
        watch = request.url.params.get("watch") == "true"
        resource = request.url.path.rstrip("/").rpartition("/")[2]
        if watch and resource in self._expire:
            form = self._expire.pop(resource)
            self.expired_watches += 1
            status = _expired_status(request.url.params.get("resourceVersion", ""))
            if form == "status":
                return httpx2.Response(410, json=status, request=request)
            line = json.dumps({"type": "ERROR", "object": status}).encode() + b"\n"
            headers = {"Content-Type": "application/json"}
            return httpx2.Response(200, headers=headers, content=line, request=request)
        response = await self._inner.handle_async_request(request)
        if not watch:
            return response
        stream = response.stream
        if not isinstance(stream, httpx2.AsyncByteStream):
            raise TypeError(f"unexpected response stream {stream!r}")
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_BreakableStream(stream, self._broken, self._flowing_of(resource)),
            extensions=response.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        abandoned, self._abandoned = self._abandoned, set()
        if abandoned:
            await asyncio.wait(abandoned, timeout=30)
        for answer in abandoned:
            if answer.done() and not answer.cancelled() and answer.exception() is None:
                await answer.result().aclose()
        await self._inner.aclose()
