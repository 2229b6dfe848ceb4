"""A pickle reader that never imports, calls or instantiates anything from the file.

Globals known as data (torch rebuild functions, dtypes, OrderedDict, ...) map to inert
stand-ins from :mod:`ckpt_tui.core.model.tree`; every other global becomes an
:class:`~ckpt_tui.core.model.tree.Opaque` placeholder that records how it was used.

Names are matched exactly, after resolving them as the real loader would (:func:`resolve_global`):
a dotted name (protocol 4's ``STACK_GLOBAL`` walks attributes: module ``torch``, name
``_utils.os.system``) is never known data, whatever its module. Every stand-in refuses pickle's
BUILD, so a file cannot change a tensor, a storage or one of these functions after it was made.
"""

from __future__ import annotations

import _compat_pickle
import codecs
import contextlib
import dataclasses
import io
import itertools
import math
import operator
import os
import pickle
import reprlib
import types
from collections.abc import Callable, Container, Iterator, Mapping
from typing import Any, BinaryIO

from ckpt_tui.core.errors import ReadError, UnsafePickle
from ckpt_tui.core.model.dtypes import DTYPES, QUANT_SCALE_DTYPES, QUANT_ZERO_POINT_DTYPES, STORAGE_CLASS_DTYPES
from ckpt_tui.core.model.made_bytes import UnreadSource
from ckpt_tui.core.model.tree import (
    DEVICE_STRING_INDEX_LIMIT,
    INT64_LIMIT,
    LAYOUTS,
    SPARSE_LAYOUTS,
    TORCH_DEVICE,
    Device,
    Layout,
    LoadedOrderedDict,
    Opaque,
    Storage,
    Symbol,
    Tensor,
    TorchSize,
    contiguous_strides,
    opaque_class,
    refuse_state,
)
from ckpt_tui.core.pickles.pickle_globals import named_globals
from ckpt_tui.core.runtime import process


class StorageType:
    """The storage class named in a persistent id (``torch.FloatStorage``...)."""

    __slots__ = ("dtype", "name")

    def __init__(self, name: str, dtype: str) -> None:
        self.name = name
        self.dtype = dtype

    __setstate__ = refuse_state

    def __repr__(self) -> str:  # errors quote persistent ids: the same file gives the same message
        return self.name


class StorageView:
    """A legacy-format view into a storage, as torch's ``legacy_load`` makes it: typed by the view's own
    storage type (``dtype``), ``offset`` and ``numel`` of those elements, clipped to the root's bytes."""

    __slots__ = ("dtype", "numel", "offset", "storage")

    def __init__(self, storage: Storage, offset: int, dtype: str, numel: int) -> None:
        self.storage = storage
        self.offset = offset
        self.dtype = dtype
        size = DTYPES[dtype][0]
        self.numel = max(0, min(numel * size, storage.nbytes - offset * size)) // size

    def tensor_offset(self, storage_offset: int, dtype: str | None) -> tuple[int, str]:
        """A tensor's offset into the root storage, in elements of its dtype, and that dtype."""
        if dtype is None or dtype == self.dtype:
            return self.offset + storage_offset, self.dtype
        start, size = self.offset * DTYPES[self.dtype][0], DTYPES[dtype][0]
        if start % size:
            raise ValueError(f"a {dtype} tensor on a {self.dtype} legacy view that starts between its elements")
        return start // size + storage_offset, dtype

    def check_extent(self, offset: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: str) -> None:
        """torch sets the tensor on the view's storage alone: it must end within the view."""
        if not shape or min(shape) > 0:
            last = offset + sum((n - 1) * step for n, step in zip(shape, strides, strict=True) if step > 0)
            view_end = self.offset * DTYPES[self.dtype][0] + self.numel * DTYPES[self.dtype][0]
            if (last + 1) * DTYPES[dtype][0] > view_end:
                raise ValueError("tensor reaches past the end of its legacy storage view (torch.load refuses it)")

    __setstate__ = refuse_state


# ---- rebuild functions: validate, then build a Tensor; nothing else -----------------------------

_INT_ONLY = {int}


def _sizes(value: Any, what: str, lowest: int) -> tuple[int, ...]:
    """A tuple of int64 values at least ``lowest`` (sizes are >= 0, strides may be negative)."""
    if not isinstance(value, (tuple, list)) or not set(map(type, value)) <= _INT_ONLY:
        raise ValueError(f"tensor {what} is not a tuple of ints")
    if value and (min(value) < lowest or max(value) >= INT64_LIMIT):
        raise ValueError(f"tensor {what} is out of range")
    return tuple(value)


def _flags(metadata: Any) -> Any:
    """Tensor metadata as torch writes it (``{"conj": True}``, ``{"neg": True}``), copied.

    Anything else (a dict of other values, an OrderedDict with ``_metadata``, a value that is not a dict)
    is kept as it is, so its globals are reported and the writer writes it or refuses it with its place;
    torch would run them while unpickling, then fail on the values. Only None and ``{}`` mean "none".
    """
    if metadata is None or (type(metadata) is dict and not metadata):
        return None
    return dict(metadata) if type(metadata) is dict else metadata


_SCALARS = (bool, int, float, str, type(None))


def _grad(requires_grad: Any) -> bool:
    """``requires_grad``: True only for True; an object (a payload's result) is refused, not dropped as False."""
    if not isinstance(requires_grad, _SCALARS):
        raise ValueError(f"tensor requires_grad is a {type(requires_grad).__name__}, not a bool: torch.load refuses it")
    return requires_grad is True


def _hooks(backward_hooks: Any) -> Any:
    """``backward_hooks`` as torch writes them (an empty OrderedDict) become None; anything else is kept."""
    if type(backward_hooks) is LoadedOrderedDict and not backward_hooks and not backward_hooks.__dict__:
        return None
    return backward_hooks


def _rebuild_tensor_v2(
    storage: Any,
    storage_offset: Any,
    size: Any,
    stride: Any,
    requires_grad: Any = False,
    backward_hooks: Any = None,
    metadata: Any = None,
    *,
    dtype: str | None = None,
) -> Tensor:
    """Every check of a tensor's arguments, at once (each unpickler's :func:`_fast_rebuilds` take the
    usual call, and check its values in bulk when the load ends)."""
    offset = storage_offset
    view = storage if isinstance(storage, StorageView) else None
    if view is not None:
        if type(storage_offset) is not int or not 0 <= storage_offset < INT64_LIMIT:
            raise ValueError("tensor storage offset is not a non-negative int64")
        offset, dtype = view.tensor_offset(storage_offset, dtype)
        storage = view.storage
    if not isinstance(storage, Storage):
        raise ValueError("tensor storage is not a storage record")
    if type(offset) is not int or not 0 <= offset < INT64_LIMIT:
        raise ValueError("tensor storage offset is not a non-negative int64")
    shape = _sizes(size, "size", 0)
    strides = contiguous_strides(shape) if stride is None else _sizes(stride, "stride", -INT64_LIMIT)
    if len(shape) != len(strides):
        raise ValueError("tensor size and stride do not match")
    if math.prod(shape) >= INT64_LIMIT:
        raise ValueError("tensor has more elements than int64 can count")
    if view is not None and dtype is not None:
        view.check_extent(offset, shape, strides, dtype)
    if strides and min(strides) < 0:
        strides = settled_strides(shape, strides)
    tensor = Tensor(
        storage,
        offset,
        shape,
        strides,
        dtype or storage.dtype,
        _grad(requires_grad),
        _hooks(backward_hooks),
        _flags(metadata),
    )
    if view is not None:
        # torch's tensor is set on the view's own storage: its storage_offset counts from the view's start
        tensor.view_start = offset - storage_offset
    return tensor


def _fast_rebuilds(unchecked: list[Tensor]) -> tuple[Callable[..., Tensor], Callable[..., Tensor]]:
    """``_rebuild_tensor_v2`` and ``_v3`` for one unpickler: what torch.save writes for a plain tensor
    is made at once, its values (offset, sizes, strides, element count) checked when the load ends, in
    bulk (:func:`check_unchecked` of ``unchecked``, which lists those tensors); other calls are exact."""

    def rebuild(
        storage: Any,
        storage_offset: Any,
        size: Any,
        stride: Any,
        requires_grad: Any = False,
        backward_hooks: Any = None,
        metadata: Any = None,
        *,
        dtype: str | None = None,
    ) -> Tensor:
        # once per tensor (50,000 times on big state_dicts): type checks only, inline
        if (
            type(storage) is Storage
            and type(storage_offset) is int
            and type(size) is tuple
            and type(stride) is tuple
            and requires_grad is False
            and metadata is None
            and type(backward_hooks) is LoadedOrderedDict
            and not backward_hooks
            and not backward_hooks.__dict__
            and len(size) == len(stride)
        ):
            tensor = Tensor(storage, storage_offset, size, stride, dtype or storage.dtype)
            unchecked.append(tensor)
            return tensor
        return _rebuild_tensor_v2(
            storage, storage_offset, size, stride, requires_grad, backward_hooks, metadata, dtype=dtype
        )

    def rebuild_v3(
        storage: Any,
        storage_offset: Any,
        size: Any,
        stride: Any,
        requires_grad: Any,
        backward_hooks: Any,
        dtype: Any,
        metadata: Any = None,
    ) -> Tensor:
        name = _dtype_name(dtype)
        return rebuild(storage, storage_offset, size, stride, requires_grad, backward_hooks, metadata, dtype=name)

    rebuild.__name__ = rebuild.__qualname__ = "_rebuild_tensor_v2"
    rebuild_v3.__name__ = rebuild_v3.__qualname__ = "_rebuild_tensor_v3"
    return _sealed(rebuild, "torch._utils._rebuild_tensor_v2"), _sealed(rebuild_v3, "torch._utils._rebuild_tensor_v3")


_OFFSET = operator.attrgetter("offset")
_SHAPE = operator.attrgetter("shape")
_STRIDE = operator.attrgetter("stride")


def check_unchecked(tensors: list[Tensor]) -> None:
    """The value checks :func:`_rebuild_tensor_v2` makes, over tensors :func:`_fast_rebuilds` made:
    in a few passes at C speed; if any fails, the first such tensor raises as that function would.

    Size and stride tuples the pickle shares (its memo) are checked once; an element count is
    computed only as far as int64 (a shape of thousands of huge sizes costs no huge product)."""
    if not tensors:
        return
    shapes = _distinct(map(_SHAPE, tensors))
    sizes = list(itertools.chain.from_iterable(shapes))
    steps = list(itertools.chain.from_iterable(_distinct(map(_STRIDE, tensors))))
    offsets = list(map(_OFFSET, tensors))
    if not (
        set(map(type, offsets)) | set(map(type, sizes)) | set(map(type, steps)) <= _INT_ONLY
        and min(offsets) >= 0
        and max(offsets) < INT64_LIMIT
        and min(sizes, default=0) >= 0
        and max(sizes, default=0) < INT64_LIMIT
        and min(steps, default=0) >= -INT64_LIMIT
        and max(steps, default=0) < INT64_LIMIT
        and _counts_fit(shapes)
    ):
        for tensor in tensors:
            _rebuild_tensor_v2(tensor.storage, tensor.offset, tensor.shape, tensor.stride)  # raises for the first
    if min(steps, default=0) < 0:
        for tensor in tensors:
            if tensor.stride and min(tensor.stride) < 0:
                tensor.stride = settled_strides(tensor.shape, tensor.stride)


def settled_strides(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """The strides a tensor has once torch's ``set_`` made it (``TensorImpl::set_sizes_and_strides``): each
    negative stride replaced, innermost first, by 1 for the last dimension, else by the next dimension's stride
    times its size (at least 1). A tensor torch refuses (a negative stride on a dimension longer than 1, and no
    size 0) keeps the strides pickled, which the layout checks then refuse as torch does."""
    if 0 not in shape and any(size > 1 and step < 0 for size, step in zip(shape, strides, strict=True)):
        return strides
    settled = list(strides)
    for index in reversed(range(len(settled))):
        if settled[index] < 0:
            last = index == len(settled) - 1
            settled[index] = 1 if last else settled[index + 1] * max(shape[index + 1], 1)
    return tuple(settled)


def _distinct(values: Iterator[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Each tuple object once (by identity: never hashed, whatever it holds)."""
    listed = list(values)
    return list(dict(zip(map(id, listed), listed, strict=True)).values())


SHORT_SHAPE = 64
"""Sizes whose product :func:`math.prod` computes at once: 64 sizes below 2**63 make at most 4,032 bits."""


def _counts_fit(shapes: list[tuple[int, ...]]) -> bool:
    """Whether every shape's element count is below 2**63 (sizes: ints in ``[0, 2**63)``)."""
    if max(map(len, shapes), default=0) <= SHORT_SHAPE:
        return max(map(math.prod, shapes), default=1) < INT64_LIMIT
    return all(map(_count_fits, shapes))


def _count_fits(shape: tuple[int, ...]) -> bool:
    """``math.prod(shape) < 2**63``, stopping as soon as the running product gets there."""
    if 0 in shape:
        return True
    count = 1
    for size in shape:
        count *= size
        if count >= INT64_LIMIT:
            return False
    return True


def _rebuild_tensor_v3(
    storage: Any,
    storage_offset: Any,
    size: Any,
    stride: Any,
    requires_grad: Any,
    backward_hooks: Any,
    dtype: Any,
    metadata: Any = None,
) -> Tensor:
    name = _dtype_name(dtype)
    return _rebuild_tensor_v2(
        storage, storage_offset, size, stride, requires_grad, backward_hooks, metadata, dtype=name
    )


def _dtype_name(dtype: Any) -> str:
    """The name of a dtype given as ``_rebuild_tensor_v3``'s argument (``torch.float8_e4m3fn``)."""
    if not isinstance(dtype, Symbol) or dtype.name not in DTYPES:
        raise ValueError(f"unknown tensor dtype {dtype!r}")
    return dtype.name


def _rebuild_tensor(storage: Any, storage_offset: Any, size: Any, stride: Any) -> Tensor:
    return _rebuild_tensor_v2(storage, storage_offset, size, stride)


def _with_flags(data: Tensor, parameter: bool, requires_grad: bool, hooks: Any, state: Any) -> Tensor:
    """A new tensor over the same data (the one given may be referenced elsewhere as it is, as in torch)."""
    return dataclasses.replace(
        data, requires_grad=requires_grad, hooks=hooks, parameter=parameter, parameter_state=state
    )


def _state(state: Any) -> Any:
    """Python state as pickled; None for none (None or a plain ``{}``): anything else is kept to be written."""
    return None if state is None or (type(state) is dict and not state) else state


def _rebuild_parameter(data: Any, requires_grad: Any, backward_hooks: Any, state: Any = None) -> Any:
    if not isinstance(data, Tensor):
        raise ValueError("parameter data is not a tensor")
    if data.python_type is not None or data.python_state is not None:
        raise ValueError("parameter data made by _rebuild_from_type_v2")
    if data.hooks is not None or data.parameter_state is not None:  # torch would drop them: never written by it
        raise ValueError("parameter data with its own backward hooks or state")
    made, state = _set_obj_state(data, _state(state))
    return _with_flags(made, True, _grad(requires_grad), _hooks(backward_hooks), state)


VALUE_SETTERS = frozenset({"real", "imag"})
"""Tensor attributes whose setter writes into the tensor's storage (``t.real = x`` copies ``x`` there)."""


def _set_obj_state(tensor: Tensor, state: Any) -> tuple[Tensor, Any]:
    """The tensor ``torch._utils._set_obj_state`` leaves, and the state left to record with it.

    torch ``setattr``s each item of the dict state, then of the slot state. ``data`` makes the tensor the
    given one's data (``set_data``: its storage, offset, shape, stride and dtype; its flags stay): the tree
    holds that tensor, and the item is taken out of the recorded state (a written file holds the loaded
    tensor itself, and a cast casts what torch loads). ``real``/``imag`` (or ``data`` set to anything but a
    dense tensor read here) change values this reader does not reproduce: that storage is marked unread.
    What torch refuses in a state is the verdict's to say.
    """
    parts = state if type(state) is tuple and len(state) == 2 else (state,)
    applied = False
    for part in parts:
        if not isinstance(part, dict):
            continue
        for name, value in part.items():
            if name == "data" and isinstance(value, Tensor) and value.kind == tensor.kind == "dense":
                applied = True
                tensor = dataclasses.replace(
                    tensor,
                    storage=value.storage,
                    offset=value.offset,
                    shape=value.shape,
                    stride=value.stride,
                    dtype=value.dtype,
                    metadata=value.metadata,
                )
            elif name == "data" or name in VALUE_SETTERS:
                _mark_unread(tensor, f"its pickled state sets {name}")
    if not applied:
        return tensor, state
    left = tuple(_without_data(p) for p in parts)
    return tensor, _state(left[0] if len(left) == 1 else left)


def _without_data(part: Any) -> Any:
    if not isinstance(part, dict):
        return part
    return {k: v for k, v in part.items() if k != "data"} or None


def _mark_unread(tensor: Tensor, why: str) -> None:
    """Mark the storages a tensor's values come from as not read (shared: torch changes the memory itself,
    so every tensor over it sees the change)."""
    parts = [tensor, *(p for p in tensor.sparse or () if isinstance(p, Tensor))]
    for part in parts:
        storage = part.storage
        # while the file is read, before any tensor is shown: the storage itself changes, as torch's does
        if storage is not None:
            storage.source = UnreadSource.over(storage.source, why)


PARAMETER = "torch.nn.parameter.Parameter"


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    """``func(*args)`` made into ``new_type`` with ``state`` set on it: every part kept, so it is written back.

    A plain tensor made a Parameter is a Parameter (torch writes those with ``_rebuild_parameter``); any
    other class or state is recorded on the tensor, or on an opaque result (a DTensor) as ``from_type``.
    """
    if not callable(func) or not isinstance(args, tuple):
        raise ValueError("malformed _rebuild_from_type_v2 call")
    result = func(*args)
    state = _state(state)
    if isinstance(result, Opaque):
        if result.from_type is not None or result.state is not None or result.how != "reduce":
            raise ValueError("_rebuild_from_type_v2 of an object already built")
        result.from_type, result.state = new_type, state
        return result
    if not isinstance(result, Tensor):
        return result
    if result.python_type is not None or result.python_state is not None:
        raise ValueError("_rebuild_from_type_v2 applied twice")
    named = new_type.qualname if isinstance(new_type, Symbol) else None
    result, state = _set_obj_state(result, state)
    if named == PARAMETER and not result.parameter:
        return _with_flags(result, True, result.requires_grad, result.hooks, state)
    if state is None and named == (PARAMETER if result.parameter else "torch.Tensor"):
        return result
    usual = named == (PARAMETER if result.parameter else "torch.Tensor")
    return dataclasses.replace(result, python_type=None if usual else new_type, python_state=state)


def _rebuild_meta_tensor_no_storage(dtype: Any, size: Any, stride: Any, requires_grad: Any) -> Tensor:
    if not isinstance(dtype, Symbol) or dtype.name not in DTYPES:
        raise ValueError(f"unknown tensor dtype {dtype!r}")
    shape, strides = _sizes(size, "size", 0), _sizes(stride, "stride", -INT64_LIMIT)
    if len(shape) != len(strides) or math.prod(shape) >= INT64_LIMIT:
        raise ValueError("tensor size and stride do not match")
    return Tensor(None, 0, shape, strides, dtype.name, _grad(requires_grad))


def _device(kind: Any, index: Any = None) -> Device:
    if isinstance(kind, Device) and index is None:
        return kind  # torch.device of a device is that device
    if not isinstance(kind, str) or not (index is None or type(index) is int):
        raise ValueError("malformed torch.device")
    if ":" in kind and index is None:
        # as torch.device parses it: ASCII digits, no leading zero, within 32 bits
        match = TORCH_DEVICE.fullmatch(kind)
        if match is None or match.group(2) is None or int(match.group(2)) >= DEVICE_STRING_INDEX_LIMIT:
            raise ValueError("malformed torch.device index")
        kind, index = match.group(1), int(match.group(2))
    if index is not None and not 0 <= index < 1 << 31:
        raise ValueError("torch.device index out of range")
    return Device(kind, index)


_TEXT_CODECS = frozenset({"latin1", "latin-1", "utf-8", "utf8", "ascii", "rot13", "rot_13"})
"""Encodings ``_codecs.encode`` is run with here: pure text transforms from the standard library."""


def _encode(text: Any, encoding: Any = "utf-8", errors: Any = "strict") -> Any:
    if not isinstance(text, str) or encoding not in _TEXT_CODECS or errors not in ("strict", "ignore", "replace"):
        raise ValueError("unsupported _codecs.encode call")
    return codecs.encode(text, encoding, errors)


_BYTEARRAY_LIMIT = 1 << 20
"""bytearray(n) of more zeros than this is refused: a few bytes of pickle must not allocate gigabytes."""


def _bytearray(data: Any = b"") -> bytearray:
    if type(data) is int and 0 <= data < _BYTEARRAY_LIMIT:
        return bytearray(data)
    if not isinstance(data, (bytes, list)):
        raise ValueError("bytearray from a non-bytes value")
    return bytearray(data)


def _get_layout(name: Any) -> Layout:
    if name not in LAYOUTS:
        raise ValueError(f"unknown tensor layout {reprlib.repr(name)}")
    return Layout(name)


_QSCHEMES = {"torch.per_tensor_affine", "torch.per_channel_affine", "torch.per_channel_affine_float_qparams"}


def _quantizer(params: Any, shape: tuple[int, ...]) -> tuple[Any, ...]:
    """Quantizer parameters in one of the two shapes torch pickles (per-tensor, per-channel), in every form
    torch's ``_rebuild_qtensor`` takes: a per-tensor scale that is a float, an int, a bool or a 0-d tensor, a
    zero point that is an int or a 0-d integer tensor; per-channel scales and zero points as tensors or both
    as lists of numbers (kept as the file holds them: a save writes them back so)."""
    if type(params) is not tuple or not params or not isinstance(params[0], Symbol):
        raise ValueError("malformed quantizer parameters")
    scheme = params[0].qualname
    if scheme == "torch.per_tensor_affine" and len(params) == 3:
        scale, zero_point = params[1], params[2]
        check_unchecked([part for part in (scale, zero_point) if isinstance(part, Tensor)])
        if _is_number(scale, _SCALE_TYPES, QUANT_SCALE_DTYPES) and _is_number(
            zero_point, (int,), QUANT_ZERO_POINT_DTYPES
        ):
            return params
    elif scheme in _QSCHEMES and len(params) == 4:
        scales, zero_points, axis = params[1], params[2], params[3]
        tensors = isinstance(scales, Tensor) and isinstance(zero_points, Tensor) and type(axis) is int
        if tensors:
            check_unchecked([scales, zero_points])  # their sizes are used here, before the load's bulk check
        counts = _channel_counts(scales, zero_points) if type(axis) is int else None
        if counts is not None and 0 <= axis < len(shape) and counts[0] == counts[1] == shape[axis]:
            return params
    raise ValueError(f"unsupported quantizer parameters for {scheme}")


_SCALE_TYPES = (float, int, bool)
"""What torch's argument parser reads as a per-tensor quantizer's scale (a float), besides a 0-d tensor."""


def _is_number(value: Any, types: tuple[type, ...], dtypes: frozenset[str]) -> bool:
    """A Python number of ``types`` (exactly), or a plain 0-d tensor of ``dtypes`` (one of a 1-element shape and a
    tensor needing grad are refused by torch's argument parser)."""
    if isinstance(value, Tensor):
        return value.kind == "dense" and value.shape == () and value.dtype in dtypes and not value.requires_grad
    return type(value) in types


def _channel_counts(scales: Any, zero_points: Any) -> tuple[int, int] | None:
    """How many scales and zero points a per-channel quantizer holds: both tensors, or both lists of numbers
    (``_rebuild_qtensor`` makes those tensors); None for anything else."""
    if isinstance(scales, Tensor) and isinstance(zero_points, Tensor):
        return scales.numel, zero_points.numel
    lists = type(scales) is list and type(zero_points) is list
    if lists and all(type(item) in _SCALE_TYPES for item in [*scales, *zero_points]):
        return len(scales), len(zero_points)
    return None


def _rebuild_qtensor(
    storage: Any,
    storage_offset: Any,
    size: Any,
    stride: Any,
    quantizer_params: Any,
    requires_grad: Any,
    backward_hooks: Any,
) -> Tensor:
    tensor = _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks)
    if not tensor.dtype.startswith(("qint", "quint")):
        raise ValueError(f"quantized tensor with a {tensor.dtype} storage")
    tensor.kind = "quantized"
    tensor.quantizer = _quantizer(quantizer_params, tensor.shape)
    return tensor


def _rebuild_sparse_tensor(layout: Any, data: Any) -> Tensor:
    if not isinstance(layout, Layout) or layout.qualname not in SPARSE_LAYOUTS or type(data) is not tuple:
        raise ValueError("malformed sparse tensor")
    coo = layout.qualname == "torch.sparse_coo"
    parts: tuple[Any, ...]
    if coo and len(data) in (3, 4):
        parts, size = (data[0], data[1]), data[2]
        if len(data) == 4 and data[3] is not None and type(data[3]) is not bool:
            raise ValueError("malformed sparse tensor (is_coalesced)")
    elif not coo and len(data) == 4:
        parts, size = (data[0], data[1], data[2]), data[3]
    else:
        raise ValueError(f"malformed {layout.name} tensor")
    if not all(isinstance(part, Tensor) and part.kind == "dense" for part in parts):
        raise ValueError(f"{layout.name} tensor parts are not dense tensors")
    shape = _sizes(size, "size", 0)
    if math.prod(shape) >= INT64_LIMIT:
        raise ValueError("sparse tensor has more elements than int64 can count")
    values = parts[-1]
    return Tensor(None, 0, shape, (), values.dtype, kind=layout.name, sparse=data)


def _reconstructor(cls: Any, base: Any, state: Any) -> Any:
    if isinstance(cls, type) and issubclass(cls, Opaque):
        obj = cls.__new__(cls)
        obj.how = "reconstructor"
        obj.args = (base, state)
        return obj
    raise ValueError("copyreg._reconstructor of a non-class")


# ---- the table of known names ------------------------------------------------------------------

_SYMBOL_NAMES = [
    "strided",
    "sparse_coo",
    "sparse_csr",
    "sparse_csc",
    "sparse_bsr",
    "sparse_bsc",
    "_mkldnn",
    "jagged",
    "per_tensor_affine",
    "per_tensor_symmetric",
    "per_channel_affine",
    "per_channel_symmetric",
    "per_channel_affine_float_qparams",
    "contiguous_format",
    "channels_last",
    "channels_last_3d",
    "preserve_format",
    "legacy_contiguous_format",
    "Tensor",
    # dtypes torch has that no tensor here is read with (bit-packed and sub-byte types)
    "bits8",
    "bits16",
    "bits1x8",
    "bits2x4",
    "bits4x2",
    "float4_e2m1fn_x2",
    *(f"uint{n}" for n in range(1, 8)),
    *(f"int{n}" for n in range(1, 8)),
]
_DTYPE_ALIASES = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "long": "int64",
    "int": "int32",
    "short": "int16",
    "cfloat": "complex64",
    "cdouble": "complex128",
    "chalf": "complex32",
}

_TENSOR_TYPES = ("Bool", "BFloat16", "Byte", "Char", "Double", "Float", "Half", "Int", "Long", "Short")
LEGACY_TENSOR_CLASSES = frozenset(
    {
        *(f"{prefix}{kind}Tensor" for prefix in ("torch.", "torch.cuda.") for kind in _TENSOR_TYPES),
        *(f"{prefix}{kind}Tensor" for prefix in ("torch.sparse.", "torch.cuda.sparse.") for kind in _TENSOR_TYPES[1:]),
    }
)
"""torch's legacy tensor constructors: torch.load builds a tensor from them, the tree keeps them as calls."""

# Names recorded as safe opaque objects. Each was read in its source: built from arguments that are
# themselves inert, it runs nothing of the file's choosing and touches no file (see docs/safety.md).
_SAFE_OPAQUE = {
    "argparse.Namespace",  # plain attribute bag
    "types.SimpleNamespace",
    "collections.defaultdict",  # stores its factory, never calls it while loading
    "collections.Counter",
    "collections.deque",
    "builtins.slice",
    "builtins.list",  # builtin types, as defaultdict factories or REDUCE targets
    "builtins.dict",
    "builtins.tuple",
    "builtins.int",
    "builtins.float",
    "builtins.str",
    "builtins.bool",
    "builtins.bytes",
    "builtins.range",
    "datetime.datetime",
    "datetime.date",
    "datetime.time",
    "datetime.timedelta",
    "datetime.timezone",
    "pathlib.Path",  # pure path arithmetic: no file is touched when built
    "pathlib.PosixPath",
    "pathlib.WindowsPath",
    "pathlib.PurePath",
    "pathlib.PurePosixPath",
    "pathlib.PureWindowsPath",
    "numpy.core.multiarray._reconstruct",  # ndarray.__new__ + __setstate__: memory only
    "numpy._core.multiarray._reconstruct",
    "numpy.core.multiarray.scalar",
    "numpy._core.multiarray.scalar",
    "numpy.ndarray",
    "numpy.dtype",
    "torch._utils._rebuild_nested_tensor",  # torch._nested_view_from_buffer
    "torch._utils._rebuild_wrapper_subclass",  # Tensor._make_wrapper_subclass of a class the file names
    "torch._utils._rebuild_device_tensor_from_numpy",
    "torch._utils._rebuild_device_tensor_from_cpu_tensor",
    "torch.torch_version.TorchVersion",  # a str subclass
    # torch's legacy tensor constructors (torch.FloatTensor([1])): on torch's own allowlist
    *LEGACY_TENSOR_CLASSES,
}


COUNTER = "collections.Counter"


def _counter_init(self: Opaque, *args: Any, **kwargs: Any) -> None:
    """REDUCE of ``collections.Counter`` with one dict, as ``Counter.__reduce__`` pickles every Counter: torch
    builds the mapping (``Counter(d)`` copies ``d``'s items), so its entries are the object's items (shown as its
    keys, ``ckpt["a"]``, and written back as ``Counter()`` and SETITEMS); any other arguments are kept as given."""
    self.how = "reduce"
    if len(args) == 1 and not kwargs and type(args[0]) is dict:
        self.items = dict(args[0])
        self.args = ()


def _sealed(function: Callable[..., Any], name: str | None = None) -> Callable[..., Any]:
    """A stand-in function that refuses pickle's BUILD (which would set attributes on it for every later
    file), named ``global_name`` for display as the global it stands for (its first name)."""
    function.__setstate__ = refuse_state  # type: ignore[attr-defined]
    if name is not None and not hasattr(function, "global_name"):
        function.global_name = name  # type: ignore[attr-defined]
    return function


def _known_globals() -> dict[str, Any]:
    known: dict[str, Any] = {
        "collections.OrderedDict": LoadedOrderedDict,
        "builtins.set": set,
        "builtins.frozenset": frozenset,
        "builtins.complex": complex,
        "builtins.bytearray": _bytearray,
        "_codecs.encode": _encode,
        "copyreg._reconstructor": _reconstructor,
        "builtins.object": Symbol("builtins.object"),
        "torch.Size": TorchSize,
        "torch.device": _device,
        "torch.serialization._get_layout": _get_layout,
        "torch._utils._rebuild_qtensor": _rebuild_qtensor,
        "torch._utils._rebuild_sparse_tensor": _rebuild_sparse_tensor,
        "torch._utils._rebuild_tensor": _rebuild_tensor,
        "torch._utils._rebuild_tensor_v2": _rebuild_tensor_v2,
        "torch._utils._rebuild_tensor_v3": _rebuild_tensor_v3,
        "torch._utils._rebuild_parameter": _rebuild_parameter,
        "torch._utils._rebuild_parameter_with_state": _rebuild_parameter,
        "torch._utils._rebuild_meta_tensor_no_storage": _rebuild_meta_tensor_no_storage,
        "torch._tensor._rebuild_from_type_v2": _rebuild_from_type_v2,
        "torch.nn.parameter.Parameter": Symbol("torch.nn.parameter.Parameter"),
        "torch.storage.UntypedStorage": StorageType("UntypedStorage", "uint8"),
        "torch.UntypedStorage": StorageType("UntypedStorage", "uint8"),
    }
    for name in DTYPES:
        known[f"torch.{name}"] = Symbol(f"torch.{name}")
    for alias, name in _DTYPE_ALIASES.items():
        known[f"torch.{alias}"] = known[f"torch.{name}"]
    for name in _SYMBOL_NAMES:
        known[f"torch.{name}"] = Symbol(f"torch.{name}")
    for cls, dtype in STORAGE_CLASS_DTYPES.items():
        known[f"torch.{cls}"] = StorageType(cls, dtype)
        known[f"torch.cuda.{cls}"] = StorageType(cls, dtype)
    for name, value in known.items():
        if isinstance(value, types.FunctionType):
            known[name] = _sealed(value, name)
    return known


KNOWN_GLOBALS = _known_globals()

# torch.load's zip reader renames this module before the lookup (``load_module_mapping``)
_TORCH_MODULE_RENAMES = {"torch.tensor": "torch._tensor"}


def resolve_global(module: str, name: str, protocol: int) -> str | None:
    """The ``module.name`` torch.load would import for a GLOBAL/STACK_GLOBAL, or None if it is no exact name.

    Like ``pickle.Unpickler.find_class``: Python 2 names are mapped (``__builtin__.set``) only while the
    protocol in force is below 3. A dotted ``name`` walks attributes from the module (protocol 4), so it
    names something else than it says; it is never resolved here.
    """
    if not module or not name or "." in name:
        return None
    module = _TORCH_MODULE_RENAMES.get(module, module)
    if protocol < 3:
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
    return f"{module}.{name}"


_HEAP_TYPE = 1 << 9


def check_stand_in(value: Any) -> Any:
    """``value`` if pickle's BUILD cannot change it; a function is sealed; raises TypeError otherwise."""
    if isinstance(value, types.FunctionType):
        return value if getattr(value, "__setstate__", None) is refuse_state else _sealed(value)
    if isinstance(value, type):
        if value.__flags__ & _HEAP_TYPE and "__setstate__" not in dir(value):
            raise TypeError(f"stand-in class {value.__name__} must define __setstate__")
        return value
    if not hasattr(type(value), "__setstate__") or hasattr(value, "__dict__"):
        raise TypeError(f"stand-in {type(value).__name__} must refuse BUILD (define __setstate__, use __slots__)")
    return value


PersistentLoad = Callable[[Any], Any]


class SafeUnpickler(pickle.Unpickler):
    """Unpickler whose ``find_class`` returns stand-ins and never imports."""

    def __init__(
        self,
        file: BinaryIO,
        persistent_load: PersistentLoad | None,
        known_classes: Container[str] = frozenset(),
        extra_globals: Mapping[str, Any] | None = None,
        protocol: int = 0,
    ) -> None:
        if persistent_load is not None:  # called straight from C, once per tensor (read by __init__ below)
            self.persistent_load = persistent_load  # type: ignore[method-assign,assignment]
        super().__init__(file, encoding="utf-8")
        self._persistent = persistent_load
        self._opaque: dict[tuple[str, bool], type[Opaque]] = {}
        self._known_classes = known_classes
        self._extra_globals = {name: check_stand_in(value) for name, value in (extra_globals or {}).items()}
        self._protocol = protocol
        self.unchecked: list[Tensor] = []
        """Tensors made with their values still to check (:func:`check_unchecked`, when the load ends)."""
        self._rebuild_tensor_v2, self._rebuild_tensor_v3 = _fast_rebuilds(self.unchecked)

    @property
    def unsafe_names(self) -> set[str]:
        """Every global this pickle named that is not known as data (reachable from the result or not)."""
        return {cls.global_name for cls in self._opaque.values() if not cls.safe}

    def find_class(self, module: str, name: str) -> Any:
        full = resolve_global(module, name, self._protocol)
        if full is not None:
            known = KNOWN_GLOBALS.get(full)
            if known is None:
                known = self._extra_globals.get(full)
            if known is _rebuild_tensor_v2:
                return self._rebuild_tensor_v2
            if known is _rebuild_tensor_v3:
                return self._rebuild_tensor_v3
            if known is not None:
                return known
        exact = full is not None
        shown = full if full is not None else f"{module}.{name}"
        cls = self._opaque.get((shown, exact))
        if cls is None:
            safe = exact and (shown in _SAFE_OPAQUE or shown in self._known_classes)
            cls = self._opaque[shown, exact] = opaque_class(shown, safe=safe)
            if exact and shown == COUNTER:
                cls.__init__ = _counter_init  # type: ignore[method-assign]
        return cls

    def persistent_load(self, pid: Any) -> Any:
        if self._persistent is None:
            raise pickle.UnpicklingError("persistent id in a plain pickle")
        return self._persistent(pid)


def _protocol(data: bytes | BinaryIO) -> int:
    """The protocol a pickle declares in its first opcode (0 when it has no PROTO opcode)."""
    if isinstance(data, bytes):
        head = data[:2]
    else:
        try:
            position = data.tell()
            head = data.read(2)
            data.seek(position)
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            return 0
    return head[1] if len(head) == 2 and head[0] == 0x80 else 0


def load_pickle(
    data: bytes | BinaryIO,
    persistent_load: PersistentLoad | None,
    what: str,
    unsafe: set[str] | None = None,
    *,
    known_classes: Container[str] = frozenset(),
    extra_globals: Mapping[str, Any] | None = None,
) -> Any:
    """Unpickle ``data`` safely; any failure becomes a one-line :class:`ReadError`.

    The names of unsafe globals met on the way are added to ``unsafe``, even ones the result does not reach.
    ``known_classes`` are exact global names this file itself defines as data (a TorchScript archive's
    own ``__torch__`` classes): they become inert, safe stand-ins. ``extra_globals`` maps further exact names
    to inert stand-ins for this file's format only (TorchScript's ``build_intlist``...); they never override
    the common table, and must refuse BUILD (functions are sealed here).
    """
    protocol = _protocol(data)
    if isinstance(data, bytes) and protocol > pickle.HIGHEST_PROTOCOL:  # torch only warns; CPython refuses
        data = b"\x80" + bytes([pickle.HIGHEST_PROTOCOL]) + data[2:]
    stream: BinaryIO = io.BytesIO(data) if isinstance(data, bytes) else data
    size = len(data) if isinstance(data, bytes) else _stream_size(data)
    start = _position(stream)
    # bytes in memory: read through a buffer (the C unpickler then reads ahead instead of calling read()
    # per opcode); a file is read as it is, so that it stops exactly where its pickle ends
    source: BinaryIO = io.BufferedReader(io.BytesIO(data)) if isinstance(data, bytes) else stream
    unpickler = SafeUnpickler(source, persistent_load, known_classes, extra_globals, protocol)
    try:
        with process.gc_paused(), process.heap_cap(size):
            try:
                root = unpickler.load()
            except Exception:
                check_unchecked(unpickler.unchecked)  # a bad tensor before the failure is what torch meets first
                raise
            check_unchecked(unpickler.unchecked)
        return root
    except ReadError as exc:
        note = _unsafe_note(unpickler, stream, start)
        raise _refusal(unpickler)(str(exc) + note) from None
    except RecursionError:
        problem = "nested too deeply to read"
    except MemoryError:
        problem = "refused: it asks for far more memory than its size justifies (a memo bomb?)"
    except EOFError:
        problem = "pickle ends early (truncated file?)"
    except UnicodeDecodeError as exc:
        # torch.load unpickles with encoding="utf-8" (errors strict): such a byte string fails its load too
        problem = f"a pickled byte string is not UTF-8, so torch.load refuses the file too ({_reason(exc)})"
    except Exception as exc:  # any failure of a hostile or broken pickle is a read error
        problem = f"corrupt pickle ({type(exc).__name__}: {_reason(exc)})"
    finally:
        if unsafe is not None:
            unsafe.update(unpickler.unsafe_names)
    note = _unsafe_note(unpickler, stream, start)
    raise _refusal(unpickler)(f"{what}: {problem}{note}")


def _refusal(unpickler: SafeUnpickler) -> type[ReadError]:
    """:class:`UnsafePickle` for a refused pickle naming a global a loader could import (every part of its
    dotted name an identifier), which no other account of the file may replace; else a plain ReadError (a text
    file read as opcodes names "globals" such as ``lass Net:`` that no import finds)."""
    importable = any(all(part.isidentifier() for part in name.split(".")) for name in unpickler.unsafe_names)
    return UnsafePickle if importable else ReadError


def _position(stream: BinaryIO) -> int | None:
    try:
        return stream.tell()
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return None


def _unsafe_note(unpickler: SafeUnpickler, stream: BinaryIO, start: int | None) -> str:
    """For a pickle the reader refused: the unsafe globals it names, met before the failure or after it.

    Read from the opcodes alone (:mod:`.pickle_globals`), classified by the same ``find_class``: a file
    the reader cannot show is still called unsafe when ``torch.load(weights_only=False)`` would run code.
    """
    if start is not None:
        with contextlib.suppress(OSError, ValueError):
            stream.seek(start)
            with process.gc_paused():
                for module, name in named_globals(stream):
                    unpickler.find_class(module, name)
    return unsafe_note(unpickler.unsafe_names)


def unsafe_note(names: set[str]) -> str:
    """``; and it is UNSAFE: it names the unsafe global ...`` for a refused file whose pickles name
    ``names`` (which a loader without weights_only would run), or "" when there are none."""
    shown_names = sorted(names)
    if not shown_names:
        return ""
    shown = ", ".join(shown_names[:5]) + (f" and {len(shown_names) - 5} more" if len(shown_names) > 5 else "")
    return (
        f"; and it is UNSAFE: it names the unsafe global {shown}"
        " (NOT executed here; torch.load(weights_only=False) would run it)"
    )


def unsafe_note_for(data: bytes, limit: int = 16) -> str:
    """``; and it is UNSAFE: ...`` for bytes holding pickles one after another (up to ``limit`` of them),
    from their opcodes alone, or "" when they name no unsafe global: for containers the reader does not
    read (a pre-0.4 tar archive) whose pickles ``torch.load(weights_only=False)`` would still run."""
    stream = io.BytesIO(data)
    unpickler = SafeUnpickler(io.BytesIO(b""), None)
    for _ in range(limit):
        start = stream.tell()
        if start >= len(data):
            break
        with contextlib.suppress(Exception), process.gc_paused():
            for module, name in named_globals(stream):
                unpickler.find_class(module, name)
        if stream.tell() <= start:
            break
    return _unsafe_note(unpickler, stream, None)


def _reason(exc: Exception) -> str:
    """An exception's message, bounded (a message can quote the file's data)."""
    try:
        text = str(exc)
    except Exception:  # str() of a huge int in the message raises
        return "unprintable value"
    return text if len(text) <= 200 else text[:199] + "…"


def _stream_size(stream: BinaryIO) -> int:
    try:
        return os.fstat(stream.fileno()).st_size
    except (AttributeError, OSError, io.UnsupportedOperation):
        return 0


def storage_from_pid(
    pid: Any,
    make: Callable[[str, str, str, int, str], Storage],
    cache: dict[Any, Storage | StorageView],
    slot: Any = None,
) -> Any:
    """Turn a torch persistent id ``('storage', type, key, location, numel[, view])`` into a Storage, or a
    legacy view (:class:`StorageView`); ``cache`` holds both by key, one namespace as in torch's loader.
    ``slot``: the key object the file gave (an int), where it differs from the record name ``key``."""
    # this runs once per tensor: exact type checks, no slicing
    if type(pid) is not tuple or len(pid) < 5 or pid[0] != "storage":
        raise pickle.UnpicklingError(f"persistent id is not a storage: {reprlib.repr(pid)}")
    storage_type, key, location, numel = pid[1], pid[2], pid[3], pid[4]
    if type(storage_type) is not StorageType:
        raise pickle.UnpicklingError(f"unknown storage type {reprlib.repr(storage_type)}")
    if type(numel) is bool:
        numel = int(numel)  # torch multiplies it by the element size: True is 1
    if type(key) is not str:
        # torch names the record data/{key} by the object's own text (torch.Size([2, 3]), torch.float32), not read
        # here: the file is not said to be corrupt, which torch may load
        raise pickle.UnpicklingError(f"a storage key of type {_object_name(key)} is not read here")
    if type(location) is not str or type(numel) is not int or not 0 <= numel < INT64_LIMIT:
        raise pickle.UnpicklingError("malformed storage persistent id")
    slot = key if slot is None else slot
    storage = cache.get(slot)
    if storage is None:
        storage = cache[slot] = make(key, storage_type.dtype, location, numel, storage_type.name)
    elif type(storage) is Storage and storage.nbytes == 0:
        # a storage of no bytes is no storage a later use shares: torch gives that use one of its own type
        storage = make(key, storage_type.dtype, location, numel, storage_type.name)
    if type(storage) is not Storage:
        raise pickle.UnpicklingError(f"legacy storage key {reprlib.repr(key)} names a view and a storage")
    view = pid[5] if len(pid) > 5 else None
    if view is not None:
        return _legacy_view(view, storage, storage_type.dtype, cache)
    return storage


def _object_name(value: Any) -> str:
    """What a value from the file is, in the file's words: a global's name (``torch.float32``, ``torch.Size``)."""
    if isinstance(value, Symbol):
        return value.qualname
    if isinstance(value, Opaque):
        return value.global_name
    if isinstance(value, (TorchSize, Device)):
        return "torch.Size" if isinstance(value, TorchSize) else "torch.device"
    return type(value).__name__


def _legacy_view(view: Any, root: Storage, dtype: str, cache: dict[Any, Storage | StorageView]) -> Any:
    """``legacy_load``'s view: the first one made under a key is the one every later id gets."""
    if not isinstance(view, tuple) or len(view) != 3 or type(view[0]) is not str:
        raise pickle.UnpicklingError("malformed storage view")
    view_key, offset, numel = view
    if (
        type(offset) is not int
        or type(numel) is not int
        or not 0 <= offset < INT64_LIMIT
        or not 0 <= numel < INT64_LIMIT
    ):
        raise pickle.UnpicklingError("malformed storage view")
    made = cache.get(view_key)
    if made is None:
        made = cache[view_key] = StorageView(root, offset, dtype, numel)
    return made
