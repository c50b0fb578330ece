"""``gpushare simulate``: seed parsing, a small end-to-end run on the embedded trace, and bad
input that exits non-zero with a message naming what is wrong (never a traceback)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from gpushare.cli.main import main
from gpushare.cli.simulate import parse_seeds
from gpushare.sim.trace import NODE_FILE, embedded_trace_dir

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
POD_FILE = "openb_pod_list_default.csv"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, ["simulate", *args])


# --- parse_seeds -----------------------------------------------------------------------------

GOOD_SEEDS = [
    ("one seed", "42", (42,)),
    ("inclusive range", "42-51", tuple(range(42, 52))),
    ("list", "42,43,47", (42, 43, 47)),
    ("spaces around items", " 42 , 43 ", (42, 43)),
    ("one-seed range", "42-42", (42,)),
    ("ranges and seeds mixed", "40-41,45", (40, 41, 45)),
    ("order kept", "47,42", (47, 42)),
    ("seed 0", "0", (0,)),
]


@pytest.mark.parametrize(
    ("text", "expected"), [c[1:] for c in GOOD_SEEDS], ids=[c[0] for c in GOOD_SEEDS]
)
def test_parse_seeds(text: str, expected: tuple[int, ...]) -> None:
    assert parse_seeds(text) == expected


BAD_SEEDS = [
    ("empty", "", "is not a seed"),
    ("word", "abc", "'abc' is not a seed"),
    ("negative", "-1", "'-1' is not a seed"),
    ("open range", "42-", "'42-' is not a seed"),
    ("decimal", "4.2", "'4.2' is not a seed"),
    ("empty list item", "42,,43", "'' is not a seed"),
    ("backwards range", "51-42", "seed range '51-42' runs backwards"),
    ("repeated seed", "42,42", "repeat a seed"),
    ("range overlapping a seed", "42-44,43", "repeat a seed"),
]


@pytest.mark.parametrize(
    ("text", "message"), [c[1:] for c in BAD_SEEDS], ids=[c[0] for c in BAD_SEEDS]
)
def test_parse_seeds_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"accepted: 42, 42-51|runs backwards|repeat") as raised:
        parse_seeds(text)
    assert message in str(raised.value)


# --- a small end-to-end run ------------------------------------------------------------------


def test_simulate_on_the_embedded_trace(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = invoke(
        "--policy", "fgd", "--policy", "bestfit", "--seeds", "42", "--jobs", "1", "--out", str(out)
    )
    assert result.exit_code == 0, result.output
    assert "fgd" in result.output
    assert "bestfit" in result.output
    assert "empty-cluster fragmentation" in result.output
    # one seed: the seed itself, no spread, no range
    assert "seed 42" in result.stdout
    assert "±" not in result.stdout
    assert "42–42" not in result.stdout
    # the failure column says it counts the whole 130 % stream
    assert "failed, whole stream" in result.stdout
    text = " ".join(result.stdout.split())  # the caption wraps
    assert "tuned to 130% of capacity (not only those arrived by 100%)" in text
    # CliRunner's output is not a terminal: one progress line per finished run, on stderr
    assert result.stderr.splitlines() == [
        line for line in result.stderr.splitlines() if line.startswith("simulate: ")
    ]
    assert "simulate: 1/3 runs done (fgd seed 42," in result.stderr
    assert "simulate: 2/3 runs done (bestfit seed 42," in result.stderr
    assert "runs done" not in result.stdout
    # the offline references close the table, and the column measures each policy against them
    assert "offline BFD" in result.stdout
    assert "lower bound" in result.stdout
    assert "above bound" in result.stdout
    assert "simulate: 3/3 runs done (offline reference seed 42)" in result.stderr

    document = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert document["workload"] == "default"
    assert document["seeds"] == [42]
    assert document["headline_arrived_pct"] == 100
    assert {s["policy"] for s in document["summaries"]} == {"fgd", "bestfit"}
    for summary in document["summaries"]:
        assert summary["seeds"] == [42]
        assert 0 <= summary["unallocated_pct"]["mean"] <= 100
        assert summary["unallocated_pct"]["sd"] == 0
        assert summary["unallocated_pct"]["count"] == 1
        assert summary["failed_pods_whole_stream"]["mean"] >= 0
    reference = document["reference"]
    assert reference["seeds"] == [42]
    [per_seed] = reference["per_seed"]
    assert per_seed["seed"] == 42
    assert per_seed["pods"] > 0
    bound, bfd = per_seed["bound_unallocated_pct"], per_seed["bfd_unallocated_pct"]
    assert 0 <= bound <= bfd <= 100
    assert reference["bound_unallocated_pct"]["mean"] == pytest.approx(bound, abs=1e-3)
    for summary in document["summaries"]:
        assert bound <= summary["unallocated_pct"]["mean"]  # no policy beats the bound
    runs = document["runs"]
    assert [(r["policy"], r["seed"]) for r in runs] == [("fgd", 42), ("bestfit", 42)]
    for run in runs:
        for curve in ("unallocated_pct", "frag_amount_pct", "frag_rate_pct"):
            assert len(run[curve]) == 131, curve
        assert 99 < run["unallocated_pct"][0] <= 100  # bin 0 holds arrivals up to 0.5%
        assert 0 < run["placed"] <= run["pods"]

    assert (out / "unallocated.png").read_bytes()[:8] == PNG_SIGNATURE


def test_several_seeds_show_mean_and_spread(tmp_path: Path) -> None:
    result = invoke(
        "--policy", "bestfit", "--seeds", "42-43", "--no-reference", "--jobs", "1",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "lower bound" not in result.stdout
    assert "reference" not in json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert "seeds 42–43" in result.stdout
    assert "±" in result.stdout
    assert "mean ± sd over seeds" in " ".join(result.stdout.split())
    assert "simulate: 2/2 runs done" in result.stderr


@pytest.mark.parametrize(
    ("flag", "label", "mode"),
    [
        pytest.param("--like-cluster", "like the cluster", "like-cluster", id="like the cluster"),
        pytest.param("--ideal", "ideal", "ideal", id="ideal"),
    ],
)
def test_the_mode_is_named_in_the_title_and_the_results(
    tmp_path: Path, flag: str, label: str, mode: str
) -> None:
    result = invoke(
        "--policy", "bestfit", "--seeds", "42", "--no-reference", "--jobs", "1", flag,
        "--out", str(tmp_path),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert text.count(f"default, {label}") >= 2, text  # the first line and the table's title
    assert json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))["mode"] == mode


# --- bad input -------------------------------------------------------------------------------


def trace_dir(tmp_path: Path, pod_rows: list[str], header: str = POD_HEADER) -> Path:
    """A trace directory with the embedded node list and a hand-written default pod list."""
    directory = tmp_path / "trace"
    directory.mkdir()
    shutil.copyfile(embedded_trace_dir() / NODE_FILE, directory / NODE_FILE)
    (directory / POD_FILE).write_text("\n".join([header, *pod_rows]) + "\n", encoding="utf-8")
    return directory


@dataclass(frozen=True)
class BadCase:
    id: str
    pod_rows: list[str]
    header: str
    expected: tuple[str, ...]  # each must appear in the output


BAD_TRACES = [
    BadCase(
        "unknown column",
        ["p0,4000,8192,1,500,red"],
        POD_HEADER + ",colour",
        (f"{POD_FILE}:1", "colour", "not a known column"),
    ),
    BadCase(
        "malformed row (too few fields)",
        ["p0,4000,8192,1,500", "p1,4000,8192,1"],
        POD_HEADER,
        (f"{POD_FILE}:3", "p1,4000,8192,1"),
    ),
    BadCase(
        "value out of range",
        ["p0,4000,8192,1,500", "p1,4000,8192,1,1200"],
        POD_HEADER,
        (f"{POD_FILE}:3", "gpu_milli", "'1200'", "from 0 to 1000"),
    ),
    BadCase(
        "not an integer",
        ["p0,4k,8192,1,500"],
        POD_HEADER,
        (f"{POD_FILE}:2", "cpu_milli", "'4k'"),
    ),
]


def assert_clean_failure(result: Result, expected: tuple[str, ...], code: int = 1) -> None:
    assert result.exit_code == code, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    for text in expected:
        assert text in result.output, f"{text!r} not in {result.output!r}"


@pytest.mark.parametrize("case", BAD_TRACES, ids=[c.id for c in BAD_TRACES])
def test_bad_trace_file_names_file_line_and_value(tmp_path: Path, case: BadCase) -> None:
    directory = trace_dir(tmp_path, case.pod_rows, case.header)
    out = tmp_path / "out"
    result = invoke("--trace", str(directory), "--seeds", "42", "--jobs", "1", "--out", str(out))
    assert_clean_failure(result, case.expected)
    assert not out.exists(), "nothing is written for a trace that does not load"


def test_missing_trace_directory(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-trace"
    result = invoke("--trace", str(missing), "--seeds", "42", "--out", str(tmp_path / "out"))
    assert_clean_failure(result, (str(missing), "does not exist"))


def test_unknown_workload_lists_the_available_ones(tmp_path: Path) -> None:
    result = invoke("--workload", "gpushare40", "--seeds", "42", "--out", str(tmp_path / "out"))
    assert_clean_failure(result, ("gpushare40", "openb_pod_list_gpushare40.csv", "default"))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--policy", "tetris"), ("--policy", "'tetris'", "fgd", "bestfit")),
        (("--seeds", "4x"), ("--seeds", "'4x' is not a seed")),
        (("--seeds", "51-42"), ("--seeds", "runs backwards")),
        (("--seeds", "42,42"), ("--seeds", "repeat a seed")),
        (("--jobs", "0"), ("--jobs",)),
        (("--tune-ratio", "0"), ("--tune-ratio",)),
    ],
    ids=[
        "unknown policy",
        "bad seeds",
        "backwards seed range",
        "repeated seeds",
        "zero jobs",
        "zero tune ratio",
    ],
)
def test_bad_option_is_a_usage_error(
    tmp_path: Path, args: tuple[str, ...], expected: tuple[str, ...]
) -> None:
    result = invoke(*args, "--out", str(tmp_path / "out"))
    assert_clean_failure(result, expected, code=2)
    assert not (tmp_path / "out").exists()
