"""torch zip checkpoints (torch >= 1.6) and TorchScript archives, metadata only."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, BinaryIO

from ckpt_tui.core.dtypes import DTYPES
from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.readers.zip_archive import STORED, ZipEntry, data_offset, read_central_directory, read_member
from ckpt_tui.core.tree import Checkpoint, Storage
from ckpt_tui.core.unpickle import load_pickle, storage_from_pid


class ZipRecords:
    """Storage records of one folder (``data/`` or ``constants/``) inside a zip checkpoint."""

    def __init__(self, path: str, entries: dict[str, ZipEntry], folder: str, file_bytes: int) -> None:
        self.path = path
        self.entries = entries
        self.folder = folder
        self.file_bytes = file_bytes
        self._file: BinaryIO | None = None
        self._lock = threading.Lock()
        self._offsets: dict[str, int] = {}

    def name(self, key: str) -> str:
        """The member name of a record key."""
        return self.folder + key

    def entry(self, storage: Storage) -> ZipEntry:
        """The central-directory entry of a storage's record."""
        entry = self.entries.get(self.name(storage.key))
        if entry is None:
            raise ReadError(f"storage record {self.name(storage.key)} is missing from the archive")
        return entry

    def has(self, storage: Storage) -> bool:
        """Whether the archive holds the storage's record."""
        return self.name(storage.key) in self.entries

    def locate(self, storage: Storage) -> tuple[int, int]:
        """Offset of the record's bytes in the file (from its local header), and its size."""
        entry = self.entry(storage)
        if entry.compress != STORED:
            raise ReadError(f"record {entry.name} is compressed; only stored records can be read in place")
        offset = self._offsets.get(entry.name)
        if offset is None:
            with self._lock:
                if self._file is None:
                    self._file = open(self.path, "rb")  # noqa: SIM115 - kept open for repeated lookups
                offset = self._offsets[entry.name] = data_offset(self._file, entry)
        if offset + entry.size > self.file_bytes:
            raise ReadError(f"record {entry.name} runs past the end of the file (truncated?)")
        if entry.size < storage.nbytes:
            raise ReadError(f"record {entry.name} holds {entry.size} bytes, its storage needs {storage.nbytes}")
        return offset, entry.size


def _data_pkl_name(names: list[str], path: str) -> str:
    candidates = [n for n in names if n == "data.pkl" or n.endswith("/data.pkl")]
    if not candidates:
        raise ReadError(f"{path}: a zip archive, but not a torch checkpoint (no data.pkl inside)")
    return min(candidates, key=lambda n: n.count("/"))


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
        with open(path, "rb") as file:
            entries = read_central_directory(file, file_bytes)
            data_name = _data_pkl_name(list(entries), path)
            prefix = data_name[: -len("data.pkl")]
            torchscript = prefix + "constants.pkl" in entries or any(n.startswith(prefix + "code/") for n in entries)
            byteorder = "little"
            if prefix + "byteorder" in entries:
                raw = read_member(file, entries[prefix + "byteorder"], file_bytes, limit=16)
                byteorder = raw.decode("ascii", "replace").strip() or "little"
            pickles = {"data": read_member(file, entries[data_name], file_bytes)}
            if torchscript and prefix + "constants.pkl" in entries:
                pickles["constants"] = read_member(file, entries[prefix + "constants.pkl"], file_bytes)
    except ReadError as exc:
        raise ReadError(f"{path}: {exc}") from None
    if byteorder not in ("little", "big"):
        raise ReadError(f"{path}: unknown byteorder record {byteorder!r}")
    loaded: dict[str, Any] = {}
    unsafe: set[str] = set()
    for folder, data in pickles.items():
        records = ZipRecords(path, entries, f"{prefix}{folder}/", file_bytes)
        what = f"{path}: {prefix}{folder}.pkl"
        if folder == "data":
            loaded[folder] = _load(data, records, what, unsafe, known_classes, extra_globals)
        else:
            loaded[folder] = _load(data, records, what, unsafe)
    if not torchscript:
        return Checkpoint(path, "zip", loaded["data"], file_bytes, byteorder=byteorder, unsafe_globals=unsafe)
    root: Any = loaded["data"]
    if loaded.get("constants"):
        root = {"module": loaded["data"], "constants": loaded["constants"]}
    note = "TorchScript archive: its code/ is listed, never run"
    return Checkpoint(path, "torchscript", root, file_bytes, byteorder=byteorder, notes=[note], unsafe_globals=unsafe)


def _load(
    data: bytes,
    records: ZipRecords,
    what: str,
    unsafe: set[str],
    known_classes: frozenset[str] = frozenset(),
    extra_globals: Mapping[str, Any] | None = None,
) -> Any:
    cache: dict[str, Storage] = {}
    entries, folder = records.entries, records.folder

    def make(key: str, dtype: str, location: str, numel: int, type_name: str) -> Storage:
        entry = entries.get(folder + key)
        declared = numel * DTYPES[dtype][0]
        if entry is not None and entry.size < declared:
            raise ReadError(
                f"{what}: storage {folder + key} declares {declared} bytes but its record holds {entry.size}"
            )
        return Storage(key, dtype, location, numel, records, type_name)

    return load_pickle(
        data,
        lambda pid: storage_from_pid(pid, make, cache),
        what,
        unsafe,
        known_classes=known_classes,
        extra_globals=extra_globals,
    )
