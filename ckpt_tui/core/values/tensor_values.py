"""Reading tensor values from a file: raw elements in bounded chunks, decoded to float64.

Every read stays inside the tensor's storage record (a deflated zip record is inflated into memory
first, within the archive's inflate cap): the lowest and the highest element a view
touches are both checked against the record before anything is mapped, and strided views are
built by numpy over a buffer cut to the record, which checks the same bounds again. Contiguous
tensors are read with positioned reads (for a pass that asks for reused buffers, statistics, diff --stats,
average, into a ring of them); a strided view's span is read into memory (up to :data:`READ_WHOLE`), a
larger one goes through an mmap whose pages are released after each chunk.

Every read is of the file as it was opened: the descriptor is checked against the record source's
version as it opens and after the last read of a pass (``byte_source.check_unchanged``), so a file replaced
or rewritten since is ``FileChanged``, never values from another file than the tree. Nothing is read through
a map but the strided views past :data:`READ_WHOLE`: a file cut short while read is a short read (one line),
not the SIGBUS that kills a process reading a map past the file's new end.

A view that repeats elements (a stride of 0, as ``expand`` makes, or overlapping strides) is read
as its storage: :meth:`TensorReader.distinct_chunks` gives each stored element once with the number
of times the view repeats it, so statistics cost the size of the storage, not of the view.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Callable, Iterator

import numpy as np

from ckpt_tui.core.errors import FileChanged, ReadError
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.dtypes import DTYPES, itemsize
from ckpt_tui.core.model.made_bytes import made_records
from ckpt_tui.core.model.tree import Tensor, view_bits

CHUNK_ELEMENTS = 1 << 21
RING_CHUNK = CHUNK_ELEMENTS // 4
"""Elements statistics read at once into reused buffers: a buffer that stays in cache while the chunk's several
passes run (read, not mapped: 2 GB summarised in chunks four times this size cost 20% more CPU in the copy)."""
MAX_DIMS = 32
MAX_ELEMENTS = 1 << 63
"""torch counts elements in an int64: a tensor claiming more is refused by torch.load too."""
MULTIPLICITY_SPAN = 1 << 24
"""Overlapping views over at most this many stored elements are counted exactly, element by element."""
DIRECT_REPEATS = 4
READ_WHOLE = places.READ_WHOLE
"""Overlapping views reading each stored element at most this many times (on average) are read directly."""

_NUMPY_TYPES = {
    "float64": "f8",
    "float32": "f4",
    "float16": "f2",
    "bfloat16": "u2",
    "int64": "i8",
    "int32": "i4",
    "int16": "i2",
    "int8": "i1",
    "uint8": "u1",
    "uint16": "u2",
    "uint32": "u4",
    "uint64": "u8",
    "bool": "u1",
    "complex128": "c16",
    "complex64": "c8",
    "complex32": "u4",  # a pair of float16: decoded through a view
    "qint8": "i1",
    "quint8": "u1",
    "qint32": "i4",
    "quint4x2": "u1",
    "quint2x4": "u1",
    "float8_e4m3fn": "u1",
    "float8_e5m2": "u1",
    "float8_e4m3fnuz": "u1",
    "float8_e5m2fnuz": "u1",
    "float8_e8m0fnu": "u1",
}


def _fp8_table(exponent_bits: int, bias: int, fn: bool, uz: bool) -> np.ndarray:
    mantissa_bits = 7 - exponent_bits
    table = np.empty(256, dtype=np.float64)
    top = (1 << exponent_bits) - 1
    for byte in range(256):
        sign = -1.0 if byte & 0x80 else 1.0
        exp = (byte >> mantissa_bits) & top
        man = byte & ((1 << mantissa_bits) - 1)
        if uz and byte == 0x80:
            value = math.nan
        elif not fn and not uz and exp == top:
            value = sign * math.inf if man == 0 else math.nan
        elif fn and exp == top and man == (1 << mantissa_bits) - 1:
            value = math.nan
        elif exp == 0:
            value = sign * man / (1 << mantissa_bits) * 2.0 ** (1 - bias)
        else:
            value = sign * (1 + man / (1 << mantissa_bits)) * 2.0 ** (exp - bias)
        table[byte] = value
    return table


_FP8_TABLES = {
    "float8_e4m3fn": _fp8_table(4, 7, fn=True, uz=False),
    "float8_e5m2": _fp8_table(5, 15, fn=False, uz=False),
    "float8_e4m3fnuz": _fp8_table(4, 8, fn=False, uz=True),
    "float8_e5m2fnuz": _fp8_table(5, 16, fn=False, uz=True),
    "float8_e8m0fnu": np.array([2.0 ** (b - 127) for b in range(255)] + [math.nan]),
}


def numpy_dtype(dtype: str, byteorder: str = "little") -> np.dtype:
    """The numpy type that holds a torch dtype's raw bytes, one element per item."""
    code = _NUMPY_TYPES.get(dtype)
    if code is None:
        raise ReadError(f"cannot read values of dtype {dtype}")
    return np.dtype(("<" if byteorder == "little" else ">") + code)


def read_order(tensor: Tensor, byteorder: str) -> str | None:
    """The byte order a tensor's elements are in once torch.load has swapped a file of ``byteorder``.

    torch swaps a big-endian file's storage in units of its storage type's element (half of a complex one),
    once, as the storage is first loaded, then reads the tensor's dtype over those bytes
    (``torch.serialization._load``, ``TypedStorage.byteswap``). So: the file's order where the units match;
    little-endian where the storage's elements are single bytes (an ``UntypedStorage``, as torch.save writes
    uint16..64, float8 and complex32 tensors; a ``ByteStorage``); None where no dtype reads the bytes as torch
    leaves them (units of 2 under 4-byte values).
    """
    storage = tensor.storage
    if byteorder == "little" or storage is None or storage.dtype not in DTYPES or tensor.dtype not in DTYPES:
        return byteorder
    unit = _swap_unit(storage.dtype)
    if unit == _swap_unit(tensor.dtype):
        return byteorder
    return "little" if unit == 1 else None


def _swap_unit(dtype: str) -> int:
    """Bytes torch swaps as one in a storage of ``dtype`` (a complex number's two parts each on its own)."""
    size = itemsize(dtype)
    return max(size // 2, 1) if dtype in COMPLEX_DTYPES else size


_INTEGERS = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})


def decode(raw: np.ndarray, dtype: str, metadata: dict[str, object] | None = None) -> np.ndarray:
    """Raw elements to float64 (complex: magnitudes; bf16 widened; fp8 through a table), the neg bit applied
    as torch applies it."""
    _, neg = view_bits(metadata)
    if neg and dtype in _INTEGERS:
        # torch negates in the tensor's own type: a uint8 250 loads as 6, an int8 -128 stays -128
        with np.errstate(all="ignore"):
            return np.negative(raw).astype(np.float64)
    if dtype == "bfloat16":
        values = (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    elif dtype in _FP8_TABLES:
        values = _FP8_TABLES[dtype][raw]
    elif dtype == "complex32":
        half = np.dtype(">f2") if raw.dtype.byteorder == ">" else np.dtype("<f2")
        pairs = np.ascontiguousarray(raw).view(half).astype(np.float64).reshape(-1, 2)
        values = np.hypot(pairs[:, 0], pairs[:, 1])
    elif raw.dtype.kind == "c":
        values = _magnitudes(raw)
    elif dtype == "bool":
        # a bool byte other than 0 is True in torch (its value as a number is 1)
        values = (raw != 0).astype(np.float64)
    else:
        values = raw.astype(np.float64)
    # a bool has no negation in torch (every op on such a tensor fails): its stored values are shown
    if neg and dtype != "bool":
        values = -values
    return values


def _magnitudes(raw: np.ndarray) -> np.ndarray:
    """|z| of complex elements in float64, as torch's ``isfinite`` sees them: a complex64 is widened first
    (its float32 ``abs`` overflows to Inf past 3.4e38 though both parts are finite), and a magnitude past
    float64's range with finite parts is its largest finite value, never an Inf torch does not count."""
    values = np.abs(raw.astype(np.complex128, copy=False))
    overflow = np.isinf(values)
    if overflow.any():
        overflow &= np.isfinite(raw.real) & np.isfinite(raw.imag)
        values[overflow] = np.finfo(np.float64).max
    return values


def nan_beside_inf(raw: np.ndarray, dtype: str) -> np.ndarray | None:
    """Complex elements with one part Inf and the other NaN: torch's ``isnan`` and ``isinf`` both count them,
    their magnitude (Inf) only the latter. None for a real dtype."""
    if dtype == "complex32":
        half = np.dtype(">f2") if raw.dtype.byteorder == ">" else np.dtype("<f2")
        pairs = np.ascontiguousarray(raw).view(half).reshape(-1, 2)
        real, imag = pairs[:, 0], pairs[:, 1]
    elif raw.dtype.kind == "c":
        real, imag = raw.real, raw.imag
    else:
        return None
    return (np.isinf(real) & np.isnan(imag)) | (np.isnan(real) & np.isinf(imag))


_SIGN_BITS = {"bfloat16": 0x8000, "float8_e4m3fn": 0x80, "float8_e5m2": 0x80, "float8_e4m3fnuz": 0x80}
_SIGN_BITS["float8_e5m2fnuz"] = 0x80


def as_loaded(raw: np.ndarray, dtype: str, metadata: dict[str, object] | None) -> np.ndarray:
    """Raw elements, in native byte order, as torch loads them: a tensor saved with its neg or conj view bit
    set loads as the negated or conjugated values, so its bits are compared after that (complex32: a pair
    of float16, real part in the low half)."""
    native = raw.astype(raw.dtype.newbyteorder("="), copy=False)
    conj, neg = view_bits(metadata)
    if not (neg or conj):
        return native
    if dtype == "complex32":
        mask = (0x80008000 if neg else 0) ^ (0x80000000 if conj else 0)
        return native ^ np.uint32(mask)
    if conj and native.dtype.kind == "c":
        native = np.conj(native)
    if neg and dtype in _SIGN_BITS:
        return native ^ native.dtype.type(_SIGN_BITS[dtype])
    if neg and dtype != "bool":
        with np.errstate(all="ignore"):
            return np.negative(native)
    return native


COMPLEX_DTYPES = frozenset({"complex32", "complex64", "complex128"})


def decode_complex(raw: np.ndarray, dtype: str, metadata: dict[str, object] | None = None) -> np.ndarray:
    """Raw elements to complex128 with both parts, as torch loads them (neg/conj view bits applied), for
    comparing values: :func:`decode` gives a complex element's magnitude, which hides a sign or phase change.
    A real dtype is widened to complex with imaginary part 0."""
    if dtype not in COMPLEX_DTYPES:
        return decode(raw, dtype, metadata).astype(np.complex128)
    if dtype == "complex32":
        # a big-endian file swaps each float16 part on its own: made native part by part (real in the low half)
        if raw.dtype.byteorder == ">":
            raw = np.ascontiguousarray(raw).view(">f2").astype("<f2").view("<u4")
        raw = as_loaded(raw, dtype, metadata)
        # (real, imaginary) float16 pairs widened into a complex128's two float64 parts
        return np.ascontiguousarray(raw).view("<f2").astype(np.float64).view(np.complex128)
    return as_loaded(raw, dtype, metadata).astype(np.complex128)


def decode_compact(raw: np.ndarray, dtype: str, metadata: dict[str, object] | None = None) -> np.ndarray:
    """The values :func:`decode` gives, held in float32 where float32 holds them exactly (float32, float16,
    bfloat16), else float64: half the memory traffic for the common dtypes."""
    if dtype == "float32":
        values = raw.astype(np.float32, copy=False)  # no copy when the bytes are in native order
    elif dtype == "float16":
        values = raw.astype(np.float32)
    elif dtype == "bfloat16":
        values = np.left_shift(raw, 16, dtype=np.uint32).view(np.float32)
    else:
        return decode(raw, dtype, metadata)
    if view_bits(metadata)[1]:
        values = -values
    return values


def element_span(offset: int, shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, int] | None:
    """The lowest and highest storage element a view touches (None when it has no elements).

    Negative strides reach below ``offset``; positive ones above it. Both ends must be checked.
    """
    if any(n == 0 for n in shape):
        return None
    low = high = offset
    for size, step in zip(shape, stride, strict=True):
        if step < 0:
            low += (size - 1) * step
        else:
            high += (size - 1) * step
    return low, high


MAPPED_AT_LEAST = 1 << 20
"""Bytes of a view below which :meth:`TensorReader.shared_reads` copies its values even where maps are asked for."""

SharedRead = Callable[[int, int, memoryview], memoryview]
"""Reads ``count`` elements from element ``element`` of a record into a buffer (:meth:`TensorReader.shared_reads`)."""


class TensorReader:
    """Reads one tensor's elements from its storage record, in bounded chunks, never outside the record."""

    def __init__(self, tensor: Tensor, byteorder: str = "little", ring: str = "ring", saving: bool = False) -> None:
        """``saving``: the view is read to be written, so values that exist only once saved (a cast,
        rewritten bytes) are made now; otherwise reading them is refused with why."""
        self.ring = ring
        """Which of this thread's rings of reused buffers its reads with ``reuse`` go into (two readers whose
        chunks are used together need two rings)."""
        storage = tensor.storage
        if storage is None or storage.source is None:
            raise ReadError(f"values of {tensor.kind} tensors are not stored in this file")
        if tensor.kind != "dense":
            raise ReadError(f"values of {tensor.kind} tensors cannot be read")
        if storage.location == "meta":
            # torch.load reads the record, then makes the storage a meta one: the tensor it loads has no values
            raise ReadError("a meta tensor has no values (torch.load loads it without data)")
        if len(tensor.shape) != len(tensor.stride):
            raise ReadError("tensor size and stride do not match")
        if tensor.dtype == "bool" and tensor.metadata and view_bits(tensor.metadata)[1]:
            # torch loads it, but negating bools is not implemented: reading its values fails there too
            raise ReadError("a bool tensor saved with the neg bit: torch cannot read its values (no neg for bool)")
        self.tensor = tensor
        order = read_order(tensor, byteorder)
        # (no element, no bytes to swap)
        if order is None and 0 in tensor.shape:
            order = byteorder
        if order is None:
            raise ReadError(
                f"values of this {tensor.dtype} tensor cannot be read: its big-endian storage of {storage.dtype} "
                "elements is byte-swapped by torch in units of another size"
            )
        self.raw_type = numpy_dtype(tensor.dtype, order)
        self.size = itemsize(tensor.dtype)
        if self.raw_type.itemsize != self.size:
            raise ReadError(f"cannot read values of dtype {tensor.dtype}")
        self.numel = math.prod(tensor.shape)
        if self.numel >= MAX_ELEMENTS:
            raise ReadError(f"tensor claims {self.numel} elements, more than any real tensor holds")
        self.span = element_span(tensor.offset, tensor.shape, tensor.stride)
        self.path = storage.source.path
        self.version = getattr(storage.source, "version", None)
        """The file's version as it was opened: read only while it is still that (``FileChanged``)."""
        self.memory: bytes | None = None
        made = made_records(storage.source)
        # bytes made, not read from a record: pieces of several files (read now), a cast or rewritten
        # bytes (made only for a save; otherwise the source's locate says why they cannot be read)
        self.made = made if made is not None and (made.made_on_save is None or saving) else None
        if self.made is not None:
            self.made.check_view(tensor)
            self.record_start, self.record_bytes = 0, 0
            return
        self.record_start, self.record_bytes = self._bounds()

    def _bounds(self) -> tuple[int, int]:
        """Where the record starts and how many of its bytes the view may touch; checks the view's extent."""
        tensor, storage = self.tensor, self.tensor.storage
        assert storage is not None and storage.source is not None
        if tensor.offset < 0:
            raise ReadError("tensor starts before its storage (negative offset): torch.load refuses it")
        if self.span is None:
            return 0, 0
        source = storage.source
        compressed = getattr(source, "is_compressed", None)
        if compressed is not None and compressed(storage):  # a deflated zip record: inflated, capped
            self.memory = source.inflate(storage)  # type: ignore[attr-defined]
            record_start, available = 0, len(self.memory)
        else:
            record_start, available = source.locate(storage)
        usable = min(available, storage.nbytes)
        if any(size > 1 and step < 0 for size, step in zip(tensor.shape, tensor.stride, strict=True)):
            raise ReadError("tensor has negative strides: torch.load refuses it")
        low, high = self.span
        if low < 0:
            raise ReadError("tensor reaches before the start of its storage (negative strides): torch.load refuses it")
        if (high + 1) * self.size > usable:
            raise ReadError(f"tensor reaches past the end of its storage ({usable} bytes): torch.load refuses it")
        return record_start, usable

    # ---- row-major reads ------------------------------------------------------------------

    def chunks(self, chunk: int = CHUNK_ELEMENTS, reuse: int = 0) -> Iterator[np.ndarray]:
        """Every element in row-major order, ``chunk`` at a time (the last chunk may be shorter), raw dtype.

        ``reuse``: as :meth:`distinct_chunks` takes it (a chunk's array may be read into ``reuse`` chunks later).
        """
        if self.span is None:
            return
        if self.made is not None:
            yield from _exact_chunks(self.made.view_elements(self.tensor, chunk, self.raw_type), chunk)
            return
        yield from self._view_chunks(self.tensor.shape, self.tensor.stride, chunk, reuse)

    def first(self, count: int) -> np.ndarray:
        """The first ``count`` elements in row-major order (raw dtype), read one by one."""
        if self.span is None or count <= 0:
            return np.empty(0, self.raw_type)
        if self.made is not None:
            return next(self.chunks(count), np.empty(0, self.raw_type))
        positions = [self._position(index) for index in range(min(count, self.numel))]
        with self._reading() as read:
            data = b"".join(read(position, 1) for position in positions)
        return np.frombuffer(data, self.raw_type)

    def _position(self, index: int) -> int:
        position = self.tensor.offset
        for size, step in zip(reversed(self.tensor.shape), reversed(self.tensor.stride), strict=True):
            index, digit = divmod(index, size)
            position += digit * step
        return position

    # ---- each stored element once ---------------------------------------------------------

    @property
    def in_order(self) -> bool:
        """Whether :meth:`distinct_chunks` gives every element once, in row-major order (a dense layout)."""
        return self.span is not None and _is_row_major(self.tensor.shape, self.tensor.stride)

    @property
    def distinct_count(self) -> int:
        """How many items :meth:`distinct_chunks` yields at most (the elements it reads)."""
        shape, stride, _ = self._without_repeats()
        numel = math.prod(shape)
        span = element_span(self.tensor.offset, shape, stride)
        if span is None:
            return 0
        return min(numel, span[1] - span[0] + 1)

    def distinct_chunks(
        self, chunk: int = CHUNK_ELEMENTS, reuse: int = 0
    ) -> Iterator[tuple[np.ndarray, int | np.ndarray]]:
        """Each element the view reads, with how many times the view holds it: ``(raw, repeats)``.

        ``repeats`` is one int for the whole chunk, or an array of counts (one per element). The
        repeats of all chunks add up to the tensor's element count; the work is bounded by the
        storage's size, whatever the view's shape. ``reuse``: read dense chunks into a ring of that
        many buffers, so a chunk's array is overwritten ``reuse`` chunks later (the caller must be
        done with it by then); 0: every chunk is a fresh array.
        """
        if self.span is None:
            return
        if self.made is not None:
            yield from ((raw, 1) for raw in self.chunks(chunk))
            return
        shape, stride, repeats = self._without_repeats()
        numel = math.prod(shape)
        low, high = element_span(self.tensor.offset, shape, stride) or (0, 0)
        span = high - low + 1
        if numel <= span or (numel <= DIRECT_REPEATS * span and span > MULTIPLICITY_SPAN):
            yield from ((raw, repeats) for raw in self._view_chunks(shape, stride, chunk, reuse))
            return
        if span > MULTIPLICITY_SPAN:
            raise ReadError(
                f"a view repeating its {span} stored elements {numel // span}x on average: too many to count"
            )
        counts = _multiplicity(self.tensor.offset - low, shape, stride, span) * repeats
        for begin in range(0, span, chunk):
            raw = np.concatenate(list(self._contiguous(low + begin, min(chunk, span - begin), chunk)))
            weight = counts[begin : begin + chunk]
            used = weight > 0
            yield raw[used], weight[used]

    def _without_repeats(self) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        """The view without its stride-0 and size-1 dimensions, and how often that drops repeat each element."""
        shape: list[int] = []
        stride: list[int] = []
        repeats = 1
        for size, step in zip(self.tensor.shape, self.tensor.stride, strict=True):
            if step == 0:
                repeats *= size
            elif size != 1:
                shape.append(size)
                stride.append(step)
        return tuple(shape), tuple(stride), repeats

    def _view_chunks(
        self, shape: tuple[int, ...], stride: tuple[int, ...], chunk: int, reuse: int = 0
    ) -> Iterator[np.ndarray]:
        numel = math.prod(shape)
        if _is_row_major(shape, stride):
            yield from self._contiguous(self.tensor.offset, numel, chunk, reuse)
            return
        with _RecordView(self) as view:
            flat = view.array(shape, stride).flat
            try:
                for begin in range(0, numel, chunk):
                    yield flat[begin : begin + chunk]  # a copy: nothing keeps the map alive
                    view.release_pages()
            finally:
                del flat

    # ---- positioned reads -----------------------------------------------------------------

    @contextlib.contextmanager
    def shared_reads(self, mapped: bool = False) -> Iterator[SharedRead | None]:
        """For a dense row-major view in a file on this machine: a function that reads ``count`` elements from
        element ``element`` of the record into a buffer, which any thread may call (positioned reads on one
        descriptor), checked against the record as every read is. None for every other view (read it with
        :meth:`distinct_chunks`). The file's version is confirmed after the last read, as for every pass.

        ``mapped``: where the file can be leased (:func:`~ckpt_tui.core.model.byte_source.lease`), each read
        hands back a window mapped under the lease instead (the buffer unused: no copy out of the page cache;
        a thread's reads in a row share a map of at least :data:`~ckpt_tui.core.model.byte_source.MAP_WINDOW`
        bytes); every window must be done with when the ``with`` ends."""
        if self.made is not None or self.memory is not None or not self.in_order:
            yield None
            return
        # (a small view costs a lease and a map more than its copy)
        if mapped and self.numel * self.size >= MAPPED_AT_LEAST:
            leased = places.lease(self.path, self.version)
            if leased is not None:
                try:

                    def window(element: int, count: int, buffer: memoryview) -> memoryview:
                        return leased.window(*self._checked(element, count))

                    yield window
                    # as a pass of positioned reads confirms the version: a writer that came while the values
                    # were read (it waited) is a changed file, whose values are not the tree's much longer
                    if not leased.held():
                        raise FileChanged(self.path)
                finally:
                    # (after the last window is done with: a writer waiting for the lease goes on now)
                    leased.close()
                return
        source = places.source_of(self.path, self.version)
        try:
            if source.local_fd() is None:
                yield None
                return

            def read(element: int, count: int, buffer: memoryview) -> memoryview:
                start, size = self._checked(element, count)
                if size > len(buffer):
                    raise ReadError("read outside the tensor's storage record refused")
                return _read_into(source, start, buffer[:size])

            yield read
            source.confirm()
        finally:
            source.close()

    def _contiguous(self, first: int, count: int, chunk: int, reuse: int = 0) -> Iterator[np.ndarray]:
        """``count`` elements stored one after another from element ``first`` (checked against the record).

        ``reuse``: into a ring of that many buffers of ``chunk`` elements (see :meth:`distinct_chunks`).
        """
        with self._reading(reuse and min(chunk, count) * self.size, reuse) as read:
            for begin in range(first, first + count, chunk):
                yield np.frombuffer(read(begin, min(chunk, first + count - begin)), self.raw_type)

    def _checked(self, element: int, count: int) -> tuple[int, int]:
        """Where ``count`` elements from element ``element`` of the record lie in the file, and their bytes;
        refused when they reach outside the record."""
        if element < 0 or count < 0 or (element + count) * self.size > self.record_bytes:
            raise ReadError("read outside the tensor's storage record refused")
        return self.record_start + element * self.size, count * self.size

    @contextlib.contextmanager
    def _reading(self, buffer_bytes: int = 0, buffers: int = 0) -> Iterator[Callable[[int, int], bytes | memoryview]]:
        """A function reading ``count`` elements from element ``element`` of the record, never outside it.

        With ``buffers``, file reads go into a ring of that many reused buffers of ``buffer_bytes``
        (no fresh pages for every read; the ring is this thread's, kept for its next reads); a read's
        bytes are then valid until the ring comes round, or until this thread reads with a ring again.
        """

        checked = self._checked
        if self.memory is not None:
            memory = self.memory

            def from_memory(element: int, count: int) -> bytes:
                start, size = checked(element, count)
                return memory[start : start + size]

            yield from_memory
            return
        source = places.source_of(self.path, self.version)
        try:

            def from_file(element: int, count: int) -> bytes:
                start, size = checked(element, count)
                data = source.read_at(start, size)
                if len(data) != size:
                    source.confirm()  # (cut short since it was opened: said as such)
                    raise ReadError("tensor data ends early (file truncated?)")
                return data

            if not buffers or not hasattr(os, "preadv"):
                yield from_file
            else:
                ring = _ring(buffer_bytes, buffers, self.ring)
                turn = iter(range(1 << 62))

                def into_ring(element: int, count: int) -> memoryview:
                    start, size = checked(element, count)
                    buffer = ring[next(turn) % buffers]
                    if size > len(buffer):
                        return memoryview(from_file(element, count))
                    return _read_into(source, start, buffer[:size])

                yield into_ring
            # after the pass's last read: a file rewritten while it was read is refused, not summed up
            source.confirm()
        finally:
            source.close()


def _read_into(source: places.ByteSource, start: int, buffer: memoryview) -> memoryview:
    """``buffer`` filled from ``start`` of the source: a short read is the file cut short since it was opened
    (said as such by the source's confirm) or a truncated file, never a partly filled buffer."""
    if source.readinto_at(start, buffer) != len(buffer):
        source.confirm()
        raise ReadError("tensor data ends early (file truncated?)")
    return buffer


_thread_buffers = threading.local()


def thread_buffer(nbytes: int, slot: str) -> memoryview:
    """This thread's reused buffer of at least ``nbytes`` (``slot``: which of its buffers), kept from read to
    read so that its pages are touched once."""
    return _ring(nbytes, 1, slot)[0]


def _ring(buffer_bytes: int, buffers: int, slot: str = "ring") -> list[memoryview]:
    """This thread's reused read buffers (``slot``: which of its rings), kept from tensor to tensor so that
    their pages are touched once."""
    ring: list[memoryview] | None = getattr(_thread_buffers, slot, None)
    if ring is None or len(ring) < buffers or len(ring[0]) < buffer_bytes:
        ring = [memoryview(bytearray(buffer_bytes)) for _ in range(buffers)]
        setattr(_thread_buffers, slot, ring)
    return ring[:buffers]


def _exact_chunks(parts: Iterator[np.ndarray], chunk: int) -> Iterator[np.ndarray]:
    """The same elements cut into pieces of exactly ``chunk`` (the last may be shorter)."""
    pending: list[np.ndarray] = []
    held = 0
    for part in parts:
        if not held and part.size == chunk:  # the usual case: a whole chunk as it came (fresh), not copied
            yield part
            continue
        while part.size:
            take = min(chunk - held, part.size)
            pending.append(part[:take])
            held += take
            part = part[take:]
            if held == chunk:
                yield np.concatenate(pending)
                pending, held = [], 0
    if held:
        yield np.concatenate(pending)


def _is_row_major(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expected = 1
    for size, step in zip(reversed(shape), reversed(stride), strict=True):
        if size != 1 and step != expected:
            return False
        expected *= size
    return True


class _RecordView:
    """A buffer cut to one storage record: numpy views over it cannot leave it. The record's bytes up to the
    view's last one are read into memory (at most :data:`READ_WHOLE`), a longer record is mapped."""

    def __init__(self, reader: TensorReader) -> None:
        self.reader = reader
        self._arrays: list[np.ndarray] = []
        self._map: places.MappedFile | None = None
        if reader.memory is not None:
            self._buffer = memoryview(reader.memory)[: reader.record_bytes]
            return
        assert reader.span is not None
        needed = min(reader.record_bytes, (reader.span[1] + 1) * reader.size)
        if needed <= READ_WHOLE:
            # read, not mapped: a file cut short meanwhile is a short read, not a SIGBUS
            self._buffer = memoryview(places.read_checked(reader.path, reader.version, reader.record_start, needed))
            return
        self._map = places.MappedFile(reader.path, reader.version)
        try:
            self._buffer = self._map.buffer(reader.record_start, reader.record_bytes)
        except ReadError:
            self._close()
            raise

    def array(self, shape: tuple[int, ...], stride: tuple[int, ...]) -> np.ndarray:
        """A read-only view of the record; numpy refuses one whose extent leaves the record."""
        reader = self.reader
        if len(shape) > MAX_DIMS:
            raise ReadError(f"tensor has {len(shape)} dimensions; at most {MAX_DIMS} can be read")
        try:
            view = np.ndarray(
                shape,
                reader.raw_type,
                buffer=self._buffer,
                offset=reader.tensor.offset * reader.size,
                strides=tuple(step * reader.size for step in stride),
            )
        except (ValueError, TypeError) as exc:
            raise ReadError(f"tensor view does not fit its storage record ({exc})") from None
        self._arrays.append(view)
        return view

    def release_pages(self) -> None:
        """Drop the mapped pages read so far (they are file-backed: reading them again is free); refuse a
        file changed since it was opened (checked after each chunk read through the map)."""
        if self._map is not None:
            self._map.release_pages()
            self._map.confirm()

    def __enter__(self) -> _RecordView:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    def _close(self) -> None:
        self._arrays.clear()
        try:
            buffer = getattr(self, "_buffer", None)
            if buffer is not None:
                buffer.release()
            if self._map is not None:
                self._map.close()
        except BufferError:  # a view is still referenced somewhere: the map is freed with it
            pass


def _multiplicity(start: int, shape: tuple[int, ...], stride: tuple[int, ...], span: int) -> np.ndarray:
    """How many index tuples of the view land on each element of its span (``start``: the view's offset in it).

    Strides are positive here: negative ones are refused before any read, and stride-0 dimensions are
    counted apart.
    """
    counts = np.zeros(span, dtype=np.uint64)
    counts[start] = 1
    for size, step in zip(shape, stride, strict=True):
        counts = _window_sum(counts, size, step)
    return counts


def _window_sum(counts: np.ndarray, size: int, step: int) -> np.ndarray:
    """``out[p] = sum(counts[p - i * step] for i in range(size))``, in linear time."""
    span = counts.size
    padded = np.zeros(-(-span // step) * step, dtype=counts.dtype)
    padded[:span] = counts
    running = padded.reshape(-1, step).cumsum(axis=0).reshape(-1)[:span]
    out = running.copy()
    reach = size * step
    if reach < span:
        out[reach:] -= running[: span - reach]
    return out


# ---- views that repeat their stored elements (expand, stride 0) -----------------------------------

REPEAT_FACTOR = 16
REPEAT_SLACK_BYTES = 64 << 20


def stored_span(tensor: Tensor) -> int:
    """How many storage elements a view reaches, from its lowest to its highest (0 when it is empty)."""
    span = element_span(tensor.offset, tensor.shape, tensor.stride)
    return 0 if span is None else span[1] - span[0] + 1


def repeats_far_more(tensor: Tensor) -> bool:
    """Whether a view holds far more elements than it stores (> 16x and > 64 MB more): ``expand``, stride 0.

    Such a view costs its storage to read (:meth:`TensorReader.distinct_chunks`), but every element to
    materialise: readers that walk it element by element, or a format without views, refuse it.
    """
    numel, span = tensor.numel, stored_span(tensor)
    return numel > REPEAT_FACTOR * span and (numel - span) * itemsize(tensor.dtype) > REPEAT_SLACK_BYTES


def same_layout(x: Tensor, y: Tensor) -> bool:
    """Whether two views pair the same element positions with storage positions (equal strides where size > 1)."""
    return x.shape == y.shape and all(
        a == b for size, a, b in zip(x.shape, x.stride, y.stride, strict=True) if size > 1
    )


def repeated_view_error(tensor: Tensor) -> ReadError:
    """The one line for a repeating view that would have to be read element by element."""
    return ReadError(
        f"a view of {tensor.numel} elements over {stored_span(tensor)} stored (expand, stride 0), laid out"
        " differently on the other side: not compared element by element"
    )


def paired_chunks(
    x: Tensor, y: Tensor, order_x: str, order_y: str, reuse: int = 0
) -> Iterator[tuple[np.ndarray, np.ndarray, int | np.ndarray]]:
    """Raw elements of two same-shaped tensors at the same positions, with how often each pair occurs.

    Laid out alike (:func:`same_layout`), each stored element is read once with its multiplicity, so a
    stride-0 view costs its storage; otherwise every element in row-major order, refused for a view that
    repeats its storage far more (:func:`repeats_far_more`). ``reuse``: as
    :meth:`TensorReader.distinct_chunks` takes it, for tensors laid out alike.
    """
    if same_layout(x, y):
        left = TensorReader(x, order_x).distinct_chunks(reuse=reuse)
        right = TensorReader(y, order_y, ring="ring_b").distinct_chunks(reuse=reuse)  # (its own buffers)
        for (raw_x, repeats), (raw_y, _) in zip(left, right, strict=True):
            yield raw_x, raw_y, repeats
        return
    for tensor in (x, y):
        if repeats_far_more(tensor):
            raise repeated_view_error(tensor)
    left_all = TensorReader(x, order_x).chunks()
    right_all = TensorReader(y, order_y).chunks()
    for raw_x, raw_y in zip(left_all, right_all, strict=True):
        yield raw_x, raw_y, 1
