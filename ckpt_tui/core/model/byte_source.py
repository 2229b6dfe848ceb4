"""Byte sources: the one interface every reader and every consumer of tensor bytes reads through.

A checkpoint is named by a string: a local path, or a URL (``hf://``, ``s3://``, ``gs://``, ``az://``,
``https://``). :func:`source_of` gives the :class:`ByteSource` that reads it: its size, ranged reads,
a name for messages and an identity (an ETag, a commit, a local file's size and mtime). The place
functions beside it (:func:`is_file`, :func:`list_dir`, :func:`join`, ...) answer what readers of
folders ask (an index's shards, a DCP folder), for local paths with ``os`` as before, for URLs through
the store that serves them.

A local path costs what it cost before: :func:`open_stream` is ``open(path, "rb")`` and
:meth:`LocalFile.read_at` one ``os.pread``; both open with :func:`open_local_fd`, which never blocks
(a FIFO, a device or stdin is refused, never waited on). Remote stores register themselves here
(:func:`register_scheme`); nothing remote is imported until a URL is opened.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol

from ckpt_tui.core.errors import FileChanged, ReadError, ShortRead

_SCHEME = re.compile(r"^([a-z][a-z0-9+.-]*)://", re.IGNORECASE)


class ByteSource(Protocol):
    """Where a file's bytes are read from."""

    name: str
    """The path or URL, for messages."""

    @property
    def size(self) -> int:
        """Bytes in the file."""
        ...

    @property
    def identity(self) -> str:
        """What changes when the file does: an ETag, a commit, a local file's size and mtime."""
        ...

    @property
    def fetched(self) -> int:
        """Bytes transferred from a remote store so far (0 for a local file)."""
        ...

    def read_at(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` (fewer only at the end of the file)."""
        ...

    def readinto_at(self, offset: int, buffer: memoryview | bytearray) -> int:
        """Fill ``buffer`` from ``offset``; the count read (less only at the end of the file)."""
        ...

    def stream(self) -> BinaryIO:
        """A seekable binary stream over the file from its start (close it when done)."""
        ...

    def copy_to(self, fd: int, offset: int, count: int) -> int:
        """Write up to ``count`` bytes from ``offset`` to the descriptor ``fd`` at its position; the count written."""
        ...

    def prefetch(self, ranges: list[tuple[int, int]]) -> None:
        """A hint: ``(offset, length)`` ranges about to be read (fetched together from remote stores)."""
        ...

    def local_fd(self) -> int | None:
        """A read-only descriptor of the file on this machine (to map it, or to let the kernel copy from
        it), or None where there is none (a remote file: read it through :meth:`read_at`)."""
        ...

    def confirm(self) -> None:
        """Raise :class:`FileChanged` when the file is no longer the version it was opened as (after the last
        read of a pass: bytes read while it changed are never used); a remote file checks each range itself."""
        ...

    def close(self) -> None:
        """Release what the source holds open."""
        ...


class Store(Protocol):
    """What serves the files of one URL scheme: their sources, and the folders readers ask about."""

    def source(self, url: str) -> ByteSource:
        """The file at ``url`` (opened once, then shared: its counts and cache live on)."""
        ...

    def is_file(self, url: str) -> bool:
        """Whether ``url`` names a file."""
        ...

    def is_dir(self, url: str) -> bool:
        """Whether ``url`` names a folder (a prefix holding files)."""
        ...

    def list_dir(self, url: str) -> list[str]:
        """Names of the entries directly inside a folder."""
        ...

    def lists(self, url: str) -> bool:
        """Whether :meth:`list_dir` gives every file of the folder (a web server that lists nothing is only asked
        for the files a loader opens: its other files are never known, so never read for code)."""
        ...

    def remember(self) -> None:
        """Keep what was fetched for a later open (the header cache)."""
        ...

    def opened(self) -> Sequence[ByteSource]:
        """The files this store has read (for the count of bytes fetched)."""
        ...


class LocalFile:
    """A file on this machine: positioned reads on one descriptor, opened on first use.

    With a ``version`` (:func:`version_of` as the file was opened), the descriptor is checked against it as it
    opens and again by :meth:`confirm`: a file replaced or rewritten since is :class:`FileChanged`, never read.
    """

    __slots__ = ("_fd", "_lock", "name", "version")

    def __init__(self, path: str, version: str | None = None) -> None:
        self.name = path
        self.version = version
        self._fd: int | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> LocalFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def size(self) -> int:
        """Bytes in the file now."""
        return os.path.getsize(self.name)

    @property
    def identity(self) -> str:
        """Size and modification time (nanoseconds)."""
        info = os.stat(self.name)
        return f"{info.st_size}-{info.st_mtime_ns}"

    @property
    def fetched(self) -> int:
        """Nothing is transferred to read a local file."""
        return 0

    def fd(self) -> int:
        """The read-only descriptor (opened once; checked against the version)."""
        if self._fd is None:
            with self._lock:
                if self._fd is None:
                    fd = open_local_fd(self.name)
                    try:
                        check_unchanged(fd, self.name, self.version)
                    except BaseException:
                        os.close(fd)
                        raise
                    self._fd = fd
        return self._fd

    def confirm(self) -> None:
        """Raise :class:`FileChanged` when the file read is no longer the version it was opened as: called
        after the last read of a pass, so that bytes read while it was rewritten are never used."""
        if self._fd is not None:
            check_unchanged(self._fd, self.name, self.version)

    def read_at(self, offset: int, length: int) -> bytes:
        """One ``os.pread``."""
        return os.pread(self.fd(), length, offset)

    def readinto_at(self, offset: int, buffer: memoryview | bytearray) -> int:
        """One ``os.preadv``."""
        return os.preadv(self.fd(), [buffer], offset)

    def stream(self) -> BinaryIO:
        """``open(path, "rb")``, never blocking."""
        return open_local(self.name)

    def copy_to(self, fd: int, offset: int, count: int) -> int:
        """One ``copy_file_range`` (by the kernel; a read and write where it or the filesystem cannot)."""
        try:
            return os.copy_file_range(self.fd(), fd, count, offset)
        except (AttributeError, OSError) as exc:
            if isinstance(exc, OSError) and exc.errno in _REAL_FAILURES:
                raise
        return write_all(fd, os.pread(self.fd(), min(count, 16 << 20), offset))

    def prefetch(self, ranges: list[tuple[int, int]]) -> None:
        """The page cache does this for a local file."""

    def local_fd(self) -> int:
        """The descriptor :meth:`read_at` uses (closed with the source)."""
        return self.fd()

    def close(self) -> None:
        """Close the descriptor, if one was opened."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def check_unchanged(fd: int, path: str, version: str | None) -> None:
    """Raise :class:`FileChanged` when the file open on ``fd`` is not ``version`` (None: nothing to check).

    One ``fstat``: another file moved over the path has another inode, one rewritten in place another size
    or modification time. (A rewrite of the same size within the filesystem clock's tick of the open looks
    the same: the one change this cannot see.)
    """
    if version is not None and _version(os.fstat(fd)) != version:
        raise FileChanged(path)


def open_local_fd(path: str) -> int:
    """A read-only descriptor of the regular file at ``path``; anything else is refused, never waited on.

    ``O_NONBLOCK`` makes opening a FIFO with no writer return at once; ``fstat`` then says what was
    opened. (It is cleared again: for a regular file it changes nothing.)
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ReadError(f"{path}: {file_kind(mode)}, not a regular file; refused")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_local(path: str) -> BinaryIO:
    """``open(path, "rb")`` through :func:`open_local_fd`."""
    return os.fdopen(open_local_fd(path), "rb")


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words (``a FIFO``, ``a device``...)."""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


_REAL_FAILURES = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EIO, errno.EBADF}


def write_all(fd: int, data: bytes) -> int:
    """Write all of ``data`` to ``fd``; its length."""
    view = memoryview(data)
    written = 0
    while written < len(view):
        written += os.write(fd, view[written:])
    return len(view)


_stores: dict[str, Callable[[], Store]] = {}
_opened_stores: dict[str, Store] = {}
_stores_lock = threading.Lock()


def register_scheme(scheme: str, make: Callable[[], Store]) -> None:
    """Serve ``scheme://`` URLs with the store ``make()`` builds (once, on first use)."""
    _stores[scheme.lower()] = make


def scheme_known(scheme: str) -> bool:
    """Whether a store serves ``scheme://`` URLs."""
    return scheme.lower() in _stores


def scheme_of(path: str) -> str | None:
    """The URL scheme of ``path`` (``hf``, ``s3``, ``https``...), or None for a local path."""
    found = _SCHEME.match(path)
    return found.group(1).lower() if found else None


def is_remote(path: str) -> bool:
    """Whether ``path`` is a URL rather than a local path."""
    return _SCHEME.match(path) is not None


def store_of(url: str) -> Store:
    """The store serving ``url``'s scheme."""
    scheme = scheme_of(url) or ""
    with _stores_lock:
        store = _opened_stores.get(scheme)
        if store is None:
            make = _stores.get(scheme)
            if make is None:
                known = ", ".join(f"{name}://" for name in sorted(_stores)) or "none (install ckpt-tui[remote])"
                raise ReadError(f"{url}: no reader for {scheme}:// URLs (known: {known})")
            store = _opened_stores[scheme] = make()
    return store


def remember_opened() -> None:
    """Let every store used keep what its files' opens fetched (no-op when none was used)."""
    with _stores_lock:
        stores = list(_opened_stores.values())
    for store in stores:
        store.remember()


def source_of(path: str, version: str | None = None) -> ByteSource:
    """The byte source of a local path or a URL; ``version``: what a local file must still be (see
    :class:`LocalFile`; a remote source checks its own)."""
    if is_remote(path):
        return store_of(path).source(path)
    return LocalFile(path, version)


def open_stream(path: str) -> BinaryIO:
    """A seekable binary stream over the file at ``path`` (for a local path, ``open(path, "rb")``)."""
    if is_remote(path):
        return store_of(path).source(path).stream()
    return open_local(path)


def read_small(path: str, limit: int, too_large: str) -> bytes:
    """All of a small file (a keys file, a rename map), at most ``limit`` bytes; a larger one is refused
    with ``PATH: too_large``, one that cannot be read with why (a FIFO or a device is refused, never waited on)."""
    try:
        with open_stream(path) as file:
            data = file.read(limit + 1)
    except OSError as exc:
        raise ReadError(f"{path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise ReadError(f"{path}: {too_large}")
    return data


def size_of(path: str) -> int:
    """Bytes in the file at ``path``."""
    if is_remote(path):
        return store_of(path).source(path).size
    return os.path.getsize(path)


def fetched_of(path: str) -> int:
    """Bytes transferred so far to read ``path`` (0 for a local path)."""
    if is_remote(path):
        return store_of(path).source(path).fetched
    return 0


def version_of(path: str) -> str | None:
    """A local file's version: device, inode, size, modification and change time (a file replaced by
    ``mv`` or rewritten in place gets another, even with its old modification time put back); None for a
    folder, a URL (ranges check their own) or no file."""
    if is_remote(path):
        return None
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    return _version(info)


def _version(info: os.stat_result) -> str:
    # the change time too: a rewrite that puts the old modification time back (os.utime) still moves it,
    # and no call sets it
    return f"{info.st_dev}:{info.st_ino}:{info.st_size}:{info.st_mtime_ns}:{info.st_ctime_ns}"


_opening = threading.local()
"""``versions``: path -> version of each local file an open in this thread has asked about, taken at first ask."""


@contextmanager
def opening(path: str, version: str | None) -> Iterator[None]:
    """While a checkpoint opens: the versions its record sources hold (:func:`version_at_open`) are those
    the files had as the open began (``path``'s: ``version``, taken before it was read)."""
    outer = getattr(_opening, "versions", None)
    versions = {} if outer is None else outer
    versions.setdefault(path, version)
    _opening.versions = versions
    try:
        yield
    finally:
        _opening.versions = outer


def version_at_open(path: str) -> str | None:
    """The version a record source of ``path`` holds: the file's as the open under way began reading it (its
    first ask), or now outside an open. Its values are read only while the file is still that version."""
    versions: dict[str, str | None] | None = getattr(_opening, "versions", None)
    if versions is None:
        return version_of(path)
    if path not in versions:
        versions[path] = version_of(path)
    return versions[path]


def is_file(path: str) -> bool:
    """``os.path.isfile`` for paths and URLs."""
    if is_remote(path):
        return store_of(path).is_file(path)
    return os.path.isfile(path)


def is_dir(path: str) -> bool:
    """``os.path.isdir`` for paths and URLs."""
    if is_remote(path):
        return store_of(path).is_dir(path)
    return os.path.isdir(path)


def exists(path: str) -> bool:
    """``os.path.exists`` for paths and URLs."""
    if is_remote(path):
        return is_file(path) or is_dir(path)
    return os.path.exists(path)


def list_dir(path: str) -> list[str]:
    """``os.listdir`` for paths and URLs."""
    if is_remote(path):
        return store_of(path).list_dir(path)
    return os.listdir(path)


def absolute(path: str) -> str:
    """``os.path.abspath`` of a local path; a URL as it is (without a trailing slash)."""
    if is_remote(path):
        return path.rstrip("/") if not path.endswith("://") else path
    return os.path.abspath(path)


def parent(path: str) -> str:
    """The folder holding ``path`` (a local path is made absolute first)."""
    return os.path.dirname(absolute(path))


def join(folder: str, name: str) -> str:
    """``name`` inside ``folder``."""
    if is_remote(folder):
        return folder.rstrip("/") + "/" + name
    return os.path.join(folder, name)


def read_into(path: str, offset: int, buffer: memoryview | bytearray, version: str | None = None) -> int:
    """Fill ``buffer`` from ``offset`` of the file at ``path``; the count read (less only at its end).
    ``version``: what a local file must be, before and after the read (:class:`FileChanged`)."""
    if is_remote(path):
        return store_of(path).source(path).readinto_at(offset, buffer)
    with LocalFile(path, version) as file:
        count = file.readinto_at(offset, buffer)
        file.confirm()
        return count


READ_WHOLE = 256 << 20
"""A strided view whose bytes span at most this is read into memory to be gathered (else mapped)."""


def read_checked(path: str, version: str | None, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset``, all of them (a short file is a ReadError), of the file as it was opened
    (``version``: checked before and after the read, :class:`FileChanged`)."""
    source = source_of(path, version)
    try:
        data = source.read_at(offset, length)
        source.confirm()
    finally:
        source.close()
    if len(data) != length:
        raise ShortRead("tensor data ends early (file truncated?)")
    return data


@contextmanager
def prefix(path: str, length: int) -> Iterator[Any]:
    """A buffer over the start of a file, valid inside the ``with``: a local file is mapped whole
    (``length`` ignored; an ``mmap``), a remote one's first ``length`` bytes are fetched (``bytes``)."""
    if is_remote(path):
        yield store_of(path).source(path).read_at(0, length)
        return
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as whole:
        yield whole


class MappedFile:
    """A whole file as a buffer: a local file is mapped (:meth:`release_pages` drops what was read), a
    remote file fetches the ranges asked for with :meth:`buffer`.

    A local file is held under a read lease where one can be had (:func:`take_lease`): no writer can cut it
    short under the map then, and :meth:`confirm` sees a writer waiting. Without one, :meth:`confirm` narrows,
    but cannot close, the window in which a file cut short under the map kills the process (SIGBUS)."""

    def __init__(self, path: str, version: str | None = None) -> None:
        self.path = path
        self.version = version
        self._file: BinaryIO | None = None
        self._map: mmap.mmap | None = None
        self._leased = False
        if is_remote(path):
            return
        self._file = open(path, "rb")  # noqa: SIM115 - closed in close()
        try:
            self._leased = take_lease(self._file.fileno())
            check_unchanged(self._file.fileno(), path, version)
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            self._close_file()
            raise ReadError(f"cannot map the file ({exc})") from None
        except BaseException:
            self._close_file()
            raise

    def confirm(self) -> None:
        """Raise :class:`FileChanged` when the mapped file is no longer the version it was opened as (its
        size shrunk under the map, or rewritten), or a writer waits for the lease: checked after each chunk
        read through the map, and before the next chunk is touched."""
        if self._file is not None:
            check_unchanged(self._file.fileno(), self.path, self.version)
            if self._leased and not lease_held(self._file.fileno()):
                raise FileChanged(self.path)

    def buffer(self, start: int, length: int) -> memoryview:
        """``length`` bytes at ``start``; refused past the file's end."""
        if self._map is None:
            data = store_of(self.path).source(self.path).read_at(start, length)
            if len(data) < length:
                raise ReadError("tensor data ends early (file truncated?)")
            return memoryview(data)
        if start + length > len(self._map):
            raise ReadError("tensor data ends early (file truncated?)")
        return memoryview(self._map)[start : start + length]

    def release_pages(self) -> None:
        """Drop the mapped pages read so far (file-backed: reading them again is free)."""
        if self._map is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        """Unmap, let go of the lease and close (buffers handed out must be released first)."""
        if self._map is not None:
            # a view still referenced somewhere: the map is freed with it
            with contextlib.suppress(BufferError):
                self._map.close()
            self._map = None
        self._close_file()

    def _close_file(self) -> None:
        if self._file is not None:
            if self._leased:
                drop_lease(self._file.fileno())
            self._file.close()
            self._file = None


LEASED_FILESYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "f2fs", "jfs", "bcachefs"})
"""File systems whose every writer runs on this machine, so that a lease keeps each of them out. Not network or
FUSE file systems (a writer on another machine never sees the lease), nor overlay (a write to the layer below
bypasses the overlay's inode)."""

_filesystems: dict[int, str | None] = {}
_filesystems_lock = threading.Lock()


def filesystem_of(device: int) -> str | None:
    """The type of the file system mounted from ``device`` (``st_dev``), from /proc/self/mountinfo; None where it
    cannot be told."""
    with _filesystems_lock:
        if device in _filesystems:
            return _filesystems[device]
        wanted, found = f"{os.major(device)}:{os.minor(device)}", None
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mounts:
                for line in mounts:
                    fields = line.split(" - ", 1)
                    head = fields[0].split()
                    if len(fields) == 2 and len(head) > 2 and head[2] == wanted:
                        found = fields[1].split()[0] if fields[1].split() else None
                        break
        except OSError:
            found = None
        _filesystems[device] = found
        return found


def take_lease(fd: int) -> bool:
    """Take a read lease on ``fd``, a read-only descriptor of a local file (Linux): whether it was taken (not where
    the file system is not in :data:`LEASED_FILESYSTEMS`, the file is open for writing somewhere or belongs to
    another user). While it is held, another process's open for writing, or a truncate, waits for the holder to
    let go (at most /proc/sys/fs/lease-break-time, 45 s by default)."""
    try:
        import fcntl
        import signal
    except ImportError:  # (not POSIX)
        return False
    setlease, setsig = getattr(fcntl, "F_SETLEASE", None), getattr(fcntl, "F_SETSIG", None)
    if setlease is None or setsig is None:
        return False
    try:
        if filesystem_of(os.fstat(fd).st_dev) not in LEASED_FILESYSTEMS:
            return False
        # a break is signalled with SIGIO, whose default action ends the process; SIGURG's is to ignore it (a
        # break is seen by asking for the lease: lease_held)
        fcntl.fcntl(fd, setsig, signal.SIGURG)
        fcntl.fcntl(fd, setlease, fcntl.F_RDLCK)
    except OSError:
        return False
    return True


def lease_held(fd: int) -> bool:
    """Whether the lease taken on ``fd`` is still held and no writer waits for it."""
    import fcntl

    # a break under way already reads as the lease it is going to (F_UNLCK): seen before the writer goes on
    return fcntl.fcntl(fd, fcntl.F_GETLEASE) == fcntl.F_RDLCK


def drop_lease(fd: int) -> None:
    """Let go of the lease on ``fd``: a writer waiting for it goes on."""
    import fcntl

    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)


MAP_WINDOW = 8 << 20
"""Bytes a thread maps at least at once under a lease (the pages are mapped only where they are read)."""


class LeasedFile:
    """A local file held open under a read lease (:func:`take_lease`), whose bytes may then be read through maps.

    A file cut short under a map kills its reader with SIGBUS. Under the lease no writer can cut it short: a writer
    waits until the holder lets go. A writer waiting breaks the lease: :meth:`window` sees it before each map and
    raises :class:`FileChanged`, and the holder lets go (:meth:`close`) once none of its maps is read any more.
    """

    __slots__ = ("_fd", "_windows", "name", "size")

    def __init__(self, fd: int, name: str, size: int) -> None:
        self._fd: int | None = fd
        self.name = name
        self.size = size
        """Bytes in the file (it cannot change while the lease is held)."""
        self._windows: dict[int, tuple[int, memoryview]] = {}
        """Each thread's last map (its start, its bytes): a read inside it maps nothing new."""

    def held(self) -> bool:
        """Whether the lease is still held and no writer waits for it."""
        return self._fd is not None and lease_held(self._fd)

    def window(self, start: int, length: int) -> memoryview:
        """``length`` bytes at ``start``, mapped (read-only; unmapped when the last view of it goes). Refused past
        the file's end (a page past it is a SIGBUS even under the lease), and once a writer waits.

        Each thread maps :data:`MAP_WINDOW` bytes at least, and reads inside its last map take a slice of it: many
        small reads in a row map once (a map costs about what copying 64 kB does)."""
        if start < 0 or length < 0 or start + length > self.size:
            raise ReadError("tensor data ends early (file truncated?)")
        if not self.held():
            raise FileChanged(self.name)
        if length == 0:
            return memoryview(b"")
        thread = threading.get_ident()
        last = self._windows.get(thread)
        if last is not None and last[0] <= start and start + length <= last[0] + len(last[1]):
            return last[1][start - last[0] : start - last[0] + length]
        assert self._fd is not None
        base = start - start % mmap.ALLOCATIONGRANULARITY
        size = min(max(length + start - base, MAP_WINDOW), self.size - base)
        mapped = memoryview(mmap.mmap(self._fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, offset=base))
        self._windows[thread] = (base, mapped)
        return mapped[start - base : start - base + length]

    def close(self) -> None:
        """Let go of the lease and close the descriptor."""
        # (each map goes with the last view of it)
        self._windows.clear()
        fd, self._fd = self._fd, None
        if fd is not None:
            drop_lease(fd)
            os.close(fd)


def lease(path: str, version: str | None) -> LeasedFile | None:
    """The local file at ``path`` under a read lease, still ``version`` (else :class:`FileChanged`); None where no
    lease can be had (:func:`take_lease`), or for a URL: read it with positioned reads instead."""
    if version is None or is_remote(path):
        return None
    fd = open_local_fd(path)
    try:
        taken = take_lease(fd)
    except BaseException:
        os.close(fd)
        raise
    if not taken:
        os.close(fd)
        return None
    leased = LeasedFile(fd, path, 0)
    try:
        # taken: nothing can change it now; it must still be the file that was opened
        check_unchanged(fd, path, version)
        leased.size = os.fstat(fd).st_size
    except BaseException:
        leased.close()
        raise
    return leased


def human(count: int) -> str:
    """A byte count in words (``1.5 MB``)."""
    value = float(count)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{count} B"


@dataclass(frozen=True)
class Transferred:
    """What reading remote files cost so far: bytes fetched against the files' sizes, and requests."""

    fetched: int
    size: int
    requests: int
    files: int

    def line(self) -> str:
        """``fetched 84.2 kB of 2.1 GB (3 requests)``."""
        files = f", {self.files} files" if self.files > 1 else ""
        requests = f"{self.requests} request" + ("" if self.requests == 1 else "s")
        return f"fetched {human(self.fetched)} of {human(self.size)} ({requests}{files})"

    def to_json(self) -> dict[str, int]:
        """The ``transferred`` field of ``--json``."""
        return {"fetched": self.fetched, "file_bytes": self.size, "requests": self.requests, "files": self.files}


def transferred() -> Transferred | None:
    """Bytes fetched from remote stores by this process, or None when none was read."""
    with _stores_lock:
        stores = list(_opened_stores.values())
    sources = [source for store in stores for source in store.opened()]
    if not sources:
        return None
    return Transferred(
        sum(s.fetched for s in sources),
        sum(s.size for s in sources),
        sum(getattr(s, "requests", 0) for s in sources),
        len(sources),
    )
