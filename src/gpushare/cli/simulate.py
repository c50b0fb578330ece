"""``gpushare simulate``: replay a trace through placement policies (the paper's experiment)."""

from __future__ import annotations

import importlib.util
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gpushare.core.policies import policy_names
from gpushare.sim.experiment import PAPER_SEEDS, run_experiment, run_in_processes
from gpushare.sim.reference import Reference, reference_for_seed
from gpushare.sim.report import (
    ReferenceSummary,
    describe_seeds,
    summarise,
    summary_table,
    write_json,
)
from gpushare.sim.synthetic import SYNTHETIC_2D, synthetic_trace
from gpushare.sim.trace import EMBEDDED_WORKLOAD, TraceError, embedded_trace_dir, load_trace

# matplotlib is imported only when plotting (it is slow to import), but it is part of the
# ``sim`` extra like polars: a missing one fails here, when the subcommand is loaded, so that
# ``gpushare simulate`` names the extra to install before it runs for minutes.
if importlib.util.find_spec("matplotlib") is None:
    raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")

EMBEDDED_SEEDS = (42, 43, 44)
_SEED_RANGE = re.compile(r"^(\d+)-(\d+)$")


def parse_seeds(text: str) -> tuple[int, ...]:
    """``42-51`` (inclusive range), ``42,43,47`` (list) or ``42`` → seeds; ``ValueError`` else."""
    seeds: list[int] = []
    for raw in text.split(","):
        part = raw.strip()
        ranged = _SEED_RANGE.match(part)
        if ranged:
            low, high = int(ranged[1]), int(ranged[2])
            if high < low:
                raise ValueError(f"seed range {part!r} runs backwards")
            seeds.extend(range(low, high + 1))
        elif part.isdigit():
            seeds.append(int(part))
        else:
            raise ValueError(f"{part!r} is not a seed; accepted: 42, 42-51 or 42,43,47")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds {text!r} repeat a seed")
    return tuple(seeds)


def plural(count: int, one: str, many: str) -> str:
    """``1 seed``, ``3 seeds``."""
    return f"{count} {one if count == 1 else many}"


def progress_line(done: int, total: int, what: str, elapsed_s: float) -> str:
    """``simulate: 3/18 runs done (fgd seed 44, 4.2 s), 12 s elapsed``: the line written to
    stderr for each finished run when the output is not a terminal; ``what`` names the run."""
    return f"simulate: {done}/{total} runs done ({what}), {elapsed_s:.0f} s elapsed"


@contextmanager
def run_progress(console: Console, total: int, started: float) -> Iterator[Callable[[str], None]]:
    """The callback for each finished run, given a text naming it: a live bar on a terminal;
    elsewhere (a log, a pipe, ``make run > file``) one ``progress_line`` per run on stderr, so a
    long run is never silent."""
    if console.is_terminal:
        with Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task("simulating", total=total)

            def advance(what: str) -> None:
                progress.update(task, advance=1, description=what)

            yield advance
        return
    finished = 0

    def report(what: str) -> None:
        nonlocal finished
        finished += 1
        line = progress_line(finished, total, what, time.perf_counter() - started)
        click.echo(line, err=True)

    yield report


class SeedsType(click.ParamType[tuple[int, ...]]):
    """Click parameter type for ``parse_seeds``."""

    name = "SEEDS"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        try:
            return parse_seeds(str(value))
        except ValueError as error:
            self.fail(str(error), param, ctx)


@click.command()
@click.option(
    "--trace",
    "trace_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="openb trace directory (node list + pod lists). Default: the embedded synthetic cluster.",
)
@click.option(
    "--workload",
    default=None,
    help=f"pod list name, e.g. default, gpushare40; or {SYNTHETIC_2D}: generated pods that ask "
    "GPU memory and compute, on the trace's nodes (docs/simulator.md).",
)
@click.option(
    "--policy",
    "policies",
    multiple=True,
    type=click.Choice(policy_names()),
    help="policy to run (repeatable). Default: all.",
)
@click.option(
    "--seeds",
    type=SeedsType(),
    default=None,
    help="seeds, e.g. 42-51 or 42,43. Default: 42-51 (the paper's) with --trace, else 42-44.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("out/simulate"),
    show_default=True,
    help="where results.json and the plot go.",
)
@click.option(
    "--tune-ratio",
    type=click.FloatRange(min=0.1, max=10.0),
    default=1.3,
    show_default=True,
    help="tune the pod stream to this multiple of GPU capacity.",
)
@click.option(
    "--reference/--no-reference",
    default=True,
    show_default=True,
    help="also place each seed's pods up to 100% arrived offline (best-fit-decreasing) and "
    "compute a lower bound on unallocated GPU that no placement can beat (docs/simulator.md).",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=None,
    help="parallel processes (default: all cores).",
)
@click.option(
    "--like-cluster/--ideal",
    "like_cluster",
    default=False,
    show_default=True,
    help="place as kube-scheduler + gpushare extender would: pods that ask no GPU by "
    "kube-scheduler's own scores, only the nodes it passes on, M learned online "
    "(docs/simulator.md, 'Like the cluster'); --ideal: every pod by the policy (the paper's).",
)
def simulate(
    *,
    trace_dir: Path | None,
    workload: str | None,
    policies: tuple[str, ...],
    seeds: tuple[int, ...] | None,
    out_dir: Path,
    tune_ratio: float,
    reference: bool,
    jobs: int | None,
    like_cluster: bool,
) -> None:
    """Replay a GPU-sharing trace through placement policies and compare how many GPUs each one
    leaves unallocated (the FGD paper's experiment, Fig. 9a)."""
    console = Console()
    if not console.is_terminal:  # logs and pipes: wide enough for the table, no truncation
        console = Console(width=120)
    source = trace_dir or embedded_trace_dir()
    workload = workload or ("default" if trace_dir else EMBEDDED_WORKLOAD)
    try:
        trace = (
            synthetic_trace(source) if workload == SYNTHETIC_2D else load_trace(source, workload)
        )
    except TraceError as error:
        raise click.ClickException(str(error)) from None
    if reference and any(pod.two_dimensional for pod in trace.pods):
        # The offline references are one-dimensional (their bound splits pods into memory
        # pieces): for pods that ask compute or whole GPUs they would bound nothing
        # (``reference_for_seed`` gives NaN).
        console.print(f"{workload}: no offline reference (it bounds one dimension only)")
        reference = False
    chosen = list(policies or policy_names())
    seeds = seeds or (PAPER_SEEDS if trace_dir else EMBEDDED_SEEDS)
    gpus = trace.gpu_capacity_milli / 1000
    mode = "like the cluster" if like_cluster else "ideal"
    label = f"{'embedded synthetic cluster' if trace_dir is None else source}: {workload}, {mode}"
    console.print(
        f"[bold]{label}[/]: {len(trace.nodes)} nodes, {gpus:.0f} GPUs, {len(trace.pods)} pods; "
        f"{plural(len(chosen), 'policy', 'policies')} × {plural(len(seeds), 'seed', 'seeds')}, "
        f"stream tuned to {tune_ratio:.0%} of capacity"
    )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise click.ClickException(f"cannot create --out {out_dir}: {error.strerror}") from None
    started = time.perf_counter()
    total = len(chosen) * len(seeds) + (len(seeds) if reference else 0)
    references: list[Reference] = []
    with run_progress(console, total, started) as tick:
        results = run_experiment(
            trace.nodes,
            trace.pods,
            chosen,
            seeds,
            tune_ratio=tune_ratio,
            jobs=jobs,
            on_done=lambda r: tick(f"{r.policy} seed {r.seed}, {r.seconds:.1f} s"),
            like_cluster=like_cluster,
        )
        if reference:
            calls = [
                partial(reference_for_seed, trace.nodes, trace.pods, seed, tune_ratio=tune_ratio)
                for seed in seeds
            ]
            references = run_in_processes(
                calls, jobs=jobs, on_done=lambda r: tick(f"offline reference seed {r.seed}")
            )
    summaries = summarise(results)
    console.print(
        summary_table(
            summaries,
            f"{label}, {describe_seeds(seeds)}",
            gpus,
            tune_ratio,
            ReferenceSummary.of(references) if references else None,
        )
    )
    console.print(
        f"empty-cluster fragmentation: {summaries[0].empty_frag_amount_pct:.2f}% of capacity"
    )
    write_json(
        out_dir / "results.json",
        results,
        summaries,
        {
            "trace": str(source),
            "workload": workload,
            "nodes": len(trace.nodes),
            "gpus": gpus,
            "pods": len(trace.pods),
            "seeds": list(seeds),
            "tune_ratio": tune_ratio,
            "mode": "like-cluster" if like_cluster else "ideal",
        },
        references,
    )
    from gpushare.extender.scoring import DEFAULT_POLICY  # noqa: PLC0415 (only when plotting)
    from gpushare.sim.plot import plot_results  # noqa: PLC0415 (matplotlib: only when plotting)

    plot_results(out_dir / "unallocated.png", results, label, references, DEFAULT_POLICY)
    console.print(
        f"wrote {out_dir / 'results.json'} and {out_dir / 'unallocated.png'} "
        f"in {time.perf_counter() - started:.1f} s"
    )
