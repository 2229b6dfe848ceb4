"""Logical tensors assembled from pieces stored elsewhere: DCP chunks, rank shards, flat partitions.

A distributed checkpoint stores one logical tensor as pieces, each a box of the tensor's index
space (``offsets``, ``sizes``) held by a stored tensor in some file. :class:`AssembledRecords` is the
record source of such tensors: reading a range of the logical tensor reads the pieces that cover it,
a bounded slab at a time, and checks that the pieces cover each slab exactly once.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ckpt_tui.core.errors import ReadError, ShortRead
from ckpt_tui.core.model import byte_source
from ckpt_tui.core.model.dtypes import itemsize
from ckpt_tui.core.model.tree import RecordSource, Storage, Tensor

if TYPE_CHECKING:  # numpy is imported where values are read: opening a file does not need it
    import numpy as np


@dataclass(slots=True)
class Piece:
    """One stored box of a logical tensor: where it sits, and the stored tensor that holds it."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    where: str
    load: Callable[[], Tensor]
    """The stored tensor (its shape equals ``sizes``), resolved on first read."""
    narrows: bool = False
    """The stored tensor may be larger than the box in any dimension: its first ``sizes`` are read (what
    ``dcp.load`` does, ``narrow_tensor_by_index``); else its shape must equal ``sizes``."""
    _tensor: Tensor | None = field(default=None, repr=False)

    @property
    def numel(self) -> int:
        """Elements in the box."""
        return math.prod(self.sizes)

    def tensor(self) -> Tensor:
        """The stored tensor, loaded once and checked against the box."""
        if self._tensor is None:
            stored = self.load()
            if not self.fits(stored.shape):
                raise ReadError(f"{self.where}: holds shape {list(stored.shape)}, the metadata says {list(self.sizes)}")
            if stored.storage is None or stored.storage.source is None:
                raise ReadError(f"{self.where}: the stored piece has no data")
            self._tensor = stored
        return self._tensor

    def fits(self, shape: tuple[int, ...]) -> bool:
        """Whether a stored tensor of ``shape`` gives this box (equal, or narrowed when :attr:`narrows`)."""
        if not self.narrows:
            return shape == self.sizes
        return len(shape) == len(self.sizes) and all(n >= size for n, size in zip(shape, self.sizes, strict=True))


@dataclass(slots=True)
class Layout:
    """How one logical tensor is cut: the grid it is indexed by, and its pieces."""

    grid: tuple[int, ...]
    pieces: list[Piece]
    overwrite: bool = False
    """Pieces may overlap, each copied over those before it (``dcp.load``'s ``copy_`` in its read order); else
    they must cover the grid exactly once."""
    casts: frozenset[tuple[str, str]] = frozenset()
    """(stored dtype, tensor dtype) pairs a piece is converted between, as its loader converts them."""
    unreadable: str | None = None
    """Why its values are not read (pieces whose values its loaders do not agree on), in words; None: read."""


def check_cover(name: str, grid: tuple[int, ...], pieces: list[Piece], exact: bool = True) -> None:
    """Every piece inside the grid, and (``exact``) their sizes adding up to the whole (cheap checks at open)."""
    for piece in pieces:
        if len(piece.offsets) != len(grid) or len(piece.sizes) != len(grid):
            raise ReadError(f"{name}: a piece has {len(piece.offsets)} dimensions, the tensor {len(grid)}")
        for start, size, total in zip(piece.offsets, piece.sizes, grid, strict=True):
            if type(start) is not int or type(size) is not int or start < 0 or size < 0 or start + size > total:
                raise ReadError(
                    f"{name}: piece at {list(piece.offsets)} size {list(piece.sizes)} is outside {list(grid)}"
                )
    covered = sum(p.numel for p in pieces)
    if exact and covered != math.prod(grid):
        raise ReadError(f"{name}: its pieces hold {covered} elements, the tensor has {math.prod(grid)}")


class AssembledRecords(RecordSource):
    """The record source of logical tensors made of pieces (one per checkpoint)."""

    in_place = False
    """Its storages are assembled from pieces of several files, while read or written."""
    made_on_save: str | None = None
    """Its values can be read before any save."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.layouts: dict[str, Layout] = {}
        self._lock = threading.Lock()

    def add(
        self,
        storage_key: str,
        grid: tuple[int, ...],
        pieces: list[Piece],
        overwrite: bool = False,
        casts: frozenset[tuple[str, str]] = frozenset(),
        unreadable: str | None = None,
    ) -> None:
        """Register the pieces of one logical storage (checked for bounds, and for total size unless they may
        overlap: see :class:`Layout`); ``unreadable``: why its values are never read (its shape still shown)."""
        check_cover(storage_key, grid, pieces, exact=not overwrite and unreadable is None)
        self.layouts[storage_key] = Layout(grid, pieces, overwrite, WIDENINGS | casts, unreadable)

    def has(self, storage: Storage) -> bool:
        """Whether the storage's pieces are known."""
        return storage.key in self.layouts

    def locate(self, storage: Storage) -> tuple[int, int]:
        """Assembled storages have no single place in one file."""
        raise ReadError(
            f"{storage.key}: assembled from {len(self.layouts[storage.key].pieces)} pieces in several files"
        )

    def placement(self, storage: Storage) -> list[str]:
        """Where each piece lives, one line each (``rows 0:5 in __0_0.distcp``)."""
        layout = self.layouts.get(storage.key)
        if layout is None:
            return []
        return [f"{box_text(p.offsets, p.sizes)} in {p.where}" for p in layout.pieces]

    def elements(self, storage: Storage, begin: int, end: int, chunk: int, raw_type: np.dtype) -> Iterator[np.ndarray]:
        """Raw elements ``begin:end`` of the logical storage in row-major order, a bounded slab at a time."""
        layout = self.layouts[storage.key]
        if layout.unreadable is not None:
            raise ReadError(layout.unreadable)
        with self._lock:
            pieces = [(p, p.tensor()) for p in layout.pieces]
        for piece, stored in pieces:
            if stored.dtype != storage.dtype and (stored.dtype, storage.dtype) not in layout.casts:
                raise ReadError(f"{piece.where}: stored as {stored.dtype}, the tensor is {storage.dtype}")
            _check_extent(piece, stored)
        for start, offsets, sizes in _slabs(layout.grid, chunk):
            stop = start + math.prod(sizes)
            if stop <= begin or start >= end:
                continue
            slab = _fill(offsets, sizes, pieces, raw_type, storage, layout.overwrite).reshape(-1)
            yield slab[max(begin, start) - start : min(end, stop) - start]

    def check_view(self, tensor: Tensor) -> None:
        """Only whole, contiguous views inside the storage are assembled."""
        storage = tensor.storage
        assert storage is not None
        if not tensor.is_contiguous() or tensor.dtype == "complex32":
            raise ReadError("only whole, contiguous views of an assembled tensor can be read")
        if tensor.offset < 0 or tensor.offset + math.prod(tensor.shape) > storage.numel:
            raise ReadError("tensor reaches outside its assembled storage")

    def view_elements(self, tensor: Tensor, chunk: int, raw_type: np.dtype) -> Iterator[np.ndarray]:
        """A whole, contiguous view's raw elements (as :meth:`elements` gives them)."""
        assert tensor.storage is not None
        self.check_view(tensor)
        return self.elements(tensor.storage, tensor.offset, tensor.offset + math.prod(tensor.shape), chunk, raw_type)

    def read_bytes(self, storage: Storage, start: int, count: int) -> bytes:
        """``count`` raw bytes of the logical storage from byte ``start`` (both whole elements)."""
        import numpy as np

        size = itemsize(storage.dtype)
        raw = np.dtype(f"V{size}")
        parts = self.elements(storage, start // size, (start + count) // size, max(1, count // size), raw)
        return b"".join(part.tobytes() for part in parts)


def box_text(offsets: tuple[int, ...], sizes: tuple[int, ...]) -> str:
    """``[0:5, 0:8]``: the index box a piece covers."""
    return "[" + ", ".join(f"{o}:{o + s}" for o, s in zip(offsets, sizes, strict=True)) + "]"


def _slabs(grid: tuple[int, ...], chunk: int) -> Iterator[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    """Boxes that tile the grid in row-major order, each a contiguous run of at most ``chunk`` elements
    (or one innermost row when a row alone is larger): (linear start, offsets, sizes)."""
    if math.prod(grid) == 0:
        return
    if not grid:
        yield 0, (), ()
        return
    split = next(k for k in range(len(grid)) if math.prod(grid[k + 1 :]) <= chunk)
    inner = math.prod(grid[split + 1 :])
    step = max(1, chunk // inner)
    strides = [math.prod(grid[k + 1 :]) for k in range(len(grid))]
    for prefix in itertools.product(*(range(n) for n in grid[:split])):
        for row in range(0, grid[split], step):
            offsets = (*prefix, row, *(0,) * (len(grid) - split - 1))
            sizes = (*(1,) * split, min(step, grid[split] - row), *grid[split + 1 :])
            yield sum(o * s for o, s in zip(offsets, strides, strict=True)), offsets, sizes


REPEAT_FACTOR = 16
REPEAT_SLACK_BYTES = 64 << 20
"""A stored piece may repeat its elements (``expand``, stride 0) only this much: an assembled tensor is
read element by element, so a piece of 2**32 elements over one stored float would cost 16 GB of reading
from a few bytes of file (:func:`ckpt_tui.core.values.tensor_values.repeats_far_more`, the same bound)."""


def _check_extent(piece: Piece, stored: Tensor) -> None:
    storage = stored.storage
    assert storage is not None and storage.source is not None
    _, available = storage.source.locate(storage)
    if stored.numel == 0:
        return
    low = stored.offset + sum((n - 1) * s for n, s in zip(stored.shape, stored.stride, strict=True) if s < 0)
    high = stored.offset + sum((n - 1) * s for n, s in zip(stored.shape, stored.stride, strict=True) if s > 0)
    if low < 0 or (high + 1) * itemsize(stored.dtype) > available:
        raise ReadError(f"{piece.where}: the stored piece reaches outside its record")
    span = high - low + 1
    if stored.numel > REPEAT_FACTOR * span and (stored.numel - span) * itemsize(stored.dtype) > REPEAT_SLACK_BYTES:
        raise ReadError(
            f"{piece.where}: the stored piece is a view of {stored.numel} elements over {span} stored "
            "(expand, stride 0); an assembled tensor is read element by element, so it is not read"
        )


def _fill(
    offsets: tuple[int, ...],
    sizes: tuple[int, ...],
    pieces: list[tuple[Piece, Tensor]],
    raw_type: np.dtype,
    storage: Storage,
    overwrite: bool,
) -> np.ndarray:
    import numpy as np

    out = np.empty(sizes, dtype=raw_type)
    hits = np.zeros(sizes, dtype=np.uint8)
    for piece, stored in pieces:
        low = tuple(max(a, b) for a, b in zip(offsets, piece.offsets, strict=True))
        high = tuple(min(a + n, b + m) for a, n, b, m in zip(offsets, sizes, piece.offsets, piece.sizes, strict=True))
        if any(lo >= hi for lo, hi in zip(low, high, strict=True)):
            continue
        block = _read_box(stored, tuple(lo - p for lo, p in zip(low, piece.offsets, strict=True)), high, low)
        target = tuple(slice(lo - o, hi - o) for lo, hi, o in zip(low, high, offsets, strict=True))
        shape = tuple(h - lo for lo, h in zip(low, high, strict=True))
        out[target] = _convert(block, stored.dtype, storage.dtype, raw_type).reshape(shape)
        if overwrite:
            hits[target] = 1  # (the later piece's values replace the earlier's, as copy_ does)
        else:
            hits[target] += 1
    if not np.all(hits == 1):
        if overwrite:
            raise ReadError(
                f"{storage.key}: its pieces leave a gap (box {box_text(offsets, sizes)}): its loader leaves those "
                "elements as torch.empty made them, values no reader can tell"
            )
        raise ReadError(f"{storage.key}: its pieces overlap or leave a gap (box {box_text(offsets, sizes)})")
    return out


WIDENINGS = frozenset({("bfloat16", "float32"), ("float16", "float32")})
"""Exact conversions a piece may need (DeepSpeed's zero_to_fp32 turns bf16/fp16 buffers into fp32)."""
COPY_CASTS = frozenset(
    {("float32", "float64"), ("float64", "float32"), ("float16", "float64"), ("bfloat16", "float64")}
)
"""Conversions ``Tensor.copy_`` makes that numpy makes bit for bit alike (IEEE round to nearest even, overflow to
inf): what ``dcp.load`` does with a chunk stored in another float dtype than its tensor's."""
_FLOATS = {"float16": "<f2", "float32": "<f4", "float64": "<f8"}


def _convert(block: np.ndarray, stored: str, target: str, raw_type: np.dtype) -> np.ndarray:
    """A piece's raw bytes as elements of the tensor's dtype (``raw_type``: its raw form)."""
    if stored == target:
        return block.view(raw_type)
    if stored == "bfloat16":
        widened = (block.view("<u2").astype("<u4") << 16).view("<f4")
    else:
        widened = block.view(_FLOATS[stored])
    import numpy as np

    with np.errstate(over="ignore"):  # (a float64 past float32's range becomes inf, as copy_ makes it)
        return widened.astype(_FLOATS[target]).view(raw_type)


def _read_box(stored: Tensor, start: tuple[int, ...], high: tuple[int, ...], low: tuple[int, ...]) -> np.ndarray:
    """The box ``start`` + (high - low) of a stored tensor, read with one positioned read when contiguous."""
    import numpy as np

    storage = stored.storage
    assert storage is not None and storage.source is not None
    size = itemsize(stored.dtype)
    shape = tuple(h - lo for lo, h in zip(low, high, strict=True))
    element = stored.offset + sum(i * s for i, s in zip(start, stored.stride, strict=True))
    data_start, _ = storage.source.locate(storage)
    count = math.prod(shape)
    probe = Tensor(storage, element, shape, stored.stride, stored.dtype)
    path = storage.source.path
    version = storage.source.version
    if probe.is_contiguous():
        try:
            data = byte_source.read_checked(path, version, data_start + element * size, count * size)
        except ShortRead:
            # (a read refused past --max-download, or failed, says so itself)
            raise ShortRead(f"{path}: piece data ends early (file truncated?)") from None
        return np.frombuffer(data, np.uint8)
    if not count:
        return np.empty(0, np.uint8)
    # the box's bytes from its lowest to its highest element (both inside the record: _check_extent)
    steps = list(zip(shape, stored.stride, strict=True))
    lowest = element + sum((n - 1) * s for n, s in steps if s < 0)
    highest = element + sum((n - 1) * s for n, s in steps if s > 0)
    if (highest - lowest + 1) * size <= byte_source.READ_WHOLE:
        # read, not mapped: a file cut short meanwhile is a short read, not a SIGBUS
        span = byte_source.read_checked(path, version, data_start + lowest * size, (highest - lowest + 1) * size)
        base = np.frombuffer(span, np.uint8)
        view = np.lib.stride_tricks.as_strided(
            base[(element - lowest) * size :],
            shape=(*shape, size),
            strides=(*(s * size for s in stored.stride), 1),
            writeable=False,
        )
        return np.ascontiguousarray(view).reshape(-1)
    mapped = byte_source.MappedFile(path, version)
    try:
        base = np.frombuffer(mapped.buffer(0, byte_source.size_of(path)), np.uint8)
        view = np.lib.stride_tricks.as_strided(
            base[data_start + element * size :],
            shape=(*shape, size),
            strides=(*(s * size for s in stored.stride), 1),
            writeable=False,
        )
        block = np.ascontiguousarray(view).reshape(-1)
        del view, base
        mapped.confirm()
        return block
    finally:
        mapped.close()
