"""Renewed certificates take effect without a restart.

The chart's certificates are renewed in place: cert-manager rewrites the Secret before they
expire, an operator replaces a Secret of their own, and kubelet swaps the mounted files (an
atomic symlink change). :class:`TlsReloader` looks at the files every ``interval_s`` (their
size, modification time and inode: a swap changes them all) and, when one changed and the new
set loads cleanly into a fresh context (a half-written pair is not taken; the old one keeps
serving and the problem is logged until the files are whole), loads it into every live
context: the server's (new handshakes present the new certificate; connections already open
keep theirs), the peer listener's, and through ``on_change`` the follower's client (its
forwarding connections). A CA file added to a context adds its certificates: a CA that is
dropped stays trusted until the process restarts (docs/install.md, "TLS").
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

__all__ = ["TlsReloader"]

log = logging.getLogger(__name__)


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size, stat.st_ino


class TlsReloader:
    """Reload ``cert``/``key`` (and the ``cas``) into the contexts ``contexts()`` returns when
    the files change (module doc); ``on_change`` is awaited after each reload."""

    def __init__(
        self,
        cert: Path,
        key: Path,
        cas: Sequence[Path] = (),
        *,
        contexts: Callable[[], Sequence[ssl.SSLContext]],
        on_change: Callable[[], Awaitable[None]] | None = None,
        interval_s: float = 30.0,
    ) -> None:
        self.cert, self.key, self.cas = cert, key, tuple(cas)
        self._contexts = contexts
        self._on_change = on_change
        self._interval_s = interval_s
        self._seen = self._signatures()
        self._problem = ""
        self.reloads = 0
        """Reloads done so far."""

    def _signatures(self) -> tuple[tuple[int, int, int] | None, ...]:
        return tuple(_signature(p) for p in (self.cert, self.key, *self.cas))

    async def run(self) -> None:
        """Check every ``interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(self._interval_s)
            await self.check()

    async def check(self) -> bool:
        """Reload when the files changed and load cleanly; whether it reloaded."""
        seen = self._signatures()
        if seen == self._seen:
            return False
        try:
            scratch = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            scratch.load_cert_chain(self.cert, self.key)
            for ca in self.cas:
                scratch.load_verify_locations(cafile=str(ca))
        except (OSError, ssl.SSLError) as error:
            problem = f"{type(error).__name__}: {error}"
            if problem != self._problem:
                self._problem = problem
                log.warning(
                    "TLS files changed but cannot be loaded (%s); still serving the previous "
                    "certificate", problem
                )  # fmt: skip
            return False
        for context in self._contexts():
            context.load_cert_chain(self.cert, self.key)
            for ca in self.cas:
                context.load_verify_locations(cafile=str(ca))
        self._seen, self._problem = seen, ""
        self.reloads += 1
        if self._on_change is not None:
            await self._on_change()
        log.info("TLS certificate reloaded from %s", self.cert)
        return True
