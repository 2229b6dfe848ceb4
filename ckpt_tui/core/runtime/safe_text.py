"""Strings from a file are data: make them safe to print on a terminal.

Every key, value, global name, location tag or metadata string read from a checkpoint goes through
:func:`printable` before the CLI prints it or the TUI shows it. Control characters (ESC, BEL, C1
controls that start OSC/CSI sequences), bidirectional overrides and other invisible format
characters, line separators and lone surrogates are shown escaped (``\\x1b``, ``\\u202e``), so a file
can neither drive the terminal nor hide text behind them. Names (keys, paths) go through
:func:`printable_name`, which escapes the backslash itself as well (``\\\\``), so a key holding the text
``\\x1b`` never looks like one holding ESC.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Iterable

_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_CACHE_LIMIT = 4096
_safe_cache: dict[str, str] = {}


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` with every character that could act on a terminal shown as an escape."""
    if text.isascii() and text.isprintable():
        return text
    cached = _safe_cache.get(text)
    if cached is not None:
        return cached
    out = "".join(_escape(char) if unicodedata.category(char) in _UNSAFE_CATEGORIES else char for char in text)
    if len(_safe_cache) < _CACHE_LIMIT:
        _safe_cache[text] = out
    return out


def printable_name(text: str) -> str:
    """A name as shown: :func:`printable`, with every backslash of the name doubled first.

    Two different names never print the same (the text ``\\x1b`` is shown ``\\\\x1b``, the ESC character
    ``\\x1b``), and
    :func:`from_printable` reads either back. A line that embeds the result may go through
    :func:`printable` again: it changes nothing there.
    """
    if "\\" in text:
        text = text.replace("\\", "\\\\")
    return printable(text)


def printable_path(path: str) -> str:
    """A file's name as shown: each byte that is not UTF-8 (held by Python as the lone surrogate U+DC80-U+DCFF,
    ``os.fsdecode``) as ``\\xff``, the byte a user types in ``$'…'``; the rest as :func:`printable` shows it."""
    if path.isascii() or not any("\udc80" <= char <= "\udcff" for char in path):
        return printable(path)
    return "".join(f"\\x{ord(char) - 0xDC00:02x}" if "\udc80" <= char <= "\udcff" else printable(char) for char in path)


_OS_BYTES = re.compile("[\udc80-\udcff]")
"""The lone surrogates that hold a file name's bytes that are not UTF-8 (``os.fsdecode``'s surrogateescape)."""


def with_file_names(text: str, names: Iterable[str]) -> str:
    """``text`` (an error line) with each file name of ``names`` in it written as :func:`printable_path` writes it
    (``bad\\xff.pth``, the bytes a user types), not as the lone surrogates Python holds (``\\udcff``): the whole
    name, each of its folders' and its own name, and that name without its suffixes (``bad\\xff.fixed.pth``, a name
    a message makes from it). The rest, keys from the file among it, is left to :func:`printable`."""
    pieces = sorted({piece for name in names for piece in _name_pieces(name)}, key=len, reverse=True)
    if not pieces:
        return text
    return re.sub("|".join(map(re.escape, pieces)), lambda found: printable_path(found.group()), text)


def _name_pieces(name: str) -> list[str]:
    """The pieces of a file name an error line may hold, those with bytes that are not UTF-8."""
    if not _OS_BYTES.search(name):
        return []
    pieces = [name]
    for part in name.split(os.sep):
        pieces += (part, part.split(".", 1)[0])
    return [piece for piece in pieces if _OS_BYTES.search(piece)]


_ESCAPE = re.compile(r"\\\\|\\x([0-9a-f]{2})|\\u([0-9a-f]{4})|\\U([0-9a-f]{8})")


def _unescape(match: re.Match[str]) -> str:
    if match.group(0) == "\\\\":
        return "\\"
    char = chr(int(next(group for group in match.groups() if group), 16))
    return char if unicodedata.category(char) in _UNSAFE_CATEGORIES else match.group(0)


def from_printable(text: str) -> str:
    """The inverse of :func:`printable_name` for text typed back: ``\\x1b`` becomes ESC again, ``\\\\`` one
    backslash.

    Only the escapes ``printable_name`` writes are decoded (a character it would escape, a doubled
    backslash), so ``\\x41`` stays as typed; ``from_printable(printable_name(s)) == s`` for any ``s``.
    """
    if "\\" not in text:
        return text
    return _ESCAPE.sub(_unescape, text)
