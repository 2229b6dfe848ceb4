"""Bytes that are not copied as they are: cast storages and strided views, a bounded chunk at a time."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ckpt_tui.core.edits import CastSource
from ckpt_tui.core.tree import Storage, Tensor
from ckpt_tui.core.values import CHUNK_ELEMENTS, TensorReader, decode, numpy_dtype


def cast_chunks(base: Storage, dtype: str, byteorder: str = "little") -> Iterator[bytes]:
    """A storage's elements converted to ``dtype``, a bounded chunk at a time."""
    whole = Tensor(base, 0, (base.numel,), (1,), base.dtype)
    yield from _converted(whole, dtype, byteorder)


def tensor_bytes(tensor: Tensor) -> Iterator[bytes]:
    """A tensor's elements as contiguous little-endian bytes (cast storages converted)."""
    storage = tensor.storage
    assert storage is not None
    if isinstance(storage.source, CastSource):
        base = storage.source.base
        yield from _converted(Tensor(base, tensor.offset, tensor.shape, tensor.stride, base.dtype), tensor.dtype)
        return
    for raw in TensorReader(tensor).chunks():
        yield raw.tobytes()


def _converted(tensor: Tensor, dtype: str, byteorder: str = "little") -> Iterator[bytes]:
    target = numpy_dtype(dtype, byteorder)
    for raw in TensorReader(tensor, byteorder).chunks(CHUNK_ELEMENTS):
        values = decode(raw, tensor.dtype)
        if dtype == "bfloat16":
            yield to_bfloat16(values).astype(target).tobytes()
        else:
            yield values.astype(target).tobytes()


def to_bfloat16(values: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float → bfloat16 bits (NaN stays NaN)."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    rounded[np.isnan(values)] = 0x7FC0
    return rounded
