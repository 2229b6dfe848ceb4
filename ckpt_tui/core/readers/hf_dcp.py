"""DCP written through torch's ``HuggingFaceStorageWriter(save_distributed=True)``: per-rank safetensors.

Each rank writes ``shard-0000R-model-0000K-of-0000N.safetensors``: plain safetensors holding that rank's
local pieces, whose ``__metadata__`` ``DCP_SHARDING_INFO`` (JSON) gives each piece's ``saved_offsets`` in
the whole tensor. torch's ``HuggingFaceStorageReader`` reads the folder by content (every safetensors
file in it) and takes a tensor's shape as the farthest corner of its pieces; so does this reader, and a
tensor is assembled from its pieces on demand (nothing read at open but the headers).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.assembled import AssembledRecords, Piece, box_text
from ckpt_tui.core.model.contained import inside, named_entry
from ckpt_tui.core.model.describe import counted
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
                raise ReadError(
                    f"{path}: {key!r} has {counted(len(start), 'offset')} for {counted(len(tensor.shape), 'dimension')}"
                )
            boxes.setdefault(key, []).append((start, tensor, name))
    source = AssembledRecords(folder)
    odd: list[str] = []
    root = {key: _assemble(key, pieces, source, odd) for key, pieces in boxes.items()}
    ranks = sorted({m.group(1) for n in names if (m := RANK_NAME.fullmatch(n))})
    others = [n for n in safetensors_names(folder) if n not in names]
    notes = [
        f"DCP through the HF storage writer: {counted(len(names), 'safetensors file')}"
        + (f" from {counted(len(ranks), 'rank')}" if ranks else "")
        + f"; {counted(len(root), 'tensor')} assembled from the pieces their {SHARDING_KEY} places"
    ]
    if others:
        notes.append(f"left aside (no {SHARDING_KEY}): " + ", ".join(others[:5]) + (" …" if len(others) > 5 else ""))
    problems = [f"{name}: {p}" for name, m in zip(names, members, strict=True) for p in m.loader_problems]
    layout = f"DCP (HF safetensors), {counted(len(ranks) or len(names), 'rank')}; weights: the root"
    return Checkpoint(
        folder,
        "dcp-hf",
        root,
        sum(m.file_bytes for m in members),
        notes=notes,
        loader_problems=problems,
        layout=layout,
        odd_layout=odd,
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


MAX_PAIRED = 256
"""Pieces of one tensor compared pairwise for overlaps (real saves have one per rank)."""
NOT_READ = "its values are not read; re-save the checkpoint (dcp.save), or leave it out (ckpt-tui convert --drop {key})"


def _odd_cover(key: str, shape: tuple[int, ...], pieces: list[Piece]) -> tuple[str, str] | None:
    """Why a tensor's pieces give no values its loaders agree on (two overlap, or some element has none): the
    finding, naming the files and their ``saved_offsets``, and the shorter line its value reads give; None when
    they tile it exactly."""
    drop = f"--drop {key} leaves it out"
    for a, b in itertools.combinations(pieces[:MAX_PAIRED], 2):
        if all(i < j + m and j < i + n for i, n, j, m in zip(a.offsets, a.sizes, b.offsets, b.sizes, strict=True)):
            # torch's readers copy the files in directory-listing order (consolidate: glob; dcp.load: fs.ls)
            offsets = f"{SHARDING_KEY} {OFFSETS_KEY} {list(a.offsets)} and {list(b.offsets)}"
            finding = (
                f"{key}: its pieces {a.where} and {b.where} overlap ({offsets}): torch copies them in "
                f"directory-listing order, so which values win depends on the file system; {NOT_READ.format(key=key)}"
            )
            return finding, f"{key}: its pieces overlap ({offsets}): not read, as torch's result depends on it; {drop}"
    covered = sum(piece.numel for piece in pieces)
    if covered < math.prod(shape):
        where = ", ".join(f"{p.where} at {list(p.offsets)}" for p in pieces[:4]) + (" …" if len(pieces) > 4 else "")
        gap = math.prod(shape) - covered
        missing = f"{gap} of its {counted(math.prod(shape), 'element')} {'is' if gap == 1 else 'are'} in no file"
        finding = (
            f"{key}: its pieces leave a gap: {missing} ({SHARDING_KEY} {OFFSETS_KEY}: {where}); torch's "
            f"consolidate_safetensors_files writes zeros there and dcp.load leaves what the tensor held; "
            f"{NOT_READ.format(key=key)}"
        )
        return finding, f"{key}: its pieces leave a gap ({missing}): not read, as torch's readers disagree; {drop}"
    return None


def _stored(tensor: Tensor) -> Callable[[], Tensor]:
    return lambda: tensor


def _assemble(
    key: str, found: list[tuple[tuple[int, ...], Tensor, str]], source: AssembledRecords, odd: list[str]
) -> Tensor:
    """One logical tensor: its shape the farthest corner of its pieces (as torch's reader takes it); pieces that
    overlap or leave a gap make its values unreadable, said in ``odd`` (its shape is still shown)."""
    first = found[0][1]
    if any(t.dtype != first.dtype or len(t.shape) != len(first.shape) for _, t, _ in found):
        raise ReadError(f"{key}: its pieces disagree on dtype or dimensions")
    shape = tuple(max(o[d] + t.shape[d] for o, t, _ in found) for d in range(len(first.shape)))
    # (a replicated tensor is written by one rank only: DCP's planner dedups it, so two files holding one box
    # overlap like any other two pieces)
    pieces = [
        Piece(offsets, tensor.shape, f"{name} {box_text(offsets, tensor.shape)}", _stored(tensor))
        for offsets, tensor, name in found
        if 0 not in tensor.shape
    ]
    storage = Storage(key, first.dtype, "cpu", math.prod(shape), source)
    why = _odd_cover(key, shape, pieces)
    if why is not None:
        odd.append(why[0])
    source.add(key, shape, pieces, unreadable=why[1] if why is not None else None)
    stride = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
    return Tensor(storage, 0, shape, stride, first.dtype)
