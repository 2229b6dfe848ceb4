"""Where a write lands: checking the target, the temporary file beside it, and the atomic rename.

Rules, in the order they are checked:

- a directory, a device, a pipe or a socket is never replaced, named directly or through any chain of
  symlinks (a link to ``/proc/self/fd/1`` is refused, not replaced by a file), and nothing in ``/dev``,
  ``/proc`` or ``/sys`` is written (``/dev/stdout`` is a link there), except the tmpfs ``/dev/shm``;
- an existing path needs ``force`` (a symlink is an existing path, even a dangling one);
- with ``force``, a symlink is replaced by the new regular file: the link goes, and whatever it
  pointed to (a blob in a cache, another user's file, the input itself) is left untouched;
- the new file keeps the permission bits of the file it replaces (of the link's target, for a
  symlink that resolves); a new file gets the umask's default, as ``open()`` would give it.

The temporary file is created with those permissions from the start, so a file that was private
is never readable by others while it is being written.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ckpt_tui.core.errors import WriteError
from ckpt_tui.core.model.describe import size
from ckpt_tui.core.writers import temp_files

NEW_FILE_MODE = 0o666
SYSTEM_FOLDERS = ("/dev", "/proc", "/sys")
"""Folders of devices and kernel files: no path in them, and no link that leads there, is ever written."""
WRITABLE_SYSTEM_FOLDERS = ("/dev/shm",)
MAX_LINKS = 40  # the kernel's own limit on a chain of symlinks


@dataclass(frozen=True)
class Target:
    """A checked output path: its folder, and the permission bits the new file gets (None: umask default)."""

    path: Path
    folder: Path
    mode: int | None
    new: bool = False
    """Nothing was at the path when it was checked: a file that appears there meanwhile is not replaced."""


def check_target(target: str | os.PathLike[str], force: bool, inputs: tuple[str, ...] = ()) -> Target:
    """Refuse what must not be replaced; say what will be."""
    path = Path(target)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        link = path.lstat()
    except FileNotFoundError:
        check_parent(folder)
        _refuse_system_paths(path)
        return Target(path, folder, None, new=True)
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(link.st_mode):
        return _check_symlink(path, folder, force, inputs)
    if stat.S_ISDIR(link.st_mode):
        raise WriteError(f"{path} is a directory")
    if not stat.S_ISREG(link.st_mode):
        raise WriteError(f"{path} is not a regular file (a device, pipe or socket?); refusing to replace it")
    _refuse_system_paths(path)
    if not force:
        what = "is the input file" if _is_input(path, inputs) else "exists"
        raise WriteError(f"{path} {what}; use --force to replace it")
    return Target(path, folder, stat.S_IMODE(link.st_mode))


def check_parent(folder: Path) -> None:
    """Refuse a parent folder that is missing or is not a folder (a file, a dangling link)."""
    if folder.is_dir():
        return
    if folder.is_symlink() and not folder.exists():
        raise WriteError(f"{folder} is a dangling symlink (to {os.readlink(folder)}), not a directory")
    if os.path.lexists(folder):
        raise WriteError(f"{folder} is not a directory")
    raise WriteError(f"{folder}: no such directory")


def check_folder_target(target: str | os.PathLike[str]) -> Path:
    """Refuse an output folder that is not new or empty, or that is a symlink (dangling or not): a
    folder of shards is renamed into place, and a link is neither followed nor replaced."""
    path = Path(target)
    parent = path.parent if str(path.parent) else Path(".")
    try:
        link = path.lstat()
    except FileNotFoundError:
        check_parent(parent)
        _refuse_system_paths(path)
        return path
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(link.st_mode):
        pointee = os.readlink(path)
        raise WriteError(f"{path} is a symlink (to {pointee}); sharded output goes to a new or empty folder")
    if not stat.S_ISDIR(link.st_mode):
        raise WriteError(f"{path} exists and is not a folder; sharded output goes to a new or empty folder")
    _refuse_system_paths(path)
    try:
        empty = not any(path.iterdir())
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None
    if not empty:
        raise WriteError(f"{path} is not an empty folder; sharded output goes to a new or empty folder")
    return path


def check_room(target: Target, needed: int) -> None:
    """Refuse before writing a byte when the output cannot fit in its folder's free space.

    A stride-0 view (``expand``) is a few bytes in a ``.pth`` but all of its elements in a
    ``.safetensors``: writing 4 TiB until the disk is full is worse than saying so at once.
    """
    try:
        free = shutil.disk_usage(target.folder).free
    except OSError:
        return  # nothing to measure; the write itself reports a full disk
    if needed > free:
        raise WriteError(f"{target.path}: the output needs {size(needed)} and {target.folder} has {size(free)} free")


def _in_system_folder(path: str) -> bool:
    """Whether ``path`` (its folder resolved) lies in /dev, /proc or /sys."""
    folder = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    full = os.path.join(folder, os.path.basename(path))
    inside = [root for root in SYSTEM_FOLDERS if full == root or full.startswith(root + "/")]
    return bool(inside) and not any(full.startswith(root + "/") for root in WRITABLE_SYSTEM_FOLDERS)


def _link_chain(path: Path) -> Iterator[str]:
    """``path`` and every path its chain of symlinks names, hop by hop (at most :data:`MAX_LINKS`)."""
    current = os.path.abspath(path)
    for _ in range(MAX_LINKS):
        yield current
        try:
            pointee = os.readlink(current)
        except OSError:
            return
        current = os.path.join(os.path.realpath(os.path.dirname(current)), pointee)


def _refuse_system_paths(path: Path) -> None:
    """Refuse a target in /dev, /proc or /sys, or a link that leads there through any hop."""
    for hop in _link_chain(path):
        if _in_system_folder(hop):
            via = "" if hop == os.path.abspath(path) else f" (it leads to {hop})"
            raise WriteError(f"{path} is a system path{via}; refusing to write there")


def _check_symlink(path: Path, folder: Path, force: bool, inputs: tuple[str, ...]) -> Target:
    pointee = os.readlink(path)
    try:
        resolved = path.stat()
    except OSError:
        resolved = None
    if resolved is not None and not stat.S_ISREG(resolved.st_mode):
        what = "a directory" if stat.S_ISDIR(resolved.st_mode) else "not a regular file (a device, pipe or socket?)"
        raise WriteError(f"{path} is a symlink to {pointee}, which is {what}; refusing to replace it")
    _refuse_system_paths(path)
    if not force:
        if resolved is None:
            what = f"is a dangling symlink (to {pointee})"
        elif _is_input(path, inputs):
            what = f"is a symlink to the input file ({pointee})"
        else:
            what = f"exists (a symlink to {pointee})"
        raise WriteError(f"{path} {what}; use --force to replace the link (its target is left as it is)")
    keep = stat.S_IMODE(resolved.st_mode) if resolved is not None else None
    return Target(path, folder, keep)


def _is_input(path: Path, inputs: tuple[str, ...]) -> bool:
    for name in inputs:
        with contextlib.suppress(OSError):
            if os.path.samefile(name, path):
                return True
    return False


class TempFile:
    """A hidden temporary file beside the target: registered for cleanup, renamed over the target on commit."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.path = ""
        self.file: BinaryIO | None = None
        self._syncing: threading.Thread | None = None
        self._sync_error: OSError | None = None

    def open(self) -> BinaryIO:
        """Create the file (never an existing one) with its final permissions."""
        name = self.target.path.name
        mode = NEW_FILE_MODE if self.target.mode is None else self.target.mode
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
        for _ in range(100):
            candidate = str(self.target.folder / f".{name}.{secrets.token_hex(4)}.tmp")
            temp_files.register(candidate)  # before it exists: a signal now finds nothing to remove, never a leftover
            try:
                fd = os.open(candidate, flags, mode)
            except FileExistsError:
                temp_files.unregister(candidate)
                continue
            except OSError as exc:
                temp_files.unregister(candidate)
                raise WriteError(f"cannot write in {self.target.folder}: {exc.strerror or exc}") from None
            self.path = candidate
            if self.target.mode is not None:
                os.fchmod(fd, self.target.mode)  # the umask may have taken bits the old file had
            self.file = os.fdopen(fd, "w+b")
            return self.file
        raise WriteError(f"cannot write in {self.target.folder}: no free temporary name")

    def start_sync(self) -> None:
        """Flush, then fsync in a background thread (fsync releases the GIL): verification runs meanwhile.

        :meth:`commit` waits for it before the rename, so the rename never precedes the data.
        """
        assert self.file is not None
        self.file.flush()
        fd = self.file.fileno()
        self._syncing = threading.Thread(target=self._fsync, args=(fd,), name="fsync", daemon=True)
        self._syncing.start()

    def _fsync(self, fd: int) -> None:
        try:
            os.fsync(fd)
        except OSError as exc:
            self._sync_error = exc

    def _wait_for_sync(self) -> None:
        if self._syncing is not None:
            self._syncing.join()
            self._syncing = None
        if self._sync_error is not None:
            raise self._sync_error

    def commit(self) -> None:
        """Wait for the data to be on disk, rename over the target (atomically) and make the rename durable."""
        self._wait_for_sync()
        self.close()
        if self.target.new:
            _put_new(Path(self.path), self.target.path)
        else:
            os.replace(self.path, self.target.path)
        temp_files.unregister(self.path)
        fsync_folder(self.target.folder)

    def close(self) -> None:
        """Close the file (kept on disk), once a background fsync of it has ended."""
        if self._syncing is not None:
            self._syncing.join()
            self._syncing = None
        if self.file is not None:
            self.file.close()
            self.file = None

    def discard(self) -> None:
        """Close and remove the temporary file (after a failure)."""
        with contextlib.suppress(OSError):
            self.close()
        if self.path:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            temp_files.unregister(self.path)


def _put_new(temp: Path, target: Path) -> None:
    """Put the finished file at a path that was free when the write began, never over a file that appeared there
    since (a second write to the same path, a copy): a hard link fails where a name exists, a rename would not."""
    try:
        os.link(temp, target)
    except FileExistsError:
        raise WriteError(
            f"{target} appeared while it was written (another write to it?): left as it is; run again with --force "
            "to replace it"
        ) from None
    except OSError:
        # (a file system without hard links: the name is checked just before the rename)
        if os.path.lexists(target):
            raise WriteError(f"{target} appeared while it was written (another write to it?): left as it is") from None
        os.replace(temp, target)
        return
    os.unlink(temp)


@contextlib.contextmanager
def temporary_beside(target: Target) -> Iterator[TempFile]:
    """A :class:`TempFile` that is removed unless committed, whatever ends the block."""
    temp = TempFile(target)
    try:
        yield temp
    except BaseException:
        temp.discard()
        raise


def fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (best effort: not every filesystem allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
