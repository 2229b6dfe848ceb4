"""``torch.distributed.checkpoint`` (DCP, used by FSDP) folders: ``.metadata`` plus ``.distcp`` files.

``.metadata`` is a pickle of ``Metadata``: per flattened key, a tensor's global shape, dtype and chunks
(or a non-tensor item), where each chunk and item lies (``storage_data``: file, offset, length) and the
nested path of each key (``planner_data``). Each item in a ``.distcp`` file is what ``torch.save``
writes, read as ``torch.load(BytesIO(item))`` reads it (:func:`read_embedded`: a zip archive or a legacy
stream). The tree is rebuilt the way ``dcp_to_torch_save`` rebuilds it (``set_element``); tensor values
are read from the chunks on demand, non-tensor items with the safe unpickler. Nothing is ever unpickled
by torch. ``dcp.load`` reads ``.metadata`` with ``pickle.load`` and non-tensor items with
``torch.load(weights_only=False)``: every global they name that is not plain data is code it runs, so a
folder refused here still names them (``and it is UNSAFE: ...``).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.assembled import COPY_CASTS, WIDENINGS, AssembledRecords, Piece, box_text
from ckpt_tui.core.model.contained import inside, named_entry
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.dtypes import DTYPES, itemsize
from ckpt_tui.core.model.tree import Checkpoint, Opaque, Storage, Symbol, Tensor
from ckpt_tui.core.pickles.unpickle import load_pickle, unsafe_note
from ckpt_tui.core.readers.dcp_extensions import SLACK, bytes_item_most, check_descriptors, plain_item
from ckpt_tui.core.readers.distributed_globals import DCP_CLASSES, DISTRIBUTED_CLASSES
from ckpt_tui.core.readers.embedded_zip import read_embedded
from ckpt_tui.core.readers.probes import METADATA

if TYPE_CHECKING:
    from ckpt_tui.core.model.remote import NoRanges

MAX_METADATA_BYTES = 512 << 20
MAX_PATH_DEPTH = 100
MAX_PAIRED = 256
"""Chunks of one tensor compared pairwise for overlaps (real saves have one per rank)."""
RANK_FILE = re.compile(r"__(\d+)_\d+\.distcp")
LIGHTNING_META = "meta.pt"
"""What Lightning's FSDP strategy saves beside a sharded (DCP) checkpoint: everything but the weights."""
OPTIMIZER_KEY = re.compile(r"optimizer_[0-9]+")


def _state(value: Any, what: str) -> dict[str, Any]:
    if isinstance(value, Opaque) and isinstance(value.state, dict):
        return value.state
    raise ReadError(f"{what}: unexpected layout (not DCP metadata)")


def _is(value: Any, name: str) -> bool:
    return isinstance(value, Opaque) and value.global_name == f"torch.distributed.checkpoint.metadata.{name}"


def _dtype(properties: Any, what: str) -> str:
    state = properties.state if isinstance(properties, Opaque) else None
    dtype = state.get("dtype") if isinstance(state, dict) else state[0] if isinstance(state, tuple) and state else None
    if isinstance(dtype, Symbol) and dtype.name in DTYPES:
        return dtype.name
    raise ReadError(f"{what}: tensor without a known dtype")


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not all(type(n) is int and n >= 0 for n in value):
        raise ReadError(f"{what}: malformed sizes or offsets")
    return tuple(value)


class DcpItems:
    """Where each item lies: ``storage_data`` turned into (file, offset, length) by (key, chunk offsets)."""

    def __init__(self, folder: str, storage_data: Any, what: str) -> None:
        self.folder = folder
        self.what = what
        self.sizes: dict[str, int] = {}
        self.places: dict[tuple[str, tuple[int, ...] | None], tuple[str, int, int]] = {}
        self.transforms: dict[tuple[str, tuple[int, ...] | None], tuple[str, ...]] = {}
        """Each compressed item's extensions, in the order torch reads it through them."""
        if not isinstance(storage_data, dict):
            raise ReadError(f"{what}: storage_data is missing (not written by FileSystemWriter)")
        if places.is_remote(folder):
            from ckpt_tui.core.model.remote import NoRanges  # (remote only)

            try:
                self._place_all(storage_data)
            except NoRanges as exc:
                raise self._download_the_folder(storage_data, exc) from None
        else:
            self._place_all(storage_data)

    def _place_all(self, storage_data: dict[Any, Any]) -> None:
        what = self.what
        for index, info in storage_data.items():
            key = _state(index, what)
            fqn, offset = key.get("fqn"), key.get("offset")
            if not isinstance(fqn, str):
                raise ReadError(f"{what}: a storage_data key without a name")
            chunk = None if offset is None else _ints(offset, what)
            fields = _state(info, what)
            self.places[(fqn, chunk)] = self._place(fields, fqn)
            descriptors = check_descriptors(fields.get("transform_descriptors"), f"{what}: {fqn!r}")
            if descriptors:
                self.transforms[(fqn, chunk)] = descriptors

    def _download_the_folder(self, storage_data: dict[Any, Any], refused: NoRanges) -> ReadError:
        """A storage file too large to take whole from a server without ranges: .metadata and every file it names
        to download into one folder (a name that leads out gives no command: its placing refuses it)."""
        from ckpt_tui.core.model.remote_stores import set_refused

        names = sorted({self._place_name(info) for info in storage_data.values()})
        files = f"{METADATA} and its {counted(len(names), 'storage file')} into one folder"
        return set_refused(self.folder, refused, files, self.folder, [METADATA, *names], "open that folder")

    def _place_name(self, info: Any) -> str:
        name = _state(info, self.what).get("relative_path")
        if not isinstance(name, str):
            raise ReadError(f"{self.what}: an item is stored in {name!r}, not a file of this folder")
        return name

    def _place(self, info: dict[str, Any], fqn: str) -> tuple[str, int, int]:
        name, offset, length = info.get("relative_path"), info.get("offset"), info.get("length")
        if not isinstance(name, str):
            raise ReadError(f"{self.what}: {fqn!r} is stored in {name!r}, not a file of this folder")
        if type(offset) is not int or type(length) is not int or offset < 0 or length < 0:
            raise ReadError(f"{self.what}: {fqn!r} has a malformed byte range")
        size = self.sizes.get(name)
        if size is None:
            path = inside(self.folder, name, f"{self.what}: the storage file of {fqn!r},")
            size = self.sizes[name] = places.size_of(path)
        if offset + length > size:
            raise ReadError(f"{self.what}: {fqn!r} lies past the end of {name} (truncated?)")
        return name, offset, length

    def find(self, fqn: str, chunk: tuple[int, ...] | None) -> tuple[str, int, int]:
        """The file, offset and length of one item."""
        place = self.places.get((fqn, chunk))
        if place is None:
            where = "" if chunk is None else f" chunk at {list(chunk)}"
            raise ReadError(f"{self.what}: no storage entry for {fqn!r}{where}")
        return place

    def plain(self, fqn: str, chunk: tuple[int, ...] | None, most: int, what: str) -> tuple[str, int, int]:
        """The file, offset and length of one item's bytes as ``torch.load`` is given them: where it lies, or
        (compressed) where it lies decompressed (:func:`~.dcp_extensions.plain_item`; up to ``most`` bytes)."""
        name, start, length = self.find(fqn, chunk)
        path = places.join(self.folder, name)
        return plain_item(path, start, length, self.transforms.get((fqn, chunk), ()), most, what)


def read_dcp(folder: str, open_file: Callable[[str], Checkpoint] | None = None) -> Checkpoint:
    """Rebuild the nested state_dict of a DCP checkpoint; tensors read their chunks on demand. A folder
    refused after some pickle named an unsafe global says so in its error (dcp.load runs it first)."""
    unsafe: set[str] = set()
    try:
        return _read_dcp(folder, open_file, unsafe)
    except ReadError as exc:
        message = str(exc)
        raise ReadError(message if "it is UNSAFE" in message else message + unsafe_note(unsafe)) from None


def _metadata(folder: str, unsafe: set[str]) -> tuple[dict[str, Any], dict[Any, Any], str, int]:
    """The ``Metadata`` object's fields, its ``state_dict_metadata``, how to name it, and its size in bytes."""
    meta_path = inside(folder, METADATA, f"{folder}: DCP metadata")
    what = f"{meta_path}: DCP metadata"
    meta_bytes = places.size_of(meta_path)
    if meta_bytes > MAX_METADATA_BYTES:
        raise ReadError(
            f"{what}: {counted(meta_bytes, 'byte')}, more than any real DCP metadata ({MAX_METADATA_BYTES >> 20} MB)"
        )
    with places.open_stream(meta_path) as file:
        metadata = load_pickle(file, None, what, unsafe, known_classes=DCP_CLASSES)
    if not _is(metadata, "Metadata"):
        raise ReadError(f"{what}: not a DCP Metadata object")
    state = _state(metadata, what)
    entries = state.get("state_dict_metadata")
    if not isinstance(entries, dict):
        raise ReadError(f"{what}: no state_dict_metadata")
    return state, entries, what, meta_bytes


def tensor_items(folder: str) -> list[tuple[str, str, int, int]]:
    """Each tensor chunk of a DCP folder (what ``dcp.load`` reads with ``torch.load(weights_only=True)``):
    a label, its file, offset and length, as ``.metadata`` places it."""
    state, entries, what, _ = _metadata(folder, set())
    items = DcpItems(folder, state.get("storage_data"), what)
    found = []
    for fqn, entry in entries.items():
        if not isinstance(fqn, str) or not _is(entry, "TensorStorageMetadata"):
            continue
        chunks = _state(entry, what).get("chunks")
        for chunk in chunks if isinstance(chunks, list) else []:
            offsets = _ints(_state(chunk, what).get("offsets"), what)
            name = items.find(fqn, offsets)[0]
            label = f"{fqn!r} (chunk at {list(offsets)}, {name})"
            most = _item_most(_state(entry, what), what)
            found.append((label, *items.plain(fqn, offsets, most, f"{places.join(folder, name)}: item {label}")))
    return found


def _read_dcp(folder: str, open_file: Callable[[str], Checkpoint] | None, unsafe: set[str]) -> Checkpoint:
    state, entries, what, meta_bytes = _metadata(folder, unsafe)
    planner = state.get("planner_data")
    paths: dict[Any, Any] = planner if isinstance(planner, dict) else {}
    items = DcpItems(folder, state.get("storage_data"), what)
    source = AssembledRecords(folder)
    root: dict[Any, Any] = {}
    odd: list[str] = []
    # each file in the order dcp.load first reads from it (it reads file by file, in that order)
    files_met: dict[str, int] = {}
    for fqn, entry in entries.items():
        if not isinstance(fqn, str):
            raise ReadError(f"{what}: a key that is not a string")
        if _is(entry, "TensorStorageMetadata"):
            value: Any = _tensor(fqn, _state(entry, what), items, source, what, odd, files_met)
        elif _is(entry, "BytesStorageMetadata"):
            name, _, stored = items.find(fqn, None)
            files_met.setdefault(name, len(files_met))
            where = f"{places.join(folder, name)}: item {fqn!r}"
            path, offset, length = items.plain(fqn, None, bytes_item_most(stored), where)
            value = read_embedded(path, offset, length, where, unsafe, DISTRIBUTED_CLASSES)
        else:
            raise ReadError(f"{what}: {fqn!r} is neither a tensor nor a bytes item")
        path = paths.get(fqn, (fqn,))
        set_element(root, _key_path(path, fqn, what), value, what)
    # the files storage_data names, each checked and measured once by DcpItems (never a listing's stray entry)
    files = sorted(items.sizes)
    total = sum(items.sizes.values()) + meta_bytes
    version = state.get("version")
    note = f"DCP checkpoint: {len(files)} .distcp files" + (f", version {version}" if isinstance(version, str) else "")
    ranks = len({m.group(1) for n in files if (m := RANK_FILE.fullmatch(n))}) or len(files)
    checkpoint = Checkpoint(
        folder,
        "dcp",
        root,
        total,
        notes=[note],
        unsafe_globals=unsafe,
        layout=f"DCP, {counted(ranks, 'rank')}",
        odd_layout=odd,
    )
    checkpoint.read_files = [places.join(folder, ".metadata"), *(places.join(folder, name) for name in files)]
    meta = places.join(folder, LIGHTNING_META)
    if open_file is not None and named_entry(meta):
        return with_lightning_meta(checkpoint, open_file(inside(folder, LIGHTNING_META, f"{folder}:")), ranks)
    return checkpoint


def with_lightning_meta(checkpoint: Checkpoint, meta: Checkpoint, ranks: int) -> Checkpoint:
    """Lightning's sharded FSDP folder: the DCP tree and ``meta.pt`` as one checkpoint, the way Lightning's
    ``consolidate_checkpoint`` joins them (meta.pt's keys over the DCP tree; ``model`` becomes
    ``state_dict``, ``optimizer_0``, ``optimizer_1``... the list ``optimizer_states``)."""
    root = checkpoint.root
    if not isinstance(meta.root, dict) or not isinstance(root, dict) or "model" not in root:
        return checkpoint
    joined: dict[Any, Any] = dict(root)
    joined.update(meta.root)
    joined["state_dict"] = joined.pop("model")
    optimizers = [key for key in joined if isinstance(key, str) and OPTIMIZER_KEY.match(key)]
    if optimizers:
        joined["optimizer_states"] = [joined.pop(f"optimizer_{n}", None) for n in range(len(optimizers))]
    checkpoint.root = joined
    checkpoint.read_files.append(meta.path)
    checkpoint.file_bytes += meta.file_bytes
    checkpoint.unsafe_globals |= meta.unsafe_globals
    checkpoint.loader_problems += [f"{LIGHTNING_META}: {p}" for p in meta.loader_problems]
    checkpoint.notes.append(
        f"Lightning FSDP sharded checkpoint: {LIGHTNING_META} joined with the DCP tree as Lightning's "
        "consolidate_checkpoint joins them (model -> state_dict, optimizer_N -> optimizer_states)"
    )
    checkpoint.layout = (
        f"Lightning FSDP (sharded): DCP + {LIGHTNING_META}, {counted(ranks, 'rank')}; weights: ckpt['state_dict']"
    )
    return checkpoint


def _key_path(path: Any, fqn: str, what: str) -> tuple[str | int, ...]:
    if not isinstance(path, (tuple, list)) or not path or len(path) > MAX_PATH_DEPTH:
        raise ReadError(f"{what}: planner_data path of {fqn!r} is malformed")
    if not all(type(k) is str or (type(k) is int and 0 <= k < 1 << 20) for k in path):
        raise ReadError(f"{what}: planner_data path of {fqn!r} holds a key that is neither a name nor an index")
    return tuple(path)


def set_element(root: dict[Any, Any], path: tuple[str | int, ...], value: Any, what: str) -> None:
    """Put ``value`` at ``path``, making dicts for names and lists for indices, as DCP's set_element does."""
    node: Any = root
    for key, following in itertools.pairwise(path):
        fresh: Any = {} if type(following) is str else []
        if isinstance(node, dict):
            node = node.setdefault(key, fresh)
        elif isinstance(node, list) and type(key) is int:
            node.extend([None] * (key + 1 - len(node)))
            if node[key] is None:
                node[key] = fresh
            node = node[key]
        else:
            raise ReadError(f"{what}: keys {path!r} clash with another entry")
        if not isinstance(node, (dict, list)):
            raise ReadError(f"{what}: keys {path!r} clash with another entry")
    last = path[-1]
    if isinstance(node, list) and type(last) is int:
        node.extend([None] * (last + 1 - len(node)))
        node[last] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ReadError(f"{what}: keys {path!r} clash with another entry")


def _tensor(
    fqn: str,
    entry: dict[str, Any],
    items: DcpItems,
    source: AssembledRecords,
    what: str,
    odd: list[str],
    files_met: dict[str, int],
) -> Tensor:
    """One tensor, read as ``dcp.load`` reads it: the chunks it copies, in its order, each item narrowed to the
    part of its chunk inside the tensor and cast to the tensor's dtype; what no saver writes is said in ``odd``,
    what the metadata shows now, what an item shows once it is read (reading every item costs as much as the
    values' own reading: ``check`` reads them all, here, and reports what they add)."""
    size = _ints(entry.get("size"), what)
    dtype = _dtype(entry.get("properties"), what)
    chunks = _chunks(fqn, entry.get("chunks"), len(size), what)
    pieces = []
    # its reads in plan order, then as FileSystemReader.read_data copies them: file by file, each file in the order
    # the whole plan first reads from it (so far: a file first met later is met in a later key)
    reads = torch_reads(size, chunks)
    placed = [items.find(fqn, chunks[index][0]) for index, _ in reads]
    for name, _, _ in placed:
        files_met.setdefault(name, len(files_met))
    copied = sorted(range(len(reads)), key=lambda k: files_met[placed[k][0]])
    reads = [reads[k] for k in copied]
    for (index, lengths), (name, start, length) in zip(reads, [placed[k] for k in copied], strict=True):
        offsets, sizes = chunks[index]
        path = places.join(items.folder, name)
        if lengths != sizes:
            odd.append(
                f"{fqn}: the chunk at {list(offsets)} ({list(sizes)}) reaches past the tensor ({list(size)}); "
                f"torch reads its first {list(lengths)}"
            )
        notice = functools.partial(_odd_item, f"{fqn}: the chunk at {list(offsets)}", sizes, lengths, dtype)
        place = functools.partial(items.plain, fqn, offsets, math.prod(size) * itemsize(dtype) + SLACK)
        load = _chunk_loader(path, start, length, fqn, odd, notice, place)
        pieces.append(Piece(offsets, lengths, f"{name} @ {start}", load, narrows=True))
    odd += _odd_cover(fqn, size, chunks, reads)
    numel = math.prod(size)
    storage = Storage(fqn, dtype, "cpu", numel, source)
    source.add(fqn, size, pieces, overwrite=True, casts=COPY_CASTS)
    stride = tuple(math.prod(size[i + 1 :]) for i in range(len(size)))
    return Tensor(storage, 0, size, stride, dtype)


Box = tuple[tuple[int, ...], tuple[int, ...]]


def _item_most(entry: dict[str, Any], what: str) -> int:
    """The most bytes one item of a tensor can hold decompressed: the whole tensor's storage (a chunk saved as a
    view of its rank's tensor keeps that tensor's storage), and ``torch.save``'s own."""
    return math.prod(_ints(entry.get("size"), what)) * itemsize(_dtype(entry.get("properties"), what)) + SLACK


def _chunks(fqn: str, chunks: Any, ndim: int, what: str) -> list[Box]:
    """A tensor's chunk list: (offsets, sizes) of each, as many dimensions as the tensor (else torch fails)."""
    if not isinstance(chunks, list):
        raise ReadError(f"{what}: {fqn!r} has no chunk list")
    boxes = []
    for chunk in chunks:
        if not _is(chunk, "ChunkStorageMetadata"):
            raise ReadError(f"{what}: {fqn!r} has a malformed chunk")
        fields = _state(chunk, what)
        offsets, sizes = _ints(fields.get("offsets"), what), _ints(fields.get("sizes"), what)
        if len(offsets) != ndim or len(sizes) != ndim:
            raise ReadError(f"{fqn}: a piece has {counted(len(offsets), 'dimension')}, the tensor {ndim}")
        boxes.append((offsets, sizes))
    return boxes


def torch_reads(size: tuple[int, ...], chunks: list[Box]) -> list[tuple[int, tuple[int, ...]]]:
    """The chunks ``dcp.load`` copies into a whole tensor of ``size``, in the order it copies them (a later one
    over an earlier where they overlap), each with the lengths it reads: its part inside the tensor.

    torch's ``create_read_items_for_chunk_list`` with one local chunk, the whole tensor: chunks sorted by where
    they start along the sweep dimension (the one reaching farthest), those starting inside the tensor kept,
    then taken by where they end (then by index); a chunk outside the tensor, or empty, is not read.
    """
    ndim = len(size)
    sweep = 0
    if ndim > 1:
        farthest = 0
        for dim in range(ndim):
            reach = max(offsets[dim] + sizes[dim] for offsets, sizes in [((0,) * ndim, size), *chunks])
            if reach > farthest:
                farthest, sweep = reach, dim
    if ndim == 0:
        bounds, end = [(0, 1)] * len(chunks), 1
    else:
        bounds, end = [(o[sweep], o[sweep] + n[sweep]) for o, n in chunks], size[sweep]
    active: list[tuple[int, int]] = []
    for index in sorted(range(len(chunks)), key=lambda i: bounds[i][0]):
        if bounds[index][0] >= end:
            break
        bisect.insort(active, (bounds[index][1], index))
    reads = []
    for _, index in active:
        offsets, sizes = chunks[index]
        if any(o >= total or o + n <= 0 or n == 0 for o, n, total in zip(offsets, sizes, size, strict=True)):
            continue
        reads.append((index, tuple(min(o + n, total) - o for o, n, total in zip(offsets, sizes, size, strict=True))))
    return reads


def _odd_item(chunk: str, sizes: tuple[int, ...], lengths: tuple[int, ...], dtype: str, stored: Tensor) -> list[str]:
    """What is odd about one chunk's item as dcp.load reads it: larger than the chunk (narrowed), cast."""
    odd = []
    if stored.shape != sizes:
        shapes = f"its item is {list(stored.shape)}, the chunk {list(sizes)}"
        # torch narrows an item along each dimension; one of another rank it cannot (its copy_ raises)
        narrows = len(stored.shape) == len(sizes) and all(s >= n for s, n in zip(stored.shape, lengths, strict=True))
        effect = f"torch narrows it to {list(lengths)}" if narrows else "torch.load refuses it (sizes mismatch)"
        odd.append(f"{chunk}: {shapes}; {effect}")
    if stored.dtype != dtype:
        known = (stored.dtype, dtype) in WIDENINGS | COPY_CASTS
        odd.append(
            f"{chunk}: its item is {stored.dtype}, the tensor {dtype}; torch casts it (copy_)"
            + ("" if known else ", which ckpt-tui does not emulate")
        )
    return odd


def _odd_cover(
    fqn: str, size: tuple[int, ...], chunks: list[Box], reads: list[tuple[int, tuple[int, ...]]]
) -> list[str]:
    """Chunks that overlap (the one copied last wins) or that surely leave part of the tensor uncovered."""
    odd = []
    rank = {index: order for order, (index, _) in enumerate(reads)}
    for a, b in itertools.combinations(range(min(len(chunks), MAX_PAIRED)), 2):
        (x, x_sizes), (y, y_sizes) = chunks[a], chunks[b]
        if all(i < j + m and j < i + n for i, n, j, m in zip(x, x_sizes, y, y_sizes, strict=True)):
            if x == y:
                # (torch finds a chunk's item by its offsets: both read the same one)
                odd.append(f"{fqn}: two chunks at {list(x)}; torch reads one stored item for both")
                break
            last = max((a, b), key=lambda index: rank.get(index, -1))
            odd.append(
                f"{fqn}: chunks {box_text(x, x_sizes)} and {box_text(y, y_sizes)} overlap; "
                f"torch copies the one at {list(chunks[last][0])} last"
            )
            break
    if sum(math.prod(lengths) for _, lengths in reads) < math.prod(size):
        odd.append(f"{fqn}: its chunks leave part of it uncovered; torch leaves that as torch.empty made it")
    return odd


def _chunk_loader(
    path: str,
    start: int,
    length: int,
    fqn: str,
    odd: list[str],
    notice: Callable[[Tensor], list[str]],
    place: Callable[[str], tuple[str, int, int]],
) -> Callable[[], Tensor]:
    """How a chunk's item is read (once, when values are first read): from where ``place`` says its bytes are as
    torch.load is given them (decompressed first, for a compressed item); what ``notice`` finds odd in it goes to
    ``odd``."""

    def load() -> Tensor:
        where = f"{path}: chunk of {fqn!r} at {start}"
        stored = read_embedded(*place(where), where, set())
        if not isinstance(stored, Tensor):
            raise ReadError(f"{where}: the item is not a tensor")
        odd.extend(notice(stored))
        return stored

    return load
