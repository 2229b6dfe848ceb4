"""Open any checkpoint: detect its format by content and read its metadata only."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Sequence

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.readers.dcp import dcp_folder_of, read_dcp
from ckpt_tui.core.readers.deepspeed import deepspeed_folder, read_deepspeed
from ckpt_tui.core.readers.distributed_globals import DISTRIBUTED_CLASSES, DISTRIBUTED_GLOBALS
from ckpt_tui.core.readers.legacy import read_pickle_file
from ckpt_tui.core.readers.rank_set import merge_ranks, with_ranks
from ckpt_tui.core.readers.safetensors_file import read_safetensors
from ckpt_tui.core.readers.sharded import read_sharded
from ckpt_tui.core.readers.torch_zip import read_zip
from ckpt_tui.core.tree import Checkpoint, children, has_children

INDEX_SUFFIX = ".index.json"
MAX_DEPTH = 100


PathArg = str | os.PathLike[str]


def open_checkpoint(path: PathArg | Sequence[PathArg]) -> Checkpoint:
    """Read a checkpoint's tree without running its pickle or reading tensor data.

    Several paths open together as one checkpoint: per-rank files (FSDP/DTensor shards assembled,
    DDP copies side by side).
    """
    if isinstance(path, (list, tuple)):
        paths = [os.fspath(p) for p in path]
        if not paths:
            raise ReadError("no checkpoint given")
        if len(paths) > 1:
            return _guarded(" ".join(paths), lambda: merge_ranks(paths, [_open_member(p) for p in paths]))
        path = paths[0]
    text = os.fspath(path)  # type: ignore[arg-type]
    return _guarded(text, lambda: _open(text))


def _guarded(text: str, read: Callable[[], Checkpoint]) -> Checkpoint:
    try:
        checkpoint = read()
    except ReadError:
        raise
    except PermissionError:
        raise ReadError(f"{text}: permission denied") from None
    except IsADirectoryError:
        raise ReadError(f"{text}: is a directory, not a checkpoint") from None
    except OSError as exc:
        raise ReadError(f"{text}: {exc.strerror or exc}") from None
    check_depth(checkpoint.root, text)
    gc.freeze()
    return checkpoint


def check_depth(root: object, path: str) -> None:
    """Refuse trees nested deeper than any real checkpoint (they only serve to exhaust recursion)."""
    seen: set[int] = set()
    stack: list[tuple[object, int]] = [(root, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ReadError(f"{path}: nested more than {MAX_DEPTH} levels deep (not a real checkpoint)")
        if id(value) in seen or not has_children(value):
            continue
        seen.add(id(value))
        stack.extend((child, depth + 1) for _, child in children(value))


def _open(path: str) -> Checkpoint:
    if not os.path.exists(path):
        raise ReadError(f"{path}: no such file or directory")
    if os.path.isdir(path):
        return _open_directory(path)
    return _open_file(path)


def _open_directory(path: str) -> Checkpoint:
    if os.path.isfile(os.path.join(path, ".metadata")):
        return read_dcp(path)
    zero = deepspeed_folder(path)
    if zero is not None:
        return read_deepspeed(zero, _open_plain_file)
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
    folder = dcp_folder_of(path)
    if folder is not None:  # one file of a DCP folder opens the whole folder
        return read_dcp(folder)
    zero = deepspeed_folder(path)
    if zero is not None:  # one file of a DeepSpeed ZeRO checkpoint opens the whole tag folder
        return read_deepspeed(zero, _open_plain_file)
    return with_ranks(path, _open_plain_file(path), _open_plain_file)


def _open_plain_file(path: str) -> Checkpoint:
    """One file on its own, by its content."""
    file_bytes = os.path.getsize(path)
    if file_bytes == 0:
        raise ReadError(f"{path}: empty file")
    with open(path, "rb") as file:
        head = file.read(512)
        file.seek(-1, os.SEEK_END)
        last = file.read(1)
    kind = detect_format(head, file_bytes, last)
    if kind == "zip":
        return read_zip(path, file_bytes, DISTRIBUTED_CLASSES, DISTRIBUTED_GLOBALS)
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


def _open_member(path: str) -> Checkpoint:
    """One of several files named together: read as it is (folders as folders)."""
    if os.path.isfile(path) and dcp_folder_of(path) is None and deepspeed_folder(path) is None:
        return _open_plain_file(path)
    return _open(path)
