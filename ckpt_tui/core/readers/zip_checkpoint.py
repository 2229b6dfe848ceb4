"""A zip archive torch wrote: a checkpoint (``torch.save``) or a TorchScript archive (``torch.jit.save``,
told apart by its ``constants.pkl``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.tree import PENDING_ROOT, Checkpoint
from ckpt_tui.core.readers.pth_columns import plain_columns, state_dict_columns
from ckpt_tui.core.readers.read_once import pickle_read
from ckpt_tui.core.readers.torch_zip import (
    NotTorchZip,
    ZipLayout,
    ZipRecords,
    check_version,
    load_with_records,
    member_pickle,
    zip_byteorder,
)
from ckpt_tui.core.readers.zip_archive import read_central_directory


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
    pickle_read(path, layout.entries)
    records = ZipRecords(path, layout.entries, layout.prefix + "data/", file_bytes)
    unsafe: set[str] = set()
    # torch.save(model.state_dict()): its columns straight from the pickle, no tensor object made
    columns = plain_columns(data, records)
    if columns is not None:
        root: Any = PENDING_ROOT
        problems: list[str] = []
    else:
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


def not_torch_zip(path: str, file_bytes: int) -> bool:
    """Whether a zip archive surely is no torch checkpoint: its listing reads and holds no ``data.pkl`` (a wheel,
    a zip of images). One that cannot be read is doubt: it is opened, and refused in one line there."""
    try:
        with places.open_stream(path) as file:
            ZipLayout(path, read_central_directory(file, file_bytes), file_bytes)
    except NotTorchZip:
        return True
    except (OSError, ReadError):
        return False
    return False
