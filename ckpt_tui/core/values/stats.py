"""Tensor statistics: one chunked pass over the values, bounded memory, cancellable.

Chunks are read in order by the calling thread and summarised on worker threads (numpy releases the
GIL); the partial results are combined in chunk order (Chan's parallel variance formula), so every
figure is the same on any machine. An all-finite block, the usual case, costs a few vectorised sweeps:
min, max and zeros in the stored precision (exact), sum and squared deviations in float64.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from ckpt_tui.core.errors import Cancelled
from ckpt_tui.core.model.tree import Tensor
from ckpt_tui.core.values.tensor_values import RING_CHUNK, TensorReader, decode, decode_compact, nan_beside_inf

STATS_CHUNK = RING_CHUNK
"""Elements summarised at once (see :data:`~ckpt_tui.core.values.tensor_values.RING_CHUNK`)."""

_T = TypeVar("_T")

HISTOGRAM_BINS = 24
SAMPLE_LIMIT = 1 << 20
BINARY_SEARCH_LIMIT = 1 << 12
"""Histograms of at most this many sampled values find their bins by binary search, larger ones by arithmetic."""
STATS_THREADS = 2
"""Worker threads summarising chunks; at most this many chunks wait besides the one being read."""
POOL_PREFIX = "ckpt-tui-stats"
BLOCK_ELEMENTS = 1 << 16
"""Values swept together inside a chunk: their float64 copies (two of 512 kB for a pair) stay in the CPU's L2
cache with room for the values streaming in (at 1 << 17 two copies filled a 2 MB L2: 15% slower here)."""
DOT_SEGMENT = 8192
"""OpenBLAS runs a dot product over more than 10,000 elements on its own threads, which then fight the
stats workers for the cores (5x slower on 2 cores): dot products are taken in segments below that."""
CANCELLATION_LIMIT = 1e-3
"""Squared deviations are taken as sum(x^2) - n*mean^2 while that keeps at least this share of sum(x^2)
(at most 3 of float64's 16 digits lost); below it, as sum((x - mean)^2)."""


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
    chunk: int = STATS_CHUNK,
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
    step = max(1, reader.distinct_count // SAMPLE_LIMIT)
    whole = _Part()
    samples: list[tuple[np.ndarray, np.ndarray | int]] = []

    def settle(part: _Part) -> None:
        whole.add(part)
        if part.samples is not None:
            samples.append(part.samples)
        if progress is not None:
            progress(whole.count / max(1, tensor.numel))

    # one chunk is summarised here, with no hand-over; so is every chunk on one of the pool's own threads
    # (work it handed to its own pool could wait for itself)
    pool = worker_pool() if reader.distinct_count > chunk else None

    def numbered() -> Iterator[tuple[np.ndarray, int | np.ndarray, Tensor, int, int]]:
        # a stored element repeated by the view is read once, counted; every part's samples and first values are
        # copies, so a reused buffer is safe
        read = 0
        for raw, repeats in reader.distinct_chunks(chunk, STATS_THREADS + 1 if pool is not None else 0):
            yield raw, repeats, tensor, read, step
            read += raw.size

    work = _quiet_chunk_part if pool is not None else _chunk_part
    in_chunk_order(numbered(), work, settle, pool, cancelled, "stats cancelled")
    if reader.in_order:
        stats.first = whole.first
    stats.count, stats.nan, stats.posinf, stats.neginf = whole.count, whole.nan, whole.posinf, whole.neginf
    stats.zeros, stats.finite = whole.zeros, whole.finite
    if stats.finite and whole.low is not None and whole.high is not None:
        stats.min, stats.max = whole.low, whole.high
        stats.absmax = max(abs(whole.low), abs(whole.high))
        stats.norm = math.sqrt(whole.sumsq)
        stats.mean = whole.mean
        stats.std = math.sqrt(whole.m2 / (stats.finite - 1)) if stats.finite > 1 else 0.0
        stats.histogram, stats.sampled = _histogram(samples, stats.min, stats.max)
        if not SAFE_SQUARES[0] <= stats.absmax <= SAFE_SQUARES[1] and stats.absmax:
            stats.mean, stats.std, stats.norm = _rescaled_moments(tensor, byteorder, stats.absmax, chunk)
            if stats.min == stats.max:
                # one value throughout: its mean is it, its spread 0 (not the rounding of a sum of them)
                stats.mean, stats.std = stats.min, 0.0
    return stats


SAFE_SQUARES = (2.0**-450, 2.0**450)
"""Largest |x| whose squares the float64 sums hold without overflow or underflow, over any count of values
(past it, the mean, std and norm are taken again from the values scaled by a power of two, as
torch.linalg.vector_norm scales)."""


def _rescaled_moments(tensor: Tensor, byteorder: str, absmax: float, chunk: int) -> tuple[float, float, float]:
    """Mean, std and L2 norm of the finite values, read again divided by the power of two nearest ``absmax``
    (exact: a power of two only moves the exponent), so no square overflows or underflows."""
    scale = math.ldexp(1.0, math.frexp(absmax)[1] - 1)  # |x| / scale < 2; 2**1024 is past float64
    whole = _Part()
    with np.errstate(all="ignore"):
        for raw, repeats in TensorReader(tensor, byteorder).distinct_chunks(chunk, 0):
            values = decode(raw, tensor.dtype, tensor.metadata) / scale
            counted = repeats if isinstance(repeats, np.ndarray) else np.full(values.size, repeats)
            weights = counted.astype(np.float64)
            whole.add(_weighted_part(values, weights, 1, max(1, values.size)))
    std = math.sqrt(whole.m2 / (whole.finite - 1)) if whole.finite > 1 else 0.0
    return whole.mean * scale, std * scale, math.sqrt(whole.sumsq) * scale


@dataclass
class _Part:
    """Statistics of a run of stored elements, each counted as often as the view repeats it."""

    count: int = 0
    nan: int = 0
    posinf: int = 0
    neginf: int = 0
    zeros: int = 0
    finite: int = 0
    low: float | None = None
    high: float | None = None
    mean: float = 0.0
    m2: float = 0.0
    """Sum of squared deviations from ``mean`` of the finite values."""
    sumsq: float = 0.0
    samples: tuple[np.ndarray, np.ndarray | int] | None = None
    first: list[float] = field(default_factory=list)

    def add(self, other: _Part) -> None:
        """Take in the statistics of the run that follows this one (Chan et al.'s pairwise update)."""
        self.count += other.count
        self.nan += other.nan
        self.posinf += other.posinf
        self.neginf += other.neginf
        self.zeros += other.zeros
        if not self.first:
            self.first = other.first
        if not other.finite or other.low is None or other.high is None:
            return
        self.low = other.low if self.low is None else min(self.low, other.low)
        self.high = other.high if self.high is None else max(self.high, other.high)
        total = self.finite + other.finite
        delta = other.mean - self.mean
        self.mean += delta * other.finite / total
        self.m2 += other.m2 + delta * delta * self.finite * other.finite / total
        self.sumsq += other.sumsq
        self.finite = total

    def repeated(self, times: int) -> _Part:
        """These statistics with every element counted ``times`` times."""
        if times != 1:
            for name in ("count", "nan", "posinf", "neginf", "zeros", "finite"):
                setattr(self, name, getattr(self, name) * times)
            self.m2 *= times
            self.sumsq *= times
        return self


_local = threading.local()
_pool_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


def worker_pool() -> ThreadPoolExecutor | None:
    """The worker threads shared by every statistics pass (started on first use): :data:`STATS_THREADS` of them;
    None on one of them (work handed to the pool from its own workers could wait for itself)."""
    if threading.current_thread().name.startswith(POOL_PREFIX):
        return None
    return _pool()


def in_chunk_order(
    chunks: Iterable[tuple[Any, ...]],
    work: Callable[..., _T],
    settle: Callable[[_T], None],
    pool: ThreadPoolExecutor | None,
    cancelled: Callable[[], bool] | None,
    message: str,
    ahead: int = STATS_THREADS,
) -> None:
    """``settle(work(*args))`` for each chunk's args, in chunk order: on ``pool`` while the next chunks are read (at
    most ``ahead`` waiting besides the one being read), or here when it is None. The chunk iterator may reuse the
    buffers of chunk k - ahead - 1 for chunk k: that one is settled by then. (Chunks whose work reads its own
    values may run further ahead: a thread done before the oldest chunk takes the next one instead of waiting.)"""
    pending: deque[Future[_T]] = deque()
    try:
        for args in chunks:
            if cancelled is not None and cancelled():
                raise Cancelled(message)
            if pool is not None:
                pending.append(pool.submit(work, *args))
                while len(pending) > ahead:
                    settle(pending.popleft().result())
            else:
                settle(work(*args))
        while pending:
            settle(pending.popleft().result())
    finally:  # on cancellation: no worker may still read a buffer that the next reads reuse
        for waiting in pending:
            waiting.cancel()
        futures_wait(pending)


def _pool() -> ThreadPoolExecutor:
    """The worker threads shared by every statistics pass (started on first use)."""
    global _executor
    with _pool_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(STATS_THREADS, thread_name_prefix=POOL_PREFIX)
        return _executor


def _ones(size: int) -> np.ndarray:
    """A read-only vector of ``size`` ones (at most BLOCK_ELEMENTS), shared by every thread."""
    global _ones_block
    if _ones_block is None or _ones_block.size < size:
        ones = np.ones(max(size, BLOCK_ELEMENTS))
        ones.flags.writeable = False
        _ones_block = ones
    return _ones_block[:size]


_ones_block: np.ndarray | None = None


def _scratch() -> np.ndarray:
    """This thread's float64 buffer for one block."""
    buffer: np.ndarray | None = getattr(_local, "scratch", None)
    if buffer is None:
        buffer = _local.scratch = np.empty(BLOCK_ELEMENTS, np.float64)
    return buffer


def _quiet_chunk_part(raw: np.ndarray, repeats: int | np.ndarray, tensor: Tensor, read: int, step: int) -> _Part:
    """:func:`_chunk_part` on a worker thread (numpy's error state is per thread)."""
    with np.errstate(all="ignore"):  # extreme values overflow to inf in the sums: reported, not warned
        return _chunk_part(raw, repeats, tensor, read, step)


def _chunk_part(raw: np.ndarray, repeats: int | np.ndarray, tensor: Tensor, read: int, step: int) -> _Part:
    """Statistics of one chunk of stored elements; ``read``: how many were read before it (for sampling)."""
    if not isinstance(repeats, int):
        weights = repeats.astype(np.float64)
        weighted = _weighted_part(decode(raw, tensor.dtype, tensor.metadata), weights, read, step)
        return _nan_beside_inf(weighted, raw, tensor.dtype, weights)
    values = decode_compact(raw, tensor.dtype, tensor.metadata)
    part = _Part(first=values[:16].astype(np.float64).tolist() if read == 0 else [])
    scratch = _scratch()
    all_finite = True
    for begin in range(0, values.size, BLOCK_ELEMENTS):
        block = values[begin : begin + BLOCK_ELEMENTS]
        summary = _finite_block(block, scratch)
        if summary is None:
            all_finite = False
            summary = _masked_block(block.astype(np.float64, copy=False))
        part.add(summary)
    finite = values if all_finite else values[np.isfinite(values)]
    if finite.size:
        picked = finite[(-read) % step :: step].astype(np.float64)  # a copy: a view would keep the chunk
        part.samples = (picked, repeats)
    return _nan_beside_inf(part, raw, tensor.dtype).repeated(repeats)


def _nan_beside_inf(part: _Part, raw: np.ndarray, dtype: str, weights: np.ndarray | None = None) -> _Part:
    """``part`` with its complex elements whose one part is Inf and the other NaN counted as NaN too, as torch's
    isnan counts them (their magnitude, Inf, is counted as such already)."""
    if not part.posinf:
        return part
    beside = nan_beside_inf(raw, dtype)
    if beside is not None:
        part.nan += int(np.count_nonzero(beside)) if weights is None else _count(beside, weights)
    return part


def _finite_block(block: np.ndarray, scratch: np.ndarray) -> _Part | None:
    """Statistics of a block whose values are all finite; None when one is not (its float64 sum is not).

    Sum and sum of squares come from two dot products; the squared deviations are their difference,
    unless the mean dwarfs the spread (cancellation would cost digits): then they are taken exactly.
    """
    size = block.size
    wide = scratch[:size]
    np.copyto(wide, block)
    total = segmented_dot(wide, _ones(size))
    if not math.isfinite(total):
        return None
    low, high = float(block.min()), float(block.max())
    zeros = int(np.count_nonzero(block == 0)) if low <= 0.0 <= high else 0
    mean = total / size
    sumsq = segmented_dot(wide, wide)
    m2 = sumsq - total * mean
    if not (math.isfinite(sumsq) and m2 > sumsq * CANCELLATION_LIMIT):
        wide -= mean
        m2 = segmented_dot(wide, wide)
    return _Part(size, 0, 0, 0, zeros, size, low, high, mean, m2, sumsq)


def _masked_block(values: np.ndarray) -> _Part:
    """Statistics of a float64 block holding NaN or Inf (or finite values whose sum overflows)."""
    part = _Part(count=values.size)
    part.nan = int(np.count_nonzero(np.isnan(values)))
    part.posinf = int(np.count_nonzero(np.isposinf(values)))
    part.neginf = int(np.count_nonzero(np.isneginf(values)))
    part.zeros = int(np.count_nonzero(values == 0))
    finite = values[np.isfinite(values)]
    if finite.size:
        part.finite = finite.size
        part.low, part.high = float(finite.min()), float(finite.max())
        part.mean = float(finite.mean())
        part.m2 = float(((finite - part.mean) ** 2).sum())
        part.sumsq = segmented_dot(finite, finite)
    return part


def _weighted_part(values: np.ndarray, weights: np.ndarray, read: int, step: int) -> _Part:
    """Statistics of stored elements that the view repeats a different number of times each."""
    part = _Part(count=_total(values.size, weights), first=values[:16].tolist() if read == 0 else [])
    part.nan = _count(np.isnan(values), weights)
    part.posinf = _count(np.isposinf(values), weights)
    part.neginf = _count(np.isneginf(values), weights)
    part.zeros = _count(values == 0, weights)
    keep = np.isfinite(values)
    finite = values[keep]
    if finite.size:
        finite_weights = weights[keep]
        part.low, part.high = float(finite.min()), float(finite.max())
        part.finite = _total(finite.size, finite_weights)
        part.mean = segmented_dot(finite_weights, finite) / part.finite
        part.m2 = segmented_dot(finite_weights, (finite - part.mean) ** 2)
        part.sumsq = segmented_dot(finite_weights, finite * finite)
        picked = slice((-read) % step, None, step)
        part.samples = (finite[picked].copy(), finite_weights[picked].copy())
    return part


def segmented_dot(a: np.ndarray, b: np.ndarray) -> float:
    """The dot product of two float64 vectors, on this thread: one BLAS dot per DOT_SEGMENT, in one call."""
    whole = a.size - a.size % DOT_SEGMENT
    total = 0.0
    if whole:
        rows_a, rows_b = a[:whole].reshape(-1, 1, DOT_SEGMENT), b[:whole].reshape(-1, DOT_SEGMENT, 1)
        total = float(np.matmul(rows_a, rows_b).sum())
    return total + float(np.dot(a[whole:], b[whole:]))


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
    weights, scale = _sample_weights(samples)
    total = values.size * scale if weights is None else round(float(weights.sum()))
    if not low < high:
        return [total], total  # one value
    edges = np.linspace(low, high, HISTOGRAM_BINS + 1)
    widths = np.diff(edges)
    if not (np.isfinite(widths).all() and (widths > 0).all()):
        return [total], total  # a range too narrow/wide to split
    counts = _bin_counts(values, edges, weights)
    if weights is None:
        return [int(c) * scale for c in counts.tolist()], total
    return [round(float(c)) for c in counts], total


def _sample_weights(samples: list[tuple[np.ndarray, np.ndarray | int]]) -> tuple[np.ndarray | None, int]:
    """Each sampled value's weight (its repeats): None and the one count when every sample repeats alike,
    else an array of weights and 1."""
    repeats = {w for _, w in samples if isinstance(w, int)}
    if len(repeats) == 1 and all(isinstance(w, int) for _, w in samples):
        return None, repeats.pop()
    return np.concatenate([np.full(v.size, w, np.float64) if isinstance(w, int) else w for v, w in samples]), 1


def _bin_counts(values: np.ndarray, edges: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
    """np.histogram's counts over ``edges`` ([e_i, e_i+1), the last bin closed), without its sort.

    Many values: numpy's arithmetic binning over equal bins (the same edges, checked against them);
    few: a binary search over the edges, which costs less than numpy's setup.
    """
    if values.size > BINARY_SEARCH_LIMIT:
        counts, _ = np.histogram(values, bins=HISTOGRAM_BINS, range=(edges[0], edges[-1]), weights=weights)
        return counts
    index = np.searchsorted(edges, values, side="right") - 1
    np.minimum(index, HISTOGRAM_BINS - 1, out=index)  # no value lies below edges[0], the minimum
    return np.bincount(index, weights=weights, minlength=HISTOGRAM_BINS)
