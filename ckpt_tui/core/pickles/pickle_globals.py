"""The globals a pickle names, read from its opcodes alone (nothing is built, nothing is resolved).

Used when the reader refuses a pickle's structure: a file whose pickle names ``posix.system`` is
called unsafe even though its tree cannot be shown, since ``torch.load(weights_only=False)`` would
run what the reader refused to build.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any, BinaryIO

MAX_OPCODES = 10_000_000
_STRINGS = frozenset(
    {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}
)
_PY2_STRINGS = frozenset({"SHORT_BINSTRING", "BINSTRING", "STRING"})
"""Byte strings pickletools gives as latin-1 text, which torch.load's unpickler decodes as UTF-8."""
_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_QUIET = frozenset({"PROTO", "FRAME", "MARK"})


def _py2_as_utf8(text: str) -> str:
    """A py2 str as torch.load reads it (``encoding="utf-8"``); bytes that are not UTF-8 (a load that fails)
    kept visible as escapes."""
    return text.encode("latin-1").decode("utf-8", "backslashreplace")


def named_globals(data: bytes | BinaryIO) -> Iterator[tuple[str, str]]:
    """``(module, name)`` of every GLOBAL, INST and STACK_GLOBAL whose operands are strings, in order.

    Stops at the pickle's end, at the first opcode that cannot be decoded, or after :data:`MAX_OPCODES`.
    A ``STACK_GLOBAL`` is matched with the two values pushed just before it (memo fetches included).
    """
    import pickletools  # (only for a pickle the reader refused: not imported to read a file)

    stream = io.BytesIO(data) if isinstance(data, bytes) else data
    pushed: list[Any] = []
    memo: dict[Any, Any] = {}
    opcodes = pickletools.genops(stream)
    for _ in range(MAX_OPCODES):
        try:
            opcode, arg, _position = next(opcodes)
        except StopIteration:
            return
        except Exception:  # a corrupt opcode: what came before is all there is
            return
        name = opcode.name
        if name in ("GLOBAL", "INST") and isinstance(arg, str):
            module, _, attribute = arg.partition(" ")
            yield module, attribute
        elif name == "STACK_GLOBAL" and len(pushed) >= 2:
            module, attribute = pushed[-2], pushed[-1]
            if isinstance(module, str) and isinstance(attribute, str):
                yield module, attribute
        if name in _STRINGS:
            pushed.append(_py2_as_utf8(arg) if name in _PY2_STRINGS and isinstance(arg, str) else arg)
        elif name in _GETS:
            pushed.append(memo.get(arg))
        elif name in _PUTS:
            memo[arg] = pushed[-1] if pushed else None
        elif name == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif name not in _QUIET:
            pushed.append(None)
        del pushed[:-2]


CALLING_OPCODES = frozenset(
    {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX", "BUILD", "EXT1", "EXT2", "EXT4"}
)
"""The opcodes with which an unpickler imports or calls something (a name it resolves, a class it builds)."""


def fails_before_calling(data: bytes, complete: bool) -> bool:
    """Whether ``pickle.load`` on bytes starting with ``data`` surely fails before it imports or calls anything.

    True only when the unpickler fails before any of :data:`CALLING_OPCODES` runs, and before a STOP: an opcode
    of ``data`` cannot be decoded (an unknown byte, an operand it cannot read), or its stack, marks or memo do
    not hold what an opcode needs (``hello``: BINGET of a memo entry never put; ``import torch``: INST with no
    MARK), as :class:`_Stack` follows them; ``complete``: ``data`` is the whole input, else running out of it is
    doubt. Operands are decoded as ``pickletools`` decodes them, which accepts at least what the unpickler does.
    """
    import pickletools  # (only for a file the readers could not read)

    opcodes = {opcode.code: opcode for opcode in pickletools.opcodes}
    stream = io.BytesIO(data)
    stack = _Stack()
    while True:
        code = stream.read(1)
        if not code:
            return complete  # (pickle fails at the end of its input)
        opcode = opcodes.get(code.decode("latin-1"))
        if opcode is None:
            return True
        if opcode.name in _MARK_FIRST and stack.following and not stack.marks:
            return True  # (the unpickler looks for the MARK before it reads the operands)
        try:
            arg = opcode.arg.reader(stream) if opcode.arg is not None else None
        except Exception:
            # an operand cut short by the end of what was read proves nothing about the rest of the file
            return complete or stream.tell() < len(data)
        if stack.fails(opcode.name, arg):
            return True
        if opcode.name in CALLING_OPCODES or opcode.name == "STOP":
            return False


_MARK_FIRST = frozenset({"INST", "OBJ"})
_PUSH = frozenset(
    {
        *("INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT"),
        *("STRING", "BINSTRING", "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8"),
        *("UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "NONE", "NEWTRUE", "NEWFALSE"),
        *("EMPTY_TUPLE", "EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET"),
    }
)
"""Opcodes that push one value and need nothing of the stack."""
_NEEDS = {"REDUCE": 2, "BUILD": 2, "NEWOBJ": 2, "NEWOBJ_EX": 3, "STACK_GLOBAL": 2, "STOP": 1}
"""Opcodes that run or import (or end the pickle), with the values above the last MARK each pops first: fewer is
a stack underflow before anything is called."""
_NO_LOADER = frozenset({"PERSID", "BINPERSID", "NEXT_BUFFER"})
"""Opcodes ``pickle.load`` (no ``persistent_load``, no ``buffers``) refuses whatever the stack holds."""
_COLLAPSE = frozenset({"TUPLE", "LIST", "DICT", "FROZENSET"})


class _Stack:
    """How many values the unpickler's stack holds, where its MARKs are and which memo entries are set: what
    ``_pickle.c`` checks before an opcode acts (underflow below the last MARK, a missing MARK, a memo entry never
    put). An opcode it does not follow ends the following: from there on nothing fails here."""

    def __init__(self) -> None:
        self.depth = 0
        self.marks: list[int] = []
        self.memo: set[Any] = set()
        self.following = True

    @property
    def fence(self) -> int:
        return self.marks[-1] if self.marks else 0

    def fails(self, name: str, arg: Any) -> bool:
        """Whether ``name`` (with its operand ``arg``) fails on the stack as it is; else its effect is taken."""
        if not self.following or name in ("PROTO", "FRAME"):
            return False
        if name in _NO_LOADER:
            return True
        if name in _PUSH:
            self.depth += 1
        elif name in _NEEDS:
            return self.depth - self.fence < _NEEDS[name]
        elif name == "MARK":
            self.marks.append(self.depth)
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            if arg not in self.memo:
                return True
            self.depth += 1
        elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            if self.depth <= self.fence or (isinstance(arg, int) and arg < 0):
                return True
            self.memo.add(len(self.memo) if name == "MEMOIZE" else arg)
        else:
            return self._changes(name)
        return False

    def _changes(self, name: str) -> bool:
        """The opcodes that take values or MARKs off the stack."""
        if name == "POP":
            if self.marks and self.marks[-1] == self.depth:
                self.marks.pop()
            elif self.depth <= self.fence:
                return True
            else:
                self.depth -= 1
        elif name == "DUP":
            if self.depth <= self.fence:
                return True
            self.depth += 1
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            taken = int(name[-1])
            if self.depth - taken < self.fence:
                return True
            self.depth -= taken - 1
        elif name in ("APPEND", "SETITEM"):
            # (the list or dict below the values: at least one more)
            taken = 1 if name == "APPEND" else 2
            if self.depth <= taken:
                return True
            self.depth -= taken
        elif name in _COLLAPSE or name in ("POP_MARK", "APPENDS", "SETITEMS", "ADDITEMS", "INST", "OBJ"):
            return self._to_mark(name)
        else:
            self.following = False
        return False

    def _to_mark(self, name: str) -> bool:
        """An opcode that takes every value down to the last MARK (and the MARK)."""
        if not self.marks:
            return True
        mark = self.marks.pop()
        if name in ("DICT", "SETITEMS") and (self.depth - mark) % 2:
            return True  # (an odd number of items for a dict)
        if name in ("APPENDS", "SETITEMS", "ADDITEMS") and mark <= 0:
            return True  # (no list, dict or set below the MARK)
        if name == "OBJ" and self.depth - mark < 1:
            return True  # (no class above the MARK)
        self.depth = mark + (1 if name in _COLLAPSE or name == "INST" else 0)
        return False
