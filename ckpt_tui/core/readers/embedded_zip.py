"""A ``torch.save`` stream stored inside a byte range of a bigger file (DCP ``.distcp`` items).

DCP's loader reads each item with ``torch.load(BytesIO(item))``, which takes a zip archive or, failing
the zip magic, a pre-0.4 tar archive or the legacy format's pickles (a plain pickle is unpickled, then
refused). A zip is read with the same central-directory reader and safe unpickler as a whole file, its
member offsets shifted to absolute file offsets; a legacy stream with the legacy reader, its storages
found at absolute offsets. Every read is bounded by the range, and every pickle torch.load would
unpickle is read (safely), so its unsafe globals are named even when the item is refused.
"""

from __future__ import annotations

import io
import os
from typing import Any, BinaryIO

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.dtypes import DTYPES
from ckpt_tui.core.model.tree import Storage
from ckpt_tui.core.pickles.unpickle import StorageView, load_pickle, storage_from_pid, unsafe_note
from ckpt_tui.core.readers.legacy import MAGIC_NUMBER, read_legacy_stream
from ckpt_tui.core.readers.torch_zip import ZipRecords, unwritten_small_records
from ckpt_tui.core.readers.zip_archive import (
    STORED,
    ZipDirectory,
    data_offset,
    read_central_directory,
    read_member,
    unwritten,
    unwritten_text,
)


class FileRange(io.RawIOBase):
    """A read-only view of ``length`` bytes of ``file`` from ``start``, positions relative to it."""

    def __init__(self, file: BinaryIO, start: int, length: int) -> None:
        super().__init__()
        self.file = file
        self.start = start
        self.length = length
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.position, os.SEEK_END: self.length}[whence]
        self.position = min(max(0, base + offset), self.length)
        return self.position

    def tell(self) -> int:
        return self.position

    def fileno(self) -> int:
        """The underlying file's descriptor (the unpickler sizes its memory cap by that file)."""
        return self.file.fileno()

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def read(self, size: int | None = -1) -> bytes:
        left = self.length - self.position
        count = left if size is None or size < 0 else min(size, left)
        self.file.seek(self.start + self.position)
        data = self.file.read(count)
        self.position += len(data)
        return data


class EmbeddedRecords(ZipRecords):
    """Storage records of an embedded archive; their offsets are found once, no file is kept open."""

    def __init__(self, path: str, entries: ZipDirectory, folder: str, end: int, offsets: dict[str, int]):
        super().__init__(path, entries, folder, end)
        self.data_offsets = offsets

    def locate(self, storage: Storage) -> tuple[int, int]:
        """Absolute offset of the record's bytes, and its size (inside the item's byte range)."""
        entry = self.entry(storage)
        if entry.compress != STORED:
            raise ReadError(f"record {entry.name} is compressed; only stored records can be read in place")
        offset = self.data_offsets[entry.name]
        if offset + entry.size > self.file_bytes:
            raise ReadError(f"record {entry.name} runs past the end of its item (truncated?)")
        if entry.size < storage.nbytes:
            raise ReadError(
                f"record {entry.name} holds {counted(entry.size, 'byte')}, its storage needs {storage.nbytes}"
            )
        return offset, entry.size

    # As before: an embedded archive's records are copied one by one (each through the writer's span),
    # and its views are read the exact way; only what the reader's locate gives is used.

    def batched_members(self) -> None:
        """None: each record of an embedded archive is written on its own."""
        return None

    def stored_spans(self) -> None:
        """None: an embedded archive's views are read the exact way."""
        return None

    def stored_places(self, keys: list[str]) -> None:
        """None: an embedded archive's views are read the exact way."""
        return None


def read_embedded(
    path: str, start: int, length: int, what: str, unsafe: set[str], known_classes: frozenset[str] = frozenset()
) -> Any:
    """The object ``torch.load(BytesIO(path[start:start+length]))`` gives, read safely (no code runs).

    Its tensors' storages point at absolute offsets of ``path``, and never past the range. The unsafe
    globals of every pickle torch.load would unpickle are added to ``unsafe``, and named in the error of
    an item that is refused.
    """
    end = start + length
    with places.open_stream(path) as file:
        if end > places.size_of(path):
            raise ReadError(f"{what}: byte range {start}+{length} is outside the file")
        view = FileRange(file, start, length)
        found: set[str] = set()
        try:
            if view.read(4) == b"PK\x03\x04":
                return _read_zip_item(file, view, path, start, length, what, found, known_classes)
            view.seek(0)
            return _read_legacy_item(view, path, start, end, what, found)
        except ReadError as exc:
            # a refused item names the unsafe globals of the pickles read before it failed, zip or legacy
            message = str(exc)
            raise ReadError(message if "it is UNSAFE" in message else message + unsafe_note(found)) from None
        finally:
            unsafe |= found


def _read_legacy_item(view: FileRange, path: str, start: int, end: int, what: str, unsafe: set[str]) -> Any:
    """torch.load's reading of bytes without the zip magic: the legacy stream's pickles (an item is a BytesIO,
    which torch never tries as a tar archive); a pickle that is not the magic number is unpickled, then refused."""
    view.seek(0)
    first = load_pickle(view, None, what, unsafe)  # type: ignore[arg-type]
    if type(first) is not int or first != MAGIC_NUMBER:
        raise ReadError(
            f"{what}: a plain pickle, not a torch.save stream (torch.load unpickles it, then fails: no magic number)"
        )
    root, problems = read_legacy_stream(path, view, start, end, unsafe, f"{what}: legacy stream")  # type: ignore[arg-type]
    if problems:
        raise ReadError(f"{what}: {problems[0]}")
    return root


def _read_zip_item(
    file: BinaryIO,
    view: FileRange,
    path: str,
    start: int,
    length: int,
    what: str,
    unsafe: set[str],
    known_classes: frozenset[str],
) -> Any:
    """A ``torch.save`` zip archive in the item's range."""
    end = start + length
    if length < 22:
        raise ReadError(f"{what}: byte range {start}+{length} is too short for a zip archive")
    try:
        relative = read_central_directory(view, length)  # type: ignore[arg-type]
    except ReadError as exc:
        raise ReadError(f"{what}: {exc}") from None
    entries = relative.shifted(start)
    if entries.collisions:
        raise ReadError(f"{what}: zip member names collide under torch's comparison: {entries.collision_text()}")
    data_names = [n for n in entries if n == "data.pkl" or n.endswith("/data.pkl")]
    if not data_names:
        raise ReadError(f"{what}: no data.pkl in the item's archive")
    data_name = min(data_names, key=lambda n: n.count("/"))
    prefix = data_name[: -len("data.pkl")]
    # torch.load (weights_only=False, in dcp.load) would unpickle or parse uninitialised memory
    data_entry = entries.listed_as(data_name)
    unread = [unwritten_text(data_entry)] if unwritten(data_entry) else unwritten_small_records(entries, prefix)
    if unread:
        raise ReadError(f"{what}: {unread[0]}")
    try:
        offsets = {n: data_offset(file, e) for n, e in entries.items() if n.startswith(prefix + "data/")}
        data = read_member(file, entries.listed_as(data_name), end)
        order = entries.get(prefix + "byteorder")
        if order is not None and read_member(file, order, end, limit=16).strip() not in (b"", b"little"):
            raise ReadError("big-endian item (not supported here)")
    except ReadError as exc:
        raise ReadError(f"{what}: {exc}") from None
    records = EmbeddedRecords(path, entries, prefix + "data/", end, offsets)
    cache: dict[str, Storage | StorageView] = {}

    def make(key: str, dtype: str, location: str, numel: int, type_name: str) -> Storage:
        entry = entries.record(records.folder, key)
        if entry is not None and entry.size < numel * DTYPES[dtype][0]:
            raise ReadError(f"{what}: storage {key} declares more bytes than its record holds")
        return Storage(key, dtype, location, numel, records, type_name)

    return load_pickle(data, lambda pid: storage_from_pid(pid, make, cache), what, unsafe, known_classes=known_classes)
