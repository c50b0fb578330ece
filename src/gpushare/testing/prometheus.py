"""A real Prometheus (Debian's ``prometheus``, ``scripts/install-observe-tools.sh``) for tests.

:class:`Prometheus` writes a configuration that scrapes the given ``/metrics`` URLs every
second (one job per name) and loads the given rule files, runs ``prometheus`` on a free loopback
port with its data in a temporary folder, and answers its HTTP API: :meth:`Prometheus.query`
(an instant query), :meth:`Prometheus.targets`, :meth:`Prometheus.rules`,
:meth:`Prometheus.label_values`. Errors of the API (a query Prometheus cannot parse) raise
:class:`PrometheusError` with Prometheus's own words.
"""

from __future__ import annotations

import json
import shutil
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from gpushare.testing.controlplane import ManagedProcess, free_ports, http_ok, wait_until

__all__ = ["Prometheus", "PrometheusError"]


class PrometheusError(Exception):
    """The Prometheus API answered an error (its ``errorType: error``), or is missing."""


class Prometheus:
    """Prometheus scraping ``jobs`` (job name → ``http://host:port/metrics`` URLs) every
    ``scrape_interval_s`` and evaluating ``rule_files``; a context manager. ``workdir`` holds
    the configuration, the data and the log."""

    def __init__(
        self,
        workdir: Path,
        jobs: Mapping[str, Sequence[str]],
        *,
        rule_files: Sequence[Path] = (),
        scrape_interval_s: int = 1,
    ) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise PrometheusError(
                "prometheus is missing: run scripts/install-observe-tools.sh (make test does)"
            )
        self.workdir = workdir
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {
                "scrape_interval": f"{scrape_interval_s}s",
                "evaluation_interval": f"{scrape_interval_s}s",
            },
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [
                {
                    "job_name": job,
                    "metrics_path": _path_of(urls),
                    "static_configs": [{"targets": [_host_of(url) for url in urls]}],
                }
                for job, urls in jobs.items()
            ],
        }
        workdir.mkdir(parents=True, exist_ok=True)
        config_path = workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.process = ManagedProcess(
            "prometheus",
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            workdir,
        )

    def __enter__(self) -> Prometheus:
        self.process.start()
        try:
            wait_until(
                "prometheus ready",
                lambda: http_ok(f"{self.url}/-/ready"),
                60,
                processes=[self.process],
            )
        except BaseException:
            self.process.stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.process.stop()

    def api(self, path: str, params: Mapping[str, str | Sequence[str]] | None = None) -> Any:
        """``GET /api/v1/<path>``: its ``data``; ``PrometheusError`` for an error answer."""
        query = urllib.parse.urlencode(params or {}, doseq=True)
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(url, timeout=10) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as error:
            answer = json.loads(error.read() or b"{}")
        if answer.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {answer.get('error', answer)}")
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result (a vector's samples: ``metric`` labels and ``value``)."""
        data = self.api("query", {"query": expr})
        result: list[dict[str, Any]] = data["result"]
        return result

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets (``labels``, ``health``, ``lastError``)."""
        targets: list[dict[str, Any]] = self.api("targets")["activeTargets"]
        return targets

    def rules(self) -> list[dict[str, Any]]:
        """Every loaded rule with its ``health`` and ``lastError``."""
        groups = self.api("rules")["groups"]
        return [rule for group in groups for rule in group["rules"]]

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        """The values of ``label`` (among series matching ``match``)."""
        params = {"match[]": [match]} if match else None
        values: list[str] = self.api(f"label/{label}/values", params)
        return values


def _host_of(url: str) -> str:
    return urllib.parse.urlsplit(url).netloc


def _path_of(urls: Sequence[str]) -> str:
    paths = {urllib.parse.urlsplit(url).path or "/metrics" for url in urls}
    if len(paths) != 1:
        raise ValueError(f"one metrics path per job, got {sorted(paths)}")
    return paths.pop()
