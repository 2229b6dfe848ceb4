"""The legacy pre-1.6 format (a sequence of pickles, then raw storages) and plain pickles.

``torch.load`` reads such a file as: a magic-number pickle, a protocol-version pickle, a sys_info
pickle, the object pickle, the list of storage keys, then for each key in that order an 8-byte element
count (which must equal the storage's size) and the storage's bytes. Every one of those pickles is
unpickled by torch, so every one is scanned here for unsafe globals: a payload can run in the magic
number pickle and then push the expected number.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from typing import Any, BinaryIO

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.dtypes import itemsize
from ckpt_tui.core.model.tree import Checkpoint, RecordSource, Storage, Tensor, iter_tensors, over_whole_storages
from ckpt_tui.core.pickles.persistent_ids import LEGACY_FIELDS, Make, PersistentIds
from ckpt_tui.core.pickles.unpickle import StorageView, load_pickle
from ckpt_tui.core.readers.read_once import CHUNK, PickleBytes, ReadOnce, pickle_read

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001
COUNT = struct.Struct("<q")


class LegacyRecords(RecordSource):
    """Storages laid out after the pickles, each behind an 8-byte element count (found at open)."""

    in_place = True
    """Its storages' bytes lie as they are in one range of ``path`` (a writer copies them)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.version = places.version_at_open(path)
        self.offsets: dict[str, tuple[int, int]] = {}
        self.unmodelled: dict[str, str] = {}
        """Storages whose bytes torch.load writes from more than their own blob (a legacy view listed in the file
        fills part of its root), by key: why their values are not read here."""

    def has(self, storage: Storage) -> bool:
        """Whether the file holds the storage's bytes."""
        return storage.key in self.offsets

    def locate(self, storage: Storage) -> tuple[int, int]:
        """Offset of the storage's data and its size in bytes."""
        why = self.unmodelled.get(storage.key)
        if why is not None:
            raise ReadError(why)
        found = self.offsets.get(storage.key)
        if found is None:
            raise ReadError(f"{self.path}: storage {storage.key} is missing from the file")
        if found[1] < storage.nbytes:
            raise ReadError(
                f"storage {storage.key} holds {counted(found[1], 'byte')}, its tensors need {storage.nbytes}"
            )
        return found


LEGACY_MAGIC = (MAGIC_NUMBER.to_bytes(10, "little"), str(MAGIC_NUMBER).encode())
"""The magic number as the first pickle of a legacy file holds it (LONG1 in protocols 2 and later, text in 0 and 1)."""


def plain_pickle(head: bytes) -> bool:
    """Whether a pickle file's first bytes hold no legacy magic number: a plain pickle, which unpickling reads to its
    end (a legacy file's pickles are small before its storages)."""
    return not any(magic in head[:64] for magic in LEGACY_MAGIC)


def read_pickle_file(path: str, file_bytes: int, head: bytes = b"") -> Checkpoint:
    """Read a legacy torch file, or a plain pickle, without touching tensor data.

    Its pickles are read from the file once (:class:`ReadOnce`) and kept as the checkpoint's ``archive``
    (:class:`PickleBytes`, with the element counts read after them): the weights_only verdict judges
    those very bytes. Whether the file is taken or refused, :func:`pickle_read` hands them on. A remote plain pickle
    (told by ``head``) past the budget is refused before its body is fetched."""
    if head and places.is_remote(path) and plain_pickle(head):
        from ckpt_tui.core.model.remote import ensure_whole_read

        ensure_whole_read(path, "unpickling this plain pickle")
    unsafe: set[str] = set()
    with places.open_stream(path) as raw:
        once = ReadOnce(raw, file_bytes)
        read = PickleBytes(path, file_bytes, once.kept)  # (grows as the pickles are read)
        file = io.BufferedReader(once, buffer_size=CHUNK)
        try:
            first = load_pickle(file, None, f"{path}: pickle", unsafe)
            if type(first) is not int or first != MAGIC_NUMBER:
                note = "a plain pickle, not a torch checkpoint (torch.load refuses it: no magic number)"
                checkpoint = Checkpoint(path, "pickle", first, file_bytes, notes=[note], unsafe_globals=unsafe)
            else:
                checkpoint = _read_legacy(path, file, file_bytes, unsafe, read)
        finally:
            # kept as it is, not copied: a plain pickle is kept whole, and a copy would double it
            read.data = once.kept
            pickle_read(path, read)
    checkpoint.archive = read
    return checkpoint


def _read_legacy(path: str, file: BinaryIO, file_bytes: int, unsafe: set[str], read: PickleBytes) -> Checkpoint:
    what = f"{path}: legacy checkpoint"
    root, problems = read_legacy_stream(path, file, 0, file_bytes, unsafe, what, read)
    # torch writes and reads a legacy storage's bytes little-endian whatever the saving host was
    # (THPStorage_writeFileRaw/readFileRaw swap on a big-endian host only): _legacy_load never reads
    # sys_info's little_endian, so neither does this reader
    return Checkpoint(
        path, "legacy", root, file_bytes, byteorder="little", unsafe_globals=unsafe, loader_problems=problems
    )


def read_legacy_stream(
    path: str, file: BinaryIO, base: int, end: int, unsafe: set[str], what: str, read: PickleBytes | None = None
) -> tuple[Any, list[str]]:
    """The object of a legacy stream whose magic-number pickle ``file`` has just read, and what torch.load
    would refuse in it (in words). ``file`` reads ``path`` from ``base`` (a DCP item's byte range, or 0),
    which ends at ``end``: the storages' offsets are absolute offsets of ``path``. ``read``: what was read of
    the file from its start, where the element counts are found (and those read after it kept)."""
    protocol = load_pickle(file, None, what, unsafe)
    # legacy_load's protocol_version != PROTOCOL_VERSION: any number equal to it passes (1001.0 too)
    if type(protocol) not in (int, float, complex) or protocol != PROTOCOL_VERSION:
        raise ReadError(f"{what}: unsupported protocol version")
    load_pickle(file, None, what, unsafe)  # sys_info: scanned, never used
    # torch's deserialized_objects is keyed by the key object: int 0 and str "0" are two storages, each
    # filled from its own place in the key list; their bytes are found apart
    records, int_records = LegacyRecords(path), LegacyRecords(path)

    def maker(source: LegacyRecords) -> Make:
        def make(key: str, dtype: str, location: str, numel: int, type_name: str) -> Storage:
            storage = Storage(key, dtype, location, numel, source, type_name)
            if storage.nbytes > end - base:
                raise ReadError(
                    f"{what}: storage {key} declares {counted(storage.nbytes, 'byte')}, more than the whole file"
                )
            return storage

        return make

    ids = PersistentIds(LEGACY_FIELDS, maker(records), make_for_int=maker(int_records))
    root = load_pickle(file, ids, what, unsafe)
    listed = load_pickle(file, None, what, unsafe)
    keys = iterated_keys(listed)
    if keys is None or not all(type(k) in (str, int) for k in keys):
        raise ReadError(f"{what}: storage key list is malformed")
    _grow_to_tensors(root, ids.cache, end - base)
    problems = ids.problems()
    problems += _scan(read, base + file.tell(), keys, ids.cache, end, path)
    return root, problems


def _grow_to_tensors(root: Any, storages: dict[Any, Storage | StorageView], file_bytes: int) -> None:
    """``legacy_load`` makes each storage ``UntypedStorage(nbytes)``, which is resizable: a tensor's ``set_`` grows
    it to what the tensor needs, and its blob is then read at that size. Grown here as torch grows it (a storage
    with a view into it is left as its persistent id says: the view's slice is not resizable; so is one grown past
    what the file could hold, whose blob cannot then be found: torch refuses it either way)."""
    tensors = _tensors_of(root)
    # what torch.save writes (each tensor over all of its own storage) grows nothing: judged in C-speed passes,
    # so a 50,000-key state_dict pays no per-tensor walk on every open
    if over_whole_storages(tensors):
        return
    viewed = {id(view.storage) for view in storages.values() if isinstance(view, StorageView)}
    for tensor in tensors:
        storage = tensor.storage
        if storage is None or id(storage) in viewed or not isinstance(storage.source, LegacyRecords):
            continue
        if tensor.kind != "dense" or 0 in tensor.shape or any(step < 0 for step in tensor.stride):
            continue
        needed = (
            tensor.offset
            + 1
            + sum((count - 1) * step for count, step in zip(tensor.shape, tensor.stride, strict=False))
        )
        # (a tensor of another dtype than its storage is left to the reader's own checks)
        if tensor.dtype == storage.dtype and storage.numel < needed <= file_bytes // max(1, itemsize(storage.dtype)):
            storage.numel = needed


def _tensors_of(root: Any) -> list[Tensor]:
    """Every tensor shown below ``root``: a flat state_dict's values as they are, else by the tree's walk."""
    if isinstance(root, dict):
        values = list(root.values())
        if set(map(type, values)) == {Tensor}:
            return values
    return [tensor for _, tensor in iter_tensors(root)]


NOT_ITERABLE = (int, float, bool, complex, type(None))
"""Key-list values torch's ``for key in deserialized_storage_keys`` fails on (TypeError: not iterable)."""


def iterated_keys(keys: Any) -> list[Any] | None:
    """The storage keys in the order ``legacy_load`` takes them (``for key in deserialized_storage_keys``: any
    iterable): a list or tuple as it is, a str's characters, a dict's keys; None where that order is not known here
    (a set of several keys iterates in the order of their hashes, which differs from run to run) or torch fails."""
    if type(keys) in (list, tuple, str):
        return list(keys)
    if isinstance(keys, dict):
        return list(keys)
    if type(keys) in (set, frozenset) and len(keys) <= 1:
        return list(keys)
    return None


def _scan(
    read: PickleBytes | None,
    start: int,
    keys: list[str | int],
    storages: dict[Any, Storage | StorageView],
    file_bytes: int,
    path: str,
) -> list[str]:
    """Find each listed storage's bytes (one read of each count); what torch.load would refuse, in words."""
    problems: list[str] = []
    position = start
    source = places.source_of(path)
    try:
        # where each count should be, as the pickle's sizes say: a remote file fetches them together
        source.prefetch(list(_expected_counts(position, keys, storages)))
        _find_records(read, source, position, keys, storages, file_bytes, problems)
    finally:
        source.close()
    return problems  # a key listed twice is read twice, the second kept (as torch does); unlisted ones are missing


def _expected_counts(
    position: int, keys: list[str | int], storages: dict[Any, Storage | StorageView]
) -> Iterator[tuple[int, int]]:
    """The ranges of the element counts, if each storage is as long as its persistent id says."""
    for key in keys:
        storage = storages.get(key)
        if storage is None or isinstance(storage, StorageView):
            return
        yield position, COUNT.size
        position += COUNT.size + storage.nbytes


def _view_listed(key: str | int, view: StorageView, problems: list[str]) -> None:
    """A legacy view listed among the storages: its root's values are not read (torch writes the view into them)."""
    root = view.storage
    why = (
        f"storage {root.key!r} is written in part by the legacy view {key!r} listed after it (torch.load fills the "
        "view's values into it): its values are not read here"
    )
    if isinstance(root.source, LegacyRecords):
        root.source.unmodelled[root.key] = why
    problems.append(f"storage key {key!r} names a legacy view: {why}")


def _find_records(
    read: PickleBytes | None,
    source: places.ByteSource,
    position: int,
    keys: list[str | int],
    storages: dict[Any, Storage | StorageView],
    file_bytes: int,
    problems: list[str],
) -> None:
    for key in keys:
        storage = storages.get(key)
        if storage is None:
            problems.append(f"storage {key!r} is listed but no tensor uses it: torch.load refuses the file")
            break  # its element size is unknown, so the storages after it cannot be found
        # (from what the reader read, or kept for the verdict)
        head = read.read_at(source, position, COUNT.size) if read is not None else source.read_at(position, COUNT.size)
        if isinstance(storage, StorageView):
            # torch reads the view's own blob into its root's bytes: the root is then more than its blob, whose
            # values would be shown wrong; the blobs after it are found past the view's
            _view_listed(key, storage, problems)
            if len(head) < COUNT.size:
                break
            position += COUNT.size + max(0, COUNT.unpack(head)[0]) * itemsize(storage.dtype)
            continue
        if len(head) < COUNT.size:
            problems.append(f"storage {key!r} is missing: the file ends first (truncated?)")
            break
        (count,) = COUNT.unpack(head)
        nbytes = count * itemsize(storage.dtype)
        if count < 0 or position + COUNT.size + nbytes > file_bytes:
            problems.append(f"storage {key!r} runs past the end of the file (truncated?)")
            break
        if count != storage.numel:
            problems.append(
                f"storage {key!r} holds {counted(count, 'element')} where its persistent id says {storage.numel}: "
                "torch.load refuses the file"
            )
        records = storage.source
        if isinstance(records, LegacyRecords):
            records.offsets[storage.key] = (position + COUNT.size, nbytes)
        position += COUNT.size + nbytes
