"""``deploy/helm/gpushare/dashboards/gpushare-dashboard.json``, checked structurally against what
Grafana needs and against the series gpushare really exposes.

There is no Grafana (nor Prometheus) here, so the dashboard is never rendered and its queries
never run. What is checked instead:

* **Grafana's model** (dashboard JSON, schema version 36 and later): the top-level keys and their
  types, a ``uid`` Grafana accepts (at most 40 of ``[A-Za-z0-9_-]``), a Prometheus datasource
  template variable that every panel and target uses, a ``node`` variable, unique panel ids
  (rows' nested panels included), panel types Grafana ships, and ``gridPos`` inside the
  24-column grid with no two panels overlapping; every non-row panel has targets with unique
  ``refId``\\ s and a non-empty ``expr``; every ``$variable`` used is defined or a Grafana
  built-in.
* **PromQL, as far as a tokenizer can tell**: brackets and quotes balance, label matchers are
  well-formed, every function called is a PromQL function, and every other identifier is a
  keyword or a series name.
* **Series**: every series name (and every label in a matcher on it) is one that the extender's
  or the device plugin's ``/metrics`` exposes: both are built for real here, with data, and
  their scrapes parsed. The panels the dashboard promises (allocation, pods, health, extender
  rate/latency/errors, Allocate latency/failures, NVML memory and utilisation) use their series.

Not checked: that Grafana renders the panels as intended, that the PromQL evaluates (types of
operands, functions' arities), and transformations' field names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpushare.deviceplugin.metrics import DevicePluginMetrics
from gpushare.deviceplugin.nvml import NvmlInventory
from gpushare.extender import ExtenderState
from gpushare.extender.metrics import ExtenderMetrics
from gpushare.testing.extender import node_json, seed_bound_pods
from gpushare.testing.nvml import FakeDevice, FakeNvml

DASHBOARD = (
    Path(__file__).resolve().parents[1]
    / "deploy" / "helm" / "gpushare" / "dashboards" / "gpushare-dashboard.json"
)  # fmt: skip
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
PANEL_TYPES = frozenset(
    {"row", "timeseries", "stat", "gauge", "table", "heatmap", "bargauge", "text", "piechart"}
)
GRAFANA_BUILTINS = frozenset(
    {"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__range_ms"}
)
PROMQL_FUNCTIONS = frozenset(
    {
        "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
        "count_values", "group", "rate", "irate", "increase", "delta", "idelta", "deriv",
        "histogram_quantile", "vector", "scalar", "abs", "clamp_min", "clamp_max", "clamp",
        "label_replace", "label_join", "sort", "sort_desc", "time", "timestamp", "absent",
        "max_over_time", "min_over_time", "avg_over_time", "sum_over_time", "changes", "resets",
        "round", "ceil", "floor", "last_over_time", "quantile_over_time", "present_over_time",
    }
)  # fmt: skip
PROMQL_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "inf", "nan", "group_left", "group_right"}
)
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
TOKEN = re.compile(r"\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|[A-Za-z_:][A-Za-z0-9_:]*")
SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*(?:,|$)')
VARIABLE = re.compile(
    r"\$\{([A-Za-z0-9_]+)(?::[A-Za-z]+)?\}|\$([A-Za-z0-9_]+)|\[\[([A-Za-z0-9_]+)\]\]"
)
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')

# The panels the dashboard must have, by a series each uses.
REQUIRED_SERIES = (
    "gpushare_gpu_memory_capacity_bytes",  # cluster memory: allocated vs capacity
    "gpushare_gpu_memory_allocated_bytes",
    "gpushare_gpu_pods",  # pods per GPU
    "gpushare_gpu_healthy",  # unhealthy GPUs
    "gpushare_extender_requests_total",  # request rate, bind errors
    "gpushare_extender_request_duration_seconds_bucket",  # p99 by verb
    "gpushare_device_plugin_allocate_duration_seconds_bucket",  # Allocate p99
    "gpushare_device_plugin_allocate_requests_total",  # Allocate failures
    "gpushare_gpu_memory_used_bytes",  # NVML
    "gpushare_gpu_utilization_ratio",
)


def expositions() -> list[str]:
    """The extender's and the device plugin's ``/metrics`` text, both with data in every
    series."""
    state = ExtenderState()
    state.upsert_node(node_json("n1", [16276, 16276]))
    seed_bound_pods(state, "n1", [4069])
    state.cluster.mark_synced()
    extender, _ = ExtenderMetrics(state).exposition()
    fake = FakeNvml([FakeDevice("GPU-1", 0, "Tesla T4", 16 * 2**30)])
    fake.set_processes(0, [(1, 2**30)])
    gpus = NvmlInventory(fake).gpus()
    plugin = DevicePluginMetrics("n1", lambda: gpus, nvml=fake, proc_root=Path("/nonexistent-proc"))
    plugin.observe_allocate("ok", 0.01)
    plugin.observe_registration()
    return [extender.decode(), generate_latest(plugin.registry).decode()]


def exposed_series() -> dict[str, set[str]]:
    """Every series name the scrapes expose, with the label names of its samples."""
    series: dict[str, set[str]] = {}
    for text in expositions():
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                series.setdefault(sample.name, set()).update(sample.labels)
    return series


SERIES = exposed_series()


def load() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return document


def all_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every target and the query variables."""
    found = []
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []):
            found.append((f"panel {panel['id']} {target['refId']}", target["expr"]))
    return found


# -- PromQL, as far as a tokenizer can tell --------------------------------------------------------


def balanced(expr: str) -> bool:
    """Brackets balance outside string literals, and every literal is closed."""
    stripped = STRING.sub('""', expr)
    if any(quote in stripped.replace('""', "") for quote in "\"'`"):
        return False
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for char in stripped:
        if char in "([{":
            stack.append(char)
        elif char in pairs and (not stack or stack.pop() != pairs[char]):
            return False
    return not stack


def names_in(expr: str) -> tuple[set[str], set[str]]:
    """(functions called, other identifiers that are not keywords): the latter are series."""
    text = STRING.sub('""', expr)
    text = re.sub(r"\$\{?__\w+\}?", "5m", text)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = GROUPING.sub(" ", text)
    functions, series = set(), set()
    for match in TOKEN.finditer(text):
        word = match.group()
        if word[0].isdigit():
            continue
        if text[match.end() :].lstrip().startswith("("):
            functions.add(word)
        elif word.lower() not in PROMQL_KEYWORDS:
            series.add(word)
    return functions, series


def matcher_problems(expr: str) -> list[str]:
    """Malformed label matchers, and labels a series does not have."""
    problems = []
    for selector in SELECTOR.finditer(expr):
        name, body = selector.group(1), selector.group(2)
        position = 0
        while position < len(body):
            matcher = MATCHER.match(body, position)
            if matcher is None:
                problems.append(f"{name}: bad matcher at {body[position:]!r}")
                break
            label = matcher.group(1)
            if name in SERIES and label not in SERIES[name]:
                problems.append(f"{name} has no label {label!r} (has {sorted(SERIES[name])})")
            position = matcher.end()
    return problems


PROMQL_CHECKER_CASES = [
    pytest.param('sum(rate(a_total{x="(", y=~"$v"}[5m]))', True, {"sum", "rate"}, {"a_total"},
                 id="brackets in strings do not count"),
    pytest.param("sum by (le) (rate(b_bucket[$__rate_interval]))", True, {"sum", "rate"},
                 {"b_bucket"}, id="grouping labels are not series"),
    pytest.param("a / on (node, gpu) group_left b or vector(0)", True, {"vector"}, {"a", "b"},
                 id="binary operators and keywords"),
    pytest.param("histogram_quantile(0.99, sum(rate(c[1m]))", False, None, None,
                 id="unbalanced parenthesis"),
    pytest.param('a{x="unclosed}', False, None, None, id="unclosed string"),
]  # fmt: skip


@pytest.mark.parametrize(("expr", "ok", "functions", "series"), PROMQL_CHECKER_CASES)
def test_promql_checker(
    expr: str, ok: bool, functions: set[str] | None, series: set[str] | None
) -> None:
    assert balanced(expr) is ok
    if ok:
        assert names_in(expr) == (functions, series)


@pytest.mark.parametrize(
    ("expr", "problems"),
    [
        pytest.param('gpushare_gpu_pods{node=~"$node", gpu="0"}', [], id="known labels"),
        pytest.param(
            'gpushare_gpu_pods{unit="MiB"}',
            ["gpushare_gpu_pods has no label 'unit' (has ['gpu', 'model', 'node'])"],
            id="a label the series lacks",
        ),
        pytest.param(
            "gpushare_gpu_pods{node=n1}",
            ["gpushare_gpu_pods: bad matcher at 'node=n1'"],
            id="unquoted value",
        ),
    ],
)
def test_matcher_checker(expr: str, problems: list[str]) -> None:
    assert matcher_problems(expr) == problems


def test_the_registries_expose_what_the_dashboard_needs() -> None:
    for name in REQUIRED_SERIES:
        assert name in SERIES, name
    assert "pod" in SERIES["gpushare_gpu_process_memory_used_bytes"]


# -- the dashboard ------------------------------------------------------------------------------


def test_top_level() -> None:
    dashboard = load()
    assert isinstance(dashboard["title"], str)
    assert dashboard["title"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"])
    assert isinstance(dashboard["schemaVersion"], int)
    assert dashboard["schemaVersion"] >= 36
    assert dashboard.get("id") is None  # importable anywhere: Grafana assigns the id
    assert isinstance(dashboard["panels"], list)
    assert dashboard["panels"]
    assert isinstance(dashboard["templating"]["list"], list)
    assert set(dashboard["time"]) == {"from", "to"}
    assert all(isinstance(tag, str) for tag in dashboard["tags"])
    assert isinstance(dashboard["editable"], bool)


def variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert len(found) == len(dashboard["templating"]["list"]), "duplicate variable names"
    return found


def test_template_variables() -> None:
    dashboard = load()
    found = variables(dashboard)
    datasource = found["datasource"]
    assert datasource["type"] == "datasource"
    assert datasource["query"] == "prometheus"
    node = found["node"]
    assert node["type"] == "query"
    assert node["datasource"] == DATASOURCE
    assert node["multi"] is True
    assert node["includeAll"] is True
    match = re.fullmatch(r"label_values\((\w+), (\w+)\)", node["query"]["query"])
    assert match is not None
    assert match.group(1) in SERIES
    assert match.group(2) in SERIES[match.group(1)]
    assert node["definition"] == node["query"]["query"]


def test_panels_ids_types_and_grid() -> None:
    dashboard = load()
    panels = list(all_panels(dashboard))
    ids = [panel["id"] for panel in panels]
    assert all(isinstance(i, int) and i > 0 for i in ids)
    assert len(set(ids)) == len(ids), "panel ids must be unique"
    occupied: dict[tuple[int, int], int] = {}
    for panel in panels:
        assert panel["type"] in PANEL_TYPES, panel["type"]
        assert isinstance(panel["title"], str)
        assert panel["title"]
        grid = panel["gridPos"]
        assert set(grid) == {"h", "w", "x", "y"}
        assert all(isinstance(grid[k], int) for k in grid)
        assert grid["h"] >= 1
        assert 1 <= grid["w"] <= 24
        assert grid["x"] >= 0
        assert grid["y"] >= 0
        assert grid["x"] + grid["w"] <= 24, f"panel {panel['id']} past column 24"
        if panel["type"] == "row":
            assert (grid["h"], grid["w"], grid["x"]) == (1, 24, 0)
            assert panel["collapsed"] or panel["panels"] == []
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                other = occupied.setdefault((x, y), panel["id"])
                assert other == panel["id"], f"panels {other} and {panel['id']} overlap"


def test_targets() -> None:
    dashboard = load()
    for panel in all_panels(dashboard):
        if panel["type"] == "row":
            assert "targets" not in panel
            continue
        assert panel["datasource"] == DATASOURCE, panel["id"]
        targets = panel["targets"]
        assert targets, f"panel {panel['id']} has no targets"
        ref_ids = [target["refId"] for target in targets]
        assert len(set(ref_ids)) == len(ref_ids)
        for target in targets:
            assert target.get("datasource", DATASOURCE) == DATASOURCE
            assert isinstance(target["expr"], str)
            assert target["expr"].strip()


def test_queries_are_promql_over_exposed_series() -> None:
    dashboard = load()
    defined = set(variables(dashboard)) | GRAFANA_BUILTINS
    used: set[str] = set()
    for where, expr in queries(dashboard):
        assert balanced(expr), f"{where}: unbalanced: {expr}"
        for match in VARIABLE.finditer(expr):
            name = next(group for group in match.groups() if group)
            assert name in defined, f"{where}: undefined variable ${name}"
        functions, series = names_in(expr)
        assert functions <= PROMQL_FUNCTIONS, f"{where}: unknown {functions - PROMQL_FUNCTIONS}"
        assert series, f"{where}: no series in {expr}"
        unknown = series - set(SERIES)
        assert not unknown, f"{where}: {sorted(unknown)} are not exposed by gpushare"
        assert matcher_problems(expr) == [], where
        used |= series
    missing = set(REQUIRED_SERIES) - used
    assert not missing, f"no panel uses {sorted(missing)}"
