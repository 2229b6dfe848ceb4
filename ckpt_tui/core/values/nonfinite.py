"""Where a tensor's NaN and Inf are: the first position of each, and the sign of its infinities.

Read only for a tensor already found to hold one (``check``, ``stats``, the browser's side panel), so the
cost of a second, row-major read is paid where the answer is wanted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ckpt_tui.core.errors import Cancelled, CkptError, ReadError, ReadStopped
from ckpt_tui.core.model.tree import Tensor
from ckpt_tui.core.values.stats import TensorStats, tensor_stats
from ckpt_tui.core.values.tensor_values import TensorReader, decode, nan_beside_inf, repeats_far_more


@dataclass(frozen=True)
class NonFinite:
    """The first NaN and the first Inf of a tensor, as indices into its shape (None: it holds none)."""

    first_nan: tuple[int, ...] | None
    first_inf: tuple[int, ...] | None


def locate_nonfinite(
    tensor: Tensor, byteorder: str = "little", cancelled: Callable[[], bool] | None = None
) -> NonFinite | None:
    """The first NaN and first Inf in row-major order (None: unreadable, cancelled, or a view repeating its
    elements other than along stride-0 dimensions, whose element-by-element read would cost far more than
    its storage)."""
    if repeats_far_more(tensor):
        return _repeated_nonfinite(tensor, byteorder, cancelled)
    try:
        reader = TensorReader(tensor, byteorder)
        nan_at = inf_at = None
        done = 0
        for raw in reader.chunks():
            if cancelled is not None and cancelled():
                return None
            nan_here, inf_here = _chunk_firsts(raw, tensor)
            if nan_at is None and nan_here is not None:
                nan_at = done + nan_here
            if inf_at is None and inf_here is not None:
                inf_at = done + inf_here
            if nan_at is not None and inf_at is not None:
                break
            done += raw.size
    except ReadError:
        return None
    shape = tensor.shape
    return NonFinite(_index(nan_at, shape), _index(inf_at, shape))


def _repeated_nonfinite(tensor: Tensor, byteorder: str, cancelled: Callable[[], bool] | None) -> NonFinite | None:
    """A stride-0 (``expand``) view's firsts without expanding it: an index along a stride-0 dimension never
    changes the element, so the row-major first is at index 0 there and, along the other dimensions, at the
    first of the view without them (what ``torch.isnan(t).nonzero()[0]`` gives)."""
    kept = [d for d, step in enumerate(tensor.stride) if step != 0]
    compact = dataclasses.replace(
        tensor, shape=tuple(tensor.shape[d] for d in kept), stride=tuple(tensor.stride[d] for d in kept)
    )
    if repeats_far_more(compact):
        return None
    found = locate_nonfinite(compact, byteorder, cancelled)
    if found is None:
        return None
    return NonFinite(*(_widened(at, kept, len(tensor.shape)) for at in (found.first_nan, found.first_inf)))


def _widened(at: tuple[int, ...] | None, kept: list[int], ndim: int) -> tuple[int, ...] | None:
    """An index into the kept dimensions as an index into all ``ndim``, 0 along the others."""
    if at is None:
        return None
    full = [0] * ndim
    for dim, index in zip(kept, at, strict=True):
        full[dim] = index
    return tuple(full)


def sparse_nonfinite(tensor: Tensor, byteorder: str = "little") -> NonFinite | None:
    """A sparse tensor's first NaN and first Inf as positions in the tensor (None: not told)."""
    from ckpt_tui.core.values.sparse_checks import sparse_firsts

    try:
        found = sparse_firsts(tensor, byteorder)
    except (ReadError, ValueError):
        return None
    return None if found is None else NonFinite(*found)


def _chunk_firsts(raw: np.ndarray, tensor: Tensor) -> tuple[int | None, int | None]:
    """The first NaN's and first Inf's offsets in one chunk (a complex value: of its magnitude, as the
    statistics count it, and a NaN where a part is NaN beside an Inf one, as torch's isnan says)."""
    with np.errstate(all="ignore"):
        values = decode(raw, tensor.dtype, tensor.metadata)
    nan = np.isnan(values)
    beside = nan_beside_inf(raw, tensor.dtype)
    return _first(nan if beside is None else nan | beside), _first(np.isinf(values))


def _first(mask: np.ndarray) -> int | None:
    """The offset of the first True (None: none)."""
    return int(mask.argmax()) if mask.any() else None


def _index(flat: int | None, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """A row-major offset as an index into ``shape``."""
    if flat is None:
        return None
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


def describe_nonfinite(stats: TensorStats, where: NonFinite | None) -> str:
    """'1 NaN, 2 Inf (1 +Inf, 1 -Inf) of 64 values; first NaN at [0, 3], first Inf at [2, 1]': the one
    sentence ``check`` and ``stats`` give for a tensor that holds NaN or Inf."""
    # only what is there: "1 NaN of 4 values", "2 +Inf of 4 values", never "0 Inf"
    found = [f"{stats.nan} NaN"] if stats.nan else []
    if stats.posinf and stats.neginf:
        found.append(f"{stats.inf} Inf ({stats.posinf} +Inf, {stats.neginf} -Inf)")
    elif stats.inf:
        found.append(f"{stats.inf} {'+' if stats.posinf else '-'}Inf")
    text = f"{', '.join(found) or '0 NaN, 0 Inf'} of {stats.count} values"
    if where is None:
        return text
    firsts = (("NaN", where.first_nan), ("Inf", where.first_inf))
    places = [f"first {name} at {list(at)}" for name, at in firsts if at is not None]
    return text + ("; " + ", ".join(places) if places else "")


@dataclass(frozen=True)
class SideCounts:
    """How many NaN and Inf each side of a compared pair holds, of ``numel`` values each: what a per-layer row
    and a diff row say in place of numbers summed over the positions left (``all 2048 NaN in B``)."""

    numel: int
    nan_a: int = 0
    inf_a: int = 0
    nan_b: int = 0
    inf_b: int = 0

    def words(self, a: str = "A", b: str = "B") -> str:
        """``all 2048 NaN in B``, ``3 NaN in B``, ``1 NaN in A, 5 NaN and 2 Inf in B``."""
        sides = [(side, nan, inf) for side, nan, inf in ((a, self.nan_a, self.inf_a), (b, self.nan_b, self.inf_b))]
        return ", ".join(f"{self._side(nan, inf)} in {side}" for side, nan, inf in sides if nan or inf)

    def _side(self, nan: int, inf: int) -> str:
        if nan + inf == self.numel > 0:
            kinds = "NaN" if not inf else "Inf" if not nan else "NaN or Inf"
            return f"all {self.numel} {kinds}"
        return " and ".join(f"{count} {kind}" for count, kind in ((nan, "NaN"), (inf, "Inf")) if count)

    @property
    def whole_side(self) -> bool:
        """Whether one side holds no finite value at all (nothing of the pair can be compared)."""
        return self.numel > 0 and self.numel in (self.nan_a + self.inf_a, self.nan_b + self.inf_b)

    def to_json(self) -> dict[str, int]:
        """``{"nan_a", "inf_a", "nan_b", "inf_b"}``."""
        return {"nan_a": self.nan_a, "inf_a": self.inf_a, "nan_b": self.nan_b, "inf_b": self.inf_b}


def side_counts(
    x: Tensor, y: Tensor, order_a: str, order_b: str, cancelled: Callable[[], bool] | None = None
) -> SideCounts | None:
    """The NaN and Inf of each side of a pair (a second read, made only for a pair found to hold some); None
    when a side cannot be read."""
    try:
        first, second = tensor_stats(x, order_a, cancelled), tensor_stats(y, order_b, cancelled)
    except (Cancelled, ReadStopped):
        raise
    except CkptError:
        return None
    return SideCounts(x.numel, first.nan, first.inf, second.nan, second.inf)
