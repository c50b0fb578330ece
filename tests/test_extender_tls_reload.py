"""A renewed certificate is served without a restart (docs/install.md, "TLS";
``gpushare.extender.tlsreload``): a real uvicorn HTTPS server, its certificate files replaced
as kubelet replaces a Secret's (a new file renamed over the old), ``TlsReloader.check`` loads
them into the live context, and the next handshake presents the new certificate; a half-written
pair is not taken (the server keeps the last good one)."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from gpushare.extender import ExtenderState, create_app
from gpushare.extender.tlsreload import TlsReloader
from gpushare.testing.controlplane import free_ports, wait_for
from gpushare.testing.pki import Ca, Pair

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def served_certificate(port: int, ca: Ca) -> str:
    """The PEM certificate the server at ``port`` presents now."""
    return ssl.get_server_certificate(("127.0.0.1", port), ca_certs=str(ca.cert))


def pem(pair: Pair) -> str:
    return ssl.DER_cert_to_PEM_cert(ssl.PEM_cert_to_DER_cert(pair.cert.read_text()))


def replace(source: Path, target: Path) -> None:
    """``source``'s bytes at ``target``, by a rename (what kubelet's atomic writer does)."""
    staged = target.with_suffix(".new")
    staged.write_bytes(source.read_bytes())
    staged.replace(target)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[uvicorn.Server, int, Ca, Pair, Path]]:
    ca = Ca.create(tmp_path / "pki")
    first = ca.sign("first", ips=["127.0.0.1"])
    live = tmp_path / "live"
    live.mkdir()
    cert, key = live / "tls.crt", live / "tls.key"
    replace(first.cert, cert)
    replace(first.key, key)
    state = ExtenderState()
    state.cluster.mark_synced()
    (port,) = free_ports(1)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(state, expire_interval_s=None), host="127.0.0.1", port=port,
            log_config=None, ws="none", ssl_certfile=str(cert), ssl_keyfile=str(key),
        )
    )  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for("the HTTPS server", lambda: server.started or None, 10)
    try:
        yield server, port, ca, first, live
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_renewed_certificate_is_served_after_a_check(
    served: tuple[uvicorn.Server, int, Ca, Pair, Path],
) -> None:
    server, port, ca, first, live = served
    cert, key = live / "tls.crt", live / "tls.key"
    live_contexts = [c for c in [server.config.ssl] if c is not None]
    reloader = TlsReloader(cert, key, contexts=lambda: live_contexts, interval_s=30)
    assert served_certificate(port, ca) == pem(first)
    assert not asyncio.run(reloader.check()), "nothing changed yet"

    second = ca.sign("second", ips=["127.0.0.1"])
    replace(second.cert, cert)
    cert_only = asyncio.run(reloader.check())  # the key still the old one: not a pair
    assert not cert_only
    assert served_certificate(port, ca) == pem(first)

    replace(second.key, key)
    assert asyncio.run(reloader.check())
    assert served_certificate(port, ca) == pem(second)
    assert reloader.reloads == 1
