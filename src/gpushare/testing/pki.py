"""Throwaway certificates for TLS tests, made with the ``openssl`` command: a CA, and
certificates it signs for a DNS name and addresses, usable by a server, a client, or both (as
the chart's serving certificate is: the replicas present it to each other).
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Ca", "Pair"]


@dataclass(frozen=True)
class Pair:
    """A certificate and its key (PEM files)."""

    cert: Path
    key: Path


def _openssl(*args: str | Path, cwd: Path) -> None:
    subprocess.run(["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True)


@dataclass(frozen=True)
class Ca:
    """A CA in ``directory`` (``<name>.crt``, ``<name>.key``)."""

    directory: Path
    name: str

    @classmethod
    def create(cls, directory: Path, name: str = "ca") -> Ca:
        """A new self-signed CA, valid for two days."""
        directory.mkdir(parents=True, exist_ok=True)
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN=gpushare test {name}",
            cwd=directory,
        )  # fmt: skip
        return cls(directory, name)

    @property
    def cert(self) -> Path:
        return self.directory / f"{self.name}.crt"

    def sign(
        self,
        name: str,
        *,
        dns: Sequence[str] = (),
        ips: Sequence[str] = (),
        usages: Sequence[str] = ("serverAuth", "clientAuth"),
        days: int = 2,
    ) -> Pair:
        """A key and a certificate for ``dns`` names and ``ips`` (subjectAltName), with the
        extended key ``usages``, signed by this CA; files ``<name>.crt``/``<name>.key``."""
        d = self.directory
        key, csr, cert, ext = (d / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
        alt = [f"DNS:{n}" for n in dns] + [f"IP:{ip}" for ip in ips]
        lines = [f"extendedKeyUsage={','.join(usages)}"]
        if alt:
            lines.append(f"subjectAltName={','.join(alt)}")
        ext.write_text("\n".join(lines) + "\n")
        subject = f"/CN={(dns or ips or (name,))[0]}"
        _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
                 "-subj", subject, cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", csr, "-CA", self.cert, "-CAkey", f"{self.name}.key",
                 "-CAcreateserial", "-out", cert, "-days", str(days), "-extfile", ext,
                 cwd=d)  # fmt: skip
        return Pair(cert, key)
