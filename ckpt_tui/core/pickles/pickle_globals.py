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

    True only when an opcode of ``data`` cannot be decoded (an unknown byte, an operand the unpickler cannot read)
    before any of :data:`CALLING_OPCODES` is read whole, and before a STOP; ``complete``: ``data`` is the whole
    input, else running out of it is doubt. Operands are decoded as ``pickletools`` decodes them, which accepts at
    least what the unpickler does (it may also fail sooner, on its stack: that only leaves more doubt here).
    """
    import pickletools  # (only for a file the readers could not read)

    opcodes = {opcode.code: opcode for opcode in pickletools.opcodes}
    stream = io.BytesIO(data)
    while True:
        code = stream.read(1)
        if not code:
            return complete  # (pickle fails at the end of its input)
        opcode = opcodes.get(code.decode("latin-1"))
        if opcode is None:
            return True
        try:
            if opcode.arg is not None:
                opcode.arg.reader(stream)
        except Exception:
            # an operand cut short by the end of what was read proves nothing about the rest of the file
            return complete or stream.tell() < len(data)
        if opcode.name in CALLING_OPCODES or opcode.name == "STOP":
            return False
