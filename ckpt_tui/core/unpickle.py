"""A pickle reader that never imports, calls or instantiates anything from the file.

Globals known as data (torch rebuild functions, dtypes, OrderedDict, ...) map to inert
stand-ins from :mod:`ckpt_tui.core.tree`; every other global becomes an
:class:`~ckpt_tui.core.tree.Opaque` placeholder that records how it was used.
"""

from __future__ import annotations

import _compat_pickle
import contextlib
import gc
import io
import os
import pickle
import reprlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO

try:
    import resource
except ImportError:  # not on Windows: the heap cap is skipped there
    resource = None  # type: ignore[assignment]

from ckpt_tui.core.dtypes import DTYPES, STORAGE_CLASS_DTYPES
from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.tree import (
    LAYOUTS,
    SPARSE_LAYOUTS,
    Device,
    Layout,
    Opaque,
    Storage,
    Symbol,
    Tensor,
    TorchSize,
    opaque_class,
)


class StorageType:
    """The storage class named in a persistent id (``torch.FloatStorage``...)."""

    __slots__ = ("dtype", "name")

    def __init__(self, name: str, dtype: str) -> None:
        self.name = name
        self.dtype = dtype


class StorageView:
    """A legacy-format view into a storage, ``offset`` elements in."""

    __slots__ = ("offset", "storage")

    def __init__(self, storage: Storage, offset: int) -> None:
        self.storage = storage
        self.offset = offset


_INT_ONLY = {int}


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not set(map(type, value)) <= _INT_ONLY:
        raise ValueError(f"tensor {what} is not a tuple of ints")
    return tuple(value)


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
    offset = storage_offset
    if isinstance(storage, StorageView):
        offset, storage = storage.offset + storage_offset, storage.storage
    if not isinstance(storage, Storage):
        raise ValueError("tensor storage is not a storage record")
    if type(offset) is not int or offset < 0:
        raise ValueError("tensor storage offset is not a non-negative int")
    shape, strides = _ints(size, "size"), _ints(stride, "stride")
    if len(shape) != len(strides) or (shape and min(shape) < 0):
        raise ValueError("tensor size and stride do not match")
    # positional: this runs once per tensor, 50,000 times on big state_dicts
    return Tensor(
        storage,
        offset,
        shape,
        strides,
        dtype or storage.dtype,
        requires_grad is True,
        backward_hooks,
        metadata if metadata and isinstance(metadata, dict) else None,
    )


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
    if not isinstance(dtype, Symbol) or dtype.name not in DTYPES:
        raise ValueError(f"unknown tensor dtype {dtype!r}")
    return _rebuild_tensor_v2(
        storage,
        storage_offset,
        size,
        stride,
        requires_grad,
        backward_hooks,
        metadata,
        dtype=dtype.name,
    )


def _rebuild_tensor(storage: Any, storage_offset: Any, size: Any, stride: Any) -> Tensor:
    return _rebuild_tensor_v2(storage, storage_offset, size, stride)


def _rebuild_parameter(data: Any, requires_grad: Any, backward_hooks: Any, state: Any = None) -> Any:
    if not isinstance(data, Tensor):
        raise ValueError("parameter data is not a tensor")
    data.parameter = True
    data.requires_grad = bool(requires_grad)
    data.parameter_state = state
    return data


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    if not callable(func) or not isinstance(args, tuple):
        raise ValueError("malformed _rebuild_from_type_v2 call")
    result = func(*args)
    if isinstance(result, Tensor) and isinstance(new_type, Symbol) and new_type.name == "Parameter":
        result.parameter = True
    if isinstance(result, Opaque) and state is not None:  # a tensor subclass (DTensor...): keep its fields
        result.state = state
    return result


def _rebuild_meta_tensor_no_storage(dtype: Any, size: Any, stride: Any, requires_grad: Any) -> Tensor:
    if not isinstance(dtype, Symbol) or dtype.name not in DTYPES:
        raise ValueError(f"unknown tensor dtype {dtype!r}")
    return Tensor(
        None,
        0,
        _ints(size, "size"),
        _ints(stride, "stride"),
        dtype.name,
        bool(requires_grad),
    )


def _device(kind: Any, index: Any = None) -> Device:
    if not isinstance(kind, str) or not (index is None or type(index) is int):
        raise ValueError("malformed torch.device")
    if ":" in kind and index is None:
        kind, _, number = kind.partition(":")
        index = int(number)
    return Device(kind, index)


def _encode(text: Any, encoding: Any = "utf-8") -> bytes:
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1", "utf-8", "utf8", "ascii"):
        raise ValueError("unsupported _codecs.encode call")
    return text.encode(encoding)


def _bytearray(data: Any = b"") -> bytearray:
    if not isinstance(data, (bytes, list)):
        raise ValueError("bytearray from a non-bytes value")
    return bytearray(data)


def _get_layout(name: Any) -> Layout:
    if name not in LAYOUTS:
        raise ValueError(f"unknown tensor layout {reprlib.repr(name)}")
    return Layout(name)


_QSCHEMES = {"torch.per_tensor_affine", "torch.per_channel_affine", "torch.per_channel_affine_float_qparams"}


def _quantizer(params: Any, shape: tuple[int, ...]) -> tuple[Any, ...]:
    """Quantizer parameters in one of the two shapes torch pickles (per-tensor, per-channel)."""
    if type(params) is not tuple or not params or not isinstance(params[0], Symbol):
        raise ValueError("malformed quantizer parameters")
    scheme = params[0].qualname
    if scheme == "torch.per_tensor_affine" and len(params) == 3:
        if type(params[1]) is float and type(params[2]) is int:
            return params
    elif scheme in _QSCHEMES and len(params) == 4:
        scales, zero_points, axis = params[1], params[2], params[3]
        tensors = isinstance(scales, Tensor) and isinstance(zero_points, Tensor) and type(axis) is int
        if tensors and 0 <= axis < len(shape) and scales.numel == zero_points.numel == shape[axis]:
            return params
    raise ValueError(f"unsupported quantizer parameters for {scheme}")


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
    shape = _ints(size, "size")
    if min(shape, default=0) < 0:
        raise ValueError("sparse tensor size is negative")
    values = parts[-1]
    return Tensor(None, 0, shape, (), values.dtype, kind=layout.name, sparse=data)


def _reconstructor(cls: Any, base: Any, state: Any) -> Any:
    if isinstance(cls, type) and issubclass(cls, Opaque):
        obj = cls.__new__(cls)
        obj.how = "reconstructor"
        obj.args = (base, state)
        return obj
    raise ValueError("copyreg._reconstructor of a non-class")


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
    "Tensor",
]

_SAFE_OPAQUE = {
    "argparse.Namespace",
    "types.SimpleNamespace",
    "collections.defaultdict",
    "collections.Counter",
    "collections.deque",
    "builtins.slice",
    "datetime.datetime",
    "datetime.date",
    "datetime.time",
    "datetime.timedelta",
    "pathlib.PosixPath",
    "pathlib.WindowsPath",
    "pathlib.PurePosixPath",
    "numpy.core.multiarray._reconstruct",
    "numpy._core.multiarray._reconstruct",
    "numpy.core.multiarray.scalar",
    "numpy._core.multiarray.scalar",
    "numpy.ndarray",
    "numpy.dtype",
    "torch._utils._rebuild_nested_tensor",
    "torch._utils._rebuild_wrapper_subclass",
    "torch._utils._rebuild_device_tensor_from_numpy",
    "torch._utils._rebuild_device_tensor_from_cpu_tensor",
    "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
    "torch.torch_version.TorchVersion",
}
_SAFE_OPAQUE_PREFIXES = ("torch.distributed.checkpoint.", "__torch__.", "torch.distributed._shard.")


def _known_globals() -> dict[str, Any]:
    known: dict[str, Any] = {
        "collections.OrderedDict": OrderedDict,
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
    for name in _SYMBOL_NAMES:
        known[f"torch.{name}"] = Symbol(f"torch.{name}")
    for cls, dtype in STORAGE_CLASS_DTYPES.items():
        known[f"torch.{cls}"] = StorageType(cls, dtype)
        known[f"torch.cuda.{cls}"] = StorageType(cls, dtype)
    return known


KNOWN_GLOBALS = _known_globals()

PersistentLoad = Callable[[Any], Any]


class SafeUnpickler(pickle.Unpickler):
    """Unpickler whose ``find_class`` returns stand-ins and never imports."""

    def __init__(
        self,
        file: BinaryIO,
        persistent_load: PersistentLoad | None,
        known_classes: frozenset[str] = frozenset(),
        extra_globals: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(file, encoding="latin1")
        self._persistent = persistent_load
        self._opaque: dict[str, type[Opaque]] = {}
        self._known_classes = known_classes
        self._extra_globals = extra_globals or {}

    @property
    def unsafe_names(self) -> set[str]:
        """Every global this pickle named that is not known as data (reachable from the result or not)."""
        return {name for name, cls in self._opaque.items() if not cls.safe}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        full = f"{module}.{name}"
        known = KNOWN_GLOBALS.get(full)
        if known is None:
            known = self._extra_globals.get(full)
        if known is not None:
            return known
        cls = self._opaque.get(full)
        if cls is None:
            safe = full in _SAFE_OPAQUE or full in self._known_classes or full.startswith(_SAFE_OPAQUE_PREFIXES)
            cls = self._opaque[full] = opaque_class(full, safe=safe)
        return cls

    def persistent_load(self, pid: Any) -> Any:
        if self._persistent is None:
            raise pickle.UnpicklingError("persistent id in a plain pickle")
        return self._persistent(pid)


HEADROOM = 1 << 30
GROWTH_PER_BYTE = 16


def _data_in_use() -> int | None:
    """This process's data segment (heap and anonymous mappings) in bytes, where Linux tells."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


@contextlib.contextmanager
def heap_limit(pickle_bytes: int) -> Iterator[None]:
    """Cap heap growth while the C unpickler runs.

    A one-byte LONG_BINPUT with a huge index makes CPython's unpickler grow its memo to that index
    (gigabytes, zeroed one by one); real pickles need a small multiple of their size. Under the cap
    such a file fails at once with MemoryError. File-backed mappings do not count against it.
    """
    in_use = _data_in_use() if resource is not None else None
    if in_use is None:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    cap = in_use + HEADROOM + GROWTH_PER_BYTE * pickle_bytes
    if soft != resource.RLIM_INFINITY and soft <= cap:
        yield
        return
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
    except (ValueError, OSError):
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def load_pickle(
    data: bytes | BinaryIO,
    persistent_load: PersistentLoad | None,
    what: str,
    unsafe: set[str] | None = None,
    *,
    known_classes: frozenset[str] = frozenset(),
    extra_globals: Mapping[str, Any] | None = None,
) -> Any:
    """Unpickle ``data`` safely; any failure becomes a one-line :class:`ReadError`.

    The names of unsafe globals met on the way are added to ``unsafe``, even ones the result does not reach.
    ``known_classes`` are exact global names this file itself defines as data (a TorchScript archive's
    own ``__torch__`` classes): they become inert, safe stand-ins. ``extra_globals`` maps further exact names
    to inert stand-ins for this file's format only (TorchScript's ``build_intlist``...); they never override
    the common table.
    """
    stream = io.BytesIO(data) if isinstance(data, bytes) else data
    size = len(data) if isinstance(data, bytes) else _stream_size(data)
    enabled = gc.isenabled()
    gc.disable()
    unpickler = SafeUnpickler(stream, persistent_load, known_classes, extra_globals)
    try:
        with heap_limit(size):
            return unpickler.load()
    except ReadError:
        raise
    except RecursionError:
        raise ReadError(f"{what}: nested too deeply to read") from None
    except MemoryError:
        raise ReadError(
            f"{what}: refused: it asks for far more memory than its size justifies (a memo bomb?)"
        ) from None
    except EOFError:
        raise ReadError(f"{what}: pickle ends early (truncated file?)") from None
    except Exception as exc:  # any failure of a hostile or broken pickle is a read error
        raise ReadError(f"{what}: corrupt pickle ({type(exc).__name__}: {exc})") from None
    finally:
        if unsafe is not None:
            unsafe.update(unpickler.unsafe_names)
        if enabled:
            gc.enable()


def _stream_size(stream: BinaryIO) -> int:
    try:
        return os.fstat(stream.fileno()).st_size
    except (AttributeError, OSError, io.UnsupportedOperation):
        return 0


def storage_from_pid(pid: Any, make: Callable[[str, str, str, int, str], Storage], cache: dict[str, Storage]) -> Any:
    """Turn a torch persistent id ``('storage', type, key, location, numel[, view])`` into a Storage."""
    # this runs once per tensor: exact type checks, no slicing
    if type(pid) is not tuple or len(pid) < 5 or pid[0] != "storage":
        raise pickle.UnpicklingError(f"persistent id is not a storage: {reprlib.repr(pid)}")
    storage_type, key, location, numel = pid[1], pid[2], pid[3], pid[4]
    if type(storage_type) is not StorageType:
        raise pickle.UnpicklingError(f"unknown storage type {reprlib.repr(storage_type)}")
    if type(key) is not str or type(location) is not str or type(numel) is not int or numel < 0:
        raise pickle.UnpicklingError("malformed storage persistent id")
    storage = cache.get(key)
    if storage is None:
        storage = cache[key] = make(key, storage_type.dtype, location, numel, storage_type.name)
    view = pid[5] if len(pid) > 5 else None
    if view:
        if not isinstance(view, tuple) or len(view) != 3 or type(view[1]) is not int:
            raise pickle.UnpicklingError("malformed storage view")
        return StorageView(storage, view[1])
    return storage
