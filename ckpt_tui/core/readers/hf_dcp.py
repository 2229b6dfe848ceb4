"""DCP written through torch's ``HuggingFaceStorageWriter(save_distributed=True)``: per-rank safetensors.

Each rank writes ``shard-0000R-model-0000K-of-0000N.safetensors``: plain safetensors holding that rank's
local pieces, whose ``__metadata__`` ``DCP_SHARDING_INFO`` (JSON) gives each piece's ``saved_offsets`` in
the whole tensor. torch's ``HuggingFaceStorageReader`` reads the folder by content (every safetensors
file in it) and takes a tensor's shape as the farthest corner of its pieces; so does this reader, and a
tensor is assembled from its pieces on demand (nothing read at open but the headers).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.assembled import AssembledRecords, Piece, box_text
from ckpt_tui.core.model.contained import inside, named_entry
from ckpt_tui.core.model.tree import Checkpoint, Storage, Tensor

SHARDING_KEY = "DCP_SHARDING_INFO"
OFFSETS_KEY = "saved_offsets"
SUFFIX = ".safetensors"
MAX_FILES = 100_000
RANK_NAME = re.compile(r"shard-(\d+)-model-\d+-of-\d+\.safetensors")


def sharding_info(checkpoint: Checkpoint) -> str | None:
    """The ``DCP_SHARDING_INFO`` text of an opened safetensors file, if it has one."""
    info = checkpoint.metadata.get(SHARDING_KEY) if checkpoint.format == "safetensors" else None
    return info if isinstance(info, str) else None


def safetensors_names(folder: str) -> list[str]:
    """The folder's ``*.safetensors`` entries (not folders), in name order (what torch's reader lists): one
    that is not a regular file of the folder (a FIFO, a link out) is refused when read, never passed over."""
    names = sorted(n for n in places.list_dir(folder) if n.endswith(SUFFIX) and named_entry(places.join(folder, n)))
    if len(names) > MAX_FILES:
        raise ReadError(f"{folder}: {len(names)} safetensors files in one folder")
    return names


def has_sharding_header(path: str) -> bool:
    """Whether a file's safetensors header (read alone, bounded) names ``DCP_SHARDING_INFO``: a cheap probe."""
    try:
        with places.open_stream(path) as file:
            head = file.read(8)
            if len(head) < 8:
                return False
            length = int.from_bytes(head, "little")
            if length > 100 << 20:
                return False
            header = file.read(length)
    except (OSError, ReadError):
        return False
    return b'"__metadata__"' in header and f'"{SHARDING_KEY}"'.encode() in header


def hf_dcp_folder(folder: str) -> list[str] | None:
    """The HF-DCP files of a folder (every safetensors file carrying sharding info), or None."""
    names = safetensors_names(folder)
    sharded = [n for n in names if has_sharding_header(inside(folder, n, f"{folder}: safetensors file"))]
    return sharded or None


def read_hf_dcp(folder: str, names: list[str], open_file: Callable[[str], Checkpoint]) -> Checkpoint:
    """Open the per-rank safetensors of ``folder`` (``names``) as one flat state_dict of whole tensors."""
    boxes: dict[str, list[tuple[tuple[int, ...], Tensor, str]]] = {}
    members: list[Checkpoint] = []
    for name in names:
        path = inside(folder, name, f"{folder}: rank file")
        member = open_file(path)
        members.append(member)
        info = sharding_info(member)
        if info is None:
            raise ReadError(f"{path}: no {SHARDING_KEY} in its metadata (not written by the HF storage writer)")
        offsets = _offsets(info, path)
        if not isinstance(member.root, dict):
            raise ReadError(f"{path}: not a flat safetensors file")
        for key, tensor in member.root.items():
            if not isinstance(tensor, Tensor):
                raise ReadError(f"{path}: {key!r} is not a tensor")
            start = offsets.get(key)
            if start is None:
                raise ReadError(f"{path}: {key!r} has no {OFFSETS_KEY} in {SHARDING_KEY}")
            if len(start) != len(tensor.shape):
                raise ReadError(f"{path}: {key!r} has {len(start)} offsets for {len(tensor.shape)} dimensions")
            boxes.setdefault(key, []).append((start, tensor, name))
    source = AssembledRecords(folder)
    root = {key: _assemble(key, pieces, source) for key, pieces in boxes.items()}
    ranks = sorted({m.group(1) for n in names if (m := RANK_NAME.fullmatch(n))})
    others = [n for n in safetensors_names(folder) if n not in names]
    notes = [
        f"DCP through the HF storage writer: {len(names)} safetensors files"
        + (f" from {len(ranks)} ranks" if ranks else "")
        + f"; {len(root)} tensors assembled from the pieces their {SHARDING_KEY} places"
    ]
    if others:
        notes.append(f"left aside (no {SHARDING_KEY}): " + ", ".join(others[:5]) + (" …" if len(others) > 5 else ""))
    problems = [f"{name}: {p}" for name, m in zip(names, members, strict=True) for p in m.loader_problems]
    layout = f"DCP (HF safetensors), {len(ranks) or len(names)} ranks; weights: the root"
    return Checkpoint(
        folder,
        "dcp-hf",
        root,
        sum(m.file_bytes for m in members),
        notes=notes,
        loader_problems=problems,
        layout=layout,
    )


def _offsets(info: str, path: str) -> dict[str, tuple[int, ...]]:
    try:
        parsed = json.loads(info)
    except (ValueError, RecursionError):
        raise ReadError(f"{path}: {SHARDING_KEY} is not JSON") from None
    if not isinstance(parsed, dict):
        raise ReadError(f"{path}: {SHARDING_KEY} is not a JSON object")
    out: dict[str, tuple[int, ...]] = {}
    for key, entry in parsed.items():
        start = entry.get(OFFSETS_KEY) if isinstance(entry, dict) else None
        if not isinstance(start, list) or not all(type(n) is int and 0 <= n < 1 << 62 for n in start):
            raise ReadError(f"{path}: {SHARDING_KEY} of {key!r} has no valid {OFFSETS_KEY}")
        out[key] = tuple(start)
    return out


def _stored(tensor: Tensor) -> Callable[[], Tensor]:
    return lambda: tensor


def _assemble(key: str, found: list[tuple[tuple[int, ...], Tensor, str]], source: AssembledRecords) -> Tensor:
    """One logical tensor: its shape the farthest corner of its pieces (as torch's reader takes it)."""
    first = found[0][1]
    if any(t.dtype != first.dtype or len(t.shape) != len(first.shape) for _, t, _ in found):
        raise ReadError(f"{key}: its pieces disagree on dtype or dimensions")
    shape = tuple(max(o[d] + t.shape[d] for o, t, _ in found) for d in range(len(first.shape)))
    pieces: dict[tuple[tuple[int, ...], tuple[int, ...]], Piece] = {}
    for offsets, tensor, name in found:
        box = (offsets, tensor.shape)
        if box not in pieces and 0 not in tensor.shape:  # one rank's copy of a replicated piece
            pieces[box] = Piece(offsets, tensor.shape, f"{name} {box_text(*box)}", _stored(tensor))
    storage = Storage(key, first.dtype, "cpu", math.prod(shape), source)
    source.add(key, shape, list(pieces.values()))
    stride = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
    return Tensor(storage, 0, shape, stride, first.dtype)
