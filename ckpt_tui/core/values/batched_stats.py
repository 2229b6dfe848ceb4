"""Statistics of many small tensors at once: the figures :func:`~ckpt_tui.core.values.stats.tensor_stats` gives.

The views' values come a batch at a time from :class:`~ckpt_tui.core.values.batched_values.ViewPlan`; every
figure is then taken over all of them at once, and equals the per-tensor pass's bit for bit: counts,
zeros, min and max with ``np.*.reduceat`` over the views' bounds; sums and sums of squares with the same
BLAS dot products (stacked, one per view: :class:`_Sums`), squared deviations by the same rule as
:func:`~ckpt_tui.core.values.stats._finite_block`; the 24-bin histogram over each view's own [min, max] with the
same edges. A view holding a NaN or an Inf, one whose sums overflow, one of :data:`DOT_SEGMENT`
elements or more, or one whose range is too narrow or wide to split, is left out: the caller reads it
the exact way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ckpt_tui.core.model.tree import Tensor
from ckpt_tui.core.values.batched_values import Gathered, ViewPlan, view_rows
from ckpt_tui.core.values.stats import CANCELLATION_LIMIT, DOT_SEGMENT, HISTOGRAM_BINS, SAFE_SQUARES, TensorStats
from ckpt_tui.core.values.tensor_values import decode_compact

FIRST = 16
"""Values kept as each view's ``first`` (as the per-tensor pass keeps them)."""
EDGE_MARGIN = 1e-4
"""Values closer than this (in bins) to a bin's edge, by arithmetic, are checked against the edges."""
COARSE_RATIO = 1e6
"""Views whose magnitude exceeds their range this many times have every value checked against the edges
(below it, the edges' rounding stays under 1e-6 bins, and float32 arithmetic's under 1e-5: far inside
:data:`EDGE_MARGIN`)."""
TINY_STEP = 1e-30
"""Bins narrower than this (near float32's smallest normal numbers) are checked against the edges."""


def batched_stats(
    tensors: Sequence[Tensor], byteorder: str = "little", cancelled: Callable[[], bool] | None = None
) -> list[TensorStats | None]:
    """Each tensor's statistics, or None where the per-tensor pass must take it."""
    found = planned_stats(ViewPlan(tensors), range(len(tensors)), byteorder, cancelled)
    return [found.get(index) for index in range(len(tensors))]


def planned_stats(
    plan: ViewPlan, chosen: Iterable[int], byteorder: str = "little", cancelled: Callable[[], bool] | None = None
) -> dict[int, TensorStats]:
    """The statistics of the chosen views (indices into the planned tensors) answered here, read as one batch."""
    found: dict[int, TensorStats] = {}
    with np.errstate(all="ignore"):
        for dtype, gathered in plan.gather(list(chosen), byteorder, cancelled).items():
            for index, stats in zip(gathered.answered.tolist(), _views_stats(gathered, dtype), strict=True):
                if stats is not None:
                    found[index] = stats
    return found


def _views_stats(gathered: Gathered, dtype: str) -> list[TensorStats | None]:
    """The statistics of every gathered view (None for one the exact pass must take)."""
    compact = decode_compact(gathered.values, dtype)  # float32 where that holds the values exactly
    values = compact.astype(np.float64)
    bounds = gathered.bounds
    starts, counts = bounds[:-1], np.diff(bounds)
    sums = _Sums.of(values, bounds)
    clean = np.isfinite(sums.total) & np.isfinite(sums.sumsq) & (counts < DOT_SEGMENT)
    low = np.minimum.reduceat(compact, starts).astype(np.float64)
    high = np.maximum.reduceat(compact, starts).astype(np.float64)
    zeros = np.add.reduceat(compact == 0, starts)
    histograms, split = _histograms(compact, values, bounds, low, high, clean)
    clean &= split
    std = np.where(counts > 1, np.sqrt((0.0 + sums.m2) / np.maximum(counts - 1, 1)), 0.0)  # as stats.py takes them
    norm = np.sqrt(0.0 + sums.sumsq)
    absmax = np.maximum(np.abs(low), np.abs(high))
    # squares that overflow or underflow float64 are left to the per-tensor pass, which rescales them
    clean &= ((absmax >= SAFE_SQUARES[0]) & (absmax <= SAFE_SQUARES[1])) | (absmax == 0)
    columns = (counts, zeros, low, high, sums.mean, std, norm, absmax)
    rows = zip(
        clean.tolist(), *(column.tolist() for column in columns), histograms, _firsts(values, bounds), strict=True
    )
    # positional, in TensorStats' field order: count, finite, nan, posinf, neginf, zeros, min, max, mean, std,
    # norm, absmax, histogram, first, sampled (a field added there fails the tests, which compare every one)
    return [
        TensorStats(n, n, 0, 0, 0, z, lo, hi, mu, sd, l2, top, bins, first, n) if ok else None
        for ok, n, z, lo, hi, mu, sd, l2, top, bins, first in rows
    ]


@dataclass
class _Sums:
    """Per view: sum, mean, sum of squares and squared deviations, each the float the per-tensor pass gets.

    :func:`~ckpt_tui.core.values.stats._finite_block` takes a block's sums as BLAS dot products (of the values
    with ones, and with themselves); a stacked matmul of row vectors runs the same dot per row, so views
    of one length are summed together, bit for bit as one by one. Views of :data:`DOT_SEGMENT` elements
    or more (summed in segments there) are left to the per-tensor pass.
    """

    total: np.ndarray
    mean: np.ndarray
    sumsq: np.ndarray
    m2: np.ndarray

    @classmethod
    def of(cls, values: np.ndarray, bounds: np.ndarray) -> _Sums:
        """The sums of every view shorter than :data:`DOT_SEGMENT` (NaN for the others)."""
        lengths = np.diff(bounds)
        total, mean, sumsq, m2 = (np.full(lengths.size, np.nan) for _ in range(4))
        for length in np.unique(lengths[lengths < DOT_SEGMENT]).tolist():
            views = np.flatnonzero(lengths == length)
            rows = view_rows(values, bounds, views, length)
            total[views] = np.matmul(rows[:, None, :], np.ones((1, length, 1))).ravel()
            sumsq[views] = np.matmul(rows[:, None, :], rows[:, :, None]).ravel()
            part_mean = total[views] / length
            mean[views] = 0.0 + (part_mean - 0.0) * length / length  # as _Part.add takes the block in
            deviations = sumsq[views] - total[views] * part_mean
            exact = ~(np.isfinite(sumsq[views]) & (deviations > sumsq[views] * CANCELLATION_LIMIT))
            if exact.any():
                centred = rows[exact] - part_mean[exact, None]
                deviations[exact] = np.matmul(centred[:, None, :], centred[:, :, None]).ravel()
            m2[views] = deviations
        return cls(total, mean, sumsq, m2)


def _histograms(
    compact: np.ndarray, values: np.ndarray, bounds: np.ndarray, low: np.ndarray, high: np.ndarray, clean: np.ndarray
) -> tuple[list[list[int]], np.ndarray]:
    """Each view's counts in :data:`HISTOGRAM_BINS` equal bins over [min, max], as the per-tensor pass
    counts them (edges ``np.linspace(min, max)``, a value in the bin whose edges hold it, the last bin
    closed); one bin holding them all for a view of one value. ``split`` is False for a view whose range cannot be
    split (the exact pass answers it)."""
    views = low.size
    spread = clean & (low < high)
    step = (high - low) / HISTOGRAM_BINS  # linspace's step: edge i is i * step + low, the last one high
    candidates = np.flatnonzero(spread & np.isfinite(step) & (step != 0))
    edges = np.linspace(low[candidates], high[candidates], HISTOGRAM_BINS + 1, axis=1)
    widths = np.diff(edges, axis=1)
    binned = np.zeros(views, np.bool_)
    binned[candidates] = np.isfinite(widths).all(axis=1) & (widths > 0).all(axis=1)
    split = ~spread | binned
    counts = np.zeros((views, HISTOGRAM_BINS), np.int64)
    if binned.any():
        chosen = np.flatnonzero(binned)
        lengths = np.diff(bounds)
        keep = None if chosen.size == views else np.repeat(binned, lengths)
        lengths = lengths[chosen]
        binned_values = _Binned(
            compact if keep is None else compact[keep],
            values if keep is None else values[keep],
            np.repeat(chosen, lengths),
            lengths,
        )
        bins = _bins(binned_values, low[chosen], high[chosen], step[chosen])
        view = binned_values.view
        counts = np.bincount(view * HISTOGRAM_BINS + bins, minlength=views * HISTOGRAM_BINS).reshape(views, -1)
    listed = counts.tolist()
    single = np.diff(bounds).tolist()
    return [bins if on else [n] for bins, on, n in zip(listed, binned.tolist(), single, strict=True)], split


@dataclass
class _Binned:
    """The values being binned, in their compact and float64 forms, and the view each belongs to."""

    compact: np.ndarray
    exact: np.ndarray
    view: np.ndarray
    lengths: np.ndarray
    """Values of each view binned (the views in ``view``'s order)."""


def _bins(values: _Binned, low: np.ndarray, high: np.ndarray, step: np.ndarray) -> np.ndarray:
    """The bin of each value (``low``, ``high``, ``step``: per view binned), as a binary search over the edges
    finds it. Arithmetic in the compact type gives the bin (``x - low`` is one rounding: ``low`` is one
    of the values); a value within :data:`EDGE_MARGIN` of an edge by that arithmetic, or in a view whose
    edges round too coarsely for the margin to hold, is checked against the edges themselves."""
    kind = values.compact.dtype
    lows, steps = np.repeat(low.astype(kind), values.lengths), np.repeat(step.astype(kind), values.lengths)
    position = (values.compact - lows) / steps  # inf or NaN where the step underflows in the compact type
    floor = np.floor(position)
    fraction = position - floor
    doubtful = (fraction < EDGE_MARGIN) | (fraction > 1 - EDGE_MARGIN) | ~np.isfinite(position)
    floor = np.nan_to_num(floor, nan=0.0, posinf=HISTOGRAM_BINS - 1, neginf=0.0)
    bins = np.clip(floor, 0, HISTOGRAM_BINS - 1).astype(np.intp)  # a first guess inside the bins
    coarse = (np.abs(low) + np.abs(high) > COARSE_RATIO * (high - low)) | (step < TINY_STEP)
    if coarse.any():
        doubtful |= np.repeat(coarse, values.lengths)
    where = np.flatnonzero(doubtful)
    if where.size:
        rank = np.repeat(np.arange(values.lengths.size), values.lengths)[where]  # the view, among these
        bins[where] = _exact_bins(values.exact[where], low[rank], step[rank], bins[where])
    return bins


def _exact_bins(x: np.ndarray, low: np.ndarray, step: np.ndarray, bins: np.ndarray) -> np.ndarray:
    """Bins moved until each value lies between its bin's edges (computed as linspace computes them).

    Every guess is a bin (0 to HISTOGRAM_BINS - 1) and the edges rise, so each value is at most that
    many moves from its bin: the loop ends after at most HISTOGRAM_BINS passes.
    """
    for _ in range(HISTOGRAM_BINS):
        below = (x < bins * step + low) & (bins > 0)
        above = (x >= (bins + 1) * step + low) & (bins < HISTOGRAM_BINS - 1)
        if not (below.any() or above.any()):
            break
        bins -= below
        bins += above
    return bins


def _firsts(values: np.ndarray, bounds: np.ndarray) -> list[list[float]]:
    """Each view's first :data:`FIRST` values."""
    ends = bounds[1:] - 1
    picked = values[np.minimum(bounds[:-1, None] + np.arange(FIRST), ends[:, None])].tolist()
    short = np.flatnonzero(np.diff(bounds) < FIRST)
    for view, length in zip(short.tolist(), np.diff(bounds)[short].tolist(), strict=True):
        picked[view] = picked[view][:length]
    return picked
