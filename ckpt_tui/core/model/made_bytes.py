"""Record sources whose storages' bytes are made rather than copied from one range of one file: pieces
assembled from several files (``assembled``), a cast of another storage (``values/casting``), bytes
held in memory (here). Each says what it can do (:class:`MadeRecords`); no consumer asks its type."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol, cast

from ckpt_tui.core.errors import EditError, ReadError
from ckpt_tui.core.model.dtypes import itemsize
from ckpt_tui.core.model.tree import RecordSource, Storage, Tensor

if TYPE_CHECKING:  # numpy is imported where values are read: opening a file does not need it
    import numpy as np


class MadeRecords(Protocol):
    """A record source whose ``in_place`` is False: its storages' bytes are made while read or written."""

    path: str
    in_place: bool

    made_on_save: str | None
    """What a user calls values that exist only once saved (``cast values``): they are made for a write,
    never read before it; None where they can be read now (pieces of other files)."""

    def locate(self, storage: Storage) -> tuple[int, int]:
        """Made bytes have no place in one file: refused with why."""
        ...

    def check_view(self, tensor: Tensor) -> None:
        """Refuse a view whose elements it cannot make (a ReadError saying why), before any is read."""
        ...

    def view_elements(self, tensor: Tensor, chunk: int, raw_type: np.dtype) -> Iterator[np.ndarray]:
        """The raw elements of a view over one of its storages, in row-major order, in pieces of about
        ``chunk`` (``raw_type``: the view's dtype in the byte order wanted)."""
        ...


def made_records(source: RecordSource | None) -> MadeRecords | None:
    """``source`` as the maker of its storages' bytes, or None where they lie in a file as they are."""
    if source is None or source.in_place:
        return None
    # every source not in place is made (a test holds the made sources to this protocol)
    return cast(MadeRecords, source)


class MemorySource(RecordSource):
    """A storage whose bytes are held in memory (sanitize turns numpy arrays into tensors); written as they are."""

    in_place = False
    made_on_save: str | None = "rewritten values"

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.path = ""

    def locate(self, storage: Storage) -> tuple[int, int]:
        """These bytes are in no file until saved."""
        raise EditError("the values of a rewritten tensor exist once it is saved")

    def check_view(self, tensor: Tensor) -> None:
        """Only contiguous views (sanitize and the quantized rewrites make them so)."""
        if not tensor.is_contiguous():
            raise ReadError("only contiguous views of rewritten bytes can be read")

    def view_elements(self, tensor: Tensor, chunk: int, raw_type: np.dtype) -> Iterator[np.ndarray]:
        """The held bytes from the view's offset, as one piece."""
        import numpy as np

        self.check_view(tensor)
        start = tensor.offset * itemsize(tensor.dtype)
        data = self.data[start : start + tensor.nbytes]
        yield np.frombuffer(data, raw_type)


class UnreadSource(RecordSource):
    """A storage whose values torch.load changes while loading in a way not reproduced here (a tensor's
    pickled state sets ``real`` or ``imag``): its bytes on disk are not what torch loads, so they are never
    shown, checked or copied as its values. Reading them, or writing them out, fails with ``why``."""

    in_place = True

    def __init__(self, base: Any, why: str) -> None:
        self.base = base
        self.why = why
        self.path = getattr(base, "path", "")

    @classmethod
    def over(cls, source: Any, why: str) -> UnreadSource:
        """``source`` marked as not read (once: a source marked already keeps its first ``why``)."""
        return source if isinstance(source, cls) else cls(source, why)

    def locate(self, storage: Storage) -> tuple[int, int]:
        """Never: the values torch loads are not these bytes."""
        raise ReadError(f"values not read: {self.why} while torch.load loads it (not reproduced here)")
