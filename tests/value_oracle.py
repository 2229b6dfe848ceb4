"""Values by difference: what ckpt-tui's tree shows for each top-level key of a file, next to what the real
``torch.load(weights_only=True)`` loads, for the value-level differential tests (generated files in tmp_path).

The rule checked: a key the tree shows as a tensor has exactly torch's dtype, shape and bytes; a tensor
torch loads that the tree does not show (kept as a call, unread) makes ``check`` report a problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ckpt_tui.core.model.tree import Tensor
from ckpt_tui.core.operations.check import check_checkpoint
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.values.tensor_values import TensorReader

Seen = tuple[str, tuple[int, ...], bytes]
"""A tensor as compared: dtype name, shape, its values' bytes (little-endian, row-major)."""


@dataclass
class Ours:
    """What ckpt-tui makes of a file: the tensors its tree shows (by top-level key) and whether check is clean."""

    tensors: dict[Any, Seen | None]
    """None: shown as a tensor whose values cannot be read."""
    clean: bool
    problems: list[str]


def ours(path: Path) -> Ours:
    checkpoint = open_checkpoint(str(path))
    root = checkpoint.root
    tensors: dict[Any, Seen | None] = {}
    if isinstance(root, dict):
        for key, value in root.items():
            if isinstance(value, Tensor):
                tensors[key] = _read(value, checkpoint.byteorder)
    report = check_checkpoint(checkpoint)
    return Ours(tensors, report.ok, [p.message for p in report.problems])


def _read(tensor: Tensor, byteorder: str) -> Seen | None:
    try:
        count = int(np.prod(tensor.shape)) if tensor.shape else 1
        values = TensorReader(tensor, byteorder).first(count)
    except Exception:
        return None
    little = values.astype(values.dtype.newbyteorder("<"))
    return tensor.dtype, tuple(tensor.shape), little.tobytes()


def theirs(path: Path) -> dict[Any, Seen] | str:
    """torch.load's tensors by top-level key, or why it refuses the file."""
    try:
        loaded = torch.load(path, weights_only=True)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    if not isinstance(loaded, dict):
        return {}
    return {k: seen(v) for k, v in loaded.items() if isinstance(v, torch.Tensor)}


def seen(tensor: torch.Tensor) -> Seen:
    """A real tensor as compared."""
    plain = tensor.detach().contiguous()
    name = str(plain.dtype).removeprefix("torch.")
    return name, tuple(plain.shape), plain.numpy().tobytes()


def disagreements(path: Path) -> list[str]:
    """Every way ckpt-tui's view of ``path`` breaks the rule, in words (empty: it holds)."""
    loaded = theirs(path)
    mine = ours(path)
    if isinstance(loaded, str):
        return [] if not mine.clean else [f"check is clean where torch refuses it: {loaded}"]
    out = []
    for key, value in mine.tensors.items():
        if key not in loaded:
            out.append(f"{key!r}: shown as a tensor, torch loads no tensor there")
        elif value is None:
            if mine.clean:
                out.append(f"{key!r}: shown with unreadable values, check clean")
        elif value != loaded[key]:
            out.append(f"{key!r}: shown as {_short(value)}, torch loads {_short(loaded[key])}")
    unread = [key for key in loaded if key not in mine.tensors]
    if unread and mine.clean:
        out.append(f"{unread!r}: torch loads tensors the tree does not show, and check is clean")
    return out


def _short(value: Seen) -> str:
    return f"{value[0]} {list(value[1])} {value[2][:16].hex()}"
