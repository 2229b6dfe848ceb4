"""Tensor statistics: one chunked pass over the values, bounded memory, cancellable."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ckpt_tui.core.errors import Cancelled
from ckpt_tui.core.tree import Tensor
from ckpt_tui.core.values import CHUNK_ELEMENTS, TensorReader, decode

HISTOGRAM_BINS = 24
SAMPLE_LIMIT = 1 << 20


@dataclass
class TensorStats:
    """Statistics of one tensor's values (complex tensors: of their magnitudes)."""

    count: int = 0
    finite: int = 0
    nan: int = 0
    posinf: int = 0
    neginf: int = 0
    zeros: int = 0
    min: float | None = None
    max: float | None = None
    mean: float | None = None
    std: float | None = None
    norm: float | None = None
    """L2 norm of the finite values (sqrt of their sum of squares, in float64)."""
    absmax: float | None = None
    """Largest absolute finite value."""
    histogram: list[int] = field(default_factory=list)
    first: list[float] = field(default_factory=list)
    sampled: int = 0

    @property
    def inf(self) -> int:
        """Count of +inf and -inf."""
        return self.posinf + self.neginf

    @property
    def zero_fraction(self) -> float:
        """Fraction of the elements that are exactly zero (0.0 for an empty tensor)."""
        return self.zeros / self.count if self.count else 0.0


def tensor_stats(
    tensor: Tensor,
    byteorder: str = "little",
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[float], None] | None = None,
    chunk: int = CHUNK_ELEMENTS,
) -> TensorStats:
    """One pass over a tensor's values: min/max/mean/std of finite values, NaN/Inf/zero counts."""
    with np.errstate(all="ignore"):  # extreme values overflow to inf in the sums: reported, not warned
        return _tensor_stats(tensor, byteorder, cancelled, progress, chunk)


def _tensor_stats(
    tensor: Tensor,
    byteorder: str,
    cancelled: Callable[[], bool] | None,
    progress: Callable[[float], None] | None,
    chunk: int,
) -> TensorStats:
    reader = TensorReader(tensor, byteorder)
    stats = TensorStats()
    if not reader.in_order:
        stats.first = decode(reader.first(16), tensor.dtype, tensor.metadata).tolist()
    mean = m2 = sumsq = 0.0
    samples: list[tuple[np.ndarray, np.ndarray | int]] = []
    step = max(1, reader.distinct_count // SAMPLE_LIMIT)
    done = read = 0
    for raw, repeats in reader.distinct_chunks(chunk):  # a stored element repeated by the view: read once, counted
        if cancelled is not None and cancelled():
            raise Cancelled("stats cancelled")
        values = decode(raw, tensor.dtype, tensor.metadata)
        if reader.in_order and not stats.first:
            stats.first = values[:16].tolist()
        weights = repeats if isinstance(repeats, int) else repeats.astype(np.float64)
        stats.count += _total(values.size, weights)
        nan = np.isnan(values)
        stats.nan += _count(nan, weights)
        stats.posinf += _count(np.isposinf(values), weights)
        stats.neginf += _count(np.isneginf(values), weights)
        stats.zeros += _count(values == 0, weights)
        keep = np.isfinite(values)
        finite = values[keep]
        if finite.size:
            finite_weights = weights if isinstance(weights, int) else weights[keep]
            low, high = float(finite.min()), float(finite.max())
            stats.min = low if stats.min is None else min(stats.min, low)
            stats.max = high if stats.max is None else max(stats.max, high)
            size = _total(finite.size, finite_weights)
            if isinstance(finite_weights, int):
                chunk_mean = float(finite.mean())
                chunk_m2 = float(((finite - chunk_mean) ** 2).sum()) * finite_weights
                sumsq += float(np.dot(finite, finite)) * finite_weights
            else:
                chunk_mean = float(np.dot(finite_weights, finite) / size)
                chunk_m2 = float(np.dot(finite_weights, (finite - chunk_mean) ** 2))
                sumsq += float(np.dot(finite_weights, finite * finite))
            total = stats.finite + size
            delta = chunk_mean - mean
            mean += delta * size / total
            m2 += chunk_m2 + delta * delta * stats.finite * size / total
            stats.finite = total
            picked = slice((-read) % step, None, step)
            kept = finite_weights if isinstance(finite_weights, int) else finite_weights[picked].copy()
            samples.append((finite[picked].copy(), kept))  # a copy: a strided view would keep the whole chunk alive
        read += values.size
        done += _total(values.size, weights)
        if progress is not None:
            progress(done / max(1, tensor.numel))
    if stats.finite:
        stats.absmax = max(abs(stats.min), abs(stats.max)) if stats.min is not None and stats.max is not None else None
        stats.norm = math.sqrt(sumsq)
        stats.mean = mean
        stats.std = math.sqrt(m2 / (stats.finite - 1)) if stats.finite > 1 else 0.0
        stats.histogram, stats.sampled = _histogram(samples, stats.min, stats.max)
    return stats


def _total(size: int, weights: np.ndarray | int) -> int:
    """How many elements of the tensor a chunk of ``size`` stored elements stands for."""
    return size * weights if isinstance(weights, int) else round(float(weights.sum()))


def _count(mask: np.ndarray, weights: np.ndarray | int) -> int:
    """How many elements of the tensor the marked stored elements stand for."""
    if isinstance(weights, int):
        return int(mask.sum()) * weights
    return round(float(weights[mask].sum()))


def _histogram(
    samples: list[tuple[np.ndarray, np.ndarray | int]], low: float | None, high: float | None
) -> tuple[list[int], int]:
    """Counts in equal bins over [low, high] of the sampled values, each weighted by its repeats."""
    values = np.concatenate([v for v, _ in samples]) if samples else np.empty(0)
    if values.size == 0 or low is None or high is None:
        return [], 0
    repeats = {w for _, w in samples if isinstance(w, int)}
    uniform = len(repeats) == 1 and all(isinstance(w, int) for _, w in samples)
    weights = (
        None
        if uniform
        else np.concatenate([np.full(v.size, w, np.float64) if isinstance(w, int) else w for v, w in samples])
    )
    scale = repeats.pop() if uniform else 1
    total = values.size * scale if weights is None else round(float(weights.sum()))
    edges = np.linspace(low, high, HISTOGRAM_BINS + 1) if low < high else None
    if edges is None or not np.all(np.isfinite(np.diff(edges))) or not np.all(np.diff(edges) > 0):
        return [total], total  # one value, or a range too narrow/wide to split
    counts, _ = np.histogram(values, bins=edges, weights=weights)
    if weights is None:
        return [int(c) * scale for c in counts.tolist()], total
    return [round(float(c)) for c in counts], total
