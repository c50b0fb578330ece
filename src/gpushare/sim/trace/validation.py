"""Row-level validation, vectorised with polars: names, integer columns and cross-column rules."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import polars as pl

from gpushare.sim.trace.constants import GPU_CAPACITY_MILLI, MAX_REPORTED
from gpushare.sim.trace.errors import TraceError, TraceProblem, _Found
from gpushare.sim.trace.reading import _read_table
from gpushare.sim.trace.schema import _IntColumn, _Schema

_INT_PATTERN: Final = r"^-?[0-9]+$"


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
