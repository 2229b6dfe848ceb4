"""The ``.safetensors`` output, laid out as the ``safetensors`` library lays it out.

The library (``prepare()`` in its Rust source) sorts tensors by dtype, largest alignment first,
then by name, and packs them without gaps; since every 8-byte dtype comes before every 4-byte one
and so on, each tensor's offset is a multiple of its element size. The JSON header is compact,
``__metadata__`` first, then the tensors in that order, padded with spaces to a multiple of 8.

``__metadata__`` always holds a ``format`` (``"pt"`` unless the source declared its own: a file
written from Flax keeps ``"flax"``, since its tensors still follow Flax's conventions), the
source's own metadata, and, as ``save_model`` records them, the names of tied tensors that were
written once (``{"lm_head.weight": "embed.weight"}``).
"""

from __future__ import annotations

import itertools
import math
import operator
import struct
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from typing import Any, BinaryIO

from ckpt_tui.core.errors import WriteError
from ckpt_tui.core.model.describe import size as shown_size
from ckpt_tui.core.model.dtypes import itemsize
from ckpt_tui.core.model.tree import HeaderRanges, Tensor, over_whole_storages, view_key
from ckpt_tui.core.readers.safetensors_file import TORCH_TO_SAFETENSORS
from ckpt_tui.core.writers.output import Output, WriteLog
from ckpt_tui.core.writers.source_bytes import SMALL, SourceReader, compressed, in_one_file
from ckpt_tui.core.writers.tensor_data import NEGATABLE, tensor_bytes, view_bits

# the library's Dtype enum, in declaration order: it sorts tensors by this, descending
LIBRARY_DTYPE_ORDER = (
    "BOOL",
    "F4",
    "F6_E2M3",
    "F6_E3M2",
    "U8",
    "I8",
    "F8_E5M2",
    "F8_E4M3",
    "F8_E8M0",
    "F8_E4M3FNUZ",
    "F8_E5M2FNUZ",
    "I16",
    "U16",
    "F16",
    "BF16",
    "I32",
    "U32",
    "F32",
    "C64",
    "F64",
    "I64",
    "U64",
)
_RANK = {name: rank for rank, name in enumerate(LIBRARY_DTYPE_ORDER)}

Progress = Callable[[int, int], None]
CancelCheck = Callable[[], bool]


@dataclass(slots=True)
class DataItem:
    """One tensor's bytes in the output: where, how many, copied from where (None: converted), CRC if known."""

    name: str
    offset: int
    size: int
    source_path: str | None = None
    source_offset: int = 0
    crc: int | None = None


@dataclass
class SafetensorsWrite:
    """What went into a ``.safetensors``: the header, each tensor's place, the aliases, and the write log."""

    header: bytes
    items: list[DataItem]
    """Each tensor's place, where it was written tensor by tensor (empty where whole runs were copied)."""
    aliases: dict[str, str]
    data_start: int = 0
    tensors: int = 0
    """Tensors written (each once; ``aliases`` name the others)."""
    log: WriteLog = field(default_factory=WriteLog)
    nbytes: int = 0


def library_order(names_and_tensors: list[tuple[str, Tensor]]) -> list[tuple[str, Tensor]]:
    """The library's order: dtype descending (by its enum), then name (names sorted per dtype at C speed)."""
    by_dtype: dict[str, list[tuple[str, Tensor]]] = {}
    for item in names_and_tensors:
        by_dtype.setdefault(item[1].dtype, []).append(item)
    ordered: list[tuple[str, Tensor]] = []
    for dtype in sorted(by_dtype, key=lambda d: -_RANK[TORCH_TO_SAFETENSORS[d]]):
        ordered += sorted(by_dtype[dtype], key=operator.itemgetter(0))
    return ordered


class SafetensorsPlan:
    """A flat dict of tensors laid out as safetensors; identical tied views written once."""

    def __init__(self, root: Any, byteorder: str, metadata: Mapping[Any, Any] | None = None) -> None:
        if byteorder != "little":
            raise WriteError("big-endian checkpoints cannot be written as safetensors")
        if not isinstance(root, dict) or not all(isinstance(k, str) for k in root):
            raise WriteError(f"safetensors holds one flat dict of tensors; this checkpoint is nested: {_way(root)}")
        others = [k for k, v in root.items() if not isinstance(v, Tensor)]
        if others:
            listed = ", ".join(repr(k) for k in others[:5])
            raise WriteError(f"safetensors holds only tensors; {listed} are not: {_way(root, '--drop')}")
        if "__metadata__" in root:
            raise WriteError("a tensor named '__metadata__' cannot be written as safetensors (rename it)")
        self.aliases: dict[str, str] = {}
        self.source = _one_plain_source(list(root.values()))
        """The one safetensors file every tensor is plainly read from (each its own range), else None:
        then the plan is made, and the data copied, in whole-list passes (a state_dict of 50,000 tensors)."""
        self.left_out = [] if self.source is not None else left_out_parts(root)
        self.tensors = library_order(list(root.items()) if self.source is not None else self._unique(root))
        keys = list(map(_SHAPE_AND_DTYPE, self.tensor_objects()))
        sizes = {key: math.prod(key[0]) * itemsize(key[1]) for key in set(keys)}  # bytes of each (shape, dtype)
        self.sizes = list(map(sizes.__getitem__, keys))
        self.metadata = self._metadata(metadata or {})

    def _unique(self, root: dict[str, Tensor]) -> list[tuple[str, Tensor]]:
        """Tensors to write; an identical view seen again becomes an alias of the first name in the tree's order."""
        from ckpt_tui.core.values.tensor_values import repeats_far_more, stored_span  # (with numpy)

        views: dict[tuple[Any, ...], list[str]] = {}
        first_view: dict[int, tuple[Any, ...]] = {}
        shared: dict[int, list[tuple[Any, ...]]] = {}
        repeating: dict[tuple[Any, ...], bool] = {}  # by layout (offset, shape, stride, dtype): judged once each
        for name, tensor in root.items():
            storage = tensor.storage
            if storage is None and tensor.kind == "dense":
                # a meta tensor (or one with no storage): shape and dtype, no values for safetensors to hold
                raise WriteError(
                    f"{name!r}: a tensor with no values (a meta tensor: shape and dtype only) cannot be written as "
                    "safetensors; write .pth, or drop it"
                )
            if storage is None or tensor.kind != "dense" or tensor.dtype not in TORCH_TO_SAFETENSORS:
                raise WriteError(f"{name!r}: {tensor.dtype} {tensor.kind} tensors cannot be written as safetensors")
            layout = (tensor.offset, tensor.shape, tensor.stride, tensor.dtype)
            far = repeating.get(layout)
            if far is None:
                far = repeating[layout] = repeats_far_more(tensor)
            if far:
                raise WriteError(
                    f"{name!r}: a view of {tensor.numel} elements over {stored_span(tensor)} stored (expand, stride 0):"
                    f" safetensors cannot hold views and would write all {shown_size(tensor.nbytes)};"
                    " write .pth, which keeps the view"
                )
            view = view_key(tensor)
            names = views.get(view)
            if names is not None:
                names.append(name)
                continue
            views[view] = [name]
            try:
                resolved = any(view_bits(tensor))
            except ValueError:
                resolved = True  # refused, with its reason, when its bytes are planned
            if resolved:
                # a negated or conjugated view is written as its own values, the bits applied: no tie to refuse
                continue
            first = first_view.setdefault(id(storage), view)
            if first is not view:
                shared.setdefault(id(storage), [first]).append(view)
        for group in shared.values():
            _refuse_overlaps([_span(view, views[view][0]) for view in group])
        unique = []
        for names in views.values():
            if len(names) == 1:
                unique.append((names[0], root[names[0]]))
                continue
            # the first name in the tree's order: the module that owns the weight, registered first (the embedding,
            # not the LM head tied to it), as transformers' save_pretrained keeps it (safetensors' save_model keeps
            # the smallest name, lm_head.weight before transformer.wte.weight, which a model loads as missing)
            kept = names[0]
            unique.append((kept, root[kept]))
            self.aliases.update((other, kept) for other in names[1:])
        return unique

    def _metadata(self, source: Mapping[Any, Any]) -> dict[str, str]:
        bad = [k for k, v in source.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise WriteError(
                f"the source's metadata entry {bad[0]!r} is not text; safetensors metadata holds only strings"
            )
        metadata = {"format": source.get("format", "pt")}
        metadata.update((k, v) for k, v in source.items() if k != "format")
        for removed, kept in self.aliases.items():
            metadata.setdefault(removed, kept)  # as save_model does: the source's own entry wins
        return metadata

    def header(self) -> bytes:
        """The JSON header as the library writes it (compact, ``__metadata__`` first), padded to 8 bytes.

        Built piece by piece (``json.dumps`` of 50,000 small dicts costs several times more); the
        same text as ``json.dumps(..., separators=(",", ":"), ensure_ascii=False)``.
        """
        quote = encode_basestring
        parts = ['{"__metadata__":{', ",".join(quote(k) + ":" + quote(v) for k, v in self.metadata.items()), "}"]
        if self.source is not None:
            return _padded(parts, self._entries())
        shapes: dict[tuple[int, ...], str] = {}
        offset = 0
        entries: list[str] = []
        for (name, tensor), size in zip(self.tensors, self.sizes, strict=True):
            if offset % itemsize(tensor.dtype):
                raise WriteError(f"{name!r} would start at an unaligned offset {offset}")  # the order rules it out
            shape = shapes.get(tensor.shape)
            if shape is None:
                shape = shapes[tensor.shape] = "[" + ",".join(map(str, tensor.shape)) + "]"
            entries.append(
                f'{quote(name)}:{{"dtype":"{TORCH_TO_SAFETENSORS[tensor.dtype]}","shape":{shape},'
                f'"data_offsets":[{offset},{offset + size}]}}'
            )
            offset += size
        return _padded(parts, entries)

    def _entries(self) -> list[str]:
        """Every tensor's header entry, in whole-list passes: one text per distinct (shape, dtype), then
        one format per tensor (the text :meth:`header` writes entry by entry)."""
        tensors = self.tensor_objects()
        shapes, dtypes = list(map(_SHAPE, tensors)), list(map(_DTYPE, tensors))
        offsets = list(itertools.accumulate(self.sizes, initial=0))
        sizes = {dtype: itemsize(dtype) for dtype in set(dtypes)}
        if any(map(operator.mod, offsets[:-1], map(sizes.__getitem__, dtypes))):
            raise WriteError("a tensor would start at an unaligned offset")  # the order rules it out
        texts = {
            (shape, dtype): f'{{"dtype":"{TORCH_TO_SAFETENSORS[dtype]}","shape":[{",".join(map(str, shape))}],'
            for shape, dtype in set(zip(shapes, dtypes, strict=True))
        }
        names = map(encode_basestring, map(operator.itemgetter(0), self.tensors))
        layouts = map(texts.__getitem__, zip(shapes, dtypes, strict=True))
        return list(map(_ENTRY.format, names, layouts, offsets[:-1], offsets[1:]))

    def tensor_objects(self) -> list[Tensor]:
        """The tensors to write, in order."""
        return list(map(operator.itemgetter(1), self.tensors))

    def write(self, file: BinaryIO, progress: Progress | None, cancelled: CancelCheck | None) -> SafetensorsWrite:
        """Header, then each tensor's bytes in order: runs that lie back to back in the source copied as one."""
        header = self.header()
        with Output(file, sum(self.sizes), progress, cancelled) as out, SourceReader() as reader:
            out.write(struct.pack("<Q", len(header)))
            out.write(header)
            result = SafetensorsWrite(
                header, [], dict(self.aliases), data_start=out.position, tensors=len(self.tensors)
            )
            if self.source is not None:
                self._copy_runs(self.source, reader, out)
                out.close()
                result.log, result.nbytes = out.log, out.position
                return result
            run: list[DataItem] = []
            copier = _Copier(reader, out)
            offset = 0
            copyable: dict[tuple[Any, ...], bool] = {}
            for (name, tensor), size in zip(self.tensors, self.sizes, strict=True):
                item = self._item(reader, name, tensor, offset, size, copyable)
                offset += item.size
                result.items.append(item)
                if item.source_path is None:
                    copier.run(run)
                    copier.flush()
                    run = []
                    out.stream(tensor_bytes(tensor), item.size)
                elif run and (run[-1].source_path != item.source_path or _end(run[-1]) != item.source_offset):
                    copier.run(run)
                    run = [item]
                else:
                    run.append(item)
            copier.run(run)
            copier.flush()
            out.close()
        result.log, result.nbytes = out.log, out.position
        return result

    def _copy_runs(self, source: HeaderRanges, reader: SourceReader, out: Output) -> None:
        """Every tensor's bytes copied from its one source file, in whole-list passes: the ranges in the
        output's order, cut where one does not start where the one before it stops; each run copied whole
        (by the kernel if large, gathered with others if small). The library's order is the source's
        when the source was written by the library: the data section is then one run, one kernel copy."""
        ranges = list(map(source.ranges.__getitem__, map(_KEY, map(_STORAGE, self.tensor_objects()))))
        starts = list(map(operator.itemgetter(0), ranges))
        stops = list(map(operator.itemgetter(1), ranges))
        # where a run starts: the first range, and each that does not start where the one before it stops
        cuts = [0, *itertools.compress(range(1, len(starts)), map(operator.ne, starts[1:], stops[:-1])), len(starts)]
        reader.learn(source)
        small = _Gathered(reader, out, source.path)
        for first, end in itertools.pairwise(cuts):
            begin, size = source.data_start + starts[first], stops[end - 1] - starts[first]
            if size >= SMALL:
                small.flush()
                out.copy(reader.source(source.path), source.path, begin, size, None)
            elif size:
                small.add(begin, size)
        small.flush()

    @staticmethod
    def _item(
        reader: SourceReader, name: str, tensor: Tensor, offset: int, size: int, copyable: dict[tuple[Any, ...], bool]
    ) -> DataItem:
        """Where a tensor's bytes come from: a range of a source file, or (None) converted while written.

        ``copyable``: whether views of a source and layout lie as they are in one file, by (source, shape, stride).
        """
        item = DataItem(name, offset, size)
        storage = tensor.storage
        assert storage is not None
        if tensor.metadata is not None:
            try:
                conj, neg = view_bits(tensor)
            except ValueError as exc:
                raise WriteError(f"{name!r}: {exc}; safetensors cannot hold it") from None
            if neg and tensor.dtype not in NEGATABLE:
                raise WriteError(f"{name!r}: a negated {tensor.dtype} tensor cannot be written as safetensors")
            if conj or neg:
                return item  # the values are written with the bits applied
        key = (id(storage.source), tensor.shape, tensor.stride)
        copies = copyable.get(key)
        if copies is None:
            copies = copyable[key] = in_one_file(storage.source) and tensor.is_contiguous()
        if not copies or compressed(storage):
            return item
        if item.size == 0:
            return item  # an empty tensor reads no byte, wherever its offset points (torch.load accepts it)
        span = reader.span(storage)
        begin = tensor.offset * itemsize(tensor.dtype)
        if begin + item.size > span.available:
            raise WriteError(f"{name!r} reaches past its storage record ({span.available} bytes)")
        item.source_path, item.source_offset = span.path, span.offset + begin
        if begin == 0 and item.size == span.available:
            item.crc = span.crc
        return item


class _Gathered:
    """Small runs of one source file, read together (:meth:`SourceReader.gather`) and written in order."""

    def __init__(self, reader: SourceReader, out: Output, path: str) -> None:
        self.reader, self.out, self.path = reader, out, path
        self.pieces: list[tuple[str, int, int]] = []
        self.bytes = 0

    def add(self, begin: int, size: int) -> None:
        """One run's bytes, written at the next flush (soon: a batch is bounded)."""
        self.pieces.append((self.path, begin, size))
        self.bytes += size
        if len(self.pieces) >= GATHER_ITEMS or self.bytes >= GATHER_BYTES:
            self.flush()

    def flush(self) -> None:
        """Write the batched runs."""
        if self.pieces:
            self.out.write_many(list(self.reader.gather(self.pieces)), self.bytes)
            self.out.advance(self.bytes)
        self.pieces, self.bytes = [], 0


_ENTRY = '{}:{}"data_offsets":[{},{}]}}'
"""A header entry: its quoted name, its layout's text (:meth:`SafetensorsPlan._entries`), its two offsets."""
_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")
_SHAPE_AND_DTYPE = operator.attrgetter("shape", "dtype")
_STORAGE = operator.attrgetter("storage")
_KEY = operator.attrgetter("key")
_SOURCE = operator.attrgetter("source")
_LEFT_OUT_FIELDS = operator.attrgetter(
    "hooks", "metadata", "parameter_state", "python_type", "python_state", "quantizer", "sparse"
)


def _padded(parts: list[str], entries: list[str]) -> bytes:
    """The header's text: ``__metadata__`` (``parts``), then the entries, padded with spaces to 8 bytes."""
    try:
        raw = (",".join(["".join(parts), *entries]) + "}").encode("utf-8")
    except UnicodeEncodeError:
        raise WriteError("a key or metadata entry is not valid Unicode; safetensors needs UTF-8") from None
    return raw + b" " * ((-len(raw)) % 8)


def _one_plain_source(tensors: list[Tensor]) -> HeaderRanges | None:
    """The one safetensors file all ``tensors`` are read from as its reader makes them, when they are: each
    dense over its own storage (:func:`~ckpt_tui.core.model.tree.over_whole_storages`), on cpu, a dtype
    safetensors holds, nothing besides its values (no hooks, view bits, Parameter or Python state), its
    range in the header. What :meth:`SafetensorsPlan._unique`, :func:`left_out_parts` and the per-tensor
    write find of such tensors is then known: no alias, nothing left out, each copied from its range."""
    if not tensors or not over_whole_storages(tensors):
        return None
    storages = list(map(_STORAGE, tensors))
    first = storages[0].source
    source = first.header_ranges() if first is not None else None
    if source is None:
        return None
    if not all(map(operator.is_, map(_SOURCE, storages), itertools.repeat(source))):
        return None
    if len(set(map(id, storages))) != len(storages) or set(map(_LOCATION, storages)) != {"cpu"}:
        return None
    if not set(map(_DTYPE, tensors)) <= TORCH_TO_SAFETENSORS.keys() or source.missing(storages):
        return None
    extras = itertools.chain.from_iterable(map(_LEFT_OUT_FIELDS, tensors))
    if not all(map(operator.is_, extras, itertools.repeat(None))):
        return None
    return source


_LOCATION = operator.attrgetter("location")


def left_out_parts(root: dict[str, Tensor]) -> list[str]:
    """What the source's tensors hold beyond their values, which safetensors cannot hold: said, never dropped silently.

    Backward hooks, a Parameter's Python state, a tensor's Python attributes and its subclass, and the
    device it was saved on (safetensors loads on cpu unless told); one entry per kind, naming up to three keys.
    """
    kinds: dict[str, list[str]] = {}
    for name, tensor in root.items():
        storage = tensor.storage
        if storage is not None and storage.location != "cpu":
            kinds.setdefault(f"the device tag {storage.location}", []).append(name)
        if tensor.hooks is not None and not (isinstance(tensor.hooks, dict) and not tensor.hooks):
            kinds.setdefault("backward hooks", []).append(name)
        if tensor.parameter_state is not None:
            kinds.setdefault("Parameter state", []).append(name)
        if tensor.python_state is not None:
            kinds.setdefault("tensor attributes", []).append(name)
        if tensor.python_type is not None:
            kinds.setdefault("tensor subclass", []).append(name)
    return [
        f"{kind} of {', '.join(repr(n) for n in names[:3])}" + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        for kind, names in kinds.items()
    ]


def _copy_run(run: list[DataItem], reader: SourceReader, out: Output) -> None:
    """Tensors that lie back to back in one source file: one kernel copy if large, else gathered."""
    if not run:
        return
    path, start = run[0].source_path, run[0].source_offset
    assert path is not None
    size = _end(run[-1]) - start
    if size >= SMALL:
        out.copy(reader.source(path), path, start, size, run[0].crc if len(run) == 1 else None)
        return
    _copy_small(run, reader, out)


def _copy_small(items: list[DataItem], reader: SourceReader, out: Output) -> None:
    """Small tensors' bytes, read in source order (:meth:`SourceReader.gather`), written in output order."""
    pieces = reader.gather([(item.source_path or "", item.source_offset, item.size) for item in items])
    for item, data in zip(items, pieces, strict=True):
        if item.crc and zlib.crc32(data) != item.crc:
            raise WriteError(
                f"{item.name!r}: its record in the source fails its CRC (corrupt, or saved with skip_data)"
            )
    out.write_many(list(pieces), sum(item.size for item in items))
    out.advance(sum(item.size for item in items))


GATHER_BYTES = 8 << 20
GATHER_ITEMS = 4096


class _Copier:
    """Writes the copied tensors in output order: large runs by the kernel, small ones gathered in batches."""

    def __init__(self, reader: SourceReader, out: Output) -> None:
        self.reader = reader
        self.out = out
        self.small: list[DataItem] = []
        self.small_bytes = 0

    def run(self, run: list[DataItem]) -> None:
        """A run of tensors back to back in the source: copied now if large, else batched."""
        if not run:
            return
        if _end(run[-1]) - run[0].source_offset >= SMALL:
            self.flush()
            _copy_run(run, self.reader, self.out)
            return
        self.small += run
        self.small_bytes += _end(run[-1]) - run[0].source_offset
        if len(self.small) >= GATHER_ITEMS or self.small_bytes >= GATHER_BYTES:
            self.flush()

    def flush(self) -> None:
        """Write the batched small tensors."""
        if self.small:
            _copy_small(self.small, self.reader, self.out)
        self.small, self.small_bytes = [], 0


def _way(root: Any, other: str = "") -> str:
    """``use --extract state_dict (the model weights are there)``: the option that makes a training checkpoint
    writable as safetensors, named with the weights' path when they are found."""
    from ckpt_tui.core.conventions.state_dicts import inner_state_dict
    from ckpt_tui.core.model.keypath import to_slash

    found = inner_state_dict(root)
    also = f" or {other}" if other else ""
    if found:
        return f"use --extract {to_slash(found)} (the model weights are there){also}"
    return f"use --extract{also}"


def _end(item: DataItem) -> int:
    return item.source_offset + item.size


def _span(view: tuple[Any, ...], name: str) -> tuple[int, int, str]:
    """The elements of its storage a view reaches, as ``[begin, end)`` (empty views reach nothing)."""
    _, offset, shape, stride = view[:4]
    if 0 in shape:
        return offset, offset, name
    return offset, offset + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) + 1, name


def _refuse_overlaps(spans: list[tuple[int, int, str]]) -> None:
    """Different views of one storage that share elements cannot be tied in safetensors (sorted sweep)."""
    spans.sort()
    reach, owner = -1, ""
    for begin, end, name in spans:
        if begin == end:
            continue  # an empty view touches nothing
        if begin < reach:
            raise WriteError(
                f"{name!r} and {owner!r} share memory but are different views; safetensors cannot tie them"
            )
        if end > reach:
            reach, owner = end, name
