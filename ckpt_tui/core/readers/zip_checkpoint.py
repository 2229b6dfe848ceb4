"""A zip archive torch wrote: a checkpoint (``torch.save``) or a TorchScript archive (``torch.jit.save``,
told apart by its ``constants.pkl``)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.tree import Checkpoint
from ckpt_tui.core.readers.pth_columns import state_dict_columns
from ckpt_tui.core.readers.torch_zip import (
    ZipLayout,
    ZipRecords,
    check_version,
    load_with_records,
    member_pickle,
    zip_byteorder,
)
from ckpt_tui.core.readers.zip_archive import ZipDirectory, read_central_directory

PickleRead = Callable[[str, ZipDirectory], None]
_pickle_read: contextvars.ContextVar[PickleRead | None] = contextvars.ContextVar("pickle_read", default=None)


@contextlib.contextmanager
def when_pickle_read(callback: PickleRead) -> Iterator[None]:
    """Call ``callback(path, entries)`` as soon as a zip checkpoint's data.pkl has been read, before its tree
    is built: ``entries`` keeps the bytes read (:meth:`ZipDirectory.read_kept`), so work started then (the
    weights_only scan in a forked child) judges the bytes the tree is built from, while the tree is built."""
    token = _pickle_read.set(callback)
    try:
        yield
    finally:
        _pickle_read.reset(token)


def read_zip(
    path: str,
    file_bytes: int,
    known_classes: frozenset[str] = frozenset(),
    extra_globals: Mapping[str, Any] | None = None,
) -> Checkpoint:
    """Read a torch zip checkpoint or TorchScript archive without touching tensor data.

    ``known_classes`` and ``extra_globals`` are passed to the safe unpickler for data.pkl (formats that
    torch.save writes inside a zip, such as distributed state_dicts).
    """
    try:
        with places.open_stream(path) as file:
            layout = ZipLayout(path, read_central_directory(file, file_bytes), file_bytes)
            byteorder = zip_byteorder(file, layout, file_bytes)
            check_version(file, layout, file_bytes)
            # torch.load tells TorchScript by the exact name in its record list (CONSTANTS.PKL is not one)
            if layout.entries.listed(layout.prefix + "constants.pkl"):
                from ckpt_tui.core.readers.torchscript import read_torchscript  # (rare: not imported to read a .pth)

                return read_torchscript(path, file, file_bytes, layout, byteorder)
            data = member_pickle(file, layout, "data.pkl", file_bytes)
    except ReadError as exc:
        message = str(exc)
        raise ReadError(message if message.startswith(path) else f"{path}: {message}") from None
    callback = _pickle_read.get()
    if callback is not None:
        callback(path, layout.entries)
    records = ZipRecords(path, layout.entries, layout.prefix + "data/", file_bytes)
    unsafe: set[str] = set()
    root, problems = load_with_records(
        data,
        records,
        "",
        f"{path}: {layout.data_pkl}",
        unsafe,
        known_classes=known_classes,
        extra_globals=extra_globals,
    )
    columns = state_dict_columns(root) if not records.lacking else None  # (a missing record: the walk says so)
    return Checkpoint(
        path,
        "zip",
        root,
        file_bytes,
        byteorder=byteorder,
        notes=layout.notes,
        unsafe_globals=unsafe,
        loader_problems=layout.problems + problems,
        hostile=layout.hostile,
        columns=columns,
        archive=records,
    )
