"""Per-tensor statistics for a whole checkpoint (or a subtree): one row per tensor, streamed.

What ``ckpt-tui stats`` prints and the browser's layers view shows. Each reference to a tensor is a
row (as in ``info``); each distinct view of the same bytes is read once (as ``check`` does), so a
tied or shared tensor costs one read. Rows come one at a time, and only their statistics are kept.
A tensor whose values cannot be read here (sparse, quantized, meta, a missing record) is a row with
no statistics and a ``reason``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.keypath import KeyPath, to_json, to_slash
from ckpt_tui.core.stats import TensorStats, tensor_stats
from ckpt_tui.core.tree import Tensor, walk

COLUMNS = ("path", "shape", "dtype", "numel", "min", "max", "mean", "std", "norm", "absmax", "zeros", "nan", "inf")
"""The columns, in the order of the table and of ``stats --json``'s objects."""
ASCENDING = frozenset({"path", "dtype"})
"""Columns sorted A→Z; every other column sorts largest first (``--sort norm``: the biggest norms on top)."""


@dataclass
class TensorRow:
    """One tensor of the table: where it is, what it is, and its statistics (None: not read, see reason)."""

    path: KeyPath
    tensor: Tensor
    stats: TensorStats | None
    reason: str | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        """The tensor's shape."""
        return self.tensor.shape

    @property
    def dtype(self) -> str:
        """The tensor's dtype name."""
        return self.tensor.dtype

    @property
    def numel(self) -> int:
        """Elements of the view."""
        return self.tensor.numel

    def value(self, column: str) -> Any:
        """A column's value (None where no statistics were read, or there were no finite values)."""
        if column == "path":
            return self.path
        if column in ("shape", "dtype", "numel"):
            return getattr(self, column)
        stats = self.stats
        if stats is None:
            return None
        if column == "zeros":
            return stats.zero_fraction
        if column in ("nan", "inf"):
            return stats.nan if column == "nan" else stats.inf
        return getattr(stats, column)

    @property
    def nonfinite(self) -> bool:
        """Whether the tensor holds NaN or Inf."""
        return self.stats is not None and bool(self.stats.nan or self.stats.inf)

    def to_json(self) -> dict[str, Any]:
        """The ``stats --json`` object of this tensor (a contract: fields are only ever added)."""
        out: dict[str, Any] = {column: self.value(column) for column in COLUMNS}
        out["path"] = to_json(self.path)
        out["shape"] = list(self.shape)
        out["reason"] = self.reason
        return out


def tensor_paths(root: Any, at: KeyPath = ()) -> list[tuple[KeyPath, Tensor]]:
    """Every shown reference to a tensor below ``root`` (already the value at ``at``), in tree order."""
    return [(path, value) for path, value, shown, _ in walk(root, at) if shown and isinstance(value, Tensor)]


def unreadable_reason(tensor: Tensor) -> str | None:
    """Why a tensor's values are not read here, or None when they are."""
    if tensor.kind != "dense":
        return f"{tensor.kind} tensor: its values are not read"
    if tensor.storage is None:
        return "no storage in the file (meta tensor)"
    source = tensor.storage.source
    if source is not None and hasattr(source, "has") and not source.has(tensor.storage):
        return f"record {tensor.storage.key} is missing from the file"
    return None


def tensor_rows(
    tensors: list[tuple[KeyPath, Tensor]],
    byteorder: str = "little",
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[TensorRow]:
    """One row per tensor reference, each view of the same bytes read once.

    ``progress(done, total)`` is called in bytes of the views read so far; ``cancelled`` is polled between
    chunks (it raises :class:`~ckpt_tui.core.errors.Cancelled`).
    """
    seen: dict[tuple[Any, ...], TensorStats | str] = {}
    total = sum(t.nbytes for _, t in tensors)
    done = 0
    for path, tensor in tensors:
        reason = unreadable_reason(tensor)
        if reason is not None:
            yield TensorRow(path, tensor, None, reason)
            done += tensor.nbytes
            continue
        assert tensor.storage is not None
        view = (id(tensor.storage), tensor.offset, tensor.shape, tensor.stride, tensor.dtype)
        if view not in seen:
            seen[view] = _read(tensor, byteorder, cancelled, progress, done, total)
        found = seen[view]
        done += tensor.nbytes
        if progress is not None:
            progress(done, total)
        if isinstance(found, str):
            yield TensorRow(path, tensor, None, found)
        else:
            yield TensorRow(path, tensor, found)


def _read(
    tensor: Tensor,
    byteorder: str,
    cancelled: Callable[[], bool] | None,
    progress: Callable[[int, int], None] | None,
    done: int,
    total: int,
) -> TensorStats | str:
    """The stats of one view, or why they cannot be read."""
    within = None
    if progress is not None:
        nbytes = tensor.nbytes

        def within(fraction: float) -> None:
            progress(done + int(fraction * nbytes), total)

    try:
        return tensor_stats(tensor, byteorder, cancelled, within)
    except ReadError as exc:
        return f"unreadable: {exc}"


def sort_rows(rows: list[TensorRow], column: str) -> list[TensorRow]:
    """Rows sorted by ``column``: path and dtype A→Z, numbers (and shapes) largest first; no value last."""
    if column not in COLUMNS:
        raise ValueError(f"unknown column {column!r}; one of {', '.join(COLUMNS)}")
    if column == "path":
        return sorted(rows, key=lambda row: to_slash(row.path))
    present = [row for row in rows if _sortable(row.value(column))]
    absent = [row for row in rows if not _sortable(row.value(column))]
    present.sort(key=lambda row: row.value(column), reverse=column not in ASCENDING)
    return present + absent


def _sortable(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))
