"""The alert rules (``deploy/helm/gpushare/alerts/gpushare-alerts.yaml``) by Prometheus's own
tools: ``promtool check rules`` accepts them, ``promtool test rules`` passes every case of
``tests/alerts/gpushare-alerts.test.yaml`` (each alert fires after its ``for`` and the series
beside it do not), every alert has a case, and the chart's PrometheusRule carries exactly these
rules. Prometheus and promtool are Debian's (``scripts/install-observe-tools.sh``); that the
series the rules read are the ones the extender and the device plugin export is proved on a
real Prometheus scraping them (``tests/cluster/test_prometheus.py``).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.testing.controlplane import REPO_ROOT
from gpushare.testing.helm import render_objects

RULES = REPO_ROOT / "deploy" / "helm" / "gpushare" / "alerts" / "gpushare-alerts.yaml"
CASES = REPO_ROOT / "tests" / "alerts" / "gpushare-alerts.test.yaml"
ALERTS = [
    "GpushareGpuOverCapacity",
    "GpushareSkippedPods",
    "GpushareGpuUnhealthy",
    "GpushareMpsDaemonDown",
    "GpushareNoExtenderLeader",
    "GpushareExtenderErrors",
    "GpushareExtenderSlow",
    "GpushareNodeConfigInvalid",
    "GpushareExtenderUnauthenticatedCalls",
    "GpushareHoldsWritableByOthers",
    "GpusharePodBypassedScheduler",
]


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool missing: run scripts/install-observe-tools.sh (make test does)"
    return found


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_promtool_accepts_the_rules() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_every_case_passes_promtool_test_rules() -> None:
    result = subprocess.run(
        [promtool(), "test", "rules", CASES.name],
        cwd=CASES.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_shipped_alerts_are_these() -> None:
    assert [rule["alert"] for rule in rules()] == ALERTS


@pytest.mark.parametrize("alert", ALERTS)
def test_each_alert_has_a_case_where_it_fires(alert: str) -> None:
    cases = yaml.safe_load(CASES.read_text())["tests"]
    firing = [
        check
        for case in cases
        for check in case["alert_rule_test"]
        if check["alertname"] == alert and check["exp_alerts"]
    ]
    assert firing, f"no case of {CASES.name} expects {alert} to fire"


@pytest.mark.parametrize("alert", ALERTS)
def test_each_alert_has_a_severity_a_summary_and_a_pointer_to_the_docs(alert: str) -> None:
    (rule,) = [r for r in rules() if r["alert"] == alert]
    assert rule["labels"]["severity"] in ("warning", "critical")
    assert rule["annotations"]["summary"]
    assert "docs/" in rule["annotations"]["description"]
    for path in _doc_paths(rule["annotations"]["description"]):
        assert (REPO_ROOT / path).is_file(), path


def _doc_paths(text: str) -> list[Path]:
    return [Path(word.strip("(),.")) for word in text.split() if word.startswith("(docs/")]


def test_the_chart_prometheus_rule_carries_the_rules_file() -> None:
    objects = render_objects(
        {"prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}}
    )
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    assert not [o for o in render_objects() if o["kind"] == "PrometheusRule"]  # off by default
