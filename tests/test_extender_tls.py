"""TLS for ``gpushare extender``: a throwaway CA, server certificate (SAN 127.0.0.1) and client
certificate made with ``openssl``; the in-memory app served by uvicorn in a thread on a free
loopback port with the options ``--tls-*`` turn into. HTTPS works with the CA, plain HTTP does
not; with a client CA a request without a client certificate is refused and one with it
answers; bad flag combinations exit non-zero with one clear message and no traceback."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx
import pytest
from click.testing import CliRunner

from gpushare.cli.main import main
from gpushare.extender import ExtenderState, create_app
from gpushare.extender.live import tls_problems, uvicorn_tls
from gpushare.testing.extender import serve_in_thread

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str | Path, cwd: Path) -> None:
    subprocess.run(["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True)


def _signed(tmp: Path, name: str, subject: str, extensions: str) -> tuple[Path, Path]:
    key, csr, cert, ext = (tmp / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
    ext.write_text(extensions)
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
             "-subj", subject, cwd=tmp)  # fmt: skip
    _openssl("x509", "-req", "-in", csr, "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", cert, "-days", "2", "-extfile", ext, cwd=tmp)  # fmt: skip
    return cert, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    tmp = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.crt", "-days", "2", "-subj", "/CN=gpushare test CA", cwd=tmp)  # fmt: skip
    cert, key = _signed(
        tmp, "server", "/CN=127.0.0.1",
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )  # fmt: skip
    client_cert, client_key = _signed(
        tmp, "client", "/CN=kube-scheduler", "extendedKeyUsage=clientAuth\n"
    )
    return Pki(tmp / "ca.crt", cert, key, client_cert, client_key)


def _serve(pki: Pki, *, client_ca: bool) -> Iterator[int]:
    """The in-memory app over HTTPS on a free loopback port (yields the port)."""
    state = ExtenderState()
    state.cluster.mark_synced()
    tls = uvicorn_tls(pki.cert, pki.key, pki.ca if client_ca else None)
    with serve_in_thread(create_app(state), **tls) as port:
        yield port


@pytest.fixture
def https_port(pki: Pki) -> Iterator[int]:
    yield from _serve(pki, client_ca=False)


@pytest.fixture
def mtls_port(pki: Pki) -> Iterator[int]:
    yield from _serve(pki, client_ca=True)


def _context(pki: Pki, *, client: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if client:
        context.load_cert_chain(pki.client_cert, pki.client_key)
    return context


def test_https_healthz_with_the_ca(pki: Pki, https_port: int) -> None:
    response = httpx.get(f"https://127.0.0.1:{https_port}/healthz", verify=_context(pki))
    assert response.status_code == 200


def test_plain_http_fails(https_port: int) -> None:
    with pytest.raises(httpx.HTTPError):  # the TLS server drops a plain-text request
        httpx.get(f"http://127.0.0.1:{https_port}/healthz", timeout=5)


def test_unknown_ca_is_refused(https_port: int) -> None:
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"https://127.0.0.1:{https_port}/healthz", timeout=5)


def test_client_ca_requires_a_client_certificate(pki: Pki, mtls_port: int) -> None:
    url = f"https://127.0.0.1:{mtls_port}/healthz"
    with pytest.raises(httpx.HTTPError):  # refused in the handshake or on the first read
        httpx.get(url, verify=_context(pki), timeout=5)
    response = httpx.get(url, verify=_context(pki, client=True), timeout=5)
    assert response.status_code == 200


def test_uvicorn_options(pki: Pki) -> None:
    assert uvicorn_tls(None, None, None) == {}
    assert uvicorn_tls(pki.cert, pki.key, None) == {
        "ssl_certfile": str(pki.cert),
        "ssl_keyfile": str(pki.key),
    }
    mutual = uvicorn_tls(pki.cert, pki.key, pki.ca)
    assert mutual["ssl_ca_certs"] == str(pki.ca)
    assert mutual["ssl_cert_reqs"] == ssl.CERT_REQUIRED
    assert tls_problems(pki.cert, pki.key, pki.ca) == []


def _run(*flags: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["extender", "--in-memory", "--port", "1", *flags])
    return result.exit_code, result.output


def test_cert_without_key_and_missing_files_listed_together(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    code, output = _run("--tls-cert", str(missing), "--tls-client-ca", str(tmp_path / "ca.pem"))
    assert code != 0
    assert "Traceback" not in output
    assert "bad TLS configuration" in output
    assert "--tls-cert needs --tls-key" in output
    assert "--tls-client-ca needs --tls-cert and --tls-key" in output
    assert f"--tls-cert {missing}: no such file" in output
    assert f"--tls-client-ca {tmp_path / 'ca.pem'}: no such file" in output


def test_key_without_cert(pki: Pki) -> None:
    code, output = _run("--tls-key", str(pki.key))
    assert code != 0
    assert "--tls-key needs --tls-cert" in output
    assert "Traceback" not in output


def test_directory_and_garbage_files(pki: Pki, tmp_path: Path) -> None:
    code, output = _run("--tls-cert", str(tmp_path), "--tls-key", str(pki.key))
    assert code != 0
    assert f"--tls-cert {tmp_path}: not a file" in output
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    code, output = _run("--tls-cert", str(garbage), "--tls-key", str(pki.key))
    assert code != 0
    assert "TLS files rejected" in output
    assert "Traceback" not in output


def test_key_that_does_not_match(pki: Pki) -> None:
    code, output = _run("--tls-cert", str(pki.cert), "--tls-key", str(pki.client_key))
    assert code != 0
    assert "TLS files rejected" in output
    assert "Traceback" not in output
