"""The tree model: what a checkpoint holds, rebuilt as inert data.

A checkpoint's root is built from plain Python containers (dict, OrderedDict, list,
tuple, set) holding scalars, strings, bytes and the node types below. Nothing here
imports torch; nothing here ever runs code from the file.

Every node type a pickle can reach refuses pickle's BUILD (``__setstate__``): once a
stand-in is validated, the file cannot change its shape, dtype, storage or attributes. The one
exception is torch's own: BUILD on a Parameter sets its requires_grad and hooks, or swaps in the
storage, shape and dtype of another (validated) tensor, as ``Tensor.__setstate__`` does.
Every walk over a tree visits each object once, so time and memory follow the file's size,
never the number of paths through shared objects.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import operator
import pickle
import re
import reprlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, NoReturn, Protocol

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model.dtypes import DTYPES, itemsize
from ckpt_tui.core.model.formats import FormatId
from ckpt_tui.core.model.keypath import Attr, Key, KeyPath

INT64_MIN = -(1 << 63)
INT64_LIMIT = 1 << 63
MAX_INT_BITS = 12_000
"""Ints longer than this (about 3,600 digits) are refused: ``str()`` of one past 4,300 digits raises."""
MAX_DEPTH = 100


def refuse_state(*_args: Any) -> NoReturn:
    """``__setstate__`` of the stand-ins that take no state: pickle's BUILD on them is refused."""
    raise pickle.UnpicklingError("BUILD on a value that takes no state (tensor, storage, size, dtype, device)")


def _empty(state: Any) -> bool:
    return state is None or (type(state) in (dict, tuple, list, str, bytes, int, float, bool) and not state)


def empty_state_only(_self: Any, state: Any) -> None:
    """``__setstate__`` of the stand-ins torch builds as plain values: an empty state changes nothing, as in torch.

    torch's BUILD on an allowed value without ``__setstate__`` updates its ``__dict__`` only when the state
    is not empty; any other state is refused (these values have no attributes to set).
    """
    if type(state) is tuple and len(state) == 2 and _empty(state[0]) and _empty(state[1]):
        return
    if not _empty(state):
        refuse_state()


class RecordSource(Protocol):
    """Where the bytes of storages live: one per file (a zip, a legacy file, a safetensors file)."""

    path: str
    in_place: bool
    """Whether the storages' bytes lie as they are in one range of ``path`` (copied as they are); else
    they are made while written (a cast, bytes in memory, pieces assembled from several files)."""

    def locate(self, storage: Storage) -> tuple[int, int]:
        """Absolute byte offset of the storage's data in ``path``, and the bytes available there."""
        ...

    version: str | None = None
    """``path``'s version (``byte_source.version_of``) as it was opened: its values are read only while the file
    is still that version (``FileChanged`` otherwise); None where nothing is checked (bytes in memory, a URL,
    whose ranges check their own)."""

    # What a source can say beyond locate, each with a default for a source that cannot: consumers ask
    # these, never the source's type (a record source subclasses this protocol to inherit the defaults).

    def zip_members(self) -> ZipMembers | None:
        """The zip archive this source's records are members of (its entries, folder and size), or None."""
        return None

    def batched_members(self) -> ZipMembers | None:
        """The zip archive whose small stored records a writer may read, check and write as a run (local
        headers parsed from one window), or None where each record goes on its own."""
        return None

    def stored_spans(self) -> dict[str, tuple[int, int]] | None:
        """Each stored record's data offset and size, by key, from the local headers read at once; None
        where this source has no such places (its views are read the exact way)."""
        return None

    def stored_places(self, keys: list[str]) -> list[tuple[int, int] | None] | None:
        """:meth:`stored_spans` of these keys, in order (None for a record without one); None where this
        source has no such places."""
        return None

    def header_ranges(self) -> HeaderRanges | None:
        """The source itself where its records are ranges a file's header gives (a safetensors file), or None."""
        return None


class ZipMembers(Protocol):
    """A record source whose storages are the stored members of a zip archive (``folder + key``)."""

    path: str
    version: str | None
    folder: str
    file_bytes: int
    """Where the archive ends in ``path`` (a record must end before it)."""

    @property
    def entries(self) -> Any:
        """The central directory read: member name -> entry (``name``, ``header_offset``, ``size``,
        ``compress``, ``crc``), as ``readers/zip_archive`` reads it."""
        ...

    def entry(self, storage: Storage) -> Any:
        """The directory's entry of a storage's record (a ReadError where it is missing)."""
        ...

    def locate(self, storage: Storage) -> tuple[int, int]:
        """The record's data offset and size, read and checked as the reader reads them."""
        ...


class HeaderRanges(Protocol):
    """A record source whose storages are ranges of one file's data, by key, as its header gives them."""

    path: str
    version: str | None
    data_start: int
    """Where the data (the ranges' 0) starts in ``path``."""

    @property
    def ranges(self) -> dict[str, list[int]]:
        """Each storage key's ``[begin, end]`` in the data."""
        ...

    def missing(self, storages: list[Storage]) -> list[Storage]:
        """The storages without a range."""
        ...


@dataclass(slots=True, eq=False)
class Storage:
    """One storage record: tensors that share it share memory (tied weights, views).

    Compared by identity: two tensors share storage exactly when ``a.storage is b.storage``. Not
    changed once made (edits make new ones with ``dataclasses.replace``); not frozen, because a frozen
    dataclass's ``__init__`` is five times slower, once per storage (50,000 on big files). BUILD is refused.
    """

    key: str
    dtype: str
    location: str
    numel: int
    source: RecordSource | None = field(default=None, repr=False)
    type_name: str = ""

    __setstate__ = refuse_state

    @property
    def nbytes(self) -> int:
        """Size of the storage in bytes."""
        return self.numel * itemsize(self.dtype)


@dataclass(frozen=True, slots=True)
class Symbol:
    """A torch constant named by a global: a dtype (``torch.float32``), layout, qscheme..."""

    qualname: str

    __setstate__ = refuse_state

    @property
    def name(self) -> str:
        """The last part of the name (``float32``)."""
        return self.qualname.rsplit(".", 1)[-1]

    def __repr__(self) -> str:
        return self.qualname


LAYOUTS = frozenset(
    f"torch.{name}"
    for name in ("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "_mkldnn", "jagged")
)
SPARSE_LAYOUTS = frozenset(
    {"torch.sparse_coo", "torch.sparse_csr", "torch.sparse_csc", "torch.sparse_bsr", "torch.sparse_bsc"}
)


@dataclass(frozen=True, slots=True)
class Layout(Symbol):
    """A ``torch.layout`` (``torch.sparse_coo``...), pickled by torch as ``torch.serialization._get_layout(name)``."""

    __setstate__ = refuse_state


TORCH_DEVICE = re.compile(r"([a-z]+)(?::(0|[1-9][0-9]*))?", re.ASCII)
"""What ``torch.device(str)`` parses (``c10::Device``): a name, then ``:`` and an index of ASCII digits with no
leading zero (``cuda:01``, ``cuda:٠`` are refused); the name must be a device type (lower case) and the index
fit :data:`DEVICE_STRING_INDEX_LIMIT`. Use with ``fullmatch``."""
DEVICE_STRING_INDEX_LIMIT = 1 << 31
"""A device string's index is read by ``std::stoi``: one of 2**31 or more is refused ("Could not parse device
index"); a smaller one is cut to 8 bits, and loads."""
DEVICE_INDEX_LIMIT = 1 << 63
"""``torch.device(type, index)`` reads the index as a 64-bit int: 2**63 or more is refused (an overflow)."""


@dataclass(frozen=True, slots=True)
class Device:
    """A ``torch.device`` value stored in the checkpoint."""

    type: str
    index: int | None = None

    __setstate__ = empty_state_only

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"


# Python 3.11.0 to 3.11.3 replace a frozen slotted dataclass's own __setstate__ by one that takes any state
# (gh-104035): set again on the classes made, so that BUILD on a torch constant is refused on every 3.11
Symbol.__setstate__ = refuse_state
Layout.__setstate__ = refuse_state
Device.__setstate__ = empty_state_only


class TorchSize(tuple[int, ...]):
    """A ``torch.Size`` value (a tuple of int64 that pickles back as ``torch.Size``)."""

    __slots__ = ()

    def __new__(cls, dims: Any = ()) -> TorchSize:
        values = tuple(dims)
        for value in values:
            if type(value) is not int or not INT64_MIN <= value < INT64_LIMIT:
                raise ValueError("torch.Size holds a value that is not an int64")
        return super().__new__(cls, values)

    __setstate__ = empty_state_only


class LoadedOrderedDict(collections.OrderedDict[Any, Any]):
    """An ``OrderedDict`` read from a file. BUILD may give it only a valid ``_metadata``, once.

    A plain OrderedDict accepts any attribute through BUILD, including ones that shadow its
    methods (``items``); this one refuses them. ``_metadata`` must be a dict with str keys, and is
    copied, so the file cannot change it after it was checked.
    """

    def __repr__(self) -> str:
        # an OrderedDict, as the file names it (messages quote it: this reader's class is no part of the file)
        return collections.OrderedDict.__repr__(self).replace(type(self).__name__, "OrderedDict", 1)

    def __setstate__(self, state: Any) -> None:
        if "_metadata" in self.__dict__:
            raise pickle.UnpicklingError("BUILD applied twice to an OrderedDict")
        if not isinstance(state, dict) or any(key != "_metadata" for key in state):
            raise pickle.UnpicklingError("BUILD sets attributes on an OrderedDict other than _metadata")
        if not state:
            return
        metadata = state["_metadata"]
        if not isinstance(metadata, dict) or not all(type(key) is str for key in metadata):
            raise pickle.UnpicklingError("a state_dict's _metadata is not a dict with str keys")
        self.__dict__["_metadata"] = collections.OrderedDict(metadata)


_SPARSE_PARTS = {
    "sparse_coo": ("indices", "values", "size", "coalesced"),
    "compressed": ("compressed_indices", "plain_indices", "values", "size"),
}
_GRAD_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16", "complex128", "complex64", "complex32"})
"""Dtypes a tensor requiring grad may have (torch allows more float kinds; those are refused here)."""
_QUANTIZED_INTS = {"qint8": "int8", "quint8": "uint8", "qint32": "int32"}
_PER_TENSOR = ("qscheme", "scale", "zero_point")
_PER_CHANNEL = ("qscheme", "scales", "zero_points", "axis")


@dataclass(slots=True, eq=False)
class Tensor:
    """Metadata of one tensor; its values stay in the file until asked for."""

    storage: Storage | None
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    requires_grad: bool = False
    hooks: Any = None
    metadata: dict[str, Any] | None = None
    parameter: bool = False
    parameter_state: Any = None
    python_type: Any = None
    """The class ``_rebuild_from_type_v2`` made this tensor (None: a Tensor, or a Parameter as flagged)."""
    python_state: Any = None
    """The Python state ``_rebuild_from_type_v2`` set on it (a tensor's attributes), as pickled."""
    kind: str = "dense"
    view_start: int = 0
    """Where a legacy storage view starts in ``storage``, in elements of the tensor's dtype: ``offset`` counts from
    the root storage, torch's ``storage_offset()`` from the view (``offset - view_start``)."""
    quantizer: tuple[Any, ...] | None = None
    """A quantized tensor's parameters as pickled: ``(qscheme, scale, zero_point)`` or
    ``(qscheme, scales, zero_points, axis)``; its ``storage`` holds the integer values."""
    sparse: tuple[Any, ...] | None = None
    """A sparse tensor's parts as pickled: ``(indices, values, size[, coalesced])`` (COO) or
    ``(compressed_indices, plain_indices, values, size)`` (CSR/CSC/BSR/BSC); ``kind`` names the layout."""

    def __setstate__(self, state: Any) -> None:
        """BUILD on a ``Parameter`` as torch's weights_only loader runs it (``Tensor.__setstate__``): a
        3-tuple (or list) ``(requires_grad, _, hooks)``, or a 5-tuple ``(data, _, hooks, requires_grad, _)`` whose
        ``data`` replaces the tensor's; any other state, or BUILD on a plain tensor, is refused."""
        if (
            not self.parameter
            or self.python_type is not None
            or type(state) not in (tuple, list)
            or len(state) not in (3, 5)
        ):
            refuse_state()
        if len(state) == 5:
            data = state[0]
            if type(data) is not Tensor or data.kind != "dense" or self.kind != "dense" or data.quantizer:
                refuse_state()
            self.storage, self.offset, self.shape, self.stride = data.storage, data.offset, data.shape, data.stride
            self.dtype, self.view_start = data.dtype, data.view_start
            state = (state[3], state[4], state[2])
        requires_grad, _, hooks = state
        # torch's requires_grad setter takes a bool only, and True only on a float or complex tensor
        if type(requires_grad) is not bool or (requires_grad and self.dtype not in _GRAD_DTYPES):
            refuse_state()
        self.requires_grad, self.hooks = requires_grad, hooks

    def __repr__(self) -> str:
        return f"Tensor({list(self.shape)}, {self.dtype}, {self.device})"

    @property
    def storage_offset(self) -> int:
        """The offset torch's ``storage_offset()`` gives: from the start of the tensor's storage as torch makes it
        (a legacy view's own)."""
        return self.offset - self.view_start

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's own elements (not of the whole storage); a sparse tensor's stored parts."""
        if self.sparse is not None:
            return sum(part.nbytes for part in self.sparse if isinstance(part, Tensor))
        return self.numel * itemsize(self.dtype) if self.dtype in DTYPES else 0

    @property
    def device(self) -> str:
        """The device it was saved on (the storage's location tag; a sparse tensor's values' tag)."""
        if self.storage is not None:
            return self.storage.location
        if self.sparse is not None:
            return next((part.device for part in self.sparse if isinstance(part, Tensor)), "cpu")
        return "meta" if self.kind == "dense" else self.kind

    @property
    def sparse_values(self) -> Tensor | None:
        """A sparse tensor's values part (a dense tensor: where its NaN/Inf would be); None otherwise."""
        if self.sparse is None:
            return None
        values = self.sparse[1] if self.kind == "sparse_coo" else self.sparse[2] if len(self.sparse) > 2 else None
        return values if isinstance(values, Tensor) else None

    def parts(self) -> list[tuple[str, Any]] | None:
        """What a sparse or quantized tensor is made of, as ordinary values: a sparse tensor's
        indices, values and size; a quantized tensor's integer values (a dense view of its storage)
        and its quantizer's parameters. None for a dense tensor (or a packed 4/2-bit one)."""
        if self.sparse is not None:
            names = _SPARSE_PARTS["sparse_coo" if self.kind == "sparse_coo" else "compressed"]
            return list(zip(names, self.sparse, strict=False))
        if self.quantizer is not None and self.dtype in _QUANTIZED_INTS:
            values = dataclasses.replace(self, dtype=_QUANTIZED_INTS[self.dtype], kind="dense", quantizer=None)
            quantizer_names = _PER_TENSOR if len(self.quantizer) == 3 else _PER_CHANNEL
            return [("int_repr", values), *zip(quantizer_names, self.quantizer, strict=False)]
        return None

    def is_contiguous(self) -> bool:
        """Whether the elements are laid out densely in row-major order."""
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.stride), strict=True):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True


class Opaque:
    """An object built from a global that is not known as data: recorded, never run.

    ``find_class`` makes one subclass per global name; calling it (REDUCE, NEWOBJ,
    INST, OBJ) and filling it (BUILD once, SETITEMS, APPENDS) only records what was given.
    """

    global_name: ClassVar[str] = "?"
    safe: ClassVar[bool] = False

    def __new__(cls, *args: Any, **kwargs: Any) -> Opaque:
        obj = object.__new__(cls)
        obj.args = args
        obj.kwargs = kwargs
        obj.how = "newobj"
        obj.state = None
        obj.built = False
        obj.items = {}
        obj.list_items = []
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.how = "reduce"

    def __setstate__(self, state: Any) -> None:
        if self.built:
            raise pickle.UnpicklingError(f"BUILD applied twice to a {self.global_name} object")
        self.state = state
        self.built = True

    def __setitem__(self, key: Any, value: Any) -> None:
        self.items[key] = value

    def append(self, value: Any) -> None:
        """Record an APPEND."""
        self.list_items.append(value)

    def extend(self, values: Any) -> None:
        """Record an APPENDS."""
        self.list_items.extend(values)

    def __call__(self, *args: Any) -> Opaque:
        result = opaque_class(f"{self.global_name}(...)", safe=True)(*args)
        result.callee = self
        return result

    def __repr__(self) -> str:
        return f"<{self.global_name}>"

    # attributes set in __new__ (declared for type checkers)
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    how: str
    state: Any
    built: bool
    items: dict[Any, Any]
    list_items: list[Any]
    callee: Opaque | None = None
    from_type: Any = None
    """The class named by the ``_rebuild_from_type_v2`` call that made this object (its ``state`` came with it)."""

    @property
    def is_module(self) -> bool:
        """A pickled ``nn.Module``: its state holds ``_parameters`` and ``_modules``."""
        return isinstance(self.state, dict) and "_parameters" in self.state and "_modules" in self.state

    @property
    def class_name(self) -> str:
        """The short class name (``Net``)."""
        return self.global_name.rsplit(".", 1)[-1]


def view_bits(metadata: Any) -> tuple[bool, bool]:
    """A tensor's (conj, neg) view bits as ``torch.load`` sets them from its pickled metadata: the one rule every
    reader of tensor metadata uses. A ReadError for metadata torch refuses (not a dict).

    ``_rebuild_tensor_v2`` applies metadata only when it is truthy, and ``set_tensor_metadata`` sets a bit for
    each key present, whatever its value: ``{"neg": False}`` loads negated.
    """
    if not metadata:
        return False, False
    if not isinstance(metadata, dict):
        raise ReadError(f"tensor metadata is of type {type(metadata).__name__}, not a dict: torch.load refuses it")
    return "conj" in metadata, "neg" in metadata


def contiguous_strides(shape: Any) -> tuple[int, ...]:
    """The row-major strides of ``shape`` (what ``tensor.set_(storage, offset, size, None)`` gives)."""
    strides = []
    step = 1
    for count in reversed(shape):
        strides.append(step)
        step *= max(count, 1)
    return tuple(reversed(strides))


def opaque_class(global_name: str, safe: bool = False) -> type[Opaque]:
    """A fresh placeholder class standing for ``global_name``."""
    short = global_name.rsplit(".", 1)[-1] or "Opaque"
    return type(short, (Opaque,), {"global_name": global_name, "safe": safe, "__module__": "ckpt_tui.opaque"})


def is_global_ref(value: Any) -> bool:
    """A bare global used as a value (a function or class reference), never resolved."""
    return isinstance(value, type) and issubclass(value, Opaque)


TensorMaker = Callable[[int, int], list["Tensor"]]
"""Makes the tensors of rows ``start`` to ``stop`` of a flat root still held as columns."""


class FlatColumns:
    """A flat state_dict as its reader built and checked it, one column per field (row ``i``: the
    ``i``-th entry of the root): totals, findings and ``info``'s rows come from the columns, without a walk.

    Its reader promises what a safetensors header guarantees once validated: str keys; plain tensors
    (nothing hidden), each over its own storage of exactly its size, laid out densely from offset 0,
    on ``cpu``, with every storage's record present; and :func:`check_tree` would pass. Trees are never
    changed in place (edits make new ones), so the columns hold while ``root`` is the checkpoint's root.

    Made with its root (a ``.pth`` reader's), or :meth:`pending`: then the root (50,000 tensor objects)
    is made only when something asks for it, once; a row asked for before (:meth:`head`) is the same object
    in it.
    """

    def __init__(self, root: dict[str, Tensor] | None, dtypes: list[str], numels: list[int]) -> None:
        self._root = root
        self.dtypes = dtypes
        self.numels = numels
        self._names: list[str] | None = None
        self._shapes: list[tuple[int, ...]] | None = None
        self._strides: list[tuple[int, ...]] | None = None
        self._storage_keys: list[str] | None = None
        self._sources: list[Any] | None = None
        self._make: TensorMaker | None = None
        self._made: dict[int, Tensor] = {}
        self._values: list[Tensor] | None = None
        self._lock = threading.Lock()
        self._listed: list[tuple[KeyPath, Tensor]] | None = None
        self._keyed: dict[str, Tensor] | None = None
        self._shell: dict[str, Any] | None = None

    @classmethod
    def pending(
        cls,
        names: list[str],
        dtypes: list[str],
        numels: list[int],
        shapes: list[tuple[int, ...]],
        strides: list[tuple[int, ...]],
        storage_keys: list[str],
        sources: list[Any],
        make: TensorMaker,
        shell: dict[str, Any] | None = None,
    ) -> FlatColumns:
        """Columns whose root is made by ``make`` when first asked for (each column one value per row).

        ``shell``: the root's own container as its reader made it (a pickle's ``OrderedDict`` and its
        ``_metadata``), its keys ``names`` in order, given its tensors as values when the root is made;
        None: the root is a plain dict."""
        columns = cls(None, dtypes, numels)
        columns._names, columns._shapes, columns._strides = names, shapes, strides
        columns._storage_keys, columns._sources, columns._make = storage_keys, sources, make
        columns._shell = shell
        return columns

    def __len__(self) -> int:
        return len(self.dtypes)

    @property
    def made(self) -> bool:
        """Whether the root's tensor objects exist (else only the columns do)."""
        return self._root is not None

    @property
    def root(self) -> dict[str, Tensor]:
        """The root, made now if it was pending (every row's tensor; those made before kept)."""
        if self._root is None:
            # one root, whichever thread asks first (the browser's workers and its UI thread both read it)
            with self._lock:
                if self._root is None:
                    assert self._make is not None and self._names is not None
                    tensors = self._make(0, len(self))
                    for row, tensor in self._made.items():
                        tensors[row] = tensor
                    if self._shell is None:
                        self._root = dict(zip(self._names, tensors, strict=True))
                    else:  # (its keys are the names, in order: their values replaced in place)
                        self._shell.update(zip(self._names, tensors, strict=True))
                        self._root = self._shell
                    self._made = {}
        return self._root

    @property
    def names(self) -> list[str]:
        """The keys, in the root's order."""
        if self._names is None:
            self._names = list(self.root)
        return self._names

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        if self._shapes is None:
            self._shapes = list(map(_SHAPE, self.root.values()))
        return self._shapes

    @property
    def strides(self) -> list[tuple[int, ...]]:
        if self._strides is None:
            self._strides = list(map(_STRIDE, self.root.values()))
        return self._strides

    @property
    def storage_keys(self) -> list[str]:
        """Each row's storage record key."""
        if self._storage_keys is None:
            self._storage_keys = list(map(_STORAGE_KEY, self.root.values()))
        return self._storage_keys

    @property
    def sources(self) -> list[Any]:
        """Each row's record source (one object for the rows of one file)."""
        if self._sources is None:
            self._sources = list(map(_STORAGE_SOURCE, self.root.values()))
        return self._sources

    def head(self, count: int) -> list[tuple[str, Tensor]]:
        """The first ``count`` entries, without making the others while the root is pending."""
        if self._root is not None:
            return list(itertools.islice(self._root.items(), count))
        rows = range(min(count, len(self)))
        return [(self.names[row], self.tensor_at(row)) for row in rows]

    def tensor_at(self, row: int) -> Tensor:
        """Row ``row``'s tensor: the root's own object (made alone while the root is pending, and then
        the same object in the root once it is made)."""
        if self._root is not None:
            if self._values is None:
                self._values = list(self._root.values())
            return self._values[row]
        with self._lock:
            if self._root is not None:
                return self.tensor_at(row)
            made = self._made.get(row)
            if made is None:
                assert self._make is not None
                made = self._made[row] = self._make(row, row + 1)[0]
            return made

    def key_dict(self) -> dict[str, Tensor]:
        """The root for checks that look only at its keys and at each value's type (findings, fixes, the
        scheduler test): the root once made; while it is pending, its keys each mapped to one stand-in
        plain tensor (every value of such a root is a plain tensor), made in one C pass."""
        if self._root is not None:
            return self._root
        if self._keyed is None:
            shell = self._shell
            # of the root's own type and attributes (an OrderedDict's _metadata): what is shown and edited
            self._keyed = dict.fromkeys(self.names, KEY_STAND_IN) if shell is None else _keyed_like(shell, self.names)
        return self._keyed

    def listed(self) -> list[tuple[KeyPath, Tensor]]:
        """Each tensor with its path, as a walk of ``root`` lists them (made once: ``check`` and the summary
        both ask; callers get a copy of the list)."""
        if self._listed is None:
            self._listed = list(zip(zip(self.root), self.root.values(), strict=True))
        return list(self._listed)

    def describes(self, root: Any) -> bool:
        """Whether these are the columns of ``root`` (a tree made from it by an edit is another object)."""
        return self._root is not None and root is self._root and len(root) == len(self.dtypes)


KEY_STAND_IN = Tensor(None, 0, (), (), "float32")
"""The one value of every key in :meth:`FlatColumns.key_dict` (never a row of ``info``, never read)."""


def _keyed_like(shell: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """A new container of ``shell``'s type and attributes, each of ``names`` mapped to :data:`KEY_STAND_IN`."""
    keyed: dict[str, Any] = type(shell).fromkeys(names, KEY_STAND_IN)
    if type(shell) is not dict:
        keyed.__dict__.update(shell.__dict__)
    return keyed


_SHAPE = operator.attrgetter("shape")
_STRIDE = operator.attrgetter("stride")
_STORAGE_KEY = operator.attrgetter("storage.key")
_STORAGE_SOURCE = operator.attrgetter("storage.source")


@dataclass
class FileBeside:
    """A file in a checkpoint's folder that its reader did not read, read on its own for what it holds of code."""

    name: str
    """Its path inside the folder (``optimizer.pt``, ``sub/evil.pth``, ``pytorch_model_fsdp_0/`` for a DCP folder)."""
    what: str
    """What it holds, in words (its format; ``unreadable`` when it could not be read)."""
    unsafe_globals: list[str] = field(default_factory=list)
    runs_code: list[str] = field(default_factory=list)
    """Code its loader runs (a TorchScript ``__setstate__``, a DCP item's unsafe globals), in words."""
    unreadable: str | None = None
    """Why it could not be read (then nothing can be said of its code: never clean)."""
    passed_over: str | None = None
    """Why it was not read, being no part of the save: a link out of the folder to a folder or to what is no
    regular file, a broken link (named in the folder's line, never a problem)."""


@dataclass
class Checkpoint:
    """An opened checkpoint: its tree, its format and where its records live."""

    path: str
    format: FormatId
    root: Any = field(repr=False)  # a repr of a hostile tree can have 2**60 paths
    file_bytes: int
    metadata: dict[str, Any] = field(default_factory=dict)
    """The file's own metadata (safetensors ``__metadata__``): what a converted file carries over."""
    byteorder: str = "little"
    notes: list[str] = field(default_factory=list)
    unsafe_globals: set[str] = field(default_factory=set)
    loader_problems: list[str] = field(default_factory=list)
    """Why the format's own loader (torch.load, safetensors) would refuse or misread this file, in words."""
    files: list[str] = field(default_factory=list)
    """The files opened together as this one checkpoint (rank files given together); empty for one file.
    torch.load reads each on its own: the verdict is each file's."""
    runs_code: list[str] = field(default_factory=list)
    """Code from the file its loader runs while loading (a TorchScript ``__setstate__``), in words: never
    clean, as ckpt-tui cannot tell what that code does."""
    hostile: list[str] = field(default_factory=list)
    """What no saver writes and readers disagree on (zip members whose names collide under torch's
    comparison: also in ``loader_problems``; a key in two shards of a set), in words; ``convert`` refuses
    such a file."""
    partial: str | None = None
    """Why its values are pieces of whole tensors a writer would write as if whole (one rank's file of a sharded
    save, opened alone), in words; None when they are whole."""
    odd_layout: list[str] = field(default_factory=list)
    """What a distributed checkpoint's metadata lays out that no saver writes but its loader still loads (a DCP
    chunk whose item is larger than the chunk, which ``dcp.load`` narrows; chunks that overlap, the one copied
    last winning; an item cast to its tensor's dtype), in words: the tree shows what the loader loads."""
    index_metadata: dict[str, Any] = field(default_factory=dict)
    """A shard index's ``metadata`` (``total_size``: numbers about the whole set): shown, never written."""
    columns: FlatColumns | None = field(default=None, repr=False)
    """The root as columns, when its reader had them (see :class:`FlatColumns`); else None."""
    replaced: dict[KeyPath, Any] = field(default_factory=dict, repr=False)
    """Values the tree shows as something else, as saved, by path: a rank's ShardedTensor or DTensor shown as the
    whole tensor assembled from every rank (or as its local shard). The globals inside them sit at that path."""
    buffer_names: dict[KeyPath, frozenset[str]] = field(default_factory=dict, repr=False)
    """The buffers of a state_dict, by the state_dict's path, where the file names them (DeepSpeed's
    ``buffer_names``): a float buffer is a buffer by that, whatever its name."""
    layout: str | None = None
    """The framework layout a distributed reader recognised ("DeepSpeed ZeRO-2, 2 ranks, bf16"), else None."""
    archive: Any = field(default=None, repr=False)
    """What its reader read of the file to build the tree (a zip's records: its central directory and the
    pickle's bytes, read once; a legacy file's or plain pickle's ``PickleBytes``), for the weights_only
    verdict to judge those same bytes; None elsewhere."""
    opened_version: str | None = field(default=None, repr=False)
    read_files: list[str] = field(default_factory=list, repr=False)
    """Files its reader read besides ``path`` and ``files`` (an index's shards, a DCP folder's ``.metadata`` and
    data files); empty where its tensors' records name them."""
    beside: list[FileBeside] | None = field(default=None, repr=False)
    """For a folder opened as a whole: every other file in it and its immediate subfolders that a loader could
    unpickle (found by content), each read for code; None when the checkpoint was not opened as a folder."""
    """The file's version (``byte_source.version_of``) when it was opened; None for a folder or a URL."""

    def input_files(self) -> list[str]:
        """Every file this checkpoint was read from: its path, the files opened together as it (rank files), and
        those its reader read besides (a DCP folder's data files, an index's shards): what a write must not
        replace as if it were any other file."""
        return list(dict.fromkeys([self.path, *self.files, *self.read_files]))

    def unwritable(self) -> str | None:
        """Why no file may be written from it as it is, in one line (every writer asks: ``convert``, ``average``,
        the browser's save), or None."""
        if self.hostile:
            # whatever is written, some reader would have read other bytes from the source
            return f"refusing to convert a file readers disagree on: {self.hostile[0]}"
        return self.partial

    def changed_on_disk(self) -> bool:
        """Whether the file is another one now than the one its tree was read from (replaced or rewritten)."""
        if self.opened_version is None:
            return False
        from ckpt_tui.core.model.byte_source import version_of

        return version_of(self.path) != self.opened_version

    def flat_columns(self) -> FlatColumns | None:
        """The columns of the root as it is now, or None (no columns, or the root was replaced)."""
        columns = self.columns
        if columns is None:
            return None
        if self.root_pending():
            return columns
        return columns if columns.describes(self.root) else None

    def root_pending(self) -> bool:
        """Whether the root is still only its columns (no tensor object made yet)."""
        return self.__dict__.get("_root") is PENDING_ROOT and self.columns is not None and not self.columns.made

    def key_root(self) -> Any:
        """The root for checks that look only at keys and value types: :meth:`FlatColumns.key_dict` while
        the root is pending, else the root."""
        if self.root_pending():
            assert self.columns is not None
            return self.columns.key_dict()
        return self.root


PENDING_ROOT: Any = object()
"""The ``root`` a reader gives a :class:`Checkpoint` whose root is its columns, made when first read."""


def _get_root(checkpoint: Checkpoint) -> Any:
    root = checkpoint.__dict__["_root"]
    if root is PENDING_ROOT:
        assert checkpoint.columns is not None
        root = checkpoint.__dict__["_root"] = checkpoint.columns.root
    return root


def _set_root(checkpoint: Checkpoint, root: Any) -> None:
    checkpoint.__dict__["_root"] = root


# the dataclass's __init__ (and dataclasses.replace) set ``root`` through this property
Checkpoint.root = property(_get_root, _set_root, doc="The tree (made from the columns when pending).")


# ---- what a node holds --------------------------------------------------------------------

MODULE_GROUPS = ("_parameters", "_buffers", "_modules")
SCALARS = (str, int, float, bool, bytes, complex, type(None))


def non_persistent_buffers(state: dict[str, Any]) -> frozenset[Any]:
    """A module's ``_non_persistent_buffers_set``; anything but a set counts as empty."""
    names = state.get("_non_persistent_buffers_set")
    return frozenset(names) if isinstance(names, (set, frozenset)) else frozenset()


def module_children(node: Opaque) -> Iterator[tuple[Key, Any]]:
    """A pickled module's parameters, buffers (persistent only) and submodules, in order."""
    state = node.state
    assert isinstance(state, dict)
    skip = non_persistent_buffers(state)
    for group in MODULE_GROUPS:
        entries = state.get(group)
        if isinstance(entries, dict):
            for name, value in entries.items():
                if value is not None and not (group == "_buffers" and name in skip):
                    yield Attr(str(name)), value


MODULE_OWN_STATE = frozenset({*MODULE_GROUPS, "training", "_non_persistent_buffers_set", "_is_full_backward_hook"})
_ATTRIBUTE_SEARCH = 256


def module_tensor_attributes(node: Opaque) -> Iterator[tuple[Key, Any]]:
    """A pickled module's other attributes that hold tensors (quantized ``_packed_params``, a tensor
    kept as a plain attribute), found within a bounded search so that shared state stays cheap."""
    state = node.state
    assert isinstance(state, dict)
    for name, value in state.items():
        if name in MODULE_OWN_STATE or (isinstance(name, str) and name.endswith("hooks")):
            continue
        if isinstance(value, (Tensor, Opaque, list, tuple, dict)) and _holds_tensor(value):
            yield Attr(str(name)), value


def _holds_tensor(value: Any) -> bool:
    """Whether a tensor is among the first objects below ``value`` (modules not entered)."""
    stack = [value]
    seen: set[int] = set()
    while stack and len(seen) < _ATTRIBUTE_SEARCH:
        item = stack.pop()
        if isinstance(item, Tensor):
            return True
        if id(item) in seen or (isinstance(item, Opaque) and item.is_module):
            continue
        seen.add(id(item))
        stack.extend(kid for _, kid in children(item))
    return False


def _shown_arg(arg: Any) -> bool:
    return has_children(arg) or isinstance(arg, (Tensor, Opaque)) or is_global_ref(arg)


def _set_order(value: Any) -> str:
    return reprlib.repr(value)


def children(value: Any) -> Iterator[tuple[Key, Any]]:
    """The (key, child) pairs shown below a value, in stored order; nothing for leaves."""
    if isinstance(value, dict):
        yield from value.items()
    elif isinstance(value, (list, tuple)) and not isinstance(value, TorchSize):
        yield from enumerate(value)
    elif isinstance(value, (set, frozenset)):
        yield from enumerate(sorted(value, key=_set_order))
    elif isinstance(value, Opaque):
        if value.is_module:
            yield from module_children(value)
            yield from module_tensor_attributes(value)
            return
        if value.callee is not None:
            yield Attr("callee"), value.callee
        for index, arg in enumerate(value.args):
            if _shown_arg(arg):
                yield Attr(f"args[{index}]"), arg
        if isinstance(value.state, dict):
            for name, item in value.state.items():
                yield Attr(str(name)), item
        elif value.state is not None:
            yield Attr("state"), value.state
        yield from value.items.items()
        yield from enumerate(value.list_items)


def hidden_parts(value: Any) -> Iterator[tuple[Key, Any]]:
    """What a value holds besides its shown children; a writer emits these too.

    Tensor hooks, tensor metadata and Parameter state; a dict's ``_metadata`` and its keys that are not
    str; an opaque object's plain and keyword arguments; a module's other attributes (hooks, flags) and
    the parameters/buffers its state_dict leaves out. Each comes with a descriptive path step.
    """
    if isinstance(value, Tensor):
        if value.hooks is not None:
            yield Attr("_backward_hooks"), value.hooks
        if value.metadata is not None:
            yield Attr("<tensor metadata>"), value.metadata
        if value.parameter_state is not None:
            yield Attr("<parameter state>"), value.parameter_state
        if value.python_type is not None:
            yield Attr("<tensor class>"), value.python_type
        if value.python_state is not None:
            yield Attr("<tensor state>"), value.python_state
    elif isinstance(value, dict):
        metadata = getattr(value, "_metadata", None)
        if metadata is not None:
            yield Attr("_metadata"), metadata
        for key in value:
            if type(key) is not str:
                yield Attr("<key>"), key
    elif isinstance(value, Opaque):
        module = value.is_module
        for index, arg in enumerate(value.args):
            if module or not _shown_arg(arg):
                yield Attr(f"args[{index}]"), arg
        for name, arg in value.kwargs.items():
            yield Attr(f"kwargs[{name}]"), arg
        if value.from_type is not None:
            yield Attr("<tensor class>"), value.from_type
        for key in value.items:
            if type(key) is not str:
                yield Attr("<key>"), key
        if module:
            if value.callee is not None:
                yield Attr("callee"), value.callee
            yield Attr("<state>"), value.state
            yield from value.items.items()
            yield from enumerate(value.list_items)


def has_children(value: Any) -> bool:
    """Whether a value is a container with at least one shown child."""
    if isinstance(value, (dict, list, set, frozenset)):
        return len(value) > 0
    if isinstance(value, tuple) and not isinstance(value, TorchSize):
        return len(value) > 0
    if isinstance(value, Opaque):
        return next(children(value), None) is not None
    return False


def child(value: Any, key: Key) -> Any:
    """The child of ``value`` at ``key``; ``KeyError`` if there is none."""
    if isinstance(value, dict) and not isinstance(key, Attr):
        return value[key]
    if isinstance(value, (list, tuple)) and isinstance(key, int):
        return value[key]
    for found_key, found in children(value):
        if found_key == key:
            return found
    raise KeyError(key)


def get(root: Any, path: tuple[Key, ...]) -> Any:
    """The value at ``path`` below ``root``."""
    value = root
    for key in path:
        value = child(value, key)
    return value


# ---- walks: each object expanded once -----------------------------------------------------

_LEAVES = (Tensor, str, bytes, int, float)


def iter_nodes(root: Any, path: tuple[Key, ...] = (), limit: int = 200) -> Iterator[tuple[tuple[Key, ...], Any]]:
    """Every shown value below ``root`` (the root included) with its path, depth first.

    A value reached again (a shared list, a tensor under two keys) is yielded at each reference
    but expanded only the first time, so the walk is linear in the file, whatever the sharing.
    """
    yield path, root
    if isinstance(root, _LEAVES) or len(path) > limit:
        return
    seen = {id(root)}
    # each frame: a path and the iterator over its children (nothing is listed ahead: the first tensor
    # of a 50,000-key dict comes at once)
    stack: list[tuple[tuple[Key, ...], Iterator[tuple[Key, Any]]]] = [(path, children(root))]
    while stack:
        where, kids = stack[-1]
        for key, kid in kids:
            at = (*where, key)
            yield at, kid
            if isinstance(kid, _LEAVES) or id(kid) in seen or len(at) > limit:
                continue
            seen.add(id(kid))
            stack.append((at, children(kid)))
            break  # its children first, then the rest of this container's
        else:
            stack.pop()


def view_key(tensor: Tensor) -> tuple[Any, ...]:
    """What a tensor shows of its storage: two tensors with one key are one set of values (tied weights saved
    under two names), read, counted and written once, as ``model.parameters()`` counts them. A tensor without a
    storage is itself. The one rule of "the same tensor" for every reader, writer and count."""
    storage = tensor.storage
    if storage is None:
        return (id(tensor),)
    metadata = tensor.metadata
    # a negated or conjugated view of the same elements loads as other values (torch.save writes w and
    # torch._neg_view(w) over one storage): not the same tensor; metadata torch refuses is nobody's twin
    bits = view_bits(metadata) if not metadata or isinstance(metadata, dict) else (id(tensor),)
    return (id(storage), tensor.offset, tensor.shape, tensor.stride, tensor.dtype, *bits)


Reference = tuple[KeyPath, Any, bool, bool]


def walk(root: Any, path: KeyPath = ()) -> Iterator[Reference]:
    """Every reference to an object below ``root``, shown or hidden: ``(path, value, shown, first)``.

    Each object is expanded once, at its first reference (``first`` is True there); later references
    are yielded but not expanded, so the walk is linear in the file whatever the sharing. Shown children
    come before hidden parts (see :func:`hidden_parts`), and an object first met in a hidden part is
    expanded once more where it is shown. Scalars (str, int, float, bytes, None...) are left out.
    """
    expanded: dict[int, bool] = {}
    stack: list[tuple[KeyPath, Any, bool]] = [(path, root, True)]
    while stack:
        where, value, shown = stack.pop()
        if isinstance(value, SCALARS):
            continue
        before = expanded.get(id(value))
        first = before is None or (shown and not before)
        yield where, value, shown, first
        if not first:
            continue
        expanded[id(value)] = shown
        if type(value) is Tensor and _nothing_hidden([value]):
            continue  # a plain tensor: nothing hidden, no children (the common case, 50,000 times on big files)
        run = _plain_tensor_run(value, where, shown, expanded) if isinstance(value, dict) and len(value) > 1 else None
        if run is not None:  # a state_dict: its tensors in one go, as the loop below would give them one by one
            yield from run
            stack.extend(((*where, key), kid, False) for key, kid in reversed(list(hidden_parts(value))))
            continue
        stack.extend(((*where, key), kid, False) for key, kid in reversed(list(hidden_parts(value))))
        if not isinstance(value, Tensor):
            stack.extend(((*where, key), kid, shown) for key, kid in reversed(list(children(value))))


def _plain_tensor_run(
    value: dict[Any, Any], where: KeyPath, shown: bool, expanded: dict[int, bool]
) -> Iterator[Reference] | None:
    """The references to a dict's values when every one is a plain tensor (nothing hidden) met here
    for the first time, each once; marked as expanded. None otherwise (the walk goes one by one)."""
    tensors = list(value.values())
    if set(map(type, tensors)) != {Tensor} or not _nothing_hidden(tensors):
        return None
    ids = list(map(id, tensors))
    if len(set(ids)) < len(ids) or not expanded.keys().isdisjoint(ids):
        return None
    expanded.update(zip(ids, itertools.repeat(shown)))
    paths = map(where.__add__, zip(list(value)))
    return zip(paths, tensors, itertools.repeat(shown), itertools.repeat(True))


def hidden_tensors(references: list[Reference]) -> list[tuple[KeyPath, Tensor]]:
    """The tensors torch.load builds that no shown path reaches, each once at its first path: a tensor's
    attributes, a Parameter's state, hooks, a dict's ``_metadata``, a tensor used as a dict key."""
    shown = {id(r[1]) for r in references if r[2] and type(r[1]) is Tensor}
    found: dict[int, tuple[KeyPath, Tensor]] = {}
    for path, value, is_shown, _ in references:
        if not is_shown and type(value) is Tensor and id(value) not in shown:
            found.setdefault(id(value), (path, value))
    return list(found.values())


def iter_reachable(root: Any, path: KeyPath = ()) -> Iterator[tuple[KeyPath, Any, bool]]:
    """Every object reachable from ``root``, shown or hidden, as ``(path, value, shown)``, each object once.

    The walk for questions about everything a file holds, such as "is any unsafe global left?":
    what a writer emits is among these.
    """
    for where, value, shown, first in walk(root, path):
        if first:
            yield where, value, shown


def iter_tensors(root: Any, path: tuple[Key, ...] = ()) -> Iterator[tuple[tuple[Key, ...], Tensor]]:
    """Every tensor below ``root`` with its path (the walk of :func:`iter_nodes`, tensors only)."""
    for where, value in iter_nodes(root, path):
        if isinstance(value, Tensor):
            yield where, value


def type_label(value: Any) -> str:
    """A short type name for display: ``OrderedDict``, ``Tensor``, ``Net (module)``..."""
    if isinstance(value, Tensor):
        label = "Parameter" if value.parameter else "Tensor"
        if value.sparse is not None or value.quantizer is not None:
            return f"{label} ({value.kind})"  # sparse_coo, sparse_csr, quantized
        return label
    if isinstance(value, Opaque):
        if value.is_module:
            return f"{value.class_name} (module)"
        return value.global_name
    if is_global_ref(value):
        return f"global {value.global_name}"
    if isinstance(value, Symbol):
        return "dtype" if value.qualname.startswith("torch.") and value.name in DTYPES else value.qualname
    if isinstance(value, TorchSize):
        return "torch.Size"
    if isinstance(value, LoadedOrderedDict):
        return "OrderedDict"
    return type(value).__name__


# ---- validation after a read ----------------------------------------------------------------


def check_tree(root: Any) -> None:
    """Refuse what no real checkpoint holds and what would break the walks and views downstream.

    Raises :class:`ReadError` (without the file name) for containers nested more than
    :data:`MAX_DEPTH` levels (the longest chain, through shared objects too, as a recursive walk
    would meet it), ints too long to print, and tensors whose sizes, strides or offset do not fit
    int64. Every object, key and hidden part is checked, each object once. An opaque object's
    argument tuple and state dict, and a module's parameter/buffer/submodule dicts, add no level.
    """
    heights: dict[int, int] = {}
    on_path: set[int] = set()
    # each frame: [container, its contents, height so far, depth, weight of the edge into it]
    frames: list[list[Any]] = [[root, _contents(root), 0, 0, 0]]
    on_path.add(id(root))
    while frames:
        frame = frames[-1]
        step = next(frame[1], None)
        if step is None:
            frames.pop()
            value, height = frame[0], frame[2]
            on_path.discard(id(value))
            heights[id(value)] = height
            if frames:
                frames[-1][2] = max(frames[-1][2], height + frame[4])
            continue
        kid, weight = step
        below = _check_value(kid, heights, on_path)
        depth = frame[3] + weight
        if below is None:
            if depth > MAX_DEPTH:
                raise ReadError(f"nested more than {MAX_DEPTH} levels deep (not a real checkpoint)")
            module_state = isinstance(frame[0], Opaque) and kid is frame[0].state and frame[0].is_module
            frames.append([kid, _contents(kid, module_state), 0, depth, weight])
            on_path.add(id(kid))
        elif below or weight:
            if depth + below > MAX_DEPTH:
                raise ReadError(f"nested more than {MAX_DEPTH} levels deep (not a real checkpoint)")
            frame[2] = max(frame[2], below + weight)


def _contents(value: Any, module_state: bool = False) -> Iterator[tuple[Any, int]]:
    """Every object a container holds directly (keys, values, hidden parts), with the depth each adds."""
    if isinstance(value, dict):
        if not module_state and len(value) > 1 and _plain_tensors_that_pass(value):
            yield next(iter(value.values())), 1  # each of the others would add the same: a checked leaf, 1 level
        else:
            for key, item in value.items():
                if type(key) is not str:
                    yield key, 1
                yield item, 0 if module_state and key in MODULE_GROUPS else 1
        metadata = getattr(value, "_metadata", None)
        if metadata is not None:
            yield metadata, 1
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield item, 1
    elif isinstance(value, Tensor):
        for _, kid in hidden_parts(value):
            yield kid, 1
    elif isinstance(value, Opaque):
        if value.callee is not None:
            yield value.callee, 1
        if value.from_type is not None:
            yield value.from_type, 1
        for part in (value.args, value.kwargs, value.state, value.items, value.list_items):
            yield part, 0


_HIDDEN_PARTS = tuple(
    operator.attrgetter(name) for name in ("hooks", "metadata", "parameter_state", "python_type", "python_state")
)
"""What :func:`hidden_parts` yields of a tensor: a tensor with none of them holds nothing hidden."""


def _nothing_hidden(tensors: list[Tensor]) -> bool:
    """Whether no tensor has hooks, metadata, Parameter state or a Python class or state (attributes set on it,
    which may hold tensors and globals of their own): each part compared with None by
    identity, at C speed (those parts are the file's objects, maybe unhashable: never hashed here)."""
    return all(all(map(operator.is_, map(part, tensors), itertools.repeat(None))) for part in _HIDDEN_PARTS)


def over_whole_storages(tensors: list[Tensor]) -> bool:
    """Whether every tensor is laid out as ``torch.save`` writes a parameter: dense, from offset 0, in
    row-major order, over all the bytes of a storage of its own dtype, or untyped (``_rebuild_tensor_v3``:
    float8, uint16...). Judged in passes over whole columns (a state_dict of 50,000 tensors), each
    distinct shape's strides computed once."""
    storages = list(map(_STORAGE, tensors))
    if not tensors or set(map(type, storages)) != {Storage} or set(map(_KIND, tensors)) != {"dense"}:
        return False
    shapes = list(map(_SHAPE, tensors))
    row_major = _RowMajor()
    if any(map(_OFFSET, tensors)) or list(map(_STRIDE, tensors)) != list(map(row_major.__getitem__, shapes)):
        return False
    dtypes, stored = list(map(_DTYPE, tensors)), list(map(_DTYPE, storages))
    numels = list(map(math.prod, shapes))
    if dtypes == stored:
        return numels == list(map(_NUMEL, storages))
    if not {*dtypes, *stored} <= DTYPES.keys():
        return False
    tensor_bytes = map(operator.mul, numels, map(itemsize, dtypes))
    storage_bytes = map(operator.mul, map(_NUMEL, storages), map(itemsize, stored))
    return all(map(operator.eq, tensor_bytes, storage_bytes))


class _RowMajor(dict[tuple[int, ...], tuple[int, ...]]):
    """Each shape's row-major strides, worked out when first asked for: each row's shape hashed once."""

    def __missing__(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        strides = self[shape] = contiguous_strides(shape)
        return strides


_STORAGE = operator.attrgetter("storage")
_KIND = operator.attrgetter("kind")
_SHAPE = operator.attrgetter("shape")
_STRIDE = operator.attrgetter("stride")
_OFFSET = operator.attrgetter("offset")
_DTYPE = operator.attrgetter("dtype")
_NUMEL = operator.attrgetter("numel")


def _plain_tensors_that_pass(state: dict[Any, Any]) -> bool:
    """Whether a dict's keys are all str and its values all plain tensors (nothing hidden) that pass
    :func:`_check_tensor`, checked in bulk (C-speed passes over a 50,000-key state_dict); False sends
    the dict entry by entry, where the first failing tensor raises, worded as always."""
    values = list(state.values())
    try:
        if set(map(type, state)) != {str} or set(map(type, values)) != {Tensor}:
            return False
        if not _nothing_hidden(values):
            return False
        shapes = list(map(operator.attrgetter("shape"), values))
        sizes = list(itertools.chain.from_iterable(shapes))
        numbers = [*map(operator.attrgetter("offset"), values), *sizes]
        numbers += itertools.chain.from_iterable(map(operator.attrgetter("stride"), values))
        return (
            set(map(type, numbers)) == {int}
            and min(numbers) >= INT64_MIN
            and max(numbers) < INT64_LIMIT
            and min(sizes, default=0) >= 0
            and max(map(math.prod, shapes)) < INT64_LIMIT
        )
    except Exception:  # anything odd: the exact path says what
        return False


def _check_value(value: Any, heights: dict[int, int], on_path: set[int]) -> int | None:
    """0 for a checked leaf, the known height of a container seen before, None for a container to enter."""
    kind = type(value)
    if kind is str or kind is float or kind is bool or value is None or kind is bytes or kind is complex:
        return 0
    if kind is int:
        if value.bit_length() > MAX_INT_BITS:
            raise ReadError("holds an integer with thousands of digits (not a real checkpoint)")
        return 0
    if kind is Tensor:
        _check_tensor(value)
        plain = value.hooks is None and value.metadata is None and value.parameter_state is None
        if plain and value.python_type is None and value.python_state is None:
            return 0
    elif kind is Storage:
        _check_int64(value.numel, "storage size")
        return 0
    elif kind is Device:
        if value.index is not None:
            _check_int64(value.index, "device index")
        return 0
    elif kind is Symbol or is_global_ref(value):
        return 0
    known = heights.get(id(value))
    if known is not None:
        return known
    if id(value) in on_path:
        return 0  # a cycle: every walk stops at objects it has seen
    return None


def _check_int64(value: Any, what: str) -> None:
    if type(value) is not int or not INT64_MIN <= value < INT64_LIMIT:
        raise ReadError(f"a {what} does not fit in int64")


def _check_tensor(tensor: Tensor) -> None:
    """Sizes, strides and offset are int64, and the element count fits one (as torch requires)."""
    _check_layout(tensor.offset, tensor.shape, tensor.stride)


def _check_layout(offset: Any, shape: tuple[Any, ...], stride: tuple[Any, ...]) -> None:
    _check_int64(offset, "tensor offset")
    for size in shape:
        _check_int64(size, "tensor size")
        if size < 0:
            raise ReadError("a tensor size is negative")
    for step in stride:
        _check_int64(step, "tensor stride")
    if math.prod(shape) >= INT64_LIMIT:
        raise ReadError("a tensor has more elements than int64 can count")


def layout_fits(offset: int, shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether :func:`check_tree` accepts a tensor laid out so (sizes, strides, offset and count in int64)."""
    try:
        _check_layout(offset, shape, stride)
    except ReadError:
        return False
    return True
