"""Reading tensor values from a file: raw elements in bounded chunks, decoded to float64.

Contiguous tensors are read with positioned reads; strided views go through an mmap whose pages
are released after each chunk. Every read stays inside the tensor's storage record.
"""

from __future__ import annotations

import math
import mmap
import os
from collections.abc import Iterator

import numpy as np

from ckpt_tui.core.dtypes import itemsize
from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.readers.assembled import AssembledRecords
from ckpt_tui.core.tree import Tensor

CHUNK_ELEMENTS = 1 << 21

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
    "complex32": "f2",
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
    """The numpy type that holds a torch dtype's raw bytes."""
    code = _NUMPY_TYPES.get(dtype)
    if code is None:
        raise ReadError(f"cannot read values of dtype {dtype}")
    return np.dtype(("<" if byteorder == "little" else ">") + code)


def decode(raw: np.ndarray, dtype: str, metadata: dict[str, object] | None = None) -> np.ndarray:
    """Raw elements to float64 (complex: magnitudes; bf16 widened; fp8 through a table)."""
    if dtype == "bfloat16":
        values = (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    elif dtype in _FP8_TABLES:
        values = _FP8_TABLES[dtype][raw]
    elif dtype == "complex32":
        pairs = raw.astype(np.float64).reshape(-1, 2)
        values = np.hypot(pairs[:, 0], pairs[:, 1])
    elif raw.dtype.kind == "c":
        values = np.abs(raw).astype(np.float64)
    else:
        values = raw.astype(np.float64)
    if metadata and metadata.get("neg"):
        values = -values
    return values


class TensorReader:
    """Reads one tensor's elements in chunks from an mmap of its file."""

    def __init__(self, tensor: Tensor, byteorder: str = "little") -> None:
        storage = tensor.storage
        if storage is None or storage.source is None:
            raise ReadError(f"values of {tensor.kind} tensors are not stored in this file")
        if tensor.kind != "dense":
            raise ReadError(f"values of {tensor.kind} tensors cannot be read")
        self.tensor = tensor
        self.raw_type = numpy_dtype(tensor.dtype, byteorder)
        self.per_element = 2 if tensor.dtype == "complex32" else 1
        self.assembled = storage.source if isinstance(storage.source, AssembledRecords) else None
        if self.assembled is not None:  # pieces in several files (distributed checkpoints)
            if not tensor.is_contiguous() or self.per_element != 1:
                raise ReadError("only whole, contiguous views of an assembled tensor can be read")
            return
        data_offset, available = storage.source.locate(storage)
        self.path = storage.source.path
        self.start = data_offset + tensor.offset * itemsize(tensor.dtype)
        extent = tensor.offset + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride, strict=True)) + 1
        if tensor.numel and extent * itemsize(tensor.dtype) > available:
            raise ReadError(f"tensor reaches past its storage record ({available} bytes)")

    def chunks(self, chunk: int = CHUNK_ELEMENTS) -> Iterator[np.ndarray]:
        """The tensor's elements, in row-major order, a bounded chunk at a time (raw dtype).

        Contiguous tensors are read with positioned reads (nothing stays resident); strided views go
        through an mmap whose pages are released after each chunk.
        """
        tensor = self.tensor
        if tensor.numel == 0:
            return
        if self.assembled is not None:
            assert tensor.storage is not None
            end = tensor.offset + tensor.numel
            yield from self.assembled.elements(tensor.storage, tensor.offset, end, chunk, self.raw_type)
            return
        with open(self.path, "rb") as file:
            if tensor.is_contiguous():
                size = itemsize(tensor.dtype)
                for begin in range(0, tensor.numel, chunk):
                    count = min(chunk, tensor.numel - begin)
                    data = os.pread(file.fileno(), count * size, self.start + begin * size)
                    if len(data) != count * size:
                        raise ReadError("tensor data ends early (file truncated?)")
                    yield np.frombuffer(data, self.raw_type, count * self.per_element)
                return
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                yield from self._strided_chunks(mapped, chunk)

    def _strided_chunks(self, mapped: mmap.mmap, chunk: int) -> Iterator[np.ndarray]:
        tensor = self.tensor
        size = itemsize(tensor.dtype) // self.per_element
        extent = sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride, strict=True)) + 1
        base = np.frombuffer(mapped, self.raw_type, extent * self.per_element, self.start)
        shape = tensor.shape + ((2,) if self.per_element == 2 else ())
        strides = tuple(s * itemsize(tensor.dtype) for s in tensor.stride) + ((size,) if self.per_element == 2 else ())
        view = np.lib.stride_tricks.as_strided(base, shape=shape, strides=strides, writeable=False)
        rows = max(1, chunk // max(1, math.prod(tensor.shape[1:])))
        for begin in range(0, tensor.shape[0], rows):
            yield np.ascontiguousarray(view[begin : begin + rows]).reshape(-1)
            if hasattr(mmap, "MADV_DONTNEED"):
                mapped.madvise(mmap.MADV_DONTNEED)
