"""Reading the bytes a write copies: windowed reads, so runs of small records cost one read.

A checkpoint of 50,000 small tensors has 50,000 records laid out one after another. Reading each
with its own seek and read (and, for a zip, a second read for its local header) costs more than
the bytes. Here a window of the source file is read once and sliced; a record found in the window
costs a slice. Large records are never read through the window: they are copied by the kernel.
"""

from __future__ import annotations

import struct
import zlib

from ckpt_tui.core.errors import ReadError, WriteError
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.byte_source import ByteSource
from ckpt_tui.core.model.dtypes import DTYPES
from ckpt_tui.core.model.tree import HeaderRanges, RecordSource, Storage, ZipMembers
from ckpt_tui.core.readers.zip_archive import LOCAL, STORED, unwritten

WINDOW = 1 << 20
"""Cache-sized: the bytes read are sliced, CRC-checked and copied out while they are still in the cache."""
SMALL = 1 << 20
GAP = 4096
LOCAL_SLACK = 256
"""Room past a local header's fixed part and name for its extra field (torch pads records to 64-byte alignment
there): where a record's bytes may start, for a window's end (a window too short only costs a read more)."""
"""Bytes between two wanted ranges that :meth:`SourceReader.gather` reads through rather than seek past."""
_LOCAL_PARTS = struct.Struct("<4s22x2H")  # a local header's signature, name length and extra length


def in_one_file(source: RecordSource | None) -> bool:
    """Whether a storage's bytes lie as they are in one range of one file (so they can be copied).

    Cast storages, bytes held in memory and tensors assembled from pieces of several files are
    produced while written instead.
    """
    return source is not None and source.in_place


def compressed(storage: Storage) -> bool:
    """Whether a storage's record is deflated in its zip (a re-zipped checkpoint): its bytes are inflated as
    torch.load inflates them and written from memory, never copied as they lie."""
    check = getattr(storage.source, "is_compressed", None)
    return check is not None and bool(check(storage))


class SourceSpan:
    """Where a storage's bytes are: file, absolute offset, bytes available there, and a CRC if one is known."""

    __slots__ = ("available", "crc", "offset", "path")

    def __init__(self, path: str, offset: int, available: int, crc: int | None) -> None:
        self.path = path
        self.offset = offset
        self.available = available
        self.crc = crc


class SourceReader:
    """Open source files and one read window per file; close it when done.

    Each file is read as the version its checkpoint was opened as (learnt from its record source, or given):
    checked as it opens and, when the ``with`` ends without an error, after the last read (a changed source
    is ``FileChanged``, raised before the caller renames anything into place).
    """

    def __init__(self, versions: dict[str, str | None] | None = None) -> None:
        self._sources: dict[str, ByteSource] = {}
        self._windows: dict[str, tuple[int, memoryview]] = {}
        self.versions: dict[str, str | None] = dict(versions or {})
        """Each source file's version as it was opened (what its reads check)."""

    def __enter__(self) -> SourceReader:
        return self

    def __exit__(self, error: type[BaseException] | None, *exc: object) -> None:
        try:
            if error is None:
                self.confirm()
        finally:
            self.close()

    def learn(self, source: RecordSource | ZipMembers | HeaderRanges) -> None:
        """Read ``source.path`` as the version its records were opened from (before it is first read)."""
        self.versions.setdefault(source.path, source.version)

    def confirm(self) -> None:
        """Raise ``FileChanged`` when a file read is no longer the version it was opened as."""
        for source in self._sources.values():
            source.confirm()

    def close(self) -> None:
        """Close every file opened."""
        for source in self._sources.values():
            source.close()
        self._sources.clear()
        self._windows.clear()

    def source(self, path: str) -> ByteSource:
        """The byte source of ``path`` (opened once)."""
        source = self._sources.get(path)
        if source is None:
            source = places.source_of(path, self.versions.get(path))
            try:
                source.read_at(0, 0)  # opened now: a file that cannot be read is said here
            except OSError as exc:
                raise WriteError(f"cannot read {path}: {exc.strerror or exc}") from None
            self._sources[path] = source
        return source

    def read(self, path: str, offset: int, size: int) -> memoryview:
        """``size`` bytes at ``offset``: a slice of the current window, or a new window read there."""
        window = self._windows.get(path)
        if window is not None:
            start, data = window
            if start <= offset and offset + size <= start + len(data):
                return data[offset - start : offset - start + size]
        start, data = self._load(path, offset, size)
        return data[:size]

    def _load(self, path: str, offset: int, size: int, upto: int | None = None) -> tuple[int, memoryview]:
        """A window of ``size`` bytes at ``offset`` at least: :data:`WINDOW`'s, or up to ``upto`` where the caller
        knows what it will read (a remote source fetches every byte asked: never 1 MB for a 2 kB record)."""
        length = max(WINDOW, size) if upto is None else max(size, upto - offset)
        data = self.source(path).read_at(offset, length)
        if len(data) < size:
            raise WriteError(f"{path} ended early (truncated while being read?)")
        window = self._windows[path] = (offset, memoryview(data))
        return window

    def gather(self, pieces: list[tuple[str, int, int]]) -> list[memoryview]:
        """The bytes of many small ranges ``(path, offset, size)``, in the order given.

        They are read in file order, ranges at most :data:`GAP` apart with one read (at most
        :data:`WINDOW` bytes), so a source laid out in another order than the output costs one pass
        over the bytes wanted, not a window per jump.
        """
        order = sorted(range(len(pieces)), key=pieces.__getitem__)
        found: list[memoryview] = [memoryview(b"")] * len(pieces)
        at = 0
        while at < len(order):
            path, begin, size = pieces[order[at]]
            end, stop = begin + size, at + 1
            while stop < len(order):
                other, start, count = pieces[order[stop]]
                if other != path or start > end + GAP or max(end, start + count) - begin > WINDOW:
                    break
                end = max(end, start + count)
                stop += 1
            data = memoryview(self.source(path).read_at(begin, end - begin))
            if len(data) < end - begin:
                raise WriteError(f"{path} ended early (truncated while being read?)")
            for index in order[at:stop]:
                _, start, count = pieces[index]
                found[index] = data[start - begin : start - begin + count]
            at = stop
        return found

    def small_zip_records(
        self, source: ZipMembers, storages: list[Storage], first: int, limit: int
    ) -> list[tuple[memoryview, int]]:
        """Bytes and CRCs of the small stored records of ``storages[first:]`` in ``source``, at most ``limit``.

        The run stops before the first storage held elsewhere or not small. Each record gets the same
        checks as the reader's ``locate`` (a local header where the directory says, the record inside the
        file, at least as long as its storage); its CRC is computed and must be the source's, where the
        record is exactly the storage's bytes. Local headers are parsed from the window: a run costs a read.
        """
        found: list[tuple[memoryview, int]] = []
        self.learn(source)
        entries, folder, path, file_bytes = source.entries, source.folder, source.path, source.file_bytes
        start, data = self._windows.get(path) or (0, memoryview(b""))
        end = start + len(data)
        spans = self._fetch_run(source, storages[first : first + limit])
        unpack_from, crc32, append = _LOCAL_PARTS.unpack_from, zlib.crc32, found.append
        for index in range(first, min(first + limit, len(storages))):
            storage = storages[index]
            entry = entries.record(folder, storage.key) if storage.source is source else None
            # (a record torch leaves unwritten goes on its own, to the reader's refusal)
            if entry is None or entry.compress != STORED or entry.size >= SMALL or unwritten(entry):
                break
            header_at, size = entry.header_offset, entry.size
            if not (start <= header_at and header_at + LOCAL.size <= end):
                upto = spans[index - first][1] if index - first < len(spans) else None
                start, data = self._load(path, header_at, LOCAL.size, upto)
                end = start + len(data)
            signature, name_len, extra_len = unpack_from(data, header_at - start)
            if signature != b"PK\x03\x04":
                raise ReadError(f"zip member {entry.name}: bad local header (corrupt zip)")
            begin = header_at + LOCAL.size + name_len + extra_len
            if begin + size > file_bytes:
                raise ReadError(f"record {entry.name} runs past the end of the file (truncated?)")
            nbytes = storage.numel * DTYPES[storage.dtype][0]
            if size < nbytes:
                raise ReadError(f"record {entry.name} holds {size} bytes, its storage needs {nbytes}")
            if begin + nbytes > end:
                start, data = self._load(path, begin, nbytes, begin + nbytes if spans else None)
                end = start + len(data)
            record = data[begin - start : begin - start + nbytes]
            crc = crc32(record)
            if size == nbytes and entry.crc and entry.crc != crc:
                raise bad_crc(storage)
            append((record, crc))
        return found

    def _fetch_run(self, source: ZipMembers, run: list[Storage]) -> list[tuple[int, int]]:
        """A remote source's small records of ``run`` (up to the first that is not one), fetched together, exactly
        (their spans, each read as its own window then); ``[]`` for a local file, read in windows of :data:`WINDOW` (the
        page cache reads ahead, and one read serves many records)."""
        reader = self.source(source.path)
        if reader.local_fd() is not None:
            return []
        spans: list[tuple[int, int]] = []
        for storage in run:
            span = _record_span(source, storage)
            if span is None:
                break
            spans.append(span)
        reader.prefetch([(begin, end - begin) for begin, end in spans])
        return spans

    def span(self, storage: Storage) -> SourceSpan:
        """Where ``storage``'s bytes are, checked against its record as the reader checks them."""
        source = storage.source
        if source is None:
            raise WriteError(f"storage {storage.key} has no data in this file")
        self.learn(source)
        members = source.zip_members()
        if members is not None:
            return self._zip_span(members, storage)
        offset, available = source.locate(storage)
        return SourceSpan(source.path, offset, available, None)

    def _zip_span(self, source: ZipMembers, storage: Storage) -> SourceSpan:
        """A zip record's data offset read from its local header through the window (one read per run)."""
        entry = source.entry(storage)
        if entry.compress != STORED or entry.size >= SMALL:
            offset, available = source.locate(storage)  # the reader's own checks and errors
            return SourceSpan(source.path, offset, available, entry.crc if available == storage.nbytes else None)
        header = self.read(source.path, entry.header_offset, LOCAL.size)
        if bytes(header[:4]) != b"PK\x03\x04":
            raise ReadError(f"zip member {entry.name}: bad local header (corrupt zip)")
        name_len, extra_len = LOCAL.unpack(header)[-2:]
        offset = entry.header_offset + LOCAL.size + name_len + extra_len
        if offset + entry.size > source.file_bytes:
            raise ReadError(f"record {entry.name} runs past the end of the file (truncated?)")
        if entry.size < storage.nbytes:
            raise ReadError(f"record {entry.name} holds {entry.size} bytes, its storage needs {storage.nbytes}")
        return SourceSpan(source.path, offset, entry.size, entry.crc if entry.size == storage.nbytes else None)


def bad_crc(storage: Storage) -> WriteError:
    """The error for a source record whose bytes do not have the CRC its zip directory gives."""
    return WriteError(f"the source's record {storage.key} fails its CRC (a corrupt file, or saved with skip_data)")


def _record_span(source: ZipMembers, storage: Storage) -> tuple[int, int] | None:
    """Where a small stored record of ``source`` lies, local header first (its end a bound: see
    :data:`LOCAL_SLACK`), or None for a storage held elsewhere or not small and stored."""
    entry = source.entries.record(source.folder, storage.key) if storage.source is source else None
    if entry is None or entry.compress != STORED or entry.size >= SMALL:
        return None
    name = entry.raw or entry.name.encode("utf-8", "surrogateescape")
    return entry.header_offset, entry.header_offset + LOCAL.size + len(name) + LOCAL_SLACK + entry.size
