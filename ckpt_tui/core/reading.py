"""Open any checkpoint: detect its format by content and read its metadata only."""

from __future__ import annotations

import os

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.readers.dcp import read_dcp
from ckpt_tui.core.readers.legacy import read_pickle_file
from ckpt_tui.core.readers.safetensors_file import read_safetensors
from ckpt_tui.core.readers.sharded import read_sharded
from ckpt_tui.core.readers.torch_zip import read_zip
from ckpt_tui.core.tree import Checkpoint, check_tree

INDEX_SUFFIX = ".index.json"


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read a checkpoint's tree without running its pickle or reading tensor data."""
    text = os.fspath(path)
    try:
        checkpoint = _open(text)
    except ReadError:
        raise
    except PermissionError:
        raise ReadError(f"{text}: permission denied") from None
    except IsADirectoryError:
        raise ReadError(f"{text}: is a directory, not a checkpoint") from None
    except OSError as exc:
        raise ReadError(f"{text}: {exc.strerror or exc}") from None
    check_depth(checkpoint.root, text)
    return checkpoint


def check_depth(root: object, path: str) -> None:
    """Refuse trees no real checkpoint has: nested too deep, ints too long to print, tensors past int64."""
    try:
        check_tree(root)
    except ReadError as exc:
        raise ReadError(f"{path}: {exc}") from None


def _open(path: str) -> Checkpoint:
    if not os.path.exists(path):
        raise ReadError(f"{path}: no such file or directory")
    if os.path.isdir(path):
        return _open_directory(path)
    return _open_file(path)


def _open_directory(path: str) -> Checkpoint:
    if os.path.isfile(os.path.join(path, ".metadata")):
        return read_dcp(path)
    indexes = sorted(n for n in os.listdir(path) if n.endswith(INDEX_SUFFIX))
    if len(indexes) == 1:
        return read_sharded(os.path.join(path, indexes[0]), _open_file)
    if indexes:
        raise ReadError(f"{path}: several index files ({', '.join(indexes)}); open one of them")
    raise ReadError(f"{path}: is a directory, not a checkpoint (no .metadata or *{INDEX_SUFFIX} inside)")


PROTOCOL0_STARTS = b"c(}])NIFSVLgp"


def detect_format(head: bytes, file_bytes: int, last: bytes = b"") -> str:
    """The container kind from a file's first (and last) bytes: zip, pickle, safetensors, json, tar, unknown."""
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if head[:1] == b"\x80" and len(head) > 1 and 0 < head[1] <= 5:
        return "pickle"
    if head[:1] and head[0] in PROTOCOL0_STARTS and last == b".":
        return "pickle"
    if len(head) >= 9 and head[8:9] == b"{":
        return "safetensors"  # its reader checks the declared header length against the file
    if head.lstrip()[:1] == b"{":
        return "json"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    return "unknown"


def _open_file(path: str) -> Checkpoint:
    file_bytes = os.path.getsize(path)
    if file_bytes == 0:
        raise ReadError(f"{path}: empty file")
    with open(path, "rb") as file:
        head = file.read(512)
        file.seek(-1, os.SEEK_END)
        last = file.read(1)
    kind = detect_format(head, file_bytes, last)
    if kind == "zip":
        return read_zip(path, file_bytes)
    if kind == "pickle":
        return read_pickle_file(path, file_bytes)
    if kind == "safetensors":
        return read_safetensors(path, file_bytes)
    if kind == "json":
        return read_sharded(path, _open_file)
    if kind == "tar":
        raise ReadError(f"{path}: a tar archive (the pre-0.4 torch format is not supported)")
    if _looks_like_text(head):
        raise ReadError(f"{path}: a text file, not a checkpoint")
    raise ReadError(f"{path}: not a checkpoint (unrecognised content: {head[:8].hex(' ')})")


def _looks_like_text(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
