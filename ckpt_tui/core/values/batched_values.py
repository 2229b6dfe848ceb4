"""The raw values of many small views at once: windows of one positioned read, one array out.

Statistics and diffs of a checkpoint of many small tensors cost, per tensor, a reader, an open, a
read and a dozen numpy calls: on 50,000 tensors that is most of the time. Here the views are planned
as :mod:`~ckpt_tui.core.values.finite_scan` plans them (row-major inside a stored record of a safetensors or
zip file, bounds checked as :class:`~ckpt_tui.core.values.tensor_values.TensorReader` checks them), read in windows
(one read for a run of records laid out one after another), and their elements gathered, in the order
asked, into one array: callers then work over every view at once (``np.add.reduceat`` and the like).

Only that common case is answered: views over :data:`LARGE` bytes, compressed records, views that are
not row-major in one record, dtypes outside float and integer, a view with a ``neg`` bit, and a short
read are left out (in no :attr:`Gathered.answered`): the caller reads those the exact, per-tensor way,
which gives the same figures and raises the same errors as always.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from ckpt_tui.core.errors import Cancelled
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.tree import Tensor
from ckpt_tui.core.values.tensor_values import numpy_dtype, read_order
from ckpt_tui.core.values.view_spans import ITEMSIZES, plan_views, windows

T = TypeVar("T")

LARGE = 4 << 20
"""Views larger than this (bytes) are left to the per-tensor path, which reads them in chunks."""
BATCH_BYTES = 512 << 10
"""Bytes of small views that callers gather at once (memory: a few times this)."""


@dataclass
class Gathered:
    """The elements of the answered views, one view after another in the order asked (native byte order)."""

    values: np.ndarray
    bounds: np.ndarray
    """``values[bounds[i]:bounds[i + 1]]``: the i-th answered view (int64, one more than the answered)."""
    answered: np.ndarray
    """Indices (into the tensors planned) of the views read here, in the order chosen."""

    def select(self, wanted: np.ndarray) -> Gathered:
        """Only the views ``wanted`` (some of ``answered``, both ascending), in that order."""
        if wanted.size == self.answered.size:
            return self
        rows = np.searchsorted(self.answered, wanted)
        lengths = np.diff(self.bounds)[rows]
        bounds = np.zeros(rows.size + 1, np.int64)
        np.cumsum(lengths, out=bounds[1:])
        taken = np.repeat(self.bounds[rows] - bounds[:-1], lengths) + np.arange(bounds[-1])
        return Gathered(self.values[taken], bounds, wanted)


def batchable(tensor: Tensor, nbytes: int) -> bool:
    """Whether a view of ``nbytes`` may be answered here (small, plain dtype, no ``neg`` bit); the plan
    checks the rest."""
    return 0 < nbytes <= LARGE and tensor.dtype in ITEMSIZES and not tensor.metadata


class ViewPlan:
    """Where each of many views' bytes are (planned once, as finite_scan plans them), for reading batches
    of them with :meth:`gather`."""

    def __init__(self, tensors: Sequence[Tensor]) -> None:
        self.tensors = tensors
        plan = plan_views(tensors)
        count = len(tensors)
        self.paths = plan.paths
        self.versions = plan.versions
        self.path = np.full(count, -1, np.int64)  # -1: not answered here
        self.start = np.zeros(count, np.int64)
        self.size = np.zeros(count, np.int64)
        index = np.array(plan.index, np.int64)
        small = np.array(plan.size, np.int64) <= LARGE
        small &= np.array([not tensors[i].metadata for i in plan.index], np.bool_)
        index = index[small]
        self.path[index] = np.array(plan.path, np.int64)[small]
        self.start[index] = np.array(plan.start, np.int64)[small]
        self.size[index] = np.array(plan.size, np.int64)[small]

    def gather(
        self, chosen: Sequence[int], byteorder: str = "little", cancelled: Callable[[], bool] | None = None
    ) -> dict[str, Gathered]:
        """The values of the chosen views (indices into the planned tensors) answered here, by dtype,
        each dtype's views in the order chosen; the others are in no ``answered``."""
        index = np.array(chosen, np.int64)
        index = index[self.path[index] >= 0]
        if byteorder != "little":
            # a view torch swaps otherwise than by its own dtype: the exact path reads it (or says why not)
            index = index[[read_order(self.tensors[i], byteorder) == byteorder for i in index.tolist()]]
        paths, starts, sizes = self.path[index], self.start[index], self.size[index]
        order = np.lexsort((starts, paths))
        pieces: list[np.ndarray | None] = [None] * len(index)  # raw elements of each view, once read
        for first, end in windows(paths[order], starts[order], starts[order] + sizes[order]):
            if cancelled is not None and cancelled():
                raise Cancelled("cancelled")
            window = order[first:end].tolist()
            file = paths[window[0]]
            dtypes = [self.tensors[i].dtype for i in index[window].tolist()]
            _read_window((self.paths[file], self.versions[file]), window, starts, sizes, dtypes, byteorder, pieces)
        by_dtype: dict[str, list[int]] = {}
        for position, piece in enumerate(pieces):
            if piece is not None:
                by_dtype.setdefault(self.tensors[index[position]].dtype, []).append(position)
        return {dtype: _joined(positions, pieces, index) for dtype, positions in by_dtype.items()}


def view_rows(values: np.ndarray, bounds: np.ndarray, views: np.ndarray, length: int) -> np.ndarray:
    """The chosen views (all ``length`` long) as the rows of one C-ordered array."""
    if views.size * length == values.size:  # every view: the values themselves
        return values.reshape(views.size, length)
    return values[bounds[views, None] + np.arange(length)]


def _read_window(
    file: tuple[str, str | None],
    window: list[int],
    starts: np.ndarray,
    sizes: np.ndarray,
    dtypes: list[str],
    byteorder: str,
    pieces: list[np.ndarray | None],
) -> None:
    """Read one window of a file (path, version as opened; a fresh buffer: its views are kept until joined)
    and cut its views from it."""
    begin = int(starts[window[0]])
    size = int((starts[window] + sizes[window]).max()) - begin
    data = bytearray(size)
    got = places.read_into(file[0], begin, data, file[1])
    typed: dict[tuple[str, int], np.ndarray] = {}
    cuts = zip(window, (starts[window] - begin).tolist(), sizes[window].tolist(), dtypes, strict=True)
    for position, start, nbytes, dtype in cuts:
        if start + nbytes > got:  # a short read: left to the exact path, which reports it
            continue
        itemsize = ITEMSIZES[dtype]
        phase = start % itemsize
        elements = typed.get((dtype, phase))
        if elements is None:
            raw_type = numpy_dtype(dtype, byteorder)
            elements = typed[dtype, phase] = np.frombuffer(data, raw_type, (got - phase) // itemsize, phase)
        first = start // itemsize
        pieces[position] = elements[first : first + nbytes // itemsize]


def _joined(positions: list[int], pieces: list[np.ndarray | None], index: np.ndarray) -> Gathered:
    """One dtype's pieces (at ``positions``) as one array in native byte order."""
    chosen = [piece for piece in (pieces[p] for p in positions) if piece is not None]
    values: np.ndarray = np.concatenate(chosen, dtype=chosen[0].dtype.newbyteorder("="))
    bounds = np.zeros(len(chosen) + 1, np.int64)
    np.cumsum([piece.size for piece in chosen], out=bounds[1:])
    return Gathered(values, bounds, index[positions])


MIN_BATCHED = 64
"""Fewer small views than this are read each on its own: a batch saves nothing on so few."""

Measure = Callable[[str, str, Gathered, Gathered], dict[int, T]]
"""What a caller computes over a batch of pairs: from the two sides' dtypes and values (the same
views, aligned), a result per pair index it answers."""


class PairBatches(Generic[T]):
    """Pairs of same-shaped small views (A's and B's), planned once and read a batch of about
    :data:`BATCH_BYTES` at a time, each batch when the caller reaches its first pair."""

    def __init__(self, pairs: Sequence[tuple[Tensor, Tensor]], byteorders: tuple[str, str]) -> None:
        self.byteorders = byteorders
        sizes = [x.nbytes for x, _ in pairs]
        chosen = [
            index
            for index, ((x, y), size) in enumerate(zip(pairs, sizes, strict=True))
            if x.shape == y.shape and batchable(x, size) and batchable(y, y.nbytes)
        ]
        self.pairs = chosen if len(chosen) >= MIN_BATCHED else []
        self.plans = (ViewPlan([pairs[i][0] for i in self.pairs]), ViewPlan([pairs[i][1] for i in self.pairs]))
        self.bounds = batch_bounds([sizes[i] for i in self.pairs])
        self.next = 0
        self.upcoming = self._first_pair()
        """The pair at which the next batch is read (past every pair when none is left)."""

    def read_until(
        self, position: int, measure: Measure[T], cancelled: Callable[[], bool] | None = None
    ) -> dict[int, T]:
        """The results of every batch whose first pair is at or before pair ``position`` not read yet, by pair."""
        found: dict[int, T] = {}
        while self.next + 1 < len(self.bounds) and self.pairs[self.bounds[self.next]] <= position:
            chosen = range(self.bounds[self.next], self.bounds[self.next + 1])
            self.next += 1
            sides = [
                plan.gather(chosen, order, cancelled) for plan, order in zip(self.plans, self.byteorders, strict=True)
            ]
            for dtype_a, a in sides[0].items():
                for dtype_b, b in sides[1].items():
                    both = np.intersect1d(a.answered, b.answered)
                    if both.size:
                        answers = measure(dtype_a, dtype_b, a.select(both), b.select(both))
                        found.update((self.pairs[index], result) for index, result in answers.items())
        self.upcoming = self._first_pair()
        return found

    def _first_pair(self) -> int:
        return self.pairs[self.bounds[self.next]] if self.next + 1 < len(self.bounds) else 1 << 62


def batch_bounds(sizes: list[int]) -> list[int]:
    """Where batches of about :data:`BATCH_BYTES` start and end: batch k is ``bounds[k]`` to ``bounds[k + 1]``."""
    bounds, held = [0], 0
    for index, size in enumerate(sizes):
        held += size
        if held >= BATCH_BYTES:
            bounds.append(index + 1)
            held = 0
    if bounds[-1] < len(sizes):
        bounds.append(len(sizes))
    return bounds
