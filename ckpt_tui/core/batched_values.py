"""The raw values of many small views at once: windows of one positioned read, one array out.

Statistics and diffs of a checkpoint of many small tensors cost, per tensor, a reader, an open, a
read and a dozen numpy calls: on 50,000 tensors that is most of the time. Here the views are planned
as :mod:`~ckpt_tui.core.finite_scan` plans them (row-major inside a stored record of a safetensors or
zip file, bounds checked as :class:`~ckpt_tui.core.values.TensorReader` checks them), read in windows
(one read for a run of records laid out one after another), and their elements gathered, in the order
asked, into one array: callers then work over every view at once (``np.add.reduceat`` and the like).

Only that common case is answered: views over :data:`LARGE` bytes, compressed records, views that are
not row-major in one record, dtypes outside float and integer, a view with a ``neg`` bit, and a short
read are left out (``answered`` is False): the caller reads those the exact, per-tensor way, which
gives the same figures and raises the same errors as always.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ckpt_tui.core.errors import Cancelled
from ckpt_tui.core.finite_scan import ITEMSIZES, _plan, _windows
from ckpt_tui.core.tree import Tensor
from ckpt_tui.core.values import numpy_dtype

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


def batchable(tensor: Tensor, nbytes: int) -> bool:
    """Whether a view of ``nbytes`` may be answered here (small, plain dtype, no ``neg`` bit); :func:`gather`
    checks the rest."""
    return 0 < nbytes <= LARGE and tensor.dtype in ITEMSIZES and not tensor.metadata


class ViewPlan:
    """Where each of many views' bytes are (planned once, as finite_scan plans them), for reading batches
    of them with :meth:`gather`."""

    def __init__(self, tensors: Sequence[Tensor]) -> None:
        self.tensors = tensors
        plan = _plan(tensors)
        count = len(tensors)
        self.paths = plan.paths
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
        paths, starts, sizes = self.path[index], self.start[index], self.size[index]
        order = np.lexsort((starts, paths))
        pieces: list[np.ndarray | None] = [None] * len(index)  # raw elements of each view, once read
        for first, end in _windows(paths[order], starts[order], starts[order] + sizes[order]):
            if cancelled is not None and cancelled():
                raise Cancelled("cancelled")
            window = order[first:end].tolist()
            path = self.paths[paths[window[0]]]
            dtypes = [self.tensors[i].dtype for i in index[window].tolist()]
            _read_window(path, window, starts, sizes, dtypes, byteorder, pieces)
        by_dtype: dict[str, list[int]] = {}
        for position, piece in enumerate(pieces):
            if piece is not None:
                by_dtype.setdefault(self.tensors[index[position]].dtype, []).append(position)
        return {dtype: _joined(positions, pieces, index) for dtype, positions in by_dtype.items()}


def gather(
    tensors: Sequence[Tensor], byteorder: str = "little", cancelled: Callable[[], bool] | None = None
) -> dict[str, Gathered]:
    """The values of every view answered here, by dtype (one batch: plan and read)."""
    return ViewPlan(tensors).gather(range(len(tensors)), byteorder, cancelled)


def _read_window(
    path: str,
    window: list[int],
    starts: np.ndarray,
    sizes: np.ndarray,
    dtypes: list[str],
    byteorder: str,
    pieces: list[np.ndarray | None],
) -> None:
    """Read one window (a fresh buffer: its views are kept until joined) and cut its views from it."""
    begin = int(starts[window[0]])
    size = int((starts[window] + sizes[window]).max()) - begin
    data = bytearray(size)
    with open(path, "rb", buffering=0) as file:
        got = os.preadv(file.fileno(), [data], begin)
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
