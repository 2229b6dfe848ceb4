"""Casts: a storage whose bytes are another storage's elements converted to a new dtype, made when they
are written (the edit changes no byte until then).

numpy is imported when the bytes are made: an edit that casts imports none of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckpt_tui.core.errors import EditError
from ckpt_tui.core.model.tree import RecordSource, Storage, Tensor

if TYPE_CHECKING:
    import numpy as np


@dataclass
class CastTally:
    """What a cast did to values its target cannot hold: finite values past its range made ±Inf, and nonzero
    values below its smallest subnormal made 0 (counted as the bytes are made, for the save's report)."""

    overflowed: int = 0
    flushed: int = 0


class CastSource(RecordSource):
    """Where a cast storage's bytes come from: another storage, converted when saved."""

    in_place = False
    made_on_save: str | None = "cast values"

    def __init__(self, base: Storage) -> None:
        self.base = base
        self.path = ""
        self.tally = CastTally()

    def locate(self, storage: Storage) -> tuple[int, int]:
        """Cast bytes exist only in the saved file."""
        raise EditError("the values of a cast tensor exist once it is saved")

    def check_view(self, tensor: Tensor) -> None:
        """Any view of the base storage can be cast (its reader checks its bounds)."""

    def view_elements(self, tensor: Tensor, chunk: int, raw_type: np.dtype) -> Iterator[np.ndarray]:
        """The same view of the base storage, its elements converted to ``raw_type`` (and its byte order)."""
        from ckpt_tui.core.values.tensor_values import TensorReader

        byteorder = "big" if raw_type.byteorder == ">" else "little"
        base = Tensor(self.base, tensor.offset, tensor.shape, tensor.stride, self.base.dtype)
        for raw in TensorReader(base, byteorder, saving=True).chunks(chunk):
            made = converted(raw, base.dtype, tensor.dtype, raw_type)
            if tensor.dtype in NARROWER:
                _count_lost(raw, base.dtype, made, tensor.dtype, self.tally)
            yield made


NARROWER = frozenset({"float16", "bfloat16", "float32"})
"""Cast targets that may not hold a value of a wider source: their losses are counted."""


def _count_lost(raw: np.ndarray, dtype: str, made: np.ndarray, target: str, tally: CastTally) -> None:
    """Add to ``tally`` the finite values ``made`` turned ±Inf and the nonzero ones it turned 0."""
    import numpy as np

    from ckpt_tui.core.values.tensor_values import decode

    with np.errstate(all="ignore"):
        before = decode(raw, dtype)
        after = decode(made.astype(made.dtype.newbyteorder("="), copy=False), target)
        tally.overflowed += int(np.count_nonzero(np.isinf(after) & np.isfinite(before)))
        tally.flushed += int(np.count_nonzero((after == 0) & (before != 0) & ~np.isnan(before)))


def converted(raw: np.ndarray, dtype: str, target: str, raw_type: np.dtype) -> np.ndarray:
    """Raw elements of ``dtype`` as raw elements of ``target`` (``raw_type``), as torch's cast rounds them, NaNs
    included (as its vectorised CPU cast gives them: ``tests/test_cast_bits.py``)."""
    import numpy as np

    from ckpt_tui.core.values.tensor_values import decode

    if dtype == "bfloat16" and target == "float32":
        # exact: the bits widened, a NaN's sign and payload kept as they are (a float64 step would quiet it)
        return np.left_shift(raw, 16, dtype=np.uint32).view(np.float32).astype(raw_type)
    with np.errstate(over="ignore", invalid="ignore"):  # out of range: ±inf, as torch's cast gives, unwarned
        values = decode(raw, dtype)
        if target == "bfloat16":
            # torch's float16 -> bfloat16 goes through c10's scalar rounding (NaN: 0x7FC0), the others its vector one
            return to_bfloat16(values, 0x7FC0 if dtype == "float16" else 0xFFFF).astype(raw_type)
        if target != "float16":
            return values.astype(raw_type)
        half = values.astype(np.float16)
        nan = np.isnan(values)
        if nan.any():
            # torch casts a NaN through float32 (the CPU's conversions: quieted, sign and payload's top bits kept);
            # numpy's float64 -> float16 neither quiets it nor goes through float32
            half[nan] = values[nan].astype(np.float32).astype(np.float16)
            half.view(np.uint16)[nan] |= 0x0200
    return half.astype(raw_type)


def cast_losses(root: object) -> str | None:
    """The save's note on what the tree's casts could not hold (None: nothing lost), naming a few tensors:
    read from the tallies the written bytes left."""
    from ckpt_tui.core.model.describe import counted
    from ckpt_tui.core.model.keypath import to_python
    from ckpt_tui.core.model.tree import iter_tensors

    overflowed = flushed = 0
    where: list[str] = []
    targets: dict[str, None] = {}
    seen: set[int] = set()
    for path, tensor in iter_tensors(root):
        source = tensor.storage.source if tensor.storage is not None else None
        # (a cast's bytes keep a tally; no other source has one: no source is asked its type)
        tally = getattr(source, "tally", None)
        if not isinstance(tally, CastTally) or id(tally) in seen:
            continue
        seen.add(id(tally))
        if tally.overflowed or tally.flushed:
            overflowed, flushed = overflowed + tally.overflowed, flushed + tally.flushed
            where.append(to_python(path))
            targets.setdefault(tensor.dtype)
    if not where:
        return None
    lost = []
    if overflowed:
        lost.append(f"{counted(overflowed, 'finite value')} past its range became ±Inf")
    if flushed:
        lost.append(f"{counted(flushed, 'nonzero value')} below its smallest became 0")
    named = ", ".join(where[:3]) + (f" (+{len(where) - 3} more)" if len(where) > 3 else "")
    to = " and ".join(targets)
    return f"the cast to {to} lost values: {'; '.join(lost)} (in {named}); check the output before using it"


def to_bfloat16(values: np.ndarray, nan: int = 0xFFFF) -> np.ndarray:
    """Round-to-nearest-even float → bfloat16 bits; every NaN becomes ``nan`` (sign and payload dropped): 0xFFFF
    as torch's vectorised CPU cast of float32 and float64 writes it, 0x7FC0 as its scalar rounding does."""
    import numpy as np

    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    rounded[np.isnan(values)] = nan
    return rounded
