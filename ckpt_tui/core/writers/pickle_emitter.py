"""Write a tree back as ``data.pkl``: protocol 2, only the opcodes torch's weights_only loader reads.

Python's pickler cannot name ``torch._utils._rebuild_tensor_v2`` without importing torch, and
re-pickling through torch means loading every tensor; the tree here is inert data, so it is
emitted opcode by opcode, the way ``torch.save`` lays it out.
"""

from __future__ import annotations

import reprlib
import struct
from collections import OrderedDict
from collections.abc import Callable
from pickle import encode_long
from typing import Any

from ckpt_tui.core.dtypes import DTYPES
from ckpt_tui.core.errors import WriteError
from ckpt_tui.core.tree import Device, Opaque, Storage, Symbol, Tensor, TorchSize, is_global_ref

MAX_DEPTH = 900
BATCH = 1000


def _split(qualname: str) -> tuple[str, str]:
    module, _, name = qualname.rpartition(".")
    return module, name


class PickleWriter:
    """Emits one pickle; storages become ``('storage', type, key, location, numel)`` persistent ids."""

    def __init__(self, storage_key: Callable[[Storage], str]) -> None:
        self.out = bytearray(b"\x80\x02")
        self.storage_key = storage_key
        self.memo: dict[int, int] = {}
        self.globals: dict[str, int] = {}
        self.strings: dict[str, int] = {}
        self.alive: list[Any] = []
        self.depth = 0

    def dump(self, root: Any) -> bytes:
        """The whole pickle for ``root``."""
        self.save(root)
        self.out += b"."
        return bytes(self.out)

    # ---- primitives -------------------------------------------------------------------

    def _put(self, obj: Any) -> None:
        index = len(self.memo) + len(self.globals) + len(self.strings)
        self.memo[id(obj)] = index
        self.alive.append(obj)
        self.out += b"q" + bytes([index]) if index < 256 else b"r" + struct.pack("<I", index)

    def _get(self, index: int) -> None:
        self.out += b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index)

    def save_global(self, qualname: str) -> None:
        """``GLOBAL module name``, memoized."""
        index = self.globals.get(qualname)
        if index is not None:
            self._get(index)
            return
        module, name = _split(qualname)
        self.out += b"c" + module.encode() + b"\n" + name.encode() + b"\n"
        index = len(self.memo) + len(self.globals) + len(self.strings)
        self.globals[qualname] = index
        self.out += b"q" + bytes([index]) if index < 256 else b"r" + struct.pack("<I", index)

    def save_str(self, text: str) -> None:
        data = text.encode("utf-8", "surrogatepass")
        self.out += b"X" + struct.pack("<I", len(data)) + data

    def save_repeated_str(self, text: str) -> None:
        """A string that recurs on every tensor ('storage', 'cpu'): written once, then fetched from the memo."""
        index = self.strings.get(text)
        if index is not None:
            self._get(index)
            return
        self.save_str(text)
        index = self.strings[text] = len(self.memo) + len(self.globals) + len(self.strings)
        self.out += b"q" + bytes([index]) if index < 256 else b"r" + struct.pack("<I", index)

    def save_int(self, number: int) -> None:
        if 0 <= number < 256:
            self.out += b"K" + bytes([number])
        elif 0 <= number < 65536:
            self.out += b"M" + struct.pack("<H", number)
        elif -(2**31) <= number < 2**31:
            self.out += b"J" + struct.pack("<i", number)
        else:
            data = encode_long(number)
            if len(data) > 255:
                raise WriteError("integer too large to write")
            self.out += b"\x8a" + bytes([len(data)]) + data

    def save_tuple(self, items: tuple[Any, ...] | list[Any]) -> None:
        if not items:
            self.out += b")"
            return
        if len(items) <= 3:
            for item in items:
                self.save(item)
            self.out += b"\x85\x86\x87"[len(items) - 1 : len(items)]
            return
        self.out += b"("
        for item in items:
            self.save(item)
        self.out += b"t"

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
        if kind is bool:
            self.out += b"\x88" if obj else b"\x89"
        elif kind is int:
            self.save_int(obj)
        elif kind is float:
            self.out += b"G" + struct.pack(">d", obj)
        elif kind is str:
            self.save_str(obj)
        elif id(obj) in self.memo:
            self._get(self.memo[id(obj)])
        else:
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise WriteError("the tree is nested too deeply to write")
            self._save_object(obj)
            self.depth -= 1

    def _save_object(self, obj: Any) -> None:
        if isinstance(obj, Tensor):
            self.save_tensor(obj)
        elif isinstance(obj, dict):
            self.save_dict(obj)
        elif isinstance(obj, list):
            self.out += b"]"
            self._put(obj)
            for start in range(0, len(obj), BATCH):
                self.out += b"("
                for item in obj[start : start + BATCH]:
                    self.save(item)
                self.out += b"e"
        elif isinstance(obj, TorchSize):
            self.save_reduce("torch.Size", (tuple(obj),))
        elif isinstance(obj, tuple):
            self.save_tuple(obj)
            if any(not isinstance(item, (int, float, str, bool, type(None))) for item in obj):
                self._put(obj)  # shared nested tuples are written once, not once per reference
        elif isinstance(obj, bytes):
            self.save_reduce("_codecs.encode", (obj.decode("latin1"), "latin1"))
        elif isinstance(obj, bytearray):
            self.save_reduce("builtins.bytearray", (bytes(obj),))
        elif isinstance(obj, (set, frozenset)):
            self.save_reduce(f"builtins.{type(obj).__name__}", (sorted(obj, key=reprlib.repr),))
        elif isinstance(obj, complex):
            self.save_reduce("builtins.complex", (obj.real, obj.imag))
        elif isinstance(obj, Symbol):
            self.save_global(obj.qualname)
        elif isinstance(obj, Device):
            self.save_reduce("torch.device", (str(obj),))
        elif isinstance(obj, Opaque):
            self.save_opaque(obj)
        elif is_global_ref(obj):
            self.save_global(obj.global_name)
        else:
            raise WriteError(f"cannot write a value of type {type(obj).__name__}")

    def save_dict(self, obj: dict[Any, Any]) -> None:
        if isinstance(obj, OrderedDict):
            self.save_global("collections.OrderedDict")
            self.out += b")R"
        else:
            self.out += b"}"
        self._put(obj)
        items = list(obj.items())
        for start in range(0, len(items), BATCH):
            self.out += b"("
            for key, value in items[start : start + BATCH]:
                self.save(key)
                self.save(value)
            self.out += b"u"
        metadata = getattr(obj, "_metadata", None)
        if metadata is not None:
            self.out += b"}"
            self.save_str("_metadata")
            self.save(metadata)
            self.out += b"sb"

    def save_storage(self, storage: Storage) -> None:
        """The persistent id of a storage, under its output record key."""
        type_name = resolved_type(storage)
        self.out += b"("
        self.save_repeated_str("storage")
        self.save_global("torch.storage.UntypedStorage" if type_name == "UntypedStorage" else f"torch.{type_name}")
        self.save_str(self.storage_key(storage))
        self.save_repeated_str(storage.location)
        self.save_int(storage.nbytes if type_name == "UntypedStorage" else storage.numel)
        self.out += b"tQ"

    def save_tensor(self, tensor: Tensor) -> None:
        if tensor.parameter:
            with_state = tensor.parameter_state is not None
            self.save_global("torch._utils._rebuild_parameter" + ("_with_state" if with_state else ""))
            self.out += b"("
            self.save_plain_tensor(tensor)
            self.save(tensor.requires_grad)
            self._save_hooks(tensor)
            if with_state:
                self.save(tensor.parameter_state)
            self.out += b"tR"
        else:
            self.save_plain_tensor(tensor)
        self._put(tensor)

    def _save_hooks(self, tensor: Tensor) -> None:
        hooks = tensor.hooks
        if hooks is None or (type(hooks) is OrderedDict and not hooks and not hasattr(hooks, "_metadata")):
            self.save_global("collections.OrderedDict")
            self.out += b")R"
        else:
            self.save(tensor.hooks)

    def save_plain_tensor(self, tensor: Tensor) -> None:
        storage = tensor.storage
        if tensor.kind != "dense":
            raise WriteError(f"cannot write {tensor.kind} tensors (their values are not in this file)")
        if storage is None:
            self.save_reduce(
                "torch._utils._rebuild_meta_tensor_no_storage",
                (Symbol(f"torch.{tensor.dtype}"), tensor.shape, tensor.stride, tensor.requires_grad),
            )
            return
        v3 = resolved_type(storage) == "UntypedStorage" or tensor.dtype != storage.dtype
        self.save_global("torch._utils._rebuild_tensor_v3" if v3 else "torch._utils._rebuild_tensor_v2")
        self.out += b"("
        self.save_storage(storage)
        self.save_int(tensor.offset)
        self.save_tuple(tensor.shape)
        self.save_tuple(tensor.stride)
        self.save(tensor.requires_grad)
        self._save_hooks(tensor)
        if v3:
            self.save_global(f"torch.{tensor.dtype}")
        if tensor.metadata:
            self.save(tensor.metadata)
        self.out += b"tR"

    def save_opaque(self, obj: Opaque) -> None:
        if obj.callee is not None:
            self.save(obj.callee)
            self.save_tuple(obj.args)
            self.out += b"R"
        elif obj.how == "reconstructor":
            self.save_global("copyreg._reconstructor")
            self.save_tuple((type(obj), *obj.args))
            self.out += b"R"
        else:
            self.save_global(obj.global_name)
            self.save_tuple(obj.args)
            self.out += b"\x81" if obj.how == "newobj" else b"R"
        self._put(obj)
        if obj.state is not None:
            self.save(obj.state)
            self.out += b"b"
        if obj.items:
            self.out += b"("
            for key, value in obj.items.items():
                self.save(key)
                self.save(value)
            self.out += b"u"
        if obj.list_items:
            self.out += b"("
            for value in obj.list_items:
                self.save(value)
            self.out += b"e"


def resolved_type(storage: Storage) -> str:
    """The storage class to write: the one read, else the one torch uses for the dtype."""
    return storage.type_name or DTYPES[storage.dtype][1] or "UntypedStorage"
