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
    histogram: list[int] = field(default_factory=list)
    first: list[float] = field(default_factory=list)
    sampled: int = 0

    @property
    def inf(self) -> int:
        """Count of +inf and -inf."""
        return self.posinf + self.neginf


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
    mean = m2 = 0.0
    samples: list[np.ndarray] = []
    step = max(1, tensor.numel // SAMPLE_LIMIT)
    done = 0
    for raw in reader.chunks(chunk):
        if cancelled is not None and cancelled():
            raise Cancelled("stats cancelled")
        values = decode(raw, tensor.dtype, tensor.metadata)
        if not stats.first:
            stats.first = values[:16].tolist()
        stats.count += values.size
        nan = np.isnan(values)
        stats.nan += int(nan.sum())
        stats.posinf += int(np.isposinf(values).sum())
        stats.neginf += int(np.isneginf(values).sum())
        stats.zeros += int((values == 0).sum())
        finite = values[np.isfinite(values)]
        if finite.size:
            low, high = float(finite.min()), float(finite.max())
            stats.min = low if stats.min is None else min(stats.min, low)
            stats.max = high if stats.max is None else max(stats.max, high)
            chunk_mean = float(finite.mean())
            chunk_m2 = float(((finite - chunk_mean) ** 2).sum())
            total = stats.finite + finite.size
            delta = chunk_mean - mean
            mean += delta * finite.size / total
            m2 += chunk_m2 + delta * delta * stats.finite * finite.size / total
            stats.finite = total
            samples.append(finite[(-done) % step :: step])
        done += values.size
        if progress is not None:
            progress(done / max(1, tensor.numel))
    if stats.finite:
        stats.mean = mean
        stats.std = math.sqrt(m2 / (stats.finite - 1)) if stats.finite > 1 else 0.0
        stats.histogram, stats.sampled = _histogram(samples, stats.min, stats.max)
    return stats


def _histogram(samples: list[np.ndarray], low: float | None, high: float | None) -> tuple[list[int], int]:
    values = np.concatenate(samples) if samples else np.empty(0)
    if values.size == 0 or low is None or high is None:
        return [], 0
    edges = np.linspace(low, high, HISTOGRAM_BINS + 1) if low < high else None
    if edges is None or not np.all(np.isfinite(np.diff(edges))) or not np.all(np.diff(edges) > 0):
        return [int(values.size)], int(values.size)  # one value, or a range too narrow/wide to split
    counts, _ = np.histogram(values, bins=edges)
    return counts.tolist(), int(values.size)
