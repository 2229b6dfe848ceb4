"""Whether many tensors hold only finite values: batched reads and vectorised checks, exact answers.

``check`` asks one question of every tensor: does it hold a NaN or an Inf? Per tensor, that costs an
open, a read and a dozen numpy calls, which on 50,000 small tensors is most of the time. Here:

- views are planned first, with the same bounds checks :class:`~ckpt_tui.core.values.TensorReader`
  makes (the view's first and last element inside its record, the record inside the file);
- small views are read in windows (one positioned read for a run of records laid out one after
  another) and checked with one ``isfinite`` over the window per dtype: a view is clean when no
  non-finite element position falls in its byte range (the plan and the windows are numpy arrays);
- large views are checked through maps of :data:`MAP_CHUNK` bytes (no copy out of the page cache),
  unmapped after each, on a small thread pool (numpy's checks release the GIL).

Only the common case is answered here: a view that is row-major inside a stored (not compressed)
record of a safetensors or zip file, of a float or integer dtype. Everything else, and any view
where something is odd (a short read, a bound that fails, a non-finite value found), is answered
``None``: the caller reads it the exact, per-tensor way (:func:`~ckpt_tui.core.stats.tensor_stats`),
which gives the counts, and raises the same errors, as always.
"""

from __future__ import annotations

import itertools
import mmap
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ckpt_tui.core.errors import Cancelled, ReadError
from ckpt_tui.core.readers.safetensors_file import SafetensorsRecords
from ckpt_tui.core.readers.torch_zip import ZipRecords
from ckpt_tui.core.tree import Storage, Tensor
from ckpt_tui.core.values import MAX_ELEMENTS

WINDOW = 16 << 20
"""Bytes read at once for a run of small views."""
GAP = 1 << 16
"""Bytes between two views read through rather than starting a new window."""
LARGE = 4 << 20
"""Views larger than this are read on their own, in chunks, by the pool."""
MAP_CHUNK = 32 << 20
WORKERS = 2

FLOAT_CODES = {"float64": "f8", "float32": "f4", "float16": "f2", "bfloat16": "u2"}
"""Dtypes that can hold NaN/Inf, and the numpy type their raw bytes are checked as."""
ALWAYS_FINITE = {
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "bool": 1,
}
"""Dtypes whose decoded values are always finite: reading them (in bounds, not short) is the check."""
ITEMSIZES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, **ALWAYS_FINITE}
BF16_EXPONENT = 0x7F80
DTYPE_NAMES = tuple(ITEMSIZES)
DTYPE_CODES = {name: code for code, name in enumerate(DTYPE_NAMES)}


@dataclass(slots=True)
class _Span:
    """Where one view's bytes are: file, absolute start, byte count, and its dtype name."""

    path: str
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
    plan = _plan(tensors)
    index = np.array(plan.index, np.int64)
    paths = np.array(plan.path, np.int64)
    starts = np.array(plan.start, np.int64)
    stops = starts + np.array(plan.size, np.int64)
    dtypes = np.array(plan.dtype, np.int64)
    small = stops - starts <= LARGE
    order = np.flatnonzero(small)
    order = order[np.lexsort((starts[order], paths[order]))]  # by file, then by place in it
    large = np.flatnonzero(~small).tolist()
    found = np.zeros(len(tensors), np.bool_)
    done, total = 0, len(index)
    with ThreadPoolExecutor(WORKERS) as pool:
        futures = [
            pool.submit(
                _large_finite,
                _Span(plan.paths[paths[i]], int(starts[i]), int(stops[i] - starts[i]), DTYPE_NAMES[dtypes[i]]),
                byteorder,
                cancelled,
            )
            for i in large
        ]

        def window(bounds: tuple[int, int]) -> np.ndarray:
            chosen = order[bounds[0] : bounds[1]]
            path = plan.paths[paths[chosen[0]]]
            return _window_finite(path, starts[chosen], stops[chosen], dtypes[chosen], byteorder, cancelled)

        windows = _windows(paths[order], starts[order], stops[order])
        for bounds, clean in zip(windows, pool.map(window, windows), strict=True):
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


# ---- planning: the reader's bounds checks, for the common case only -------------------------------


@dataclass
class _Plan:
    """The views this scan answers, as parallel lists: tensor index, file (index into ``paths``), absolute
    start, byte count, dtype (index into :data:`DTYPE_NAMES`)."""

    index: list[int] = field(default_factory=list)
    path: list[int] = field(default_factory=list)
    start: list[int] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    dtype: list[int] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)


def _plan(tensors: Sequence[Tensor]) -> _Plan:
    """The views this scan answers, each checked against its record as TensorReader checks it."""
    zips = {id(t.storage.source): t.storage.source for t in tensors if t.storage is not None and _zip_source(t)}
    for source in zips.values():
        assert isinstance(source, ZipRecords)
        source.find_offsets()
    layouts: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    path_ids: dict[str, int] = {}
    plan = _Plan()
    for index, tensor in enumerate(tensors):
        storage = tensor.storage
        size = ITEMSIZES.get(tensor.dtype)
        if storage is None or size is None or tensor.kind != "dense" or tensor.offset < 0:
            continue
        key = (tensor.shape, tensor.stride)
        numel = layouts.get(key)
        if numel is None:
            numel = layouts[key] = _row_major_numel(tensor.shape, tensor.stride)
        if not numel:
            continue
        where = _record(storage)
        if where is None:
            continue
        start, available = where
        if (tensor.offset + numel) * size > min(available, storage.nbytes):
            continue
        path: str = storage.source.path  # type: ignore[union-attr]
        path_id = path_ids.get(path)
        if path_id is None:
            path_id = path_ids[path] = len(plan.paths)
            plan.paths.append(path)
        plan.index.append(index)
        plan.path.append(path_id)
        plan.start.append(start + tensor.offset * size)
        plan.size.append(numel * size)
        plan.dtype.append(DTYPE_CODES[tensor.dtype])
    return plan


def _zip_source(tensor: Tensor) -> bool:
    return tensor.storage is not None and type(tensor.storage.source) is ZipRecords


def _record(storage: Storage) -> tuple[int, int] | None:
    """Where a stored record's bytes are and how many, as ``locate`` finds them; None to leave it to the
    exact pass (compressed, missing, anything ``locate`` refuses: it raises there, worded as always)."""
    source = storage.source
    if type(source) is ZipRecords:
        return source.stored_at(storage)
    if type(source) is SafetensorsRecords:
        try:
            return source.locate(storage)
        except (ReadError, KeyError):
            return None
    return None


def _row_major_numel(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """The element count of a row-major view with as many strides as sizes; 0 for any other view (and
    for views past :data:`MAX_ELEMENTS` or empty ones: the exact pass reads those)."""
    if len(shape) != len(stride):
        return 0
    expected = 1
    for size, step in zip(reversed(shape), reversed(stride), strict=True):
        if size != 1 and step != expected:
            return 0
        expected *= size
    return expected if expected < MAX_ELEMENTS else 0


# ---- small views: windows ----------------------------------------------------------------------


def _windows(paths: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> list[tuple[int, int]]:
    """Runs of views (sorted by file and start) read together: ``(first, end)`` positions. A run is in
    one file, has no gap over :data:`GAP`, and its views start within :data:`WINDOW` bytes of each
    other (so it reads at most WINDOW + LARGE bytes)."""
    count = len(starts)
    if not count:
        return []
    reach = np.maximum.accumulate(stops)
    first = np.ones(count, np.bool_)
    first[1:] = (paths[1:] != paths[:-1]) | (starts[1:] > reach[:-1] + GAP)
    run_start = starts[first][np.cumsum(first) - 1]
    bucket = (starts - run_start) // WINDOW
    first[1:] |= bucket[1:] != bucket[:-1]
    bounds = [*np.flatnonzero(first).tolist(), count]
    return list(itertools.pairwise(bounds))


_buffers = threading.local()


def _buffer(size: int) -> memoryview:
    """A reused per-thread buffer of at least ``size`` bytes (no fresh pages per read)."""
    held = getattr(_buffers, "data", None)
    if held is None or len(held) < size:
        held = _buffers.data = bytearray(max(size, WINDOW))
    return memoryview(held)[:size]


def _read_into(path: str, start: int, size: int) -> memoryview:
    """``size`` bytes at ``start`` (fewer if the file ends first)."""
    buffer = _buffer(size)
    with open(path, "rb", buffering=0) as file:
        got = os.preadv(file.fileno(), [buffer], start)
    return buffer[:got]


def _window_finite(
    path: str,
    starts: np.ndarray,
    stops: np.ndarray,
    dtypes: np.ndarray,
    byteorder: str,
    cancelled: Callable[[], bool] | None,
) -> np.ndarray:
    """Which of these views (one run of :func:`_windows`) were read whole and hold only finite values."""
    if cancelled is not None and cancelled():
        raise Cancelled("check cancelled")
    begin = int(starts[0])
    data = _read_into(path, begin, int(stops.max()) - begin)
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

    Floats are checked through a map of one chunk at a time (no copy out of the page cache), unmapped
    after each chunk so that memory stays bounded whatever the view's size; other dtypes are read.
    """
    size = ITEMSIZES[span.dtype]
    end = span.start + span.size
    with open(span.path, "rb", buffering=0) as file:
        fd = file.fileno()
        if os.fstat(fd).st_size < end:
            return None
        at = span.start
        while at < end:
            if cancelled is not None and cancelled():
                raise Cancelled("check cancelled")
            base = at - at % mmap.ALLOCATIONGRANULARITY
            stop = min(end, base + MAP_CHUNK)
            stop -= (stop - at) % size  # whole elements (the view's end is a whole element too)
            if span.dtype not in FLOAT_CODES:
                if os.preadv(fd, [_buffer(stop - at)], at) != stop - at:
                    return None
            elif not _mapped_finite(fd, base, at, stop, span.dtype, byteorder):
                return None
            at = stop
    return True


def _mapped_finite(fd: int, base: int, at: int, stop: int, dtype: str, byteorder: str) -> bool:
    """Whether the elements from ``at`` to ``stop`` are finite, read through a map from ``base``."""
    with mmap.mmap(fd, stop - base, access=mmap.ACCESS_READ, offset=base) as mapped:
        view = memoryview(mapped)[at - base :]
        try:
            return _chunk_finite(view, dtype, byteorder)
        finally:
            view.release()


def _chunk_finite(buffer: memoryview, dtype: str, byteorder: str) -> bool:
    values = np.frombuffer(buffer, _numpy_type(dtype, byteorder))
    if dtype == "bfloat16":
        return not bool(_nonfinite(values, dtype).any())
    return bool(np.isfinite(values).all())
