"""Content digests of tree values: two values get the same digest when they hold the same data.

Used where values are compared without a tensor-by-tensor read (``diff`` of leaves, opaque objects
and keys). Every part counts (an opaque object's class, arguments and state; a dict's order when
it is ordered; a float's exact bits), so two different values never compare equal the way two
truncated ``repr`` strings can. Each object is digested once per :class:`Fingerprints` (shared
objects are not walked again), a cycle becomes a back-reference, and nothing recurses.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from ckpt_tui.core.model.keypath import Attr
from ckpt_tui.core.model.tree import (
    Device,
    LoadedOrderedDict,
    Opaque,
    Storage,
    Symbol,
    Tensor,
    TorchSize,
    is_global_ref,
)


def _scalar(value: Any) -> bytes | None:
    """The digest input of a scalar, or None if ``value`` is not one."""
    kind = type(value)
    if kind is str:
        return b"s" + value.encode("utf-8", "surrogatepass")
    if kind is bool:
        return b"?1" if value else b"?0"
    if kind is int:
        return b"i" + str(value).encode()
    if kind is float:
        return b"f" + struct.pack("<d", value)
    if kind is complex:
        return b"c" + struct.pack("<dd", value.real, value.imag)
    if kind is bytes or kind is bytearray:
        return (b"b" if kind is bytes else b"B") + bytes(value)
    if value is None:
        return b"n"
    if kind is Symbol:
        return b"y" + value.qualname.encode("utf-8", "surrogatepass")
    if kind is Device:
        return b"d" + str(value).encode("utf-8", "surrogatepass")
    if kind is Attr:
        return b"a" + value.name.encode("utf-8", "surrogatepass")
    if kind is Storage:
        return b"S" + repr((value.key, value.dtype, value.location, value.numel)).encode("utf-8", "surrogatepass")
    if is_global_ref(value):
        return b"G" + value.global_name.encode("utf-8", "surrogatepass")
    return None


def _tensor_header(tensor: Tensor) -> bytes:
    storage = tensor.storage
    where = (storage.key, storage.location) if storage is not None else None
    fields = (tensor.shape, tensor.stride, tensor.offset, tensor.dtype, tensor.kind, where)
    flags = (tensor.requires_grad, tensor.parameter)
    return b"T" + repr((fields, flags)).encode("utf-8", "surrogatepass")


def _parts(value: Any) -> tuple[bytes, bool, Iterator[Any]]:
    """A container's header, whether its parts are unordered, and its parts (what it holds)."""
    if isinstance(value, dict):
        ordered = isinstance(value, LoadedOrderedDict) or type(value).__name__ == "OrderedDict"
        header = b"D" + (b"o" if ordered else b"u")

        def items() -> Iterator[Any]:
            for key, item in value.items():
                yield _Pair(key, item)
            yield getattr(value, "_metadata", None)

        return header, not ordered, items()
    if isinstance(value, TorchSize):
        return b"Z", False, iter(value)
    if isinstance(value, list):
        return b"L", False, iter(value)
    if isinstance(value, tuple):
        return b"U", False, iter(value)
    if isinstance(value, (set, frozenset)):
        return (b"E" if isinstance(value, set) else b"F"), True, iter(value)
    if isinstance(value, Tensor):
        return (
            _tensor_header(value),
            False,
            iter((value.hooks, value.metadata, value.parameter_state, value.python_type, value.python_state)),
        )
    if isinstance(value, Opaque):
        header = b"O" + repr((value.global_name, value.how)).encode("utf-8", "surrogatepass")
        parts = (value.args, value.kwargs, value.state, value.items, value.list_items, value.callee, value.from_type)
        return header, False, iter(parts)
    if isinstance(value, _Pair):
        return b"p", False, iter((value.key, value.value))
    return b"?" + type(value).__name__.encode(), False, iter(())


class _Pair:
    """A dict entry, digested as one part so that unordered dicts sort whole entries."""

    __slots__ = ("key", "value")

    def __init__(self, key: Any, value: Any) -> None:
        self.key = key
        self.value = value


def _sha256(data: bytes) -> Any:
    """A SHA-256 hasher of ``data``."""
    # imported on first use: hashlib loads OpenSSL (a hundredth of a second), and diff --stats of two state_dicts
    # digests no value at all
    import hashlib

    return hashlib.sha256(data)


class Fingerprints:
    """Digests of the values of one tree (memoized by identity: use one per tree)."""

    def __init__(self) -> None:
        self._done: dict[int, tuple[Any, bytes]] = {}

    def of(self, value: Any) -> bytes:
        """The digest of ``value``'s content."""
        scalar = _scalar(value)
        if scalar is not None:
            return _sha256(scalar).digest() if len(scalar) > 64 else scalar
        known = self._done.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
        return self._walk(value)

    def _walk(self, root: Any) -> bytes:
        on_path: dict[int, int] = {}
        # each frame: [value, header, unordered, parts, digests of the parts so far]
        frames: list[list[Any]] = []

        def enter(value: Any) -> None:
            header, unordered, parts = _parts(value)
            on_path[id(value)] = len(frames)
            frames.append([value, header, unordered, parts, []])

        enter(root)
        result = b""
        while frames:
            frame = frames[-1]
            part = next(frame[3], _END)
            if part is _END:
                frames.pop()
                value, header, unordered, _, digests = frame
                del on_path[id(value)]
                if unordered:
                    digests.sort()
                hasher = _sha256(header)
                for digest in digests:
                    hasher.update(len(digest).to_bytes(4, "little"))
                    hasher.update(digest)
                result = hasher.digest()
                if not isinstance(value, _Pair):
                    self._done[id(value)] = (value, result)
                if frames:
                    frames[-1][4].append(result)
                continue
            scalar = _scalar(part)
            if scalar is not None:
                frame[4].append(scalar)
                continue
            known = self._done.get(id(part))
            if known is not None and known[0] is part:
                frame[4].append(known[1])
            elif id(part) in on_path:
                frame[4].append(b"<" + str(len(frames) - on_path[id(part)]).encode())
            else:
                enter(part)
        return result


_END = object()


def same_value(x: Any, y: Any, left: Fingerprints | None = None, right: Fingerprints | None = None) -> bool:
    """Whether two values (from two trees) hold the same data, by content."""
    return (left or Fingerprints()).of(x) == (right or Fingerprints()).of(y)
