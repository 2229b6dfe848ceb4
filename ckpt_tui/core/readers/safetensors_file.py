"""``.safetensors`` files: the JSON header only, validated as the ``safetensors`` library validates it.

The library (``safetensors`` 0.8, ``SafeTensors::read_metadata``) refuses a file unless: the 8-byte
header length fits the file and 100,000,000 bytes; the header is UTF-8 JSON (leading and trailing
JSON whitespace allowed) holding an object; ``__metadata__`` is absent, null or an object of strings
and appears once; every other entry has a known ``dtype``, a ``shape`` of unsigned ints and a
``data_offsets`` pair of unsigned ints, its fields once each; the ranges, sorted, tile the data from 0
to the end of the file with no hole and no overlap, each exactly as long as its shape needs; and the
JSON nests at most 128 levels. Here a file that breaks only the tiling, the metadata or the nesting
rule is still shown, with each rule it breaks in ``loader_problems``; one whose tensors cannot be
located is refused.
"""

from __future__ import annotations

import json
import math
import struct
from collections import Counter
from typing import Any

from ckpt_tui.core.dtypes import itemsize
from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.tree import Checkpoint, Storage, Tensor

MAX_HEADER = 100_000_000
MAX_DEPTH = 128
JSON_WHITESPACE = b" \t\n\r"
U64 = 1 << 64

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
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "C64": "complex64",
}
SUB_BYTE_DTYPES = ("F4", "F6_E2M3", "F6_E3M2")
TORCH_TO_SAFETENSORS = {torch_name: st for st, torch_name in SAFETENSORS_DTYPES.items()}


class NotSafetensors(ReadError):
    """The file is not framed as a safetensors file (length, JSON object): maybe it is another format."""


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


def header_length(head: bytes, file_bytes: int) -> int | None:
    """The declared header length when it fits the file and the library's cap, else None."""
    if len(head) < 8:
        return None
    (length,) = struct.unpack_from("<Q", head)
    if length < 2 or length > min(MAX_HEADER, file_bytes - 8):
        return None
    return length


def looks_like_safetensors(head: bytes, file_bytes: int) -> bool:
    """A length that fits, then a JSON object (after JSON whitespace): worth parsing as safetensors."""
    length = header_length(head, file_bytes)
    if length is None:
        return False
    start = head[8 : 8 + length].lstrip(JSON_WHITESPACE)
    return start[:1] == b"{" or (not start and length > len(head) - 8)


class _Object(dict[str, Any]):
    """A JSON object that remembers the keys it was given more than once."""

    duplicates: list[str]


def _object(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object(pairs)
    obj.duplicates = []
    if len(obj) < len(pairs):
        counts = Counter(key for key, _ in pairs)
        obj.duplicates = [key for key, count in counts.items() if count > 1]
    return obj


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _header(path: str, file_bytes: int) -> tuple[_Object, int]:
    with open(path, "rb") as file:
        head = file.read(8)
        length = header_length(head, file_bytes)
        if length is None:
            raise NotSafetensors(f"{path}: not a safetensors file (its first 8 bytes are no header length)")
        raw = file.read(length)
    try:
        text = raw.decode("utf-8")
        header = json.loads(text, object_pairs_hook=_object, parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise NotSafetensors(f"{path}: safetensors header is not UTF-8") from None
    except RecursionError:
        raise NotSafetensors(f"{path}: safetensors header nests too deeply") from None
    except ValueError as exc:  # JSONDecodeError, NaN, ints past the digit limit
        raise NotSafetensors(f"{path}: safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, _Object):
        raise NotSafetensors(f"{path}: safetensors header is not a JSON object")
    return header, 8 + length


def read_safetensors(path: str, file_bytes: int) -> Checkpoint:
    """Read a safetensors header into a flat dict of tensors; no tensor data is read.

    Raises :class:`NotSafetensors` when the file is not framed as safetensors at all.
    """
    header, data_start = _header(path, file_bytes)
    problems: list[str] = []
    notes: list[str] = []
    if _depth(header) > MAX_DEPTH:
        problems.append(f"its header nests deeper than {MAX_DEPTH} levels, which the safetensors library refuses")
    metadata = _metadata(header, problems)
    if "__metadata__" in header.duplicates:
        problems.append("its header holds __metadata__ twice, which the safetensors library refuses")
    names = [name for name in header.duplicates if name != "__metadata__"]
    if names:
        notes.append(f"the header names {_some(names)} twice: the safetensors library uses the last entry, as shown")
    data_bytes = file_bytes - data_start
    records = SafetensorsRecords(path, data_start)
    root: dict[str, Tensor] = {}
    for name in sorted(header):  # the order safetensors' own keys() and load_file() give
        if name != "__metadata__":
            root[name] = _tensor(path, name, header[name], data_bytes, records, problems)
    problems += _tiling_problems(records.ranges, data_bytes)
    return Checkpoint(path, "safetensors", root, file_bytes, metadata=metadata, notes=notes, loader_problems=problems)


def _metadata(header: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    metadata = header.get("__metadata__")
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        problems.append("its __metadata__ is not an object of strings, which the safetensors library refuses")
        return {}
    _text(metadata, "__metadata__")
    if not all(isinstance(v, str) for v in metadata.values()):
        odd = [k for k, v in metadata.items() if not isinstance(v, str)]
        problems.append(f"__metadata__ {_some(odd)} is not a string, which the safetensors library refuses")
    return dict(metadata)


def _tensor(
    path: str, name: str, entry: Any, data_bytes: int, records: SafetensorsRecords, problems: list[str]
) -> Tensor:
    _text(name, "a tensor name")
    where = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict):
        raise ReadError(f"{where}: header entry is not an object")
    if isinstance(entry, _Object) and entry.duplicates:
        problems.append(f"tensor {name!r} repeats {_some(entry.duplicates)} in its entry: the library refuses that")
    code = entry.get("dtype")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if code in SUB_BYTE_DTYPES:
        raise ReadError(f"{where}: dtype {code} (sub-byte floats) cannot be read by ckpt-tui")
    dtype = SAFETENSORS_DTYPES.get(code) if isinstance(code, str) else None
    if dtype is None:
        raise ReadError(f"{where}: unknown dtype {code!r}")
    if not isinstance(shape, list) or not all(type(n) is int and 0 <= n < U64 for n in shape):
        raise ReadError(f"{where}: shape is not a list of non-negative ints")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(n) is int and 0 <= n < U64 for n in offsets)):
        raise ReadError(f"{where}: data_offsets is not a pair of non-negative ints")
    begin, end = offsets
    numel = math.prod(shape)
    if not begin <= end <= data_bytes or end - begin != numel * itemsize(dtype):
        raise ReadError(f"{where}: data_offsets {offsets} out of range or wrong for shape {shape}")
    records.ranges[name] = (begin, end)
    storage = Storage(name, dtype, "cpu", numel, records)
    stride = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
    return Tensor(storage, 0, tuple(shape), stride, dtype)


def _tiling_problems(ranges: dict[str, tuple[int, int]], data_bytes: int) -> list[str]:
    """How the ranges fail to tile the data exactly (the library's ``validate``), one line per kind."""
    overlaps: list[str] = []
    holes: list[str] = []
    position = 0
    for name, (begin, end) in sorted(ranges.items(), key=lambda item: item[1]):
        if begin < position:
            overlaps.append(name)
        elif begin > position:
            holes.append(name)
        position = max(position, end)
    problems = []
    if overlaps:
        problems.append(f"tensor {_some(overlaps)} overlaps another's data, which the safetensors library refuses")
    if holes:
        problems.append(f"unused bytes lie before tensor {_some(holes)}, which the safetensors library refuses")
    if position < data_bytes:
        problems.append(
            f"{data_bytes - position} bytes follow the last tensor's data, which the safetensors library refuses"
        )
    return problems


def _depth(value: Any) -> int:
    """How deeply a parsed JSON value nests (walked without recursion)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return deepest


def _text(value: Any, what: str) -> None:
    """Refuse strings the JSON escapes made invalid (lone surrogates): the library refuses them too."""
    texts = [value] if isinstance(value, str) else [t for kv in value.items() for t in kv if isinstance(t, str)]
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ReadError(f"{what} holds an invalid \\u escape (a lone surrogate)") from None


def _some(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")
