"""From a run's per-event series to the paper's curves against arrived workload.

Source: the artifact's ``experiments/analysis/merge_*_discrete.py`` (docs/simulator.md, "One
run", step 5):
arrived% = round(100 · arrived / capacity); each integer bin from 0 to ``max_percent`` averages
the events that fall in it; an empty bin uses the events of bins ±1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpushare.sim.engine import RunRecord

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Curves:
    """Per arrived-% bin (index = percent, 0..max): unallocated GPU % of capacity (idle GPU:
    ``bin_by_arrived``), fragmentation amount % of capacity, and fragmentation rate % of idle
    GPU."""

    unallocated_pct: FloatArray
    frag_amount_pct: FloatArray
    frag_rate_pct: FloatArray


def arrived_bins(arrived: npt.ArrayLike, capacity: float) -> npt.NDArray[np.int64]:
    """The arrived-% bin of each event: ``round(100 · arrived / capacity)`` (module doc);
    ``arrived`` cumulative GPU units, ``capacity`` the cluster's GPU total (both GPU units)."""
    return np.rint(100.0 * np.asarray(arrived, dtype=np.float64) / capacity).astype(np.int64)


def bin_by_arrived(record: RunRecord, capacity: float, max_percent: int = 130) -> Curves:
    """The run's curves (module doc). ``capacity`` is the cluster's GPU total in GPU units."""
    arrived_pct = arrived_bins(record.arrived, capacity)
    # Allocated GPU is capacity minus idle GPU (``gpu_idle``: with two dimensions, what is free
    # in both). With one dimension it is the placed request exactly (integer-valued floats), so
    # the curves are the paper's to the bit; with two, a GPU that pods asking opposite
    # dimensions share counts once, never above its capacity, so unallocated is never negative.
    alloc_pct = 100.0 * (capacity - record.idle) / capacity
    amount_pct = 100.0 * record.fragmentation / capacity
    with np.errstate(divide="ignore", invalid="ignore"):
        rate_pct = np.where(record.idle > 0, 100.0 * record.fragmentation / record.idle, 0.0)
    bins = max_percent + 1
    clipped = np.clip(arrived_pct, 0, bins)  # bin `bins` collects everything beyond the range
    counts = np.bincount(clipped, minlength=bins + 1)[:bins].astype(np.float64)

    def binned(values: FloatArray) -> FloatArray:
        sums = np.bincount(clipped, weights=values, minlength=bins + 1)[:bins]
        out = np.full(bins, np.nan)
        present = counts > 0
        out[present] = sums[present] / counts[present]
        for b in np.flatnonzero(~present).tolist():
            lo, hi = max(b - 1, 0), min(b + 1, bins - 1)
            n = counts[lo : hi + 1].sum()
            if n > 0:
                out[b] = sums[lo : hi + 1].sum() / n
        return out

    return Curves(
        unallocated_pct=100.0 - binned(alloc_pct),
        frag_amount_pct=binned(amount_pct),
        frag_rate_pct=binned(rate_pct),
    )
