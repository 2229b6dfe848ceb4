"""A tar archive given as a checkpoint: torch's pre-0.4 tar format, or any other tar (one ``tar cf`` made).

``torch.load`` tries every file at offset 0 as a tar first (``_legacy_load``): a tar it opens is read as torch's
pre-0.4 format, which extracts the member ``storages`` and unpickles it, then ``tensors``, then ``pickle``. A tar
without a ``storages`` member fails there (``KeyError: "filename 'storages' not found"``) before anything is
unpickled: it is no checkpoint, and nothing in it runs. Neither is read here (no reader reads the pre-0.4
format); each is refused in one line that says which it is, and for another tar which of its files to extract.
"""

from __future__ import annotations

import io
import os
import tarfile
from dataclasses import dataclass, field
from typing import BinaryIO

from ckpt_tui.core.errors import CkptError, ReadError
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.dtypes import DTYPES
from ckpt_tui.core.readers.probes import looks_like_safetensors
from ckpt_tui.core.runtime.shell import join_command, path_arg

TORCH_MEMBERS = ("storages", "tensors", "pickle")
"""The members ``_legacy_load`` reads, in its order: each is unpickled with the plain pickle module."""
CHECKPOINT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".tar")
MAX_SNIFFED = 64
"""Members whose first bytes are read to tell a checkpoint by content, at most."""
MAX_MEMBER = 256 << 20
"""A pre-0.4 member larger than this is not scanned for globals (it is refused all the same)."""
MAX_RECORDS = 1 << 16
SHOWN = 3
ELEMENT_SIZES = {storage: size for size, storage in DTYPES.values() if storage is not None}


@dataclass
class TarContents:
    """What a tar archive holds, as torch and a user see it."""

    torch_format: bool
    """Whether it has a ``storages`` member, as ``tarfile.getmember`` finds it: torch then unpickles it."""
    files: list[str] = field(default_factory=list)
    """Its regular members, by name."""
    checkpoints: list[str] = field(default_factory=list)
    """Those that are checkpoints by name or by their first bytes."""


def torch_tar(path: str) -> bool:
    """Whether ``torch.load`` unpickles anything from this tar: it has a ``storages`` member. A tar that
    ``tarfile`` cannot list is doubt: counted as one."""
    try:
        with places.open_stream(path) as file:
            return has_torch_members(file)
    except (OSError, CkptError):
        return True


def has_torch_members(file: BinaryIO) -> bool:
    """:func:`torch_tar` of an open file (read from its start; where it was left is not kept)."""
    file.seek(0)
    try:
        with tarfile.open(fileobj=file, mode="r:", format=tarfile.PAX_FORMAT) as tar:
            # (torch asks tarfile for the member by name: the same lookup here)
            tar.getmember(TORCH_MEMBERS[0])
    except KeyError:
        return False
    except Exception:  # (a tar tarfile cannot list: doubt)
        return True
    return True


def contents(path: str) -> TarContents:
    """A tar's members (raises what :mod:`tarfile` raises on a broken one)."""
    with places.open_stream(path) as file, tarfile.open(fileobj=file, mode="r:", format=tarfile.PAX_FORMAT) as tar:
        try:
            # (torch asks tarfile for the member by name: the same lookup here)
            tar.getmember(TORCH_MEMBERS[0])
            torch_format = True
        except KeyError:
            torch_format = False
        found = TarContents(torch_format)
        for member in tar.getmembers():
            if member.isfile():
                found.files.append(member.name)
                sniffed = len(found.files) <= MAX_SNIFFED
                if member.name.endswith(CHECKPOINT_SUFFIXES) or (sniffed and _checkpoint_bytes(tar, member)):
                    found.checkpoints.append(member.name)
    return found


def _checkpoint_bytes(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bool:
    """Whether a member begins as torch.save or safetensors writes: a zip, a pickle's PROTO, a header."""
    extracted = tar.extractfile(member)
    head = extracted.read(512) if extracted is not None else b""
    return head[:4] == b"PK\x03\x04" or head[:1] == b"\x80" or looks_like_safetensors(head, member.size)


def refusal(path: str) -> ReadError:
    """The one line that refuses a tar archive: torch's pre-0.4 format (with the globals its pickles name), or
    another tar, saying what it holds and which file to extract and open."""
    try:
        found = contents(path)
    except (tarfile.TarError, OSError, CkptError):
        found = TarContents(torch_format=True)
    if found.torch_format:
        return ReadError(
            f"{path}: a tar archive: torch.load reads it in the pre-0.4 torch tar format, which ckpt-tui does not read"
            + _unsafe_note(path)
        )
    return ReadError(f"{path}: {other_tar(path, found)}")


def other_tar(path: str, found: TarContents) -> str:
    """What a tar that is no torch checkpoint holds, and the way forward."""
    head = (
        "a tar archive, not a torch checkpoint: torch.load fails on it before unpickling anything (it has no "
        "'storages' member, which torch's pre-0.4 tar format has)"
    )
    if not found.checkpoints:
        shown = ", ".join(found.files[:SHOWN]) + (", …" if len(found.files) > SHOWN else "")
        return (
            f"{head}; it holds {counted(len(found.files), 'file')}"
            + (f" ({shown})" if shown else "")
            + (", none a checkpoint")
        )
    first = found.checkpoints[0]
    extract = join_command(["tar", "xf", path_arg(path), *([first] if len(found.checkpoints) == 1 else [])])
    opened = join_command(["ckpt-tui", path_arg(first)])
    if len(found.checkpoints) == 1:
        return f"{head}; it holds the checkpoint {first}: extract it ({extract}) and open that ({opened})"
    shown = ", ".join(found.checkpoints[:SHOWN]) + (", …" if len(found.checkpoints) > SHOWN else "")
    return (
        f"{head}; it holds {counted(len(found.checkpoints), 'checkpoint file')} ({shown}): extract them "
        f"({extract}) and open one ({opened})"
    )


# ---- the globals a pre-0.4 tar's pickles name, read as _legacy_load reads its members --------------------


def _unsafe_note(path: str) -> str:
    """``; and it is UNSAFE: ...`` for the globals the pickles ``_legacy_load`` unpickles name (its members
    ``storages``, ``tensors``, ``pickle``, walked as it walks them: never the raw bytes between pickles); ""
    when they name none."""
    from ckpt_tui.core.pickles.unpickle import unsafe_note

    unsafe: set[str] = set()
    try:
        with places.open_stream(path) as file, tarfile.open(fileobj=file, mode="r:") as tar:
            for name in TORCH_MEMBERS:
                data = _member_bytes(tar, name)
                if data is None:
                    break  # (torch fails here: nothing after it is read)
                _WALKS[name](data, f"{path}: {name}", unsafe)
    except Exception:  # a broken tar: torch fails on it as well; what was found is said
        pass
    return unsafe_note(unsafe)


def _member_bytes(tar: tarfile.TarFile, name: str) -> bytes | None:
    try:
        member = tar.getmember(name)
    except KeyError:
        return None
    extracted = tar.extractfile(member) if member.isfile() and member.size <= MAX_MEMBER else None
    return extracted.read() if extracted is not None else None


def _load(stream: io.BytesIO, what: str, unsafe: set[str]) -> object:
    from ckpt_tui.core.pickles.unpickle import load_pickle

    return load_pickle(stream, lambda pid: pid, what, unsafe)


def _walk_storages(data: bytes, what: str, unsafe: set[str]) -> None:
    """``storages``: a count, then per storage its ``(key, location, storage_type)`` pickle and its raw bytes
    (an int64 element count, then the elements), then the views' pickle."""
    stream = io.BytesIO(data)
    count = _load(stream, what, unsafe)
    for _ in range(min(count, MAX_RECORDS) if isinstance(count, int) else 0):
        args = _load(stream, what, unsafe)
        storage_type = args[2] if isinstance(args, tuple) and len(args) == 3 else None
        size = ELEMENT_SIZES.get(getattr(storage_type, "name", "").rsplit(".", 1)[-1])
        if size is None:
            return  # (torch fails on a storage type it has no dtype for)
        numel = int.from_bytes(stream.read(8), "little", signed=True)
        stream.seek(max(numel, 0) * size, os.SEEK_CUR)
    _load(stream, what, unsafe)


def _walk_tensors(data: bytes, what: str, unsafe: set[str]) -> None:
    """``tensors``: a count, then per tensor its ``(key, storage_id, type)`` pickle and its geometry (ndim as 8
    bytes, sizes and strides as ndim int64 each, an int64 offset)."""
    stream = io.BytesIO(data)
    count = _load(stream, what, unsafe)
    for _ in range(min(count, MAX_RECORDS) if isinstance(count, int) else 0):
        _load(stream, what, unsafe)
        ndim = int.from_bytes(stream.read(4), "little", signed=True)
        stream.seek(4 + 16 * max(ndim, 0) + 8, os.SEEK_CUR)


def _walk_pickle(data: bytes, what: str, unsafe: set[str]) -> None:
    _load(io.BytesIO(data), what, unsafe)


_WALKS = {"storages": _walk_storages, "tensors": _walk_tensors, "pickle": _walk_pickle}
