"""A TCP server that accepts connections, reads what clients send and never answers: a TLS
handshake with it never ends, so a test can interrupt a client in the middle of one
(``tests/test_kube_transport.py``). It notes when a client sent its first bytes (the TLS
ClientHello) and when the client closed the connection.

Test-only (asyncio; one event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

__all__ = ["SilentServer", "silent_server"]


@dataclass
class SilentServer:
    """``port`` on 127.0.0.1; ``spoke`` is set once a client sent bytes, ``closed`` once a
    client that connected closed its side (end of stream or reset)."""

    port: int = 0
    spoke: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    @property
    def url(self) -> str:
        """``https://127.0.0.1:<port>``: what a TLS client is pointed at."""
        return f"https://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while await reader.read(65536):
                self.spoke.set()
        except ConnectionError:
            pass
        self.closed.set()
        writer.close()


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[SilentServer]:
    """Serve on an ephemeral port of 127.0.0.1 until the block ends."""
    silent = SilentServer()
    server = await asyncio.start_server(silent._serve, "127.0.0.1", 0)
    silent.port = server.sockets[0].getsockname()[1]
    try:
        yield silent
    finally:
        server.close()
        for writer in silent._writers:  # a client that never closed does not hold the server
            writer.close()
        await server.wait_closed()
