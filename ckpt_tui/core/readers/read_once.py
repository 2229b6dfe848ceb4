"""What a reader read of a file, kept for the weights_only verdict: one read from the file for both.

A zip checkpoint's pickle is kept by its central directory (:meth:`ZipDirectory.read_kept`); a legacy
file or plain pickle is read from its start through :class:`ReadOnce`, which keeps every byte it read
(:class:`PickleBytes`). :func:`when_pickle_read` lets a caller start work on those bytes (the verdict in
a forked child) as soon as the reader has them, even when the reader then refuses the file.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from ckpt_tui.core.model import byte_source as places

CHUNK = 1 << 16
"""Bytes read from the file at a time (what the unpickler reads ahead; a remote file fetches no more)."""


@dataclass
class PickleBytes:
    """The start of a file as its reader read it: its pickles (and what was read ahead past them), and
    the 8-byte element counts it read further on, by position."""

    path: str
    file_bytes: int
    """The file's size when it was read."""
    data: bytes | bytearray = b""
    """Every byte read from the start of the file (bytes once the reader is done)."""
    counts: dict[int, bytes] = field(default_factory=dict)

    def read_at(self, source: places.ByteSource, position: int, length: int) -> bytes:
        """``length`` bytes at ``position``: from what was read if it holds them, else read from ``source``
        (and kept, so that the verdict judges the very bytes the reader found)."""
        if position + length <= len(self.data):
            return bytes(self.data[position : position + length])
        kept = self.counts.get(position)
        if kept is not None and len(kept) == length:
            return kept
        read = source.read_at(position, length)
        self.counts[position] = read
        return read


class ReadOnce(io.RawIOBase):
    """A file from its start, each byte read from it once and kept: seeking back (an unpickler's second
    look for unsafe globals) is answered from memory, never by reading the file again."""

    def __init__(self, file: BinaryIO, file_bytes: int) -> None:
        super().__init__()
        self.file = file
        self.file_bytes = file_bytes
        self.kept = bytearray()
        self.position = 0
        self.ended = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.file.fileno()

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.file_bytes}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self.position = base + offset
        return self.position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        end = self.position + len(view)
        while end > len(self.kept) and not self.ended:
            self._fill(end - len(self.kept))
        count = max(0, min(end, len(self.kept)) - self.position)
        view[:count] = self.kept[self.position : self.position + count]
        self.position += count
        return count

    def _fill(self, wanted: int) -> None:
        """Read on from where the file was last read."""
        chunk = self.file.read(wanted)
        if not chunk:
            self.ended = True
        self.kept += chunk


PickleRead = Callable[[str, Any], None]
"""Called with the path and what was read: a zip's central directory (its pickle kept) or :class:`PickleBytes`."""
_pickle_read: contextvars.ContextVar[PickleRead | None] = contextvars.ContextVar("pickle_read", default=None)


@contextlib.contextmanager
def when_pickle_read(callback: PickleRead) -> Iterator[None]:
    """Call ``callback(path, read)`` as soon as a file's pickle has been read: a zip checkpoint's data.pkl
    before its tree is built (``read``: its central directory, which keeps the bytes read, see
    :meth:`ZipDirectory.read_kept`), a legacy file or plain pickle once its pickles were read, whether the
    reader then takes it or refuses it (``read``: :class:`PickleBytes`). Work started then (the weights_only
    scan in a forked child) judges the bytes the tree is built from."""
    token = _pickle_read.set(callback)
    try:
        yield
    finally:
        _pickle_read.reset(token)


def pickle_read(path: str, read: Any) -> None:
    """Tell the caller of :func:`when_pickle_read`, if any, that ``path``'s pickle was read."""
    callback = _pickle_read.get()
    if callback is not None:
        callback(path, read)
