"""The output stream of a write, and the log of what went where (what verification checks).

Bytes written from memory are gathered and written about a megabyte at a time; each such stretch
is logged with its CRC and its first and last bytes (a :class:`Segment`). Large ranges copied
from a source by the kernel are logged with where they came from and their CRC if the source
knows it (a :class:`Copy`). Together they tile the file, so :mod:`.verify` can check every byte
on disk against what was meant without keeping the bytes.
"""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import BinaryIO

from ckpt_tui.core.errors import Cancelled
from ckpt_tui.core.model.byte_source import ByteSource

FLUSH_AT = 1 << 20
"""Cache-sized: the CRC of a stretch reads it while the join has just brought it into the cache."""
EDGE = 4096
COPY_CHUNK = 64 << 20
WRITEBACK_EVERY = 32 << 20
PARALLEL_CRC = 1 << 20
"""A streamed chunk at least this large has its CRC taken on a helper thread while it is written (both
release the GIL): one after the other, writing and checksumming 1 GB was 0.65 s of the writer's 2.5 s."""

Progress = Callable[[int, int], None]
CancelCheck = Callable[[], bool]


@dataclass(slots=True)
class Segment:
    """Bytes written from memory: where, how many, their CRC, their first and last bytes."""

    offset: int
    size: int
    crc: int
    head: bytes
    tail: bytes


@dataclass(slots=True)
class Copy:
    """Bytes copied by the kernel from ``source_path`` at ``source_offset``; ``crc`` if the source gave one."""

    offset: int
    size: int
    crc: int | None
    source_path: str
    source_offset: int


@dataclass
class WriteLog:
    """Everything written, in order."""

    segments: list[Segment] = field(default_factory=list)
    copies: list[Copy] = field(default_factory=list)
    versions: dict[str, str | None] = field(default_factory=dict)
    """Each source file copied from: its version as opened (what the verification's reads of it check)."""


_crc_lock = threading.Lock()
_crc_executor: ThreadPoolExecutor | None = None


def _written_crc(file: BinaryIO, chunk: bytes | memoryview, running: int) -> int:
    """Write ``chunk`` and return the CRC running on through it; a large one's CRC is taken meanwhile on the
    helper thread (done before this returns, so the caller may reuse the chunk's memory)."""
    if memoryview(chunk).nbytes < PARALLEL_CRC:
        file.write(chunk)
        return zlib.crc32(chunk, running)
    pending = _crc_pool().submit(zlib.crc32, chunk, running)
    try:
        file.write(chunk)
    finally:  # (a failed write: the helper is done with the chunk before it is freed or reused)
        crc = pending.result()
    return crc


def _crc_pool() -> ThreadPoolExecutor:
    """The CRC helper thread (started on first use)."""
    global _crc_executor
    with _crc_lock:
        if _crc_executor is None:
            _crc_executor = ThreadPoolExecutor(1, thread_name_prefix="ckpt-tui-crc")
        return _crc_executor


class Writeback:
    """Starts putting a large output on disk while it is still being written.

    A background thread calls ``fdatasync`` each time another :data:`WRITEBACK_EVERY` bytes were
    written (it releases the GIL, and the disk works while the copy goes on), so the final fsync has
    little left to wait for. Without it, writing 2 GB and then syncing costs the copy plus the whole
    disk write, one after the other.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.error: OSError | None = None
        self._wanted = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def kick(self) -> None:
        """Ask for a sync of what has been written so far (one runs at a time; asks in between merge)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="writeback", daemon=True)
            self._thread.start()
        self._wanted.set()

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            if self._stopping:
                return
            try:
                os.fdatasync(self.fd)
            except OSError as exc:  # the final fsync reports it
                self.error = exc
                return

    def stop(self) -> None:
        """End the thread (before the file is closed)."""
        if self._thread is not None:
            self._stopping = True
            self._wanted.set()
            self._thread.join()
            self._thread = None


class Output:
    """A file being written: buffered small writes, kernel copies, progress and cancellation.

    Use it as a context manager: leaving the block stops the background writeback.
    """

    def __init__(
        self, file: BinaryIO, total: int = 0, progress: Progress | None = None, cancelled: CancelCheck | None = None
    ) -> None:
        self.file = file
        self.position = file.tell()
        self.log = WriteLog()
        self.total = total
        self.done = 0
        self.progress = progress
        self.cancelled = cancelled
        self._pending: list[bytes | memoryview] = []
        self._pending_at = self.position
        self._pending_bytes = 0
        self._writeback = Writeback(file.fileno())
        self._unsynced = 0

    def __enter__(self) -> Output:
        return self

    def __exit__(self, *exc: object) -> None:
        self._writeback.stop()

    def write(self, data: bytes | memoryview) -> None:
        """Append bytes (buffered)."""
        self._pending.append(data)
        self._pending_bytes += len(data)
        self.position += len(data)
        if self._pending_bytes >= FLUSH_AT:
            self.flush()

    def write_pair(self, first: bytes | memoryview, second: bytes | memoryview) -> None:
        """Append two pieces (a header and its data) at the cost of one call."""
        self._pending += (first, second)
        count = len(first) + len(second)
        self._pending_bytes += count
        self.position += count
        if self._pending_bytes >= FLUSH_AT:
            self.flush()

    def write_many(self, pieces: list[bytes | memoryview], count: int) -> None:
        """Append many pieces (``count`` bytes in all) at the cost of one call."""
        self._pending += pieces
        self._pending_bytes += count
        self.position += count
        if self._pending_bytes >= FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        """Write what is buffered as one logged segment."""
        if not self._pending:
            return
        data = b"".join(self._pending)
        self.file.write(data)
        self._log(self._pending_at, data, zlib.crc32(data))
        self._pending.clear()
        self._pending_bytes = 0
        self._pending_at = self.position

    def _log(self, offset: int, data: bytes, crc: int) -> None:
        self.log.segments.append(Segment(offset, len(data), crc, data[:EDGE], data[-EDGE:]))

    def stream(self, chunks: Iterable[bytes | memoryview], size: int) -> int:
        """Write ``size`` bytes from ``chunks`` unbuffered, as one segment; returns their CRC."""
        self.flush()
        start, running, written = self.position, 0, 0
        head, tail = b"", b""
        for chunk in chunks:
            running = _written_crc(self.file, chunk, running)
            if len(head) < EDGE:
                head += bytes(chunk[: EDGE - len(head)])
            tail = (tail + bytes(chunk[-EDGE:]))[-EDGE:]
            written += len(chunk)
            self.advance(len(chunk))
        if written != size:
            raise OSError(f"wrote {written} bytes, {size} were expected")
        self.position += size
        self._pending_at = self.position
        self.log.segments.append(Segment(start, size, running, head, tail))
        return running

    def patch(self, offset: int, data: bytes) -> None:
        """Overwrite bytes already written (a header whose CRC is known only afterwards); logged as a segment."""
        self.flush()
        self.file.seek(offset)
        self.file.write(data)
        self.file.seek(0, os.SEEK_END)
        self._log(offset, data, zlib.crc32(data))

    def copy(self, source: ByteSource, source_path: str, source_offset: int, size: int, crc: int | None) -> None:
        """Copy a range of a source file to the current position, by the kernel where it can."""
        self.flush()
        self.file.flush()
        start = self.position
        target_fd = self.file.fileno()
        copied = 0
        while copied < size:
            count = source.copy_to(target_fd, source_offset + copied, min(COPY_CHUNK, size - copied))
            if count <= 0:
                raise OSError(f"{source_path} ended early")
            copied += count
            self.advance(count)
        self.file.seek(0, os.SEEK_END)
        self.position += size
        self._pending_at = self.position
        self.log.copies.append(Copy(start, size, crc, source_path, source_offset))
        # the verification reads the source again: as the version copied (a changed one is FileChanged, not a CRC)
        self.log.versions.setdefault(source_path, getattr(source, "version", None))

    def advance(self, count: int) -> None:
        """Count progress (and start writeback every so often); stop here if cancelled."""
        self.done += count
        self._unsynced += count
        if self._unsynced >= WRITEBACK_EVERY:
            self._unsynced = 0
            self._writeback.kick()
        if self.cancelled is not None and self.cancelled():
            raise Cancelled("save cancelled")
        if self.progress is not None:
            self.progress(self.done, self.total)

    def close(self) -> None:
        """Flush the last buffered bytes."""
        self.flush()
        self.file.flush()
