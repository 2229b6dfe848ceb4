"""The sums ``diff --stats`` takes of two equal-length vectors: Σa², Σb², Σ(a−b)², Σ(a+b)², Σab and
Σ(a−b)(a+b), block by block in cache.

Two paths, chosen block by block:

- **wide** (float64 inputs, and any block the narrow path cannot vouch for): the values widened to
  float64 and four BLAS dot products per segment of :data:`~ckpt_tui.core.values.stats.DOT_SEGMENT`
  values (a·a, b·b, a·b, d·d): relative error about 1e-16 times a segment's length.
- **narrow** (both sides float32, as float32, float16 and bfloat16 are read): d = a − b in float32, then
  four float32 dot products per segment of :data:`NARROW_SEGMENT` values (d·d, a·a, b·b, a·d), whose
  segment results are added in float64; ab = a² − ad, (a−b)(a+b) = 2ad − d², (a+b)² = 2a² + 2b² − d².
  The worst-case relative error of a segment sum of S products in float32 is ``S·2^-24``; with d rounded
  once, a narrow block's Σd², Σa², Σb² are each within :data:`NARROW_BOUND` of the exact sum of its values,
  Σad within NARROW_BOUND of √(Σa²·Σd²), so Σab within 2.5 bounds of Σa² + Σb² and Σ(a−b)(a+b) within
  a bound of 2√(Σa²Σd²) + Σd² (what the cosine near 1 needs: ‖a‖ − ‖b‖ to a share of ‖a−b‖). A block is
  taken narrow only where Σa², Σb² are within 4 times each other, Σ(a+b)² is at least half of Σa² + Σb²
  (not near a cosine of −1: then it is within 8 bounds of itself), every segment sum is finite (a square
  or product past float32's range, a NaN or an Inf sends the block wide, where NaN/Inf are found as
  before), and Σd², Σa², Σb² are each 0 (seen to be exact zeros) or at least ``2^-100`` per value, so that
  float32 underflow (a product below 2^-149 lost) costs less than 2^-49 of the sum. Measured on gaussian
  data the errors are about 1e-8, far inside the bound.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np

from ckpt_tui.core.values.stats import BLOCK_ELEMENTS, DOT_SEGMENT, segmented_dot

NARROW_SEGMENT = 512
"""Float32 values summed in float32 before the segment's sum is added in float64: the worst-case error of a
segment is NARROW_SEGMENT·2^-24 of it (about 3e-5). Each segment is one BLAS call, whose fixed cost a shorter
segment pays more often: 256 took 25% more time here than 512 (a ``diff --stats`` of two 1 GB files), 1024 no
less."""
NARROW_BOUND = (NARROW_SEGMENT + 2) * 2.0**-24
"""Relative error bound of a narrow block's sums of squares (S products summed, plus d and s rounded once):
about 3.1e-5."""
NARROW_SMALLEST = 2.0**-100
"""A narrow block's Σd² and Σs² must be 0 or at least this per value (float32 underflow below 2^-149 per
value then costs under 2^-49 of the sum)."""
NARROW_RATIO = 4.0
"""Neither Σa² nor Σb² of a narrow block may be more than this many times the other (the error of Σab is bounded
by a share of their total)."""
NARROW_SUM_SHARE = 2.0
"""A narrow block's Σ(a+b)² must be at least 1/NARROW_SUM_SHARE of Σa² + Σb² (a cosine not near −1): taken as
2Σa² + 2Σb² − Σ(a−b)², its error is then within 8 bounds of itself."""
_SEGMENTS = BLOCK_ELEMENTS // NARROW_SEGMENT
_WIDE_SEGMENTS = BLOCK_ELEMENTS // DOT_SEGMENT


class PairSums(NamedTuple):
    """The sums of a pair of vectors (not finite when a value is NaN or Inf)."""

    aa: float
    bb: float
    dd: float
    """Σ(a−b)²."""
    ss: float
    """Σ(a+b)²."""
    ab: float
    ds: float
    """Σ(a−b)(a+b), which is Σa² − Σb² taken without its cancellation when the norms are close."""
    narrow: bool
    """Some block was summed in float32 (its figures are within :data:`NARROW_BOUND`, not float64's)."""

    def scaled(self, times: int) -> PairSums:
        """Every sum ``times`` times (each element repeated by a view)."""
        if times == 1:
            return self
        k = times
        return PairSums(self.aa * k, self.bb * k, self.dd * k, self.ss * k, self.ab * k, self.ds * k, self.narrow)

    def plus(self, other: PairSums) -> PairSums:
        """The sums of this run followed by ``other``."""
        return PairSums(
            self.aa + other.aa,
            self.bb + other.bb,
            self.dd + other.dd,
            self.ss + other.ss,
            self.ab + other.ab,
            self.ds + other.ds,
            self.narrow or other.narrow,
        )


NO_SUMS = PairSums(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, False)


def wide_sums(aa: float, bb: float, dd: float, ab: float) -> PairSums:
    """Float64 sums as :class:`PairSums` (Σ(a+b)² and Σ(a−b)(a+b) from them)."""
    return PairSums(aa, bb, dd, aa + bb + 2.0 * ab, ab, aa - bb, False)


_local = threading.local()


class _WideBlock:
    """One thread's float64 copies of a block of two vectors, with views that take each segment's dot products
    (all of a block's x·x and y·y in one BLAS-backed call)."""

    def __init__(self) -> None:
        self.wide = np.empty((2, BLOCK_ELEMENTS), np.float64)
        # each DOT_SEGMENT of x and of y as a row and as a column: a stacked matmul of (1, S) by (S, 1) pieces
        # is one single-threaded BLAS dot per segment, as segmented_dot takes them
        self.rows = self.wide.reshape(2, _WIDE_SEGMENTS, 1, DOT_SEGMENT)
        self.columns = self.wide.reshape(2, _WIDE_SEGMENTS, DOT_SEGMENT, 1)


def _wide_block() -> _WideBlock:
    block: _WideBlock | None = getattr(_local, "wide", None)
    if block is None:
        block = _local.wide = _WideBlock()
    return block


def _narrow_block() -> np.ndarray:
    """This thread's float32 d = x − y of a block."""
    block: np.ndarray | None = getattr(_local, "narrow", None)
    if block is None:
        block = _local.narrow = np.empty(BLOCK_ELEMENTS, np.float32)
    return block


def pair_sums(a: np.ndarray, b: np.ndarray, wide: bool = False) -> PairSums:
    """The sums of two equal-length vectors, block by block in cache: one pass over memory.

    Two float32 vectors are summed narrow where a block allows it (see the module), unless ``wide``; every
    other block, and the rest after the last whole block, wide: the figures of a pair with no narrow block
    are :func:`segmented_dot`'s, bit for bit.
    """
    with np.errstate(all="ignore"):  # a square past the range is inf, and sends its block wide: not warned
        return _pair_sums(a, b, wide)


def _pair_sums(a: np.ndarray, b: np.ndarray, wide: bool) -> PairSums:
    full = a.size // BLOCK_ELEMENTS
    narrow = not wide and full > 0 and a.dtype == np.float32 and b.dtype == np.float32
    if narrow:
        sums, accepted = _narrow_blocks(a, b, 1)
        # a run whose first block cannot be summed narrow (squares too small or too large for float32, norms far
        # apart: optimizer moments, a zero-initialised layer) is most likely alike throughout: summed wide at once
        if accepted[0] and full > 1:
            rest_sums, rest_accepted = _narrow_blocks(a[BLOCK_ELEMENTS:], b[BLOCK_ELEMENTS:], full - 1)
            sums, accepted = np.concatenate([sums, rest_sums]), np.concatenate([accepted, rest_accepted])
        elif not accepted[0]:
            sums, accepted = np.empty((full, 6)), np.zeros(full, bool)
    else:
        sums, accepted = np.empty((full, 6)), np.zeros(full, bool)
    if not accepted.all():
        sums[~accepted] = _wide_blocks(a, b, np.flatnonzero(~accepted))
    aa = bb = dd = ss = ab = ds = 0.0
    # block by block in order (+ 0.0: as segmented_dot adds the empty rest of a whole block)
    for block_aa, block_bb, block_dd, block_ss, block_ab, block_ds in sums.tolist():
        aa, bb, dd = aa + (block_aa + 0.0), bb + (block_bb + 0.0), dd + (block_dd + 0.0)
        ss, ab, ds = ss + (block_ss + 0.0), ab + (block_ab + 0.0), ds + (block_ds + 0.0)
    total = PairSums(aa, bb, dd, ss, ab, ds, bool(accepted.any()))
    rest = a.size - full * BLOCK_ELEMENTS
    return total.plus(_wide_rest(a[full * BLOCK_ELEMENTS :], b[full * BLOCK_ELEMENTS :])) if rest else total


def _narrow_blocks(a: np.ndarray, b: np.ndarray, full: int) -> tuple[np.ndarray, np.ndarray]:
    """Each whole block's six sums taken narrow (float64 rows of aa, bb, dd, ss, ab, ds), and which blocks the
    narrow sums hold for (the others are to be taken wide)."""
    d = _narrow_block()
    d_rows = d.reshape(_SEGMENTS, NARROW_SEGMENT)
    # each segment's float32 d·d, a·a, b·b and a·d of each whole block: one subtraction and four dot products
    dots = np.empty((full, 4, _SEGMENTS), np.float32)
    zeros_hidden = np.zeros(full, bool)
    for index in range(full):
        begin = index * BLOCK_ELEMENTS
        x, y = a[begin : begin + BLOCK_ELEMENTS], b[begin : begin + BLOCK_ELEMENTS]
        x_rows, y_rows = x.reshape(_SEGMENTS, NARROW_SEGMENT), y.reshape(_SEGMENTS, NARROW_SEGMENT)
        np.subtract(x, y, out=d)
        found = dots[index]
        np.vecdot(d_rows, d_rows, out=found[0])
        np.vecdot(x_rows, x_rows, out=found[1])
        np.vecdot(y_rows, y_rows, out=found[2])
        np.vecdot(x_rows, d_rows, out=found[3])
        # a float32 sum of squares of 0 can hide values whose squares underflow: it holds when they are zeros
        if not found[:3].any(axis=1).all():
            zeros_hidden[index] = any(not found[k].any() and bool(v.any()) for k, v in enumerate((d, x, y)))
    dd, aa, bb, ad = dots.sum(axis=2, dtype=np.float64).T
    smallest = NARROW_SMALLEST * BLOCK_ELEMENTS
    # Σ(a+b)² from the others is within a few bounds of itself only while a + b is not small beside a and b
    ss = 2.0 * (aa + bb) - dd
    accepted = (
        np.isfinite(dd)
        & np.isfinite(aa)
        & np.isfinite(bb)
        & np.isfinite(ad)
        & ~zeros_hidden
        & ((dd == 0) | (dd >= smallest))
        & ((aa == 0) | (aa >= smallest))
        & ((bb == 0) | (bb >= smallest))
        & (aa * NARROW_RATIO >= bb)
        & (bb * NARROW_RATIO >= aa)
        & (ss * NARROW_SUM_SHARE >= aa + bb)
    )
    return np.stack([aa, bb, dd, ss, aa - ad, 2.0 * ad - dd], axis=1), accepted


def _wide_blocks(a: np.ndarray, b: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """The six sums of the given whole blocks, taken wide (float64 rows of aa, bb, dd, ss, ab, ds)."""
    sweep = _wide_block()
    x, y = sweep.wide
    # each segment's four dot products (x·x, y·y, d·d, x·y) of each block
    dots = np.empty((blocks.size, 4, _WIDE_SEGMENTS, 1, 1), np.float64)
    for row, index in enumerate(blocks.tolist()):
        begin = index * BLOCK_ELEMENTS
        np.copyto(x, a[begin : begin + BLOCK_ELEMENTS])
        np.copyto(y, b[begin : begin + BLOCK_ELEMENTS])
        found = dots[row]
        np.matmul(sweep.rows, sweep.columns, out=found[:2])
        np.matmul(sweep.rows[0], sweep.columns[1], out=found[3])
        np.subtract(x, y, out=x)
        np.matmul(sweep.rows[0], sweep.columns[0], out=found[2])
    aa, bb, dd, ab = dots.reshape(blocks.size, 4, _WIDE_SEGMENTS).sum(axis=2).T
    return np.stack([aa, bb, dd, aa + bb + 2.0 * ab, ab, aa - bb], axis=1)


def _wide_rest(a: np.ndarray, b: np.ndarray) -> PairSums:
    """The sums of fewer than a block's values, taken wide."""
    sweep = _wide_block()
    x, y = sweep.wide[0, : a.size], sweep.wide[1, : a.size]
    np.copyto(x, a)
    np.copyto(y, b)
    aa, bb, ab = segmented_dot(x, x), segmented_dot(y, y), segmented_dot(x, y)
    x -= y
    return wide_sums(aa, bb, segmented_dot(x, x), ab)
