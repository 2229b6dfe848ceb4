"""Storages whose bytes are made while the file is written, not copied from a file: a cast of another
storage, or bytes held in memory. Readers and edits make them; writers produce their bytes."""

from __future__ import annotations

from ckpt_tui.core.errors import EditError
from ckpt_tui.core.model.tree import Storage


class CastSource:
    """Where a cast storage's bytes come from: another storage, converted when saved."""

    in_place = False
    """Its storages' bytes are made while a file is written (never copied from one range of a file)."""

    def __init__(self, base: Storage) -> None:
        self.base = base
        self.path = ""

    def locate(self, storage: Storage) -> tuple[int, int]:
        """Cast bytes exist only in the saved file."""
        raise EditError("the values of a cast tensor exist once it is saved")


class MemorySource:
    """A storage whose bytes are held in memory (sanitize turns numpy arrays into tensors); written as they are."""

    in_place = False
    """Its storages' bytes are made while a file is written (never copied from one range of a file)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.path = ""

    def locate(self, storage: Storage) -> tuple[int, int]:
        """These bytes are in no file until saved."""
        raise EditError("the values of a rewritten tensor exist once it is saved")
