"""Write a tree back as ``data.pkl``: protocol 2, only the opcodes torch's weights_only loader reads.

Python's pickler cannot name ``torch._utils._rebuild_tensor_v2`` without importing torch, and
re-pickling through torch means loading every tensor; the tree here is inert data, so it is
emitted opcode by opcode, the way ``torch.save`` lays it out.

The emitter is also the scan that decides whether a tree may be written: every global it emits
is either one of its own fixed names (:data:`EMITTED_GLOBALS`, :data:`CONSTANTS`) or an opaque
object the reader marked as safe data. Anything else (a hook, a tensor's metadata, a Parameter's
state, ``_metadata``, an opaque object's arguments or state holding an unsafe global) refuses the
write with the global's name and where it sits: what is refused is exactly what would be written.
"""

from __future__ import annotations

import reprlib
import struct
from collections import OrderedDict
from collections.abc import Callable
from pickle import encode_long
from typing import Any

from ckpt_tui.core.conventions.findings import tensor_problem
from ckpt_tui.core.errors import Cancelled, WriteError, WriteRefused
from ckpt_tui.core.model.dtypes import DTYPES
from ckpt_tui.core.model.keypath import Attr, Key, to_python
from ckpt_tui.core.model.tree import LAYOUTS, Device, Layout, Opaque, Storage, Symbol, Tensor, TorchSize, is_global_ref
from ckpt_tui.core.readers.distributed_globals import framework_of

MAX_DEPTH = 150  # the reader refuses trees deeper than 100; each level costs a few stack frames here
BATCH = 1000
SHORT = 64  # longer strings are memoized: shared by reference, written once

REBUILD_FUNCTIONS = frozenset(
    {
        "torch._utils._rebuild_tensor_v2",
        "torch._utils._rebuild_tensor_v3",
        "torch._utils._rebuild_parameter",
        "torch._utils._rebuild_parameter_with_state",
        "torch._utils._rebuild_meta_tensor_no_storage",
        "torch._utils._rebuild_qtensor",
        "torch._utils._rebuild_sparse_tensor",
    }
)
"""The tensor rebuild functions the emitter writes (all in torch's weights_only allowlist)."""

CONSTANTS = frozenset(
    {f"torch.{name}" for name in DTYPES}
    | {
        "torch.per_tensor_affine",
        "torch.per_tensor_symmetric",
        "torch.per_channel_affine",
        "torch.per_channel_symmetric",
        "torch.per_channel_affine_float_qparams",
        "torch.contiguous_format",
        "torch.channels_last",
        "torch.channels_last_3d",
        "torch.preserve_format",
        "torch.Tensor",
        "torch.nn.parameter.Parameter",
        "builtins.object",
    }
    | LAYOUTS
)
"""Constants a :class:`Symbol` may name: dtypes, qschemes, memory formats, a few classes."""

STORAGE_TYPES = frozenset({"torch.storage.UntypedStorage"} | {f"torch.{cls}" for _, cls in DTYPES.values() if cls})

EMITTED_GLOBALS = (
    REBUILD_FUNCTIONS
    | CONSTANTS
    | STORAGE_TYPES
    | {
        "collections.OrderedDict",
        "torch.Size",
        "torch.device",
        "torch.serialization._get_layout",
        "_codecs.encode",
        "builtins.bytearray",
        "builtins.set",
        "builtins.frozenset",
        "builtins.complex",
        "copyreg._reconstructor",
        "torch._tensor._rebuild_from_type_v2",
    }
)
"""Every global the emitter writes on its own account; opaque objects add only safe-marked names."""


FRAMEWORK_HINT = (
    "--extract auto writes the consolidated weights, --sanitize writes everything as plain data, "
    "--drop PATH leaves it out"
)
UNSAFE_HINT = "--sanitize rewrites data objects (OmegaConf, numpy, paths...) as plain data, --drop PATH leaves it out"


class Refusal(Exception):
    """Something in the tree cannot be written; ``where`` collects the path while it propagates."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.where: list[Key] = []

    def error(self) -> WriteError:
        """The user's one-line error, naming where the offending value sits (and what to do)."""
        path = tuple(reversed(self.where))
        where = to_python(path[:12]) + ("…" if len(path) > 12 else "") if path else "the root"
        bare = f"refusing to write {self.message} at {where}"
        return WriteRefused(bare + (f": {self.hint}" if self.hint else ""), bare)


def _memo_put(index: int) -> bytes:
    return b"q" + bytes([index]) if index < 256 else b"r" + struct.pack("<I", index)


def _memo_get(index: int) -> bytes:
    return b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index)


def encode_int(number: int) -> bytes:
    """The shortest protocol-2 opcode for an int."""
    if 0 <= number < 256:
        return b"K" + bytes([number])
    if 0 <= number < 65536:
        return b"M" + struct.pack("<H", number)
    if -(2**31) <= number < 2**31:
        return b"J" + struct.pack("<i", number)
    data = encode_long(number)
    if len(data) > 255:
        raise Refusal("an integer too large for a checkpoint")
    return b"\x8a" + bytes([len(data)]) + data


def encode_str(text: str) -> bytes:
    """``BINUNICODE``: the string opcode torch's weights_only loader reads."""
    data = text.encode("utf-8", "surrogatepass")
    return b"X" + struct.pack("<I", len(data)) + data


class CommonLayout:
    """The cached bytes of usual tensors in one storage layout (storage type, dtypes, location)."""

    __slots__ = ("bodies", "head", "middle", "tail", "untyped")

    def __init__(self, head: bytes, middle: bytes, untyped: bool, tail: bytes) -> None:
        self.head = head
        """The rebuild function, the argument tuple's start and the persistent id up to the storage key."""
        self.middle = middle
        """The location, after the key."""
        self.untyped = untyped
        """Whether the persistent id counts bytes (UntypedStorage), not elements."""
        self.tail = tail
        """Empty hooks, the dtype for ``_rebuild_tensor_v3``, and the call."""
        self.bodies: dict[tuple[int, int, tuple[int, ...], tuple[int, ...], bool], bytes] = {}
        """Everything after the storage key, by (storage numel, offset, shape, stride, requires_grad)."""


class PickleWriter:
    """Emits one pickle; storages become ``('storage', type, key, location, numel)`` persistent ids.

    ``storage_key`` names each storage's output record (called in first-use order); without one, the
    storages are numbered 0, 1, ... in first-use order, as torch numbers them, and listed in :attr:`storages`.
    """

    def __init__(
        self,
        storage_key: Callable[[Storage], str] | None = None,
        judging: bool = False,
        cancelled: Callable[[], bool] | None = None,
    ) -> None:
        self.out = bytearray(b"\x80\x02")
        self.judging = judging
        """Write unsafe globals as they are, for the weights_only verdict alone (such a pickle is never saved)."""
        self.cancelled = cancelled
        """Asked once a batch of list items or dict entries: True stops the pickle with :class:`Cancelled`."""
        self.storage_key = storage_key or self._number
        self.storages: list[Storage] = []
        """The storages numbered, in first-use order (without a ``storage_key``)."""
        self._numbers: dict[int, str] | None = {} if storage_key is None else None
        self.memo: dict[int, int] = {}
        self.alive: list[Any] = []
        self.next_index = 0
        self.depth = 0
        self.tensors = 0
        self._globals: dict[str, bytes] = {}
        self._ints: dict[int, bytes] = {}
        self._tuples: dict[tuple[int, ...], bytes] = {}
        self._strings: dict[str, bytes] = {}
        self._layouts: dict[tuple[str, str, str, str], CommonLayout] = {}
        self._empty_hooks = b""
        self._pending_type: Any = None

    def _number(self, storage: Storage) -> str:
        """The record key of a storage: its number in first-use order."""
        assert self._numbers is not None
        key = self._numbers.get(id(storage))
        if key is None:
            key = self._numbers[id(storage)] = str(len(self.storages))
            self.storages.append(storage)
        return key

    def dump(self, root: Any) -> bytes:
        """The whole pickle for ``root``; a :class:`WriteError` naming the place if any part cannot be written."""
        try:
            self.save(root)
        except Refusal as refusal:
            raise refusal.error() from None
        except RecursionError:
            raise WriteError("refusing to write a tree nested too deeply") from None
        self.out += b"."
        return bytes(self.out)

    # ---- primitives -------------------------------------------------------------------

    def _stop_if_cancelled(self) -> None:
        """Raise :class:`Cancelled` where the caller no longer wants the pickle (a newer tree to judge)."""
        if self.cancelled is not None and self.cancelled():
            raise Cancelled("cancelled: the pickle was not finished")

    def _new_index(self) -> int:
        index = self.next_index
        self.next_index += 1
        return index

    def _put(self, obj: Any, temporary: bool = True) -> None:
        index = self._new_index()
        self.memo[id(obj)] = index
        if temporary:
            self.alive.append(obj)  # keeps temporaries alive so their ids are never reused
        self.out += _memo_put(index)

    def global_ref(self, qualname: str) -> bytes:
        """The bytes that push ``qualname``: written once, then fetched from the memo."""
        known = self._globals.get(qualname)
        if known is not None:
            return known
        module, _, name = qualname.rpartition(".")
        index = self._new_index()
        self._globals[qualname] = _memo_get(index)
        return b"c" + module.encode() + b"\n" + name.encode() + b"\n" + _memo_put(index)

    def save_global(self, qualname: str) -> None:
        """``GLOBAL module name`` for one of the emitter's own names."""
        if qualname not in EMITTED_GLOBALS:
            raise Refusal(f"the global {qualname} (not one the writer knows as data)")
        self.out += self.global_ref(qualname)

    def int_bytes(self, number: int) -> bytes:
        """``encode_int``, cached: offsets, sizes and numels repeat on every tensor."""
        known = self._ints.get(number)
        if known is None:
            known = encode_int(number)
            if len(self._ints) < 100_000:
                self._ints[number] = known
        return known

    def int_tuple(self, items: tuple[int, ...]) -> bytes:
        """A tuple of plain ints (a shape or stride), cached."""
        known = self._tuples.get(items)
        if known is None:
            body = b"".join(map(self.int_bytes, items))
            if not items:
                known = b")"
            elif len(items) <= 3:
                known = body + b"\x85\x86\x87"[len(items) - 1 : len(items)]
            else:
                known = b"(" + body + b"t"
            if len(self._tuples) < 10_000:
                self._tuples[items] = known
        return known

    def save_tuple(self, items: tuple[Any, ...] | list[Any]) -> None:
        if not items:
            self.out += b")"
            return
        if len(items) > 3:
            self.out += b"("
        for index, item in enumerate(items):
            try:
                self.save(item)
            except Refusal as refusal:
                refusal.where.append(index)
                raise
        self.out += b"\x85\x86\x87"[len(items) - 1 : len(items)] if len(items) <= 3 else b"t"

    def save_reduce(self, qualname: str, args: tuple[Any, ...] | list[Any]) -> None:
        self.save_global(qualname)
        self.save_tuple(args)
        self.out += b"R"

    # ---- dispatch ---------------------------------------------------------------------

    def save(self, obj: Any) -> None:
        """Emit any value of the tree model."""
        if obj is None:
            self.out += b"N"
            return
        kind = type(obj)
        if kind is str and len(obj) <= SHORT:
            self.out += encode_str(obj)
        elif kind is str:
            self.save_long_str(obj)
        elif kind is int:
            self.out += self.int_bytes(obj)
        elif kind is bool:
            self.out += b"\x88" if obj else b"\x89"
        elif kind is float:
            self.out += b"G" + struct.pack(">d", obj)
        elif id(obj) in self.memo:
            self.out += _memo_get(self.memo[id(obj)])
            if kind is Tensor:
                self.tensors += 1  # a tied tensor counts at each place, as ``info`` counts it
        else:
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise Refusal("a tree nested too deeply")
            self._save_object(obj)
            self.depth -= 1

    def _save_object(self, obj: Any) -> None:
        if isinstance(obj, Tensor):
            self.save_tensor(obj)
        elif isinstance(obj, dict):
            self.save_dict(obj)
        elif isinstance(obj, list):
            self.save_list(obj)
        elif isinstance(obj, TorchSize):
            self.save_reduce("torch.Size", (tuple(obj),))
            self._put(obj)
        elif isinstance(obj, tuple):
            self.save_tuple(obj)
            if any(not isinstance(item, (int, float, str, bool, type(None))) for item in obj):
                self._put(obj)  # shared nested tuples are written once, not once per reference
        elif isinstance(obj, (bytes, bytearray, set, frozenset, complex)):
            self.save_builtin(obj)
            self._put(obj)  # written once however often it is shared (nested frozensets double at each level)
        elif isinstance(obj, Layout):
            self.save_layout(obj)
        elif isinstance(obj, Symbol):
            if obj.qualname not in CONSTANTS:
                raise Refusal(f"the global {obj.qualname} (not a constant the writer knows)")
            self.out += self.global_ref(obj.qualname)
        elif isinstance(obj, Device):
            self.save_reduce("torch.device", (str(obj),))
            self._put(obj)
        elif isinstance(obj, Opaque):
            self.save_opaque(obj)
        elif is_global_ref(obj):
            self.save_opaque_global(obj)
        else:
            raise Refusal(f"a value of type {type(obj).__name__}")

    def save_long_str(self, text: str) -> None:
        """A long string, written once however often it is shared (a pickle can repeat one by reference)."""
        index = self.memo.get(id(text))
        if index is not None:
            self.out += _memo_get(index)
            return
        self.out += encode_str(text)
        self._put(text)  # kept alive: a string made while writing (bytes as latin-1) must not lend its id

    def save_builtin(self, obj: bytes | bytearray | set[Any] | frozenset[Any] | complex) -> None:
        """bytes, bytearray, sets and complex numbers as torch's pickler writes them (REDUCE of a builtin)."""
        if isinstance(obj, bytes):
            self.save_reduce("_codecs.encode", (obj.decode("latin1"), "latin1"))
        elif isinstance(obj, bytearray):
            self.save_reduce("builtins.bytearray", (bytes(obj),))
        elif isinstance(obj, (set, frozenset)):
            self.save_reduce(f"builtins.{type(obj).__name__}", (sorted(obj, key=reprlib.repr),))
        else:
            self.save_reduce("builtins.complex", (obj.real, obj.imag))

    def save_list(self, obj: list[Any]) -> None:
        self.out += b"]"
        self._put(obj)
        index = 0
        try:
            for start in range(0, len(obj), BATCH):
                self._stop_if_cancelled()
                self.out += b"("
                for index in range(start, min(start + BATCH, len(obj))):
                    self.save(obj[index])
                self.out += b"e"
        except Refusal as refusal:
            refusal.where.append(index)
            raise

    def save_dict(self, obj: dict[Any, Any]) -> None:
        if isinstance(obj, OrderedDict):
            self.save_global("collections.OrderedDict")
            self.out += b")R"
        else:
            self.out += b"}"
        self._put(obj)
        items = list(obj.items())
        key: Any = None
        out, memo, save, save_tensor, usual = self.out, self.memo, self.save, self.save_tensor, self._save_usual_entries
        try:
            for start in range(0, len(items), BATCH):
                self._stop_if_cancelled()
                out += b"("
                index, stop = start, min(start + BATCH, len(items))
                while index < stop:
                    index = usual(items, index, stop)  # the common case: a run of usual tensors
                    if index == stop:
                        break
                    key, value = items[index]
                    index += 1
                    if type(key) is str and len(key) <= SHORT:
                        out += encode_str(key)
                    else:
                        save(key)
                    if type(value) is Tensor and id(value) not in memo:
                        save_tensor(value)  # without the generic dispatch
                    else:
                        save(value)
                out += b"u"
        except Refusal as refusal:
            refusal.where.append(key)
            raise
        metadata = getattr(obj, "_metadata", None)
        if metadata is not None:
            self.out += b"}" + encode_str("_metadata")
            self._save_attribute("_metadata", metadata)
            self.out += b"sb"

    def _save_attribute(self, name: str, value: Any) -> None:
        try:
            self.save(value)
        except Refusal as refusal:
            refusal.where.append(Attr(name))
            raise

    def save_layout(self, layout: Layout) -> None:
        """A layout as torch pickles it: ``torch.serialization._get_layout('torch.sparse_coo')``."""
        if layout.qualname not in LAYOUTS:
            raise Refusal(f"the layout {layout.qualname}")
        self.out += self.global_ref("torch.serialization._get_layout") + encode_str(layout.qualname) + b"\x85R"

    # ---- tensors ----------------------------------------------------------------------

    def save_tensor(self, tensor: Tensor) -> None:
        self.tensors += 1
        problem = tensor_problem(tensor)
        if problem is not None:  # torch.load would refuse the output as it refuses the source
            raise Refusal(f"a tensor that {problem} (torch.load refuses it; --drop it)")
        typed = tensor.python_type is not None or tensor.python_state is not None
        if typed:  # _rebuild_from_type_v2(func, new_type, args, state), as torch writes a tensor with Python state
            self.save_global("torch._tensor._rebuild_from_type_v2")
            self.out += b"("
            usual = Symbol("torch.nn.parameter.Parameter" if tensor.parameter else "torch.Tensor")
            self._pending_type = usual if tensor.python_type is None else tensor.python_type  # written after func
        if tensor.parameter:
            with_state = tensor.parameter_state is not None
            self._tensor_function("torch._utils._rebuild_parameter" + ("_with_state" if with_state else ""))
            self.out += b"("
            self.save_plain_tensor(tensor, as_parameter_data=True)
            self.out += b"\x88" if tensor.requires_grad else b"\x89"
            self._save_hooks(tensor)
            if with_state:
                self._save_attribute("parameter_state", tensor.parameter_state)
            self.out += b"t" if typed else b"tR"
        elif typed or not self._save_common_tensor(tensor):
            self.save_plain_tensor(tensor, reduce=not typed)
        if typed:
            self._save_attribute("python_state", {} if tensor.python_state is None else tensor.python_state)
            self.out += b"tR"
        self._put(tensor, temporary=False)

    def _save_common_tensor(self, tensor: Tensor) -> bool:
        """The usual tensor (dense, stored, no hooks or metadata) from bytes cached per storage layout.

        The cache is filled after the first such tensor went through :meth:`save_plain_tensor`, so every
        global and repeated string in it is already defined and is fetched from the memo. False: not handled.
        """
        storage = tensor.storage
        if storage is None or tensor.kind != "dense" or tensor.metadata is not None or tensor.sparse is not None:
            return False
        hooks = tensor.hooks
        if not (hooks is None or (type(hooks) is OrderedDict and not hooks and not hasattr(hooks, "_metadata"))):
            return False
        layout = (storage.type_name, storage.dtype, tensor.dtype, storage.location)
        cached = self._layouts.get(layout)
        if cached is None:
            self.save_plain_tensor(tensor)
            self._layouts[layout] = self._common_layout(storage, tensor.dtype)
            return True
        key = self.storage_key(storage).encode()
        body = self._common_body(cached, tensor)
        self.out += b"".join((cached.head, b"X", len(key).to_bytes(4, "little"), key, body))
        return True

    def _common_body(self, layout: CommonLayout, tensor: Tensor) -> bytes:
        """What follows the storage key in a usual tensor's bytes: location, sizes, shape, stride, hooks, end."""
        storage = tensor.storage
        assert storage is not None
        numel = storage.numel * DTYPES[storage.dtype][0] if layout.untyped else storage.numel
        return b"".join(
            (
                layout.middle,
                self.int_bytes(numel),
                b"tQ",
                self.int_bytes(tensor.offset),
                self.int_tuple(tensor.shape),
                self.int_tuple(tensor.stride),
                b"\x88" if tensor.requires_grad else b"\x89",
                layout.tail,
            )
        )

    def _save_usual_entries(self, items: list[tuple[Any, Any]], index: int, stop: int) -> int:
        """Dict entries from ``items[index]`` on (before ``stop``) whose key is a short string and whose value is
        a usual tensor met before in its layout; returns the index of the first entry that is not one.

        Everything :meth:`save_tensor` does for each, key and tensor in one piece: the bytes after the storage
        key are cached per layout and geometry (storage size, offset, shape, stride), which also decides
        :func:`tensor_problem` once per geometry.
        """
        memo, layouts, numbers, storage_key, out = self.memo, self._layouts, self._numbers, self.storage_key, self.out
        first, next_index, storages = index, self.next_index, self.storages
        while index < stop:
            name, tensor = items[index]
            if type(name) is not str or len(name) > SHORT or type(tensor) is not Tensor:
                break
            storage = tensor.storage
            if (
                storage is None
                or id(tensor) in memo
                or tensor.parameter
                or tensor.kind != "dense"
                or tensor.metadata is not None
                or tensor.sparse is not None
                or tensor.python_type is not None
                or tensor.python_state is not None
            ):
                break
            hooks = tensor.hooks
            if not (hooks is None or (type(hooks) is OrderedDict and not hooks and not hasattr(hooks, "_metadata"))):
                break
            layout = layouts.get((storage.type_name, storage.dtype, tensor.dtype, storage.location))
            if layout is None:
                break
            geometry = (storage.numel, tensor.offset, tensor.shape, tensor.stride, tensor.requires_grad)
            body = layout.bodies.get(geometry)
            if body is None:
                if tensor_problem(tensor) is not None:
                    break  # save_tensor refuses it, naming the problem
                body = self._common_body(layout, tensor)
                if len(layout.bodies) < 10_000:
                    layout.bodies[geometry] = body
            text = name.encode("utf-8", "surrogatepass")
            if numbers is None:
                key = storage_key(storage).encode()
            else:  # _number, inline
                number = numbers.get(id(storage))
                if number is None:
                    number = numbers[id(storage)] = str(len(storages))
                    storages.append(storage)
                key = number.encode()
            memo[id(tensor)] = next_index
            out += b"".join(
                (
                    b"X",
                    len(text).to_bytes(4, "little"),
                    text,
                    layout.head,
                    b"X",
                    len(key).to_bytes(4, "little"),
                    key,
                    body,
                    b"q" + bytes((next_index,)) if next_index < 256 else b"r" + next_index.to_bytes(4, "little"),
                )
            )
            next_index += 1
            index += 1
        self.next_index = next_index
        self.tensors += index - first
        return index

    def _common_layout(self, storage: Storage, dtype: str) -> CommonLayout:
        """Memo fetches for one storage layout: rebuild call and pid start, location, hooks and end."""
        type_name = resolved_type(storage)
        untyped = type_name == "UntypedStorage"
        v3 = untyped or dtype != storage.dtype
        rebuild = self.global_ref("torch._utils._rebuild_tensor_v3" if v3 else "torch._utils._rebuild_tensor_v2")
        kind = self.global_ref("torch.storage.UntypedStorage" if untyped else f"torch.{type_name}")
        head = rebuild + b"((" + self._repeated_str("storage") + kind
        tail = self.global_ref("collections.OrderedDict") + b")R"
        tail += (self.global_ref(f"torch.{dtype}") if v3 else b"") + b"tR"
        return CommonLayout(head, self._repeated_str(storage.location), untyped, tail)

    def _save_hooks(self, tensor: Tensor) -> None:
        hooks = tensor.hooks
        if hooks is None or (type(hooks) is OrderedDict and not hooks and not hasattr(hooks, "_metadata")):
            self.out += self.global_ref("collections.OrderedDict") + b")R"
        else:
            self._save_attribute("backward_hooks", hooks)

    def _tensor_function(self, qualname: str) -> None:
        """A tensor's rebuild function; then the class ``_rebuild_from_type_v2`` makes it, when one is pending."""
        self.save_global(qualname)
        pending, self._pending_type = self._pending_type, None
        if pending is not None:
            self._save_attribute("python_type", pending)

    def save_plain_tensor(self, tensor: Tensor, as_parameter_data: bool = False, reduce: bool = True) -> None:
        """``_rebuild_tensor_v2/v3`` (or the quantized, sparse and meta variants) for one tensor.

        ``reduce`` False: the function and its argument tuple only, for ``_rebuild_from_type_v2`` to call.
        """
        call = b"R" if reduce else b""
        if tensor.kind == "quantized":
            self.save_quantized(tensor, call)
            return
        if tensor.sparse is not None:
            self.save_sparse(tensor, call)
            return
        if tensor.kind != "dense":
            raise Refusal(f"a {tensor.kind} tensor (its values are not in this file)")
        storage = tensor.storage
        if storage is None:
            self._tensor_function("torch._utils._rebuild_meta_tensor_no_storage")
            self.save_tuple((Symbol(f"torch.{tensor.dtype}"), tensor.shape, tensor.stride, tensor.requires_grad))
            self.out += call
            return
        v3 = resolved_type(storage) == "UntypedStorage" or tensor.dtype != storage.dtype
        requires_grad = tensor.requires_grad and not as_parameter_data
        self._tensor_function("torch._utils._rebuild_tensor_v3" if v3 else "torch._utils._rebuild_tensor_v2")
        self.out += (
            b"("
            + self.storage_id(storage)
            + self.int_bytes(tensor.offset)
            + self.int_tuple(tensor.shape)
            + self.int_tuple(tensor.stride)
            + (b"\x88" if requires_grad else b"\x89")
        )
        self._save_hooks(tensor)
        if v3:
            self.out += self.global_ref(f"torch.{tensor.dtype}")
        if tensor.metadata is not None:
            self._save_attribute("metadata", tensor.metadata)
        self.out += b"t" + call

    def storage_id(self, storage: Storage) -> bytes:
        """The persistent id of a storage under its output record key (``BINPERSID``)."""
        type_name = resolved_type(storage)
        qualname = "torch.storage.UntypedStorage" if type_name == "UntypedStorage" else f"torch.{type_name}"
        if qualname not in STORAGE_TYPES:
            raise Refusal(f"the storage type {qualname}")
        numel = storage.nbytes if type_name == "UntypedStorage" else storage.numel
        return (
            b"("
            + self._repeated_str("storage")
            + self.global_ref(qualname)
            + encode_str(self.storage_key(storage))
            + self._repeated_str(storage.location)
            + self.int_bytes(numel)
            + b"tQ"
        )

    def _repeated_str(self, text: str) -> bytes:
        """A string that recurs on every tensor ('storage', 'cpu'): written once, then fetched from the memo."""
        known = self._strings.get(text)
        if known is not None:
            return known
        index = self._new_index()
        self._strings[text] = _memo_get(index)
        return encode_str(text) + _memo_put(index)

    def save_quantized(self, tensor: Tensor, call: bytes = b"R") -> None:
        """``_rebuild_qtensor(storage, offset, size, stride, quantizer, requires_grad, hooks)``, as torch writes it."""
        storage = tensor.storage
        if storage is None or tensor.quantizer is None:
            raise Refusal("a quantized tensor without its storage or quantizer")
        self._tensor_function("torch._utils._rebuild_qtensor")
        self.out += (
            b"("
            + self.storage_id(storage)
            + self.int_bytes(tensor.offset)
            + self.int_tuple(tensor.shape)
            + self.int_tuple(tensor.stride)
        )
        counted = self.tensors
        self._save_attribute("quantizer", tensor.quantizer)
        self.tensors = counted  # per-channel scales are part of this tensor, not tensors of their own
        self.out += b"\x88" if tensor.requires_grad else b"\x89"
        self._save_hooks(tensor)
        self.out += b"t" + call

    def save_sparse(self, tensor: Tensor, call: bytes = b"R") -> None:
        """``_rebuild_sparse_tensor(layout, parts)``, as torch writes it."""
        layout = Layout(f"torch.{tensor.kind}")
        self._tensor_function("torch._utils._rebuild_sparse_tensor")
        self.save_layout(layout)
        counted = self.tensors
        self._save_attribute("sparse", tensor.sparse)
        self.tensors = counted  # indices and values are part of this tensor
        self.out += b"\x86" + call

    # ---- opaque objects ---------------------------------------------------------------

    def _check_opaque_class(self, cls: type[Opaque]) -> None:
        if self.judging:
            return
        if not cls.safe:
            raise Refusal(f"the unsafe global {cls.global_name}", UNSAFE_HINT)
        owner = framework_of(cls.global_name)
        if owner is not None:
            # read as inert data here, but torch.load(weights_only=True) refuses them, and the real
            # classes need the framework (and, for ShardedTensor, a process group) to load at all
            raise Refusal(f"{owner}'s own object {cls.global_name}", FRAMEWORK_HINT)

    def save_opaque_global(self, cls: type[Opaque]) -> None:
        """A bare global (a class or function reference): written only if the reader knows it as data."""
        self._check_opaque_class(cls)
        self.out += self.global_ref(cls.global_name)

    def save_opaque(self, obj: Opaque) -> None:
        if obj.kwargs:
            raise Refusal(f"a {obj.global_name} built with keyword arguments")
        if obj.from_type is not None:
            self.save_from_type(obj)
        elif obj.callee is not None:
            self._save_attribute("callee", obj.callee)
            self._save_args(obj.args)
            self.out += b"R"
        elif obj.how == "reconstructor":
            self._check_opaque_class(type(obj))
            self.save_global("copyreg._reconstructor")
            self.out += b"(" + self.global_ref(type(obj).global_name)
            self._save_args(obj.args, opened=True)
            self.out += b"R"
        else:
            self.save_opaque_global(type(obj))
            self._save_args(obj.args)
            self.out += b"\x81" if obj.how == "newobj" else b"R"
        self._put(obj)
        if obj.state is not None and obj.from_type is None:
            self._save_state(obj.state)
            self.out += b"b"
        if obj.items:
            key: Any = None
            try:
                self.out += b"("
                for key, value in obj.items.items():
                    self.save(key)
                    self.save(value)
                self.out += b"u"
            except Refusal as refusal:
                refusal.where.append(key)
                raise
        if obj.list_items:
            self.out += b"("
            for index, value in enumerate(obj.list_items):
                try:
                    self.save(value)
                except Refusal as refusal:
                    refusal.where.append(index)
                    raise
            self.out += b"e"

    def save_from_type(self, obj: Opaque) -> None:
        """``_rebuild_from_type_v2(func, new_type, args, state)`` that made ``obj`` (a DTensor...), every part kept."""
        if obj.how != "reduce":
            raise Refusal(f"a {obj.global_name} made by _rebuild_from_type_v2 in an unusual way")
        self.save_global("torch._tensor._rebuild_from_type_v2")
        self.out += b"("
        if obj.callee is not None:
            self._save_attribute("callee", obj.callee)
        else:
            self.save_opaque_global(type(obj))
        self._save_attribute("<tensor class>", obj.from_type)
        self._save_args(obj.args)
        self._save_state({} if obj.state is None else obj.state)
        self.out += b"tR"

    def _save_state(self, state: Any) -> None:
        """An opaque object's state; a refusal names its entries as the tree shows them (attributes)."""
        try:
            self.save(state)
        except Refusal as refusal:
            if isinstance(state, dict) and refusal.where:
                refusal.where[-1] = Attr(str(refusal.where[-1]))
            else:
                refusal.where.append(Attr("state"))
            raise

    def _save_args(self, args: tuple[Any, ...], opened: bool = False) -> None:
        """An opaque object's arguments as a tuple (``opened``: a MARK and the class are already out)."""
        if opened:
            self._save_items_as_args(args)
            self.out += b"t"
            return
        if not args:
            self.out += b")"
            return
        if len(args) > 3:
            self.out += b"("
        self._save_items_as_args(args)
        self.out += b"\x85\x86\x87"[len(args) - 1 : len(args)] if len(args) <= 3 else b"t"

    def _save_items_as_args(self, args: tuple[Any, ...]) -> None:
        for index, arg in enumerate(args):
            try:
                self.save(arg)
            except Refusal as refusal:
                refusal.where.append(Attr(f"args[{index}]"))
                raise


def resolved_type(storage: Storage) -> str:
    """The storage class to write: the one read, else the one torch uses for the dtype."""
    return storage_class(storage.type_name, storage.dtype)


def storage_class(type_name: str, dtype: str) -> str:
    """The storage class written for a storage read as ``type_name`` (may be empty) holding ``dtype``."""
    return type_name or DTYPES[dtype][1] or "UntypedStorage"
