"""Write a torch zip checkpoint: stored records aligned to 64 bytes, zip64 where needed.

The layout follows torch's own writer (miniz): an ``FB`` extra field pads each local header
so record data starts on a 64-byte boundary, zip64 extras carry sizes and offsets past 4 GiB,
and a zip64 end record is always written.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import BinaryIO

from ckpt_tui.core.readers.zip_archive import CENTRAL, EOCD, LOCAL, ZIP64_EOCD, ZIP64_LOCATOR

ALIGNMENT = 64
LIMIT = 0xFFFFFFFF
COPY_CHUNK = 64 << 20
SMALL_RECORD = 1 << 20
FLAGS = 0x0800  # names are UTF-8


@dataclass
class WrittenEntry:
    """A member as it went into the archive."""

    name: str
    offset: int
    size: int
    crc: int


def _zip64_extra(size: int | None, offset: int | None) -> bytes:
    values = [v for v in (size, size, offset) if v is not None]
    if not values:
        return b""
    return struct.pack("<2H", 0x0001, 8 * len(values)) + struct.pack(f"<{len(values)}Q", *values)


class ZipWriter:
    """Appends stored members to an open file and finishes with the central directory."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.entries: list[WrittenEntry] = []
        self.position = file.tell()

    def _local_header(self, name: bytes, size: int, crc: int) -> int:
        big = size >= LIMIT or self.position >= LIMIT
        zip64 = _zip64_extra(size if big else None, self.position if self.position >= LIMIT else None)
        base = self.position + LOCAL.size + len(name) + len(zip64) + 4
        pad = (-base) % ALIGNMENT
        extra = zip64 + struct.pack("<2H", 0x4246, pad) + b"Z" * pad
        shown = LIMIT if big else size
        header = LOCAL.pack(
            b"PK\x03\x04", 45 if zip64 else 20, FLAGS, 0, 0, 0x21, crc, shown, shown, len(name), len(extra)
        )
        self.file.write(header + name + extra)
        return self.position + len(header) + len(name) + len(extra)

    def add_bytes(self, name: str, data: bytes) -> None:
        """A small member held in memory."""
        crc = zlib.crc32(data)
        start = self._begin(name, len(data), crc)
        self.file.write(data)
        self._end(name, start, len(data), crc)

    def add_stream(
        self,
        name: str,
        size: int,
        chunks: Iterable[bytes | memoryview],
        crc: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        """A member written from chunks; the CRC is computed unless given, and patched in afterwards."""
        start = self._begin(name, size, crc or 0)
        running, written = 0, 0
        for chunk in chunks:
            self.file.write(chunk)
            if crc is None:
                running = zlib.crc32(chunk, running)
            written += len(chunk)
            if progress is not None:
                progress(len(chunk))
        if written != size:
            raise OSError(f"{name}: wrote {written} bytes, expected {size}")
        if crc is None:
            crc = running
            self.file.seek(start + 14)
            self.file.write(struct.pack("<I", crc))
            self.file.seek(0, os.SEEK_END)
        self._end(name, start, size, crc)

    def add_copy(
        self,
        name: str,
        source: BinaryIO,
        offset: int,
        size: int,
        crc: int,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        """A member copied byte for byte from another file (kernel copy for large ones)."""
        start = self._begin(name, size, crc)
        if size < SMALL_RECORD:
            source.seek(offset)
            data = source.read(size)
            if len(data) != size:
                raise OSError(f"{name}: source ended early")
            self.file.write(data)
            if progress is not None:
                progress(size)
            self._end(name, start, size, crc)
            return
        self.file.flush()
        copied = 0
        while copied < size:
            count = min(COPY_CHUNK, size - copied)
            done = _copy_range(source, self.file, offset + copied, count)
            if done <= 0:
                raise OSError(f"{name}: source ended early")
            copied += done
            if progress is not None:
                progress(done)
        self.file.seek(0, os.SEEK_END)
        self._end(name, start, size, crc)

    def _begin(self, name: str, size: int, crc: int) -> int:
        start = self.position
        data_start = self._local_header(name.encode("utf-8"), size, crc)
        self.position = data_start
        return start

    def _end(self, name: str, start: int, size: int, crc: int) -> None:
        self.entries.append(WrittenEntry(name, start, size, crc))
        self.position += size

    def close(self) -> None:
        """Write the central directory and the (zip64) end records."""
        cd_start = self.position
        for entry in self.entries:
            name = entry.name.encode("utf-8")
            big = entry.size >= LIMIT
            far = entry.offset >= LIMIT
            extra = _zip64_extra(entry.size if big else None, entry.offset if far else None)
            shown = LIMIT if big else entry.size
            record = CENTRAL.pack(
                b"PK\x01\x02",
                45 if extra else 20,
                45 if extra else 20,
                FLAGS,
                0,
                0,
                0x21,
                entry.crc,
                shown,
                shown,
                len(name),
                len(extra),
                0,
                0,
                0,
                0,
                LIMIT if far else entry.offset,
            )
            self.file.write(record + name + extra)
            self.position += len(record) + len(name) + len(extra)
        cd_size = self.position - cd_start
        count = len(self.entries)
        eocd64_at = self.position
        self.file.write(ZIP64_EOCD.pack(b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, cd_size, cd_start))
        self.file.write(ZIP64_LOCATOR.pack(b"PK\x06\x07", 0, eocd64_at, 1))
        self.file.write(
            EOCD.pack(
                b"PK\x05\x06",
                0,
                0,
                min(count, 0xFFFF),
                min(count, 0xFFFF),
                min(cd_size, LIMIT),
                min(cd_start, LIMIT),
                0,
            )
        )


def _copy_range(source: BinaryIO, target: BinaryIO, offset: int, count: int) -> int:
    try:
        return os.copy_file_range(source.fileno(), target.fileno(), count, offset)
    except (AttributeError, OSError):
        source.seek(offset)
        data = source.read(min(count, 16 << 20))
        target.write(data)
        target.flush()
        return len(data)
