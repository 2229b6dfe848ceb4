"""Casts: a storage whose bytes are another storage's elements converted to a new dtype, made when they
are written (the edit changes no byte until then).

numpy is imported when the bytes are made: an edit that casts imports none of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ckpt_tui.core.errors import EditError
from ckpt_tui.core.model.tree import RecordSource, Storage, Tensor

if TYPE_CHECKING:
    import numpy as np


class CastSource(RecordSource):
    """Where a cast storage's bytes come from: another storage, converted when saved."""

    in_place = False
    made_on_save: str | None = "cast values"

    def __init__(self, base: Storage) -> None:
        self.base = base
        self.path = ""

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
            yield converted(raw, base.dtype, tensor.dtype, raw_type)


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


def to_bfloat16(values: np.ndarray, nan: int = 0xFFFF) -> np.ndarray:
    """Round-to-nearest-even float → bfloat16 bits; every NaN becomes ``nan`` (sign and payload dropped): 0xFFFF
    as torch's vectorised CPU cast of float32 and float64 writes it, 0x7FC0 as its scalar rounding does."""
    import numpy as np

    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    rounded[np.isnan(values)] = nan
    return rounded
