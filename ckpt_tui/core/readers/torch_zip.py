"""torch zip checkpoints (torch >= 1.6) and TorchScript archives, metadata only.

What ``torch.load`` (torch 2.13, ``PyTorchStreamReader`` and ``_load``) requires of the zip, each
checked here and reported in ``loader_problems`` when broken, the file still shown where possible:
every member lies in the folder named by the first member's path (one archive per zip); that folder
holds ``data.pkl`` and a ``version`` record (``.data/version`` first) between 1 and 10; ``byteorder``,
when present, is exactly ``little`` or ``big``; each storage record is exactly as long as its storage;
each persistent id has exactly five fields and a location tag torch can restore. CRCs are not checked
by torch, so a CRC mismatch is only a note. A zip with ``constants.pkl`` beside ``data.pkl`` is a
TorchScript archive (``torch.load`` hands it to ``torch.jit.load``): see :mod:`.torchscript`.
"""

from __future__ import annotations

import itertools
import operator
import threading
from collections.abc import Container, Mapping
from typing import Any, BinaryIO

from ckpt_tui.core.errors import ReadError, ReadStopped, UnwrittenRecord
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.dtypes import DTYPES
from ckpt_tui.core.model.keypath import is_unicode
from ckpt_tui.core.model.tree import RecordSource, Storage
from ckpt_tui.core.pickles.persistent_ids import ZIP_FIELDS, PersistentIds
from ckpt_tui.core.pickles.unpickle import load_pickle
from ckpt_tui.core.readers.zip_archive import (
    DEFLATED,
    LOCAL,
    STORED,
    UNSUPPORTED_FLAGS,
    ZipDirectory,
    ZipEntry,
    crc_matches,
    data_offset,
    inflate_cap,
    multidisk_member,
    open_refusal,
    read_member,
    unwritten,
    unwritten_text,
)

MIN_VERSION, MAX_VERSION = 1, 10
"""File format versions torch 2.13's reader accepts."""


PT2_MARK = "archive_format"
"""The member naming a ``torch.export`` (PT2) archive's format (``pt2``), in its folder."""


class ZipRecords(RecordSource):
    """Storage records inside a zip checkpoint: a storage's record is ``folder + key``."""

    in_place = True
    """Its storages' bytes lie as they are in one range of ``path`` (a writer copies them)."""

    def __init__(self, path: str, entries: ZipDirectory, folder: str, file_bytes: int) -> None:
        self.path = path
        self.version = places.version_at_open(path)
        self.entries = entries
        self.folder = folder
        self.file_bytes = file_bytes
        self._file: BinaryIO | None = None
        self._lock = threading.Lock()
        self._offsets: dict[str, int] = {}
        self._offsets_sought = False
        self.lacking: list[str] = []
        """Keys of the storages the archive's pickles named whose record it lacks."""

    def name(self, key: str) -> str:
        """The member name of a record key."""
        return self.folder + key

    def entry(self, storage: Storage) -> ZipEntry:
        """The central-directory entry of a storage's record, whose bytes are read for its values: every
        reader of a record's bytes (locate, inflate, the writers' spans) comes here first."""
        entry = self.entries.record(self.folder, storage.key)
        if entry is None:
            raise ReadError(f"storage record {self.name(storage.key)} is missing from the archive")
        if unwritten(entry):
            # torch.load's values are whatever the buffer held, never these bytes: no one may show them as values
            raise UnwrittenRecord(unwritten_text(entry))
        return entry

    def unwritten(self, keys: list[str]) -> list[str]:
        """The member names of the records of these keys that torch's reader leaves unwritten
        (:func:`~ckpt_tui.core.readers.zip_archive.unwritten`): their tensors load as uninitialised memory."""
        found = [self.entries.record(self.folder, key) for key in keys]
        return [entry.name for entry in found if entry is not None and unwritten(entry)]

    def has(self, storage: Storage) -> bool:
        """Whether the archive holds the storage's record."""
        return self.entries.record(self.folder, storage.key) is not None

    def missing(self, storages: list[Storage]) -> list[Storage]:
        """The storages whose record the archive lacks (:meth:`has` of each, in one pass)."""
        folder, entries = self.folder, self.entries
        return [s for s in storages if folder + s.key not in entries or not (s.key.isascii() or is_unicode(s.key))]

    def is_compressed(self, storage: Storage) -> bool:
        """Whether the storage's record is compressed (it cannot be read in place: see :meth:`inflate`)."""
        return self.entry(storage).compress != STORED

    def inflate(self, storage: Storage) -> bytes:
        """A compressed record's bytes, inflated within the archive's cap (torch.load reads these too)."""
        entry = self.entry(storage)
        if entry.size < storage.nbytes:
            raise ReadError(
                f"record {entry.name} holds {counted(entry.size, 'byte')}, its storage needs {storage.nbytes}"
            )
        with places.open_stream(self.path) as file:
            self._check(file)
            data = read_member(file, entry, self.file_bytes)
            self._check(file)
            return data

    def _check(self, file: BinaryIO) -> None:
        """Refuse a file changed since it was opened (``FileChanged``): its records are not the tree's."""
        if self.version is not None:
            places.check_unchanged(file.fileno(), self.path, self.version)

    def locate(self, storage: Storage) -> tuple[int, int]:
        """Offset of the record's bytes in the file (from its local header), and its size."""
        entry = self.entry(storage)
        if entry.compress != STORED:
            raise ReadError(f"record {entry.name} is compressed; only stored records can be read in place")
        offset = self._offsets.get(entry.name)
        if offset is None:
            with self._lock:
                if self._file is None:
                    file = places.open_stream(self.path)
                    try:
                        self._check(file)
                    except ReadStopped:
                        file.close()
                        raise
                    self._file = file
                offset = self._offsets[entry.name] = data_offset(self._file, entry)
        if offset + entry.size > self.file_bytes:
            raise ReadError(f"record {entry.name} runs past the end of the file (truncated?)")
        if entry.size < storage.nbytes:
            raise ReadError(
                f"record {entry.name} holds {counted(entry.size, 'byte')}, its storage needs {storage.nbytes}"
            )
        return offset, entry.size

    def zip_members(self) -> ZipRecords:
        """This archive: its entries, folder and size (:class:`~ckpt_tui.core.model.tree.ZipMembers`)."""
        return self

    def batched_members(self) -> ZipRecords | None:
        """This archive: a writer reads runs of its small stored records together."""
        return self

    def stored_spans(self) -> dict[str, tuple[int, int]] | None:
        """:meth:`stored_places` of every record whose local header :meth:`find_offsets` read, by key."""
        self.find_offsets()
        cut = len(self.folder)
        keys = [name[cut:] for name in self._offsets]
        return {key: place for key, place in zip(keys, self._places(keys), strict=True) if place is not None}

    def stored_places(self, keys: list[str]) -> list[tuple[int, int] | None] | None:
        """:meth:`_places` of these keys."""
        return self._places(keys)

    def _places(self, keys: list[str]) -> list[tuple[int, int] | None]:
        """Each record's data offset and size, as :meth:`locate` finds them, when it is stored, its local
        header was read by :meth:`find_offsets` and it ends inside the file; None for any other (the
        caller leaves it to ``locate``, which reads it or refuses it in its words). The caller still
        checks each size against its storage. All at once: no read, no lookup of a header per record."""
        self.find_offsets()
        end, offsets = self.file_bytes, self._offsets
        record, folder = self.entries.record, self.folder
        found = [record(folder, key) for key in keys]
        # offsets are kept by the name of the member torch's lookup finds (a key may differ from it in case)
        return [
            (offset, entry.size)
            if entry is not None
            and (offset := offsets.get(entry.name)) is not None
            and entry.compress == STORED
            and offset + entry.size <= end
            and not unwritten(entry)
            else None
            for entry in found
        ]

    def find_offsets(self) -> None:
        """Read the local headers of every record at once; :meth:`locate` then finds them without
        a read each. Headers that do not parse here are left for :meth:`locate`, which reports them as
        always. Done once.

        The headers are read in windows (one read for headers close together) and their bytes gathered with
        numpy (50,000 small records: no Python per header). Read, not mapped: a file cut short meanwhile is
        a short read (the header is then looked for alone, or refused), never a SIGBUS."""
        if self._offsets_sought:
            return
        self._offsets_sought = True
        wanted = list(filter(operator.methodcaller("startswith", self.folder), self.entries))
        if self._offsets:  # some found one by one already (locate)
            wanted = [name for name in wanted if name not in self._offsets]
        if not wanted:
            return
        heads = [self.entries.listed_as(name).header_offset for name in wanted]
        source = places.source_of(self.path, self.version)
        try:
            if source.local_fd() is None:  # a remote file: the headers are fetched together
                found = _fetched_offsets(source, wanted, heads)
            else:
                found = _windowed_offsets(source, wanted, heads)
                source.confirm()
        except ReadStopped:
            raise
        except (OSError, ValueError, ReadError):
            return  # (a file that changed, or cannot be mapped) locate reads each header, or refuses it
        finally:
            source.close()
        with self._lock:
            self._offsets.update(found)

    def unreadable(self, keys: list[str]) -> str | None:
        """Why torch's zip reader (miniz) fails on the first of these records it cannot read, or None:
        a compression method other than stored or deflate, encryption or patch data, or, for a record
        it reads (not empty, not a directory), a local header that is cut short or not signed, or data
        running past the end of the file. (A deflate stream is not inflated here.)"""
        self.find_offsets()
        record, folder = self.entries.record, self.folder
        # (a missing record is said elsewhere)
        entries = [entry for entry in (record(folder, key) for key in keys) if entry is not None]
        read = [entry for entry in entries if entry.compressed_size and not entry.directory]
        starts = list(map(self._offsets.get, map(_NAME, read)))
        if (
            set(map(_COMPRESS, entries)) <= {STORED, DEFLATED}
            and not any(map(operator.and_, map(_FLAGS, entries), itertools.repeat(UNSUPPORTED_FLAGS)))
            and None not in starts
            and max(map(operator.add, starts, map(_COMPRESSED_SIZE, read)), default=0) <= self.file_bytes
        ):
            return None
        return next(filter(None, map(self._unreadable_record, entries)), None)

    def _unreadable_record(self, entry: ZipEntry) -> str | None:
        """Why torch's zip reader fails on one record, or None."""
        if entry.compress not in (STORED, DEFLATED):
            how = f"compressed with method {entry.compress}"
            return f"record {entry.name} is {how} (torch's zip reader: unsupported method)"
        if entry.flags & UNSUPPORTED_FLAGS:
            return f"record {entry.name} is encrypted or patch data (torch's zip reader: unsupported encryption)"
        if not entry.compressed_size or entry.directory:
            return None  # (read as empty: its local header is not looked at)
        start = self._offsets.get(entry.name)
        if start is None:
            start = self._header_read_alone(entry)  # (the map may have failed: each header, exactly)
        if start is None:
            return f"record {entry.name} has a bad local header (torch's zip reader: invalid header)"
        if start + entry.compressed_size > self.file_bytes:
            return f"record {entry.name} runs past the end of the file (torch's zip reader: invalid header)"
        return None

    def _header_read_alone(self, entry: ZipEntry) -> int | None:
        """Where a record's data starts, from its local header read on its own; None if it is bad."""
        try:
            with places.open_stream(self.path) as file:
                return data_offset(file, entry)
        except (OSError, ReadError):
            return None


_NAME = operator.attrgetter("name")
_COMPRESS = operator.attrgetter("compress")
_COMPRESSED_SIZE = operator.attrgetter("compressed_size")
_FLAGS = operator.attrgetter("flags")
_LOCAL_SIGNATURE = (0x50, 0x4B, 0x03, 0x04)


HEADER_WINDOW = 16 << 20
"""Local headers are read in windows of at most this many bytes (and a gap of :data:`HEADER_GAP` between two
headers starts a new one)."""
HEADER_GAP = 1 << 16


def _windowed_offsets(source: places.ByteSource, names: list[str], heads: list[int]) -> dict[str, int]:
    """:func:`_data_offsets` of headers read in windows: headers close together (within one aligned
    :data:`HEADER_WINDOW`, less than :data:`HEADER_GAP` apart) come with one read."""
    import numpy as np

    at = np.array(heads, np.int64)
    order = np.argsort(at, kind="stable")
    at = at[order]
    breaks = np.flatnonzero((np.diff(at) > HEADER_GAP) | (np.diff(at // HEADER_WINDOW) != 0)) + 1
    chosen = [names[i] for i in order.tolist()]
    found: dict[str, int] = {}
    for first, stop in zip([0, *breaks.tolist()], [*breaks.tolist(), len(at)], strict=True):
        begin = int(at[first])
        data = source.read_at(begin, int(at[stop - 1]) + LOCAL.size - begin)
        found.update(_data_offsets(data, begin, chosen[first:stop], at[first:stop].tolist()))
    return found


def _data_offsets(window: bytes, begin: int, names: list[str], heads: list[int]) -> dict[str, int]:
    """Where each record's data starts, from its local header at ``heads`` (in the file; ``window`` holds its
    bytes from ``begin``): a header cut short by the file's end, or not signed, is left out."""
    import numpy as np

    places = np.array(heads, np.int64)
    whole = places - begin + LOCAL.size <= len(window)
    data = np.frombuffer(window, np.uint8)
    fields = data[places[whole][:, None] - begin + np.arange(LOCAL.size)].astype(np.int64)
    del data
    signed = (fields[:, :4] == _LOCAL_SIGNATURE).all(axis=1)
    name_len = fields[:, 26] | fields[:, 27] << 8
    extra_len = fields[:, 28] | fields[:, 29] << 8
    starts = (places[whole] + LOCAL.size + name_len + extra_len)[signed]
    kept = itertools.compress(itertools.compress(names, whole.tolist()), signed.tolist())
    return dict(zip(kept, starts.tolist(), strict=True))


def _fetched_offsets(source: places.ByteSource, names: list[str], heads: list[int]) -> dict[str, int]:
    """:func:`_data_offsets` of a file that cannot be mapped (a remote one): the headers fetched together."""
    source.prefetch([(head, LOCAL.size) for head in heads])
    found: dict[str, int] = {}
    for name, head in zip(names, heads, strict=True):
        fields = source.read_at(head, LOCAL.size)
        if len(fields) == LOCAL.size and fields[:4] == bytes(_LOCAL_SIGNATURE):
            name_len, extra_len = LOCAL.unpack(fields)[-2:]
            found[name] = head + LOCAL.size + name_len + extra_len
    return found


class NotTorchZip(ReadError):
    """A zip archive that holds no ``data.pkl`` (a wheel, a zip of images): ``torch.load`` fails on it before it
    unpickles anything, so it is no checkpoint."""


class ZipLayout:
    """Where the archive's members are, and what of its layout torch.load would refuse."""

    def __init__(self, path: str, entries: ZipDirectory, file_bytes: int) -> None:
        self.entries = entries
        self.problems: list[str] = []
        self.notes: list[str] = []
        first = next(iter(entries), None)
        if first is None:
            raise NotTorchZip(f"{path}: an empty zip archive, not a torch checkpoint")
        folder, slash, _ = first.partition("/")
        self.prefix = folder + slash
        if not slash:
            self.problems.append(f"its first member {first!r} is not in a folder, which torch.load refuses")
        inside_all = not slash or all_start_with(list(entries), self.prefix)
        outside = [] if inside_all else [name for name in entries if not name.startswith(self.prefix)]
        if outside:
            self.problems.append(
                f"{counted(len(outside), 'member')} {'lies' if len(outside) == 1 else 'lie'} outside the archive "
                f"folder {folder!r} ({outside[0]!r}...): "
                "torch.load refuses a zip holding more than one archive"
            )
        self.hostile: list[str] = []
        collision = entries.collision_text()
        if collision is not None:
            picked = ", ".join(repr(entries.listed_as(group[0].name).name) for group in entries.collisions[:3])
            self.hostile.append(
                f"zip member names collide under torch's comparison (case-insensitive, one name twice): {collision}; "
                f"torch 2.13 reads {picked if entries.resolved else 'one of them'}, other zip readers may read "
                "another: torch.save never writes this"
            )
            self.problems += self.hostile
        if entries.disagreement is not None:
            self.hostile.append(f"{entries.disagreement}: torch.save never writes this")
            self.problems.append(self.hostile[-1])
        # torch decodes each name past the archive folder (the folder's own bytes are never decoded)
        undecodable = _undecodable_name(entries, self.prefix.encode("utf-8", "surrogateescape"))
        if undecodable is not None:
            self.problems.append(
                f"the member name {undecodable!r} is not UTF-8: torch.load fails listing the archive's records"
            )
        multidisk = multidisk_member(entries)
        if multidisk is not None:
            self.problems.append(
                f"its member {multidisk!r} lies on another disk: torch.load refuses multidisk archives"
            )
        refusal = open_refusal(entries, file_bytes)
        if refusal is not None:
            self.problems.append(f"{refusal}: torch.load refuses the whole archive")
        self.problems += unwritten_small_records(entries, self.prefix)
        if self.prefix + "data.pkl" not in entries:
            self.prefix = self._other_data_pkl(path)
        self.data_pkl = self.prefix + "data.pkl"

    def _other_data_pkl(self, path: str) -> str:
        candidates = [n for n in self.entries if n == "data.pkl" or n.endswith("/data.pkl")]
        if not candidates and any(n == PT2_MARK or n.endswith("/" + PT2_MARK) for n in self.entries):
            # torch.export's archive: weights as raw records described by JSON, read by torch.export.load
            raise NotTorchZip(
                f"{path}: a torch.export archive (.pt2), not a torch.save checkpoint: torch.export.load reads it "
                "(its .state_dict holds the weights), and ckpt-tui does not"
            )
        if not candidates:
            raise NotTorchZip(f"{path}: a zip archive, but not a torch checkpoint (no data.pkl inside)")
        chosen = min(candidates, key=lambda n: n.count("/"))
        self.problems.append(f"torch.load looks for {self.prefix}data.pkl, which is missing; shown: {chosen}")
        return chosen[: -len("data.pkl")]

    def member(self, name: str) -> ZipEntry | None:
        """A member of the archive folder by its name inside it."""
        return self.entries.get(self.prefix + name)


SMALL_RECORDS = (".data/version", "byteorder", ".data/serialization_id", ".format_version", ".storage_alignment")
"""The small records torch reads whole when present (``version`` where ``.data/version`` is not)."""


def any_unwritten(entries: ZipDirectory) -> bool:
    """Whether :func:`unwritten` holds of any member (whole-list passes over the columns first: no member
    a directory, none compressed to 0 bytes, and it holds of none)."""
    columns = entries.member_columns()
    if not columns.any_directory and 0 not in columns.compressed_sizes:
        return False
    return any(map(unwritten, entries.members))


def unwritten_small_records(entries: ZipDirectory, prefix: str) -> list[str]:
    """Problems for the small records torch reads that its reader leaves unwritten (data.pkl and storage
    records are said where they are read); in a TorchScript archive, every member (torch.jit.load reads
    its code, pickles and constants)."""
    if not any_unwritten(entries):
        return []
    if entries.listed(prefix + "constants.pkl"):
        # (data.pkl refuses the read, storage records are said per tensor)
        skipped = (prefix + "data.pkl", prefix + "data/")
        found = [entry for entry in entries.members if unwritten(entry) and not entry.name.startswith(skipped)]
    else:
        names = [*SMALL_RECORDS, "version" if prefix + ".data/version" not in entries else ".data/version"]
        found = [entry for entry in map(entries.get, [prefix + name for name in names]) if entry and unwritten(entry)]
    if not found:
        return []
    more = f" (and {len(found) - 1} more members)" if len(found) > 1 else ""
    return [f"{unwritten_text(found[0])}{more}"]


MAX_LISTED_NAME = 511
"""The bytes of a member name miniz copies out (``MZ_ZIP_MAX_ARCHIVE_FILENAME_SIZE`` 512, with its NUL)."""


def listed_name(raw: bytes) -> bytes:
    """A member name as torch's ``get_all_records`` gets it from miniz: up to a NUL, at most 511 bytes."""
    return raw.split(b"\0", 1)[0][:MAX_LISTED_NAME]


def _undecodable_name(entries: ZipDirectory, prefix: bytes) -> str | None:
    """The first member whose name past ``prefix`` torch cannot decode as it lists the records, or None."""
    if not entries.collisions and _ascii_names(list(entries), prefix):
        return None
    raws = [entry.raw for entry in entries.members]
    # the usual archive at C speed: every name in the folder, no NUL, none cut at 511 bytes, and the names
    # joined by NULs (a NUL ends any character cut short) decode, so each name past the folder decodes
    # (the folder's name is whole characters, so a name decodes past it exactly when it decodes whole)
    if (
        _utf8(prefix)
        and all(map(operator.methodcaller("startswith", prefix), raws))
        and max(map(len, raws), default=0) <= MAX_LISTED_NAME
        and b"\0" not in b"".join(raws)
        and _utf8(b"\0".join(raws))
    ):
        return None
    cut = len(prefix)
    return next((e.name for e in entries.members if _not_utf8(listed_name(e.raw)[cut:])), None)


def _ascii_names(names: list[str], prefix: bytes) -> bool:
    """Whether ``names``, one per member, are ASCII (so each is its raw bytes, one byte per character),
    all in the folder ``prefix``, none holding a NUL or cut at 511 bytes: then every one decodes."""
    joined = "\0".join(names)
    return (
        joined.isascii()
        and joined.count("\0") == len(names) - 1
        and all_start_with(names, prefix.decode("latin-1"))
        and max(map(len, names), default=0) <= MAX_LISTED_NAME
    )


def all_start_with(names: list[str], prefix: str) -> bool:
    """Whether every name starts with ``prefix``: where no name holds a NUL, by counting the prefix after
    each NUL of the names joined by NULs (a search at C speed, no call per name)."""
    joined = "\0" + "\0".join(names)
    if "\0" not in prefix and joined.count("\0") == len(names):
        return joined.count("\0" + prefix) == len(names)
    return all(map(operator.methodcaller("startswith", prefix), names))


def _utf8(raw: bytes) -> bool:
    return not _not_utf8(raw)


def _not_utf8(raw: bytes) -> bool:
    """Whether torch fails to decode a member name as it lists it (a name cut inside a character too)."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def member_pickle(file: BinaryIO, layout: ZipLayout, name: str, file_bytes: int) -> bytes:
    """A pickle member's bytes (inflated if compressed); a CRC mismatch becomes a note, as torch ignores it."""
    entry = layout.member(name)
    if entry is None:
        raise ReadError(f"{layout.prefix}{name} is missing")
    if entry.flags & UNSUPPORTED_FLAGS:
        layout.problems.append(f"{entry.name} is marked encrypted or patch data: torch's zip reader cannot read it")
    elif unwritten(entry):
        # torch unpickles whatever that buffer held: the pickle in the file is not what it loads
        raise UnwrittenRecord(unwritten_text(entry))
    data = layout.entries.read_kept(file, entry, file_bytes)
    if not crc_matches(entry, data):
        layout.notes.append(f"{entry.name} fails its CRC check (torch does not check CRCs; the file may be damaged)")
    return data


def load_with_records(
    data: bytes,
    records: ZipRecords,
    key_prefix: str,
    what: str,
    unsafe: set[str],
    *,
    known_classes: Container[str] = frozenset(),
    extra_globals: Mapping[str, Any] | None = None,
    script: bool = False,
) -> tuple[Any, list[str]]:
    """Unpickle one pickle of the archive whose storages live in ``records``; the loader problems found.

    Storage keys become ``key_prefix + key`` (unique across the archive's record folders). ``script``:
    judged as ``torch.jit.load`` judges it (records of any size, any device string as location).
    """
    wrong_sizes: list[str] = []
    unwritten_records: list[ZipEntry] = []
    folder, entries, file_bytes = records.folder + key_prefix, records.entries, records.file_bytes

    def make(key: str, dtype: str, location: str, numel: int, type_name: str) -> Storage:
        # once per storage (50,000 times on big state_dicts): plain lookups only (the dict's own for a name
        # without a NUL: the member of exactly that name is torch's pick for it; else as torch looks it up)
        name = folder + key
        entry = dict.get(entries, name) if "\0" not in name and key.isascii() else None
        if entry is None:
            entry = entries.record(folder, key)
        if entry is None:
            records.lacking.append(key_prefix + key)
        declared = numel * DTYPES[dtype][0]
        limit = file_bytes if entry is None or entry.compress == STORED else inflate_cap(file_bytes)
        if declared > limit:
            raise ReadError(
                f"{what}: storage {key_prefix + key} declares {counted(declared, 'byte')}, more than the whole file"
            )
        if entry is not None and entry.size != declared and not script:
            wrong_sizes.append(f"{entry.name} holds {counted(entry.size, 'byte')} where its storage needs {declared}")
        elif entry is not None and unwritten(entry):
            unwritten_records.append(entry)
        return Storage(key_prefix + key, dtype, location, numel, records, type_name)

    ids = PersistentIds(ZIP_FIELDS, make, script)
    root = load_pickle(data, ids, what, unsafe, known_classes=known_classes, extra_globals=extra_globals)
    problems = ids.problems()
    if wrong_sizes:
        more = f" (and {len(wrong_sizes) - 1} more)" if len(wrong_sizes) > 1 else ""
        problems.append(f"record {wrong_sizes[0]}{more}: torch.load refuses records of the wrong size")
    if unwritten_records:
        more = f" (and {len(unwritten_records) - 1} more records)" if len(unwritten_records) > 1 else ""
        problems.append(f"{unwritten_text(unwritten_records[0])}{more}: its tensors' values are not in the file")
    return root, problems


def zip_byteorder(file: BinaryIO, layout: ZipLayout, file_bytes: int) -> str:
    entry = layout.member("byteorder")
    if entry is None:
        return "little"
    # torch compares the whole record with b"little" and b"big": a longer one is refused, unread here
    raw = layout.entries.read_kept(file, entry, file_bytes, limit=64) if entry.size <= 64 else b""
    if raw in (b"little", b"big"):
        return raw.decode()
    text = raw.decode("ascii", "replace").strip()
    shown = repr(raw[:16]) if entry.size <= 64 else f"{counted(entry.size, 'byte')} long"
    layout.problems.append(f"its byteorder record is {shown}, which torch.load refuses (only 'little' or 'big')")
    return text if text in ("little", "big") else "little"


SMALL_RECORD_KEPT = 4096
"""The usual small records are read once and kept (what is shown and what is judged are the same bytes)."""
SMALL_RECORD_HELD = 64 << 20
"""torch reads its small records whole, whatever their size (``getRecord``): a larger one is read here too
(not kept), up to this many bytes."""


def read_small_record(file: BinaryIO, entries: ZipDirectory, entry: ZipEntry, file_bytes: int) -> bytes:
    """A record torch reads whole (version, alignment...): kept when small, read up to :data:`SMALL_RECORD_HELD`."""
    if entry.size <= SMALL_RECORD_KEPT:
        return entries.read_kept(file, entry, file_bytes, limit=SMALL_RECORD_KEPT)
    return read_member(file, entry, file_bytes, limit=SMALL_RECORD_HELD)


def record_version(raw: bytes) -> int | None:
    """A version record read as torch's reader reads it (``std::stoull``): leading whitespace, an optional
    sign, then the leading digits; a minus sign negates modulo 2**64 (``-18446744073709551613`` is 3)."""
    text = raw.decode("latin-1").lstrip(" \t\n\r\v\f")
    sign = text[:1] if text[:1] in ("+", "-") else ""
    text = text[len(sign) :]
    end = next((i for i, c in enumerate(text) if c not in "0123456789"), len(text))
    if not end:
        return None
    if end > 20:
        # past any unsigned 64-bit number: std::stoull throws out_of_range (never parsed here)
        return 1 << 64
    number = int(text[:end])
    if number >= 1 << 64:
        return 1 << 64  # out_of_range
    return -number % (1 << 64) if sign == "-" else number


def check_version(file: BinaryIO, layout: ZipLayout, file_bytes: int) -> None:
    """torch reads ``.data/version`` (else ``version``) as an unsigned number and accepts 1 to 10."""
    entry = layout.member(".data/version") or layout.member("version")
    if entry is None:
        layout.problems.append("it has no version record, which torch.load requires")
        return
    raw = read_small_record(file, layout.entries, entry, file_bytes)
    version = record_version(raw)
    if version is None:
        layout.problems.append(f"its version record {raw[:16]!r} is not a number, which torch.load refuses")
    elif not MIN_VERSION <= version <= MAX_VERSION:
        layout.problems.append(
            f"its format version {version} is outside {MIN_VERSION}-{MAX_VERSION}, which torch 2.13 refuses"
        )
