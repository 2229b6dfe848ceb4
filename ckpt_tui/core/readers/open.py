"""Open any checkpoint: detect its format by content, as the real loaders do, and read its metadata only.

The order follows the loaders. The ``safetensors`` library reads a file whose header validates,
whatever its name; ``torch.load`` hands any path ending in ``.safetensors`` to that library, reads a
file starting with a zip local header as a zip checkpoint, tries every other file as a pre-0.4 tar
archive (Python's ``tarfile``), and unpickles what is left. Here a validated safetensors header wins
first (its length can start with ``\\x80\\x02`` like a pickle); then zip, tar, an index JSON, and a
pickle. A file that two loaders read differently (a polyglot) is shown as one of them, with the other
reading in ``loader_problems``.
"""

from __future__ import annotations

import codecs
import os
import pickletools
import threading
from collections.abc import Callable, Sequence
from typing import BinaryIO

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.formats import format_name
from ckpt_tui.core.model.tree import Checkpoint, check_tree
from ckpt_tui.core.pickles.unpickle import load_pickle
from ckpt_tui.core.readers.dcp import dcp_folder_of, read_dcp
from ckpt_tui.core.readers.deepspeed import deepspeed_folder, read_deepspeed
from ckpt_tui.core.readers.distributed_globals import DISTRIBUTED_CLASSES, DISTRIBUTED_GLOBALS
from ckpt_tui.core.readers.folder import checkpoint_files, read_folder
from ckpt_tui.core.readers.hf_dcp import hf_dcp_folder, read_hf_dcp, sharding_info
from ckpt_tui.core.readers.legacy import read_pickle_file
from ckpt_tui.core.readers.rank_set import holds_sharded, merge_ranks, rank_folder, with_ranks
from ckpt_tui.core.readers.safetensors_file import (
    NotSafetensors,
    length_problem,
    looks_like_safetensors,
    read_safetensors,
)
from ckpt_tui.core.readers.sharded import read_sharded
from ckpt_tui.core.readers.zip_checkpoint import read_zip

INDEX_SUFFIX = ".index.json"
ZIP_STARTS = (b"PK\x03\x04", b"PK\x05\x06")
TORCH_ZIP_START = b"PK\x03\x04"
TAR_BLOCK = 512
PICKLE_OPCODES = frozenset(op.code.encode("latin-1")[0] for op in pickletools.opcodes)


PathArg = str | os.PathLike[str]


def open_checkpoint(path: PathArg | Sequence[PathArg]) -> Checkpoint:
    """Read a checkpoint's tree without running its pickle or reading tensor data.

    Several paths open together as one checkpoint: per-rank files (FSDP/DTensor shards assembled,
    DDP copies side by side).
    """
    _serve_urls([os.fspath(p) for p in path] if isinstance(path, (list, tuple)) else [os.fspath(path)])  # type: ignore[arg-type]
    if isinstance(path, (list, tuple)):
        paths = [os.fspath(p) for p in path]
        if not paths:
            raise ReadError("no checkpoint given")
        if len(paths) > 1:
            return _guarded(" ".join(paths), lambda: merge_ranks(paths, [_open_member(p) for p in paths]))
        path = paths[0]
    text = os.fspath(path)  # type: ignore[arg-type]
    return _guarded(text, lambda: _open(text))


def _serve_urls(paths: list[str]) -> None:
    """Make the remote stores ready when a URL is among ``paths`` (nothing is imported for local paths)."""
    if any(map(places.is_remote, paths)):
        from ckpt_tui.core.model import remote_stores

        remote_stores.register()


_opened = threading.local()
"""``checked``: the root :func:`_open_file` last checked and returned unchanged, in this thread."""


def _guarded(text: str, read: Callable[[], Checkpoint]) -> Checkpoint:
    _opened.checked = None
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
    places.remember_opened()
    checked, _opened.checked = getattr(_opened, "checked", None), None
    if checked is not checkpoint.root:  # a tree is checked once (each walk of 50,000 tensors costs)
        check_depth(checkpoint.root, text)
    return checkpoint


def check_depth(root: object, path: str) -> None:
    """Refuse trees no real checkpoint has: nested too deep, ints too long to print, tensors past int64."""
    try:
        check_tree(root)
    except ReadError as exc:
        raise ReadError(f"{path}: {exc}") from None


def _open(path: str) -> Checkpoint:
    if places.is_remote(path) and places.is_file(path):
        return _open_file(path)  # (a store's folder is a listing: asked only when the URL is no file)
    if not places.exists(path):
        raise ReadError(f"{path}: no such file or directory")
    if places.is_dir(path):
        return _open_directory(path)
    return _open_file(path)


def _open_directory(path: str) -> Checkpoint:
    if places.is_file(places.join(path, ".metadata")):
        return read_dcp(path, _open_plain_file)
    zero = deepspeed_folder(path)
    if zero is not None:
        return read_deepspeed(zero, _open_plain_file)
    indexes = sorted(n for n in places.list_dir(path) if n.endswith(INDEX_SUFFIX))
    hf_dcp = None if indexes else hf_dcp_folder(path)
    if hf_dcp is not None:  # torch's HuggingFaceStorageWriter(save_distributed=True): per-rank safetensors
        return read_hf_dcp(path, hf_dcp, open_shard)
    if len(indexes) == 1:
        return read_sharded(places.join(path, indexes[0]), open_shard)
    if indexes:
        raise ReadError(f"{path}: several index files ({', '.join(indexes)}); open one of them")
    files = checkpoint_files(path)
    ranks = rank_folder(path, files)
    opened: dict[str, Checkpoint] = {}

    def member(file: str) -> Checkpoint:
        if file not in opened:
            opened[file] = open_shard(file)
        return opened[file]

    if ranks is not None and holds_sharded(member(ranks[0])):  # FSDP1/DTensor state_dicts, one file per rank
        # the merged tree is checked as a whole when it is returned (as a rank file's siblings are): the
        # ranks' ShardedTensor/DTensor internals are read only through their checked fields
        merged = merge_ranks(ranks, [member(p) for p in ranks])
        merged.path = path
        return merged
    if files:  # Accelerate's save_state: model.safetensors, optimizer.bin, scheduler.bin, ...
        return read_folder(path, files, lambda file: opened.pop(file, None) or open_shard(file))
    raise ReadError(
        f"{path}: is a directory, not a checkpoint (no .metadata, *{INDEX_SUFFIX} or checkpoint files inside)"
    )


def open_shard(path: str) -> Checkpoint:
    """Open one shard of a sharded checkpoint: any single-file format, never another index."""
    return _open_plain_file(path, allow_index=False)


def _open_file(path: str) -> Checkpoint:
    folder = dcp_folder_of(path)
    if folder is not None:  # one file of a DCP folder opens the whole folder
        return read_dcp(folder, _open_plain_file)
    zero = deepspeed_folder(path)
    if zero is not None:  # one file of a DeepSpeed ZeRO checkpoint opens the whole tag folder
        return read_deepspeed(zero, _open_plain_file)
    checkpoint = _open_plain_file(path)
    if sharding_info(checkpoint) is not None:  # one rank's file of an HF-DCP folder opens the whole folder
        folder = places.parent(path)
        names = hf_dcp_folder(folder)
        if names is not None and len(names) > 1:
            return read_hf_dcp(folder, names, open_shard)
    _check_opened(checkpoint, path)  # before anything else walks it
    opened = with_ranks(path, checkpoint, _open_plain_file)
    if opened is checkpoint:
        _opened.checked = checkpoint.root
    return opened


def _open_member(path: str) -> Checkpoint:
    """One of several files named together: read as it is (folders as folders)."""
    if places.is_file(path) and dcp_folder_of(path) is None and deepspeed_folder(path) is None:
        checkpoint = _open_plain_file(path)
    else:
        checkpoint = _open(path)
    _check_opened(checkpoint, path)  # each member before the ranks are merged
    return checkpoint


def _check_opened(checkpoint: Checkpoint, path: str) -> None:
    """:func:`check_depth` on a file's tree, unless its reader checked it as it built its columns."""
    if checkpoint.flat_columns() is None:
        check_depth(checkpoint.root, path)


def _open_plain_file(path: str, allow_index: bool = True) -> Checkpoint:
    """One file on its own, by its content."""
    with places.open_stream(path) as file:  # a FIFO, a device or stdin is refused here, never waited on
        head = file.read(512)
    file_bytes = places.size_of(path)
    if file_bytes == 0:
        raise ReadError(f"{path}: empty file")
    framing_error: NotSafetensors | None = None
    if looks_like_safetensors(head, file_bytes):
        try:
            return _with_other_readings(read_safetensors(path, file_bytes), head, file_bytes)
        except NotSafetensors as exc:
            framing_error = exc
    checkpoint = _open_torch(path, head, file_bytes, framing_error, allow_index)
    if path.endswith(".safetensors"):
        checkpoint.loader_problems.append(
            f"its name ends in .safetensors, so torch.load hands it to the safetensors library, "
            f"which refuses it: it is a {format_name(checkpoint.format)}"
        )
    return checkpoint


def _open_torch(
    path: str, head: bytes, file_bytes: int, framing_error: NotSafetensors | None, allow_index: bool
) -> Checkpoint:
    """Read the file as torch.load would pick its format (zip, tar, pickle), or as an index."""
    if head[:4] in ZIP_STARTS:
        return read_zip(path, file_bytes, DISTRIBUTED_CLASSES, DISTRIBUTED_GLOBALS)
    if is_tar(path, head):
        raise ReadError(
            f"{path}: a tar archive: torch.load reads it in the pre-0.4 torch tar format, which ckpt-tui does not read"
            + _tar_unsafe_note(path)
        )
    if head.lstrip()[:1] == b"{" and framing_error is None:
        if not allow_index:
            raise ReadError(f"{path}: an index file where a shard was expected")
        return read_sharded(path, open_shard)
    if head[0] in PICKLE_OPCODES:
        try:
            return read_pickle_file(path, file_bytes)
        except ReadError:
            if framing_error is not None:
                raise framing_error from None
            if path.endswith(".safetensors") or head[8:9] == b"{":
                raise ReadError(f"{path}: safetensors {length_problem(head, file_bytes)}") from None
            if _looks_like_text(head):
                raise ReadError(f"{path}: a text file, not a checkpoint") from None
            raise
    if framing_error is not None:
        raise framing_error
    if path.endswith(".safetensors") or head[8:9] == b"{":
        raise ReadError(f"{path}: safetensors {length_problem(head, file_bytes)}")
    if _looks_like_text(head):
        raise ReadError(f"{path}: a text file, not a checkpoint")
    raise ReadError(f"{path}: not a checkpoint (unrecognised content: {head[:8].hex(' ')})")


MAX_TAR_MEMBERS = 64
MAX_TAR_PICKLE = 256 << 20
"""Tar members scanned for unsafe globals: the first 64, each up to 256 MB."""


def is_tar(path: str, head: bytes) -> bool:
    """Whether ``torch.load`` would read the file as a pre-0.4 tar archive (``tarfile.open(mode="r:")``).

    Only a first block whose checksum holds can start a tar archive; ``tarfile`` itself decides then.
    """
    if not _tar_checksum_holds(head):
        return False
    import tarfile

    try:
        with places.open_stream(path) as file, tarfile.open(fileobj=file, mode="r:", format=tarfile.PAX_FORMAT):
            return True
    except tarfile.TarError:
        return False
    except OSError:
        raise
    except Exception:  # torch.load fails the same way reading it as tar: no other reading applies
        return True


def _tar_unsafe_note(path: str) -> str:
    """The unsafe globals the pickles of the tar's members name (``torch.load(weights_only=False)`` unpickles
    ``storages``, ``tensors`` and ``pickle`` with the plain pickle module), as a note; "" if none."""
    import tarfile

    from ckpt_tui.core.pickles.unpickle import unsafe_note_for

    found = []
    try:
        with places.open_stream(path) as file, tarfile.open(fileobj=file, mode="r:") as tar:
            for member in tar.getmembers()[:MAX_TAR_MEMBERS]:
                extracted = tar.extractfile(member) if member.isfile() and member.size <= MAX_TAR_PICKLE else None
                if extracted is not None:
                    found.append(unsafe_note_for(extracted.read()))
    except Exception:  # a broken tar: torch fails on it as well; nothing more to say
        return ""
    return next((note for note in found if note), "")


def _tar_checksum_holds(head: bytes) -> bool:
    """The test ``tarfile`` applies to a header block: its checksum field equals the sum of its bytes."""
    if len(head) < TAR_BLOCK or head[:TAR_BLOCK].count(0) == TAR_BLOCK:
        return False
    block = head[:TAR_BLOCK]
    field = block[148:156]
    if field[:1] in (b"\x80", b"\xff"):  # base-256 numbers: rare, let tarfile decide
        return True
    digits = field.split(b"\0", 1)[0].strip()
    if not digits or any(c not in b"01234567" for c in digits):
        return False  # not a number (or 0, which no header block sums to)
    unsigned = sum(block[:148]) + 8 * 0x20 + sum(block[156:])
    signed = sum(b - 256 if b > 127 else b for b in block[:148] + block[156:]) + 8 * 0x20
    return int(digits, 8) in (unsigned, signed)


def _with_other_readings(checkpoint: Checkpoint, head: bytes, file_bytes: int) -> Checkpoint:
    """A valid safetensors file that torch.load would read as something else: say so, scan that reading."""
    path = checkpoint.path
    other: str | None = None
    if head.startswith(TORCH_ZIP_START):
        try:
            zipped = read_zip(path, file_bytes, DISTRIBUTED_CLASSES, DISTRIBUTED_GLOBALS)
        except ReadError:
            zipped = None
        if zipped is not None:
            other = "a torch zip checkpoint"
            checkpoint.unsafe_globals |= zipped.unsafe_globals
    elif is_tar(path, head):
        other = "a pre-0.4 tar archive"
    elif head[0] in PICKLE_OPCODES:
        with places.open_stream(path) as file:
            if _first_pickle_loads(file, path, checkpoint.unsafe_globals):
                other = "a pickle"
    if other is not None:
        checkpoint.loader_problems.append(
            f"a polyglot: also {other}; torch.load reads it as {other} unless its name ends in .safetensors, "
            "and the safetensors library reads what is shown"
        )
    return checkpoint


def _first_pickle_loads(file: BinaryIO, path: str, unsafe: set[str]) -> bool:
    """Whether the file starts with a whole pickle (its unsafe globals are added to ``unsafe``)."""
    try:
        load_pickle(file, lambda pid: pid, f"{path}: pickle", unsafe)
    except ReadError:
        return False
    return True


def _looks_like_text(head: bytes) -> bool:
    """UTF-8 (a character cut at the end of ``head`` allowed) without control bytes other than whitespace."""
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return False
    return not any(ord(c) < 32 and c not in "\t\n\r\f" for c in text)
