"""Where many tensors' bytes lie in their files, planned at once: what batched reads start from.

``check``'s NaN/Inf scan, ``stats`` and ``diff`` on many small tensors read runs of records laid out
one after another with one positioned read per window. This plans the views such reads can answer:
a view that is row-major inside a stored (not compressed) record of a safetensors or zip file, of a
float or integer dtype, checked as :class:`~ckpt_tui.core.values.tensor_values.TensorReader` checks it (first and
last element inside the record, the record inside the file). Every other view is left out: the
caller reads it the exact, per-tensor way, which gives the same figures and raises the same errors.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ckpt_tui.core.model.dtypes import DTYPES
from ckpt_tui.core.model.tree import RecordSource, Tensor, over_whole_storages
from ckpt_tui.core.values.tensor_values import MAX_ELEMENTS

WINDOW = 16 << 20
"""Bytes read at once for a run of small views."""
GAP = 1 << 16
"""Bytes between two views read through rather than starting a new window."""

FLOAT_SIZES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}
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
ITEMSIZES = {**FLOAT_SIZES, **ALWAYS_FINITE}
DTYPE_NAMES = tuple(ITEMSIZES)
DTYPE_CODES = {name: code for code, name in enumerate(DTYPE_NAMES)}


@dataclass
class PlannedViews:
    """The views planned, as parallel lists: tensor index, file (index into ``paths`` and ``versions``),
    absolute start, byte count, dtype (index into :data:`DTYPE_NAMES`)."""

    index: list[int] = field(default_factory=list)
    path: list[int] = field(default_factory=list)
    start: list[int] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    dtype: list[int] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    versions: list[str | None] = field(default_factory=list)
    """Each file's version as it was opened (what its reads check: ``byte_source.check_unchanged``)."""


_FIELDS = operator.attrgetter("storage", "dtype", "kind", "offset", "shape", "stride")


def plan_views(tensors: Sequence[Tensor]) -> PlannedViews:
    """The views batched reads answer, each checked against its record as TensorReader checks it.

    Per tensor: a few lookups; per distinct layout (shape, stride) and per record source, the rest.
    """
    planned = _plan_in_bulk(tensors)
    if planned is not None:
        return planned
    rows = list(map(_FIELDS, tensors))
    sources = {id(row[0].source): row[0].source for row in rows if row[0] is not None}
    zip_spans = {key: source.stored_spans() for key, source in sources.items() if source is not None}
    paths: dict[int, int] = {}  # id(source) -> index into plan.paths
    numels: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    plan = PlannedViews()
    add_index, add_path, add_start = plan.index.append, plan.path.append, plan.start.append
    add_size, add_dtype = plan.size.append, plan.dtype.append
    for index, (storage, dtype, kind, offset, shape, stride) in enumerate(rows):
        size = ITEMSIZES.get(dtype)
        if storage is None or size is None or kind != "dense" or offset < 0:
            continue
        numel = numels.get((shape, stride))
        if numel is None:
            numel = numels[shape, stride] = _row_major_numel(shape, stride)
        if not numel:
            continue
        source = storage.source
        stored = storage.numel * DTYPES.get(storage.dtype, (0,))[0]
        where: tuple[int, int] | None = None  # other sources (assembled pieces...): the exact pass
        header = source.header_ranges() if source is not None else None
        if header is not None:  # the range from the header
            span = header.ranges.get(storage.key)
            where = None if span is None else (header.data_start + span[0], span[1] - span[0])
        # the record's place, from its local header (a zip's), where its source has one
        elif (spans := zip_spans.get(id(source))) is not None:
            where = spans.get(storage.key)
            if where is not None and where[1] < stored:
                where = None  # a record shorter than its storage: the exact pass reports it
        if where is None or (offset + numel) * size > min(where[1], stored):
            continue
        path_id = paths.get(id(source))
        if path_id is None:
            path_id = paths[id(source)] = _path_index(plan, source.path, source.version)
        add_index(index)
        add_path(path_id)
        add_start(where[0] + offset * size)
        add_size(numel * size)
        add_dtype(DTYPE_CODES[dtype])
    return plan


def _plan_in_bulk(tensors: Sequence[Tensor]) -> PlannedViews | None:
    """:func:`plan_views` for tensors as a state_dict file holds them, in passes over whole columns:
    each over all of its own storage (:func:`~ckpt_tui.core.model.tree.over_whole_storages`), all in one
    file's records. The same views, in the same order, as the loop plans; None when any tensor is otherwise."""
    if not over_whole_storages(list(tensors)):
        return None
    storages = list(map(_STORAGE, tensors))
    source = storages[0].source
    if not all(map(operator.is_, map(_SOURCE, storages), itertools.repeat(source))):
        return None
    numels = list(map(math.prod, map(_SHAPE, tensors)))
    dtypes = list(map(_DTYPE, tensors))
    places = _record_places(source, list(map(_KEY, storages)))
    if places is None:
        return None
    starts, sizes = places
    nbytes = list(map(operator.mul, numels, map(ITEMSIZES.get, dtypes, itertools.repeat(0))))  # 0: not read here
    chosen = list(map(operator.and_, map(bool, nbytes), map(operator.le, nbytes, sizes)))
    if all(chosen):  # (a state_dict of float tensors: every view, no compress pass)
        return PlannedViews(
            list(range(len(tensors))),
            [0] * len(nbytes),
            starts,
            nbytes,
            list(map(DTYPE_CODES.__getitem__, dtypes)),
            [source.path],
            [source.version],
        )
    index = list(itertools.compress(range(len(tensors)), chosen))
    return PlannedViews(
        index,
        [0] * len(index),
        list(itertools.compress(starts, chosen)),
        list(itertools.compress(nbytes, chosen)),
        list(map(DTYPE_CODES.__getitem__, itertools.compress(dtypes, chosen))),
        [source.path],
        [source.version],
    )


_STORAGE = operator.attrgetter("storage")
_SOURCE = operator.attrgetter("source")
_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")
_KEY = operator.attrgetter("key")


def _record_places(source: RecordSource | None, keys: list[str]) -> tuple[list[int], list[int]] | None:
    """Each record's absolute start and byte count (two columns), as the loop finds them; None for another
    source, or when a record has no place (the loop then leaves it to the exact pass, in its words)."""
    header = source.header_ranges() if source is not None else None
    if header is not None:
        ranges = list(map(header.ranges.get, keys))
        if None in ranges:
            return None
        pairs = list(itertools.chain.from_iterable(ranges))  # type: ignore[arg-type]
        begins, ends = pairs[0::2], pairs[1::2]
        return list(map(header.data_start.__add__, begins)), list(map(operator.sub, ends, begins))
    places = source.stored_places(keys) if source is not None else None
    if places is None or None in places:
        return None
    return list(map(operator.itemgetter(0), places)), list(map(operator.itemgetter(1), places))  # type: ignore[arg-type]


def _path_index(plan: PlannedViews, path: str, version: str | None) -> int:
    """The index of a file in ``plan.paths`` (two sources of one file, opened as one version, share it)."""
    files = list(zip(plan.paths, plan.versions, strict=True))
    if (path, version) not in files:
        plan.paths.append(path)
        plan.versions.append(version)
        return len(plan.paths) - 1
    return files.index((path, version))


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


def windows(paths: np.ndarray, starts: np.ndarray, stops: np.ndarray, window: int = WINDOW) -> list[tuple[int, int]]:
    """Runs of views (sorted by file and start) read together: ``(first, end)`` positions. A run is in
    one file, has no gap over :data:`GAP`, and its views start within ``window`` bytes of each other
    (so it reads at most ``window`` bytes plus its last view)."""
    count = len(starts)
    if not count:
        return []
    reach = np.maximum.accumulate(stops)
    first = np.ones(count, np.bool_)
    first[1:] = (paths[1:] != paths[:-1]) | (starts[1:] > reach[:-1] + GAP)
    run_start = starts[first][np.cumsum(first) - 1]
    bucket = (starts - run_start) // window
    first[1:] |= bucket[1:] != bucket[:-1]
    bounds = [*np.flatnonzero(first).tolist(), count]
    return list(itertools.pairwise(bounds))
