"""Write a torch zip checkpoint: stored records aligned to 64 bytes, zip64 where needed.

The layout follows torch's own writer (miniz): an ``FB`` extra field pads each local header
so record data starts on a 64-byte boundary, zip64 extras carry sizes and offsets past 4 GiB,
and a zip64 end record is always written.

Members go through an :class:`~.output.Output`: small ones are gathered and written about a
megabyte at a time (50,000 records would otherwise cost 100,000 write calls), large ones are
copied by the kernel.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ckpt_tui.core.model.byte_source import ByteSource
from ckpt_tui.core.readers.zip_archive import CENTRAL, EOCD, LOCAL, ZIP64_EOCD, ZIP64_LOCATOR
from ckpt_tui.core.writers.output import Output

ALIGNMENT = 64
LIMIT = 0xFFFFFFFF
FLAGS = 0x0800  # names are UTF-8
_PAD = b"Z" * ALIGNMENT
_FB = struct.Struct("<2H")


@dataclass(slots=True)
class WrittenEntry:
    """A member as it went into the archive: where its local header and its data start."""

    name: str
    offset: int
    data_offset: int
    size: int
    crc: int


def _zip64_extra(size: int | None, offset: int | None) -> bytes:
    values = [v for v in (size, size, offset) if v is not None]
    if not values:
        return b""
    return struct.pack("<2H", 0x0001, 8 * len(values)) + struct.pack(f"<{len(values)}Q", *values)


def local_header(position: int, name: bytes, size: int, crc: int) -> bytes:
    """A stored member's local header at ``position``, its extra field padding the data to 64 bytes."""
    if size < LIMIT and position < LIMIT:
        pad = (-(position + LOCAL.size + len(name) + 4)) % ALIGNMENT
        extra = _FB.pack(0x4246, pad) + _PAD[:pad]
        return LOCAL.pack(b"PK\x03\x04", 20, FLAGS, 0, 0, 0x21, crc, size, size, len(name), len(extra)) + name + extra
    big = size >= LIMIT or position >= LIMIT
    zip64 = _zip64_extra(size if big else None, position if position >= LIMIT else None)
    pad = (-(position + LOCAL.size + len(name) + len(zip64) + 4)) % ALIGNMENT
    extra = zip64 + _FB.pack(0x4246, pad) + _PAD[:pad]
    shown = LIMIT if big else size
    return LOCAL.pack(b"PK\x03\x04", 45, FLAGS, 0, 0, 0x21, crc, shown, shown, len(name), len(extra)) + name + extra


_PADDING = [_FB.pack(0x4246, pad) + _PAD[:pad] for pad in range(ALIGNMENT)]
"""The ``FB`` extra field for each pad length (the usual local header's whole extra field)."""


def central_record(name: bytes, offset: int, size: int, crc: int) -> bytes:
    """A stored member's central directory record (zip64 extra where its size or offset needs one)."""
    big, far = size >= LIMIT, offset >= LIMIT
    extra = _zip64_extra(size if big else None, offset if far else None) if big or far else b""
    version = 45 if extra else 20
    shown = LIMIT if big else size
    where = LIMIT if far else offset
    head = CENTRAL.pack(
        b"PK\x01\x02", version, version, FLAGS, 0, 0, 0x21, crc, shown, shown, len(name), len(extra), 0, 0, 0, 0, where
    )
    return head + name + extra


class ZipWriter:
    """Appends stored members to an :class:`Output` and finishes with the central directory.

    Each member's central directory record is made as it is added; :meth:`close` writes them.
    """

    def __init__(self, out: Output) -> None:
        self.out = out
        self.entries: list[WrittenEntry] = []
        self._directory: list[bytes] = []

    def _added(self, name: str, encoded: bytes, start: int, header_size: int, size: int, crc: int) -> None:
        self.entries.append(WrittenEntry(name, start, start + header_size, size, crc))
        self._directory.append(central_record(encoded, start, size, crc))

    def add_bytes(self, name: str, data: bytes | memoryview, crc: int | None = None) -> int:
        """A member held in memory (its CRC computed unless given); returns the CRC."""
        if crc is None:
            crc = zlib.crc32(data)
        out = self.out
        start, size, encoded = out.position, len(data), name.encode("utf-8")
        if size < LIMIT and start < LIMIT:  # local_header's usual case, inline: this runs once per record
            pad = (-(start + LOCAL.size + len(encoded) + 4)) % ALIGNMENT
            header = (
                LOCAL.pack(b"PK\x03\x04", 20, FLAGS, 0, 0, 0x21, crc, size, size, len(encoded), pad + 4)
                + encoded
                + _PADDING[pad]
            )
        else:
            header = local_header(start, encoded, size, crc)
        out.write_pair(header, data)
        self._added(name, encoded, start, len(header), size, crc)
        return crc

    def add_numbered(self, prefix: str, first: int, members: Sequence[tuple[memoryview | bytes, int]]) -> None:
        """Small members held in memory with their CRCs, named ``prefix`` + ``first``, ``first + 1``, ...

        The same layout as :meth:`add_bytes`, with the per-member work inline and written at the cost
        of one call (a checkpoint can hold 50,000 small records).
        """
        out, entries, directory = self.out, self.entries, self._directory
        local, central, padding = LOCAL.pack, CENTRAL.pack, _PADDING
        position = out.position
        pieces: list[bytes | memoryview] = []
        for number, (data, crc) in enumerate(members, first):
            name = prefix + str(number)
            encoded, size = name.encode("utf-8"), len(data)
            if size >= LIMIT or position >= LIMIT:
                header, record = (
                    local_header(position, encoded, size, crc),
                    central_record(encoded, position, size, crc),
                )
            else:
                pad = (-(position + 34 + len(encoded))) % ALIGNMENT  # 30-byte header, 4-byte FB field
                header = (
                    local(b"PK\x03\x04", 20, FLAGS, 0, 0, 0x21, crc, size, size, len(encoded), pad + 4)
                    + encoded
                    + padding[pad]
                )
                record = (
                    central(
                        b"PK\x01\x02", 20, 20, FLAGS, 0, 0, 0x21, crc, size, size, len(encoded), 0, 0, 0, 0, 0, position
                    )
                    + encoded
                )
            pieces += (header, data)
            directory.append(record)
            entries.append(WrittenEntry(name, position, position + len(header), size, crc))
            position += len(header) + size
        out.write_many(pieces, position - out.position)

    def add_stream(self, name: str, size: int, chunks: Iterable[bytes | memoryview]) -> int:
        """A member written from chunks; its CRC is computed and patched into the header. Returns the CRC."""
        out = self.out
        out.flush()
        start, encoded = out.position, name.encode("utf-8")
        placeholder = local_header(start, encoded, size, 0)
        out.file.write(placeholder)  # logged below, once its CRC is in it
        out.position += len(placeholder)
        crc = out.stream(chunks, size)
        out.patch(start, local_header(start, encoded, size, crc))
        self._added(name, encoded, start, len(placeholder), size, crc)
        return crc

    def add_copy(
        self, name: str, source: ByteSource, source_path: str, source_offset: int, size: int, crc: int
    ) -> None:
        """A member copied byte for byte from another file by the kernel; ``crc`` is the source's."""
        out = self.out
        start = out.position
        encoded = name.encode("utf-8")
        header = local_header(start, encoded, size, crc)
        out.write(header)
        out.copy(source, source_path, source_offset, size, crc)
        self._added(name, encoded, start, len(header), size, crc)

    def close(self) -> None:
        """Write the central directory and the (zip64) end records."""
        out = self.out
        cd_start = out.position
        directory = b"".join(self._directory)
        out.write(directory)
        cd_size = len(directory)
        count = len(self.entries)
        eocd64_at = out.position
        out.write(ZIP64_EOCD.pack(b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, cd_size, cd_start))
        out.write(ZIP64_LOCATOR.pack(b"PK\x06\x07", 0, eocd64_at, 1))
        out.write(
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
        out.close()
