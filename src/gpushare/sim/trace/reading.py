"""Reading a trace CSV file into string columns: text decoding, records, header and field counts."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import polars as pl

from gpushare.sim.trace.constants import MAX_REPORTED
from gpushare.sim.trace.errors import TraceError, TraceProblem, _Found
from gpushare.sim.trace.schema import _Schema


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
