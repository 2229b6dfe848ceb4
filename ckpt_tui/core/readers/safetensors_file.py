"""``.safetensors`` files: the JSON header only, validated before any use."""

from __future__ import annotations

import json
import math
import struct
from typing import Any

from ckpt_tui.core.dtypes import itemsize
from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.tree import Checkpoint, Storage, Tensor

MAX_HEADER = 100 * 1024 * 1024

SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "U16": "uint16",
    "U32": "uint32",
    "U64": "uint64",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
    "C64": "complex64",
}
TORCH_TO_SAFETENSORS = {torch_name: st for st, torch_name in SAFETENSORS_DTYPES.items()}


class SafetensorsRecords:
    """Tensor data of one safetensors file: offsets are known from the header."""

    def __init__(self, path: str, data_start: int) -> None:
        self.path = path
        self.data_start = data_start
        self.ranges: dict[str, tuple[int, int]] = {}

    def has(self, storage: Storage) -> bool:
        """Every storage named in the header has its range."""
        return storage.key in self.ranges

    def locate(self, storage: Storage) -> tuple[int, int]:
        """Absolute offset and size of one tensor's bytes."""
        begin, end = self.ranges[storage.key]
        return self.data_start + begin, end - begin


def _header(path: str, file_bytes: int) -> tuple[dict[str, Any], int]:
    with open(path, "rb") as file:
        head = file.read(8)
        if len(head) < 8:
            raise ReadError(f"{path}: too short for a safetensors file")
        (length,) = struct.unpack("<Q", head)
        if length < 2 or length > min(MAX_HEADER, file_bytes - 8):
            raise ReadError(f"{path}: safetensors header length {length} does not fit a {file_bytes}-byte file")
        raw = file.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReadError(f"{path}: safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ReadError(f"{path}: safetensors header is not a JSON object")
    return header, 8 + length


def read_safetensors(path: str, file_bytes: int) -> Checkpoint:
    """Read a safetensors header into a flat dict of tensors; no tensor data is read."""
    header, data_start = _header(path, file_bytes)
    data_bytes = file_bytes - data_start
    metadata = header.pop("__metadata__", None) or {}
    records = SafetensorsRecords(path, data_start)
    root: dict[str, Tensor] = {}
    for name in sorted(header):  # the order safetensors' own keys() and load_file() give
        root[name] = _tensor(path, name, header[name], data_bytes, records)
    return Checkpoint(
        path, "safetensors", root, file_bytes, metadata=dict(metadata) if isinstance(metadata, dict) else {}
    )


def _tensor(path: str, name: str, entry: Any, data_bytes: int, records: SafetensorsRecords) -> Tensor:
    where = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict):
        raise ReadError(f"{where}: header entry is not an object")
    dtype = SAFETENSORS_DTYPES.get(entry.get("dtype", ""))
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if dtype is None:
        raise ReadError(f"{where}: unknown dtype {entry.get('dtype')!r}")
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise ReadError(f"{where}: shape is not a list of non-negative ints")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(n) is int for n in offsets)):
        raise ReadError(f"{where}: data_offsets is not a pair of ints")
    begin, end = offsets
    numel = math.prod(shape)
    if not 0 <= begin <= end <= data_bytes or end - begin != numel * itemsize(dtype):
        raise ReadError(f"{where}: data_offsets {offsets} out of range or wrong for shape {shape}")
    records.ranges[name] = (begin, end)
    storage = Storage(name, dtype, "cpu", numel, records)
    stride = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
    return Tensor(storage, 0, tuple(shape), stride, dtype)
