"""``--sanitize``: rewrite what ``torch.load(weights_only=True)`` refuses into plain data it accepts.

An ordinary edit, ``(root) -> (new root, Change)``: the tree is read as it is, nothing from the file
is imported or called. Every rewrite reads the object's pickled arguments and state:

==========================================  =====================================================
refused object                               becomes
==========================================  =====================================================
``argparse.Namespace``, ``SimpleNamespace``  a dict of its attributes
numpy arrays                                 tensors of the same dtype and values (bytes parsed here)
numpy scalars, dtypes                        Python scalars, the dtype's name
OmegaConf ``DictConfig`` / ``ListConfig``    dict / list of their values (``_content``)
``pathlib`` paths                            str
``datetime`` values                          ISO 8601 strings
enum members                                 their value
a pickled ``nn.Module`` (or DataParallel)    its state_dict, with ``_metadata``
``defaultdict``, ``deque``, ``frozenset``    dict, list, set
any other object with plain-data state       ``{"__class__": "module.Name", **state}``
==========================================  =====================================================

Functions, references to functions and the results of calling them are code: they are refused
with their path, unless ``drop`` names a path that holds them.
"""

from __future__ import annotations

import dataclasses
import datetime
import pathlib
import shlex
import struct
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ckpt_tui.core.conventions.quantized_modules import state_dict_children, state_dict_version
from ckpt_tui.core.edits.tree_edits import Change, refuse_unreached_tensors
from ckpt_tui.core.errors import EditError
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.keypath import Attr, Key, KeyPath, to_python, to_slash
from ckpt_tui.core.model.made_bytes import MemorySource
from ckpt_tui.core.model.numpy_values import NUMPY_DTYPES, NotNumpy, array_state, scalar_of
from ckpt_tui.core.model.tree import LAYOUTS, Device, Opaque, Storage, Symbol, Tensor, TorchSize, is_global_ref
from ckpt_tui.core.readers.distributed_globals import framework_of
from ckpt_tui.core.weights_only.verdict import outer_path, tables

MODULE_VERSIONS = {
    f"torch.nn.modules.{kind}.{name}{dims}": 2
    for kind, name in (("batchnorm", "BatchNorm"), ("batchnorm", "LazyBatchNorm"), ("instancenorm", "InstanceNorm"))
    for dims in ("1d", "2d", "3d")
} | {
    "torch.nn.modules.instancenorm.LazyInstanceNorm1d": 2,
    "torch.nn.modules.instancenorm.LazyInstanceNorm2d": 2,
    "torch.nn.modules.instancenorm.LazyInstanceNorm3d": 2,
    "torch.nn.modules.batchnorm.SyncBatchNorm": 2,
}
"""``nn.Module`` classes whose ``_version`` (a class attribute, so not in the pickle) is not 1."""
OMEGACONF_NODES = "omegaconf.nodes."
_KNOWN_CLASSES = frozenset({"functools.partial", "collections.OrderedDict", "collections.Counter"})


@dataclass
class SanitizeChange(Change):
    """A sanitize edit: per kind of rewrite, how many objects and which classes."""

    kinds: dict[str, tuple[int, set[str]]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """A line per kind of rewrite with its count and the class names replaced."""
        out = [f"{self.title}: {counted(self.count, 'object')} rewritten"]
        for kind, (count, names) in self.kinds.items():
            out.append(f"  {kind}: {count} ({', '.join(sorted(names))})")
        return out


class _Refused(Exception):
    """A value that is code: it has no plain-data form."""


def sanitize(root: Any, drop: Iterable[KeyPath] = ()) -> tuple[Any, SanitizeChange]:
    """The tree with every refused object rewritten as plain data; code refused unless dropped."""
    rewriter = _Rewriter(frozenset(drop))
    new_root = rewriter.visit(root, ())
    if rewriter.refused:
        listed = "; ".join(f"{name} at {_where(path)}" for path, name in rewriter.refused[:5])
        more = f" and {len(rewriter.refused) - 5} more" if len(rewriter.refused) > 5 else ""
        drops = " ".join(dict.fromkeys(_drop_option(path) for path, _ in rewriter.refused[:5]))
        raise EditError(
            f"cannot sanitize: code, not data: {listed}{more} (leave them out with {drops}, or trust the file)"
        )
    count = sum(n for n, _ in rewriter.kinds.values())
    change = SanitizeChange("sanitize for torch.load(weights_only=True)", count, kinds=rewriter.kinds)
    if rewriter.dropped:
        change.kinds["dropped (--drop)"] = (len(rewriter.dropped), {_where(p) for p in rewriter.dropped})
    return new_root, change


def _drop_option(path: KeyPath) -> str:
    """The ``--drop`` that leaves the value at ``path`` out (``--drop PATH`` for code at the root)."""
    return f"--drop {shlex.quote(to_slash(path))}" if path else "--drop PATH"


def _where(path: KeyPath) -> str:
    return to_python(path) if path else "the root"


_NOT_PLAIN = object()
"""What :meth:`_Rewriter._plain_data` answers for a global that is not known plain data."""


class _Rewriter:
    """One walk over the tree; each object visited once (shared objects stay shared)."""

    def __init__(self, drop: frozenset[KeyPath]) -> None:
        self.drop = drop
        self.memo: dict[int, Any] = {}
        self.active: set[int] = set()
        self.refused: list[tuple[KeyPath, str]] = []
        self.dropped: list[KeyPath] = []
        self.kinds: dict[str, tuple[int, set[str]]] = {}
        self.arrays = 0

    def note(self, kind: str, name: str) -> None:
        count, names = self.kinds.get(kind, (0, set()))
        names.add(name)
        self.kinds[kind] = (count + 1, names)

    def refuse(self, path: KeyPath, name: str) -> None:
        where = outer_path(path)
        if all(where != seen for seen, _ in self.refused):
            self.refused.append((where, name))

    # ---- the walk ----------------------------------------------------------------------------

    def visit(self, value: Any, path: KeyPath) -> Any:
        if value is None or isinstance(value, (bool, int, float, str, bytes, complex, Device, TorchSize)):
            return value
        key = id(value)
        if key in self.memo:
            return self.memo[key]
        if key in self.active:
            self.refuse(path, "a cycle through a tuple or an object")
            return None
        self.active.add(key)
        try:
            result = self._visit(value, path)
        except _Refused as exc:
            self.refuse(path, str(exc))
            result = None
        finally:
            self.active.discard(key)
        self.memo[key] = result
        return result

    def _visit(self, value: Any, path: KeyPath) -> Any:
        if isinstance(value, Tensor):
            return self._tensor(value, path)
        if isinstance(value, dict):
            return self._dict(value, path)
        if isinstance(value, list):
            new: list[Any] = []
            self.memo[id(value)] = new
            new.extend(self._children(enumerate(value), path))
            return new
        if isinstance(value, tuple):
            return tuple(item for _, item in self._pairs(enumerate(value), path))
        if isinstance(value, (set, frozenset)):
            if isinstance(value, frozenset):
                self.note("frozenset → set", "builtins.frozenset")
            return {self._hashable(item, path) for item in self._children(enumerate(value), path)}
        if isinstance(value, bytearray):
            return value
        if isinstance(value, Symbol):
            return self._symbol(value)
        if is_global_ref(value):
            return self._global_ref(value.global_name)
        if isinstance(value, Opaque):
            return self._opaque(value, path)
        raise _Refused(type(value).__name__)

    def _pairs(self, items: Iterable[tuple[Key, Any]], path: KeyPath) -> Iterable[tuple[Key, Any]]:
        for key, item in items:
            where = (*path, key)
            if where in self.drop:
                self.dropped.append(where)
                continue
            yield key, self.visit(item, where)

    def _children(self, items: Iterable[tuple[Key, Any]], path: KeyPath) -> Iterable[Any]:
        return (item for _, item in self._pairs(items, path))

    def _hashable(self, value: Any, path: KeyPath) -> Any:
        try:
            hash(value)
        except TypeError:
            raise _Refused("a key or set member that becomes a dict or list") from None
        return value

    def _dict(self, value: dict[Any, Any], path: KeyPath) -> dict[Any, Any]:
        new: dict[Any, Any] = OrderedDict() if isinstance(value, OrderedDict) else {}
        self.memo[id(value)] = new
        for key, item in value.items():
            where = (*path, key)
            if where in self.drop:
                self.dropped.append(where)
                continue
            new_key = self._hashable(self.visit(key, where), where)
            new[new_key] = self.visit(item, where)
        metadata = getattr(value, "_metadata", None)
        if metadata is not None:
            new._metadata = self.visit(metadata, (*path, Attr("_metadata")))  # type: ignore[attr-defined]
        return new

    def _tensor(self, tensor: Tensor, path: KeyPath) -> Tensor:
        changes: dict[str, Any] = {}
        hooks = tensor.hooks
        if hooks is not None and not (type(hooks) is OrderedDict and not hooks):
            self.note("backward hooks → dropped (torch.save never keeps them)", "hooks")
            changes["hooks"] = None
        if tensor.metadata:
            metadata = self.visit(tensor.metadata, (*path, Attr("metadata")))
            if metadata is not tensor.metadata:
                changes["metadata"] = metadata
        if tensor.parameter_state is not None:
            state = self.visit(tensor.parameter_state, (*path, Attr("parameter_state")))
            if state is not tensor.parameter_state:
                changes["parameter_state"] = state
        kind = tensor.python_type
        if kind is not None and not (isinstance(kind, Symbol) and kind.qualname in tables.ALLOWED):
            self.note("tensor subclass → a plain tensor", getattr(kind, "global_name", None) or repr(kind))
            changes["python_type"] = None
        if tensor.python_state is not None:
            state = self.visit(tensor.python_state, (*path, Attr("python_state")))
            if state is not tensor.python_state:
                changes["python_state"] = state
        return dataclasses.replace(tensor, **changes) if changes else tensor

    def _symbol(self, value: Symbol) -> Any:
        if value.qualname in tables.ALLOWED or value.qualname in LAYOUTS:
            return value
        self.note("torch constant → its name", value.qualname)
        return value.qualname

    def _global_ref(self, name: str) -> str:
        if tables.data_global(name) is None:
            raise _Refused(f"{name} (a reference to a function or class)")
        self.note("class reference → its name", name)
        return name

    # ---- objects ---------------------------------------------------------------------------------

    def _opaque(self, value: Opaque, path: KeyPath) -> Any:
        name = value.global_name
        if value.callee is not None:
            raise _Refused(f"the result of calling {value.callee.global_name}")
        if name in tables.ALLOWED:
            return value
        if value.is_module:
            return self._module(value, path)
        rewritten = self._plain_data(value, path)
        if rewritten is not _NOT_PLAIN:
            return rewritten
        if _enum_like(value):
            self.note("enum → its value", name)
            return value.args[0]
        short = name.rsplit(".", 1)[-1]
        known = name in _KNOWN_CLASSES or framework_of(name) is not None  # DeepSpeed's fragment_address: a dataclass
        if value.how == "reconstructor" or short[:1].isupper() or known:
            return self._object(value, path)
        raise _Refused(f"{name} (a function call)")

    def _plain_data(self, value: Opaque, path: KeyPath) -> Any:
        """What an object of a known plain-data global becomes (numpy arrays, scalars and dtypes, namespaces,
        omegaconf, paths, dates, defaultdict, deque, slice, range); :data:`_NOT_PLAIN` for any other."""
        name = value.global_name
        short = name.rsplit(".", 1)[-1]
        if name.startswith("numpy.") and short == "_reconstruct":
            return self._numpy_array(value, path)
        if name.startswith("numpy.") and short == "scalar":
            return self._numpy_scalar(value)
        if name == "numpy.dtype":
            self.note("numpy dtype → its name", name)
            return NUMPY_DTYPES.get(str(value.args[0]) if value.args else "", str(value.args[:1]))
        if name in ("argparse.Namespace", "types.SimpleNamespace"):
            self.note("namespace → dict", name)
            namespace: dict[str, Any] = {}
            self.memo[id(value)] = namespace
            return self._state_into(value, path, namespace)
        if name in ("omegaconf.dictconfig.DictConfig", "omegaconf.listconfig.ListConfig"):
            return self._omegaconf(value, path)
        if name.startswith(OMEGACONF_NODES):
            state = value.state if isinstance(value.state, dict) else {}
            return self.visit(state.get("_val"), (*path, Attr("_val")))
        if name.startswith(("pathlib.", "pathlib._local.")):
            return self._path(value)
        if name.startswith("datetime."):
            return self._datetime(value)
        if name == "collections.defaultdict":
            self.note("defaultdict → dict", name)
            return dict(self._pairs(value.items.items(), path))
        if name == "collections.deque":
            self.note("deque → list", name)
            source = value.list_items or (list(value.args[0]) if value.args and isinstance(value.args[0], list) else [])
            return list(self._children(enumerate(source), path))
        if name in ("builtins.slice", "builtins.range"):
            return self._slice(value)
        return _NOT_PLAIN

    def _state_into(self, value: Opaque, path: KeyPath, new: dict[str, Any]) -> dict[str, Any]:
        """The object's pickled attributes (``__dict__`` and slots), rewritten, added to ``new``."""
        state = value.state
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], (dict, type(None))):
            merged = dict(state[0] or {})
            merged.update(state[1] if isinstance(state[1], dict) else {})
            state = merged
        if state is None:
            state = {}
        if not isinstance(state, dict):
            raise _Refused(f"{value.global_name} with a state that is not a dict")
        for key, item in state.items():
            if key in new:
                raise _Refused(f"{value.global_name} with an attribute {key!r} that clashes with {key}")
            where = (*path, Attr(str(key)))
            if where in self.drop:
                self.dropped.append(where)
                continue
            new[key] = self.visit(item, where)
        return new

    def _object(self, value: Opaque, path: KeyPath) -> dict[str, Any]:
        """Any other object: ``{"__class__": name, **state}`` (plus its constructor arguments, if any)."""
        self.note("object → dict with __class__", value.global_name)
        new: dict[str, Any] = {"__class__": value.global_name}
        self.memo[id(value)] = new
        args = value.args if value.how != "reconstructor" else ()
        if args:
            new["__args__"] = [
                item for _, item in self._pairs(((Attr(f"args[{i}]"), a) for i, a in enumerate(args)), path)
            ]
        if value.state is not None:
            self._state_into(value, path, new)
        if value.items:
            new["__items__"] = dict(self._pairs(value.items.items(), path))
        if value.list_items:
            new["__list__"] = list(self._children(enumerate(value.list_items), path))
        return new

    def _module(self, value: Opaque, path: KeyPath) -> OrderedDict[str, Any]:
        """A pickled ``nn.Module``: its ``state_dict()``, with the ``_metadata`` torch would give it.

        The entries are those torch's ``state_dict()`` writes, a quantized layer's packed weights and
        quantization parameters included; a tensor the module holds that no entry carries (and no
        ``--drop`` names) refuses the rewrite rather than vanish from the output.
        """
        self.note("nn.Module → its state_dict", value.global_name)
        state: OrderedDict[str, Any] = OrderedDict()
        metadata: OrderedDict[str, Any] = OrderedDict()
        self.memo[id(value)] = state
        carried: set[int] = set()
        stack: list[tuple[str, KeyPath, Opaque]] = [("", path, value)]
        seen: set[int] = set()
        while stack:
            prefix, where, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            version = state_dict_version(module) or MODULE_VERSIONS.get(module.global_name, 1)
            metadata[prefix[:-1]] = {"version": version}
            children: list[tuple[str, KeyPath, Opaque]] = []
            for key, child in state_dict_children(module):
                name = getattr(key, "name", str(key))
                child_path = (*where, key)
                if child_path in self.drop:
                    self.dropped.append(child_path)
                elif isinstance(child, Opaque) and child.is_module:
                    children.append((f"{prefix}{name}.", child_path, child))
                else:
                    carried.update(id(t) for t in (child if isinstance(child, tuple) else (child,)))
                    state[prefix + name] = self.visit(child, child_path)
            stack.extend(reversed(children))
        try:
            refuse_unreached_tensors(value, carried, lambda where: self._under_drop((*path, *where)))
        except EditError as exc:
            raise _Refused(f"{value.global_name}: {exc}") from None
        state._metadata = metadata  # type: ignore[attr-defined]
        return state

    def _under_drop(self, path: KeyPath) -> bool:
        return any(path[:n] in self.drop for n in range(1, len(path) + 1))

    def _omegaconf(self, value: Opaque, path: KeyPath) -> Any:
        self.note("OmegaConf container → dict/list", value.global_name)
        state = value.state if isinstance(value.state, dict) else {}
        content = state.get("_content")
        where = (*path, Attr("_content"))
        if isinstance(content, dict):
            new: dict[Any, Any] = {}
            self.memo[id(value)] = new
            for key, item in content.items():
                new[key] = self.visit(item, (*where, key))
            return new
        if isinstance(content, list):
            items: list[Any] = []
            self.memo[id(value)] = items
            items.extend(self.visit(item, (*where, index)) for index, item in enumerate(content))
            return items
        return self.visit(content, where)  # None, or an interpolation / "???" string

    def _path(self, value: Opaque) -> str:
        parts = [part for part in value.args if isinstance(part, str)]
        if len(parts) != len(value.args):
            raise _Refused(f"{value.global_name} with parts that are not text")
        self.note("path → str", value.global_name)
        windows = "Windows" in value.global_name
        return str(pathlib.PureWindowsPath(*parts) if windows else pathlib.PurePosixPath(*parts))

    def _slice(self, value: Opaque) -> dict[str, Any]:
        """``slice(1, 2)``, ``range(3)``: ``{"__class__": "builtins.slice", "start": 1, "stop": 2, "step": None}``."""
        name = value.global_name
        args = value.args
        plain = value.how == "reduce" and value.state is None and not value.items and not value.list_items
        if not plain or not 1 <= len(args) <= 3 or not all(a is None or type(a) is int for a in args):
            raise _Refused(f"{name} with arguments that are not a pickled {name.rsplit('.', 1)[1]}")
        if name == "builtins.range":
            start, stop, step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
        else:
            start, stop, step = (None, args[0], None) if len(args) == 1 else (*args, None)[:3]
        self.note(f"{name.rsplit('.', 1)[1]} → dict with __class__", name)
        return {"__class__": name, "start": start, "stop": stop, "step": step}

    def _datetime(self, value: Opaque) -> str:
        name = value.global_name
        try:
            text = _iso(name, value.args)
        except (ValueError, TypeError, struct.error, OverflowError, IndexError):
            raise _Refused(f"{name} with arguments that are not a pickled {name}") from None
        self.note("datetime → ISO 8601 string", name)
        return text

    # ---- numpy ------------------------------------------------------------------------------------

    def _numpy_array(self, value: Opaque, path: KeyPath) -> Any:
        """``_reconstruct(ndarray, (0,), b'b')`` + BUILD ``(version, shape, dtype, fortran, data)``."""
        try:
            shape, code, order, fortran, raw = array_state(value)
        except NotNumpy as exc:
            raise _Refused(str(exc)) from None
        import numpy as np

        if code[:1] in ("U", "S") and isinstance(raw, bytes):
            self.note("numpy string array → list", "numpy.ndarray")
            array = np.frombuffer(raw, dtype=np.dtype(order + code)).reshape(shape, order="F" if fortran else "C")
            return array.tolist()
        torch_dtype = NUMPY_DTYPES.get(code)
        if torch_dtype is None or not isinstance(raw, bytes):
            raise _Refused(f"a numpy array of dtype {code!r} (object, string or date arrays are not tensors)")
        numpy_dtype = np.dtype(("<" if order in ("|", "=") else order) + code)
        count = 1
        for n in shape:
            count *= n
        if len(raw) != count * numpy_dtype.itemsize:
            raise _Refused(f"a numpy array whose data holds {len(raw)} bytes, not {count * numpy_dtype.itemsize}")
        array = np.frombuffer(raw, dtype=numpy_dtype).reshape(shape, order="F" if fortran else "C")
        data = np.ascontiguousarray(array, dtype=numpy_dtype.newbyteorder("<")).tobytes()
        self.note("numpy array → tensor", "numpy.ndarray")
        self.arrays += 1
        storage = Storage(f"numpy{self.arrays}", torch_dtype, "cpu", count, MemorySource(data))
        strides: list[int] = []
        step = 1
        for n in reversed(shape):
            strides.insert(0, step)
            step *= max(n, 1)
        return Tensor(storage, 0, shape, tuple(strides), torch_dtype)

    def _numpy_scalar(self, value: Opaque) -> Any:
        try:
            found = scalar_of(value)
        except NotNumpy as exc:
            raise _Refused(str(exc)) from None
        self.note("numpy scalar → Python scalar", "numpy scalar")
        return found


def _enum_like(value: Opaque) -> bool:
    """A class called with one plain value and nothing else: how an ``Enum`` member pickles."""
    module = value.global_name.rpartition(".")[0].split(".")[0]
    return (
        value.how == "reduce"
        and len(value.args) == 1
        and isinstance(value.args[0], (int, float, str, bytes))
        and value.state is None
        and not value.items
        and not value.list_items
        and value.global_name.rsplit(".", 1)[-1][:1].isupper()
        and module not in ("datetime", "pathlib", "collections", "numpy", "torch", "builtins")
    )


def _iso(name: str, args: tuple[Any, ...]) -> str:
    """The ISO 8601 text of a pickled ``datetime``/``date``/``time``/``timedelta``/``timezone``."""
    short = name.rsplit(".", 1)[-1]
    if short == "timedelta":
        days, seconds, micro = (*args, 0, 0, 0)[:3]
        sign = "-" if days < 0 else ""
        total = abs(days * 86400 + seconds)
        days_part, rest = divmod(total, 86400)
        return f"{sign}P{days_part}DT{rest}.{micro:06d}S" if micro else f"{sign}P{days_part}DT{rest}S"
    raw = args[0]
    if isinstance(raw, str):
        raw = raw.encode("latin1")
    zone = _zone(args[1]) if len(args) > 1 else None
    if short == "datetime":
        year = raw[0] * 256 + raw[1]
        micro = (raw[7] << 16) | (raw[8] << 8) | raw[9]
        return datetime.datetime(year, raw[2], raw[3], raw[4], raw[5], raw[6], micro, zone).isoformat()
    if short == "date":
        return datetime.date(raw[0] * 256 + raw[1], raw[2], raw[3]).isoformat()
    if short == "time":
        micro = (raw[3] << 16) | (raw[4] << 8) | raw[5]
        return datetime.time(raw[0], raw[1], raw[2], micro, zone).isoformat()
    raise ValueError(name)


def _zone(value: Any) -> datetime.tzinfo:
    if isinstance(value, Opaque) and value.global_name == "datetime.timezone" and value.args:
        delta = value.args[0]
        if isinstance(delta, Opaque) and delta.global_name == "datetime.timedelta":
            days, seconds, micro = (*delta.args, 0, 0, 0)[:3]
            return datetime.timezone(datetime.timedelta(days, seconds, micro))
    raise ValueError("a time zone that is not a fixed offset")
