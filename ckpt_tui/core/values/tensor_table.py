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

from ckpt_tui.core.errors import ReadError, ReadStopped
from ckpt_tui.core.model.keypath import KeyPath, to_json, to_slash
from ckpt_tui.core.model.tree import Tensor, hidden_tensors, view_key, walk
from ckpt_tui.core.values.batched_stats import planned_stats
from ckpt_tui.core.values.batched_values import MIN_BATCHED, ViewPlan, batch_bounds, batchable
from ckpt_tui.core.values.stats import TensorStats, tensor_stats

COLUMNS = ("path", "shape", "dtype", "numel", "min", "max", "mean", "std", "norm", "absmax", "zeros", "nan", "inf")
"""The columns, in the order of the table and of ``stats --json``'s objects."""
_STATS_FIELDS = frozenset({"min", "max", "mean", "std", "norm", "absmax"})
"""Columns that are fields of :class:`~ckpt_tui.core.values.stats.TensorStats` as they are."""
ASCENDING = frozenset({"path", "dtype"})
"""Columns sorted A→Z; every other column sorts largest first (``--sort norm``: the biggest norms on top)."""


UNREADABLE, MISSING_RECORD = "unreadable", "record"
UNREADABLE_REASONS = (UNREADABLE + ":", MISSING_RECORD + " ")
"""How a row's reason starts when its tensor is one torch.load refuses (the others: not read here)."""


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
        if column in _STATS_FIELDS:  # the usual question first
            return None if self.stats is None else getattr(self.stats, column)
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

    @property
    def unreadable(self) -> bool:
        """Whether its values cannot be read as torch would load them (a problem, as ``check`` counts it); a
        sparse, quantized or meta tensor is not read here, and is not."""
        return self.stats is None and self.reason is not None and self.reason.startswith(UNREADABLE_REASONS)

    def to_json(self) -> dict[str, Any]:
        """The ``stats --json`` object of this tensor (a contract: fields are only ever added)."""
        out: dict[str, Any] = {column: self.value(column) for column in COLUMNS}
        out["path"] = to_json(self.path)
        out["shape"] = list(self.shape)
        out["reason"] = self.reason
        out["posinf"] = None if self.stats is None else self.stats.posinf
        out["neginf"] = None if self.stats is None else self.stats.neginf
        return out


def tensor_paths(root: Any, at: KeyPath = ()) -> list[tuple[KeyPath, Tensor]]:
    """Every shown reference to a tensor below ``root`` (already the value at ``at``), in tree order, then the
    tensors torch.load builds that no shown path reaches (:func:`~ckpt_tui.core.model.tree.hidden_tensors`)."""
    references = list(walk(root, at))
    shown = [(path, value) for path, value, is_shown, _ in references if is_shown and isinstance(value, Tensor)]
    return shown + hidden_tensors(references)


def unreadable_reason(tensor: Tensor) -> str | None:
    """Why a tensor's values are not read here, or None when they are."""
    if tensor.kind != "dense":
        return f"{tensor.kind} tensor: its values are not read"
    if tensor.storage is None:
        return "no storage in the file (meta tensor)"
    source = tensor.storage.source
    if source is not None and hasattr(source, "has") and not source.has(tensor.storage):
        return f"{MISSING_RECORD} {tensor.storage.key} is missing from the file"
    return None


def tensor_rows(
    tensors: list[tuple[KeyPath, Tensor]],
    byteorder: str = "little",
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[TensorRow]:
    """One row per tensor reference, each view of the same bytes read once.

    Small views are read a batch at a time (:func:`~ckpt_tui.core.values.batched_stats.planned_stats`), the
    rest, and any view a batch leaves out, one by one (:func:`~ckpt_tui.core.values.stats.tensor_stats`).
    ``progress(done, total)`` is called in bytes of the views read so far; ``cancelled`` is polled between
    chunks and batches (it raises :class:`~ckpt_tui.core.errors.Cancelled`).
    """
    sizes = [tensor.nbytes for _, tensor in tensors]
    reasons = [unreadable_reason(tensor) for _, tensor in tensors]
    views = [None if reason else view_key(tensor) for (_, tensor), reason in zip(tensors, reasons, strict=True)]
    batches = _Batches(tensors, sizes, views)
    seen: dict[tuple[Any, ...], TensorStats | str] = {}
    total, done = sum(sizes), 0
    for position, ((path, tensor), size, reason, view) in enumerate(zip(tensors, sizes, reasons, views, strict=True)):
        if view is None:
            yield TensorRow(path, tensor, None, reason)
            done += size
            continue
        if position >= batches.upcoming:
            batches.read_until(position, seen, byteorder, cancelled)
        if view not in seen:
            seen[view] = _read(tensor, byteorder, cancelled, progress, done, total)
        found = seen[view]
        done += size
        if progress is not None:
            progress(done, total)
        if isinstance(found, str):
            yield TensorRow(path, tensor, None, found)
        else:
            yield TensorRow(path, tensor, found)


class _Batches:
    """The small views of a table, planned once and read a batch of about :data:`BATCH_BYTES` at a time,
    each batch when the rows reach its first view."""

    def __init__(
        self, tensors: list[tuple[KeyPath, Tensor]], sizes: list[int], views: list[tuple[Any, ...] | None]
    ) -> None:
        first: dict[tuple[Any, ...], int] = {}
        for position, ((_, tensor), size, view) in enumerate(zip(tensors, sizes, views, strict=True)):
            if view is not None and view not in first and batchable(tensor, size):
                first[view] = position
        if len(first) < MIN_BATCHED:
            first.clear()
        self.views = list(first)
        self.positions = list(first.values())
        self.plan = ViewPlan([tensors[position][1] for position in self.positions])
        self.bounds = batch_bounds([sizes[position] for position in self.positions])
        self.next = 0
        self.upcoming = self._first_row()
        """The row at which the next batch is read (past every row when none is left)."""

    def read_until(
        self,
        position: int,
        seen: dict[tuple[Any, ...], TensorStats | str],
        byteorder: str,
        cancelled: Callable[[], bool] | None,
    ) -> None:
        """Read every batch whose first view is at or before row ``position``; ``seen`` takes their stats."""
        while self.next + 1 < len(self.bounds) and self.positions[self.bounds[self.next]] <= position:
            chosen = range(self.bounds[self.next], self.bounds[self.next + 1])
            self.next += 1
            for index, stats in planned_stats(self.plan, chosen, byteorder, cancelled).items():
                seen[self.views[index]] = stats
        self.upcoming = self._first_row()

    def _first_row(self) -> int:
        return self.positions[self.bounds[self.next]] if self.next + 1 < len(self.bounds) else 1 << 62


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
    except ReadStopped:
        raise
    except ReadError as exc:
        return f"{UNREADABLE}: {exc}"


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
