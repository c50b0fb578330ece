"""Request limits (docs/extender.md, "Limits"), on the real server: uvicorn with the settings the
extender runs with (``gpushare.extender.limits``), a real loopback socket, raw HTTP written
byte by byte so that a request can be left half-sent, as a slowloris client leaves it.

No test bounds wall time (two busy cores are CI's normal state): the only
timeouts that can close a connection within ``WAIT_S`` are the ones a test is about (the head
and body timeouts, 0.5 s; the keep-alive timeout is far longer than ``WAIT_S``), so a
connection closed by the server before ``WAIT_S`` was closed by them."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from gpushare.extender import ExtenderState, create_app
from gpushare.extender.limits import RequestLimits, uvicorn_settings
from gpushare.testing.controlplane import wait_for
from gpushare.testing.extender import serve_in_thread

PREFIX = "/gpushare-scheduler"
FAST = RequestLimits(
    max_body_bytes=16 * 1024,
    head_timeout_s=0.5,
    body_timeout_s=0.5,
    keep_alive_timeout_s=600,
    max_connections=50,
)
WAIT_S = 30.0  # far above the head and body timeouts, far below the keep-alive one


@contextmanager
def serving(limits: RequestLimits) -> Iterator[int]:
    """The in-memory app under ``limits`` on a free loopback port (yields the port)."""
    state = ExtenderState()
    state.cluster.mark_synced()
    app = create_app(state, expire_interval_s=None, limits=limits)
    with serve_in_thread(app, **uvicorn_settings(limits)) as port:
        yield port


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with serving(FAST) as bound:
        yield bound


def connect(port: int) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    return conn


def read_all(conn: socket.socket) -> bytes:
    """Everything until the server closes the connection; raises ``TimeoutError`` when it stays
    open ``WAIT_S``."""
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    return data


def post_head(length: int | None, *, path: str = f"{PREFIX}/filter") -> bytes:
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{framing}\r\n\r\n"
    ).encode()


HALF_SENT = [
    ("nothing at all", b""),
    ("half a request line", b"POST /gpushare-scheduler/filter HTT"),
    ("a request line, no blank line", b"POST /gpushare-scheduler/filter HTTP/1.1\r\nHost: x\r\n"),
]  # fmt: skip


@pytest.mark.parametrize("sent", [h[1] for h in HALF_SENT], ids=[h[0] for h in HALF_SENT])
def test_a_half_sent_request_head_is_closed(port: int, sent: bytes) -> None:
    with connect(port) as conn:
        conn.sendall(sent)
        data = read_all(conn)
    assert data == b""


def test_a_half_sent_second_request_on_a_kept_alive_connection_is_closed(port: int) -> None:
    with connect(port) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while not first.endswith(b'{"status":"ok"}'):
            first += conn.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHo")
        data = read_all(conn)
    assert data == b""


def test_a_slow_body_gets_408_and_is_closed(port: int) -> None:
    with connect(port) as conn:
        conn.sendall(post_head(100) + b'{"Pod": ')
        data = read_all(conn)
    assert data.startswith(b"HTTP/1.1 408"), data
    assert b"connection: close" in data.lower()
    assert b"request body not complete within 0.5s (8 bytes received" in data


def test_a_declared_body_over_the_limit_gets_413_before_it_is_read(port: int) -> None:
    with connect(port) as conn:
        conn.sendall(post_head(100 * 1024 * 1024))  # 100 MB announced, nothing sent
        data = read_all(conn)
    assert data.startswith(b"HTTP/1.1 413"), data
    assert b"request body of 104857600 bytes (Content-Length) is larger than" in data
    assert b"--max-request-body-mib" in data


def test_a_streamed_body_over_the_limit_gets_413(port: int) -> None:
    chunk = b"x" * 20_000  # one chunk, over the 16 KiB limit, with no length announced
    with connect(port) as conn:
        conn.sendall(post_head(None) + f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        data = read_all(conn)
    assert data.startswith(b"HTTP/1.1 413"), data
    assert b"larger than the extender accepts (16384 bytes" in data


def test_a_request_head_growing_past_64_kib_is_refused(port: int) -> None:
    with connect(port) as conn:  # no end of head in sight after 70 KB: h11 gives up
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000)
        data = read_all(conn)
    assert data.startswith(b"HTTP/1.1 400"), data[:100]


def test_connections_past_the_cap_are_closed_at_once() -> None:
    limits = RequestLimits(head_timeout_s=120.0, max_connections=5)
    with serving(limits) as bound:
        # Connected (handshake done) before the sixth is opened, the five are ahead of it in
        # the kernel's accept queue, which the server accepts in order: no wait is needed.
        held = [connect(bound) for _ in range(5)]
        try:
            with connect(bound) as extra:  # a sixth accepted would wait 120 s for its head
                data = read_all(extra)
            assert data == b""
        finally:
            for conn in held:
                conn.close()
        last = [b""]

        def served() -> bytes | None:
            with connect(bound) as conn:
                conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                try:
                    last[0] = read_all(conn)
                except ConnectionResetError:
                    last[0] = b""
            return last[0] if last[0].startswith(b"HTTP/1.1 200") else None

        # the closed ones are forgotten: a new connection is served
        wait_for("a new connection to be served", served, WAIT_S, detail=lambda: last[0])
