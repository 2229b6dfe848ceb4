"""The zip structures torch checkpoints use: reading the central directory and local headers.

Python's ``zipfile`` builds a ``ZipInfo`` per member, which costs half a second on 70,000
records, and cannot tell where a record's bytes start; this reads just what is needed.

Members are found as torch finds them (:meth:`ZipDirectory.locate`, the one lookup every reader
uses): torch's ``PyTorchStreamReader`` asks miniz's ``mz_zip_reader_locate_file(name, flags=0)``,
which compares names byte by byte with ASCII letters lowered (``mz_zip_filename_compare``) in a
binary search over the central directory heap-sorted by that comparison
(``mz_zip_reader_sort_central_dir_offsets_by_filename``). Two members whose names compare equal
(``data.pkl`` and ``DATA.PKL``, or one name twice) *collide*: which one torch reads depends on the
heap sort and the search, emulated here step by step. ``torch.save`` never writes a collision.
"""

from __future__ import annotations

import dataclasses
import operator
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.keypath import is_unicode

EOCD = struct.Struct("<4s4H2LH")
ZIP64_LOCATOR = struct.Struct("<4sLQL")
ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")
CENTRAL = struct.Struct("<4s6H3L5H2L")
_CENTRAL_READ = struct.Struct("<4s4x2H4x3L4H2x2L")
""":data:`CENTRAL` with only what is read: versions, time, date and internal attributes skipped (fewer ints made
per member)."""
LOCAL = struct.Struct("<4s5H3L2H")
STORED, DEFLATED = 0, 8
DOS_DIRECTORY = 0x10
UNSUPPORTED_FLAGS = 0x1 | 0x20 | 0x40
"""Encrypted, compressed patch data, strong encryption: general-purpose flags miniz refuses to read."""
MAX_ENTRIES = 1_000_000
INFLATE_FLOOR = 64 << 20
INFLATE_RATIO = 16
"""A compressed member may inflate to 64 MiB or 16x the file's size, whichever is more; never further."""


@dataclass(slots=True)
class ZipEntry:
    """One member as the central directory describes it."""

    name: str
    header_offset: int
    compress: int
    compressed_size: int
    size: int
    crc: int
    flags: int = 0
    """The general-purpose bit flags (encryption, patch data...)."""
    directory: bool = False
    """Named with a trailing ``/`` or marked with the DOS directory attribute: what miniz calls a directory."""
    disk: int = 0
    """The disk its local header starts on."""
    raw: bytes = b""
    """The name's bytes, as torch's reader compares them."""
    index: int = 0
    """Its place in the central directory (miniz's file index)."""


class ZipDirectory(dict[str, ZipEntry]):
    """The members by name (names decoded as UTF-8, undecodable bytes kept as surrogates), in
    central-directory order; ``get``, ``in`` and ``[]`` find a member as torch's zip reader finds it.

    Each name maps to the member torch's reader finds for it; :attr:`members` holds every member, and
    :attr:`collisions` the groups of members whose names torch's comparison cannot tell apart.
    """

    members: list[ZipEntry]
    """Every member in central-directory order (miniz's file index), twins included."""
    collisions: list[list[ZipEntry]]
    """Groups of two or more members whose names compare equal under torch's comparison."""
    found: dict[bytes, ZipEntry]
    """A name with ASCII letters lowered -> the member torch's lookup finds."""
    this_disk: int = 0
    """The disk the end record says this is: members must start on it or on disk 1 (miniz's rule)."""
    disagreement: str | None = None
    """How the zip's structure reads differently to other zip readers than to torch's (two end records)."""
    resolved: bool = True
    """False where collisions were left unresolved (:data:`MAX_COLLIDING`): ``found`` then holds the first."""
    columns: MemberColumns | None = None
    """:attr:`members`' fields as read (None: :meth:`member_columns` gathers them from the members)."""

    def member_columns(self) -> MemberColumns:
        """Every member's fields as lists, in :attr:`members`' order."""
        if self.columns is None:
            self.columns = MemberColumns.of(self.members)
        return self.columns

    def locate(self, name: str) -> ZipEntry | None:
        """The member ``torch``'s reader returns for ``name`` (None: torch says "file not found")."""
        try:
            raw = name.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return None  # torch cannot even pass such a name to its reader
        return self.found.get(fold(raw))

    def record(self, folder: str, key: str) -> ZipEntry | None:
        """The member torch's reader returns for a storage key a pickle names (None: torch finds none).

        ``folder`` is the start of a member name as listed (a byte that is not UTF-8 kept as a surrogate);
        ``key`` is a str of the pickle, which torch passes to its reader encoded as strict UTF-8: a key
        holding a lone surrogate cannot be passed ("incompatible function arguments"), so it finds no
        member, even where its surrogates would spell a listed name's bytes.
        """
        if not key.isascii() and not is_unicode(key):
            return None
        return self.get(folder + key)

    def listed_as(self, name: str) -> ZipEntry:
        """The member listed under exactly ``name`` (one of :meth:`keys`; torch's pick among twins), NUL and
        all: for names taken from the listing itself, never looked up as torch looks them up."""
        return dict.__getitem__(self, name)

    def _exact(self, name: str) -> ZipEntry | None:
        """The usual case at dict speed: a member of exactly this name maps to torch's pick for it (a NUL
        in the name is the exception: torch's lookup stops there)."""
        found = dict.get(self, name)
        return found if found is not None and "\0" not in name else None

    def get(self, name: str, default: ZipEntry | None = None) -> ZipEntry | None:  # type: ignore[override]
        found = self._exact(name) or self.locate(name)
        return default if found is None else found

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (self._exact(name) or self.locate(name)) is not None

    def __getitem__(self, name: str) -> ZipEntry:
        found = self._exact(name) or self.locate(name)
        if found is None:
            raise KeyError(name)
        return found

    def candidates(self, name: str) -> list[ZipEntry]:
        """Every member torch's comparison takes for ``name`` (more than one: a collision)."""
        found = self.locate(name)
        if found is None:
            return []
        key = found.raw.lower()
        return next((group for group in self.collisions if group[0].raw.lower() == key), [found])

    def listed(self, name: str) -> bool:
        """Whether torch's ``get_all_records()`` lists ``name`` (a full member name): compared exactly, as
        Python compares the list's strings, each name cut at a NUL as the C string it passes through."""
        if dict.__contains__(self, name):
            return True
        if "\0" not in "".join(self):  # (no name holds a NUL, as torch.save writes them: one search of them all)
            return False
        return any(entry.name.split("\0", 1)[0] == name for entry in self.members if "\0" in entry.name)

    def shifted(self, by: int) -> ZipDirectory:
        """The same directory with every local header ``by`` bytes further (an archive inside a file)."""
        moved = {id(e): dataclasses.replace(e, header_offset=e.header_offset + by) for e in self.members}
        copy = ZipDirectory((name, moved[id(entry)]) for name, entry in self.items())
        copy.members = [moved[id(entry)] for entry in self.members]
        copy.collisions = [[moved[id(entry)] for entry in group] for group in self.collisions]
        copy.found = {key: moved[id(entry)] for key, entry in self.found.items()}
        copy.resolved = self.resolved
        copy.this_disk, copy.disagreement = self.this_disk, self.disagreement
        return copy

    def read_kept(self, file: BinaryIO, entry: ZipEntry, file_bytes: int, limit: int = 1 << 32) -> bytes:
        """:func:`read_member`, read from the file once: the same member asked for again (the weights_only
        verdict after the tree reader) gets the very bytes read the first time, so what is shown and what
        is judged cannot differ, even if the file changes in between. Only members asked for here are kept
        (pickles and small records, never tensor data)."""
        kept: dict[int, bytes] = self.__dict__.setdefault("kept", {})
        # entries of another directory (a shifted copy) are read as they are, never mixed up by index
        ours = entry.index < len(self.members) and self.members[entry.index] is entry
        raw = kept.get(entry.index) if ours else None
        if raw is None:
            raw = read_member(file, entry, file_bytes, limit)
            if ours:
                kept[entry.index] = raw
        elif entry.size > limit:
            raise ReadError(f"zip member {entry.name} is too large ({counted(entry.size, 'byte')})")
        return raw

    def was_read(self, entry: ZipEntry) -> bool:
        """Whether :meth:`read_kept` holds this member's bytes."""
        kept: dict[int, bytes] = self.__dict__.get("kept", {})
        return entry.index in kept and entry.index < len(self.members) and self.members[entry.index] is entry

    def collision_text(self) -> str | None:
        """``'a/data.pkl' and 'a/DATA.PKL'`` for the first collision (None without any)."""
        if not self.collisions:
            return None
        group = self.collisions[0]
        names = " and ".join(repr(entry.name) for entry in group[:3]) + (" …" if len(group) > 3 else "")
        more = f" (and {len(self.collisions) - 1} more collisions)" if len(self.collisions) > 1 else ""
        unknown = "" if self.resolved else " (too many members to tell which one torch reads)"
        return names + more + unknown


def fold(raw: bytes) -> bytes:
    """A name as miniz compares it: up to a NUL (torch passes a C string), ASCII letters lowered."""
    end = raw.find(0)
    return (raw if end < 0 else raw[:end]).lower()


def heap_order(keys: list[bytes]) -> list[int]:
    """miniz's ``mz_zip_reader_sort_central_dir_offsets_by_filename``, step by step: the file indices in
    the order of its (unstable) heap sort, which decides where equal names land."""
    size = len(keys)
    order = list(range(size))
    if size <= 1:
        return order

    def sift(root: int, end: int) -> None:
        while True:
            child = 2 * root + 1
            if child >= end:
                return
            if child + 1 < end and keys[order[child]] < keys[order[child + 1]]:
                child += 1
            if not keys[order[root]] < keys[order[child]]:
                return
            order[root], order[child] = order[child], order[root]
            root = child

    for start in range((size - 2) >> 1, -1, -1):
        sift(start, size)
    for end in range(size - 1, 0, -1):
        order[end], order[0] = order[0], order[end]
        sift(0, end)
    return order


def binary_search(order: list[int], keys: list[bytes], target: bytes) -> int | None:
    """miniz's ``mz_zip_locate_file_binary_search``: the file index it stops at, or None."""
    low, high = 0, len(order) - 1
    while low <= high:
        middle = low + ((high - low) >> 1)
        index = order[middle]
        key = keys[index]
        if key == target:
            return index
        if key < target:
            low = middle + 1
        else:
            high = middle - 1
    return None


MAX_COLLIDING = 1 << 17
"""Past this many members (3 s of heap sort in Python), a collision is not resolved: the first member is
shown and the collision says torch's pick is unknown (the file is flagged as hostile either way)."""


_RAW = operator.attrgetter("raw")
_NAME = operator.attrgetter("name")


def _resolve(members: list[ZipEntry]) -> tuple[dict[bytes, ZipEntry], list[list[ZipEntry]], bool]:
    """Which member torch finds for each folded name, the collisions, and whether they were resolved."""
    # the central directory's names are compared whole (a NUL in one is a byte like any other)
    keys = list(map(bytes.lower, map(_RAW, members)))
    found = dict(zip(keys, members, strict=True))
    if len(found) == len(members):
        return found, [], True  # every name distinct: the sorted order is unique, and so is each search's answer
    found = {}
    groups: dict[bytes, list[ZipEntry]] = {}
    for key, entry in zip(keys, members, strict=True):
        if key in found:
            groups.setdefault(key, [found[key]]).append(entry)
        else:
            found[key] = entry
    if len(members) > MAX_COLLIDING:
        return found, list(groups.values()), False
    order = heap_order(keys)
    for key in groups:
        index = binary_search(order, keys, key)
        if index is not None:
            found[key] = members[index]
    return found, list(groups.values()), True


def read_central_directory(file: BinaryIO, file_bytes: int) -> ZipDirectory:
    """Every member of the archive by name (zip64 aware); a one-line ReadError if it lies."""
    tail_size = min(file_bytes, 65536 + EOCD.size)
    file.seek(file_bytes - tail_size)
    tail = file.read(tail_size)
    # miniz takes the last signature with a whole record's room after it (a later, shorter one is skipped)
    at = tail.rfind(b"PK\x05\x06", 0, len(tail) - EOCD.size + 4)
    if at < 0:
        raise ReadError("no zip end-of-central-directory record (file truncated?)")
    eocd_at = file_bytes - tail_size + at
    _, this_disk, cd_disk, on_disk, count, cd_size, cd_offset, _ = EOCD.unpack_from(tail, at)
    zip64 = _zip64_end(file, eocd_at, file_bytes)
    disagree = None
    if zip64 is not None:  # miniz reads the zip64 record whenever one is there, whatever the 32-bit one says
        saturated = count == 0xFFFF or cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF
        if not saturated and (count, cd_size, cd_offset) != zip64[3:]:
            disagree = (
                "the zip's two end records name different central directories: torch reads the zip64 one, "
                "zip readers that take the 32-bit one read other members"
            )
        this_disk, cd_disk, on_disk, count, cd_size, cd_offset = zip64
    elif count == 0xFFFF or cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF:
        raise ReadError("zip64 end record missing (corrupt zip)")
    if count != on_disk or ((this_disk | cd_disk) and (this_disk, cd_disk) != (1, 1)):
        raise ReadError("the zip's end record spans several disks (torch's zip reader: unsupported multidisk)")
    if cd_offset + cd_size > file_bytes:
        raise ReadError("zip central directory points outside the file (truncated or corrupt)")
    if count > MAX_ENTRIES or count * CENTRAL.size > cd_size:
        raise ReadError(f"zip central directory claims {counted(count, 'entry')} (corrupt, or more than {MAX_ENTRIES})")
    file.seek(cd_offset)
    directory = file.read(cd_size)
    entries = _entries(directory, count, file_bytes)
    entries.this_disk, entries.disagreement = this_disk, disagree
    return entries


def _zip64_end(file: BinaryIO, eocd_at: int, file_bytes: int) -> tuple[int, int, int, int, int, int] | None:
    """The zip64 end record's disks, entry counts, central directory size and offset, as miniz reads them
    (``mz_zip_reader_read_central_dir``): None where no locator and record are signed before the end record."""
    if eocd_at < ZIP64_LOCATOR.size + ZIP64_EOCD.size:
        return None
    file.seek(eocd_at - ZIP64_LOCATOR.size)
    locator = file.read(ZIP64_LOCATOR.size)
    if len(locator) < ZIP64_LOCATOR.size or locator[:4] != b"PK\x06\x07":
        return None
    _, _, record_at, disks = ZIP64_LOCATOR.unpack(locator)
    if record_at > file_bytes - ZIP64_EOCD.size:
        raise ReadError("the zip64 end record lies past the end of the file (torch's zip reader: not an archive)")
    file.seek(record_at)
    record = file.read(ZIP64_EOCD.size)
    if len(record) < ZIP64_EOCD.size or record[:4] != b"PK\x06\x06":
        return None
    _, record_size, _, _, this_disk, cd_disk, on_disk, count, cd_size, cd_offset = ZIP64_EOCD.unpack(record)
    if record_size < ZIP64_EOCD.size - 12:
        raise ReadError("the zip64 end record is too short (corrupt zip)")
    if disks != 1:
        raise ReadError("the zip64 locator counts several disks (torch's zip reader: unsupported multidisk)")
    if max(count, on_disk, cd_size) > 0xFFFFFFFF:
        raise ReadError("the zip64 end record claims more entries or bytes than torch's zip reader takes")
    return this_disk, cd_disk, on_disk, count, cd_size, cd_offset


def _entries(directory: bytes, count: int, file_bytes: int) -> ZipDirectory:
    members: list[ZipEntry] = []
    rows: list[tuple[Any, ...]] = []
    zip64 = folders = False
    pos = 0
    unpack, fixed, length = _CENTRAL_READ.unpack_from, _CENTRAL_READ.size, len(directory)
    for index in range(count):  # once per member (70,000 on big state_dicts): locals and plain slices only
        if pos + fixed > length:
            raise ReadError("zip central directory is cut short or corrupt")
        row = unpack(directory, pos)
        (signature, flags, compress, crc, csize, size, name_len, extra_len, comment_len, disk, external, offset) = row
        if signature != b"PK\x01\x02":
            raise ReadError("zip central directory is cut short or corrupt")
        start = pos + fixed
        if csize == 0xFFFFFFFF or size == 0xFFFFFFFF or offset == 0xFFFFFFFF:
            extra = directory[start + name_len : start + name_len + extra_len]
            size, csize, offset = _zip64_extra(extra, size, csize, offset)
            zip64 = True
        raw = directory[start : start + name_len]
        # torch compares bytes and names records in UTF-8, whatever the flag 0x800 says: decoded losslessly
        name = raw.decode("utf-8", "surrogateescape")
        if offset >= file_bytes:
            raise ReadError(f"zip member {name!r} starts past the end of the file")
        folder = name.endswith("/") or bool(external & DOS_DIRECTORY)
        if folder:
            folders = True
        members.append(ZipEntry(name, offset, compress, csize, size, crc, flags, folder, disk, raw, index))
        rows.append(row)
        pos = start + name_len + extra_len + comment_len
    # (a zip64 member's sizes and offset are in its extra field, not in its row: gathered from the members)
    return _directory(members, None if zip64 else _row_columns(rows, folders))


@dataclass(slots=True)
class MemberColumns:
    """Every member's numeric fields as lists in central-directory order, for the checks made over all
    members in whole-list passes (the lists of one central directory's rows cost less to gather than a
    pass over the members' objects each)."""

    offsets: list[int]
    compress: list[int]
    compressed_sizes: list[int]
    sizes: list[int]
    flags: list[int]
    disks: list[int]
    any_directory: bool
    """Whether any member is a directory to miniz (:attr:`ZipEntry.directory`)."""

    @classmethod
    def of(cls, members: list[ZipEntry]) -> MemberColumns:
        """The columns of any members."""

        def column(field: str) -> list[int]:
            return list(map(operator.attrgetter(field), members))

        return cls(
            column("header_offset"),
            column("compress"),
            column("compressed_size"),
            column("size"),
            column("flags"),
            column("disk"),
            any(map(_DIRECTORY, members)),
        )


_DIRECTORY = operator.attrgetter("directory")


def _row_columns(rows: list[tuple[Any, ...]], folders: bool) -> MemberColumns:
    """The columns of the members read from these central-directory rows (none of them zip64), ``folders``
    telling whether any is a directory."""
    if not rows:
        return MemberColumns([], [], [], [], [], [], folders)
    (_, flags, compress, _, csizes, sizes, _, _, _, disks, _, offsets) = map(list, zip(*rows, strict=True))
    return MemberColumns(offsets, compress, csizes, sizes, flags, disks, folders)


def _directory(members: list[ZipEntry], columns: MemberColumns | None = None) -> ZipDirectory:
    """The directory of these members: each name mapped to the member torch's lookup finds for it."""
    entries = ZipDirectory()
    entries.members = members
    entries.columns = columns
    entries.found, entries.collisions, entries.resolved = _resolve(members)
    if not entries.collisions:  # (names decode one to one: each is its own member)
        dict.update(entries, zip(map(_NAME, members), members, strict=True))
        return entries
    for entry in members:
        dict.__setitem__(entries, entry.name, entries.found.get(entry.raw.lower(), entry))
    return entries


def unwritten(entry: ZipEntry) -> bool:
    """Whether torch's zip reader "reads" this member without writing a byte of it into the buffer it
    allocated for the member's size: miniz's ``mz_zip_reader_extract_to_mem_no_alloc`` returns success at
    once for a directory (a name ending ``/`` or the DOS directory attribute, ``mz_zip_reader_is_file_a_directory``)
    and for a compressed size of 0, before it looks at the method, the flags or the local header. torch then
    uses that buffer as it is: uninitialised memory, different at each load (an empty member is fine)."""
    return entry.size > 0 and (entry.directory or not entry.compressed_size)


def unwritten_text(entry: ZipEntry) -> str:
    """Why :func:`unwritten` holds of a member, in a user's words."""
    if entry.directory:
        why = "trailing '/'" if entry.name.endswith("/") else "DOS directory attribute"
        what = f"a directory to torch's zip reader ({why})"
    else:
        what = "compressed to 0 bytes"
    return (
        f"zip member {entry.name!r} is {what}: torch.load writes none of its {counted(entry.size, 'byte')} and uses "
        "uninitialised memory instead, different at each load"
    )


def multidisk_member(entries: Mapping[str, ZipEntry]) -> str | None:
    """A member starting on a disk other than the first (or the one miniz takes for it): torch's zip
    reader refuses the whole archive as multidisk when it opens it."""
    every = entries.members if isinstance(entries, ZipDirectory) else list(entries.values())
    allowed = (entries.this_disk if isinstance(entries, ZipDirectory) else 0, 1)
    if isinstance(entries, ZipDirectory) and set(entries.member_columns().disks) <= set(allowed):
        return None
    return next((entry.name for entry in every if entry.disk not in allowed), None)


LOCAL_DIR_MASKED = 0x2000
"""The general-purpose flag of an encrypted central directory: miniz refuses the whole archive."""


def open_refusal(entries: ZipDirectory, file_bytes: int) -> str | None:
    """Why torch's zip reader refuses the archive as it opens it, whatever members are read: the checks
    ``mz_zip_reader_read_central_dir`` makes of every member (twins and unread members included)."""
    if _plainly_stored(entries.member_columns(), file_bytes):
        return None
    for entry in entries.members:
        if entry.compressed_size < 0xFFFFFFFF and entry.size < 0xFFFFFFFF:
            stored_mismatch = entry.compress == STORED and entry.size != entry.compressed_size
            if stored_mismatch or (entry.size and not entry.compressed_size):
                return f"zip member {entry.name!r}: sizes that cannot be (torch's zip reader: invalid header)"
            if entry.header_offset + LOCAL.size + entry.compressed_size > file_bytes:
                return f"zip member {entry.name!r} runs past the end of the file (torch's zip reader: invalid header)"
        if entry.flags & LOCAL_DIR_MASKED:
            return f"zip member {entry.name!r} has a masked local header (torch's zip reader: unsupported encryption)"
    return None


def _plainly_stored(columns: MemberColumns, file_bytes: int) -> bool:
    """Whether every member is what torch.save writes (stored, equal sizes under 4 GiB, inside the file, no
    masked header), checked in whole-list passes: then :func:`open_refusal` finds nothing, member by member."""
    sizes = columns.sizes
    return (
        not any(columns.compress)  # STORED is 0
        and sizes == columns.compressed_sizes
        and max(sizes, default=0) < 0xFFFFFFFF
        and max(map(operator.add, columns.offsets, sizes), default=0) + LOCAL.size <= file_bytes
        and not any(map(LOCAL_DIR_MASKED.__and__, columns.flags))
    )


def _zip64_extra(extra: bytes, size: int, csize: int, offset: int) -> tuple[int, int, int]:
    """The 64-bit values of the fields the central entry marks 0xFFFFFFFF (zip64 extra field, tag 1)."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<2H", extra, pos)
        body = extra[pos + 4 : pos + 4 + length]
        if tag == 0x0001:
            wanted = [size == 0xFFFFFFFF, csize == 0xFFFFFFFF, offset == 0xFFFFFFFF]
            if len(body) < 8 * sum(wanted) or len(body) != length:
                raise ReadError("a member's zip64 extra field is shorter than the sizes it must hold (corrupt zip)")
            values = iter(struct.unpack_from(f"<{sum(wanted)}Q", body))
            return (
                next(values) if wanted[0] else size,
                next(values) if wanted[1] else csize,
                next(values) if wanted[2] else offset,
            )
        pos += 4 + length
    raise ReadError("zip64 sizes missing from a member's extra field (corrupt zip)")


def data_offset(file: BinaryIO, entry: ZipEntry) -> int:
    """Where a member's bytes start: after its local header, name and (alignment) extra field."""
    file.seek(entry.header_offset)
    header = file.read(LOCAL.size)
    if len(header) < LOCAL.size or header[:4] != b"PK\x03\x04":
        raise ReadError(f"zip member {entry.name}: bad local header (corrupt zip)")
    name_len, extra_len = LOCAL.unpack(header)[-2:]
    return entry.header_offset + LOCAL.size + name_len + extra_len


def inflate_cap(file_bytes: int) -> int:
    """How far a compressed member may inflate in a file of this size."""
    return max(INFLATE_FLOOR, INFLATE_RATIO * file_bytes)


def read_member(file: BinaryIO, entry: ZipEntry, file_bytes: int, limit: int = 1 << 32) -> bytes:
    """A whole member's bytes (stored, or deflated within :func:`inflate_cap`); CRCs are not checked here.

    torch's reader does not check CRCs (files saved with ``skip_data`` have wrong ones): callers that
    care compare :func:`crc_matches`.
    """
    start = data_offset(file, entry)
    if start + entry.compressed_size > file_bytes:
        raise ReadError(f"zip member {entry.name} runs past the end of the file (truncated?)")
    if entry.size > limit:
        raise ReadError(f"zip member {entry.name} is too large ({counted(entry.size, 'byte')})")
    if entry.compress == DEFLATED:
        cap = inflate_cap(file_bytes)
        if entry.size > cap:
            raise ReadError(
                f"zip member {entry.name} would inflate to {counted(entry.size, 'byte')}, past {cap} for this file"
            )
        file.seek(start)
        try:
            raw = zlib.decompressobj(-15).decompress(file.read(entry.compressed_size), entry.size + 1)
        except zlib.error as exc:
            raise ReadError(f"zip member {entry.name}: bad deflate data ({exc})") from None
    elif entry.compress == STORED:
        if entry.compressed_size != entry.size:
            raise ReadError(f"zip member {entry.name}: stored with two different sizes (corrupt zip)")
        file.seek(start)
        raw = file.read(entry.size)
    else:
        raise ReadError(f"zip member {entry.name}: unsupported compression method {entry.compress}")
    if len(raw) != entry.size:
        raise ReadError(
            f"zip member {entry.name}: holds {counted(len(raw), 'byte')}, not the {entry.size} its entry says"
        )
    return raw


INFLATE_CHUNK = 8 << 20
"""Bytes of a deflated member read (and inflated, then dropped) at a time when only its length is checked."""


def inflates_whole(file: BinaryIO, entry: ZipEntry, file_bytes: int) -> bool:
    """Whether a deflated member's data inflates to exactly the size its entry says (miniz's extraction fails
    otherwise, and torch goes on with the buffer it allocated: uninitialised memory, or refuses a size that
    differs). Streamed: the inflated bytes are counted, never kept."""
    return inflated_size(file, entry, file_bytes) == (entry.size, True)


def inflated_size(file: BinaryIO, entry: ZipEntry, file_bytes: int) -> tuple[int, bool] | None:
    """How many bytes a deflated member's data inflates to (counted up to one past its entry's size) and whether
    its stream ended; None where the data is no deflate stream (zlib fails) or runs past the file."""
    start = data_offset(file, entry)
    if start + entry.compressed_size > file_bytes:
        return None
    inflater = zlib.decompressobj(-15)
    file.seek(start)
    left, made = entry.compressed_size, 0
    try:
        while left and made <= entry.size:
            chunk = file.read(min(INFLATE_CHUNK, left))
            if not chunk:
                return None
            left -= len(chunk)
            made += len(inflater.decompress(chunk, entry.size + 1 - made))
            # (what max_length held back is inflated now, a chunk at a time)
            while inflater.unconsumed_tail and made <= entry.size:
                made += len(inflater.decompress(inflater.unconsumed_tail, INFLATE_CHUNK))
        made += len(inflater.flush())
    except zlib.error:
        return None
    return made, inflater.eof


def crc_matches(entry: ZipEntry, data: bytes) -> bool:
    """Whether a member's bytes match the CRC-32 its central entry records."""
    return zlib.crc32(data) == entry.crc
