"""Columns for a ``.pth`` state_dict that keeps :class:`~ckpt_tui.core.model.tree.FlatColumns`' promise.

``torch.save(model.state_dict())`` writes what a safetensors file holds: str keys, plain tensors each
over its own storage of exactly its size, dense from offset 0. When a read tree is that, checked here
in passes over whole columns (C speed on 50,000 tensors), totals and findings come from the columns
as for a safetensors file. Anything else (a shared storage, a view, a GPU tag, a Parameter, an odd
``_metadata``...) gets no columns, and is walked as any tree.
"""

from __future__ import annotations

import collections
import itertools
import math
import operator
from typing import TYPE_CHECKING, Any

from ckpt_tui.core.model.dtypes import itemsize
from ckpt_tui.core.model.tree import INT64_LIMIT, FlatColumns, LoadedOrderedDict, Storage, Tensor, over_whole_storages
from ckpt_tui.core.pickles.plain_rows import PlainStateDict, read_plain_state_dict
from ckpt_tui.core.readers.zip_archive import ZipEntry

if TYPE_CHECKING:
    from ckpt_tui.core.readers.torch_zip import ZipRecords

_PLAIN_FIELDS = operator.attrgetter(
    "hooks", "metadata", "parameter_state", "python_type", "python_state", "requires_grad", "parameter", "kind"
)
_PLAIN = (None, None, None, None, None, False, False, "dense")
"""What ``torch.save`` of a state_dict gives each tensor (a dense kind has no quantizer or sparse parts)."""
_STORAGE = operator.attrgetter("storage")
_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")
_METADATA_VALUES = (str, bool, type(None))


def state_dict_columns(root: Any) -> FlatColumns | None:
    """Columns for ``root`` as an unpickler made it, or None unless it is a plain state_dict.

    Its tensors' values were checked as they were made (sizes, strides and offset in int64); the
    caller makes sure that every storage's record is present (else: no columns, and the walk says so).
    """
    if type(root) not in (dict, LoadedOrderedDict) or not root or not _plain_metadata(root):
        return None
    tensors = list(root.values())
    if set(map(type, root)) != {str} or set(map(type, tensors)) != {Tensor} or not _plain(tensors):
        return None
    storages = list(map(_STORAGE, tensors))
    if not over_whole_storages(tensors) or not _one_each(storages):
        return None
    if set(map(operator.attrgetter("location"), storages)) != {"cpu"}:
        return None
    numels = list(map(math.prod, map(_SHAPE, tensors)))
    dtypes = list(map(_DTYPE, tensors))
    return FlatColumns(root, dtypes, numels)


def _plain_metadata(root: Any) -> bool:
    """No attribute but a ``_metadata`` as ``state_dict()`` writes it: module name to a dict of scalars."""
    attributes = getattr(root, "__dict__", {})
    if not attributes:
        return True
    metadata = attributes.get("_metadata")
    if len(attributes) != 1 or type(metadata) is not collections.OrderedDict:
        return False
    entries = list(metadata.values())
    if set(map(type, entries)) - {dict}:
        return False
    keys = list(itertools.chain.from_iterable(entries))
    values = list(itertools.chain.from_iterable(map(dict.values, entries)))
    if set(map(type, keys)) - {str}:
        return False
    numbers = [value for value in values if type(value) is int]
    if any(not -INT64_LIMIT <= number < INT64_LIMIT for number in numbers):
        return False
    return all(type(value) is int or type(value) in _METADATA_VALUES for value in values)


def _plain(tensors: list[Tensor]) -> bool:
    """Every tensor dense and plain: nothing hidden, no Python type or state, not a Parameter, no grad.

    One tuple per tensor, compared with :data:`_PLAIN` (each part first by identity; never hashed)."""
    return all(map(operator.eq, map(_PLAIN_FIELDS, tensors), itertools.repeat(_PLAIN)))


def _one_each(storages: list[Storage]) -> bool:
    """Every tensor over a storage of its own (then no tensor object is listed twice either)."""
    return len(set(map(id, storages))) == len(storages)


def plain_columns(data: bytes, records: ZipRecords) -> FlatColumns | None:
    """The columns of a zip checkpoint's ``data.pkl`` that is a plain state_dict, its root pending (no
    Storage or Tensor made until asked for): where the full reader (``load_with_records``) would find every
    persistent id and rebuild as torch.save writes them, every record present, of its storage's size and
    written, no loader problem, and :func:`state_dict_columns` would give these columns. None otherwise: the
    caller reads the pickle the full way, which says what it says."""
    plain = read_plain_state_dict(data)
    if plain is None or not _plain_metadata(plain.root) or not _records_hold(records, plain):
        return None

    def make(start: int, stop: int) -> list[Tensor]:
        """The tensors of rows ``start`` to ``stop``, as the full reader makes them."""
        dtypes = plain.dtypes[start:stop]
        storages = map(
            Storage,
            plain.keys[start:stop],
            dtypes,
            plain.locations[start:stop],
            plain.numels[start:stop],
            itertools.repeat(records),
            plain.type_names[start:stop],
        )
        offsets, shapes, strides = plain.offsets[start:stop], plain.shapes[start:stop], plain.strides[start:stop]
        return list(map(Tensor, storages, offsets, shapes, strides, dtypes))

    # (an OrderedDict the pickle made: its order is its dict's, see plain_rows)
    names, count = list(dict.keys(plain.root)), len(plain.keys)
    return FlatColumns.pending(
        names, plain.dtypes, plain.numels, plain.shapes, plain.strides, plain.keys, [records] * count, make, plain.root
    )


_SIZE = operator.attrgetter("size")
_COMPRESSED_SIZE = operator.attrgetter("compressed_size")
_DIRECTORY = operator.attrgetter("directory")


def _records_hold(records: ZipRecords, plain: PlainStateDict) -> bool:
    """Whether every storage's record is the member of exactly its name (no NUL in it), holds exactly the
    storage's bytes (within the file), and is written (:func:`~ckpt_tui.core.readers.zip_archive.unwritten`):
    then the full reader's ``make`` raises nothing and notes nothing."""
    names = list(map((records.folder).__add__, plain.keys))
    if "\0" in "".join(names):
        return False
    found: list[ZipEntry | None] = list(map(dict.get, itertools.repeat(records.entries), names))
    if not all(found):  # (by truth: an entry is never compared with None, by its dataclass __eq__)
        return False
    entries: list[ZipEntry] = found  # type: ignore[assignment]
    sizes = {dtype: itemsize(dtype) for dtype in set(plain.dtypes)}
    declared = list(map(operator.mul, plain.numels, map(sizes.__getitem__, plain.dtypes)))
    return (
        max(declared) <= records.file_bytes
        and list(map(_SIZE, entries)) == declared
        and not any(map(_DIRECTORY, entries))
        # (a record torch writes nothing of: not empty, compressed to 0 bytes)
        and not any(itertools.compress(declared, map(operator.not_, map(_COMPRESSED_SIZE, entries))))
    )
