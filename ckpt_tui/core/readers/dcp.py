"""``torch.distributed.checkpoint`` (DCP/FSDP) directories: the ``.metadata`` pickle only."""

from __future__ import annotations

import math
import os
from typing import Any

from ckpt_tui.core.dtypes import DTYPES
from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.tree import Checkpoint, Opaque, Symbol, Tensor
from ckpt_tui.core.unpickle import load_pickle


def _state(value: Any) -> dict[str, Any]:
    if isinstance(value, Opaque) and isinstance(value.state, dict):
        return value.state
    raise ReadError("DCP .metadata: unexpected layout")


def _dtype(properties: Any) -> str:
    state = properties.state if isinstance(properties, Opaque) else None
    dtype = state.get("dtype") if isinstance(state, dict) else state[0] if isinstance(state, tuple) and state else None
    if isinstance(dtype, Symbol) and dtype.name in DTYPES:
        return dtype.name
    raise ReadError("DCP .metadata: tensor without a known dtype")


def read_dcp(folder: str) -> Checkpoint:
    """Rebuild the nested state_dict of a DCP checkpoint from its metadata."""
    meta_path = os.path.join(folder, ".metadata")
    unsafe: set[str] = set()
    with open(meta_path, "rb") as file:
        metadata = load_pickle(file.read(), None, f"{meta_path}: DCP metadata", unsafe)
    state = _state(metadata)
    entries = state.get("state_dict_metadata")
    if not isinstance(entries, dict):
        raise ReadError(f"{meta_path}: no state_dict_metadata")
    planner_data = state.get("planner_data")
    planner: dict[Any, Any] = planner_data if isinstance(planner_data, dict) else {}
    root: dict[str, Any] = {}
    for fqn, entry in entries.items():
        value: Any = entry
        if isinstance(entry, Opaque) and entry.global_name.endswith("TensorStorageMetadata"):
            value = _tensor(_state(entry))
        path = planner.get(fqn)
        keys = (
            list(path) if isinstance(path, (tuple, list)) and path and all(isinstance(k, str) for k in path) else [fqn]
        )
        _insert(root, keys, value)
    files = [n for n in os.listdir(folder) if n.endswith(".distcp")]
    total = sum(os.path.getsize(os.path.join(folder, n)) for n in files) + os.path.getsize(meta_path)
    note = f"DCP checkpoint: {len(files)} .distcp files; tensor values are not read from DCP files yet"
    return Checkpoint(folder, "dcp", root, total, notes=[note], unsafe_globals=unsafe)


def _tensor(entry: dict[str, Any]) -> Tensor:
    size = entry.get("size")
    if not isinstance(size, tuple) or not all(type(n) is int for n in size):
        raise ReadError("DCP .metadata: tensor size is malformed")
    stride = tuple(math.prod(size[i + 1 :]) for i in range(len(size)))
    chunks = entry.get("chunks")
    return Tensor(
        None,
        0,
        tuple(size),
        stride,
        _dtype(entry.get("properties")),
        kind="dcp",
        metadata={"chunks": len(chunks) if isinstance(chunks, list) else 0},
    )


def _insert(root: dict[str, Any], keys: list[str], value: Any) -> None:
    node = root
    for key in keys[:-1]:
        nxt = node.setdefault(key, {})
        if not isinstance(nxt, dict):
            nxt = node[key] = {}
        node = nxt
    node[keys[-1]] = value
