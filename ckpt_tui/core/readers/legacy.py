"""The legacy pre-1.6 format (a sequence of pickles, then raw storages) and plain pickles."""

from __future__ import annotations

import struct
import threading
from typing import BinaryIO

from ckpt_tui.core.dtypes import itemsize
from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.tree import Checkpoint, Storage
from ckpt_tui.core.unpickle import load_pickle, storage_from_pid

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001


class LegacyRecords:
    """Storages laid out after the pickles, each behind an 8-byte element count."""

    def __init__(self, path: str, file_bytes: int, storages: dict[str, Storage]):
        self.path = path
        self.keys: list[str] = []
        self.data_start = 0
        self.file_bytes = file_bytes
        self.storages = storages
        self._offsets: dict[str, tuple[int, int]] | None = None
        self._lock = threading.Lock()

    def _scan(self) -> dict[str, tuple[int, int]]:
        offsets: dict[str, tuple[int, int]] = {}
        position = self.data_start
        with open(self.path, "rb") as file:
            for key in self.keys:
                storage = self.storages.get(key)
                if storage is None:
                    raise ReadError(f"{self.path}: storage {key} is listed but never used")
                file.seek(position)
                head = file.read(8)
                if len(head) < 8:
                    raise ReadError(f"{self.path}: storage {key} is missing (file truncated)")
                (count,) = struct.unpack("<q", head)
                nbytes = count * itemsize(storage.dtype)
                if count < 0 or position + 8 + nbytes > self.file_bytes:
                    raise ReadError(f"{self.path}: storage {key} runs past the end of the file (truncated?)")
                offsets[key] = (position + 8, nbytes)
                position += 8 + nbytes
        return offsets

    def has(self, storage: Storage) -> bool:
        """Whether the storage is listed in the file's key list."""
        return storage.key in self.keys

    def locate(self, storage: Storage) -> tuple[int, int]:
        """Offset of the storage's data and its size, from one scan of the count headers."""
        with self._lock:
            if self._offsets is None:
                self._offsets = self._scan()
        found = self._offsets.get(storage.key)
        if found is None:
            raise ReadError(f"{self.path}: storage {storage.key} is missing from the file")
        return found


def read_pickle_file(path: str, file_bytes: int) -> Checkpoint:
    """Read a legacy torch file, or a plain pickle, without touching tensor data."""
    unsafe: set[str] = set()
    with open(path, "rb") as file:
        first = load_pickle(file, None, f"{path}: pickle", unsafe)
        if first != MAGIC_NUMBER:
            return Checkpoint(path, "pickle", first, file_bytes, unsafe_globals=unsafe)
        return _read_legacy(path, file, file_bytes)


def _read_legacy(path: str, file: BinaryIO, file_bytes: int) -> Checkpoint:
    what = f"{path}: legacy checkpoint"
    if load_pickle(file, None, what) != PROTOCOL_VERSION:
        raise ReadError(f"{what}: unsupported protocol version")
    sys_info = load_pickle(file, None, what)
    byteorder = "big" if isinstance(sys_info, dict) and sys_info.get("little_endian") is False else "little"
    cache: dict[str, Storage] = {}
    records = LegacyRecords(path, file_bytes, cache)

    def make(key: str, dtype: str, location: str, numel: int, type_name: str) -> Storage:
        storage = Storage(key, dtype, location, numel, records, type_name)
        if storage.nbytes > file_bytes:
            raise ReadError(f"{what}: storage {key} declares {storage.nbytes} bytes, more than the whole file")
        return storage

    unsafe: set[str] = set()
    root = load_pickle(file, lambda pid: storage_from_pid(pid, make, cache), what, unsafe)
    keys = load_pickle(file, None, what, unsafe)
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ReadError(f"{what}: storage key list is malformed")
    records.keys = keys
    records.data_start = file.tell()
    return Checkpoint(path, "legacy", root, file_bytes, byteorder=byteorder, unsafe_globals=unsafe)
