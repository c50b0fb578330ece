"""``gpushare simulate``: replay a trace through placement policies (the paper's experiment)."""

from __future__ import annotations

import importlib.util
import re
import time
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gpushare.core.policies import policy_names
from gpushare.sim.experiment import PAPER_SEEDS, RunResult, run_experiment
from gpushare.sim.report import summarise, summary_table, write_json
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
@click.option("--workload", default=None, help="pod list name, e.g. default, gpushare40.")
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
    "--jobs",
    type=click.IntRange(min=1),
    default=None,
    help="parallel processes (default: all cores).",
)
def simulate(
    *,
    trace_dir: Path | None,
    workload: str | None,
    policies: tuple[str, ...],
    seeds: tuple[int, ...] | None,
    out_dir: Path,
    tune_ratio: float,
    jobs: int | None,
) -> None:
    """Replay a GPU-sharing trace through placement policies and compare how many GPUs each one
    leaves unallocated (the FGD paper's experiment, Fig. 9a)."""
    console = Console()
    if not console.is_terminal:  # logs and pipes: wide enough for the table, no truncation
        console = Console(width=120)
    source = trace_dir or embedded_trace_dir()
    workload = workload or ("default" if trace_dir else EMBEDDED_WORKLOAD)
    try:
        trace = load_trace(source, workload)
    except TraceError as error:
        raise click.ClickException(str(error)) from None
    chosen = list(policies or policy_names())
    seeds = seeds or (PAPER_SEEDS if trace_dir else EMBEDDED_SEEDS)
    gpus = trace.gpu_capacity_milli / 1000
    label = f"{'embedded synthetic cluster' if trace_dir is None else source}: {workload}"
    console.print(
        f"[bold]{label}[/]: {len(trace.nodes)} nodes, {gpus:.0f} GPUs, {len(trace.pods)} pods; "
        f"{len(chosen)} policies × {len(seeds)} seeds, stream tuned to {tune_ratio:.0%} of capacity"
    )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise click.ClickException(f"cannot create --out {out_dir}: {error.strerror}") from None
    started = time.perf_counter()
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("simulating", total=len(chosen) * len(seeds))

        def done(result: RunResult) -> None:
            progress.update(task, advance=1, description=f"{result.policy} seed {result.seed}")

        results = run_experiment(
            trace.nodes, trace.pods, chosen, seeds, tune_ratio=tune_ratio, jobs=jobs, on_done=done
        )
    summaries = summarise(results)
    console.print(summary_table(summaries, f"{label}, seeds {seeds[0]}–{seeds[-1]}", gpus))
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
        },
    )
    from gpushare.sim.plot import plot_results  # noqa: PLC0415 (matplotlib: only when plotting)

    plot_results(out_dir / "unallocated.png", results, label)
    console.print(
        f"wrote {out_dir / 'results.json'} and {out_dir / 'unallocated.png'} "
        f"in {time.perf_counter() - started:.1f} s"
    )
