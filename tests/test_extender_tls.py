"""TLS for ``gpushare extender``: a throwaway CA, server certificate (SAN 127.0.0.1) and client
certificate made with ``openssl``; the in-memory app served by uvicorn in a thread on a free
loopback port with the options ``--tls-*`` turn into (the extender's own h11 protocol,
``uvicorn_settings``). HTTPS works with the CA, plain HTTP does not; with a client CA every
verb called without a client certificate gets 401 and is counted, one with it answers, a
certificate of another CA is refused in the handshake, and the probes need none; bad flag
combinations exit non-zero with one clear message and no traceback."""

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
from gpushare.extender.callers import ClientAuth
from gpushare.extender.limits import RequestLimits, uvicorn_settings
from gpushare.extender.live import tls_problems, uvicorn_tls
from gpushare.testing.extender import node_json, pod_json, serve_in_thread
from gpushare.testing.metrics import sample_sum

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path


def _openssl(*args: str | Path, cwd: Path) -> None:
    subprocess.run(["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True)


def _signed(
    tmp: Path, name: str, subject: str, extensions: str, ca: str = "ca"
) -> tuple[Path, Path]:
    key, csr, cert, ext = (tmp / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
    ext.write_text(extensions)
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
             "-subj", subject, cwd=tmp)  # fmt: skip
    _openssl("x509", "-req", "-in", csr, "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", cert, "-days", "2", "-extfile", ext, cwd=tmp)  # fmt: skip
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
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "other.key", "-out",
             "other.crt", "-days", "2", "-subj", "/CN=another CA", cwd=tmp)  # fmt: skip
    stranger_cert, stranger_key = _signed(
        tmp, "stranger", "/CN=kube-scheduler", "extendedKeyUsage=clientAuth\n", ca="other"
    )
    return Pki(tmp / "ca.crt", cert, key, client_cert, client_key, stranger_cert, stranger_key)


@dataclass(frozen=True)
class Served:
    port: int

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"


def _serve(pki: Pki, client_auth: ClientAuth | None) -> Iterator[Served]:
    """The in-memory app over HTTPS on a free loopback port, with the extender's protocol."""
    state = ExtenderState()
    state.upsert_node(node_json("n1", [16]))
    state.cluster.mark_synced()
    tls = uvicorn_tls(pki.cert, pki.key, pki.ca if client_auth is not None else None)
    app = create_app(state, client_auth=client_auth, expire_interval_s=None)
    with serve_in_thread(app, **tls, **uvicorn_settings(RequestLimits())) as port:
        yield Served(port)


@pytest.fixture
def https_port(pki: Pki) -> Iterator[int]:
    for served in _serve(pki, None):
        yield served.port


@pytest.fixture
def mtls(pki: Pki) -> Iterator[Served]:
    yield from _serve(pki, ClientAuth.REQUIRED)


@pytest.fixture
def optional_mtls(pki: Pki) -> Iterator[Served]:
    yield from _serve(pki, ClientAuth.OPTIONAL)


def _context(pki: Pki, *, client: bool = False, stranger: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if client:
        context.load_cert_chain(pki.client_cert, pki.client_key)
    if stranger:
        context.load_cert_chain(pki.stranger_cert, pki.stranger_key)
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


PREFIX = "/gpushare-scheduler"
POD = pod_json("p", 4)
VERB_BODIES = {
    "filter": {"Pod": POD, "NodeNames": ["n1"]},
    "prioritize": {"Pod": POD, "NodeNames": ["n1"]},
    "bind": {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "n1"},
    "preempt": {"Pod": POD, "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "x"}]}}},
}


@pytest.mark.parametrize("verb", sorted(VERB_BODIES))
def test_with_a_client_ca_every_verb_needs_a_client_certificate(
    pki: Pki, mtls: Served, verb: str
) -> None:
    url = mtls.url(f"{PREFIX}/{verb}")
    refused = httpx.post(url, json=VERB_BODIES[verb], verify=_context(pki), timeout=5)
    assert refused.status_code == 401, refused.text
    assert "needs a client certificate" in refused.json()["Error"]
    answered = httpx.post(url, json=VERB_BODIES[verb], verify=_context(pki, client=True), timeout=5)
    assert answered.status_code == 200, answered.text
    metrics = mtls.url("/metrics")
    context = _context(pki)
    refusals = {"verb": verb, "action": "refused"}
    assert sample_sum(metrics, "gpushare_extender_unauthenticated_requests_total", refusals,
                      context=context) == 1.0  # fmt: skip
    outcome = {"verb": verb, "outcome": "unauthenticated"}
    assert sample_sum(metrics, "gpushare_extender_requests_total", outcome,
                      context=context) == 1.0  # fmt: skip


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", f"{PREFIX}/inspect"])
def test_with_a_client_ca_probes_and_metrics_need_no_certificate(
    pki: Pki, mtls: Served, path: str
) -> None:
    assert httpx.get(mtls.url(path), verify=_context(pki), timeout=5).status_code == 200


def test_a_client_certificate_of_another_ca_is_refused_in_the_handshake(
    pki: Pki, mtls: Served
) -> None:
    with pytest.raises(httpx.HTTPError):  # refused in the handshake or on the first read
        httpx.post(mtls.url(f"{PREFIX}/filter"), json=VERB_BODIES["filter"],
                   verify=_context(pki, stranger=True), timeout=5)  # fmt: skip


def test_optional_client_auth_serves_the_verb_and_counts_it(
    pki: Pki, optional_mtls: Served
) -> None:
    url = optional_mtls.url(f"{PREFIX}/filter")
    answered = httpx.post(url, json=VERB_BODIES["filter"], verify=_context(pki), timeout=5)
    assert answered.status_code == 200, answered.text
    served = {"verb": "filter", "action": "served"}
    metrics = optional_mtls.url("/metrics")
    assert sample_sum(metrics, "gpushare_extender_unauthenticated_requests_total", served,
                      context=_context(pki)) == 1.0  # fmt: skip


def test_without_a_client_ca_the_verbs_ask_no_certificate(pki: Pki, https_port: int) -> None:
    url = f"https://127.0.0.1:{https_port}{PREFIX}/filter"
    response = httpx.post(url, json=VERB_BODIES["filter"], verify=_context(pki), timeout=5)
    assert response.status_code == 200


def test_uvicorn_options(pki: Pki) -> None:
    assert uvicorn_tls(None, None, None) == {}
    assert uvicorn_tls(pki.cert, pki.key, None) == {
        "ssl_certfile": str(pki.cert),
        "ssl_keyfile": str(pki.key),
    }
    mutual = uvicorn_tls(pki.cert, pki.key, pki.ca)
    assert mutual["ssl_ca_certs"] == str(pki.ca)
    assert mutual["ssl_cert_reqs"] == ssl.CERT_OPTIONAL  # the app requires it of the verbs
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
