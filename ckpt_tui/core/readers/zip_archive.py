"""The zip structures torch checkpoints use: reading the central directory and local headers.

Python's ``zipfile`` builds a ``ZipInfo`` per member, which costs half a second on 70,000
records, and cannot tell where a record's bytes start; this reads just what is needed.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import BinaryIO

from ckpt_tui.core.errors import ReadError

EOCD = struct.Struct("<4s4H2LH")
ZIP64_LOCATOR = struct.Struct("<4sLQL")
ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")
CENTRAL = struct.Struct("<4s6H3L5H2L")
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


class ZipDirectory(dict[str, ZipEntry]):
    """The members by name, in central-directory order, and the names given to more than one member."""

    duplicates: list[str]


def read_central_directory(file: BinaryIO, file_bytes: int) -> ZipDirectory:
    """Every member of the archive by name (zip64 aware); a one-line ReadError if it lies."""
    tail_size = min(file_bytes, 65536 + EOCD.size)
    file.seek(file_bytes - tail_size)
    tail = file.read(tail_size)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < EOCD.size:
        raise ReadError("no zip end-of-central-directory record (file truncated?)")
    _, _, _, _, count, cd_size, cd_offset, _ = EOCD.unpack_from(tail, at)
    if count == 0xFFFF or cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF:
        count, cd_size, cd_offset = _zip64_end(file, file_bytes - tail_size + at)
    if cd_offset + cd_size > file_bytes:
        raise ReadError("zip central directory points outside the file (truncated or corrupt)")
    if count > MAX_ENTRIES or count * CENTRAL.size > cd_size:
        raise ReadError(f"zip central directory claims {count} entries (corrupt, or more than {MAX_ENTRIES})")
    file.seek(cd_offset)
    directory = file.read(cd_size)
    return _entries(directory, count, file_bytes)


def _zip64_end(file: BinaryIO, eocd_at: int) -> tuple[int, int, int]:
    file.seek(eocd_at - ZIP64_LOCATOR.size)
    locator = file.read(ZIP64_LOCATOR.size)
    if len(locator) < ZIP64_LOCATOR.size or locator[:4] != b"PK\x06\x07":
        raise ReadError("zip64 locator missing (corrupt zip)")
    file.seek(ZIP64_LOCATOR.unpack(locator)[2])
    record = file.read(ZIP64_EOCD.size)
    if len(record) < ZIP64_EOCD.size or record[:4] != b"PK\x06\x06":
        raise ReadError("zip64 end record missing (corrupt zip)")
    fields = ZIP64_EOCD.unpack(record)
    return fields[7], fields[8], fields[9]


def _entries(directory: bytes, count: int, file_bytes: int) -> ZipDirectory:
    entries = ZipDirectory()
    entries.duplicates = []
    pos = 0
    unpack, fixed, length = CENTRAL.unpack_from, CENTRAL.size, len(directory)
    for _ in range(count):  # once per member (70,000 on big state_dicts): locals and plain slices only
        if pos + fixed > length:
            raise ReadError("zip central directory is cut short or corrupt")
        fields = unpack(directory, pos)
        (signature, _, _, flags, compress, _, _, crc, csize, size, name_len, extra_len, comment_len) = fields[:13]
        disk, external, offset = fields[13], fields[15], fields[16]
        if signature != b"PK\x01\x02":
            raise ReadError("zip central directory is cut short or corrupt")
        start = pos + fixed
        if csize == 0xFFFFFFFF or size == 0xFFFFFFFF or offset == 0xFFFFFFFF:
            extra = directory[start + name_len : start + name_len + extra_len]
            size, csize, offset = _zip64_extra(extra, size, csize, offset)
        name = directory[start : start + name_len].decode("utf-8" if flags & 0x800 else "cp437", "replace")
        if offset >= file_bytes:
            raise ReadError(f"zip member {name} starts past the end of the file")
        if name in entries:  # torch's reader (miniz) finds the first: the one kept
            entries.duplicates.append(name)
        else:
            folder = name.endswith("/") or bool(external & DOS_DIRECTORY)
            entries[name] = ZipEntry(name, offset, compress, csize, size, crc, flags, folder, disk)
        pos = start + name_len + extra_len + comment_len
    return entries


def multidisk_member(entries: Mapping[str, ZipEntry]) -> str | None:
    """A member starting on a disk other than the first (or the one miniz takes for it): torch's zip
    reader refuses the whole archive as multidisk when it opens it."""
    return next((entry.name for entry in entries.values() if entry.disk not in (0, 1)), None)


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
        raise ReadError(f"zip member {entry.name} is too large ({entry.size} bytes)")
    if entry.compress == DEFLATED:
        cap = inflate_cap(file_bytes)
        if entry.size > cap:
            raise ReadError(f"zip member {entry.name} would inflate to {entry.size} bytes, past {cap} for this file")
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
        raise ReadError(f"zip member {entry.name}: holds {len(raw)} bytes, not the {entry.size} its entry says")
    return raw


def crc_matches(entry: ZipEntry, data: bytes) -> bool:
    """Whether a member's bytes match the CRC-32 its central entry records."""
    return zlib.crc32(data) == entry.crc
