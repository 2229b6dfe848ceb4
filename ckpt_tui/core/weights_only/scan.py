"""torch's weights-only unpickler, emulated on one pickle without importing or running anything.

torch's ``_weights_only_unpickler.Unpickler`` is a pure-Python loop: it reads only 34 opcodes, resolves
GLOBAL through an allowlist, and allows REDUCE, NEWOBJ, BUILD, SETITEM(S), APPEND(S) and persistent
ids only on certain types. Running such a loop here costs about a second on 50,000 tensors, so the
scan has two parts:

1. a tokenizer (one regular expression over runs of fixed-size opcodes) that refuses every opcode
   torch refuses and rewrites the few whose rules depend on their operands' types (NEWOBJ, BUILD,
   SETITEM(S), APPEND(S), and REDUCE when needed) into a BINPERSID call that reaches
   :meth:`Machine.persistent_load` with the operands;
2. CPython's C unpickler running the rewritten pickle, with stand-ins for torch's allowed globals
   that check their arguments the way torch's functions would, and build inert shadow values.

Refused globals are recorded and treated as if the user had allowlisted them, so one scan finds
every global an ``add_safe_globals`` line must name, and every refusal that no such line can fix.
"""

from __future__ import annotations

import codecs
import io
import math
import pickle
import re
import secrets
import struct
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ckpt_tui.core.model.dtypes import DTYPES, QUANT_SCALE_DTYPES, QUANT_ZERO_POINT_DTYPES, QUANTIZED_DTYPES
from ckpt_tui.core.model.tree import (
    DEVICE_INDEX_LIMIT,
    DEVICE_STRING_INDEX_LIMIT,
    LAYOUTS,
    TORCH_DEVICE,
    contiguous_strides,
)
from ckpt_tui.core.weights_only import tables

MEMO_LIMIT = 1 << 20
"""Memo indices below this pass through; larger ones (a memo bomb for CPython's array memo) are renumbered."""


class Refusal(Exception):
    """torch refuses the pickle at this point, and no ``add_safe_globals`` line changes that."""


class CannotTell(Refusal):
    """The emulation does not model what torch does here: torch may load or refuse (the verdict: "cannot tell").

    A subclass of :class:`Refusal` so that every path that stops on a refusal stops here too; the scan
    records it in :attr:`PickleScan.unknown`, never in ``fatal``.
    """


@dataclass(kw_only=True)
class Findings:
    """What ``torch.load(weights_only=True)`` would refuse or cannot be told about, over one pickle or a
    whole file: :class:`PickleScan` and the verdict's ``FileScan`` are this, each with its own ending."""

    refused: Counter[str] = field(default_factory=Counter)
    """Refused global names -> how many objects were built from (or referred to) them."""
    hidden: Counter[str] = field(default_factory=Counter)
    """Types never named by a GLOBAL that BUILD needs allowlisted (numpy's dtype classes)."""
    usage: dict[str, set[str]] = field(default_factory=dict)
    """How each refused global was used: ``reduce1`` (one scalar argument), ``reduce``, ``newobj``, ``build``."""
    unknown: str | None = None
    """What the emulation does not model, met before any refusal: torch may load or refuse ("cannot tell")."""
    setitem_on_other: bool = False
    """SETITEM(S) wrote into something other than a dict: refused since torch 2.10, accepted before."""
    version_names: set[str] = field(default_factory=set)
    """Allowlisted names that only some torch versions have (sub-byte ints, new float formats)."""
    needs_import: Counter[str] = field(default_factory=Counter)
    """Names torch allowlists once a module of its own is imported (DTensor's, see ``tables.NEEDS_IMPORT``) ->
    how many objects were built from them: refused in a fresh process, scanned on as allowed."""

    def add_globals(self, other: Findings) -> None:
        """Add what ``other`` found about globals (refused, hidden, their usage, version-only names, SETITEM)."""
        self.refused.update(other.refused)
        self.hidden.update(other.hidden)
        for name, hows in other.usage.items():
            self.usage.setdefault(name, set()).update(hows)
        self.setitem_on_other |= other.setitem_on_other
        self.version_names |= other.version_names
        self.needs_import.update(other.needs_import)

    def import_modules(self) -> list[str]:
        """The modules to import before ``torch.load`` for the names in :attr:`needs_import`."""
        return sorted({tables.NEEDS_IMPORT[name] for name in self.needs_import})


@dataclass
class PickleScan(Findings):
    """What one pickle needs from ``torch.load(weights_only=True)``."""

    fatal: str | None = None
    """The first refusal no ``add_safe_globals`` line fixes (None if there is none)."""
    result: Any = None
    end: int = 0
    """Offset just past the pickle's STOP."""


# ---- shadow values ------------------------------------------------------------------------


class Shadow:
    """An inert value standing for what torch would build; never callable, never iterable."""

    __slots__ = ()


class WStorage(Shadow):
    """A ``TypedStorage`` as torch's ``persistent_load`` returns it."""

    __slots__ = ("dtype", "key", "location", "nbytes", "resizable")

    def __init__(self, dtype: str, nbytes: int, key: Any, location: str, resizable: bool = False) -> None:
        self.dtype, self.nbytes, self.key, self.location = dtype, nbytes, key, location
        self.resizable = resizable
        """Made by a call, not read from a record: ``set_`` grows it to what a tensor needs."""


class WTensor(Shadow):
    """A tensor (``type_name``: torch.Tensor, torch.nn.parameter.Parameter, or a subclass).

    ``plain``: a dense tensor over a storage (False for sparse, quantized, meta, nested...);
    ``requires_grad``: as rebuilt (setting ``data`` to an integer tensor then fails);
    ``shape`` and ``location``: None where not known (checks that need them are not emulated).
    """

    __slots__ = ("dtype", "location", "plain", "requires_grad", "shape", "type_name")

    def __init__(
        self,
        dtype: str,
        type_name: str = "torch.Tensor",
        plain: bool = True,
        requires_grad: bool = False,
        shape: tuple[int, ...] | None = None,
        location: str | None = None,
    ) -> None:
        self.dtype, self.type_name, self.plain, self.requires_grad = dtype, type_name, plain, requires_grad
        self.shape, self.location = shape, location

    def retyped(self, type_name: str) -> WTensor:
        """The same tensor as another class (``as_subclass``)."""
        return WTensor(self.dtype, type_name, self.plain, self.requires_grad, self.shape, self.location)


class WObject(Shadow):
    """An instance of a class; ``type_name`` None when the function that made it is unknown."""

    __slots__ = ("maker", "type_name")

    def __init__(self, type_name: str | None, maker: str = "") -> None:
        self.type_name, self.maker = type_name, maker


class WSize(tuple[Any, ...]):
    """A ``torch.Size``."""

    __slots__ = ()


class WLeaf(Shadow):
    """A value of an allowed type without a ``__dict__`` (device, layout, bytearray...)."""

    __slots__ = ("type_name",)

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name


class GlobalRef:
    """What GLOBAL pushes for an allowed name: torch's object, by name. Calling it is a REDUCE."""

    __slots__ = ("entry", "handler", "storage_dtype")

    def __init__(self, entry: tables.AllowedGlobal) -> None:
        self.entry = entry
        self.handler = _handler(entry)
        self.storage_dtype: str | None = None
        if entry.name == "torch.storage.UntypedStorage":
            self.storage_dtype = "uint8"
        elif entry.role == "storage_type":
            self.storage_dtype = entry.detail

    def __call__(self, *args: Any) -> Any:
        try:
            return self.handler(args)
        except Refusal:
            raise
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as exc:
            raise Refusal(f"{self.entry.name} fails on these arguments ({type(exc).__name__}: {exc})") from None


class Placeholder:
    """What GLOBAL pushes for a refused name: scanned on as if the user had allowlisted it.

    ``allowed``: a name ``import torch`` allowlists itself (nested tensors), not a refusal.
    """

    __slots__ = ("allowed", "machine", "name")

    def __init__(self, name: str, machine: Machine, allowed: bool = False) -> None:
        self.name, self.machine, self.allowed = name, machine, allowed

    def __call__(self, *args: Any) -> Any:
        return self.machine.call(self, args)


# ---- the tokenizer and rewriter -------------------------------------------------------------

_FIXED = (
    rb"[qhK][\x00-\xff]|[rj][\x00-\xff]{2}[\x00-\x0f]\x00|J[\x00-\xff]{4}|M[\x00-\xff]{2}|G[\x00-\xff]{8}"
    rb"|\x80[\x00-\x05]|[(t\x85\x86\x87N\x89\x88)\]}\x8fQ"
)
_SHORT_STRINGS = b"|".join(
    b"X" + re.escape(bytes([length, 0, 0, 0])) + (rb"[\x00-\xff]{%d}" % length if length else b"")
    for length in range(48)
)
"""BINUNICODE of up to 47 bytes (keys, record names) matched by the same expression: no Python step per string."""
FAST_RUN = re.compile(rb"(?:" + _FIXED + rb"R]|" + _SHORT_STRINGS + rb")*", re.S)
EXACT_RUN = re.compile(rb"(?:" + _FIXED + rb"]|" + _SHORT_STRINGS + rb")*", re.S)
_U32 = struct.Struct("<I")


@dataclass
class Rewritten:
    """The pickle as the C unpickler will run it, or the refusal the tokenizer found."""

    data: bytes
    end: int
    error: str | None = None


def rewrite(data: bytes, start: int, marker_module: str, exact: bool) -> Rewritten:
    """Tokenize from ``start`` to STOP; refuse unknown opcodes; route type-dependent ones to the machine."""
    run = (EXACT_RUN if exact else FAST_RUN).match
    get_marker = b"j" + _U32.pack(MEMO_LIMIT)
    out = [b"c" + marker_module.encode() + b"\nm\nr" + get_marker[1:] + b"0"]
    intercept = {op: code.replace(b"@", get_marker) for op, code in _INTERCEPT.items()}
    remap: dict[int, int] = {}
    copied = pos = start
    size = len(data)
    unpack = _U32.unpack_from
    while True:
        found = run(data, pos)
        pos = found.end() if found else pos
        if pos >= size:
            return Rewritten(b"", pos, "the pickle ends before its STOP opcode (truncated?)")
        op = data[pos]
        if op == 0x58:  # BINUNICODE
            if pos + 5 > size:
                return Rewritten(b"", pos, "the pickle ends inside a string (truncated?)")
            pos += 5 + unpack(data, pos + 1)[0]
        elif op in intercept:
            out.append(data[copied:pos])
            out.append(intercept[op])
            pos = copied = pos + 1
        elif op == 0x63:  # GLOBAL
            first = data.find(b"\n", pos + 1)
            second = data.find(b"\n", first + 1) if first >= 0 else -1
            if second < 0:
                return Rewritten(b"", pos, "the pickle ends inside a GLOBAL (truncated?)")
            pos = second + 1
        elif op in (0x55, 0x8A):  # SHORT_BINSTRING, LONG1
            pos += 2 + (data[pos + 1] if pos + 1 < size else 0)
        elif op in (0x72, 0x6A):  # LONG_BINPUT / LONG_BINGET with a large index
            if pos + 5 > size:
                return Rewritten(b"", pos, "the pickle ends inside a memo index (truncated?)")
            (index,) = unpack(data, pos + 1)
            if op == 0x72:
                new = remap.setdefault(index, MEMO_LIMIT + 1 + len(remap))
            else:
                new = remap.get(index, MEMO_LIMIT + 2 + len(remap))
            out.append(data[copied:pos])
            out.append(bytes([op]) + _U32.pack(new))
            pos = copied = pos + 5
        elif op == 0x80:  # PROTO above 5: torch only warns; CPython would refuse
            out.append(data[copied:pos])
            pos = copied = pos + 2
        elif op == 0x2E:  # STOP
            out.append(data[copied : pos + 1])
            return Rewritten(b"".join(out), pos + 1)
        else:
            return Rewritten(b"", pos, f"opcode {bytes([op])!r} (byte {op}) is not one torch's loader reads")


_INTERCEPT = {
    0x81: b"\x86@K\x81\x87Q",
    0x52: b"\x86@KR\x87Q",
    ord("b"): b"\x86@Kb\x87Q",
    ord("a"): b"\x86@Ka\x87Q",
    ord("s"): b"\x86\x86@Ks\x87Q",
    ord("u"): b"t\x86@Ku\x87Q",
    ord("e"): b"t\x86@Ke\x87Q",
}


# ---- the machine ------------------------------------------------------------------------------

StorageLoader = Callable[[tuple[Any, ...]], WStorage]
_KNOWN_CLASSES = tables.PLAIN_DATA_CLASSES | {"functools.partial"}
"""Globals a REDUCE of which builds an instance of them though their name is not capitalised."""
_LEAF_TYPES = frozenset({"torch.device", "builtins.bytearray"})
_SCALAR_TYPES = (int, float, str, bool, bytes, type(None))
_DEVICE_TYPES = frozenset(
    {"cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip", "ve", "fpga", "maia", "xla"}
    | {"lazy", "vulkan", "mps", "meta", "hpu", "mtia", "privateuseone"}
)
_NUMPY_KINDS = {
    "b1": "Bool",
    "i1": "Int8",
    "u1": "UInt8",
    "i2": "Int16",
    "u2": "UInt16",
    "i4": "Int32",
    "u4": "UInt32",
    "i8": "Int64",
    "u8": "UInt64",
    "f2": "Float16",
    "f4": "Float32",
    "f8": "Float64",
    "c8": "Complex64",
    "c16": "Complex128",
    "f16": "LongDouble",
    "c32": "CLongDouble",
    "O8": "Object",
    "O": "Object",
}


def numpy_dtype_class(code: Any) -> str:
    """The ``numpy.dtypes`` class of the dtype ``numpy.dtype(code)`` builds (numpy >= 1.25)."""
    text = str(code)
    if text in _NUMPY_KINDS:
        return f"numpy.dtypes.{_NUMPY_KINDS[text]}DType"
    kind = text[:1]
    named = {"U": "Str", "S": "Bytes", "V": "Void", "M": "DateTime64", "m": "TimeDelta64", "O": "Object"}
    return f"numpy.dtypes.{named.get(kind, 'Void')}DType"


class Machine(pickle.Unpickler):
    """Runs a rewritten pickle with torch's weights-only rules; see the module docstring."""

    def __init__(self, data: bytes, marker_module: str, storage: StorageLoader, scan: PickleScan) -> None:
        super().__init__(io.BytesIO(data), encoding="utf-8", errors="strict", fix_imports=False)
        self.marker = object()
        self.marker_module = marker_module
        self.load_storage = storage
        self.scan = scan
        self.refs: dict[str, Any] = {}

    # ---- globals and persistent ids ------------------------------------------------------

    def find_class(self, module: str, name: str) -> Any:
        if module == self.marker_module and name == "m":
            return self.marker
        if (module, name) in tables.NAME_MAPPING:
            module, name = tables.NAME_MAPPING[(module, name)]
        elif module in tables.IMPORT_MAPPING:
            module = tables.IMPORT_MAPPING[module]
        return self._global(f"{module}.{name}", module)

    def _global(self, full: str, module: str | None) -> Any:
        """What torch's unpickler has for the name ``full``: an allowed object, or a refused name's placeholder;
        ``module``: the GLOBAL's module (None for a name reached by ``getattr``, which no module rule checks)."""
        ref = self.refs.get(full)
        if ref is not None:
            return ref
        direct = _DIRECT.get(full)
        if direct is not None:
            return direct
        entry = tables.ALLOWED.get(full)
        if entry is not None:
            if full in tables.ADDED_IN:
                self.scan.version_names.add(full)
            ref = self.refs[full] = GlobalRef(entry)
            return ref
        if full in tables.ADDED_IN:
            self.scan.version_names.add(full)
        if full in tables.IMPORTED_ALLOWED:
            ref = self.refs[full] = Placeholder(full, self, allowed=True)
            return ref
        if full in tables.NEEDS_IMPORT:
            # refused in a fresh process, allowed once torch's own module is imported: the scan goes on as allowed
            self.scan.needs_import[full] += 0
            ref = self.refs[full] = Placeholder(full, self, allowed=True)
            return ref
        if module is not None and module in tables.BLOCKED_MODULES:
            self._fatal(f"GLOBAL {full} is from module {module}, which torch refuses even when allowlisted")
        self.scan.refused[full] += 0
        ref = self.refs[full] = Placeholder(full, self)
        return ref

    def _fatal(self, message: str) -> None:
        if self.scan.fatal is None:
            self.scan.fatal = message

    def _cannot_tell(self, message: str) -> None:
        """Go on scanning, but the answer can no longer be "loads" (see :func:`note_unknown`)."""
        note_unknown(self.scan, message)

    def persistent_load(self, pid: Any) -> Any:
        if type(pid) is tuple:
            if len(pid) == 3 and pid[1] is self.marker:
                operands, _, op = pid
                return self.OPS[op](self, *operands)
            if pid and (pid[0] == "storage" or _ascii(pid[0]) == "storage"):
                return self.load_storage(pid)
            if pid:
                raise Refusal(f"a persistent id {_short(pid[0])} (torch allows only 'storage')")
            raise Refusal("an empty persistent id")
        if type(pid) is int:
            raise Refusal("a persistent id that is an int, not a storage tuple")
        raise Refusal(f"a persistent id of type {type(pid).__name__} (torch allows only storages)")

    # ---- the type-dependent opcodes (reached through the rewrite) -------------------------

    def op_reduce(self, func: Any, args: Any) -> Any:
        if not _callable(func):
            raise Refusal(f"REDUCE calls a {type_name(func)}, which is not an allowed function")
        return self.call(func, tuple(_iterate(args, "REDUCE arguments")))

    def op_newobj(self, cls: Any, args: Any) -> Any:
        args = tuple(_iterate(args, "NEWOBJ arguments"))
        if cls in _DIRECT_NEW:
            return _DIRECT_NEW[cls](*args)
        if isinstance(cls, Placeholder):
            self._use(cls.name, "newobj")
            return WObject(cls.name, cls.name)
        if isinstance(cls, WObject) and cls.type_name is None and cls.maker:
            raise Refusal(f"NEWOBJ of what {cls.maker} returned (torch creates only allowlisted classes)")
        if not isinstance(cls, GlobalRef):
            raise Refusal(f"NEWOBJ of a {type_name(cls)} (torch creates only allowlisted classes)")
        entry = cls.entry
        if entry.name == "torch.nn.parameter.Parameter":
            return self.call(cls, args)
        if entry.role in ("function", "dtype", "qscheme", "storage_type"):
            raise Refusal(f"NEWOBJ of {entry.name}, which is not a class")
        if entry.name == "builtins.bytearray":
            return WLeaf("builtins.bytearray")
        return self.call(cls, args)

    def op_build(self, inst: Any, state: Any) -> Any:
        kind = type(inst)
        if kind is WTensor:
            self._build_tensor(inst, state)
            if inst.type_name == "torch.Tensor":
                _forget_shape(inst)  # set_() changed the tensor in place: the memo holds it too
        elif kind is OrderedDict:
            _try(lambda: {}.update(state), "BUILD state for an OrderedDict")
        elif kind is WObject:
            self._build_object(inst, state)
        elif kind in (Counter, set, complex, WSize, WStorage) or (kind is WLeaf and inst.type_name in _LEAF_TYPES):
            self._build_plain(state, has_dict=kind is Counter)
        else:
            raise Refusal(f"BUILD on a {type_name(inst)} (torch builds only Tensor, Parameter, OrderedDict)")
        return inst

    def _build_tensor(self, inst: WTensor, state: Any) -> None:
        if inst.type_name == "torch.Tensor":
            _tensor_set(inst, list(_iterate(state, "BUILD state for a Tensor")))
        elif inst.type_name == "torch.nn.parameter.Parameter":
            _parameter_setstate(inst, state)
        else:
            self._use(inst.type_name, "build")

    def _build_object(self, inst: WObject, state: Any) -> None:
        if inst.type_name is None:
            self._cannot_tell(f"BUILD on the result of {inst.maker}, whose type cannot be known without running it")
        elif inst.type_name.startswith("numpy.dtypes."):
            self.scan.hidden[inst.type_name] += 1
        else:
            self._use(inst.type_name, "build")

    @staticmethod
    def _build_plain(state: Any, has_dict: bool) -> None:
        slots = None
        if isinstance(state, tuple) and len(state) == 2:
            state, slots = state
        if state and not has_dict:
            raise Refusal("BUILD sets attributes on a value that has none")
        if state:
            _try(lambda: {}.update(state), "BUILD state")
        if slots and (not has_dict or not isinstance(slots, dict) or not all(isinstance(k, str) for k in slots)):
            raise Refusal("BUILD sets slots on a value that has none")
        for name, value in (slots or {}).items():
            _counter_setattr(name, value)

    def op_setitem(self, target: Any, pair: tuple[Any, Any]) -> Any:
        self._setitems(target, pair, "SETITEM")
        return target

    def op_setitems(self, target: Any, items: tuple[Any, ...]) -> Any:
        self._setitems(target, items, "SETITEMS")
        return target

    def _setitems(self, target: Any, items: tuple[Any, ...], opcode: str) -> None:
        if type(target) not in (dict, OrderedDict, Counter):
            self.scan.setitem_on_other = True
            raise Refusal(f"{opcode} into a {type_name(target)} (torch 2.10+ writes only into dicts)")
        if len(items) % 2:
            raise Refusal(f"{opcode} with an odd number of items")
        for index in range(0, len(items), 2):
            key, value = items[index], items[index + 1]
            try:
                target[key] = value
            except TypeError:
                raise Refusal(f"{opcode} with an unhashable key ({type_name(key)})") from None

    def op_append(self, target: Any, item: Any) -> Any:
        if type(target) is not list:
            raise Refusal(f"APPEND to a {type_name(target)} (torch appends only to lists)")
        target.append(item)
        return target

    def op_appends(self, target: Any, items: tuple[Any, ...]) -> Any:
        if type(target) is not list:
            raise Refusal(f"APPENDS to a {type_name(target)} (torch extends only lists)")
        target.extend(items)
        return target

    OPS: ClassVar[dict[int, Callable[..., Any]]] = {
        0x52: op_reduce,
        0x81: op_newobj,
        ord("b"): op_build,
        ord("s"): op_setitem,
        ord("u"): op_setitems,
        ord("a"): op_append,
        ord("e"): op_appends,
    }

    # ---- calls ---------------------------------------------------------------------------------

    def _use(self, name: str, how: str) -> None:
        if name in tables.IMPORTED_ALLOWED:
            return
        if name in tables.NEEDS_IMPORT:
            self.scan.needs_import[name] += how != "build"
            return
        if how != "build":
            self.scan.refused[name] += 1
        self.scan.usage.setdefault(name, set()).add(how)

    def call(self, func: Any, args: tuple[Any, ...]) -> Any:
        """REDUCE (and NEWOBJ of some classes): what torch's object would return for ``args``."""
        if isinstance(func, Placeholder):
            return self._call_refused(func.name, args)
        try:
            return func(*args)
        except Refusal:
            raise
        except (TypeError, ValueError, OverflowError) as exc:
            raise Refusal(f"{type_name(func)} fails on these arguments ({exc})") from None

    def _call_refused(self, name: str, args: tuple[Any, ...]) -> Any:
        one_scalar = len(args) == 1 and isinstance(args[0], _SCALAR_TYPES)
        self._use(name, "reduce1" if one_scalar else "reduce")
        reached = _attribute_name(name, args)
        if reached is not None:
            # torch's allowlist holds objects by module and qualified name, so the attribute getattr reaches (a
            # nested class) is allowed or refused under its own dotted name, and add_safe_globals must name it
            return self._global(reached, None)
        short = name.rsplit(".", 1)[-1]
        if short == "_reconstruct" and name.startswith("numpy."):
            cls = args[0] if args else None
            return WObject(cls.name if isinstance(cls, Placeholder) else None, name)
        if name == "numpy.dtype":
            return WObject(numpy_dtype_class(args[0] if args else ""), name)
        if short == "scalar" and name.startswith("numpy."):
            return WObject("numpy.generic", name)
        if name == "copyreg._reconstructor":
            cls = args[0] if args else None
            return WObject(cls.name if isinstance(cls, Placeholder) else None, name)
        return WObject(name if builds_instance(name) else None, name)


def _attribute_name(name: str, args: tuple[Any, ...]) -> str | None:
    """The dotted name ``getattr(<a global>, "<attribute>")`` reaches; None for any other call."""
    if name != "builtins.getattr" or len(args) != 2 or not isinstance(args[1], str):
        return None
    owner = args[0]
    if isinstance(owner, (GlobalRef, Placeholder)) and args[1].isidentifier():
        return f"{type_name(owner)}.{args[1]}"
    return None


def _counter_setattr(name: str, value: Any) -> None:
    """``setattr(counter, name, value)`` (BUILD's slot state): the attributes whose setters check their value."""
    # a Counter's instance attributes go to its __dict__, except these three data descriptors
    if name == "__weakref__":
        raise Refusal("BUILD slot state sets __weakref__ on a Counter (not writable)")
    if name == "__dict__" and type(value) not in (dict, OrderedDict, Counter):
        raise Refusal(f"BUILD slot state sets a Counter's __dict__ to a {type_name(value)} (torch wants a dict)")
    # only a heap type of the same layout may replace __class__; of the allowed classes only Counter itself
    is_counter = value is Counter
    if name == "__class__" and isinstance(value, Placeholder):
        raise CannotTell(f"BUILD slot state sets a Counter's __class__ to {value.name}: torch may refuse it")
    if name == "__class__" and not is_counter:
        raise Refusal(f"BUILD slot state sets a Counter's __class__ to {_class_name(value)} (torch refuses it)")


def _class_name(value: Any) -> str:
    if type(value) is type:
        return f"{value.__module__}.{value.__qualname__}"
    return f"a {type_name(value)}"


def builds_instance(name: str) -> bool:
    """Whether a REDUCE of the refused global ``name`` is taken to build an instance of it (a class: a
    capitalised name, or one of :data:`_KNOWN_CLASSES`); else what it makes is of an unknown type."""
    return name in _KNOWN_CLASSES or name.rsplit(".", 1)[-1][:1].isupper()


def _iterate(value: Any, what: str) -> Iterable[Any]:
    if isinstance(value, (tuple, list, WSize, str, dict, set)):
        return value
    raise Refusal(f"{what} are a {type_name(value)}, not a sequence")


def _try(action: Callable[[], Any], what: str) -> None:
    try:
        action()
    except (TypeError, ValueError) as exc:
        raise Refusal(f"{what} is malformed ({exc})") from None


def _ascii(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("ascii", "replace")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def type_name(value: Any) -> str:
    """What a value is, in the file's words (a stand-in's torch type, an allowed global's name)."""
    if isinstance(value, (WTensor, WObject, WLeaf)):
        return str(value.type_name)
    if isinstance(value, WStorage):
        return "storage"
    if isinstance(value, GlobalRef):
        return value.entry.name
    if isinstance(value, WSize):
        return "torch.Size"
    if isinstance(value, Placeholder):
        return value.name
    return type(value).__name__


# ---- torch's allowed functions, on shadow values --------------------------------------------

_INT_ONLY = frozenset({int})


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list, WSize)) or not set(map(type, value)) <= _INT_ONLY:
        raise Refusal(f"{what} is not a sequence of ints")
    return tuple(value)


def _bool(value: Any, what: str) -> bool:
    if type(value) is not bool:
        raise Refusal(f"{what} must be a bool")
    return value


def _dtype(value: Any) -> str:
    if not isinstance(value, GlobalRef) or value.entry.role != "dtype":
        raise Refusal(f"a dtype argument is a {type_name(value)}")
    return value.entry.detail


def _grad(requires_grad: Any, dtype: str) -> None:
    if _bool(requires_grad, "requires_grad") and dtype not in tables.FLOATING_DTYPES:
        raise Refusal(f"requires_grad=True on a {dtype} tensor (only floating point and complex can)")


_SEQUENCES = (tuple, list, WSize)


_PLAIN_TENSORS: dict[tuple[str, bool, tuple[int, ...], str], WTensor] = {}
"""Shared shadows of plain tensors (per dtype, requires_grad, shape, location): never changed (state goes to
a copy)."""
_EXTENTS: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
"""Valid (size, stride) pairs seen before -> elements from the offset to the last one (-1: empty)."""
_EXTENTS_KEPT = 4096


def _set_storage(storage: Any, offset: Any, size: Any, stride: Any, dtype: str) -> None:
    """``tensor.set_(storage, offset, size, stride)`` on a storage read from the file (not resizable)."""
    if type(storage) is not WStorage:
        raise Refusal(f"a tensor's storage is a {type_name(storage)}")
    # set_(storage, offset, size, None) and set_(..., size, ()): torch takes no strides as row-major
    no_stride = stride is None or (type(stride) in _SEQUENCES and not stride)
    if no_stride and type(size) in _SEQUENCES and set(map(type, size)) <= _INT_ONLY:
        stride = contiguous_strides(size)
    _check_geometry_types(offset, size, stride)
    _check_geometry_values(offset, size, stride)
    # the bytes it reaches: within the storage
    extent = -1 if 0 in size else 1 + sum((count - 1) * step for count, step in zip(size, stride, strict=True))
    if type(size) is tuple and type(stride) is tuple and len(_EXTENTS) < _EXTENTS_KEPT:
        _EXTENTS[(size, stride)] = extent
    if extent < 0 or dtype not in DTYPES:
        return
    needed = (offset + extent) * DTYPES[dtype][0]
    if needed > storage.nbytes and not storage.resizable:
        raise Refusal(f"a tensor needs {needed} bytes of a {storage.nbytes}-byte storage (not resizable)")
    # set_ grows a resizable storage (a legacy one, a meta one) to what the tensor needs
    storage.nbytes = max(storage.nbytes, needed)


def _check_geometry_types(offset: Any, size: Any, stride: Any) -> None:
    """An int offset, and a size and a stride that are sequences of ints of one length (else a Refusal; a tensor
    among them: CannotTell)."""
    # set_ takes any value with __index__: a one-element integer tensor gives its value, which is not read here
    parts = [offset, size, stride]
    parts += [*(size if type(size) in _SEQUENCES else ()), *(stride if type(stride) in _SEQUENCES else ())]
    if any(type(part) is WTensor for part in parts):
        raise CannotTell("a tensor's storage offset, size or stride holds a tensor: torch may take its values")
    if type(offset) is not int:
        raise Refusal("a tensor's storage offset is not an int")
    if type(size) not in _SEQUENCES or not set(map(type, size)) <= _INT_ONLY:
        raise Refusal("a tensor's size is not a sequence of ints")
    if type(stride) not in _SEQUENCES or not set(map(type, stride)) <= _INT_ONLY:
        raise Refusal("a tensor's stride is not a sequence of ints")
    if len(size) != len(stride):
        raise Refusal(f"a tensor's size and stride differ in length ({len(size)} vs {len(stride)})")


def _check_geometry_values(offset: int, size: Sequence[int], stride: Sequence[int]) -> None:
    """Offset, sizes and strides that torch accepts: not negative, within int64, a count that does not overflow."""
    if offset < 0 or (size and min(size) < 0):
        raise Refusal("a tensor has a negative offset or size")
    if (
        offset >= _INT64
        or (size and max(size) >= _INT64)
        or (stride and not -_INT64 <= min(stride) <= max(stride) < _INT64)
    ):
        raise Refusal("a tensor's offset, size or stride does not fit int64")
    # set_ takes its strides as SymInts, which hold no int below -2**62 (even where a size 0 makes it unused)
    if stride and min(stride) < _SYMINT_MIN:
        raise Refusal(f"a tensor's stride {min(stride)} cannot be a SymInt (torch refuses it)")
    # torch's safe_compute_numel (refresh_numel after set_): the unsigned 64-bit product overflows (even before
    # a 0), or the count passes int64 (zero strides let such a tensor fit a one-element storage)
    if _count_overflows(size) or math.prod(size) >= _INT64:
        raise Refusal("a tensor's element count does not fit int64 (torch: integer multiplication overflow)")
    # torch's storage size sum stops at a size 0 before it looks at any stride; a negative stride of a size
    # above 1 overflows it (unsigned), one of size 1 adds nothing
    if 0 not in size and any(n > 1 and s < 0 for n, s in zip(size, stride, strict=True)):
        raise Refusal("a tensor has a negative stride")


_INT64 = 1 << 63
_U64 = 1 << 64
_SYMINT_MIN = -(1 << 62)
"""The least int a ``SymInt`` holds: torch refuses a size or stride below it ("cannot be represented as a SymInt")."""


def _count_overflows(size: Sequence[int], limit: int = _U64) -> bool:
    """Whether torch's element count overflows: it multiplies the sizes in 64 bits, left to right, and
    refuses a product that passes 2**64 even where a later 0 would make it 0 (``limit``: another bound)."""
    count = 1
    for step in size:
        count *= step
        if count >= limit:
            return True
        if not count:
            return False
    return False


def _rebuild_tensor(args: tuple[Any, ...]) -> WTensor:
    storage, offset, size, stride = args
    dtype = storage.dtype if isinstance(storage, WStorage) else ""
    _set_storage(storage, offset, size, stride, dtype)
    return WTensor(dtype, shape=tuple(size), location=storage.location)


def _rebuild_tensor_v2(args: tuple[Any, ...]) -> WTensor:
    if len(args) == 6:
        storage, offset, size, stride, requires_grad, _hooks = args
        metadata = None
    elif len(args) == 7:
        storage, offset, size, stride, requires_grad, _hooks, metadata = args
    else:
        raise TypeError(f"takes 6 or 7 arguments, got {len(args)}")
    if type(storage) is not WStorage:
        raise Refusal(f"a tensor's storage is a {type_name(storage)}")
    dtype = storage.dtype
    if requires_grad is not False:
        _grad(requires_grad, dtype)
    if metadata is not None:
        _check_metadata(metadata, dtype)
    # known layouts by value: only of ints (a float or bool stride equals an int one, and torch refuses it)
    plain = type(size) is tuple and type(stride) is tuple and set(map(type, size + stride)) <= _INT_ONLY
    extent = _EXTENTS.get((size, stride)) if plain else None
    if (
        extent is None
        or type(offset) is not int
        or offset < 0
        or (extent >= 0 and (offset + extent) * DTYPES[dtype][0] > storage.nbytes)
    ):
        _set_storage(storage, offset, size, stride, dtype)  # checks, and raises with the reason
    shape = size if type(size) is tuple else tuple(size)
    key = (dtype, requires_grad is True, shape, storage.location)
    tensor = _PLAIN_TENSORS.get(key)
    if tensor is None:
        if len(_PLAIN_TENSORS) >= _EXTENTS_KEPT:
            _PLAIN_TENSORS.clear()
        grad = requires_grad is True
        tensor = _PLAIN_TENSORS[key] = WTensor(dtype, "torch.Tensor", True, grad, shape, storage.location)
    return tensor


def _forget_shape(tensor: WTensor) -> None:
    """A tensor whose ``set_`` ran: its shape is no longer known here (later checks of it say "cannot tell").

    torch changes the tensor itself, so every later reference (a memo GET) sees the new one: the shadow
    is changed in place too, and first taken out of the shared shadows so that no other file sees it.
    """
    if tensor.shape is not None and tensor.location is not None:
        key = (tensor.dtype, tensor.requires_grad, tensor.shape, tensor.location)
        if _PLAIN_TENSORS.get(key) is tensor:
            del _PLAIN_TENSORS[key]
    tensor.shape = None


def _rebuild_tensor_v3(args: tuple[Any, ...]) -> WTensor:
    if not 7 <= len(args) <= 8:
        raise TypeError(f"takes 7 or 8 arguments, got {len(args)}")
    storage, offset, size, stride, requires_grad, _hooks, dtype_ref = args[:7]
    if dtype_ref is None:
        # torch.empty(dtype=None) takes the default dtype, which code run before the load may have changed
        raise CannotTell("_rebuild_tensor_v3 with dtype None: torch uses the default dtype (float32 unless changed)")
    dtype = _dtype(dtype_ref)
    if not isinstance(storage, WStorage):
        raise Refusal(f"a tensor's storage is a {type_name(storage)}")
    # torch.empty((0,), requires_grad=...) takes None as False; then set_() runs in place on the new tensor,
    # which torch refuses on a leaf that requires grad
    if requires_grad is not None:
        _grad(requires_grad, dtype)
    if requires_grad is True:
        raise Refusal("_rebuild_tensor_v3 with requires_grad=True: set_() in place on a leaf that requires grad")
    _set_storage(storage, offset, size, stride, dtype)
    if len(args) == 8:
        _check_metadata(args[7], dtype)
    return WTensor(dtype, shape=tuple(size), location=storage.location)


_COMPLEX = frozenset({"complex32", "complex64", "complex128"})


def _check_metadata(metadata: Any, dtype: str) -> None:
    """``set_tensor_metadata``: a dict of str to bool-like values; ``conj`` only on complex tensors."""
    if not _truthy(metadata, "tensor metadata"):
        return
    if not isinstance(metadata, dict):
        raise Refusal(f"tensor metadata is of type {type_name(metadata)}, not a dict")
    for key, value in metadata.items():
        if type(key) is not str:
            raise Refusal(f"tensor metadata has a key of type {type_name(key)} (torch wants str)")
        if isinstance(value, Shadow):
            raise CannotTell(f"tensor metadata holds a {type_name(value)}: torch may refuse it (not emulated here)")
        if value is not None and not isinstance(value, (bool, int, float, complex)):
            raise Refusal(f"tensor metadata holds a value of type {type_name(value)} (torch wants a bool)")
    if "conj" in metadata and dtype not in _COMPLEX:
        raise Refusal(f"tensor metadata sets conj on a {dtype} tensor (only complex tensors have it)")


def _rebuild_parameter(args: tuple[Any, ...]) -> WTensor:
    if len(args) != 3:
        raise TypeError(f"takes 3 arguments, got {len(args)}")
    return _parameter(args[:2])


def _rebuild_parameter_with_state(args: tuple[Any, ...]) -> WTensor:
    if len(args) != 4:
        raise TypeError(f"takes 4 arguments, got {len(args)}")
    parameter = _parameter(args[:2])
    set_obj_state(parameter, args[3])
    return parameter


def _parameter(args: tuple[Any, ...]) -> WTensor:
    if len(args) > 2:
        raise TypeError("Parameter takes at most 2 arguments")
    data = args[0] if args else None
    if data is not None and not isinstance(data, WTensor):
        raise Refusal(f"a Parameter's data is a {type_name(data)}")
    dtype = data.dtype if isinstance(data, WTensor) else "float32"
    requires_grad = args[1] if len(args) > 1 else True
    _grad(requires_grad, dtype)
    if isinstance(data, WTensor):
        return WTensor(dtype, "torch.nn.parameter.Parameter", data.plain, requires_grad, data.shape, data.location)
    return WTensor(dtype, "torch.nn.parameter.Parameter", True, requires_grad, (0,), None)


def _rebuild_from_type_v2(args: tuple[Any, ...]) -> Any:
    func, new_type, call_args, state = args
    if not _callable(func):
        raise Refusal(f"_rebuild_from_type_v2 calls a {type_name(func)}")
    result = func(*_iterate(call_args, "_rebuild_from_type_v2 arguments"))
    if isinstance(new_type, Placeholder) and isinstance(result, WTensor):
        if new_type.name in tables.WRAPPER_SUBCLASSES and result.type_name == new_type.name:
            # a DTensor has no __setstate__ of its own: torch sets its state as on a Tensor
            set_obj_state(result, state)
        return result.retyped(new_type.name)
    if isinstance(new_type, GlobalRef) and new_type.entry.name in ("torch.Tensor", "torch.nn.parameter.Parameter"):
        if not isinstance(result, WTensor):
            if isinstance(result, (WObject, Placeholder)):
                raise CannotTell(
                    f"_rebuild_from_type_v2 makes a value of type {type_name(result)} a Tensor: torch may refuse it "
                    "(whether it is a tensor is not known without running it)"
                )
            raise Refusal(
                f"_rebuild_from_type_v2 makes a value of type {type_name(result)} a Tensor (as_subclass fails)"
            )
        result = result.retyped(new_type.entry.name)
        set_obj_state(result, state)
        return result
    raise Refusal(f"_rebuild_from_type_v2 to a {type_name(new_type)}, not a Tensor subclass")


# ---- torch._utils._set_obj_state on a rebuilt tensor ---------------------------------------------


def set_obj_state(tensor: WTensor, state: Any) -> None:
    """``_set_obj_state(tensor, state)``: ``setattr`` for each item of the dict state and the slot state."""
    if type(state) is tuple:
        if len(state) != 2:
            raise Refusal(f"a tensor's state is a tuple of {len(state)}, not (dict state, slot state)")
        parts: tuple[Any, ...] = state
    else:
        parts = (state,)
    for part in parts:
        if not _truthy(part, "a tensor's state"):
            continue
        if type(part) not in (dict, OrderedDict, Counter):
            if isinstance(part, (WObject, Placeholder)):
                raise CannotTell(f"a tensor's state is a {type_name(part)}: torch may refuse it (not run here)")
            raise Refusal(f"a tensor's state is of type {type_name(part)}, which has no items()")
        for name, value in part.items():
            _setattr(tensor, name, value)


def _tensor_set(tensor: WTensor, args: list[Any]) -> None:
    """BUILD on a plain Tensor: ``tensor.set_(*state)`` (legacy pickles), on a tensor whose storage cannot grow."""
    if tensor.requires_grad:
        raise Refusal("BUILD calls set_() on a tensor that requires grad (in place on a leaf: torch refuses)")
    if not args:
        return
    source = args[0]
    if isinstance(source, WTensor):
        if len(args) != 1:
            raise Refusal("BUILD calls set_(tensor, ...) with more arguments (set_ takes the tensor alone)")
        if source.dtype != tensor.dtype:
            raise Refusal(f"BUILD calls set_() with a {source.dtype} tensor on a {tensor.dtype} tensor")
        _same_device(tensor, _known_device(source), "a tensor")
        return
    if not isinstance(source, WStorage):
        raise Refusal(f"BUILD calls set_() with a {type_name(source)}, not a storage or tensor")
    _same_device(tensor, source.location, "a storage")
    if source.dtype != tensor.dtype:
        if source.dtype == "uint8":  # an UntypedStorage is accepted, a ByteStorage is not: not told apart here
            raise CannotTell("BUILD calls set_() with a byte storage: torch may refuse it (typed or untyped)")
        raise Refusal(f"BUILD calls set_() with a {source.dtype} storage on a {tensor.dtype} tensor")
    if len(args) in (3, 4):  # set_(storage, offset, size, stride=()): no stride is row-major
        _set_storage(source, args[1], args[2], args[3] if len(args) == 4 else (), tensor.dtype)
    elif len(args) != 1:
        raise Refusal(f"BUILD calls set_() with {len(args)} arguments (it takes 1 or 4)")


def _known_device(tensor: WTensor) -> str | None:
    """Where a tensor is, where the emulation knows it: a dense tensor on its storage, or a meta tensor."""
    return tensor.location if tensor.plain or tensor.location == "meta" else None


def _same_device(tensor: WTensor, location: str | None, what: str) -> None:
    """``set_`` refuses a storage or tensor on another device than the tensor's own."""
    mine = _known_device(tensor)
    if mine is None or location is None:
        raise CannotTell(f"BUILD calls set_() with {what} where the devices are not known here: torch may refuse it")
    if mine != location:
        raise Refusal(f"BUILD calls set_() with {what} on {location} on a tensor on {mine} (the devices must match)")
    if mine == "meta" and what == "a storage":
        # a map_location moves the storage (meta to cpu) but not the storage-less meta tensor: set_ then refuses
        raise CannotTell(
            "BUILD calls set_() with a meta storage on a meta tensor: torch.load loads it, but with a "
            "map_location (e.g. 'cpu') it refuses it"
        )


def _parameter_setstate(tensor: WTensor, state: Any) -> None:
    """BUILD on a Parameter: ``Tensor.__setstate__`` (legacy ``set_`` arguments, or requires_grad and hooks)."""
    if type(state) not in (tuple, list):
        raise CannotTell(f"BUILD on a Parameter with a state of type {type_name(state)}: torch may refuse it")
    if len(state) == 4:
        raise CannotTell("BUILD on a Parameter with set_() arguments: torch may refuse them (not emulated here)")
    if len(state) == 5:
        _setattr(tensor, "data", state[0])
        state = (state[3], state[4], state[2])
    if len(state) != 3:
        raise Refusal(f"BUILD on a Parameter with a state of {len(state)} items (torch unpacks 3)")
    _setattr(tensor, "requires_grad", state[0])


def _truthy(value: Any, what: str) -> bool:
    """``bool(value)`` as torch would get it, for the values whose truth is known without running anything."""
    if value is None or isinstance(value, (int, float, complex, str, bytes, tuple, list, dict, set, frozenset)):
        return bool(value)
    if isinstance(value, (GlobalRef, WSize)) or (type(value) is WLeaf and value.type_name == "torch.device"):
        return True
    raise Refusal(f"{what} is a {type_name(value)}: whether torch finds it empty is not known here")


def _setattr(tensor: WTensor, name: Any, value: Any) -> None:
    """``setattr(tensor, name, value)``: torch's tensor properties check what they are given."""
    if type(name) is not str:
        raise Refusal(
            f"a tensor's state sets an attribute named by a value of type {type_name(name)} (setattr wants a str)"
        )
    rule = tables.TENSOR_ATTRIBUTES.get(name, "instance")
    if rule == "instance":
        return
    if rule == "read-only":
        raise Refusal(f"a tensor's state sets {name!r}, a read-only attribute of torch.Tensor")
    if rule == "complex-only" and tensor.dtype not in _COMPLEX:
        raise Refusal(f"a tensor's state sets {name!r} on a {tensor.dtype} tensor (only complex tensors have one)")
    if rule == "dict":
        if type(value) not in (dict, OrderedDict, Counter):
            raise Refusal(f"a tensor's state sets __dict__ to a value of type {type_name(value)} (torch wants a dict)")
    elif rule == "requires_grad":
        _grad(value, tensor.dtype)
        tensor.requires_grad = value
    elif rule == "data":
        _set_data(tensor, value)
    elif rule == "grad":
        _set_grad(tensor, name, value)
    elif rule == "none":
        if value is not None:
            raise Refusal(
                f"a tensor's state sets {name!r} to a value of type {type_name(value)} (torch takes only None)"
            )
    elif value is not None or rule != "none-or-more":  # (complex-only on a complex tensor: may)
        raise CannotTell(f"a tensor's state sets {name!r}: torch's setter may reject this value (not emulated here)")


def _set_data(tensor: WTensor, value: Any) -> None:
    if not isinstance(value, WTensor):
        raise Refusal(f"a tensor's state sets data to a value of type {type_name(value)} (torch wants a tensor)")
    if not (tensor.plain and value.plain):
        raise CannotTell("a tensor's state sets data across tensor kinds: torch's set_data may reject it")
    if tensor.requires_grad and value.dtype not in tables.FLOATING_DTYPES:
        raise Refusal(f"a tensor's state sets data to a {value.dtype} tensor on one that requires grad")
    if value.location != tensor.location or value.location is None:
        raise CannotTell("a tensor's state sets data to a tensor whose device is not known here: torch may reject it")
    tensor.dtype, tensor.shape = value.dtype, value.shape


def _set_grad(tensor: WTensor, name: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, WTensor):
        raise Refusal(
            f"a tensor's state sets {name} to a value of type {type_name(value)} (torch wants a tensor or None)"
        )
    if value.dtype != tensor.dtype:
        raise Refusal(f"a tensor's state sets a {value.dtype} {name} on a {tensor.dtype} tensor")
    known = value.plain and tensor.plain and None not in (value.shape, tensor.shape, value.location, tensor.location)
    if not known:
        raise CannotTell(f"a tensor's state sets {name}: torch checks its shape and device, not emulated for these")
    if value.shape != tensor.shape:
        raise Refusal(
            f"a tensor's state sets a {name} of shape {list(value.shape or ())} on one of {list(tensor.shape or ())}"
        )
    if value.location != tensor.location:
        raise Refusal(f"a tensor's state sets a {name} on {value.location} for a tensor on {tensor.location}")


def _rebuild_qtensor(args: tuple[Any, ...]) -> WTensor:
    storage, offset, size, stride, params, requires_grad, _hooks = args
    params = tuple(_iterate(params, "quantizer parameters"))
    scheme = params[0] if params else None
    name = scheme.entry.name if isinstance(scheme, GlobalRef) else ""
    if name == "torch.per_tensor_affine":
        if len(params) != 3:
            raise Refusal("per-tensor quantizer parameters are not (scheme, scale, zero_point)")
    elif name in ("torch.per_channel_affine", "torch.per_channel_affine_float_qparams"):
        if len(params) != 4 or type(params[3]) is not int:
            raise Refusal("per-channel quantizer parameters are not (scheme, scales, zero_points, axis)")
    else:
        raise Refusal(f"a quantized tensor with quantizer scheme {_short(scheme)}")
    dtype = storage.dtype if isinstance(storage, WStorage) else ""
    if not dtype.startswith(("qint", "quint")):
        raise Refusal(f"a quantized tensor on a {dtype or type_name(storage)} storage")
    _set_storage(storage, offset, size, stride, dtype)
    if name == "torch.per_tensor_affine":
        _per_tensor_params(params[1], params[2])
    else:
        _per_channel_params(params[1], params[2], params[3], tuple(size))
    # torch sets requires_grad after building: a quantized dtype cannot require grad
    _grad(requires_grad, dtype)
    return WTensor(dtype, plain=False, requires_grad=requires_grad)


_QUANT_INDEX_LIMIT = 1 << 63


def _per_tensor_params(scale: Any, zero_point: Any) -> None:
    """``torch._empty_affine_quantized(size, scale=scale, zero_point=zero_point)``: a scale its argument parser
    reads as a float (a number, a bool, a 0-d tensor), a zero point it reads as an int (an int, a 0-d tensor)."""
    if isinstance(scale, WTensor) or isinstance(zero_point, WTensor):
        _zero_dim_param(scale, "scale", QUANT_SCALE_DTYPES)
        _zero_dim_param(zero_point, "zero point", QUANT_ZERO_POINT_DTYPES)
        scale = 0.0 if isinstance(scale, WTensor) else scale
        zero_point = 0 if isinstance(zero_point, WTensor) else zero_point
    if type(scale) not in (float, int, bool):
        raise Refusal(f"a per-tensor quantizer's scale is a {type_name(scale)}, not a float")
    if type(zero_point) is not int:
        raise Refusal(f"a per-tensor quantizer's zero point is a {type_name(zero_point)}, not an int")
    if not -_QUANT_INDEX_LIMIT <= zero_point < _QUANT_INDEX_LIMIT or (
        type(scale) is int and not -_QUANT_INDEX_LIMIT <= scale < _QUANT_INDEX_LIMIT
    ):
        raise Refusal("a per-tensor quantizer's scale or zero point does not fit 64 bits")


def _zero_dim_param(part: Any, what: str, dtypes: frozenset[str]) -> None:
    """A per-tensor quantizer's scale or zero point given as a tensor: torch's argument parser takes a plain 0-d
    tensor on the CPU as its ``item()`` (a scale of a float, integer or bool dtype, a zero point of an integer one),
    and refuses one of more dimensions, of another dtype, or needing grad."""
    if not isinstance(part, WTensor):
        return
    if part.shape is None or part.type_name != "torch.Tensor" or not part.plain or part.location not in ("cpu", None):
        raise CannotTell(f"a per-tensor quantizer's {what} is a tensor of a kind not emulated here")
    if part.shape != ():
        raise Refusal(f"a per-tensor quantizer's {what} is a tensor of {len(part.shape)} dimensions, not 0")
    if part.requires_grad is not False:
        raise Refusal(f"a per-tensor quantizer's {what} is a tensor that requires grad")
    if part.dtype in dtypes:
        return
    if what == "zero point" and (part.dtype in _REAL_FLOATS or part.dtype == "bool"):
        raise Refusal(f"a per-tensor quantizer's zero point is a {part.dtype} tensor, not an integer one")
    # (a complex scale with no imaginary part is taken: the values are not read here)
    raise CannotTell(f"a per-tensor quantizer's {what} is a {part.dtype} tensor: not emulated here")


def _per_channel_params(scales: Any, zero_points: Any, axis: int, size: tuple[Any, ...]) -> None:
    """``_rebuild_qtensor``'s checks of a per-channel quantizer, then ``torch._empty_per_channel_affine_quantized``'s:
    the axis within the size, as many scales and zero points as that dimension holds, lists made tensors (both
    lists) or tensors of one dimension, the scales floating point."""
    if not 0 <= axis < len(size):
        raise Refusal(f"a per-channel quantizer's axis {axis} is out of range for size {list(size)}")
    expected = size[axis]
    for what, part in (("scales", scales), ("zero points", zero_points)):
        if type(part) is list:
            count = len(part)
        elif isinstance(part, WTensor):
            if part.shape is None:
                raise CannotTell(f"a per-channel quantizer's {what} are a tensor of a shape not known here")
            count = math.prod(part.shape)
        else:
            raise Refusal(f"a per-channel quantizer's {what} are a {type_name(part)}, not a list or a tensor")
        if count != expected:
            raise Refusal(f"a per-channel quantizer has {count} {what} for {expected} channels")
    if type(scales) is list and type(zero_points) is list:
        # torch.tensor(...) of each: numbers convert; anything else is not emulated
        if not all(type(item) in (int, float, bool) for item in [*scales, *zero_points]):
            raise CannotTell("a per-channel quantizer's scales or zero points hold other than numbers")
        return
    if not (isinstance(scales, WTensor) and isinstance(zero_points, WTensor)):
        raise Refusal("a per-channel quantizer's scales and zero points are a list and a tensor")
    if len(scales.shape or ()) != 1 or len(zero_points.shape or ()) != 1:
        raise Refusal("a per-channel quantizer's scales or zero points are not a tensor of one dimension")
    if scales.dtype not in _REAL_FLOATS:
        raise Refusal(f"a per-channel quantizer's scales are {scales.dtype}, not floating point")
    if zero_points.dtype in _COMPLEX or not scales.plain or not zero_points.plain:
        raise CannotTell("a per-channel quantizer's zero points are of a kind not emulated here")
    if scales.location not in ("cpu", None) or zero_points.location not in ("cpu", None):
        raise CannotTell("a per-channel quantizer's scales or zero points are on a device: not emulated here")


_REAL_FLOATS = frozenset({"float64", "float32", "float16", "bfloat16"})
"""The dtypes a per-channel quantizer's scales may have (torch: "scale tensor must be floating point")."""


def _rebuild_sparse_tensor(args: tuple[Any, ...]) -> WTensor:
    layout, data = args
    name = layout.type_name if isinstance(layout, WLeaf) else ""
    parts = tuple(_iterate(data, "sparse tensor data"))
    if name == "torch.sparse_coo" and len(parts) in (3, 4):
        _check_coo(*parts)
    elif name in _COMPRESSED and len(parts) == 4:
        _check_compressed(*parts)
    else:
        raise Refusal(f"a sparse tensor with layout {name or type_name(layout)} and {len(parts)} parts")
    values = parts[1] if name == "torch.sparse_coo" else parts[2]
    assert isinstance(values, WTensor)
    return WTensor(values.dtype, plain=False)


_COMPRESSED = frozenset({"torch.sparse_csr", "torch.sparse_csc", "torch.sparse_bsr", "torch.sparse_bsc"})

_NO_TENSOR_DATA = (type(None), str, bytes, dict, set, frozenset)
"""Parts torch's tensor constructor cannot make a tensor of ("Could not infer dtype", "invalid data type")."""


def _sparse_part(value: Any, what: str) -> WTensor:
    """A part of a sparse tensor: torch's constructor makes a tensor of any data (``torch.tensor(value)``);
    a tensor is taken as it is, what it cannot convert is refused, other data (numbers, lists) not emulated."""
    if isinstance(value, WTensor):
        return value
    if isinstance(value, _NO_TENSOR_DATA):
        raise Refusal(f"a sparse tensor's {what} are a {type_name(value)}, not a tensor")
    raise CannotTell(f"a sparse tensor's {what} are a {type_name(value)}: torch makes a tensor of it (not emulated)")


def _check_coo(indices: Any, values: Any, size: Any, is_coalesced: Any = None) -> None:
    """``torch.sparse_coo_tensor(indices, values, size, check_invariants=False)``: the shape checks it still makes."""
    indices, values = _sparse_part(indices, "indices"), _sparse_part(values, "values")
    if is_coalesced is not None and type(is_coalesced) is not bool:
        raise Refusal("a sparse tensor's is_coalesced is not a bool")
    dims = _ints(size, "a sparse tensor's size")
    if dims and min(dims) < 0:
        raise Refusal("a sparse tensor has a negative size")
    if dims and max(dims) >= _INT64:
        raise Refusal("a sparse tensor's size does not fit int64")
    # torch's safe_compute_numel: the unsigned 64-bit product overflows (even before a 0), or the count passes int64
    if _count_overflows(dims) or math.prod(dims) >= _INT64:
        raise Refusal("a sparse tensor's element count does not fit int64 (torch: integer multiplication overflow)")
    if indices.shape is None or values.shape is None or len(indices.shape) != 2:
        raise CannotTell("a sparse tensor whose parts' shapes are not known here: torch may refuse it")
    sparse_dim, nnz = indices.shape
    values_nnz = values.shape[0] if values.shape else 1
    if nnz != values_nnz:
        raise Refusal(f"a sparse tensor's indices and values differ in nnz ({nnz} vs {values_nnz})")
    dense = values.shape[1:]
    if len(dims) != sparse_dim + len(dense):
        raise Refusal(f"a sparse tensor's size has {len(dims)} dims, its parts {sparse_dim} + {len(dense)}")
    if tuple(dims[sparse_dim:]) != dense:
        raise Refusal("a sparse tensor's values do not have the dense sizes of its size")


def _check_compressed(compressed: Any, plain: Any, values: Any, size: Any) -> None:
    """``torch.sparse_compressed_tensor(..., check_invariants=False)``, as ``_rebuild_sparse_tensor`` calls it.

    Without invariant checks (torch.load's default) torch's ``_sparse_compressed_tensor_unsafe`` checks no
    ranks, nnz, block sizes, batch dims or index dtypes: only the size (ints that fit int64, each a SymInt),
    the parts' devices (``set_member_tensors``) and the element count (``safe_compute_numel``, which
    multiplies the sizes as unsigned 64-bit ints: a negative size is a huge one)."""
    parts = (
        _sparse_part(compressed, "compressed indices"),
        _sparse_part(plain, "plain indices"),
        _sparse_part(values, "values"),
    )
    dims = _ints(size, "a sparse tensor's size")
    if any(not -_INT64 <= n < _INT64 for n in dims):
        raise Refusal("a sparse tensor's size does not fit int64")
    if dims and min(dims) < _SYMINT_MIN:
        raise Refusal(f"a sparse tensor's size {min(dims)} cannot be a SymInt (torch refuses it)")
    unsigned = [n % _U64 for n in dims]
    if _count_overflows(unsigned) or math.prod(unsigned) >= _INT64:
        raise Refusal("a sparse tensor's element count does not fit int64 (torch: integer multiplication overflow)")
    _parts_on_one_device(parts)


def _parts_on_one_device(parts: Sequence[WTensor]) -> None:
    """``set_member_tensors``: every part on the values' device. Meta stays meta under any ``map_location``;
    other devices may be moved by one, and parts of unknown place are not emulated."""
    places = {part.location for part in parts}
    if len(places) == 1 and None not in places:
        return
    if "meta" in places:
        raise Refusal("a sparse tensor's parts are on different devices (one on meta)")
    raise CannotTell("a sparse tensor's parts are on devices not known here, or different: torch may refuse it")


def _rebuild_meta(args: tuple[Any, ...]) -> WTensor:
    dtype_ref, size, stride, requires_grad = args
    dtype = _dtype(dtype_ref)
    if dtype in QUANTIZED_DTYPES:
        # torch.empty_strided on meta has no QuantizedMeta kernel, whatever the size (NotImplementedError)
        raise Refusal(f"a meta tensor of the quantized dtype {dtype}: torch cannot make one")
    sizes = _ints(size, "a meta tensor's size")
    strides = _ints(stride, "a meta tensor's stride")
    # torch.empty_strided unpacks both into int64 first
    if any(not -_INT64 <= n < _INT64 for n in sizes + strides):
        raise Refusal("a meta tensor's size or stride does not fit int64")
    if len(sizes) != len(strides):
        raise Refusal("a meta tensor's size and stride differ in length")
    if sizes and min(sizes) < 0:
        raise Refusal("a meta tensor has a negative size")
    # torch's safe_compute_numel: the unsigned 64-bit product overflows (even before a 0), or the count passes int64
    if _count_overflows(sizes) or math.prod(sizes) >= _INT64:
        raise Refusal("a meta tensor's element count does not fit int64 (torch: integer multiplication overflow)")
    _grad(requires_grad, dtype)
    return WTensor(dtype, plain=False, requires_grad=requires_grad, shape=sizes, location="meta")


_CASTABLE = frozenset(
    {"bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"}
    | {"complex64", "complex128"}
)
"""dtypes that ``Tensor.to`` converts between on the CPU (others: not emulated)."""


def _target_device(device: Any) -> str | None:
    """Where ``Tensor.to(device=device)`` puts a tensor: None (where it is), "cpu" or "meta"; else a Refusal,
    or CannotTell where the answer depends on the machine (an accelerator)."""
    if device is None:
        return None
    unless = " (torch.load refuses it unless map_location replaces it)"
    if type(device) is str:
        match = TORCH_DEVICE.fullmatch(device)
        if match is None or match.group(1) not in _DEVICE_TYPES or _index_past(match):
            raise Refusal(f"a tensor is rebuilt on {_short(device)}, which is not a device{unless}")
        if match.group(1) in ("cpu", "meta"):
            return match.group(1)
        raise CannotTell(f"a tensor is rebuilt on {device}: whether this machine has it is not known here")
    if type(device) in (int, bool) or (type(device) is WLeaf and device.type_name == "torch.device"):
        raise CannotTell("a tensor is rebuilt on a device not known here: torch may refuse it")
    raise Refusal(f"a tensor is rebuilt on a device given as a {type_name(device)}{unless}")


def _rebuild_device_tensor_from_cpu_tensor(args: tuple[Any, ...]) -> WTensor:
    """``data.to(dtype=dtype, device=device)``, then ``tensor.requires_grad = requires_grad``."""
    data, dtype_ref, device, requires_grad = args
    if isinstance(data, (WObject, Placeholder)):
        raise CannotTell(f"a tensor is rebuilt from a {type_name(data)}: torch may refuse it (not run here)")
    if not isinstance(data, WTensor):
        raise Refusal(f"a tensor is rebuilt from a {type_name(data)}, which has no to()")
    dtype = data.dtype if dtype_ref is None else _dtype(dtype_ref)
    target = _target_device(device)
    # a meta tensor has no values to copy out; map_location="cpu" makes every target the CPU
    if data.location == "meta" and target == "cpu":
        raise Refusal("a meta tensor is rebuilt on cpu (torch cannot copy out of a meta tensor)")
    if data.location == "meta":
        raise CannotTell("a meta tensor is rebuilt on meta: torch loads it, but refuses it under map_location='cpu'")
    if not data.plain or data.location != "cpu":
        raise CannotTell("a tensor is rebuilt from one whose kind or device is not known here: torch may refuse it")
    if dtype != data.dtype and not {dtype, data.dtype} <= _CASTABLE:
        raise CannotTell(f"a {data.dtype} tensor is converted to {dtype}: not emulated here, torch may refuse it")
    # a copy that requires grad is not a leaf: torch refuses to turn its requires_grad off
    if data.requires_grad and requires_grad is not True:
        raise CannotTell("a tensor that requires grad is rebuilt without it: torch may refuse it (not emulated here)")
    _grad(requires_grad, dtype)
    return WTensor(dtype, requires_grad=requires_grad, shape=data.shape, location=target or data.location)


def _rebuild_device_tensor_from_numpy(args: tuple[Any, ...]) -> WTensor:
    """``torch.from_numpy(data).to(...)``: ``data`` must be a numpy array, which only a refused global makes."""
    data, _dtype_ref, _device, _requires_grad = args
    if isinstance(data, (WObject, Placeholder)):
        raise CannotTell(f"a tensor is rebuilt from a {type_name(data)}: torch may refuse it (not run here)")
    raise Refusal(f"a tensor is rebuilt from a {type_name(data)} by torch.from_numpy (it wants a numpy array)")


def _rebuild_wrapper_subclass(args: tuple[Any, ...]) -> WTensor:
    """``Tensor._make_wrapper_subclass(cls, ...)``: ``cls`` must define ``__torch_dispatch__``, which no class
    of torch's default allowlist does; torch's own DTensor does (allowed once ``torch.distributed.tensor`` is
    imported)."""
    cls = args[0] if len(args) == 8 else None
    if len(args) != 8:
        raise TypeError(f"takes 8 arguments, got {len(args)}")
    if isinstance(cls, Placeholder) and cls.name in tables.WRAPPER_SUBCLASSES:
        return _wrapper_of(cls.name, args[1:])
    if isinstance(cls, Placeholder):
        raise CannotTell(f"a wrapper subclass {cls.name} is rebuilt: torch runs its class (not emulated here)")
    raise Refusal(f"a wrapper subclass is rebuilt from {type_name(cls)}, which does not define __torch_dispatch__")


def _wrapper_of(class_name: str, args: tuple[Any, ...]) -> WTensor:
    """A wrapper subclass of torch's own: ``(dtype, size, stride, storage_offset, layout, device, requires_grad)``
    checked as ``_make_wrapper_subclass`` takes them (it allocates nothing: the values are the state's)."""
    dtype_ref, size, stride, offset, layout, device, requires_grad = args
    dtype = _dtype(dtype_ref)
    sizes = _ints(size, "a wrapper subclass's size")
    _ints(stride, "a wrapper subclass's stride")
    if type(offset) is not int:
        raise Refusal(f"a wrapper subclass's storage offset is a {type_name(offset)}, not an int")
    if not (type(layout) is WLeaf and layout.type_name in LAYOUTS):
        raise CannotTell(f"a wrapper subclass's layout is a {type_name(layout)}: torch may refuse it")
    if not (type(device) is WLeaf and device.type_name == "torch.device"):
        raise CannotTell(f"a wrapper subclass's device is a {type_name(device)}: torch may refuse it")
    _grad(requires_grad, dtype)
    return WTensor(dtype, class_name, plain=False, requires_grad=requires_grad, shape=sizes)


def _rebuild_nested_tensor(args: tuple[Any, ...]) -> WTensor:
    """``torch._nested_view_from_buffer(buffer, sizes, strides, offsets)``: torch checks each component against
    the buffer's storage, which needs the values of the three int64 tensors: not emulated, so "cannot tell"."""
    buffer, sizes, strides, offsets = args
    for part, what in ((buffer, "buffer"), (sizes, "sizes"), (strides, "strides"), (offsets, "offsets")):
        if isinstance(part, (WObject, Placeholder)):
            raise CannotTell(f"a nested tensor's {what} is a {type_name(part)}: torch may refuse it (not run here)")
        if not isinstance(part, WTensor):
            raise Refusal(f"a nested tensor's {what} is a {type_name(part)}, not a tensor")
    raise CannotTell(
        "a nested tensor: torch checks each component's offset and sizes against its buffer while loading "
        "(not emulated here)"
    )


def _size(args: tuple[Any, ...]) -> WSize:
    if len(args) > 1:
        raise TypeError("torch.Size takes one argument")
    values = tuple(_iterate(args[0], "torch.Size items")) if args else ()
    if not all(isinstance(v, int) for v in values):
        raise Refusal("torch.Size of something other than ints")
    return WSize(values)


def _device(args: tuple[Any, ...]) -> WLeaf:
    if not args or len(args) > 2:
        raise TypeError("torch.device takes 1 or 2 arguments")
    first = args[0]
    if type(first) is int and len(args) == 1:
        return WLeaf("torch.device")
    if type(first) is WLeaf and first.type_name == "torch.device" and len(args) == 1:
        return first  # torch.device of a device is that device
    if type(first) is not str:
        raise Refusal(f"torch.device of a {type_name(first)}")
    match = TORCH_DEVICE.fullmatch(first)
    if match is None or match.group(1) not in _DEVICE_TYPES or (match.group(2) and len(args) == 2):
        raise Refusal(f"torch.device({_short(first)}) is not a device")
    if _index_past(match):
        raise Refusal(f"torch.device({_short(first)}): its index is past 32 bits")
    if len(args) == 2 and (type(args[1]) is not int or not 0 <= args[1] < DEVICE_INDEX_LIMIT):
        raise Refusal("torch.device index is not a non-negative 64-bit int")
    return WLeaf("torch.device")


def _index_past(match: re.Match[str]) -> bool:
    """Whether a device string's index is one ``std::stoi`` cannot read (torch refuses the string)."""
    return match.group(2) is not None and int(match.group(2)) >= DEVICE_STRING_INDEX_LIMIT


def _get_layout(args: tuple[Any, ...]) -> WLeaf:
    (name,) = args
    if not isinstance(name, str) or name not in LAYOUTS:
        raise Refusal(f"_get_layout({_short(name)}) is not a layout")
    return WLeaf(name)


_CODEC_NAME = re.compile(r"[A-Za-z0-9_.\- ]{1,64}\Z")


def _codec_call(action: Callable[[], Any], what: str) -> Any:
    """Run a standard-library codec on the file's text (``codecs`` finds codecs only in ``encodings``)."""
    try:
        return action()
    except (LookupError, TypeError, ValueError, OverflowError) as exc:  # UnicodeError is a ValueError
        raise Refusal(f"{what} fails ({type(exc).__name__}: {_short(str(exc))})") from None


def _codec_args(encoding: Any, errors: Any, what: str) -> None:
    if type(encoding) is not str or type(errors) is not str:
        raise Refusal(f"{what}: the encoding and errors are not text")
    if not _CODEC_NAME.match(encoding):
        raise Refusal(f"{what}: unknown encoding {_short(encoding)}")


def _encode(args: tuple[Any, ...]) -> Any:
    """``_codecs.encode(obj, encoding="utf-8", errors="strict")``: any codec, text or not (rot13, hex...)."""
    if not 1 <= len(args) <= 3:
        raise TypeError("_codecs.encode takes 1 to 3 arguments")
    value = args[0]
    encoding = args[1] if len(args) > 1 else "utf-8"
    errors = args[2] if len(args) > 2 else "strict"
    _codec_args(encoding, errors, "_codecs.encode")
    if not isinstance(value, (str, bytes)):
        raise Refusal(f"_codecs.encode of a {type_name(value)}")
    encode: Callable[[Any, str, str], Any] = codecs.encode  # text or bytes, any codec
    return _codec_call(lambda: encode(value, encoding, errors), "_codecs.encode")


def _bytearray(args: tuple[Any, ...]) -> WLeaf:
    if len(args) > 3:
        raise TypeError("bytearray takes at most 3 arguments")
    if args:
        first = args[0]
        if isinstance(first, str) != (len(args) > 1):
            raise Refusal("bytearray of text needs an encoding (and only text takes one)")
        if isinstance(first, str):  # str.encode: text encodings only (rot13 is refused)
            encoding, errors = args[1], args[2] if len(args) > 2 else "strict"
            _codec_args(encoding, errors, "bytearray")
            _codec_call(lambda: first.encode(encoding, errors), "bytearray")
        if type(first) in (int, bool) and first < 0:
            raise Refusal("bytearray of a negative size")
        if isinstance(first, (list, tuple)) and not all(type(v) in (int, bool) and 0 <= v < 256 for v in first):
            raise Refusal("bytearray of values outside 0..255")
        if isinstance(first, WTensor) and (first.dtype == "bool" or first.dtype.startswith(("int", "uint"))):
            # torch takes an integer tensor's elements (or a 0-d one as a size): its values decide, unread here
            raise CannotTell("bytearray of an integer tensor: torch makes one of its values (not read here)")
        if not isinstance(first, (bytes, str, int, list, tuple, WLeaf)):
            raise Refusal(f"bytearray of a {type_name(first)}")
    return WLeaf("builtins.bytearray")


_CLASS_DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
}
"""The dtype of each legacy tensor class ``torch.<Kind>Tensor``."""
LEGACY_CONSTRUCTED = 1 << 24
"""Elements a legacy constructor may be asked to allocate and still be called "loads" (an uninitialized
tensor of that size is a small allocation; a larger one may fail for lack of memory)."""


def _legacy_constructor(entry: tables.AllowedGlobal, args: tuple[Any, ...]) -> WTensor:
    """``torch.FloatTensor(*args)`` (REDUCE, or NEWOBJ: the same legacy constructor).

    Emulated for the forms torch.save's old files use: no arguments (an empty tensor, then BUILD's
    ``set_``), sizes as ints or a Size (an uninitialized tensor), and data as nested lists of numbers. Its
    other forms (storages, tensors, strings, CUDA and sparse classes) are not emulated: "cannot tell".
    """
    short = entry.name.rsplit(".", 1)[-1]
    dtype = "float32" if entry.name == "torch.Tensor" else _CLASS_DTYPES.get(short[: -len("Tensor")])
    dense = entry.name == "torch.Tensor" or entry.name.count(".") == 1
    if dtype is None or not dense:
        raise CannotTell(f"{entry.name}(...): CUDA and sparse legacy constructors are not emulated here")
    if not args:
        return WTensor(dtype, shape=(0,), location="cpu")
    if len(args) == 1 and type(args[0]) in (list, tuple):
        return WTensor(dtype, shape=_legacy_data(entry.name, args[0], dtype), location="cpu")
    if len(args) == 1 and type(args[0]) is WSize:
        args = tuple(args[0])
    count = 1
    for size in args:
        if type(size) is not int:
            raise CannotTell(
                f"{entry.name}(...) with a {type_name(size)} argument: the legacy constructor's checks of "
                "data, storages and tensors are not emulated here"
            )
        if size < 0:
            raise Refusal(f"{entry.name}() of a negative size")
        count *= size
    if count > LEGACY_CONSTRUCTED:
        raise CannotTell(f"{entry.name}() of {count} elements: torch may fail to allocate it")
    # a size 0 makes the count 0, but torch's contiguous strides and storage size still multiply the other
    # sizes in int64 (and refuse on overflow: "Stride calculation overflowed")
    if _count_overflows([max(size, 1) for size in args], LEGACY_CONSTRUCTED):
        raise CannotTell(
            f"{entry.name}() of sizes whose strides pass {LEGACY_CONSTRUCTED}: torch's checks not emulated"
        )
    return WTensor(dtype, shape=tuple(args), location="cpu")


_INT_RANGES = {
    "uint8": (0, 255),
    "int8": (-128, 127),
    "int16": (-(1 << 15), (1 << 15) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
}
_FLOAT_LIMITS = {"float16": 65504.0, "bfloat16": 3.3e38, "float32": 3.4e38, "float64": float("inf")}


def _legacy_data(name: str, data: list[Any] | tuple[Any, ...], dtype: str) -> tuple[int, ...]:
    """The shape of ``torch.FloatTensor([[1, 2], [3, 4]])``'s data: nested lists or tuples of numbers, each
    of a value the dtype holds. Ragged data, or values torch would convert or refuse, are not emulated."""
    shape: list[int] = []
    level: list[Any] = [data]
    while level and type(level[0]) in (list, tuple):
        length = len(level[0])
        if any(type(item) not in (list, tuple) or len(item) != length for item in level):
            raise CannotTell(f"{name}(...) of ragged or mixed data: not emulated here")
        shape.append(length)
        level = [value for item in level for value in item]
        if len(level) > LEGACY_CONSTRUCTED:
            raise CannotTell(f"{name}(...) of more than {LEGACY_CONSTRUCTED} values: not emulated here")
    if not all(_holds(dtype, value) for value in level):
        raise CannotTell(f"{name}(...) of values a {dtype} tensor may not hold: its conversion is not emulated here")
    return tuple(shape)


def _holds(dtype: str, value: Any) -> bool:
    """Whether a value converts to ``dtype`` as it is (no overflow, no rounding of a float to an int)."""
    kind = type(value)
    if dtype == "bool":
        return kind is bool
    if dtype in _INT_RANGES:
        low, high = _INT_RANGES[dtype]
        return kind is bool or (kind is int and low <= value <= high)
    if kind is bool or kind is int:
        return abs(value) <= _FLOAT_LIMITS.get(dtype, 0.0)
    return kind is float and abs(value) <= _FLOAT_LIMITS.get(dtype, 0.0)


_DIRECT: dict[str, type] = {
    "collections.OrderedDict": OrderedDict,
    "collections.Counter": Counter,
    "builtins.set": set,
    "builtins.complex": complex,
}
"""Allowed classes that only build plain data: the C unpickler calls them itself (no Python step per call)."""
_DIRECT_NEW: dict[Any, Callable[..., Any]] = {
    OrderedDict: lambda *args: OrderedDict(),
    Counter: lambda *args: Counter(),
    set: lambda *args: set(),
    complex: complex,
}
"""NEWOBJ of those classes: ``cls.__new__(cls, *args)`` (only complex's ``__new__`` reads its arguments)."""


def _callable(func: Any) -> bool:
    """Whether REDUCE may call ``func`` (torch: it is one of the allowed, or allowlisted, globals)."""
    return isinstance(func, (GlobalRef, Placeholder)) or (type(func) is type and func in _DIRECT_NEW)


_STORAGE_BYTES_EMULATED = 1 << 34
"""A storage built by a call is emulated up to this size (a bigger one may fail to allocate)."""


def _typed_storage(args: tuple[Any, ...]) -> WStorage:
    """``torch.storage.TypedStorage(*args)``: the default dtype (float32), of a size or of Python numbers."""
    count = _storage_count(args, (int, float, bool), "TypedStorage")
    return WStorage("float32", 4 * count, None, "cpu", resizable=True)


def _untyped_storage(args: tuple[Any, ...]) -> WStorage:
    """``torch.storage.UntypedStorage(*args)``: what torch's rebuild functions do with one (they ask a storage
    for its dtype, which it lacks) is not emulated."""
    raise CannotTell("torch.storage.UntypedStorage called: what torch does with it is not emulated here")


def _storage_count(args: tuple[Any, ...], kinds: tuple[type, ...], name: str) -> int:
    """The element count of a storage a call builds from nothing, a size or a flat sequence; CannotTell for
    the other forms (nested sequences, keyword-like arguments), whose rules are not emulated here."""
    if not args:
        return 0
    first: Any = args[0] if len(args) == 1 else None
    if type(first) is int:
        if first < 0:
            raise Refusal(f"{name}({first}): a negative size")
        count = first
    elif type(first) in (str, bytes):
        raise Refusal(f"{name} of a {type(first).__name__} (torch wants a size or numbers)")
    elif type(first) in (list, tuple) and all(type(item) in kinds for item in first):
        count = len(first)
        # torch converts each number to a double as Python does: past the float range an int raises
        # OverflowError (a float or int below it just rounds, to inf in float32)
        if any(type(item) is int and not _fits_double(item) for item in first):
            raise Refusal(f"{name} of an int too large to convert to float")
    else:
        raise CannotTell(f"{name} called with these arguments: not emulated here, torch may refuse it")
    if count * 4 > _STORAGE_BYTES_EMULATED:
        raise CannotTell(f"{name}({count}): whether torch can allocate it is not known here")
    return count


def _fits_double(value: int) -> bool:
    try:
        float(value)
    except OverflowError:
        return False
    return True


_CALLS: dict[str, Callable[[tuple[Any, ...]], Any]] = {
    "builtins.bytearray": _bytearray,
    "torch.nn.parameter.Parameter": _parameter,
    "torch.Size": _size,
    "torch.device": _device,
    "torch.serialization._get_layout": _get_layout,
    "_codecs.encode": _encode,
    "torch._tensor._rebuild_from_type_v2": _rebuild_from_type_v2,
    "torch.storage.TypedStorage": _typed_storage,
    "torch.storage.UntypedStorage": _untyped_storage,
    "torch._utils._rebuild_tensor": _rebuild_tensor,
    "torch._utils._rebuild_tensor_v2": _rebuild_tensor_v2,
    "torch._utils._rebuild_tensor_v3": _rebuild_tensor_v3,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
    "torch._utils._rebuild_parameter_with_state": _rebuild_parameter_with_state,
    "torch._utils._rebuild_qtensor": _rebuild_qtensor,
    "torch._utils._rebuild_sparse_tensor": _rebuild_sparse_tensor,
    "torch._utils._rebuild_meta_tensor_no_storage": _rebuild_meta,
    "torch._utils._rebuild_nested_tensor": _rebuild_nested_tensor,
    "torch._utils._rebuild_wrapper_subclass": _rebuild_wrapper_subclass,
    "torch._utils._rebuild_device_tensor_from_numpy": _rebuild_device_tensor_from_numpy,
    "torch._utils._rebuild_device_tensor_from_cpu_tensor": _rebuild_device_tensor_from_cpu_tensor,
}


def _not_callable(name: str) -> Callable[[tuple[Any, ...]], Any]:
    def refuse(args: tuple[Any, ...]) -> Any:
        raise Refusal(f"REDUCE calls {name}, which is not callable")

    return refuse


def _handler(entry: tables.AllowedGlobal) -> Callable[[tuple[Any, ...]], Any]:
    """What calling an allowed global does, on shadow values."""
    if entry.role in ("dtype", "qscheme", "storage_type"):
        return _not_callable(entry.name)
    handler = _CALLS.get(entry.name)
    if handler is not None:
        return handler
    if entry.role == "tensor_class" or entry.name == "torch.Tensor":  # legacy constructors
        return lambda args: _legacy_constructor(entry, args)
    return lambda args: WStorage("uint8", 0, None, "cpu")


# ---- one pickle ------------------------------------------------------------------------------------


def note_unknown(scan: PickleScan, message: str) -> None:
    """Record what the emulation does not model, unless torch has already refused the pickle before it
    (a refused GLOBAL or a refusal: torch stops there, whatever comes after)."""
    if scan.unknown is None and scan.fatal is None and not scan.refused:
        scan.unknown = message


_STAND_INS = frozenset({"WStorage", "WTensor", "WObject", "WLeaf", "WSize", "Placeholder", "GlobalRef"})
"""The emulation's stand-ins for torch's objects, as Python names their type in an error."""


def _about_a_stand_in(exc: Exception) -> bool:
    """Whether a failure names one of the emulation's stand-ins (``'WTensor' object is not iterable``): it
    says what the stand-in cannot do, not what torch's object can."""
    text = str(exc)
    return any(f"'{name}'" in text for name in _STAND_INS)


def scan_pickle(data: bytes, storage: StorageLoader, start: int = 0) -> PickleScan:
    """Emulate ``torch.load``'s weights-only unpickling of the pickle at ``data[start:]``."""
    scan = PickleScan()
    marker_module = "ckpt-tui marker " + secrets.token_hex(8)
    for exact in (False, True):
        scan = PickleScan()
        rewritten = rewrite(data, start, marker_module, exact)
        scan.end = rewritten.end
        if rewritten.error is not None:
            scan.fatal = rewritten.error
            return scan
        machine = Machine(rewritten.data, marker_module, storage, scan)
        try:
            scan.result = machine.load()
        except CannotTell as exc:
            note_unknown(scan, str(exc))
        except Refusal as exc:
            if scan.fatal is None:
                scan.fatal = str(exc)
        except TypeError as exc:
            if not exact and "argument list must be a tuple" in str(exc):
                continue  # a REDUCE whose arguments are not a tuple: rerun with REDUCE routed to the machine
            if _about_a_stand_in(exc):
                # a plain-data class (set, complex) given an emulated tensor or object: torch's real object may
                # well do (a set of a tensor's elements, complex of a one-element tensor)
                note_unknown(scan, f"an allowed class given a tensor or object ({exc}): not emulated here")
            else:
                scan.fatal = scan.fatal or f"malformed pickle ({exc})"
        except RecursionError:
            scan.fatal = scan.fatal or "the pickle nests too deeply"
        except MemoryError:
            scan.fatal = scan.fatal or "the pickle asks for more memory than its size justifies"
        except Exception as exc:  # every other failure of a malformed pickle: torch fails on it too
            scan.fatal = scan.fatal or f"malformed pickle ({type(exc).__name__}: {exc})"
        return scan
    return scan
