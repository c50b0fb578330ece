"""A loopback stand-in for a Kubernetes Service in front of several extender replicas.

kube-scheduler's extender configuration has one ``urlPrefix``; in a cluster it names the
extender's Service, and kube-proxy sends each new TCP connection to one of the ready endpoints.
:class:`ServiceProxy` does the same on 127.0.0.1 for replicas running as processes of the test
(no kube-proxy or endpoints controller runs here): it probes every backend's ``/readyz``
every ``probe_period_s``, each probe given ``probe_timeout_s``, and takes a backend out after
``failure_threshold`` failed probes in a row (the chart's readiness probe: 1 s, 2 s, 3), back in
after one success; each accepted connection is piped,
byte for byte, to the next ready backend in turn; a backend that refuses the connection is
skipped for that connection. Connections already open stay with their backend until either side
closes them, as with kube-proxy.

It runs its own event loop in a daemon thread; :meth:`ServiceProxy.stop` closes everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from collections.abc import Sequence

from gpushare.testing.controlplane import ControlPlaneError

__all__ = ["ServiceProxy"]

log = logging.getLogger(__name__)


class ServiceProxy:
    """Forward ``127.0.0.1:<port>`` to the ready ones of ``backends`` (``(host, port)``)."""

    def __init__(
        self,
        backends: Sequence[tuple[str, int]],
        *,
        probe_period_s: float = 1.0,
        probe_timeout_s: float = 2.0,
        failure_threshold: int = 3,
        probe_path: str = "/readyz",
    ) -> None:
        self.backends = list(backends)
        self.probe_period_s = probe_period_s
        self.probe_timeout_s = probe_timeout_s
        self.failure_threshold = failure_threshold
        self.probe_path = probe_path
        self._failures = dict.fromkeys(self.backends, failure_threshold)  # out until a success
        self.port = 0
        self.ready: list[tuple[str, int]] = []
        self.connections = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._turn = itertools.count()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServiceProxy:
        """Start the thread; return once the port listens."""
        self._thread = threading.Thread(target=self._main, name="service-proxy", daemon=True)
        self._thread.start()
        if not self._started.wait(10) or self._error is not None:
            raise ControlPlaneError(f"the service proxy did not start: {self._error!r}")
        return self

    def stop(self) -> None:
        """Close the listener and every connection; join the thread."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> ServiceProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- the loop --------------------------------------------------------------------

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as error:
            self._error = error
            self._started.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        prober = asyncio.create_task(self._probe_forever())
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            prober.cancel()
            server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2)

    async def _probe_forever(self) -> None:
        while True:
            results = await asyncio.gather(*(self._probe(b) for b in self.backends))
            for backend, ok in zip(self.backends, results, strict=True):
                before = self._failures[backend] < self.failure_threshold
                self._failures[backend] = 0 if ok else self._failures[backend] + 1
                after = self._failures[backend] < self.failure_threshold
                if before != after:
                    log.warning(
                        "service proxy: %s:%d %s", *backend,
                        "ready" if after else f"not ready ({self.failure_threshold} failed probes)",
                    )  # fmt: skip
            self.ready = [b for b in self.backends if self._failures[b] < self.failure_threshold]
            await asyncio.sleep(self.probe_period_s)

    async def _probe(self, backend: tuple[str, int]) -> bool:
        host, port = backend
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(self.probe_timeout_s):
                reader, writer = await asyncio.open_connection(host, port)
                request = (
                    f"GET {self.probe_path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                )
                writer.write(request.encode())
                await writer.drain()
                status = await reader.readline()
        except (OSError, TimeoutError):
            return False
        finally:  # a backend too slow to answer in time still gets its connection closed
            if writer is not None:
                writer.close()
        parts = status.split()
        return len(parts) >= 2 and parts[1] == b"200"

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        ready = list(self.ready)
        start = next(self._turn)
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            for i in range(len(ready)):
                host, port = ready[(start + i) % len(ready)]
                try:
                    upstream = await asyncio.open_connection(host, port)
                    break
                except OSError:
                    continue
        finally:
            if upstream is None:  # no ready endpoint, or stopped meanwhile: refuse (close)
                log.warning("service proxy: no ready backend for a new connection; closed")
                client_w.close()
        if upstream is None:
            return
        server_r, server_w = upstream
        try:
            await asyncio.gather(
                self._pipe(client_r, server_w),
                self._pipe(server_r, client_w),
                return_exceptions=True,
            )
        finally:  # cancelled at stop: both ends are closed all the same
            server_w.close()
            client_w.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()
