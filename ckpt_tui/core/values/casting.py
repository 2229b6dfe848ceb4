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
    """Raw elements of ``dtype`` as raw elements of ``target`` (``raw_type``), as torch's cast rounds them."""
    import numpy as np

    from ckpt_tui.core.values.tensor_values import decode

    with np.errstate(over="ignore", invalid="ignore"):  # out of range: ±inf, as torch's cast gives, unwarned
        values = decode(raw, dtype)
        return (to_bfloat16(values) if target == "bfloat16" else values).astype(raw_type)


def to_bfloat16(values: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float → bfloat16 bits (NaN stays NaN)."""
    import numpy as np

    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    rounded[np.isnan(values)] = 0x7FC0
    return rounded
