"""Throw-away TLS material (CA, serving and admin pairs, service-account keys) and kubeconfigs."""

from __future__ import annotations

import json
import ssl
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpushare.testing.controlplane.errors import ControlPlaneError


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args)} failed:\n{done.stderr}")


@dataclass(frozen=True)
class Credentials:
    """A throw-away CA, the API server's serving pair, the admin client pair and the SA keys."""

    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path

    @classmethod
    def generate(cls, directory: Path, *, extra_ips: Sequence[str] = ()) -> Credentials:
        """Generate everything in ``directory``; ``extra_ips`` join the serving cert's SANs."""
        directory.mkdir(parents=True, exist_ok=True)
        sans = [
            "IP:127.0.0.1",
            "IP:10.0.0.1",
            *(f"IP:{ip}" for ip in extra_ips if ip != "127.0.0.1"),
        ]
        sans += ["DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default"]
        sans += ["DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local"]
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=gpushare-test-ca",
            cwd=directory,
        )  # fmt: skip
        (directory / "serving.ext").write_text(
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\n"
            f"subjectAltName={','.join(sans)}\n"
        )
        (directory / "client.ext").write_text(
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=clientAuth\n"
        )
        for name, subject, ext in (
            ("serving", "/CN=kube-apiserver", "serving.ext"),
            ("admin", "/O=system:masters/CN=gpushare-test-admin", "client.ext"),
        ):
            _openssl(
                "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                "-out", f"{name}.csr", "-subj", subject,
                cwd=directory,
            )  # fmt: skip
            _openssl(
                "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-extfile", ext, "-out", f"{name}.crt",
                cwd=directory,
            )  # fmt: skip
        _openssl("genrsa", "-out", "sa.key", "2048", cwd=directory)
        _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
        return cls(
            ca_cert=directory / "ca.crt",
            serving_cert=directory / "serving.crt",
            serving_key=directory / "serving.key",
            admin_cert=directory / "admin.crt",
            admin_key=directory / "admin.key",
            sa_key=directory / "sa.key",
            sa_pub=directory / "sa.pub",
        )

    def admin_ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        context.load_cert_chain(str(self.admin_cert), str(self.admin_key))
        return context


def write_kubeconfig(
    path: Path,
    server: str,
    ca_cert: Path | None,
    user: Mapping[str, str],
    *,
    context: str = "test",
) -> Path:
    """A one-context kubeconfig (JSON, which is YAML; mode 0600) for ``server`` with ``user``
    credentials, its current context named ``context``. ``ca_cert``: the CA that signs the
    server's certificate, or ``None`` for ``insecure-skip-tls-verify`` (a server nothing
    verifies: an unreachable address, a test's own listener)."""
    cluster: dict[str, str | bool] = {"server": server}
    if ca_cert is None:
        cluster["insecure-skip-tls-verify"] = True
    else:
        cluster["certificate-authority"] = str(ca_cert)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "gpushare-test", "cluster": cluster}],
        "users": [{"name": "user", "user": dict(user)}],
        "contexts": [{"name": context, "context": {"cluster": "gpushare-test", "user": "user"}}],
        "current-context": context,
    }
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)
    return path


def unverified_kubeconfig(path: Path, server: str, *, context: str = "test") -> Path:
    """``write_kubeconfig`` for a server nothing verifies, with a token no API server accepts:
    for the tests of what a client does before (or without) a real API server."""
    return write_kubeconfig(path, server, None, {"token": "not-a-real-token"}, context=context)
