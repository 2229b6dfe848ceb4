"""Bytes that are not copied as they are: cast storages, strided views, conj/neg bits, a bounded chunk at a time.

numpy is imported only when such bytes are produced: a plain copy or prefix edit never needs it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ckpt_tui.core.model.dtypes import itemsize
from ckpt_tui.core.model.made_bytes import CastSource, MemorySource
from ckpt_tui.core.model.tree import Storage, Tensor

if TYPE_CHECKING:
    import numpy as np


def cast_chunks(base: Storage, dtype: str, byteorder: str = "little") -> Iterator[bytes]:
    """A storage's elements converted to ``dtype``, a bounded chunk at a time."""
    whole = Tensor(base, 0, (base.numel,), (1,), base.dtype)
    yield from _converted(whole, dtype, byteorder)


VIEW_BITS = frozenset({"conj", "neg"})
"""The tensor metadata torch writes: lazy conjugation and negation, applied when the tensor is read."""


def view_bits(tensor: Tensor) -> tuple[bool, bool]:
    """A tensor's (conj, neg) bits; a ValueError for metadata that is anything else."""
    metadata = {} if tensor.metadata is None else tensor.metadata
    if not isinstance(metadata, dict):
        raise ValueError(f"tensor metadata is a {type(metadata).__name__}, not a dict of conjugation or negation bits")
    unknown = [key for key, value in metadata.items() if key not in VIEW_BITS or type(value) is not bool]
    if unknown:
        raise ValueError(f"tensor metadata {unknown[0]!r} is not a conjugation or negation bit")
    return bool(metadata.get("conj")), bool(metadata.get("neg"))


def tensor_bytes(tensor: Tensor) -> Iterator[bytes | memoryview]:
    """A tensor's values as contiguous little-endian bytes: cast storages converted, conj/neg bits applied."""
    storage = tensor.storage
    assert storage is not None
    import numpy as np

    from ckpt_tui.core.values.tensor_values import TensorReader, numpy_dtype

    conj, neg = view_bits(tensor)
    if isinstance(storage.source, MemorySource):  # contiguous from its offset: sanitize writes it so
        start = tensor.offset * itemsize(tensor.dtype)
        data = storage.source.data[start : start + tensor.nbytes]
        yield _apply_bits(np.frombuffer(data, numpy_dtype(tensor.dtype)), tensor.dtype, conj, neg)
        return
    if isinstance(storage.source, CastSource):
        base = storage.source.base
        chunks = _converted(Tensor(base, tensor.offset, tensor.shape, tensor.stride, base.dtype), tensor.dtype)
        yield from (_apply_bits(np.frombuffer(c, numpy_dtype(tensor.dtype)), tensor.dtype, conj, neg) for c in chunks)
        return
    for raw in TensorReader(tensor).chunks():
        yield _apply_bits(raw, tensor.dtype, conj, neg)


_SIGN_BITS = {"bfloat16": 0x8000, "float8_e4m3fn": 0x80, "float8_e5m2": 0x80}
NEGATABLE = frozenset(
    {"float64", "float32", "float16", "complex128", "complex64", "int64", "int32", "int16", "int8"} | set(_SIGN_BITS)
)


def _apply_bits(raw: np.ndarray, dtype: str, conj: bool, neg: bool) -> bytes | memoryview:
    """Raw elements with conjugation and negation resolved, as bytes (the chunk's own memory where nothing
    changes: a chunk is a fresh array, and copying it costs as much as writing it)."""
    if not conj and not neg:
        import numpy as np

        return np.ascontiguousarray(raw).reshape(-1).view(np.uint8).data
    values = raw.copy()
    import numpy as np

    if conj and values.dtype.kind == "c":
        np.conjugate(values, out=values)
    if neg and dtype in _SIGN_BITS:
        values ^= _SIGN_BITS[dtype]  # stored as unsigned integers: flip the sign bit
    elif neg:
        np.negative(values, out=values)
    return values.tobytes()


def _converted(tensor: Tensor, dtype: str, byteorder: str = "little") -> Iterator[bytes]:
    import numpy as np

    from ckpt_tui.core.values.tensor_values import CHUNK_ELEMENTS, TensorReader, decode, numpy_dtype

    target = numpy_dtype(dtype, byteorder)
    source = tensor.storage.source if tensor.storage is not None else None
    if isinstance(source, MemorySource):  # bytes made in memory (a rewritten tensor): cast from there
        start = tensor.offset * itemsize(tensor.dtype)
        chunks: Iterator[np.ndarray] = iter(
            [np.frombuffer(source.data[start : start + tensor.nbytes], numpy_dtype(tensor.dtype))]
        )
    else:
        chunks = TensorReader(tensor, byteorder).chunks(CHUNK_ELEMENTS)
    for raw in chunks:
        with np.errstate(over="ignore", invalid="ignore"):  # out of range: ±inf, as torch's cast gives, unwarned
            values = decode(raw, tensor.dtype)
            converted = (to_bfloat16(values) if dtype == "bfloat16" else values).astype(target).tobytes()
        yield converted


def to_bfloat16(values: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float → bfloat16 bits (NaN stays NaN)."""
    import numpy as np

    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    rounded[np.isnan(values)] = 0x7FC0
    return rounded
