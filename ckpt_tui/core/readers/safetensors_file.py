"""``.safetensors`` files: the JSON header only, validated as the ``safetensors`` library validates it.

The library (``safetensors`` 0.8, ``SafeTensors::read_metadata``) refuses a file unless: the 8-byte
header length fits the file and 100,000,000 bytes; the header is UTF-8 JSON (leading and trailing
JSON whitespace allowed) holding an object; ``__metadata__`` is absent, null or an object of strings
and appears once; every other value, including each earlier value of a name given twice, is an entry
with a known ``dtype``, a ``shape`` of unsigned ints (``-0`` is a float to serde_json) and a
``data_offsets`` pair of unsigned ints, its fields once each; the element count, multiplied left to
right, stays within 64 bits; the ranges, sorted, tile the data from 0 to the end of the file with no
hole and no overlap, each exactly as long as its shape needs; and the JSON nests at most 127 levels.
Here a file that breaks only the tiling, the metadata, the nesting, the count or a repeated name's
earlier value is still shown, with each rule it breaks in ``loader_problems``; one whose tensors
cannot be located is refused.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import operator
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.describe import counted, plural, size
from ckpt_tui.core.model.dtypes import itemsize
from ckpt_tui.core.model.tree import (
    PENDING_ROOT,
    Checkpoint,
    FlatColumns,
    RecordSource,
    Storage,
    Tensor,
    layout_fits,
)
from ckpt_tui.core.readers.probes import MAX_HEADER, header_length
from ckpt_tui.core.runtime import process

_LAZY: Any = object()
orjson: Any = _LAZY
"""The orjson module, imported by the first header parsed (its import takes datetime, uuid and platform
along: time a command that reads no safetensors file need not spend); None without it."""


def _orjson() -> Any:
    """orjson, imported once; None where it is missing (a declared dependency: every header then parsed by json)."""
    global orjson
    if orjson is _LAZY:
        try:
            import orjson as module

            orjson = module
        except ImportError:
            orjson = None
    return orjson


PEAK_PER_TENSOR = 900
"""Bytes at the peak of reading one header entry with ``json`` (its parsed entry; about 770 measured),
besides the header's text held twice (bytes and str)."""
ORJSON_PEAK_PER_TENSOR = 2400
"""The same with orjson (about 1,530 measured), which parses only with this much room to spare: it
crashes the process (no MemoryError) when an allocation fails under an address-space limit."""
MAX_DEPTH = 127
"""serde_json's recursion limit: a 128th nested array or object fails."""
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
PACKED_FP4, PACKED_FP4_DTYPE = "F4", "float4_e2m1fn_x2"
"""The sub-byte code the library loads (as torch's packed FP4 dtype; its values are not decoded here)."""
TORCH_TO_SAFETENSORS = {torch_name: st for st, torch_name in SAFETENSORS_DTYPES.items()}


REFUSED = "which the safetensors library refuses"
"""How each rule this reader finds broken ends (``loader_problems`` of a safetensors file)."""


def library_refusals(problems: list[str]) -> list[str]:
    """The loader problems of a safetensors file that make the library refuse it."""
    return [problem for problem in problems if problem.endswith(REFUSED)]


class NotSafetensors(ReadError):
    """The file is not framed as a safetensors file (length, JSON object): maybe it is another format."""


class SafetensorsRecords(RecordSource):
    """Tensor data of one safetensors file: offsets are known from the header."""

    in_place = True
    """Its storages' bytes lie as they are in one range of ``path`` (a writer copies them)."""

    def __init__(self, path: str, data_start: int, version: str | None = None) -> None:
        self.path = path
        self.version = version if version is not None else places.version_at_open(path)
        self.data_start = data_start
        self._ranges: dict[str, list[int]] | None = {}
        self._names: list[str] = []
        self._offsets: list[list[int]] | None = []
        self._pairs: list[int] = []

    @property
    def ranges(self) -> dict[str, list[int]]:
        """Each tensor's ``[begin, end]`` in the data, as the header gives it (of a header read in bulk,
        made from its columns when first asked for: ``info`` never asks)."""
        ranges = self._ranges
        if ranges is None:
            # (two threads asking at once make equal dicts: either one will do)
            ranges = self._ranges = dict(zip(self._names, self.offsets(), strict=True))
        return ranges

    def set_columns(self, names: list[str], offsets: list[list[int]] | None, pairs: list[int] | None = None) -> None:
        """The ranges as columns: each name's checked ``[begin, end]`` pair (or, with ``offsets`` None,
        ``pairs``: every begin and end in one list, the pairs made when first asked for)."""
        self._names, self._offsets, self._pairs = names, offsets, pairs or []
        self._ranges = None

    def pairs(self) -> list[int]:
        """Every row's begin and end, in one list."""
        if self._ranges is None and self._offsets is None:
            return self._pairs
        return list(itertools.chain.from_iterable(self.offsets()))

    def offsets(self) -> list[list[int]]:
        """Each row's ``[begin, end]``, in the order of :meth:`set_columns` (or of the range dict)."""
        if self._ranges is not None:
            return list(self._ranges.values())
        if self._offsets is None:
            pairs = self._pairs
            self._offsets = list(map(list, zip(pairs[0::2], pairs[1::2], strict=True)))
        return self._offsets

    def has(self, storage: Storage) -> bool:
        """Every storage named in the header has its range."""
        return storage.key in self.ranges

    def missing(self, storages: list[Storage]) -> list[Storage]:
        """The storages without a range (:meth:`has` of each, in one pass)."""
        ranges = self.ranges
        return [s for s in storages if s.key not in ranges]

    def locate(self, storage: Storage) -> tuple[int, int]:
        """Absolute offset and size of one tensor's bytes."""
        begin, end = self.ranges[storage.key]
        return self.data_start + begin, end - begin

    def header_ranges(self) -> SafetensorsRecords:
        """Its records are the header's ranges."""
        return self


def length_problem(head: bytes, file_bytes: int) -> str:
    """Why a file's start is no safetensors header, in words: a length past the library's limit or past the file,
    too short for an object, or a header that is no JSON object (a byte-order mark, a list)."""
    length = int.from_bytes(head[:8], "little") if len(head) >= 8 else 0
    if length > MAX_HEADER:
        return f"header length {length:,} is over the safetensors library's limit of {MAX_HEADER:,} bytes"
    if len(head) < 8 or length > file_bytes - 8:
        return f"header length {length} does not fit a {file_bytes}-byte file"
    if length < 2:
        return f"header length {length} is too short for a JSON object"
    text = head[8 : 8 + length]
    if text.startswith(b"\xef\xbb\xbf"):
        return "header starts with a UTF-8 byte-order mark, which the safetensors library refuses"
    return f"header is not a JSON object (it starts with {bytes(text[:16])!r})"


FIELDS = ("dtype", "shape", "data_offsets")


@dataclass
class _Header:
    """A parsed header, and what only the raw text shows: keys given twice, and escapes."""

    entries: dict[str, Any]
    data_start: int
    escaped: bool
    duplicates: dict[int, list[str]]
    """Keys given more than once, by ``id`` of the object that holds them."""
    exact: bool = True
    """Parsed by ``json``; False: by orjson, which reads ints past 64 bits as floats."""
    earlier: dict[str, list[Any]] = field(default_factory=dict)
    """The values a top-level key had before its last one (the library parses each as a tensor entry)."""

    def twice(self, obj: Any) -> list[str]:
        """The keys ``obj`` was given more than once."""
        return self.duplicates.get(id(obj), [])


_MINUS_ZERO = re.compile(rb"[\[,:]\s*-0(?![0-9.eE])")
"""An integer ``-0`` as a JSON value (not inside a string such as a date, "2024-01-05")."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _raw_header(path: str, file_bytes: int) -> bytes:
    with places.open_stream(path) as file:
        head = file.read(8)
        length = header_length(head, file_bytes)
        if length is None:
            raise NotSafetensors(f"{path}: not a safetensors file ({length_problem(head, file_bytes)})")
        return file.read(length)


def _room_for(path: str, raw: bytes) -> bool:
    """Refuse, in one line, a header whose tensors cannot be held in the memory this process may still
    use (an address-space limit, say); whether orjson may parse it (True) or ``json`` must (False)."""
    room = process.memory_room()
    if room is None:
        return True
    tensors = raw.count(b'"data_offsets"')
    need = tensors * PEAK_PER_TENSOR + 2 * len(raw)
    if need > room:
        raise ReadError(
            f"{path}: its header lists {tensors:,} {plural(tensors, 'tensor')}; reading them needs about {size(need)}, "
            f"more than the {size(room)} this process may still use"
        )
    return room >= tensors * ORJSON_PEAK_PER_TENSOR + len(raw)


def _minus_zero(raw: bytes) -> bool:
    """Whether an integer ``-0`` stands as a value (the regex only where the text has a ``-0`` at all, and
    that looked for only where it has a ``-``: a one-byte find is a memchr pass, the regex a tenth of
    the read on 50,000 tensors)."""
    return b"-" in raw and b"-0" in raw and _MINUS_ZERO.search(raw) is not None


def _fast_header(raw: bytes) -> _Header | None:
    """The header parsed by orjson (faster than ``json`` on big headers), when it has no escapes and no
    key can have been given twice; None otherwise, or when orjson refuses it (``json`` then says why)."""
    fast = _orjson()
    if fast is None or b"\\" in raw or _minus_zero(raw):  # (orjson reads -0 as 0)
        return None
    try:
        header = fast.loads(raw)
    except fast.JSONDecodeError:
        return None
    if not isinstance(header, dict) or not _counts_agree(raw, header):
        return None
    return _Header(header, 8 + len(raw), False, {}, exact=False)


def _header(path: str, raw: bytes) -> _Header:
    duplicates: dict[int, list[str]] = {}
    earlier: dict[int, dict[str, list[Any]]] = {}

    def remember_twice(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) < len(pairs):
            duplicates[id(obj)] = [key for key, count in Counter(k for k, _ in pairs).items() if count > 1]
            before = earlier[id(obj)] = {}
            for key, value in pairs:
                if value is not obj[key]:
                    before.setdefault(key, []).append(value)
        return obj

    ints = {"parse_int": _int} if _minus_zero(raw) else {}  # the hook only where a -0 stands (it costs)
    try:
        text = raw.decode("utf-8")
        header = json.loads(text, parse_constant=_no_constant, **ints)  # type: ignore[arg-type]
        escaped = b"\\" in raw
        if isinstance(header, dict) and (escaped or not _counts_agree(raw, header)):
            header = json.loads(text, parse_constant=_no_constant, object_pairs_hook=remember_twice, **ints)  # type: ignore[arg-type]
    except UnicodeDecodeError:
        raise NotSafetensors(f"{path}: safetensors header is not UTF-8") from None
    except RecursionError:
        raise NotSafetensors(f"{path}: safetensors header nests too deeply") from None
    except ValueError as exc:  # JSONDecodeError, NaN, ints past the digit limit
        raise NotSafetensors(f"{path}: safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise NotSafetensors(f"{path}: safetensors header is not a JSON object")
    return _Header(header, 8 + len(raw), escaped, duplicates, earlier=earlier.get(id(header), {}))


class _MinusZero(int):
    """``-0`` in the header: serde_json reads it as the float -0.0, which the library refuses where an
    unsigned int must stand (a shape, an offset). Not an ``int`` to the checks here, so they refuse it too."""


def _int(text: str) -> int:
    return _MinusZero(0) if text == "-0" else int(text)


def _counts_agree(raw: bytes, header: dict[str, Any]) -> bool:
    """Whether no key can have been given twice: without escapes every ``"`` opens or closes a string, and
    the text holds exactly the strings the parsed header holds (parsing without a hook is several times
    faster on 50,000 tensors)."""
    tensors = len(header) - ("__metadata__" in header)
    metadata = header.get("__metadata__")
    strings = len(header) + 4 * tensors + (2 * len(metadata) if isinstance(metadata, dict) else 0)
    if raw.count(b'"') != 2 * strings:  # keys, dtypes and metadata: a key given twice adds its own
        return False
    if _plain_metadata(metadata):
        # the count assumes each entry holds four strings and the metadata two per item: an entry that
        # holds fewer is not a tensor entry (the file is refused for it, repeated keys or not), so only
        # metadata values that are not strings could hide a repeated key's strings; none here
        return True
    # (each field name and __metadata__ as often as the parsed header holds them)
    if raw.count(b'"__metadata__"') != ("__metadata__" in header):
        return False
    return all(raw.count(b'"' + name.encode() + b'"') == tensors for name in FIELDS)


def read_safetensors(path: str, file_bytes: int) -> Checkpoint:
    """Read a safetensors header into a flat dict of tensors; no tensor data is read.

    Raises :class:`NotSafetensors` when the file is not framed as safetensors at all.
    """
    # each big object is dropped as soon as the next one is made: the peak of a 100 MB header counts
    raw: bytes | None = _raw_header(path, file_bytes)
    assert raw is not None
    length = len(raw)
    try:
        fast = _fast_header(raw) if _room_for(path, raw) else None
        if fast is not None:
            raw = None
            checkpoint = _checkpoint(path, file_bytes, fast)
            if checkpoint is not None:
                return checkpoint
            fast = None
            raw = _raw_header(path, file_bytes)  # read again (rare: floats where huge ints stand)
        parsed = _header(path, raw)
        raw = None
        checkpoint = _checkpoint(path, file_bytes, parsed)
    except MemoryError:
        raise ReadError(f"{path}: not enough memory to hold its header's tensors ({size(length)} of JSON)") from None
    assert checkpoint is not None  # json's parse is always read
    return checkpoint


def _checkpoint(path: str, file_bytes: int, parsed: _Header) -> Checkpoint | None:
    """The checkpoint a parsed header describes. None for an orjson parse that is not all plain
    (tensor entries that pass in bulk, ``__metadata__`` of strings): floats may stand there for huge
    ints, so ``json``'s parse is read instead."""
    header = parsed.entries
    if not parsed.exact and not _plain_metadata(header.get("__metadata__")):
        return None
    problems: list[str] = []
    notes: list[str] = []
    metadata = _metadata(header, problems, parsed.escaped)
    _repeated_names(parsed, problems, notes)
    # the tensors: in bulk when the header is plain, else entry by entry
    data_bytes = file_bytes - parsed.data_start
    records = SafetensorsRecords(path, parsed.data_start)
    deepest = 1 + _depth(header.get("__metadata__"))  # the header object is level 1
    earlier = [value for values in parsed.earlier.values() for value in values]  # parsed by the library too
    deepest = max(deepest, 1 + max(map(_depth, earlier), default=0))
    names = sorted(header)  # the order safetensors' own keys() and load_file() give
    plain = not parsed.escaped and not parsed.duplicates
    read = _plain_tensors(header, names, data_bytes, records, problems) if plain else None
    if read is None and not parsed.exact:
        return None
    if read is None:
        root, deepest = _each_tensor(path, parsed, names, data_bytes, records, problems, deepest)
        columns, tiled = None, False
    else:
        root, columns, tiled = read
    if deepest > MAX_DEPTH:
        problems.append(f"its header nests deeper than {MAX_DEPTH} levels, which the safetensors library refuses")
    if not tiled:
        problems += _tiling_problems(records.ranges, data_bytes, list(records.ranges.values()))
    return Checkpoint(
        path,
        "safetensors",
        root,
        file_bytes,
        metadata=metadata,
        notes=notes,
        loader_problems=problems,
        columns=columns,
    )


def _repeated_names(parsed: _Header, problems: list[str], notes: list[str]) -> None:
    """What names given twice in the header mean: ``__metadata__`` twice, or a name once without a tensor
    entry, is refused by the library (a problem); a name twice with entries each time takes the last (a note)."""
    header = parsed.entries
    if "__metadata__" in parsed.twice(header):
        problems.append("its header holds __metadata__ twice, which the safetensors library refuses")
    names = [name for name in parsed.twice(header) if name != "__metadata__"]
    unparsed = [
        name for name in names if not all(_parsed_entry(parsed, value) for value in parsed.earlier.get(name, []))
    ]
    if unparsed:
        problems.append(f"the header names {_some(unparsed)} twice, once with no tensor entry, {REFUSED}")
    names = [name for name in names if name not in unparsed]
    if names:
        notes.append(f"the header names {_some(names)} twice: the safetensors library uses the last entry, as shown")


def _parsed_entry(parsed: _Header, entry: Any) -> bool:
    """Whether the library parses an earlier value of a name as a tensor entry: one, no field given twice."""
    return _library_entry(entry) and not parsed.twice(entry)


def _library_entry(entry: Any) -> bool:
    """Whether the library parses a value as a tensor entry (a known dtype, a shape and two offsets
    of unsigned ints; other fields ignored), as it parses every value given for a name."""
    if not isinstance(entry, dict):
        return False
    code, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    return (
        isinstance(code, str)
        and (code in SAFETENSORS_DTYPES or code in SUB_BYTE_DTYPES)
        and isinstance(shape, list)
        and all(type(n) is int and 0 <= n < U64 for n in shape)
        and isinstance(offsets, list)
        and len(offsets) == 2
        and all(type(n) is int and 0 <= n < U64 for n in offsets)
    )


def _plain_metadata(metadata: Any) -> bool:
    """No ``__metadata__``, or an object of strings."""
    return metadata is None or (isinstance(metadata, dict) and set(map(type, metadata.values())) <= {str})


def _plain_tensors(
    header: dict[str, Any], names: list[str], data_bytes: int, records: SafetensorsRecords, problems: list[str]
) -> tuple[Any, FlatColumns | None, bool] | None:
    """The tensors of a header whose entries all pass the checks of :func:`_tensor`, checked in bulk
    (type sets and min/max over every field at once), as columns whose tensors are made when first asked
    for (the root: ``PENDING_ROOT``); or, when a layout would fail :func:`~ckpt_tui.core.model.tree.check_tree`
    (which then says why), the tree made now and no columns. Last, whether the ranges were seen to tile
    the data (else :func:`_tiling_problems` looks). None when any entry does not pass, so that the
    entry-by-entry path raises the first error, worded as always."""
    tensor_names = [name for name in names if name != "__metadata__"] if "__metadata__" in header else names
    # the fields: each entry an object of the three fields, of the right types
    fields = _bulk_fields(list(map(header.__getitem__, tensor_names)))
    if fields is None:
        return None
    codes, shapes, offsets, begins, ends = fields
    # the shapes: sizes in range; one shape, stride and count object per distinct shape, looked up per row
    keys = list(map(tuple, shapes))  # ints only (checked above): equal shapes are the same shape
    distinct = set(keys)
    sizes_seen = set(itertools.chain.from_iterable(distinct))
    if sizes_seen and (min(sizes_seen) < 0 or max(sizes_seen) >= U64):
        return None
    shape_keys = _per_row(keys, {shape: shape for shape in distinct})
    strides = _per_row(keys, {shape: _strides(shape) for shape in distinct})
    numels = _per_row(keys, {shape: math.prod(shape) for shape in distinct})
    # the byte ranges: in the data, each as long as its tensor's bytes
    if not _ranges_fit(codes, numels, begins, ends, data_bytes):
        return None
    # the tensors
    dtypes = _per_row(codes, {code: SAFETENSORS_DTYPES[code] for code in set(codes)})
    records.set_columns(tensor_names, offsets)  # each a checked [begin, end] pair
    tiled = _tiles(begins, ends, data_bytes) or _tiles_in_file_order(header, data_bytes)
    overflowing = {shape for shape in distinct if _overflows(shape)}
    # every entry passed: the parsed JSON is freed before the tensors are made (the peak of a big header)
    del fields, shapes, keys
    header.clear()
    # (only now: a None above sends the header entry by entry, which says it itself)
    if overflowing:
        problems.append(
            _overflow_problem([n for n, s in zip(tensor_names, shape_keys, strict=True) if s in overflowing])
        )
    columns = _pending_columns(records, tensor_names, dtypes, numels, shape_keys, strides)
    if not all(layout_fits(0, shape, _strides(shape)) for shape in distinct):
        # no columns: the tree is made now and check_tree says why it is refused
        return columns.root, None, tiled
    return PENDING_ROOT, columns, tiled


def _pending_columns(
    records: SafetensorsRecords,
    names: list[str],
    dtypes: list[str],
    numels: list[int],
    shapes: list[tuple[int, ...]],
    strides: list[tuple[int, ...]],
) -> FlatColumns:
    """The columns of a header's checked tensors, each tensor (one Storage and one Tensor) made when asked for."""

    def make(start: int, stop: int) -> list[Tensor]:
        """The tensors of rows ``start`` to ``stop``."""
        row_dtypes = dtypes[start:stop]
        storages = map(Storage, names[start:stop], row_dtypes, _CPU, numels[start:stop], _repeat(records))
        return list(map(Tensor, storages, _ZERO, shapes[start:stop], strides[start:stop], row_dtypes))

    return FlatColumns.pending(names, dtypes, numels, shapes, strides, names, [records] * len(names), make)


WIRED = frozenset({"path", "format", "root", "file_bytes", "metadata", "notes", "loader_problems", "columns"})
"""The fields of a checkpoint :func:`to_wire` hands back (``opened_version`` too: a shard has none)."""


def to_wire(checkpoint: Checkpoint) -> dict[str, Any] | None:
    """A ``.safetensors`` file read as columns still pending, as a JSON value (each distinct dtype and shape
    once, each row's by its place; the ranges as one list of ints) that :func:`from_wire` makes the same
    checkpoint of: how a forked child hands a file it read back. None for anything else (read again)."""
    columns = checkpoint.columns
    if checkpoint.format != "safetensors" or columns is None or not checkpoint.root_pending() or not len(columns):
        return None
    # every other field as a new Checkpoint has it (a field added later is never dropped on the way back)
    for each in dataclasses.fields(checkpoint):
        if each.name not in WIRED:
            default = each.default_factory() if each.default_factory is not dataclasses.MISSING else each.default
            if getattr(checkpoint, each.name) != default:
                return None
    records = columns.sources[0]
    if not isinstance(records, SafetensorsRecords) or records.path != checkpoint.path:
        return None
    dtypes, shapes = list(dict.fromkeys(columns.dtypes)), list(dict.fromkeys(columns.shapes))
    return {
        "path": checkpoint.path,
        "file_bytes": checkpoint.file_bytes,
        "metadata": checkpoint.metadata,
        "notes": checkpoint.notes,
        "problems": checkpoint.loader_problems,
        "data_start": records.data_start,
        "version": records.version,
        "names": columns.names,
        "dtypes": dtypes,
        "dtype_rows": _places(columns.dtypes, dtypes),
        "shapes": shapes,
        "shape_rows": _places(columns.shapes, shapes),
        "ranges": records.pairs(),
    }


def _places(column: list[Any], distinct: list[Any]) -> list[int]:
    """Each row's place in ``distinct``."""
    if len(distinct) == 1:
        return [0] * len(column)
    return list(map({value: place for place, value in enumerate(distinct)}.__getitem__, column))


def from_wire(wire: dict[str, Any]) -> Checkpoint:
    """The checkpoint :func:`to_wire` describes (its columns pending, as the reader leaves them)."""
    path, names = wire["path"], wire["names"]
    shapes = list(map(tuple, wire["shapes"]))
    shape_rows, dtype_rows = wire["shape_rows"], wire["dtype_rows"]
    pairs = wire["ranges"]
    # the version the child saw as it read the header: the file must still be that one when values are read
    records = SafetensorsRecords(path, wire["data_start"], wire["version"])
    records.set_columns(names, None, pairs)
    columns = _pending_columns(
        records,
        names,
        _per_row(dtype_rows, dict(enumerate(wire["dtypes"]))),
        _per_row(shape_rows, dict(enumerate(map(math.prod, shapes)))),
        _per_row(shape_rows, dict(enumerate(shapes))),
        _per_row(shape_rows, dict(enumerate(map(_strides, shapes)))),
    )
    return Checkpoint(
        path,
        "safetensors",
        PENDING_ROOT,
        wire["file_bytes"],
        metadata=wire["metadata"],
        notes=wire["notes"],
        loader_problems=wire["problems"],
        columns=columns,
    )


_CPU = itertools.repeat("cpu")
_ZERO = itertools.repeat(0)
_repeat = itertools.repeat


def _per_row(keys: list[Any], values: dict[Any, Any]) -> list[Any]:
    """Each row's value, by its key, ``values`` holding every key's and no other (one look per row; a
    column of one key is its one value repeated)."""
    if len(values) == 1:
        return [*values.values()] * len(keys)
    return list(map(values.__getitem__, keys))


def _tiles(begins: list[int], ends: list[int], data_bytes: int) -> bool:
    """Whether each range starts where the one before it stops, from 0 to ``data_bytes`` (two list
    comparisons at C speed)."""
    return bool(begins) and begins[0] == 0 and ends[-1] == data_bytes and begins[1:] == ends[:-1]


def _tiles_in_file_order(header: dict[str, Any], data_bytes: int) -> bool:
    """:func:`_tiles` of the ranges in the order the header lists them (a writer's data order, which tiles
    the data without a sort); called once every entry passed."""
    pairs = list(itertools.chain.from_iterable(map(operator.itemgetter("data_offsets"), _entries(header))))
    return _tiles(pairs[0::2], pairs[1::2], data_bytes)


def _entries(header: dict[str, Any]) -> Any:
    """The header's tensor entries, in its order."""
    if "__metadata__" not in header:
        return header.values()
    return (entry for name, entry in header.items() if name != "__metadata__")


def _bulk_fields(entries: list[Any]) -> tuple[list[str], list[Any], list[Any], list[int], list[int]] | None:
    """Every entry's dtype codes, shapes, offsets, begins and ends, when every entry is an object of the
    three fields with a known dtype, a list shape of ints and a ``[begin, end]`` pair of ints, no begin negative
    (each end is checked with the sizes, :func:`_ranges_fit`); else None."""
    if set(map(type, entries)) - {dict} or set(map(len, entries)) - {len(FIELDS)}:
        return None
    try:
        codes, shapes, offsets = (list(map(operator.itemgetter(field), entries)) for field in FIELDS)
        # (a code not a str is not a key of the table; one that cannot be hashed raises)
        if not set(codes) <= SAFETENSORS_DTYPES.keys():
            return None
    except (KeyError, TypeError):
        return None
    if set(map(type, itertools.chain(shapes, offsets))) - {list} or set(map(len, offsets)) - {2}:
        return None
    # every pair's two ints in one list: begins and ends are its even and odd places
    pairs = list(itertools.chain.from_iterable(offsets))
    if not _all_ints(shapes, offsets, pairs):
        return None
    begins = pairs[0::2]
    # each end is checked with the sizes (at most the data's size, at least its begin): here, the begins
    if begins and min(begins) < 0:
        return None
    return codes, shapes, offsets, begins, pairs[1::2]


_INT_LISTS = b"0123456789,[]"
"""What orjson writes for lists of lists of ints (no sign: a negative size or offset is refused anyway)."""


def _all_ints(shapes: list[list[Any]], offsets: list[list[Any]], pairs: list[Any]) -> bool:
    """Whether every size of every shape and every offset is an ``int`` (not a bool, float or anything
    else). With orjson, both columns written as one JSON text and looked at once: only digits, commas and
    the brackets of these very lists (a float has a point or an exponent, a bool is a word, a list inside
    adds brackets); without it, or for what orjson does not write (ints past 64 bits), by type."""
    fast = _orjson()
    if fast is not None:
        try:
            # (an int subclass, such as json's -0 here, is not written as an int: looked at by type)
            text = fast.dumps((shapes, offsets), option=fast.OPT_PASSTHROUGH_SUBCLASS)
        except TypeError:  # (orjson's JSONEncodeError: an int past 64 bits, or a subclass)
            text = b""
        if text:
            return not text.translate(None, _INT_LISTS) and text.count(b"[") == 1 + 2 + len(shapes) + len(offsets)
    return not {*map(type, itertools.chain.from_iterable(shapes)), *map(type, pairs)} - {int}


def _ranges_fit(codes: list[str], numels: list[int], begins: list[int], ends: list[int], data_bytes: int) -> bool:
    """Whether each ``[begin, end)`` lies in the data and holds exactly its tensor's bytes (a length equal
    to a byte count, never negative, puts each begin at or before its end; the begins are not negative:
    so every offset lies within 64 bits, as the entry-by-entry path requires)."""
    sizes = {code: itemsize(dtype) for code, dtype in SAFETENSORS_DTYPES.items()}
    if ends and max(ends) > data_bytes:
        return False
    lengths = list(map(operator.sub, ends, begins))
    if len(set(codes)) == 1:  # (one dtype: each row's byte count is its element count times one size)
        size = sizes[codes[0]]
        if numels and numels.count(numels[0]) == len(numels):  # (and one count: one byte count for all)
            return lengths.count(numels[0] * size) == len(lengths)
        return lengths == list(map(size.__mul__, numels))
    return lengths == list(map(operator.mul, numels, map(sizes.__getitem__, codes)))


def _overflows(shape: tuple[int, ...]) -> bool:
    """Whether the library's element count overflows: it multiplies the sizes left to right in 64 bits,
    so a shape with a 0 can still pass 2**64 before reaching it."""
    count = 1
    for dim in shape:
        count *= dim
        if count >= U64:
            return True
    return False


def _overflow_problem(names: list[str]) -> str:
    return (
        f"tensor {_some(names)} has a shape whose element count passes 2**64 before its 0, "
        "which the safetensors library refuses"
    )


def _each_tensor(
    path: str,
    parsed: _Header,
    names: list[str],
    data_bytes: int,
    records: SafetensorsRecords,
    problems: list[str],
    deepest: int,
) -> tuple[dict[str, Tensor], int]:
    """Every tensor entry checked on its own (and what only escapes and repeated keys can break)."""
    header = parsed.entries
    records.ranges.clear()
    root: dict[str, Tensor] = {}
    for name in names:
        if name == "__metadata__":
            continue
        entry = header[name]
        if parsed.escaped:
            _text(name, "a tensor name")
        if isinstance(entry, dict) and len(entry) > len(FIELDS):  # fields the library ignores, still parsed
            deepest = max(deepest, 2 + max(_depth(v) for k, v in entry.items() if k not in FIELDS))
        if parsed.twice(entry):
            problems.append(f"tensor {name!r} repeats {_some(parsed.twice(entry))} in its entry, {REFUSED}")
        root[name] = _tensor(path, name, entry, data_bytes, records)
    overflowing = [name for name, tensor in root.items() if 0 in tensor.shape and _overflows(tensor.shape)]
    if overflowing:
        problems.append(_overflow_problem(overflowing))
    return root, deepest


def _metadata(header: dict[str, Any], problems: list[str], escaped: bool) -> dict[str, Any]:
    metadata = header.get("__metadata__")
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        problems.append("its __metadata__ is not an object of strings, which the safetensors library refuses")
        return {}
    if escaped:
        _text(metadata, "__metadata__")
    if not all(isinstance(v, str) for v in metadata.values()):
        odd = [k for k, v in metadata.items() if not isinstance(v, str)]
        problems.append(f"__metadata__ {_some(odd)} is not a string, which the safetensors library refuses")
    return dict(metadata)


def _tensor(path: str, name: str, entry: Any, data_bytes: int, records: SafetensorsRecords) -> Tensor:
    where = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict):
        raise ReadError(f"{where}: header entry is not an object")
    code = entry.get("dtype")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if code in SUB_BYTE_DTYPES and code != PACKED_FP4:
        raise ReadError(f"{where}: dtype {code} (6-bit floats) has no torch dtype: the safetensors library refuses it")
    dtype = PACKED_FP4_DTYPE if code == PACKED_FP4 else SAFETENSORS_DTYPES.get(code) if isinstance(code, str) else None
    if dtype is None:
        raise ReadError(f"{where}: unknown dtype {code!r}")
    if not isinstance(shape, list) or not all(type(n) is int and 0 <= n < U64 for n in shape):
        raise ReadError(f"{where}: shape is not a list of non-negative ints")
    if code == PACKED_FP4:
        # the library loads F4 as torch's float4_e2m1fn_x2, two values a byte along the last dimension
        if not shape or shape[-1] % 2:
            raise ReadError(
                f"{where}: F4 shape {shape} does not end in whole bytes: the safetensors library refuses it"
            )
        shape = [*shape[:-1], shape[-1] // 2]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(n) is int and 0 <= n < U64 for n in offsets)):
        raise ReadError(f"{where}: data_offsets is not a pair of non-negative ints")
    begin, end = offsets
    numel = math.prod(shape)
    if not begin <= end <= data_bytes or end - begin != numel * itemsize(dtype):
        raise ReadError(f"{where}: data_offsets {offsets} out of range or wrong for shape {shape}")
    records.ranges[name] = [begin, end]
    storage = Storage(name, dtype, "cpu", numel, records)
    return Tensor(storage, 0, tuple(shape), _strides(shape), dtype)


def _strides(shape: Any) -> tuple[int, ...]:
    """Row-major strides as the header's shape gives them (a 0-sized dimension makes those before it 0):
    each the product of the sizes after it, taken from the last one back (linear in the dimensions)."""
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return tuple(strides)


def _tiling_problems(ranges: dict[str, list[int]], data_bytes: int, *orders: list[list[int]]) -> list[str]:
    """How the ranges fail to tile the data exactly (the library's ``validate``), one line per kind.
    ``orders``: the ranges listed in orders worth trying before a sort (the header's, the names')."""
    if any(_chained(order, data_bytes) for order in orders) or _chained(sorted(ranges.values()), data_bytes):
        return []  # each range starts where the one before it stops: they tile the data
    overlaps: list[str] = []
    holes: list[str] = []
    position = 0
    for begin, end, name in sorted((begin, end, name) for name, (begin, end) in ranges.items()):
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
            f"{counted(data_bytes - position, 'byte')} follow{'s' if data_bytes - position == 1 else ''} the last "
            "tensor's data, which the safetensors library refuses"
        )
    return problems


def _chained(ordered: list[list[int]], data_bytes: int) -> bool:
    """Whether each range starts where the one before it stops, from 0 to ``data_bytes``. Ranges that
    chain in the header's order are in sorted order already (the writers' usual order): no sort needed."""
    if not ordered or ordered[0][0] != 0 or ordered[-1][1] != data_bytes:
        return False
    starts, stops = map(operator.itemgetter(0), ordered[1:]), map(operator.itemgetter(1), ordered[:-1])
    return all(map(operator.eq, starts, stops))


def _depth(value: Any) -> int:
    """How deeply a parsed JSON value nests, 0 for a scalar (walked without recursion)."""
    if not isinstance(value, (dict, list)):
        return 0
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
