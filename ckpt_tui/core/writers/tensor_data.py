"""Bytes that are not copied as they are: cast storages, strided views, conj/neg bits, a bounded chunk at a time.

numpy is imported only when such bytes are produced: a plain copy or prefix edit never needs it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ckpt_tui.core.model.tree import Tensor
from ckpt_tui.core.model.tree import view_bits as loaded_bits

if TYPE_CHECKING:
    import numpy as np


VIEW_BITS = frozenset({"conj", "neg"})
"""The tensor metadata torch writes: lazy conjugation and negation, applied when the tensor is read."""


def view_bits(tensor: Tensor) -> tuple[bool, bool]:
    """A tensor's (conj, neg) bits; a ValueError for metadata that is anything else."""
    metadata = tensor.metadata or {}
    if not isinstance(metadata, dict):
        raise ValueError(f"tensor metadata is a {type(metadata).__name__}, not a dict of conjugation or negation bits")
    unknown = [key for key, value in metadata.items() if key not in VIEW_BITS or type(value) is not bool]
    if unknown:
        raise ValueError(f"tensor metadata {unknown[0]!r} is not a conjugation or negation bit")
    return loaded_bits(metadata)


def tensor_bytes(tensor: Tensor, byteorder: str = "little") -> Iterator[bytes | memoryview]:
    """A tensor's values as contiguous bytes (little-endian unless said): bytes made for the save (a cast,
    rewritten tensors, pieces of several files) made by their source, conj/neg bits applied."""
    from ckpt_tui.core.values.tensor_values import TensorReader

    conj, neg = view_bits(tensor)
    for raw in TensorReader(tensor, byteorder, saving=True).chunks():
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
