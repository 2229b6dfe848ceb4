"""DCP items stored through torch's stream extensions (``FileSystemWriter(_extensions=[ZStandard()])``).

torch names each compressed item's extensions in ``.metadata`` (``transform_descriptors``:
``["stream.zstd/1"]``) and reads the item back through them in that order, each with the library it finds
(``zstandard``'s ``stream_reader``, else ``pyzstd``), before ``torch.load`` (a tensor) or the planner (a
non-tensor item) sees it. Here the item's stream is decompressed the same way into a private temporary file
(kept for the process: the tensors read from it later point at it), and read from there as an uncompressed
item is read from its ``.distcp`` file. Nothing is decompressed past the size the item can hold.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from typing import IO, Any

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.byte_source import human
from ckpt_tui.core.runtime.leaving import remove_on_leaving

ZSTD = "stream.zstd"
"""The one stream extension torch registers (``torch.distributed.checkpoint._extension.ZStandard``)."""
LIBRARIES = ("zstandard", "pyzstd")
"""What torch decompresses with, first found first."""
INSTALL = "pip install 'ckpt-tui[zstd]'"
BYTES_ITEM_MOST = 256 << 20
"""A compressed non-tensor item is decompressed up to this size (or 64 times its stored size, if more)."""
SLACK = 1 << 20
"""What a tensor item holds besides its storage (``torch.save``'s pickle, record headers, alignment)."""
CHUNK = 1 << 20


def check_descriptors(descriptors: object, what: str) -> tuple[str, ...]:
    """An item's ``transform_descriptors`` as torch reads them (``NAME/VERSION``, each a known extension of
    version 1), or a one-line refusal: an extension torch does not know, or no library to decompress with."""
    if descriptors is None:
        return ()
    if not isinstance(descriptors, (list, tuple)) or not all(isinstance(d, str) for d in descriptors):
        raise ReadError(f"{what}: malformed transform_descriptors {descriptors!r}")
    for descriptor in descriptors:
        name, _, version = descriptor.partition("/")
        if name != ZSTD or version.partition(".")[0] != "1":
            raise ReadError(f"{what}: stored through the DCP extension {descriptor!r}, which torch does not know")
    if descriptors:
        _stream_reader(what)
        # (the folder its items are decompressed into is made here, as it is opened: never first in a child)
        _PLAIN.place()
    return tuple(descriptors)


def _stream_reader(what: str) -> Callable[[IO[bytes]], IO[bytes]]:
    """A zstd stream reader from the library torch would use (``zstandard``, else ``pyzstd``), or a one-line
    refusal naming what to install."""
    for library in LIBRARIES:
        try:
            module: Any = importlib.import_module(library)
        except ImportError:
            continue
        if library == "zstandard":
            # (as torch reads it: the first frame of the item's stream)
            return lambda stream: module.ZstdDecompressor().stream_reader(stream)
        return lambda stream: module.ZstdFile(stream)
    raise ReadError(
        f"{what}: compressed with zstd (torch's DCP extension, FileSystemWriter(_extensions=[ZStandard()])); "
        f"reading it needs zstandard, as torch's reading does: {INSTALL}"
    )


class _Plain:
    """Decompressed items, each in its own file of one private folder, made as a compressed folder is opened and
    removed as the process that made it leaves (a forked child writes its items into its parent's folder: they go
    with it)."""

    def __init__(self) -> None:
        self.folder: str | None = None
        self.made: dict[tuple[str, int, int, str], tuple[str, int]] = {}
        self.lock = threading.Lock()

    def place(self) -> str:
        with self.lock:
            if self.folder is None:
                folder = self.folder = tempfile.mkdtemp(prefix="ckpt-tui-dcp-")
                remove_on_leaving(lambda: shutil.rmtree(folder, ignore_errors=True))
            return self.folder

    def new_file(self) -> str:
        """A fresh file of the folder (unique across the processes that share it)."""
        handle, path = tempfile.mkstemp(prefix="item", dir=self.place())
        os.close(handle)
        return path


_PLAIN = _Plain()


def plain_item(
    path: str, start: int, length: int, descriptors: Sequence[str], most: int, what: str
) -> tuple[str, int, int]:
    """Where an item's bytes lie as ``torch.load`` is given them: its own range, or (compressed) a private file
    holding them decompressed, made once. ``most``: the size the item can hold, past which it is refused."""
    if not descriptors:
        return path, start, length
    # (a file changed since, reopened in the same process, is decompressed anew)
    version = places.source_of(path).identity if places.is_remote(path) else places.version_of(path)
    key = (path, start, length, version or "")
    with _PLAIN.lock:
        made = _PLAIN.made.get(key)
    if made is None:
        target = _PLAIN.new_file()
        made = (target, _decompress(path, start, length, descriptors, most, what, target))
        with _PLAIN.lock:
            made = _PLAIN.made.setdefault(key, made)
    return made[0], 0, made[1]


def _decompress(
    path: str, start: int, length: int, descriptors: Sequence[str], most: int, what: str, target: str
) -> int:
    """Decompress ``path[start:start+length]`` through each extension in turn into ``target``; its size."""
    from ckpt_tui.core.readers.embedded_zip import FileRange

    reader = _stream_reader(what)
    with places.open_stream(path) as file, open(target, "wb") as out:
        stream: IO[bytes] = FileRange(file, start, length)  # type: ignore[assignment]
        for _ in descriptors:
            stream = reader(stream)
        written = 0
        try:
            while chunk := stream.read(CHUNK):
                written += len(chunk)
                if written > most:
                    raise ReadError(
                        f"{what}: decompresses to more than {human(most)}, more than the item can hold; refused"
                    )
                out.write(chunk)
        except ReadError:
            raise
        except Exception as exc:  # the library's own failure (a corrupt frame), in one line
            raise ReadError(f"{what}: its zstd stream cannot be decompressed ({type(exc).__name__}: {exc})") from None
    return written


def bytes_item_most(length: int) -> int:
    """How far a compressed non-tensor item of ``length`` stored bytes is decompressed."""
    return max(BYTES_ITEM_MOST, 64 * length)
