"""Every policy on every workload: the 100 % table and the 75–100 % curves (docs/simulator.md,
"Every policy, every workload (10 seeds)").

Run: ``.venv/bin/python bench/every_policy.py out/sweep*/*/results.json [--plot FILE]
[--highlight fgd-spare]``. Each ``results.json`` is one ``gpushare simulate --out
DIR/<workload>`` run; files in directories of the same name are one workload, so policies run
separately are merged (a policy run twice for a workload: the later file wins). The offline
references (best-fit-decreasing, the lower bound) come from whichever file of the workload has
them (``--reference``, the default of ``gpushare simulate``).

Prints a Markdown table: one row per workload, unallocated GPU % at 100 % arrived (mean over
seeds, ± sd for the highlighted policy), each policy's column in the order of its mean on the
``default`` workload, then the references; the best online policy of each row in bold. With
``--plot``, writes one panel per workload of unallocated GPU % against arrived % (75–100, the
paper's Fig. 9a range) for the highlighted policy, fgd, fgd-cpu, alibaba and bestfit (mean over
seeds); with ``--plot-difference``, one panel per workload of the seed-paired difference
highlighted − ``--baseline`` (mean, and a band of ± one sd: "behind" in bench/dominance.py is
the whole band above zero).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from dominance import mean_sd, paired  # bench/dominance.py: the same seed-paired differences

CURVES = ("fgd-spare", "fgd", "fgd-cpu", "alibaba", "bestfit")
LEVELS = range(75, 101)


def load(paths: list[Path]) -> dict[str, dict[str, Any]]:
    """workload → {"runs": {policy: {seed: run}}, "reference": dict | None}."""
    workloads: dict[str, dict[str, Any]] = {}
    for path in sorted(paths, key=lambda p: p.stat().st_mtime):
        document = json.loads(path.read_text())
        entry = workloads.setdefault(path.parent.name, {"runs": {}, "reference": None})
        for run in document["runs"]:
            entry["runs"].setdefault(run["policy"], {})[run["seed"]] = run
        if document.get("reference"):
            entry["reference"] = document["reference"]
    return workloads


def at(runs: dict[int, dict[str, Any]], level: int) -> list[float]:
    """Unallocated % at ``level`` % arrived, one value per seed."""
    return [float(run["unallocated_pct"][level]) for _, run in sorted(runs.items())]


def table(workloads: dict[str, dict[str, Any]], highlight: str) -> str:
    """The Markdown table (module doc)."""
    policies = sorted({p for w in workloads.values() for p in w["runs"]})
    default = workloads.get("default", next(iter(workloads.values())))

    def default_mean(policy: str) -> float:
        runs = default["runs"].get(policy)
        return statistics.fmean(at(runs, 100)) if runs else math.inf

    policies.sort(key=default_mean)
    head = ["workload", *[f"`{p}`" for p in policies], "BFD (offline)", "lower bound"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in sorted(workloads):
        runs = workloads[name]["runs"]
        means = {p: statistics.fmean(at(runs[p], 100)) for p in policies if p in runs}
        best = min(means.values())
        cells = [name]
        for policy in policies:
            if policy not in means:
                cells.append("")
                continue
            text = f"{means[policy]:.2f}"
            values = at(runs[policy], 100)
            if policy == highlight and len(values) > 1:
                text += f" ± {statistics.stdev(values):.2f}"
            cells.append(f"**{text}**" if means[policy] == best else text)
        reference = workloads[name]["reference"]
        for key in ("bfd_unallocated_pct", "bound_unallocated_pct"):
            cells.append(f"{reference[key]['mean']:.2f}" if reference else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(workloads: dict[str, dict[str, Any]], highlight: str, out: Path) -> None:
    """One panel per workload (module doc)."""
    names = sorted(workloads)
    columns = 4
    rows = math.ceil(len(names) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4 * columns, 2.8 * rows), squeeze=False)
    shown = (highlight, *[p for p in CURVES if p != highlight])
    for index, name in enumerate(names):
        ax = axes[index // columns][index % columns]
        runs = workloads[name]["runs"]
        for policy in shown:
            if policy not in runs:
                continue
            curve = [statistics.fmean(at(runs[policy], level)) for level in LEVELS]
            ax.plot(list(LEVELS), curve, label=policy, linewidth=2.2 if policy == highlight else 1)
        ax.set_title(name, fontsize=10)
        ax.set_xlim(75, 100)
        ax.grid(alpha=0.3)
        if index % columns == 0:
            ax.set_ylabel("unallocated GPU %")
    _finish(figure, axes, len(names), out)


def plot_difference(
    workloads: dict[str, dict[str, Any]], highlight: str, baseline: str, out: Path
) -> None:
    """One panel per workload: mean and ± sd of highlighted − baseline, paired by seed."""
    names = sorted(n for n in workloads if {highlight, baseline} <= set(workloads[n]["runs"]))
    columns = 4
    rows = math.ceil(len(names) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4 * columns, 2.4 * rows), squeeze=False)
    for index, name in enumerate(names):
        ax = axes[index // columns][index % columns]
        ours, base = workloads[name]["runs"][highlight], workloads[name]["runs"][baseline]
        seeds = sorted(set(ours) & set(base))
        means, sds = zip(*(mean_sd(paired(ours, base, level)) for level in LEVELS), strict=True)
        low = [m - sd for m, sd in zip(means, sds, strict=True)]
        high = [m + sd for m, sd in zip(means, sds, strict=True)]
        ax.fill_between(list(LEVELS), low, high, alpha=0.25, label="± 1 sd")
        ax.plot(list(LEVELS), means, linewidth=2, label=f"{highlight} − {baseline}, mean")
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_title(f"{name} ({len(seeds)} seeds)", fontsize=10)
        ax.set_xlim(75, 100)
        ax.grid(alpha=0.3)
        if index % columns == 0:
            ax.set_ylabel("difference, points")
    _finish(figure, axes, len(names), out)


def _finish(figure: Any, axes: Any, used: int, out: Path) -> None:
    """The legend of the first panel in the first unused one (else below), the axis label,
    the file."""
    handles, labels = axes[0][0].get_legend_handles_labels()
    rows, columns = len(axes), len(axes[0])
    for index in range(used, rows * columns):
        axes[index // columns][index % columns].axis("off")
    if used < rows * columns:
        axes[used // columns][used % columns].legend(handles, labels, loc="center")
    else:
        figure.legend(handles, labels, loc="lower right", ncol=len(labels))
    figure.supxlabel("arrived workload, % of GPU capacity (mean over seeds)")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=80)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--highlight", default="fgd-spare")
    parser.add_argument("--baseline", default="fgd")
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--plot-difference", type=Path)
    args = parser.parse_args()
    workloads = load(args.results)
    print(table(workloads, args.highlight))
    if args.plot is not None:
        plot(workloads, args.highlight, args.plot)
    if args.plot_difference is not None:
        plot_difference(workloads, args.highlight, args.baseline, args.plot_difference)


if __name__ == "__main__":
    main()
