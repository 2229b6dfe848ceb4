"""A remote file read with ranged requests: the remote :class:`~.byte_source.ByteSource`.

A :class:`Transport` knows one store's requests (HTTP, the Hub, S3 through fsspec): the file's size and
identity, and the bytes of a range. :class:`RemoteFile` decides what to ask for. Small reads (the
readers' headers, central directories, pickles) are served from the ranges fetched before; a miss
fetches a little more than asked, and more each time a stream reads on from where the last fetch
ended, so a pickle of a few MB costs a few requests. Large reads (tensor values) are fetched in
parallel parts and not kept. Every byte counts against :data:`BUDGET`: past it a read is refused in
one line that says how much it needs, never a silent full download.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import io
import math
import os
import re
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, BinaryIO, Protocol

from ckpt_tui.core.errors import ReadError, ReadStopped, StoreFailed
from ckpt_tui.core.model import byte_source
from ckpt_tui.core.model.byte_source import human, write_all

if TYPE_CHECKING:
    from ckpt_tui.core.model.tree import Tensor

MIN_AHEAD = 64 << 10
MAX_AHEAD = 16 << 20
BIG = 4 << 20
"""Reads of this size or more are values: fetched in parallel parts, not cached."""
PART = 8 << 20
WORKERS = 8
TAIL = 64 << 10
"""What a first request for a file fetches from its end: a zip's end records and usually its directory."""
WINDOW = 2 * MAX_AHEAD
"""Bytes of ranges fetched after a file opened (values read in chunks, a stream's read-ahead) kept at most: the oldest
go first, so memory stays at this, not the file's size. What the open fetched (and prefetched) stays."""
DEFAULT_MAX_DOWNLOAD = 10**9


class NotFound(ReadError):
    """The store has no such file."""


class NoRanges(ReadError):
    """A server that ignores ranges sent a file too large to keep whole (past the budget): ``url`` and ``length``
    (None when the server named none) let a reader of a set (an index and its shards) say it of the set."""

    def __init__(self, message: str, url: str, length: int | None) -> None:
        super().__init__(message)
        self.url = url
        self.length = length


@dataclass
class Tally:
    """Bytes fetched and requests made for one file."""

    fetched: int = 0
    requests: int = 0


@dataclass
class Transfer:
    """Requests made and bytes fetched from remote stores by this process: the one place every byte is counted
    (each file's :class:`Tally` is kept here too, under the same lock), and the budget is held."""

    requests: int = 0
    fetched: int = 0
    limit: int = DEFAULT_MAX_DOWNLOAD

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _here(self, name: str) -> None:
        # a forked child's count dies with it: what it fetched would pass the budget unseen and be said nowhere
        # (its caller does the work itself when the child fails)
        if os.getpid() != self._pid:
            raise ReadError(f"{name}: remote bytes are fetched by the process that counts them, not a child")

    def reserve(self, name: str, count: int, tally: Tally | None = None, requests: int = 1) -> None:
        """Count ``count`` bytes about to be fetched in ``requests`` (for ``tally``'s file), or refuse them past the
        budget."""
        with self._lock:
            self._here(name)
            if self.fetched + count > self.limit:
                raise StoreFailed(self.refusal(name, count))
            self.fetched += count
            self.requests += requests
            if tally is not None:
                tally.fetched += count
                tally.requests += requests

    def refusal(self, name: str, count: int) -> str:
        """Why ``count`` more bytes are refused: how much, what was fetched, and the least value that reads them (what
        the reads after them need is not known yet)."""
        least = size_text(self.fetched + count)
        return (
            f"{name}: this needs {human(count)} more from the remote store, past --max-download {human(self.limit)} "
            f"({human(self.fetched)} fetched already); raise it (at least --max-download {least})"
        )

    def give_back(self, count: int, tally: Tally | None = None) -> None:
        """Bytes reserved but not received (a short range at the end of a file)."""
        with self._lock:
            self.fetched -= count
            if tally is not None:
                tally.fetched -= count

    def claim(self, name: str, count: int) -> bool:
        """Count ``count`` bytes of an answer already on its way (a whole file a server sent), or say False,
        counting nothing, when they would pass the budget."""
        with self._lock:
            self._here(name)
            if self.fetched + count > self.limit:
                return False
            self.fetched += count
            return True

    def came(self, tally: Tally, count: int) -> None:
        """Count ``count`` bytes that came along with an answer (a stat's tail), past the budget or not: they are
        fetched already."""
        with self._lock:
            self.fetched += count
            tally.fetched += count

    def attribute(self, tally: Tally, count: int, requests: int) -> None:
        """Say of ``tally``'s file ``count`` bytes claimed while it was asked for, and ``requests`` more made."""
        with self._lock:
            self.requests += requests
            tally.fetched += count
            tally.requests += requests


TRANSFER = Transfer()


def claim(name: str, count: int) -> bool:
    """:meth:`Transfer.claim` on this process's count."""
    return TRANSFER.claim(name, count)


def past_budget(what: str) -> str:
    """``WHAT is past --max-download 1.0 GB (2.1 kB fetched so far)``."""
    return f"{what} is past --max-download {human(TRANSFER.limit)} ({human(TRANSFER.fetched)} fetched so far)"


def budget_left() -> int:
    """Bytes the budget still allows."""
    return max(0, TRANSFER.limit - TRANSFER.fetched)


def parse_size(text: str) -> int:
    """``1G``, ``500MB``, ``2GiB``, ``123`` as bytes (k/M/G/T powers of 1000; KiB/MiB/GiB/TiB of 1024)."""
    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([kKmMgGtT]?)(i?)[bB]?\s*", text)
    if found is None:
        raise ValueError(f"{text!r} is not a size (e.g. 500M, 2G, 1.5GB)")
    number, unit, binary = found.groups()
    base = 1024 if binary else 1000
    return int(float(number) * base ** " KMGT".index(unit.upper() or " "))


def held_whole(path: str) -> bool:
    """Whether the remote file at ``path`` came whole in its first answer (a server that ignores ranges): its
    values cost no more requests, nor any more of the budget."""
    if not path or not byte_source.is_remote(path):
        return False
    source = byte_source.store_of(path).source(path)
    return isinstance(source, RemoteFile) and source.kept_whole()


def ensure_values_budget(name: str, tensors: Iterable[Tensor], what: str) -> None:
    """Refuse up front, in one line, ``what`` reading the values of ``tensors`` (each storage once) past the budget
    left; a file the server sent whole was counted as it came: its values cost nothing more."""
    storages = {id(t.storage): t.storage for t in tensors if t.storage is not None}
    where = {key: getattr(storage.source, "path", "") for key, storage in storages.items()}
    held = {path: held_whole(path) for path in set(where.values())}
    ensure_budget(name, sum(s.nbytes for key, s in storages.items() if not held[where[key]]), what)


def ensure_whole_read(path: str, what: str) -> None:
    """Refuse up front, in one line, reading a remote file whole (a plain pickle: unpickling reads to its end) past
    the budget left: its size is known from its first answer, so the refusal says the real total, before a byte of
    the rest is fetched (never a read up to the cap, then "a bit more")."""
    if not path or not byte_source.is_remote(path):
        return
    source = byte_source.store_of(path).source(path)
    if not isinstance(source, RemoteFile) or source.kept_whole():
        return
    ensure_budget(path, source.not_held(), f"{what} ({human(source.size)}, read whole)", "more")


def ensure_budget(name: str, need: int, what: str, of: str = "of tensor values") -> None:
    """Refuse up front, in one line saying how much and the value to raise the cap to, work that would fetch more
    than the budget left (``need`` bytes, ``of`` what)."""
    with TRANSFER._lock:
        fetched, limit = TRANSFER.fetched, TRANSFER.limit
    if fetched + need > limit:
        total = fetched + need
        so_far = f"; {human(fetched)} fetched already" if fetched else ""
        raise ReadError(
            f"{name}: {what} needs {human(need)} {of} from the remote store ({apart(total, limit)} in all"
            f"{so_far}), past --max-download {apart(limit, total)}; raise it (--max-download {size_text(total)}) "
            "or use a local copy"
        )


def apart(count: int, other: int) -> str:
    """``count`` in words, with a digit more where one decimal would say it as ``other`` (16.93 MB, 16.90 MB)."""
    if human(count) != human(other) or count == other:
        return human(count)
    exponent = min(4, max(1, int(math.log10(max(count, 1)) // 3)))
    units = ("kB", "MB", "GB", "TB")
    return f"{count / 1000**exponent:.2f} {units[exponent - 1]}"


def size_text(count: int) -> str:
    """A ``--max-download`` value that allows ``count`` bytes: three digits, rounded up (``17.0MB``, ``1.01GB``), never
    less than ``count`` once read back by :func:`parse_size`."""
    if count < 1000:
        return f"{count}B"
    exponent = min(4, int(math.log10(count) // 3))
    step = 10 ** max(0, int(math.log10(count)) - 2)
    rounded = -(-count // step) * step
    while True:
        value = rounded / 1000**exponent
        text = f"{value:.{max(0, 2 - int(math.log10(value)))}f}{('kB', 'MB', 'GB', 'TB')[exponent - 1]}"
        if parse_size(text) >= count:
            return text
        rounded += step


@dataclass(frozen=True)
class Stat:
    """What a store says of a file: its size and identity, and the bytes the asking brought (if any)."""

    size: int
    identity: str
    seed: tuple[int, bytes] | None = None
    whole: IO[bytes] | None = None
    """The whole file, when the store sent it in one answer (a server that ignores ranges): a private
    temporary file (in memory while small), already counted against the budget; every read is served
    from it, so every byte comes from that one answer."""
    asked: int = 1
    """Requests the answer took (a refused range asked again)."""


class CameWhole(Exception):
    """A transport's first ranged GET was answered with the whole file (a server that ignores ranges behind a store
    that told the size another way: the Hub's HEAD), kept within the budget as a stat's whole answer is (already
    counted): from now on every read is served from it."""

    def __init__(self, whole: IO[bytes], size: int) -> None:
        super().__init__("the whole file came")
        self.whole, self.size = whole, size


class Transport(Protocol):
    """One store's requests for one file."""

    def stat(self) -> Stat:
        """Size and identity (one request; it may bring the file's tail along)."""
        ...

    def fetch(self, offset: int, length: int, identity: str) -> bytes:
        """The bytes of a range; refuses (:class:`ReadError`) when the file is no longer ``identity``."""
        ...


class RemoteFile:
    """A remote file: ranged reads through a transport, small ones served from fetched ranges."""

    def __init__(
        self, name: str, transport: Transport, seed: Callable[[Stat], list[tuple[int, bytes]]] | None = None
    ) -> None:
        self.name = name
        self._transport = transport
        self._seed = seed
        self._stat: Stat | None = None
        self._starts: list[int] = []
        self._chunks: list[bytes] = []
        self._lock = threading.RLock()
        self._window: collections.deque[int] = collections.deque()
        """Starts of the ranges kept in the window (not the open's), oldest first."""
        self._window_bytes = 0
        self._opened = False
        self._last_end = -1
        self._ahead = MIN_AHEAD
        self.tally = Tally()
        self.remembered = 0

    def _info(self) -> Stat:
        if self._stat is None:
            with self._lock:
                if self._stat is None:
                    TRANSFER.reserve(self.name, 0, self.tally)
                    stat = self._transport.stat()
                    # the transport claimed a whole file against the budget as it came; a seed is counted here
                    came = stat.size if stat.whole is not None else 0
                    TRANSFER.attribute(self.tally, came, stat.asked - 1)
                    if stat.whole is not None:
                        # nothing else is asked for
                        self._stat = stat
                        return stat
                    if stat.seed is not None:
                        TRANSFER.came(self.tally, len(stat.seed[1]))
                        self._keep(*stat.seed)
                    for start, data in self._seed(stat) if self._seed else ():
                        self._keep(start, data)
                    self.remembered = sum(map(len, self._chunks)) - (len(stat.seed[1]) if stat.seed else 0)
                    self._stat = stat
        return self._stat

    def kept_whole(self) -> bool:
        """Whether the store sent the whole file in its first answer (every read is served from it)."""
        return self._stat is not None and self._stat.whole is not None

    def stat_known(self) -> bool:
        """Whether the store has told this file's size (it exists)."""
        return self._stat is not None

    @property
    def size(self) -> int:
        """Bytes in the file (asked once)."""
        return self._info().size

    @property
    def identity(self) -> str:
        """The store's ETag or commit of the file."""
        return self._info().identity

    @property
    def fetched(self) -> int:
        """Bytes fetched for this file."""
        return self.tally.fetched

    @property
    def requests(self) -> int:
        """Requests made for this file."""
        return self.tally.requests

    def not_held(self) -> int:
        """Bytes of the file neither fetched nor seeded from the cache (what reading it whole would fetch)."""
        size = self.size
        with self._lock:
            return max(0, size - sum(map(len, self._chunks)))

    def extents(self) -> list[tuple[int, bytes]]:
        """The ranges fetched and kept (the readers' metadata), in file order."""
        with self._lock:
            return list(zip(self._starts, self._chunks, strict=True))

    def opened(self) -> None:
        """The file has opened: the ranges kept so far (headers, directories, pickles) stay; those fetched from now
        on are kept in the window (:data:`WINDOW`)."""
        with self._lock:
            self._opened = True

    def _keep(self, start: int, data: bytes, stays: bool = False) -> None:
        """Remember fetched bytes (ranges kept apart: a new range never overlaps an older one); once the file has
        opened, in the window, unless ``stays`` (what a reader prefetches: records' headers, a storage's count)."""
        if not data:
            return
        at = bisect.bisect_right(self._starts, start)
        self._starts.insert(at, start)
        self._chunks.insert(at, data)
        if not self._opened or stays:
            return
        self._window.append(start)
        self._window_bytes += len(data)
        # the oldest go first; the range just kept stays (a read is being served from it)
        while self._window_bytes > WINDOW and len(self._window) > 1:
            oldest = bisect.bisect_left(self._starts, self._window.popleft())
            self._window_bytes -= len(self._chunks[oldest])
            del self._starts[oldest], self._chunks[oldest]

    def _cached(self, offset: int) -> tuple[bytes, int] | None:
        """The kept range holding ``offset``, and where ``offset`` is inside it."""
        at = bisect.bisect_right(self._starts, offset) - 1
        if at >= 0 and offset < self._starts[at] + len(self._chunks[at]):
            return self._chunks[at], offset - self._starts[at]
        return None

    def _next_kept(self, offset: int) -> int:
        at = bisect.bisect_right(self._starts, offset)
        return self._starts[at] if at < len(self._starts) else self.size

    def read_at(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset``."""
        size = self.size
        end = min(size, offset + max(0, length))
        if offset >= end:
            return b""
        whole = self._info().whole
        if whole is not None:
            with self._lock:
                whole.seek(offset)
                return whole.read(end - offset)
        if end - offset >= BIG and self._cached(offset) is None:
            return self._fetch_parallel(offset, end - offset)
        pieces: list[bytes] = []
        at = offset
        with self._lock:
            while at < end:
                found = self._cached(at)
                if found is not None:
                    chunk, inside = found
                    take = chunk[inside : inside + end - at]
                    pieces.append(take)
                    at += len(take)
                    continue
                stop = min(self._next_kept(at), max(end, at + self._read_ahead(at)))
                data = self._fetch(at, stop - at)
                self._keep(at, data)
                self._last_end = at + len(data)
                if not data:
                    raise ReadError(f"{self.name}: the store sent no bytes at {at} (file changed?)")
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _read_ahead(self, at: int) -> int:
        """More each time a read goes on where the last fetch ended (a stream), back to the minimum else."""
        self._ahead = min(MAX_AHEAD, self._ahead * 2) if at == self._last_end else MIN_AHEAD
        return self._ahead

    def _fetch(self, offset: int, length: int) -> bytes:
        TRANSFER.reserve(self.name, length, self.tally)
        try:
            data = self._transport.fetch(offset, length, self.identity)
        except CameWhole as came:
            return self._came_whole(came, offset, length)
        except NoRanges as exc:
            # refused before its body was read: the range reserved was not fetched
            TRANSFER.give_back(length, self.tally)
            raise StoreFailed(str(exc)) from None
        except ReadStopped:
            raise
        except ReadError as exc:
            # a store that fails mid-work (access refused, a signature expired, a timeout) says nothing of the values:
            # the work stops in one line, never a tensor "unreadable" (read as a finding: "DIFFERENT", exit 1)
            raise StoreFailed(str(exc)) from None
        if len(data) < length:
            TRANSFER.give_back(length - len(data), self.tally)
        return data

    def _came_whole(self, came: CameWhole, offset: int, length: int) -> bytes:
        """The whole file, come in answer to a range: kept as a stat's whole answer is (the transport counted it as it
        came; the range reserved for it was not fetched), and the range served from it."""
        TRANSFER.give_back(length, self.tally)
        with self._lock:
            if self._info().whole is None:
                # (said once: a transport holding the whole file says so to every read after)
                TRANSFER.attribute(self.tally, came.size, 0)
                self._stat = dataclasses.replace(self._info(), whole=came.whole)
            came.whole.seek(offset)
            return came.whole.read(length)

    def _fetch_parallel(self, offset: int, length: int) -> bytes:
        parts = [(at, min(PART, offset + length - at)) for at in range(offset, offset + length, PART)]
        if len(parts) == 1:
            return self._fetch(offset, length)
        with ThreadPoolExecutor(min(WORKERS, len(parts))) as pool:
            return b"".join(pool.map(lambda part: self._fetch(*part), parts))

    def readinto_at(self, offset: int, buffer: memoryview | bytearray) -> int:
        """Fill ``buffer`` from ``offset``."""
        data = self.read_at(offset, len(buffer))
        memoryview(buffer)[: len(data)] = data
        return len(data)

    def copy_to(self, fd: int, offset: int, count: int) -> int:
        """Fetch up to 64 MB of the range (in parallel parts) and write it to ``fd``."""
        return write_all(fd, self.read_at(offset, min(count, 64 << 20)))

    def prefetch(self, ranges: list[tuple[int, int]]) -> None:
        """Fetch the small ranges not kept yet, in parallel, and keep them."""
        size = self.size
        if self._info().whole is not None:
            return
        with self._lock:
            wanted = sorted({(o, min(size, o + n)) for o, n in ranges if n > 0 and o < size})
            missing: list[tuple[int, int]] = []
            for start, stop in wanted:
                if self._cached(start) is not None and self._cached(stop - 1) is not None:
                    continue
                if missing and start <= missing[-1][1] + 4096:
                    missing[-1] = (missing[-1][0], max(stop, missing[-1][1]))
                else:
                    missing.append((start, stop))
            missing = [(start, min(stop, self._next_kept(start))) for start, stop in missing]
            missing = [(start, stop) for start, stop in missing if stop > start and self._cached(start) is None]
        if not missing:
            return
        with ThreadPoolExecutor(min(WORKERS, len(missing))) as pool:
            fetched = list(pool.map(lambda r: (r[0], self._fetch(r[0], r[1] - r[0])), missing))
        with self._lock:
            for start, data in fetched:
                if self._cached(start) is None and self._cached(start + len(data) - 1) is None:
                    self._keep(start, data, stays=True)

    def stream(self) -> BinaryIO:
        """A seekable stream reading through :meth:`read_at`."""
        return RemoteStream(self)  # type: ignore[return-value]

    def local_fd(self) -> None:
        """A remote file has no local descriptor."""
        return None

    def confirm(self) -> None:
        """Every range is checked against the first answer's version as it comes: nothing more to check."""

    def close(self) -> None:
        """Nothing to release: the file stays known to its store for later reads of values."""


class RemoteStream(io.RawIOBase):
    """A file object over a :class:`RemoteFile` (what pickle and the zip reader read from)."""

    def __init__(self, source: RemoteFile) -> None:
        self._source = source
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._source.size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def tell(self) -> int:
        return self._position

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        count = self._source.readinto_at(self._position, buffer)
        self._position += count
        return count

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            size = max(0, self._source.size - self._position)
        data = self._source.read_at(self._position, size)
        self._position += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)
