"""The tree model: what a checkpoint holds, rebuilt as inert data.

A checkpoint's root is built from plain Python containers (dict, OrderedDict, list,
tuple, set) holding scalars, strings, bytes and the node types below. Nothing here
imports torch; nothing here ever runs code from the file.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from ckpt_tui.core.dtypes import DTYPES, itemsize
from ckpt_tui.core.keypath import Attr, Key


class RecordSource(Protocol):
    """Where the bytes of storages live: one per file (a zip, a legacy file, a safetensors file)."""

    path: str

    def locate(self, storage: Storage) -> tuple[int, int]:
        """Absolute byte offset of the storage's data in ``path``, and the bytes available there."""
        ...


@dataclass(frozen=True, slots=True, eq=False)
class Storage:
    """One storage record: tensors that share it share memory (tied weights, views).

    Compared by identity: two tensors share storage exactly when ``a.storage is b.storage``.
    """

    key: str
    dtype: str
    location: str
    numel: int
    source: RecordSource | None = field(default=None, repr=False)
    type_name: str = ""

    @property
    def nbytes(self) -> int:
        """Size of the storage in bytes."""
        return self.numel * itemsize(self.dtype)


@dataclass(frozen=True, slots=True)
class Symbol:
    """A torch constant named by a global: a dtype (``torch.float32``), layout, qscheme..."""

    qualname: str

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


@dataclass(frozen=True, slots=True)
class Device:
    """A ``torch.device`` value stored in the checkpoint."""

    type: str
    index: int | None = None

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"


class TorchSize(tuple[int, ...]):
    """A ``torch.Size`` value (a tuple that pickles back as ``torch.Size``)."""

    __slots__ = ()


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
    kind: str = "dense"
    quantizer: tuple[Any, ...] | None = None
    """A quantized tensor's parameters as pickled: ``(qscheme, scale, zero_point)`` or
    ``(qscheme, scales, zero_points, axis)``; its ``storage`` holds the integer values."""
    sparse: tuple[Any, ...] | None = None
    """A sparse tensor's parts as pickled: ``(indices, values, size[, coalesced])`` (COO) or
    ``(compressed_indices, plain_indices, values, size)`` (CSR/CSC/BSR/BSC); ``kind`` names the layout."""

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
    INST, OBJ) and filling it (BUILD, SETITEMS, APPENDS) only records what was given.
    """

    global_name: ClassVar[str] = "?"
    safe: ClassVar[bool] = False

    def __new__(cls, *args: Any, **kwargs: Any) -> Opaque:
        obj = object.__new__(cls)
        obj.args = args
        obj.kwargs = kwargs
        obj.how = "newobj"
        obj.state = None
        obj.items = {}
        obj.list_items = []
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.how = "reduce"

    def __setstate__(self, state: Any) -> None:
        self.state = state

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
    items: dict[Any, Any]
    list_items: list[Any]
    callee: Opaque | None = None

    @property
    def is_module(self) -> bool:
        """A pickled ``nn.Module``: its state holds ``_parameters`` and ``_modules``."""
        return isinstance(self.state, dict) and "_parameters" in self.state and "_modules" in self.state

    @property
    def class_name(self) -> str:
        """The short class name (``Net``)."""
        return self.global_name.rsplit(".", 1)[-1]


def opaque_class(global_name: str, safe: bool = False) -> type[Opaque]:
    """A fresh placeholder class standing for ``global_name``."""
    short = global_name.rsplit(".", 1)[-1] or "Opaque"
    return type(short, (Opaque,), {"global_name": global_name, "safe": safe, "__module__": "ckpt_tui.opaque"})


def is_global_ref(value: Any) -> bool:
    """A bare global used as a value (a function or class reference), never resolved."""
    return isinstance(value, type) and issubclass(value, Opaque)


@dataclass
class Checkpoint:
    """An opened checkpoint: its tree, its format and where its records live."""

    path: str
    format: str
    root: Any
    file_bytes: int
    metadata: dict[str, Any] = field(default_factory=dict)
    byteorder: str = "little"
    notes: list[str] = field(default_factory=list)
    unsafe_globals: set[str] = field(default_factory=set)
    loader_problems: list[str] = field(default_factory=list)
    """Why the format's own loader (torch.load, safetensors) would refuse or misread this file, in words."""


# ---- walking the tree -------------------------------------------------------------------


def module_children(node: Opaque) -> Iterator[tuple[Key, Any]]:
    """A pickled module's parameters, buffers (persistent only) and submodules, in order."""
    state = node.state
    assert isinstance(state, dict)
    skip = state.get("_non_persistent_buffers_set") or ()
    for group in ("_parameters", "_buffers", "_modules"):
        entries = state.get(group)
        if isinstance(entries, dict):
            for name, value in entries.items():
                if value is not None and not (group == "_buffers" and name in skip):
                    yield Attr(str(name)), value


def children(value: Any) -> Iterator[tuple[Key, Any]]:
    """The (key, child) pairs below a value, in stored order; nothing for leaves."""
    if isinstance(value, dict):
        yield from value.items()
    elif isinstance(value, (list, tuple)) and not isinstance(value, TorchSize):
        yield from enumerate(value)
    elif isinstance(value, (set, frozenset)):
        yield from enumerate(sorted(value, key=reprlib.repr))
    elif isinstance(value, Opaque):
        if value.is_module:
            yield from module_children(value)
            return
        if value.callee is not None:
            yield Attr("callee"), value.callee
        for index, arg in enumerate(value.args):
            if has_children(arg) or isinstance(arg, (Tensor, Opaque)) or is_global_ref(arg):
                yield Attr(f"args[{index}]"), arg
        if isinstance(value.state, dict):
            for name, item in value.state.items():
                yield Attr(str(name)), item
        elif value.state is not None:
            yield Attr("state"), value.state
        yield from value.items.items()
        yield from enumerate(value.list_items)


def has_children(value: Any) -> bool:
    """Whether a value is a container with at least one child."""
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


def iter_nodes(root: Any, path: tuple[Key, ...] = (), limit: int = 200) -> Iterator[tuple[tuple[Key, ...], Any]]:
    """Every value below ``root`` (the root included) with its path, depth first, once each."""
    seen: set[int] = set()
    stack: list[tuple[tuple[Key, ...], Any]] = [(path, root)]
    while stack:
        where, value = stack.pop()
        yield where, value
        if isinstance(value, (Tensor, str, bytes, int, float)) or id(value) in seen or len(where) > limit:
            continue
        seen.add(id(value))
        kids = list(children(value))
        stack.extend(((*where, key), kid) for key, kid in reversed(kids))


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
    return type(value).__name__
