"""A plain state_dict's pickle read as rows, with the thinnest callbacks the C unpickler can call.

``torch.save(model.state_dict())`` pickles (protocol 2) an ``OrderedDict`` (or a dict) of str keys to
``torch._utils._rebuild_tensor_v2(<persistent id>, 0, size, stride, False, OrderedDict())``. The full reader
(:class:`~ckpt_tui.core.pickles.unpickle.SafeUnpickler`) checks each persistent id and each rebuild as it
comes and makes a ``Storage`` and a ``Tensor`` for it: three Python callbacks per tensor and most of the time
a 50,000-key file takes. Here each callback only keeps what it was given and hands back a fresh token; the
caller judges the kept rows in whole-column passes once the pickle ends, and takes them only when they are
exactly what the full reader makes of the same bytes (see ``readers/pth_columns.py``).

Anything a plain state_dict never holds stops this reader, and the caller reads the pickle the full way:
a global other than ``collections.OrderedDict``, ``_rebuild_tensor_v2`` and the storage types, any failure
of the load. Tokens refuse pickle's BUILD as the full reader's storages and tensors do, and are objects only
the callbacks make, so the file cannot pass anything else off as one.
"""

from __future__ import annotations

import io
import itertools
import math
import operator
import pickle
from dataclasses import dataclass
from typing import Any

from ckpt_tui.core.model.tree import INT64_LIMIT, LoadedOrderedDict, contiguous_strides, refuse_state
from ckpt_tui.core.pickles.unpickle import (
    KNOWN_GLOBALS,
    StorageType,
    _counts_fit,
    _rebuild_tensor_v2,
    _sealed,
    resolve_global,
)
from ckpt_tui.core.runtime import process

PROTOCOL = 2
"""torch.save's pickle protocol (``DEFAULT_PROTOCOL``): the only one read here."""


class Token(tuple[Any, ...]):
    """What a callback hands back: what it was given, in an object that only this call made. BUILD is refused
    (as the full reader's ``Storage`` and ``Tensor`` refuse it)."""

    __slots__ = ()
    __setstate__ = refuse_state


class NotPlain(Exception):
    """The pickle names a global that a plain state_dict never names: read it the full way."""


@dataclass
class PlainStateDict:
    """A plain state_dict's pickle as columns, row ``i`` the root's ``i``-th entry: what the full reader would
    make of it is ``root`` with each value ``Tensor(Storage(keys[i], dtypes[i], locations[i], numels[i], <the
    records>, type_names[i]), offsets[i], shapes[i], strides[i], dtypes[i])``, each storage its own."""

    root: dict[str, Any]
    """The root container as the pickle made it (its values still this reader's tokens)."""
    keys: list[str]
    """Each row's storage record key (distinct)."""
    dtypes: list[str]
    type_names: list[str]
    locations: list[str]
    """Each ``cpu``."""
    numels: list[int]
    """Each storage's element count: its tensor's, a row-major tensor over all of it from offset 0."""
    offsets: list[int]
    shapes: list[tuple[int, ...]]
    strides: list[tuple[int, ...]]


class RowUnpickler(pickle.Unpickler):
    """The C unpickler with callbacks that keep their arguments (:class:`Token`) and check nothing."""

    def __init__(self, file: io.BufferedReader) -> None:
        self.ids: list[Token] = []
        self.rows: list[Token] = []
        ids, rows = self.ids.append, self.rows.append

        # once per tensor each (50,000 times on big state_dicts): one token, one append
        def persistent_load(pid: Any) -> Token:
            token = Token((pid,))
            ids(token)
            return token

        def rebuild(*args: Any) -> Token:
            row = Token(args)
            rows(row)
            return row

        self.persistent_load = persistent_load  # type: ignore[method-assign]
        super().__init__(file, encoding="utf-8")
        self._rebuild = _sealed(rebuild, "torch._utils._rebuild_tensor_v2")

    def find_class(self, module: str, name: str) -> Any:
        full = resolve_global(module, name, PROTOCOL)
        known = KNOWN_GLOBALS.get(full) if full is not None else None
        if known is LoadedOrderedDict or type(known) is StorageType:
            return known
        if known is _rebuild_tensor_v2:
            return self._rebuild
        raise NotPlain(full)


_ROOT_OPENINGS = (b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01", b"\x80\x02}q\x00")
"""How torch.save's pickle of an ``OrderedDict`` or a dict starts (then a MARK, or one key alone)."""
_FIRST_VALUE = b"ctorch._utils\n_rebuild_tensor_v2\n"


def looks_plain(data: bytes) -> bool:
    """Whether the pickle starts as torch.save's of a flat state_dict: the root made, then its first key,
    then a rebuilt tensor (a checkpoint holding a state_dict under a key is read the full way at once)."""
    opening = next((start for start in _ROOT_OPENINGS if data.startswith(start)), None)
    if opening is None:
        return False
    at = len(opening) + data.startswith(b"(", len(opening))
    if not data.startswith(b"X", at):  # (BINUNICODE: a str key)
        return False
    key_end = at + 5 + int.from_bytes(data[at + 1 : at + 5], "little")
    # the key's BINPUT, then the rebuild function
    return data.startswith(b"q", key_end) and data.startswith(_FIRST_VALUE, key_end + 2)


def read_plain_state_dict(data: bytes) -> PlainStateDict | None:
    """The columns of a pickle that is a plain state_dict (see :class:`PlainStateDict`); None where it is not
    one, or not plainly (another global, an unusual call, a shared storage, a view, any failure): the full
    reader then reads it, and says what it says."""
    if not looks_plain(data):
        return None
    unpickler = RowUnpickler(io.BufferedReader(io.BytesIO(data)))
    try:
        with process.gc_paused(), process.heap_cap(len(data)):
            root = unpickler.load()
    except Exception:  # (NotPlain, or whatever the file does wrong: the full reader words it)
        return None
    rows, ids = unpickler.rows, unpickler.ids
    if not _rows_are_the_root(root, rows, ids):
        return None
    return _columns(root, rows, ids)


def _rows_are_the_root(root: Any, rows: list[Token], ids: list[Token]) -> bool:
    """Whether the root is a dict of str keys whose values are the rebuilt tensors, each once, in the order
    they were rebuilt, each rebuilt with six arguments over the persistent id read just before it. (Then no
    token is anywhere else in the tree but in the root's ``_metadata``, which the caller checks holds only
    scalars.)"""
    return (
        type(root) in (dict, LoadedOrderedDict)
        and 0 < len(root) == len(rows) == len(ids)
        # (an OrderedDict's own order is its dict's: nothing a pickle can call moves a key)
        and all(map(operator.is_, dict.values(root), rows))
        and set(map(type, dict.keys(root))) == {str}
        and set(map(len, rows)) == {6}
        and all(map(operator.is_, map(_FIRST, rows), ids))
    )


_FIRST, _KIND, _KEY, _LOCATION, _NUMEL = map(operator.itemgetter, range(5))
_OFFSET, _SHAPE, _STRIDE, _GRAD, _HOOKS = map(operator.itemgetter, range(1, 6))
_INT = {int}
_DTYPE = operator.attrgetter("dtype")
_NAME = operator.attrgetter("name")


def _columns(root: Any, rows: list[Token], ids: list[Token]) -> PlainStateDict | None:
    """The columns of rows and ids that are the usual ones of the full reader (``PersistentIds`` and the
    usual rebuild, :func:`~ckpt_tui.core.pickles.unpickle._fast_rebuilds`, then :func:`check_unchecked`), each
    tensor dense from offset 0 over a ``cpu`` storage of its own and exactly its size; else None. One pass
    over a column per check."""
    pids = list(map(_FIRST, ids))
    if set(map(type, pids)) != {tuple} or set(map(len, pids)) != {5}:
        return None
    firsts = list(map(_FIRST, pids))
    kinds, keys, locations, numels = (list(map(field, pids)) for field in (_KIND, _KEY, _LOCATION, _NUMEL))
    # (no global a plain state_dict names makes a str: each str here is one, so equal sets say equal values;
    # types first: a set of the values needs them hashable, and a memo slot can hold a dict where "storage" was)
    if (
        set(map(type, firsts)) != {str}
        or set(map(type, locations)) != {str}
        or set(firsts) != {"storage"}
        or set(locations) != {"cpu"}
        or set(map(type, kinds)) != {StorageType}
        or set(map(type, keys)) != {str}
        or set(map(type, numels)) != _INT
        or len(set(keys)) != len(keys)
    ):
        return None
    offsets, hooks = list(map(_OFFSET, rows)), list(map(_HOOKS, rows))
    if (
        set(map(type, offsets)) != _INT
        or any(offsets)
        or not all(map(operator.is_, map(_GRAD, rows), itertools.repeat(False)))
        or set(map(type, hooks)) != {LoadedOrderedDict}
        or any(map(len, hooks))
        or any(map(vars, hooks))
    ):
        return None
    shapes, strides = list(map(_SHAPE, rows)), list(map(_STRIDE, rows))
    if set(map(type, shapes)) != {tuple} or set(map(type, strides)) != {tuple}:
        return None
    sizes, steps = list(itertools.chain.from_iterable(shapes)), list(itertools.chain.from_iterable(strides))
    # (types first: a bool or a float compares equal to an int)
    if not set(map(type, sizes)) | set(map(type, steps)) <= _INT:
        return None
    # (row-major strides are positive, but past int64 where a size is 0: shape (0, 2**40, 2**40))
    if sizes and not (min(sizes) >= 0 and max(sizes) < INT64_LIMIT and max(steps, default=0) < INT64_LIMIT):
        return None
    if _row_major_counts(shapes, strides) != numels:  # (None too: a count past int64, or not row-major)
        return None
    dtypes, type_names = list(map(_DTYPE, kinds)), list(map(_NAME, kinds))
    return PlainStateDict(root, keys, dtypes, type_names, locations, numels, offsets, shapes, strides)


def _row_major_counts(shapes: list[tuple[int, ...]], strides: list[tuple[int, ...]]) -> list[int] | None:
    """Each tensor's element count where each is row-major (its strides those of ``set_`` without strides)
    and every count fits in int64; else None. Each distinct shape judged once, each shape hashed once."""
    rows = list(map(_ShapeFacts().__getitem__, shapes))
    counts = list(map(_COUNT, rows))
    if None in counts or list(map(_STRIDES, rows)) != strides:
        return None
    return counts


class _ShapeFacts(dict[tuple[int, ...], tuple[int | None, tuple[int, ...]]]):
    """A shape's element count (None past int64) and row-major strides, worked out when first asked for."""

    def __missing__(self, shape: tuple[int, ...]) -> tuple[int | None, tuple[int, ...]]:
        # (the count's product only where it fits: a shape of thousands of huge sizes is no huge product)
        facts = self[shape] = (math.prod(shape), contiguous_strides(shape)) if _counts_fit([shape]) else (None, ())
        return facts


_COUNT, _STRIDES = operator.itemgetter(0), operator.itemgetter(1)
