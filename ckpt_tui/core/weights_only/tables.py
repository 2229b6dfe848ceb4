"""torch's weights-only allowlist as data, per torch version, and which refused globals are plain data.

The names below are what ``torch._weights_only_unpickler._get_allowed_globals()`` holds in torch
2.13 (a test compares them with the installed torch); :data:`ADDED_IN` and :data:`REMOVED_AFTER`
record the differences across 2.6–2.14, read from each release's ``_weights_only_unpickler.py``.
Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass

# ---- versions -----------------------------------------------------------------------------

VERSIONS: tuple[tuple[int, int], ...] = tuple((2, minor) for minor in range(6, 15))
"""The torch releases the emulation was compared with (2.6 made ``weights_only=True`` the default)."""

SETITEM_CHECK_SINCE = (2, 10)
"""From 2.10 on, SETITEM/SETITEMS write only into dict, OrderedDict or Counter; earlier ones write into anything."""

SAFETENSORS_ROUTE_SINCE = (2, 13)
"""From 2.13 on, ``torch.load`` hands any path ending in ``.safetensors`` to ``safetensors.torch.load_file``."""


def version_text(version: tuple[int, int]) -> str:
    """``2.13``."""
    return f"{version[0]}.{version[1]}"


# ---- the allowlist ------------------------------------------------------------------------

# torch's Python-2 name fixes (torch._utils.IMPORT_MAPPING / NAME_MAPPING), applied to every GLOBAL
IMPORT_MAPPING = {
    "__builtin__": "builtins",
    "copy_reg": "copyreg",
    "Queue": "queue",
    "repr": "reprlib",
    "_abcoll": "collections.abc",
    "UserDict": "collections",
    "UserList": "collections",
    "UserString": "collections",
    "whichdb": "dbm",
    "StringIO": "io",
    "cStringIO": "io",
}
NAME_MAPPING = {
    ("__builtin__", "xrange"): ("builtins", "range"),
    ("__builtin__", "reduce"): ("functools", "reduce"),
    ("__builtin__", "intern"): ("sys", "intern"),
    ("__builtin__", "unichr"): ("builtins", "chr"),
    ("__builtin__", "unicode"): ("builtins", "str"),
    ("__builtin__", "long"): ("builtins", "int"),
    ("itertools", "izip"): ("builtins", "zip"),
    ("itertools", "imap"): ("builtins", "map"),
    ("itertools", "ifilter"): ("builtins", "filter"),
    ("itertools", "ifilterfalse"): ("itertools", "filterfalse"),
    ("itertools", "izip_longest"): ("itertools", "zip_longest"),
    ("UserDict", "IterableUserDict"): ("collections", "UserDict"),
    ("UserList", "UserList"): ("collections", "UserList"),
    ("UserString", "UserString"): ("collections", "UserString"),
    ("__builtin__", "basestring"): ("builtins", "str"),
    ("exceptions", "StandardError"): ("builtins", "Exception"),
    ("UserDict", "UserDict"): ("collections", "UserDict"),
}

BLOCKED_MODULES = frozenset({"sys", "os", "posix", "nt"})
"""Modules torch refuses even when the user allowlists a name from them."""

IMPORTED_ALLOWED = frozenset(
    {
        "torch.nested._internal.nested_tensor.NestedTensor",
        "torch.nested._internal.nested_tensor._rebuild_njt",
        "torch.distributed._mesh_layout._MeshLayout",
        "torch.distributed._mesh_layout._FlatLayout",
    }
)
"""Names ``import torch`` itself allowlists (through ``add_safe_globals``) in torch 2.13."""

IMPORT_ALLOWS = {
    # torch/distributed/tensor/__init__.py: add_safe_globals([DeviceMesh, _DTensorSpec, ...]) "for weights_only
    # torch.load"; torch's refusal of the first four names below says "must be imported to load DTensors"
    "torch.distributed.tensor": frozenset(
        {
            "torch.distributed.device_mesh.DeviceMesh",
            "torch.distributed.tensor.DTensor",
            "torch.distributed.tensor._dtensor_spec.DTensorSpec",
            "torch.distributed.tensor._dtensor_spec.ShardOrderEntry",
            "torch.distributed.tensor._dtensor_spec.TensorMeta",
            "torch.distributed.tensor.placement_types.Partial",
            "torch.distributed.tensor.placement_types.Replicate",
            "torch.distributed.tensor.placement_types.Shard",
            "torch.distributed.tensor.placement_types._StridedShard",
        }
    ),
    # torch/_dynamo/__init__.py (torch's refusal says "torch.nested and torch._dynamo"; torch.nested comes with torch)
    "torch._dynamo": frozenset({"torch._dynamo.decorators._DimRange"}),
}
"""Modules whose import allowlists more names (``add_safe_globals`` at import time, torch 2.13): a file that
needs them is refused by ``torch.load`` in a fresh process and loads once the user imports the module."""

NEEDS_IMPORT = {name: module for module, names in IMPORT_ALLOWS.items() for name in names}
"""Each name :data:`IMPORT_ALLOWS` holds -> the module to import first."""

IMPORTS_READ = "2.13"
"""The torch release :data:`IMPORT_ALLOWS` was read from (ShardOrderEntry, _StridedShard are newer than 2.6)."""

IMPORT_WHAT = {"torch.distributed.tensor": "torch's DTensor classes", "torch._dynamo": "torch's _DimRange class"}
"""What each module of :data:`IMPORT_ALLOWS` allowlists, in words."""

WRAPPER_SUBCLASSES = frozenset({"torch.distributed.tensor.DTensor"})
"""Tensor wrapper subclasses among :data:`NEEDS_IMPORT`: each defines ``__torch_dispatch__`` (so
``_rebuild_wrapper_subclass`` makes one) and no ``__setstate__`` of its own (so ``_rebuild_from_type_v2``
sets its state with ``_set_obj_state``, as on a plain Tensor)."""

LEGACY_STORAGE_DTYPES = {
    "BFloat16Storage": "bfloat16",
    "BoolStorage": "bool",
    "ByteStorage": "uint8",
    "CharStorage": "int8",
    "ComplexDoubleStorage": "complex128",
    "ComplexFloatStorage": "complex64",
    "DoubleStorage": "float64",
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "IntStorage": "int32",
    "LongStorage": "int64",
    "ShortStorage": "int16",
    "QInt32Storage": "qint32",
    "QInt8Storage": "qint8",
    "QUInt2x4Storage": "quint2x4",
    "QUInt4x2Storage": "quint4x2",
    "QUInt8Storage": "quint8",
}
CUDA_STORAGES = tuple(name for name in LEGACY_STORAGE_DTYPES if not name.startswith("Q"))
TENSOR_TYPES = ("BFloat16", "Bool", "Byte", "Char", "Double", "Float", "Half", "Int", "Long", "Short")
SPARSE_TENSOR_TYPES = tuple(t for t in TENSOR_TYPES if t != "Bool")
_DTYPES_2_13 = (
    "bfloat16 bits16 bits1x8 bits2x4 bits4x2 bits8 bool complex128 complex32 complex64 float16 float32 "
    "float4_e2m1fn_x2 float64 float8_e4m3fn float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz float8_e8m0fnu "
    "int16 int32 int64 int8 qint32 qint8 quint2x4 quint4x2 quint8 uint16 uint32 uint64 uint8"
)
DTYPE_NAMES = _DTYPES_2_13.split(" ") + [f"{kind}{bits}" for kind in ("int", "uint") for bits in range(1, 8)]
QSCHEMES = (
    "per_tensor_affine",
    "per_tensor_symmetric",
    "per_channel_affine",
    "per_channel_symmetric",
    "per_channel_affine_float_qparams",
)
REBUILD_FUNCTIONS = (
    "_rebuild_parameter",
    "_rebuild_parameter_with_state",
    "_rebuild_qtensor",
    "_rebuild_tensor",
    "_rebuild_tensor_v2",
    "_rebuild_tensor_v3",
    "_rebuild_sparse_tensor",
    "_rebuild_meta_tensor_no_storage",
    "_rebuild_nested_tensor",
    "_rebuild_wrapper_subclass",
    "_rebuild_device_tensor_from_numpy",
    "_rebuild_device_tensor_from_cpu_tensor",
)
FLOATING_DTYPES = frozenset(
    {"bfloat16", "float16", "float32", "float64", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2"}
    | {"float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "complex32", "complex64", "complex128"}
)


@dataclass(frozen=True, slots=True)
class AllowedGlobal:
    """One value torch's allowlist maps a global name to: what it is, and what it stands for."""

    name: str
    role: str
    """class, function, dtype, qscheme, storage_type (a legacy storage class), tensor_class"""
    detail: str = ""
    """the dtype of a storage type or tensor class; the function's short name"""


def _allowed_globals() -> dict[str, AllowedGlobal]:
    table: dict[str, AllowedGlobal] = {}

    def add(name: str, role: str, detail: str = "") -> None:
        table[name] = AllowedGlobal(name, role, detail or name.rsplit(".", 1)[-1])

    for name in (
        "collections.OrderedDict",
        "collections.Counter",
        "torch.nn.parameter.Parameter",
        "torch.Size",
        "torch.Tensor",
        "torch.device",
        "builtins.bytearray",
        "builtins.set",
        "builtins.complex",
        "torch.storage.TypedStorage",
        "torch.storage.UntypedStorage",
    ):
        add(name, "class")
    for name in ("torch.serialization._get_layout", "_codecs.encode", "torch._tensor._rebuild_from_type_v2"):
        add(name, "function")
    for function in REBUILD_FUNCTIONS:
        add(f"torch._utils.{function}", "function")
    for dtype in DTYPE_NAMES:
        add(f"torch.{dtype}", "dtype", dtype)
    for scheme in QSCHEMES:
        add(f"torch.{scheme}", "qscheme")
    for storage, dtype in LEGACY_STORAGE_DTYPES.items():
        add(f"torch.{storage}", "storage_type", dtype)
    for storage in CUDA_STORAGES:
        add(f"torch.cuda.{storage}", "storage_type", LEGACY_STORAGE_DTYPES[storage])
    for prefix, kinds in (("torch.", TENSOR_TYPES), ("torch.cuda.", TENSOR_TYPES)):
        for kind in kinds:
            add(f"{prefix}{kind}Tensor", "tensor_class", "dense")
    for prefix in ("torch.sparse.", "torch.cuda.sparse."):
        for kind in SPARSE_TENSOR_TYPES:
            add(f"{prefix}{kind}Tensor", "tensor_class", "sparse")
    return table


ALLOWED: dict[str, AllowedGlobal] = _allowed_globals()
"""torch 2.13's default weights-only allowlist: exact name -> what it stands for."""

ADDED_IN: dict[str, tuple[int, int]] = {
    **{f"torch.{kind}{bits}": (2, 7) for kind in ("int", "uint") for bits in range(1, 8)},
    "torch.float8_e8m0fnu": (2, 7),
    "torch.float4_e2m1fn_x2": (2, 8),
    "torch.bcomplex32": (2, 14),
}
"""Allowlisted names that older (or, for bcomplex32, only newer) releases lack."""


def allowed_in(name: str, version: tuple[int, int]) -> bool:
    """Whether ``name`` is on the default allowlist of that torch version."""
    since = ADDED_IN.get(name)
    if since is not None:
        return version >= since
    return name in ALLOWED


# ---- what setattr does on a tensor (torch._utils._set_obj_state) ---------------------------------

_READ_ONLY = (
    "H T __cuda_array_interface__ __weakref__ _base _cdata _has_symbolic_sizes_strides _python_dispatch _version "
    "device dtype grad_fn is_cpu is_cuda is_ipu is_leaf is_maia is_meta is_mkldnn is_mps is_mtia is_nested "
    "is_quantized is_sparse is_sparse_csr is_vulkan is_xla is_xpu itemsize layout mH mT name nbytes ndim "
    "output_nr retains_grad shape"
)
TENSOR_ATTRIBUTES: dict[str, str] = {
    **dict.fromkeys(_READ_ONLY.split(), "read-only"),
    **dict.fromkeys(("_backward_hooks", "_post_accumulate_grad_hooks", "volatile"), "instance"),
    "__dict__": "dict",
    "data": "data",
    "grad": "grad",
    "_grad": "grad",
    "requires_grad": "requires_grad",
    "_grad_fn": "none",
    "grad_dtype": "none-or-more",
    "real": "may",
    "imag": "complex-only",
    "__class__": "may",
}
"""The data descriptors of ``torch.nn.Parameter`` in torch 2.13 (a test compares them with the installed torch)
and what setting one does: read-only ones raise; ``instance``: accepts anything; the others check the value
(``may``: a check not emulated here; ``complex-only``: refused on a tensor that is not complex, else ``may``).
Any other name becomes an instance attribute."""


# ---- refused globals that are plain data ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class DataGlobal:
    """A refused global that only builds plain data, and how to name it in ``add_safe_globals``."""

    expression: str
    """Python that evaluates to the object (``argparse.Namespace``)."""
    module: str
    """The module to import for ``expression``."""
    by_name: bool = False
    """Name it as ``(object, "name in the file")``: its ``__module__`` differs across versions."""


_PATH_CLASSES = frozenset({"Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"})
_NUMPY_CORE = ("numpy.core.multiarray", "numpy._core.multiarray")
_OMEGACONF = {
    "omegaconf.dictconfig.DictConfig",
    "omegaconf.listconfig.ListConfig",
    "omegaconf.base.ContainerMetadata",
    "omegaconf.base.Metadata",
    "omegaconf.nodes.AnyNode",
    "omegaconf.nodes.StringNode",
    "omegaconf.nodes.IntegerNode",
    "omegaconf.nodes.FloatNode",
    "omegaconf.nodes.BooleanNode",
    "omegaconf.nodes.BytesNode",
    "omegaconf.nodes.PathNode",
    "omegaconf.nodes.EnumNode",
}
PLAIN_DATA_CLASSES = frozenset(
    {
        "argparse.Namespace",
        "types.SimpleNamespace",
        "collections.defaultdict",
        "collections.deque",
        "datetime.datetime",
        "datetime.date",
        "datetime.time",
        "datetime.timedelta",
        "datetime.timezone",
        "decimal.Decimal",
        "fractions.Fraction",
        "uuid.UUID",
        "typing.Any",
        "numpy.ndarray",
        "numpy.dtype",
    }
)
"""The plain-data classes outside builtins, pathlib and omegaconf: a file may hold their objects, and
an ``add_safe_globals`` line allowlists them. The scan takes each for a class (a REDUCE of one builds
one of its instances), whatever the case of its name (``collections.deque``, ``datetime.date``)."""
_PLAIN_DATA = {
    *PLAIN_DATA_CLASSES,
    *(f"builtins.{name}" for name in ("dict", "list", "tuple", "int", "float", "str", "bool", "bytes", "frozenset")),
    *(f"builtins.{name}" for name in ("object", "slice", "range", "NoneType")),
    *(f"pathlib.{name}" for name in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath")),
    "pathlib.PureWindowsPath",
    *(f"pathlib._local.{name}" for name in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath")),
    "pathlib._local.PureWindowsPath",
    *_OMEGACONF,
}


def data_global(name: str) -> DataGlobal | None:
    """How to allowlist ``name`` if it is a known plain-data global, else None."""
    if name.startswith("numpy.dtypes.") and name.endswith("DType") and name.count(".") == 2:
        return DataGlobal(name, "numpy")
    for core in _NUMPY_CORE:
        if name in (f"{core}._reconstruct", f"{core}.scalar"):
            # as the file names it: numpy 2 wrote numpy._core (numpy.core warns there), numpy 1 numpy.core
            return DataGlobal(name, "numpy", by_name=True)
    if name.startswith(("pathlib._local.", "pathlib.")) and name.rsplit(".", 1)[1] in _PATH_CLASSES:
        # by name: Python 3.13 moved the classes to pathlib._local, files keep the name they were saved with
        return DataGlobal("pathlib." + name.rsplit(".", 1)[1], "pathlib", by_name=True)
    if name in _PLAIN_DATA:
        module, _, short = name.rpartition(".")
        if module == "builtins":
            return DataGlobal(short if short != "NoneType" else "type(None)", "builtins", by_name=short == "NoneType")
        return DataGlobal(name, module.split(".")[0] if module.startswith("omegaconf") else module)
    return None
