"""Whether many tensors hold only finite values: batched reads and vectorised checks, exact answers.

``check`` asks one question of every tensor: does it hold a NaN or an Inf? Per tensor, that costs an
open, a read and a dozen numpy calls, which on 50,000 small tensors is most of the time. Here:

- views are planned first (:mod:`~ckpt_tui.core.values.view_spans`), with the same bounds checks
  :class:`~ckpt_tui.core.values.tensor_values.TensorReader` makes (the view's first and last element inside its
  record, the record inside the file);
- small views are read in windows (one positioned read for a run of records laid out one after
  another) and checked with one ``isfinite`` over the window per dtype: a view is clean when no
  non-finite element position falls in its byte range (the plan and the windows are numpy arrays);
- large views are read :data:`READ_CHUNK` bytes at a time into a reused, cache-sized buffer per thread
  (as cheap as a map of the page cache, and a file cut short while read is a short read, never the
  SIGBUS a map dies of), on a small thread pool (numpy's checks release the GIL).

Every read checks that the file is still the version it was opened as (``byte_source.check_unchanged``):
a file replaced or rewritten since is ``FileChanged``, never scanned.

Only the common case is answered here: a view that is row-major inside a stored (not compressed)
record of a safetensors or zip file, of a float or integer dtype. Everything else, and any view
where something is odd (a short read, a bound that fails, a non-finite value found), is answered
``None``: the caller reads it the exact, per-tensor way (:func:`~ckpt_tui.core.values.stats.tensor_stats`),
which gives the counts, and raises the same errors, as always.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ckpt_tui.core.errors import Cancelled
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.tree import Tensor
from ckpt_tui.core.values import view_spans
from ckpt_tui.core.values.tensor_values import read_order
from ckpt_tui.core.values.view_spans import DTYPE_NAMES, ITEMSIZES, plan_views, windows

WINDOW = view_spans.WINDOW
"""Bytes read at once for a run of small views."""
LARGE = 4 << 20
"""Views larger than this are read on their own, in chunks, by the pool."""
READ_CHUNK = 1 << 20
"""Bytes of a large view read at once: the buffer stays in the core's cache while it is checked."""
WORKERS = 2

FLOAT_CODES = {"float64": "f8", "float32": "f4", "float16": "f2", "bfloat16": "u2"}
"""Dtypes that can hold NaN/Inf, and the numpy type their raw bytes are checked as."""
BF16_EXPONENT = 0x7F80


@dataclass(slots=True)
class _Span:
    """Where one view's bytes are: file, absolute start, byte count, and its dtype name."""

    path: str
    version: str | None
    start: int
    size: int
    dtype: str


def all_finite(
    tensors: Sequence[Tensor],
    byteorder: str = "little",
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[bool | None]:
    """For each tensor: True when every value was read and is finite; None when it needs the exact pass.

    ``None`` covers both what this scan does not answer and views holding a NaN or an Inf (their
    counts come from the exact pass). ``progress(done, total)`` counts views.
    """
    plan = plan_views(tensors)
    index = np.array(plan.index, np.int64)
    paths = np.array(plan.path, np.int64)
    starts = np.array(plan.start, np.int64)
    stops = starts + np.array(plan.size, np.int64)
    dtypes = np.array(plan.dtype, np.int64)
    small = stops - starts <= LARGE
    if byteorder != "little":
        # a view torch swaps otherwise than by its own dtype: left to the exact pass (None)
        swapped = np.array([read_order(tensors[i], byteorder) == byteorder for i in plan.index], np.bool_)
        index, paths, starts, stops, dtypes, small = (
            index[swapped],
            paths[swapped],
            starts[swapped],
            stops[swapped],
            dtypes[swapped],
            small[swapped],
        )
    order = np.flatnonzero(small)
    order = order[np.lexsort((starts[order], paths[order]))]  # by file, then by place in it
    large = np.flatnonzero(~small).tolist()
    found = np.zeros(len(tensors), np.bool_)
    done, total = 0, len(index)
    with ThreadPoolExecutor(WORKERS) as pool:
        futures = [
            pool.submit(
                _large_finite,
                _Span(
                    plan.paths[paths[i]],
                    plan.versions[paths[i]],
                    int(starts[i]),
                    int(stops[i] - starts[i]),
                    DTYPE_NAMES[dtypes[i]],
                ),
                byteorder,
                cancelled,
            )
            for i in large
        ]

        def window(bounds: tuple[int, int]) -> np.ndarray:
            chosen = order[bounds[0] : bounds[1]]
            file = paths[chosen[0]]
            return _window_finite(
                (plan.paths[file], plan.versions[file]),
                starts[chosen],
                stops[chosen],
                dtypes[chosen],
                byteorder,
                cancelled,
            )

        runs = windows(paths[order], starts[order], stops[order], WINDOW)
        for bounds, clean in zip(runs, pool.map(window, runs), strict=True):
            found[index[order[bounds[0] : bounds[1]]]] = clean
            done += bounds[1] - bounds[0]
            if progress is not None:
                progress(done, total)
        for i, future in zip(large, futures, strict=True):
            found[index[i]] = future.result() is True
            done += 1
            if progress is not None:
                progress(done, total)
    return [True if clean else None for clean in found.tolist()]


# ---- small views: windows ----------------------------------------------------------------------


_buffers = threading.local()


def _buffer(size: int) -> memoryview:
    """A reused per-thread buffer of at least ``size`` bytes (no fresh pages per read)."""
    held = getattr(_buffers, "data", None)
    if held is None or len(held) < size:
        held = _buffers.data = bytearray(max(size, WINDOW))
    return memoryview(held)[:size]


def _read_into(file: tuple[str, str | None], start: int, size: int) -> memoryview:
    """``size`` bytes at ``start`` of a file (path, version) (fewer if the file ends first)."""
    buffer = _buffer(size)
    got = places.read_into(file[0], start, buffer, file[1])
    return buffer[:got]


def _window_finite(
    file: tuple[str, str | None],
    starts: np.ndarray,
    stops: np.ndarray,
    dtypes: np.ndarray,
    byteorder: str,
    cancelled: Callable[[], bool] | None,
) -> np.ndarray:
    """Which of these views (one run of :func:`~ckpt_tui.core.values.view_spans.windows`) were read whole and
    hold only finite values."""
    if cancelled is not None and cancelled():
        raise Cancelled("check cancelled")
    begin = int(starts[0])
    data = _read_into(file, begin, int(stops.max()) - begin)
    starts, stops = starts - begin, stops - begin
    clean = stops <= len(data)  # a short read: those views go the exact way (which reports it)
    for code in np.unique(dtypes).tolist():
        dtype = DTYPE_NAMES[code]
        if dtype not in FLOAT_CODES:
            continue
        of_dtype = dtypes == code
        phases = starts % ITEMSIZES[dtype]  # grouped by where, in the window, their elements start
        for phase in np.unique(phases[of_dtype]).tolist():
            chosen = np.flatnonzero(of_dtype & (phases == phase))
            _mark_nonfinite(data, dtype, byteorder, starts, stops, chosen, clean)
    return clean


def _mark_nonfinite(
    data: memoryview,
    dtype: str,
    byteorder: str,
    starts: np.ndarray,
    stops: np.ndarray,
    chosen: np.ndarray,
    clean: np.ndarray,
) -> None:
    """Clear ``clean`` for the chosen views (elements in step) whose bytes hold a non-finite ``dtype`` value."""
    size = ITEMSIZES[dtype]
    first = int(starts[chosen].min())
    last = min(int(stops[chosen].max()), len(data))
    values = np.frombuffer(data, _numpy_type(dtype, byteorder), max(0, (last - first) // size), first)
    bad = np.flatnonzero(_nonfinite(values, dtype)) * size + first
    if bad.size:
        hits = np.searchsorted(bad, stops[chosen]) - np.searchsorted(bad, starts[chosen])
        clean[chosen[hits > 0]] = False


def _numpy_type(dtype: str, byteorder: str) -> np.dtype:
    return np.dtype(("<" if byteorder == "little" else ">") + FLOAT_CODES[dtype])


def _nonfinite(values: np.ndarray, dtype: str) -> np.ndarray:
    """Where the raw values are NaN or ±Inf (bfloat16: its exponent bits all set)."""
    if dtype == "bfloat16":
        return (values & BF16_EXPONENT) == BF16_EXPONENT
    return ~np.isfinite(values)


# ---- large views: chunks, in the pool ------------------------------------------------------------


def _large_finite(span: _Span, byteorder: str, cancelled: Callable[[], bool] | None) -> bool | None:
    """True when the whole view was read and is finite; None on a short file or a non-finite value.

    Read :data:`READ_CHUNK` at a time into this thread's buffer, on one descriptor checked against the
    version as it opens and after the last read (a file rewritten meanwhile is ``FileChanged``).
    """
    size = ITEMSIZES[span.dtype]
    end = span.start + span.size
    step = READ_CHUNK - READ_CHUNK % size
    source = places.source_of(span.path, span.version)
    try:
        at = span.start
        while at < end:
            if cancelled is not None and cancelled():
                raise Cancelled("check cancelled")
            want = min(step, end - at)
            buffer = _buffer(want)
            if source.readinto_at(at, buffer) != want:
                return None
            if span.dtype in FLOAT_CODES and not _chunk_finite(buffer, span.dtype, byteorder):
                return None
            at += want
        source.confirm()
    finally:
        source.close()
    return True


def _chunk_finite(buffer: memoryview, dtype: str, byteorder: str) -> bool:
    values = np.frombuffer(buffer, _numpy_type(dtype, byteorder))
    if dtype == "bfloat16":
        return not bool(_nonfinite(values, dtype).any())
    return bool(np.isfinite(values).all())
