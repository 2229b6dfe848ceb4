"""torch zip checkpoints (torch >= 1.6) and TorchScript archives, metadata only."""

from __future__ import annotations

import struct
import threading
import zipfile
from typing import Any, BinaryIO

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model import Checkpoint, Storage
from ckpt_tui.core.unpickle import load_pickle, storage_from_pid

LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")


class ZipRecords:
    """Storage records of one folder (``data/`` or ``constants/``) inside a zip checkpoint."""

    def __init__(self, path: str, infos: dict[str, zipfile.ZipInfo], folder: str, file_bytes: int) -> None:
        self.path = path
        self.infos = infos
        self.folder = folder
        self.file_bytes = file_bytes
        self._file: BinaryIO | None = None
        self._lock = threading.Lock()

    def name(self, key: str) -> str:
        """The member name of a record key."""
        return self.folder + key

    def info(self, storage: Storage) -> zipfile.ZipInfo:
        """The central-directory entry of a storage's record."""
        info = self.infos.get(self.name(storage.key))
        if info is None:
            raise ReadError(f"storage record {self.name(storage.key)} is missing from the archive")
        return info

    def has(self, storage: Storage) -> bool:
        """Whether the archive holds the storage's record."""
        return self.name(storage.key) in self.infos

    def locate(self, storage: Storage) -> tuple[int, int]:
        """Offset of the record's bytes in the file (from its local header), and its size."""
        info = self.info(storage)
        if info.compress_type != zipfile.ZIP_STORED:
            raise ReadError(f"record {info.filename} is compressed; only stored records can be read in place")
        with self._lock:
            if self._file is None:
                self._file = open(self.path, "rb")  # noqa: SIM115 - kept open for repeated lookups
            self._file.seek(info.header_offset)
            header = self._file.read(LOCAL_HEADER.size)
        if len(header) < LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
            raise ReadError(f"record {info.filename}: bad local header (corrupt zip)")
        name_len, extra_len = LOCAL_HEADER.unpack(header)[-2:]
        offset = info.header_offset + LOCAL_HEADER.size + name_len + extra_len
        if offset + info.file_size > self.file_bytes:
            raise ReadError(f"record {info.filename} runs past the end of the file (truncated?)")
        if info.file_size < storage.nbytes:
            raise ReadError(f"record {info.filename} holds {info.file_size} bytes, its storage needs {storage.nbytes}")
        return offset, info.file_size

    def close(self) -> None:
        """Close the file handle kept for lookups."""
        if self._file is not None:
            self._file.close()
            self._file = None


def _open_zip(path: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:
        raise ReadError(f"{path}: not a readable zip archive ({exc}; truncated file?)") from None
    except (OSError, ValueError, struct.error, OverflowError) as exc:
        raise ReadError(f"{path}: corrupt zip archive ({exc})") from None


def _read_member(archive: zipfile.ZipFile, name: str, path: str) -> bytes:
    try:
        return archive.read(name)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, struct.error) as exc:
        raise ReadError(f"{path}: cannot read {name} ({exc})") from None


def _data_pkl_name(names: list[str], path: str) -> str:
    candidates = [n for n in names if n == "data.pkl" or n.endswith("/data.pkl")]
    if not candidates:
        raise ReadError(f"{path}: a zip archive, but not a torch checkpoint (no data.pkl inside)")
    return min(candidates, key=lambda n: n.count("/"))


def read_zip(path: str, file_bytes: int) -> Checkpoint:
    """Read a torch zip checkpoint or TorchScript archive without touching tensor data."""
    archive = _open_zip(path)
    with archive:
        infos = dict(archive.NameToInfo)
        data_name = _data_pkl_name(list(infos), path)
        prefix = data_name[: -len("data.pkl")]
        torchscript = prefix + "constants.pkl" in infos or any(n.startswith(prefix + "code/") for n in infos)
        byteorder = "little"
        if prefix + "byteorder" in infos:
            byteorder = _read_member(archive, prefix + "byteorder", path).decode("ascii", "replace").strip() or "little"
        pickles = {"data": _read_member(archive, data_name, path)}
        if torchscript and prefix + "constants.pkl" in infos:
            pickles["constants"] = _read_member(archive, prefix + "constants.pkl", path)
    loaded: dict[str, Any] = {}
    for folder, data in pickles.items():
        records = ZipRecords(path, infos, f"{prefix}{folder}/", file_bytes)
        loaded[folder] = _load(data, records, f"{path}: {prefix}{folder}.pkl")
    if not torchscript:
        return Checkpoint(path, "zip", loaded["data"], file_bytes, byteorder=byteorder)
    root: Any = loaded["data"]
    if loaded.get("constants"):
        root = {"module": loaded["data"], "constants": loaded["constants"]}
    note = "TorchScript archive: its code/ is listed, never run"
    return Checkpoint(path, "torchscript", root, file_bytes, byteorder=byteorder, notes=[note])


def _load(data: bytes, records: ZipRecords, what: str) -> Any:
    cache: dict[str, Storage] = {}

    def make(key: str, dtype: str, location: str, numel: int, type_name: str) -> Storage:
        return Storage(key, dtype, location, numel, records, type_name)

    return load_pickle(data, lambda pid: storage_from_pid(pid, make, cache), what)
