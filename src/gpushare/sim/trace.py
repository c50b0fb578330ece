"""Load an openb trace (Alibaba cluster-trace-gpu-v2023) into core model objects.

A trace directory holds one node list, ``openb_node_list_gpu_node.csv``, and one or more pod lists,
``openb_pod_list_<workload>.csv`` (format: ``shared/traces/openb/README.md``). Units are the
trace's own: CPU in milli-cores, memory in MiB, GPU in milli-GPU (1000 = one whole GPU), so every
node's GPUs have ``capacity == 1000``.

Every column is read as text and validated here, vectorised with polars, so that each problem is
reported with its exact position: the file, the 1-based line number (the header is line 1), the
column, the value received and what is accepted, e.g.::

    openb_pod_list_default.csv:17: column gpu_milli: value '1200' is out of range;
    accepted: an integer from 0 to 1000

(one line in the message, wrapped here).

Errors: every user error (missing file or directory, unknown workload, bad header, malformed row,
value out of range, duplicate name, undecodable text) raises one ``TraceError``, a ``ValueError``
listing the first ``MAX_REPORTED`` problems in line order and how many there are in all; an
underlying ``OSError`` or ``UnicodeDecodeError`` is chained as its cause. Nothing else escapes for
bad input.

Pod columns beyond the five the simulator reads (``gpu_spec`` aside) — ``qos``, ``pod_phase`` and
the three time columns — are accepted and ignored (METHOD.md §10: time is not simulated).
Blank lines are skipped (they keep their line numbers). A file with a ``"`` anywhere is parsed
with the standard ``csv`` quoting rules; openb files have none and take the faster path.
"""

from __future__ import annotations

import csv
import importlib.resources
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import polars as pl

from gpushare.core.model import ContainerRequest, Gpu, Node, PodRequest

__all__ = [
    "EMBEDDED_TRACE_DIR",
    "EMBEDDED_WORKLOAD",
    "GPU_CAPACITY_MILLI",
    "MAX_GPUS_PER_NODE",
    "MAX_GPUS_PER_POD",
    "MAX_REPORTED",
    "NODE_FILE",
    "POD_FILE_PREFIX",
    "Trace",
    "TraceError",
    "TraceProblem",
    "available_workloads",
    "embedded_trace_dir",
    "load_embedded_trace",
    "load_nodes",
    "load_pods",
    "load_trace",
    "pod_file",
]

NODE_FILE: Final = "openb_node_list_gpu_node.csv"
"""File name of the node list in a trace directory."""
POD_FILE_PREFIX: Final = "openb_pod_list_"
"""Pod lists are named ``<POD_FILE_PREFIX><workload>.csv``."""
GPU_CAPACITY_MILLI: Final = 1000
"""Capacity of one trace GPU, in milli-GPU."""
MAX_GPUS_PER_NODE: Final = 64
"""Largest accepted ``gpu`` count of a node."""
MAX_GPUS_PER_POD: Final = 64
"""Largest accepted ``num_gpu`` of a pod (the openb data has at most 8)."""
MAX_REPORTED: Final = 5
"""How many problems one ``TraceError`` message lists (its ``total`` counts them all)."""
EMBEDDED_WORKLOAD: Final = "default"
"""Workload name of the synthetic trace shipped in the package."""

_INT_PATTERN: Final = r"^-?[0-9]+$"
_SHOWN_CHARS: Final = 80


@dataclass(frozen=True, slots=True)
class TraceProblem:
    """One thing wrong with a trace input, at a position.

    ``line`` is 1-based (header = 1) or ``None`` for a whole-file problem; ``column`` is the
    header name or ``None`` for a whole row or file; ``value`` is the text received (``None``
    when there is none); ``reason`` says what is wrong and ``accepted`` what would be valid.
    """

    line: int | None
    column: str | None
    value: str | None
    reason: str
    accepted: str | None = None

    def render(self, path: Path) -> str:
        """``<path>:<line>: column <c>: value '<v>' <reason>; accepted: <accepted>``."""
        where = f"{path}:{self.line}" if self.line is not None else f"{path}"
        parts = [where]
        if self.column is not None:
            parts.append(f"column {self.column}")
        text = self.reason
        if self.value is not None:
            shown = self.value
            if len(shown) > _SHOWN_CHARS:
                shown = shown[: _SHOWN_CHARS - 3] + "..."
            text = f"value {shown!r} {text}"
        if self.accepted is not None:
            text = f"{text}; accepted: {self.accepted}"
        parts.append(text)
        return ": ".join(parts)


class TraceError(ValueError):
    """A trace file or directory that cannot be loaded as given.

    ``path`` is the file (or directory) at fault; ``problems`` are the first ``MAX_REPORTED``
    problems in line order; ``total`` counts all problems found (>= ``len(problems)``). The
    message has one ``problem.render(path)`` line per problem, then ``... and N more`` if any.
    """

    def __init__(
        self, path: Path, problems: Sequence[TraceProblem], total: int | None = None
    ) -> None:
        self.path = path
        self.problems = tuple(problems)
        self.total = len(self.problems) if total is None else total
        lines = [problem.render(path) for problem in self.problems]
        if self.total > len(self.problems):
            lines.append(f"... and {self.total - len(self.problems)} more problems in {path}")
        super().__init__("\n".join(lines))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.problems, self.total))


@dataclass(frozen=True, slots=True)
class Trace:
    """A loaded trace: the cluster and one workload, in file order.

    ``nodes`` come from ``node_path``, ``pods`` from ``pod_path`` (workload ``workload``).
    """

    nodes: tuple[Node, ...]
    pods: tuple[PodRequest, ...]
    workload: str
    node_path: Path
    pod_path: Path

    @property
    def gpu_capacity_milli(self) -> int:
        """Sum of all GPU capacities, in milli-GPU (6,212,000 for the openb GPU nodes)."""
        return sum(gpu.capacity for node in self.nodes for gpu in node.gpus)

    @property
    def gpu_request_milli(self) -> int:
        """Sum of all pods' GPU requests, in milli-GPU (num_gpu × gpu_milli per pod)."""
        return sum(pod.gpu_total for pod in self.pods)


# --- schemas -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _IntColumn:
    name: str
    low: int
    high: int
    accepted: str


@dataclass(frozen=True, slots=True)
class _Schema:
    kind: str  # "node" / "pod", for messages
    required: tuple[str, ...]
    optional: tuple[str, ...]
    ints: tuple[_IntColumn, ...]

    def describe(self) -> str:
        text = ",".join(self.required)
        if self.optional:
            text += f" (optional: {','.join(self.optional)})"
        return text


_INT64_MAX: Final = 2**63 - 1

_NODE_SCHEMA: Final = _Schema(
    kind="node",
    required=("sn", "cpu_milli", "memory_mib", "gpu", "model"),
    optional=(),
    ints=(
        _IntColumn("cpu_milli", 0, _INT64_MAX, "a non-negative 64-bit integer (milli-CPU)"),
        _IntColumn("memory_mib", 0, _INT64_MAX, "a non-negative 64-bit integer (MiB)"),
        _IntColumn("gpu", 0, MAX_GPUS_PER_NODE, f"an integer from 0 to {MAX_GPUS_PER_NODE}"),
    ),
)

_POD_SCHEMA: Final = _Schema(
    kind="pod",
    required=("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"),
    optional=("gpu_spec", "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time"),
    ints=(
        _IntColumn("cpu_milli", 0, _INT64_MAX, "a non-negative 64-bit integer (milli-CPU)"),
        _IntColumn("memory_mib", 0, _INT64_MAX, "a non-negative 64-bit integer (MiB)"),
        _IntColumn("num_gpu", 0, MAX_GPUS_PER_POD, f"an integer from 0 to {MAX_GPUS_PER_POD}"),
        _IntColumn(
            "gpu_milli", 0, GPU_CAPACITY_MILLI, f"an integer from 0 to {GPU_CAPACITY_MILLI}"
        ),
    ),
)


# --- public loaders ------------------------------------------------------------------------


def load_nodes(path: Path) -> list[Node]:
    """The nodes of an openb node list (columns ``sn,cpu_milli,memory_mib,gpu,model``).

    Each row becomes ``Node(name=sn, gpus=(Gpu(i, model, 1000) for i < gpu), cpu_milli,
    memory_mib)``, in file order. Accepted: unique non-empty ``sn``; ``cpu_milli`` and
    ``memory_mib`` integers >= 0; ``gpu`` from 0 to ``MAX_GPUS_PER_NODE``; a non-empty ``model``
    without ``|`` when ``gpu > 0`` (a CPU-only node may leave it empty).
    Raises ``TraceError`` naming file, line, column and value for any bad input.
    """
    frame = _read_validated(path, _NODE_SCHEMA, _node_checks)
    gpus_by_shape: dict[tuple[str, int], tuple[Gpu, ...]] = {}
    nodes: list[Node] = []
    for name, cpu, memory, count, model in zip(
        frame["sn"].to_list(),
        frame["_v_cpu_milli"].to_list(),
        frame["_v_memory_mib"].to_list(),
        frame["_v_gpu"].to_list(),
        frame["model"].to_list(),
        strict=True,
    ):
        gpus = gpus_by_shape.get((model, count))
        if gpus is None:
            gpus = tuple(
                Gpu(index=i, model=model, capacity=GPU_CAPACITY_MILLI) for i in range(count)
            )
            gpus_by_shape[(model, count)] = gpus
        nodes.append(Node(name=name, gpus=gpus, cpu_milli=cpu, memory_mib=memory))
    return nodes


def load_pods(path: Path) -> list[PodRequest]:
    """The pods of an openb pod list, in file order, one container ``"main"`` each.

    Columns ``name,cpu_milli,memory_mib,num_gpu,gpu_milli`` are required; ``gpu_spec``, ``qos``,
    ``pod_phase``, ``creation_time``, ``deletion_time`` and ``scheduled_time`` are optional (a
    missing ``gpu_spec`` means any model; the others are ignored). Each row becomes
    ``PodRequest(key=name, containers=(ContainerRequest("main", gpu_share=gpu_milli,
    gpu_count=num_gpu, allowed_models=frozenset(gpu_spec.split("|")))), cpu_milli, memory_mib)``;
    a CPU-only pod has ``gpu_share == gpu_count == 0``.

    Accepted: unique non-empty ``name``; ``cpu_milli``/``memory_mib`` integers >= 0; ``num_gpu``
    from 0 to ``MAX_GPUS_PER_POD``; ``gpu_milli`` from 0 to 1000, with ``gpu_milli == 0`` exactly
    when ``num_gpu == 0`` and ``gpu_milli == 1000`` when ``num_gpu > 1``; ``gpu_spec`` empty or
    model names separated by ``|``. Raises ``TraceError`` for any bad input.
    """
    frame = _read_validated(path, _POD_SCHEMA, _pod_checks)
    containers: dict[tuple[int, int, str], ContainerRequest] = {}
    pods: list[PodRequest] = []
    for name, cpu, memory, count, share, spec in zip(
        frame["name"].to_list(),
        frame["_v_cpu_milli"].to_list(),
        frame["_v_memory_mib"].to_list(),
        frame["_v_num_gpu"].to_list(),
        frame["_v_gpu_milli"].to_list(),
        frame["gpu_spec"].to_list(),
        strict=True,
    ):
        container = containers.get((share, count, spec))
        if container is None:
            models = frozenset(spec.split("|")) if spec else frozenset[str]()
            container = ContainerRequest(
                name="main", gpu_share=share, gpu_count=count, allowed_models=models
            )
            containers[(share, count, spec)] = container
        pods.append(PodRequest(key=name, containers=(container,), cpu_milli=cpu, memory_mib=memory))
    return pods


def pod_file(trace_dir: Path, workload: str) -> Path:
    """The path of workload ``workload``'s pod list in ``trace_dir`` (whether or not it exists)."""
    return trace_dir / f"{POD_FILE_PREFIX}{workload}.csv"


def available_workloads(trace_dir: Path) -> list[str]:
    """Sorted workload names with a pod list in ``trace_dir`` (``default``, ``gpushare40``, ...).

    Raises ``TraceError`` when ``trace_dir`` does not exist or is not a directory.
    """
    _require_directory(trace_dir)
    try:
        entries = list(trace_dir.glob(f"{POD_FILE_PREFIX}*.csv"))
    except OSError as exc:
        raise TraceError(
            trace_dir, [TraceProblem(None, None, None, f"cannot be listed: {exc.strerror}")]
        ) from exc
    names = [p.name[len(POD_FILE_PREFIX) : -len(".csv")] for p in entries if p.is_file()]
    return sorted(name for name in names if name)


def load_trace(trace_dir: Path, workload: str) -> Trace:
    """Load ``<trace_dir>/openb_node_list_gpu_node.csv`` and ``openb_pod_list_<workload>.csv``.

    Raises ``TraceError`` when the directory or node list is missing, when ``workload`` has no
    pod list there (the message lists the available workloads), or for any bad row.
    """
    workloads = available_workloads(trace_dir)
    if workload not in workloads:
        accepted = "one of " + ", ".join(workloads) if workloads else "none: no pod lists here"
        raise TraceError(
            trace_dir,
            [
                TraceProblem(
                    None,
                    None,
                    None,
                    f"has no workload {workload!r} (no file {pod_file(trace_dir, workload).name})",
                    accepted,
                )
            ],
        )
    node_path = trace_dir / NODE_FILE
    pod_path = pod_file(trace_dir, workload)
    return Trace(
        nodes=tuple(load_nodes(node_path)),
        pods=tuple(load_pods(pod_path)),
        workload=workload,
        node_path=node_path,
        pod_path=pod_path,
    )


def embedded_trace_dir() -> Path:
    """The directory of the synthetic trace shipped in the package (``gpushare/sim/data``).

    It holds ``openb_node_list_gpu_node.csv`` and ``openb_pod_list_default.csv``, generated by
    ``bench/make_embedded_trace.py`` (no rows of the Alibaba trace). Raises ``RuntimeError`` if
    the package is installed somewhere that is not a plain directory (e.g. a zip file).
    """
    resource = importlib.resources.files("gpushare.sim").joinpath("data")
    if not isinstance(resource, Path):
        raise RuntimeError(f"gpushare.sim data is not a directory on disk: {resource}")
    return resource


EMBEDDED_TRACE_DIR: Final = embedded_trace_dir()
"""``embedded_trace_dir()``, resolved once at import."""


def load_embedded_trace() -> Trace:
    """The shipped synthetic trace: ``load_trace(embedded_trace_dir(), EMBEDDED_WORKLOAD)``."""
    return load_trace(embedded_trace_dir(), EMBEDDED_WORKLOAD)


# --- reading -------------------------------------------------------------------------------


def _require_directory(trace_dir: Path) -> None:
    if not trace_dir.exists():
        raise TraceError(
            trace_dir, [TraceProblem(None, None, None, "does not exist", "a trace directory")]
        )
    if not trace_dir.is_dir():
        raise TraceError(
            trace_dir, [TraceProblem(None, None, None, "is not a directory", "a trace directory")]
        )


def _read_text(path: Path, schema: _Schema) -> str:
    accepted = f"a CSV file of {schema.kind}s with the header {schema.describe()}"
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise TraceError(
            path, [TraceProblem(None, None, None, "does not exist", accepted)]
        ) from exc
    except IsADirectoryError as exc:
        raise TraceError(
            path, [TraceProblem(None, None, None, "is a directory", accepted)]
        ) from exc
    except OSError as exc:
        raise TraceError(
            path, [TraceProblem(None, None, None, f"cannot be read: {exc.strerror}", accepted)]
        ) from exc
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise TraceError(
            path,
            [
                TraceProblem(
                    line, None, None, f"has bytes that are not UTF-8 (byte {exc.start})", accepted
                )
            ],
        ) from exc


def _split_rows(text: str) -> pl.DataFrame:
    """Non-blank records as ``_line`` (1-based first line), ``_raw`` (text), ``_fields`` (list)."""
    if '"' not in text:
        lines = pl.Series("_raw", text.split("\n"), dtype=pl.String)
        return (
            pl.DataFrame([lines])
            .with_row_index("_line", offset=1)
            .with_columns(pl.col("_line").cast(pl.Int64), pl.col("_raw").str.strip_suffix("\r"))
            .filter(pl.col("_raw").str.strip_chars() != "")
            .with_columns(pl.col("_raw").str.split(",").alias("_fields"))
        )
    # Quoted fields: the csv module knows the quoting rules and where each record starts.
    physical = text.split("\n")
    starts: list[int] = []
    raws: list[str] = []
    fields: list[list[str]] = []
    reader = csv.reader(io.StringIO(text, newline=""))
    end = 0
    for record in reader:
        start, end = end + 1, reader.line_num
        if not record or (len(record) == 1 and not record[0].strip()):
            continue
        starts.append(start)
        raws.append("\n".join(physical[start - 1 : end]).rstrip("\r"))
        fields.append(record)
    return pl.DataFrame(
        {"_line": starts, "_raw": raws, "_fields": fields},
        schema={"_line": pl.Int64, "_raw": pl.String, "_fields": pl.List(pl.String)},
    )


def _read_table(path: Path, schema: _Schema) -> tuple[pl.DataFrame, list[_Found]]:
    """The rows of ``path`` as string columns named by its header, plus ``_line``; and the rows
    whose field count differs from the header's. Raises ``TraceError`` for file/header faults."""
    text = _read_text(path, schema)
    accepted_header = f"a header line {schema.describe()}, then one row per {schema.kind}"
    try:
        records = _split_rows(text)
    except csv.Error as exc:
        raise TraceError(
            path, [TraceProblem(None, None, None, f"is not valid CSV: {exc}", accepted_header)]
        ) from exc
    if records.height == 0:
        raise TraceError(path, [TraceProblem(1, None, None, "is empty", accepted_header)])

    header_line = int(records["_line"][0])
    header_raw = str(records["_raw"][0])
    header: list[str] = records["_fields"][0].to_list()
    _check_header(path, schema, header, header_line, header_raw)

    body = records.slice(1)
    if body.height == 0:
        raise TraceError(
            path,
            [
                TraceProblem(
                    header_line + 1,
                    None,
                    None,
                    f"no {schema.kind} rows after the header",
                    f"at least one {schema.kind} row",
                )
            ],
        )
    width = len(header)
    count = pl.col("_fields").list.len()
    ragged = body.filter(count != width).with_columns(count.alias("_count"))
    found: list[_Found] = []
    if ragged.height:
        found.append(
            _Found(
                ragged.height,
                [
                    TraceProblem(
                        int(row["_line"]),
                        None,
                        str(row["_raw"]),
                        _ragged_reason(header, int(row["_count"])),
                        f"{width} fields, as in the header {','.join(header)}",
                    )
                    for row in ragged.head(MAX_REPORTED).iter_rows(named=True)
                ],
                order=-1,
            )
        )
    table = body.filter(count == width).select(
        pl.col("_line"),
        *(pl.col("_fields").list.get(i).alias(name) for i, name in enumerate(header)),
    )
    for name in schema.optional:
        if name not in header:
            table = table.with_columns(pl.lit("", dtype=pl.String).alias(name))
    return table, found


def _ragged_reason(header: list[str], count: int) -> str:
    if count < len(header):
        return f"has {count} fields: missing {','.join(header[count:])}"
    return f"has {count} fields, {count - len(header)} more than the header's {len(header)}"


def _check_header(path: Path, schema: _Schema, header: list[str], line: int, raw: str) -> None:
    known = set(schema.required) | set(schema.optional)
    accepted = f"a header with the columns {schema.describe()}, each once"
    problems: list[TraceProblem] = []
    seen: set[str] = set()
    for name in header:
        if name not in known:
            problems.append(TraceProblem(line, name, name, "is not a known column", accepted))
        elif name in seen:
            problems.append(TraceProblem(line, name, name, "appears twice in the header", accepted))
        seen.add(name)
    problems.extend(
        TraceProblem(line, name, None, f"is missing from the header {raw!r}", accepted)
        for name in schema.required
        if name not in seen
    )
    if problems:
        raise TraceError(path, problems[:MAX_REPORTED], len(problems))


# --- validation ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Found:
    """Problems of one check: how many rows failed it, and the first ``MAX_REPORTED``."""

    total: int
    first: list[TraceProblem]
    order: int  # tie-break between checks failing on the same line


@dataclass(frozen=True, slots=True)
class _Check:
    """Rows where ``mask`` is true are problems on ``column``.

    ``reason`` may name fields of the row in braces (parsed integers are ``_v_<column>``,
    the first line of a duplicated name is ``_first``).
    """

    mask: pl.Expr
    column: str
    reason: str
    accepted: str


def _read_validated(
    path: Path, schema: _Schema, checks: Callable[[], list[_Check]]
) -> pl.DataFrame:
    """Read ``path``, parse its integer columns into ``_v_<name>`` and run ``checks``; raise one
    ``TraceError`` with the first problems in line order if anything failed."""
    table, found = _read_table(path, schema)
    first_line = pl.col("_line").min()
    name = schema.required[0]
    table = table.with_columns(first_line.over(name).alias("_first"))
    all_checks = [*_name_checks(name, schema.kind), *_int_checks(schema.ints), *checks()]
    table = table.with_columns(_parsed_ints(schema.ints))
    for order, check in enumerate(all_checks):
        bad = table.filter(check.mask)
        if bad.height:
            first = [
                TraceProblem(
                    int(row["_line"]),
                    check.column,
                    str(row[check.column]),
                    check.reason.format(**row),
                    check.accepted,
                )
                for row in bad.head(MAX_REPORTED).iter_rows(named=True)
            ]
            found.append(_Found(bad.height, first, order))
    total = sum(f.total for f in found)
    if total:
        ranked = sorted(
            ((p.line or 0, f.order, i, p) for f in found for i, p in enumerate(f.first)),
            key=lambda item: item[:3],
        )
        raise TraceError(path, [item[3] for item in ranked[:MAX_REPORTED]], total)
    return table


def _int_value(col: _IntColumn) -> tuple[pl.Expr, pl.Expr, pl.Expr]:
    """``(is an integer, its Int64 value or null, within range)`` for column ``col``."""
    text = pl.col(col.name)
    is_int = text.str.contains(_INT_PATTERN)
    value = text.cast(pl.Int64, strict=False)
    in_range = (is_int & value.is_not_null() & value.is_between(col.low, col.high)).fill_null(False)
    return is_int, value, in_range


def _parsed_ints(columns: Sequence[_IntColumn]) -> list[pl.Expr]:
    """``_v_<name>``: each integer column as Int64, null where it is not a valid value."""
    exprs = []
    for col in columns:
        _, value, in_range = _int_value(col)
        exprs.append(pl.when(in_range).then(value).otherwise(None).alias(f"_v_{col.name}"))
    return exprs


def _int_checks(columns: Sequence[_IntColumn]) -> list[_Check]:
    checks = []
    for col in columns:
        is_int, _, in_range = _int_value(col)
        checks.append(_Check(~is_int, col.name, "is not an integer", col.accepted))
        checks.append(_Check(is_int & ~in_range, col.name, "is out of range", col.accepted))
    return checks


def _name_checks(column: str, kind: str) -> list[_Check]:
    name = pl.col(column)
    return [
        _Check(name == "", column, "is empty", f"a non-empty {kind} name"),
        _Check(
            (name != "") & (pl.col("_line") != pl.col("_first")),
            column,
            "repeats the name on line {_first}",
            f"a {kind} name used once in the file",
        ),
    ]


def _node_checks() -> list[_Check]:
    gpu = pl.col("_v_gpu")
    model = pl.col("model")
    return [
        _Check(
            (model == "") & (gpu > 0),
            "model",
            "is empty while gpu is {_v_gpu}",
            "a GPU model name when gpu > 0",
        ),
        _Check(
            model.str.contains("|", literal=True),
            "model",
            "contains '|'",
            "a model name without '|' (it separates models in a pod's gpu_spec)",
        ),
    ]


def _pod_checks() -> list[_Check]:
    count = pl.col("_v_num_gpu")
    milli = pl.col("_v_gpu_milli")
    return [
        _Check(
            (count > 0) & (milli == 0),
            "gpu_milli",
            "is 0 while num_gpu is {_v_num_gpu}",
            f"an integer from 1 to {GPU_CAPACITY_MILLI} when num_gpu > 0",
        ),
        _Check(
            (count > 1) & (milli > 0) & (milli < GPU_CAPACITY_MILLI),
            "gpu_milli",
            "is below 1000 while num_gpu is {_v_num_gpu}",
            "1000 when num_gpu > 1 (only a single-GPU pod may take a GPU share)",
        ),
        _Check(
            (count == 0) & (milli > 0),
            "gpu_milli",
            "is not 0 while num_gpu is 0",
            "0 when num_gpu is 0 (a CPU-only pod)",
        ),
        _Check(
            pl.col("gpu_spec").str.contains(r"^\||\|\||\|$"),
            "gpu_spec",
            "has an empty model name",
            "GPU model names separated by '|', or empty for any model",
        ),
    ]
