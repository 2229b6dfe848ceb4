"""A pickle assembler: values described as small nodes, written as opcodes with a chosen protocol.

Every node can be written several ways (memo or not, MARK+TUPLE or TUPLE2, GLOBAL or STACK_GLOBAL,
REDUCE or NEWOBJ or INST or OBJ...); the writer picks one with its random generator, limited to what
the protocol has. Nothing here imports torch: the bytes are all there is.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class G:
    """A global: ``module.name`` as GLOBAL (or STACK_GLOBAL) pushes it."""

    module: str
    name: str


@dataclass
class Call:
    """``func(*args)``: REDUCE, or NEWOBJ / NEWOBJ_EX / INST / OBJ when ``via`` says so."""

    func: Any
    args: Any = ()
    via: str = "reduce"


@dataclass
class Build:
    """BUILD: ``obj`` then ``state``."""

    obj: Any
    state: Any


@dataclass
class Pid:
    """A persistent id (BINPERSID, or PERSID for a text id)."""

    value: Any
    text: bool = False


@dataclass
class Shared:
    """One value referred to from several places: written once, then fetched from the memo."""

    value: Any
    key: int = field(default_factory=lambda: random.getrandbits(48))


@dataclass
class Raw:
    """Opcodes written as given (a trick the nodes cannot say: a call dropped by POP, an EXT code)."""

    code: bytes


@dataclass
class Seq:
    """Several nodes written one after the other (the last one is the value)."""

    items: list[Any]


class Writer:
    """Writes nodes as one pickle of ``protocol``; ``rng`` picks among equivalent encodings."""

    def __init__(self, protocol: int, rng: random.Random, memo_rate: float = 0.3) -> None:
        self.protocol = protocol
        self.rng = rng
        self.memo_rate = memo_rate
        self.out = bytearray()
        self.memo: dict[int, int] = {}
        self.next_memo = 0

    def dump(self, node: Any, frame: bool = False) -> bytes:
        """The whole pickle: PROTO, the value, STOP."""
        if self.protocol >= 2 or self.rng.random() < 0.1:
            self.out += b"\x80" + bytes([self.protocol])
        start = len(self.out)
        self.write(node)
        self.out += b"."
        if frame and self.protocol >= 4:
            body = bytes(self.out[start:])
            self.out[start:] = b"\x95" + struct.pack("<Q", len(body)) + body
        return bytes(self.out)

    # ---- memo ----

    def put(self) -> None:
        index = self.next_memo
        self.next_memo += 1
        self._put_index(index)

    def _put_index(self, index: int) -> None:
        choice = self.rng.random()
        if self.protocol >= 4 and choice < 0.15:
            self.out += b"\x94"  # MEMOIZE
        elif self.protocol == 0 or choice < 0.2:
            self.out += b"p%d\n" % index if self.protocol == 0 else b"r" + struct.pack("<I", index)
        elif index < 256:
            self.out += b"q" + bytes([index])
        else:
            self.out += b"r" + struct.pack("<I", index)

    def get(self, index: int) -> None:
        if self.protocol == 0:
            self.out += b"g%d\n" % index
        elif index < 256 and self.rng.random() < 0.8:
            self.out += b"h" + bytes([index])
        else:
            self.out += b"j" + struct.pack("<I", index)

    def maybe_put(self) -> None:
        if self.rng.random() < self.memo_rate:
            self.put()

    # ---- values ----

    def write(self, node: Any) -> None:
        """Push ``node``'s value."""
        kind = type(node)
        if node is None:
            self.out += b"N"
        elif kind is bool:
            self._bool(node)
        elif kind is int:
            self._int(node)
        elif kind is float:
            self.out += b"G" + struct.pack(">d", node) if self.protocol >= 1 else b"F%r\n" % node
        elif kind is str:
            self._str(node)
        elif kind is bytes:
            self._bytes(node)
        elif kind is tuple:
            self._tuple(node)
        elif kind is list:
            self._list(node)
        elif kind is dict:
            self._dict(node)
        elif kind is G:
            self._global(node)
        elif kind is Call:
            self._call(node)
        elif kind is Build:
            self.write(node.obj)
            self.write(node.state)
            self.out += b"b"
            self.maybe_put()
        elif kind is Pid:
            self._pid(node)
        elif kind is Shared:
            self._shared(node)
        elif kind is Raw:
            self.out += node.code
        elif kind is Seq:
            for item in node.items:
                self.write(item)
        else:
            raise TypeError(f"no encoding for {kind.__name__}")

    def _bool(self, value: bool) -> None:
        if self.protocol >= 2:
            self.out += b"\x88" if value else b"\x89"
        else:
            self.out += b"I01\n" if value else b"I00\n"

    def _int(self, value: int) -> None:
        if self.protocol == 0:
            self.out += b"I%d\n" % value
        elif 0 <= value < 256 and self.rng.random() < 0.8:
            self.out += b"K" + bytes([value])
        elif 0 <= value < 65536 and self.rng.random() < 0.7:
            self.out += b"M" + struct.pack("<H", value)
        elif -(1 << 31) <= value < (1 << 31) and self.rng.random() < 0.9:
            self.out += b"J" + struct.pack("<i", value)
        elif self.protocol >= 2:
            data = value.to_bytes((value.bit_length() + 8) // 8 or 1, "little", signed=True)
            self.out += b"\x8a" + bytes([len(data)]) + data
        else:
            self.out += b"L%dL\n" % value

    def _str(self, value: str) -> None:
        data = value.encode("utf-8", "surrogatepass")
        if self.protocol == 0:
            self.out += b"V" + value.encode("raw_unicode_escape") + b"\n"
        elif self.protocol >= 4 and len(data) < 256 and self.rng.random() < 0.3:
            self.out += b"\x8c" + bytes([len(data)]) + data  # SHORT_BINUNICODE
        else:
            self.out += b"X" + struct.pack("<I", len(data)) + data
        self.maybe_put()

    def _bytes(self, value: bytes) -> None:
        if self.protocol >= 3:
            if len(value) < 256:
                self.out += b"C" + bytes([len(value)]) + value
            else:
                self.out += b"B" + struct.pack("<I", len(value)) + value
        else:  # as protocol 2 pickles bytes: _codecs.encode(text, "latin1")
            self.write(Call(G("_codecs", "encode"), (value.decode("latin1"), "latin1")))
            return
        self.maybe_put()

    def _tuple(self, items: tuple[Any, ...]) -> None:
        if not items and self.protocol >= 1:
            self.out += b")"
            return
        if self.protocol >= 2 and len(items) <= 3 and self.rng.random() < 0.7:
            for item in items:
                self.write(item)
            self.out += (b"\x85", b"\x86", b"\x87")[len(items) - 1]
        else:
            self.out += b"("
            for item in items:
                self.write(item)
            self.out += b"t"
        self.maybe_put()

    def _list(self, items: list[Any]) -> None:
        if self.protocol == 0:
            self.out += b"(l"
            self.maybe_put()
            for item in items:
                self.write(item)
                self.out += b"a"
            return
        self.out += b"]"
        self.maybe_put()
        if not items:
            return
        if len(items) == 1 and self.rng.random() < 0.5:
            self.write(items[0])
            self.out += b"a"
            return
        self.out += b"("
        for item in items:
            self.write(item)
        self.out += b"e"

    def _dict(self, pairs: dict[Any, Any]) -> None:
        if self.protocol == 0:
            self.out += b"(d"
            self.maybe_put()
            for key, value in pairs.items():
                self.write(key)
                self.write(value)
                self.out += b"s"
            return
        self.out += b"}"
        self.maybe_put()
        if not pairs:
            return
        if len(pairs) == 1 and self.rng.random() < 0.5:
            ((key, value),) = pairs.items()
            self.write(key)
            self.write(value)
            self.out += b"s"
            return
        self.out += b"("
        for key, value in pairs.items():
            self.write(key)
            self.write(value)
        self.out += b"u"

    def _global(self, node: G) -> None:
        if self.protocol >= 4 and self.rng.random() < 0.3:
            self._str(node.module)
            self._str(node.name)
            self.out += b"\x93"  # STACK_GLOBAL
        else:
            self.out += b"c" + node.module.encode("utf-8", "surrogateescape") + b"\n"
            self.out += node.name.encode("utf-8", "surrogateescape") + b"\n"
        self.maybe_put()

    def _call(self, node: Call) -> None:
        args = node.args
        if node.via == "inst" and type(node.func) is G and type(args) is tuple:
            self.out += b"("
            for item in args:
                self.write(item)
            self.out += b"i" + node.func.module.encode() + b"\n" + node.func.name.encode() + b"\n"
        elif node.via == "obj" and type(args) is tuple:
            self.out += b"("
            self.write(node.func)
            for item in args:
                self.write(item)
            self.out += b"o"
        elif node.via == "newobj_ex":
            self.write(node.func)
            self.write(args)
            self.write({})
            self.out += b"\x92"
        else:
            self.write(node.func)
            self.write(args)
            self.out += b"\x81" if node.via == "newobj" else b"R"
        self.maybe_put()

    def _pid(self, node: Pid) -> None:
        if node.text and type(node.value) is str:
            self.out += b"P" + node.value.encode() + b"\n"
        else:
            self.write(node.value)
            self.out += b"Q"
        self.maybe_put()

    def _shared(self, node: Shared) -> None:
        index = self.memo.get(node.key)
        if index is not None:
            self.get(index)
            return
        self.write(node.value)
        index = self.memo[node.key] = 1_000_000 + len(self.memo) if self.protocol >= 1 else 9000 + len(self.memo)
        self._put_index(index) if self.protocol == 0 else self._long_put(index)

    def _long_put(self, index: int) -> None:
        self.out += b"r" + struct.pack("<I", index)
