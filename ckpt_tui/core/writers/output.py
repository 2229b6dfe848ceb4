"""The output stream of a write, and the log of what went where (what verification checks).

Bytes written from memory are gathered and written about a megabyte at a time; each such stretch
is logged with its CRC and its first and last bytes (a :class:`Segment`). Large ranges copied
from a source by the kernel are logged with where they came from and their CRC if the source
knows it (a :class:`Copy`). Together they tile the file, so :mod:`.verify` can check every byte
on disk against what was meant without keeping the bytes.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import sys
import threading
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
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

DIRECT_FROM = 512 << 20
"""A file holding more than this (verification's ``FULL_VERIFY_BYTES``: its written bytes are then checked at
their edges, not read back whole) has its large streamed records written past the page cache."""
DIRECT_RECORD = 8 << 20
"""Streamed records at least this large are written past the page cache (in a large file)."""
DIRECT_ALIGN = 4096
"""File offsets, lengths and memory of writes past the page cache are multiples of this (a page: any block size
of a local file system; a file system wanting more refuses the write, which is then made through the cache)."""
STAGE = 8 << 20
"""Bytes gathered in an aligned buffer per write past the page cache."""
STAGES = 3
"""Aligned buffers: two written and checksummed while the next fills (the disk and the CRC thread, shared with
other work, may each lag a buffer behind)."""

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


_helpers_lock = threading.Lock()
_helpers: dict[str, ThreadPoolExecutor] = {}


def _helper(name: str) -> ThreadPoolExecutor:
    """The one helper thread named ``name`` (``crc``: checksums in order; ``direct``: direct writes), started on
    first use and kept for the process."""
    with _helpers_lock:
        if name not in _helpers:
            _helpers[name] = ThreadPoolExecutor(1, thread_name_prefix=f"ckpt-tui-{name}")
        return _helpers[name]


def _written_crc(file: BinaryIO, chunk: bytes | memoryview, running: int) -> int:
    """Write ``chunk`` and return the CRC running on through it; a large one's CRC is taken meanwhile on the
    helper thread (done before this returns, so the caller may reuse the chunk's memory)."""
    if memoryview(chunk).nbytes < PARALLEL_CRC:
        file.write(chunk)
        return zlib.crc32(chunk, running)
    pending = _helper("crc").submit(zlib.crc32, chunk, running)
    try:
        file.write(chunk)
    finally:  # (a failed write: the helper is done with the chunk before it is freed or reused)
        crc = pending.result()
    return crc


_HAS_DIRECT = hasattr(os, "O_DIRECT") and hasattr(os, "pwrite")


def _set_direct(fd: int, on: bool) -> bool:
    """Turn direct writes on or off for ``fd``; whether they are now on (False where the file system has none)."""
    import fcntl

    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    wanted = flags | os.O_DIRECT if on else flags & ~os.O_DIRECT
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, wanted)
    except OSError:
        return False
    return on


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (a short write goes on where it stopped)."""
    done = 0
    while done < len(data):
        count = os.pwrite(fd, data[done:], offset + done)
        if count <= 0:
            raise OSError(errno.EIO, "the file system wrote nothing")
        done += count


def _copy_into(buffer: mmap.mmap, at: int, data: memoryview) -> None:
    """Copy ``data`` into ``buffer`` at ``at``: by numpy where it is loaded (its copy releases the GIL, so the
    threads making the next chunks go on meanwhile), else by the memoryview (a plain copy never loads numpy)."""
    np = sys.modules.get("numpy")
    if np is None:
        memoryview(buffer)[at : at + len(data)] = data
    else:
        np.copyto(np.frombuffer(buffer, np.uint8, len(data), at), np.frombuffer(data, np.uint8))


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


class DirectStream:
    """One streamed range ``[start, end)`` written with every whole page past the page cache (``O_DIRECT``).

    Writing a gigabyte through the page cache costs the writing thread half a second of copying into cache
    pages (and the kernel as much again to write them out and free them); written directly, the disk reads
    the bytes from our memory. The bytes are gathered in aligned buffers, each written by the writer thread
    and checksummed by the CRC thread (in order, the CRC running on from buffer to buffer) while the next
    fills: the thread that stages the chunks waits only for a buffer to come free. The unaligned head and
    tail (less than a page each, sharing pages with the zip headers around them) go through the page cache.
    Nothing changes what is written, nor the fsync that puts it on disk; a file system that refuses a direct
    write has it, and every write after it, made through the cache.
    """

    def __init__(self, fd: int, start: int, size: int, buffers: list[mmap.mmap]) -> None:
        self.fd = fd
        self.at = start
        self.end = start + size
        self.first = min(-(-start // DIRECT_ALIGN) * DIRECT_ALIGN, self.end)
        """The first page boundary: bytes before it go through the cache."""
        self.last = max(self.end // DIRECT_ALIGN * DIRECT_ALIGN, self.first)
        """The last page boundary: bytes after it go through the cache."""
        self.buffers = buffers
        self.current = 0
        self.filled = 0
        self.staged_at = self.first
        self.busy: list[list[Future[None]]] = [[] for _ in buffers]
        """Each buffer's write and CRC under way (done before it is filled again)."""
        self.crc = 0
        """The CRC of the bytes staged so far (updated on the CRC thread, in order)."""
        self.direct = False
        self.tail = bytearray()

    def add(self, chunk: bytes | memoryview) -> None:
        """The next bytes of the range."""
        data = memoryview(chunk).cast("B")
        if self.at < self.first:  # the head, through the cache (before any write past it)
            count = min(len(data), self.first - self.at)
            _pwrite_all(self.fd, data[:count], self.at)
            self.crc = zlib.crc32(data[:count], self.crc)
            self.at += count
            data = data[count:]
        if data and self.at == self.first < self.last and self.filled == 0 and self.staged_at == self.first:
            self.direct = _set_direct(self.fd, True)  # (once, as the first whole page comes)
        while data and self.at < self.last:
            count = min(len(data), self.last - self.at, STAGE - self.filled)
            _copy_into(self.buffers[self.current], self.filled, data[:count])
            self.filled += count
            self.at += count
            data = data[count:]
            if self.filled == STAGE or self.at == self.last:
                self._hand_over()
        if data:
            self.tail += data
            self.at += len(data)

    def _hand_over(self) -> None:
        """The filled buffer to the writer and CRC threads; go on in the next one, once it is free."""
        view = memoryview(self.buffers[self.current])[: self.filled]
        self.busy[self.current] = [
            _helper("direct").submit(self._write, view, self.staged_at),
            _helper("crc").submit(self._checksum, view),
        ]
        self.staged_at += self.filled
        self.current = (self.current + 1) % len(self.buffers)
        self.filled = 0
        self._free(self.current)

    def _free(self, index: int) -> None:
        """Wait for a buffer's write and CRC (both, then the first failure raised)."""
        pending, self.busy[index] = self.busy[index], []
        failures = [task.exception() for task in pending]
        failure = next((exc for exc in failures if exc is not None), None)
        if failure is not None:
            raise failure

    def _checksum(self, view: memoryview) -> None:
        # (one CRC thread: the buffers' checksums run in the order they were handed over)
        self.crc = zlib.crc32(view, self.crc)

    def _write(self, view: memoryview, offset: int) -> None:
        try:
            _pwrite_all(self.fd, view, offset)
        except OSError as exc:
            if not self.direct or exc.errno != errno.EINVAL:
                raise
            # the file system wants other alignments: this write and every later one through the cache
            self.direct = _set_direct(self.fd, False)
            _pwrite_all(self.fd, view, offset)

    def close(self) -> int:
        """Wait for the writes past the cache, then write the tail through it; the CRC of the whole range."""
        self.wait()
        if self.direct:
            self.direct = _set_direct(self.fd, False)
        if self.tail:
            _pwrite_all(self.fd, memoryview(self.tail), self.last)
        return zlib.crc32(self.tail, self.crc)

    def wait(self) -> None:
        """Wait for every buffer's write and CRC (the first failure raised, once all are done)."""
        failure: BaseException | None = None
        for index in range(len(self.buffers)):
            try:
                self._free(index)
            except BaseException as exc:  # (every buffer waited for before raising)
                failure = failure or exc
        if failure is not None:
            raise failure

    def abandon(self) -> None:
        """Stopped early: wait for the writes under way (their failures are the caller's failure's), direct off."""
        with contextlib.suppress(Exception):
            self.wait()
        if self.direct:
            self.direct = _set_direct(self.fd, False)


class Output:
    """A file being written: buffered small writes, kernel copies, progress and cancellation.

    Use it as a context manager: leaving the block stops the background writeback.
    """

    def __init__(
        self,
        file: BinaryIO,
        total: int = 0,
        progress: Progress | None = None,
        cancelled: CancelCheck | None = None,
        total_of: Callable[[], int] | None = None,
    ) -> None:
        """``total``: the bytes of every record (for progress; ``total_of`` computes it when a large record is
        streamed, where it was not given): a file larger than :data:`DIRECT_FROM` has its large streamed
        records written past the page cache."""
        self.file = file
        self.position = file.tell()
        self.log = WriteLog()
        self.total = total
        self._total_of = total_of
        self._stage: list[mmap.mmap] = []
        self._direct = False
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
        direct = self._direct_stream(size)
        try:
            for chunk in chunks:
                if direct is None:
                    running = _written_crc(self.file, chunk, running)
                else:
                    direct.add(chunk)
                if len(head) < EDGE:
                    head += bytes(chunk[: EDGE - len(head)])
                tail = (tail + bytes(chunk[-EDGE:]))[-EDGE:]
                written += len(chunk)
                if written > size:
                    raise OSError(f"wrote {written} bytes, {size} were expected")
                self.advance(len(chunk))
            if direct is not None:
                running = direct.close()
                self.file.seek(start + written)
        except BaseException:
            if direct is not None:  # (no write left running on a buffer the next record reuses)
                direct.abandon()
            raise
        finally:
            self._direct = False
        if written != size:
            raise OSError(f"wrote {written} bytes, {size} were expected")
        self.position += size
        self._pending_at = self.position
        self.log.segments.append(Segment(start, size, running, head, tail))
        return running

    def _direct_stream(self, size: int) -> DirectStream | None:
        """A :class:`DirectStream` for a large record of a large file, where this system has direct writes."""
        if size < DIRECT_RECORD or not _HAS_DIRECT:
            return None
        if not self.total and self._total_of is not None:
            self.total = self._total_of()
        if self.total <= DIRECT_FROM:
            return None
        self.file.flush()  # (what the file object holds, written before the positioned writes)
        if not self._stage:
            self._stage = [mmap.mmap(-1, STAGE) for _ in range(STAGES)]  # page-aligned memory, kept for every record
        self._direct = True
        return DirectStream(self.file.fileno(), self.position, size, self._stage)

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
        # (bytes written past the page cache are already on their way to the disk: no writeback to start)
        if self._unsynced >= WRITEBACK_EVERY and not self._direct:
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
