"""Sharded checkpoints: ``*.index.json`` with a weight map over several shard files."""

from __future__ import annotations

import json
import operator
from collections.abc import Callable
from typing import Any

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.contained import inside
from ckpt_tui.core.model.tree import Checkpoint, FlatColumns, Tensor

_DTYPE = operator.attrgetter("dtype")
_NUMEL = operator.attrgetter("storage.numel")


def _read_index(path: str) -> Any:
    """The index file's JSON (a ReadError for text that is not UTF-8 or not JSON)."""
    try:
        with places.open_stream(path) as file:
            return _parsed(file.read())
    except UnicodeDecodeError:
        raise ReadError(f"{path}: index is not UTF-8 text") from None
    except RecursionError:
        raise ReadError(f"{path}: index JSON nests too deeply to be an index") from None
    except ValueError as exc:  # JSONDecodeError, ints past the digit limit
        raise ReadError(f"{path}: index is not valid JSON ({exc})") from None


def _open_shards(path: str, names: list[str], open_shard: Callable[[str], Checkpoint]) -> dict[str, Checkpoint]:
    """Each shard the index names, opened (each inside the index's folder)."""
    folder = places.parent(path)

    def opened(shard: str) -> Checkpoint:
        return open_shard(inside(folder, shard, f"{path}: shard"))

    # remote shards are read together: each costs round trips, not bytes
    if places.is_remote(folder) and len(names) > 1:
        from concurrent.futures import ThreadPoolExecutor  # (its import takes logging along: remote only)

        with ThreadPoolExecutor(min(8, len(names))) as pool:
            return dict(zip(names, pool.map(opened, names), strict=True))
    return {shard: opened(shard) for shard in names}


def read_sharded(path: str, open_shard: Callable[[str], Checkpoint]) -> Checkpoint:
    """Open every shard named in the index and show them as one flat state_dict.

    ``open_shard`` opens one shard file and refuses index files, so an index naming itself or another
    index is refused instead of followed.
    """
    # the index
    index = _read_index(path)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ReadError(f"{path}: JSON without a weight_map: not a sharded checkpoint index")
    # the shards
    shards = _open_shards(path, list(dict.fromkeys(weight_map.values())), open_shard)
    # one state_dict: each key from the shard the index maps it to
    root: dict[str, Any] = {}
    for key, shard in weight_map.items():
        tensors = shards[shard].root
        value = tensors.get(key) if isinstance(tensors, dict) else None
        if not isinstance(value, Tensor):
            raise ReadError(f"{path}: {key!r} is mapped to {shard}, which does not hold it")
        root[key] = value
    columns = _columns(root, list(shards.values()))
    total = sum(c.file_bytes for c in shards.values())
    index_metadata = index.get("metadata") if isinstance(index.get("metadata"), dict) else {}
    metadata: dict[str, Any] = {}  # the shards' own metadata carries over, as transformers merges them
    for shard_checkpoint in shards.values():
        for name, value in shard_checkpoint.metadata.items():
            metadata.setdefault(name, value)
    note = f"{len(shards)} shards: " + ", ".join(shards)
    unsafe = set().union(*(c.unsafe_globals for c in shards.values()))
    problems = [f"shard {name}: {problem}" for name, c in shards.items() for problem in c.loader_problems]
    notes = [note] + [f"shard {name}: {n}" for name, c in shards.items() for n in c.notes]
    return Checkpoint(
        path,
        "sharded",
        root,
        total,
        metadata=metadata,
        notes=notes,
        unsafe_globals=unsafe,
        loader_problems=problems,
        index_metadata=dict(index_metadata),
        columns=columns,
    )


def _parsed(raw: bytes) -> Any:
    """The index's JSON: orjson (4x faster on a 90,000-key weight map), json where orjson refuses
    what json reads (ints past 64 bits), so that both give one answer."""
    import orjson

    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw.decode("utf-8"))


def _columns(root: dict[str, Any], shards: list[Checkpoint]) -> FlatColumns | None:
    """Columns of the assembled root when every shard was read as columns: each of its tensors is then a
    shard's plain tensor over its own storage, so what :class:`FlatColumns` promises holds for the set."""
    if not root or any(shard.flat_columns() is None for shard in shards):
        return None
    values = root.values()
    return FlatColumns(root, list(map(_DTYPE, values)), list(map(_NUMEL, values)))
