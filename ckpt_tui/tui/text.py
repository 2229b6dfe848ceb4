"""Strings from a file, made inert for the screen.

Every key, value, global name, location tag, metadata entry or error message that quotes them goes
through here before a widget sees it: control characters are shown escaped (``\\x1b``) by
:func:`ckpt_tui.core.runtime.safe_text.printable`, and the result is a ``rich.text.Text`` (or a string for a
``markup=False`` surface), never a markup string, so ``[/data]`` or ``[@click=...]`` is shown as written.
"""

from __future__ import annotations

import re
import shlex

from rich.text import Text

from ckpt_tui.core.model.keypath import KeyPath, to_python
from ckpt_tui.core.runtime.safe_text import printable


def safe(value: object) -> str:
    """``str(value)`` with control characters escaped; for surfaces that take plain text (``markup=False``)."""
    return printable(str(value))


def data(value: object, style: str = "") -> Text:
    """Text from the file, as a ``Text`` that no widget parses as markup."""
    return Text(printable(str(value)), style=style)


def path_text(path: KeyPath) -> str:
    """A key path as Python (``ckpt["model"]["fc.weight"]``; ``ckpt`` for the root), escaped."""
    return printable(to_python(path))


def broken(text: str, width: int) -> str:
    """``text`` in lines of at most ``width``, broken after a key (``]``) or a space, else after a ``.`` or ``/`` of
    one, and only where none comes late enough, inside a word (a key path has no spaces for the terminal to wrap
    at)."""
    if width < 8:
        return text
    lines = []
    while len(text) > width:
        head = text[:width]
        marks = ("]", " ", ".", "/")
        cut = next((head.rfind(mark) + 1 for mark in marks if head.rfind(mark) + 1 > width // 2), width)
        lines.append(text[:cut])
        text = text[cut:]
    return "\n".join([*lines, text])


def where(path: KeyPath) -> str:
    """A key path for a sentence: ``ckpt["model"]``, or ``the root``."""
    return path_text(path) if path else "the root"


def joined(*parts: tuple[str, str] | str) -> Text:
    """A Text from plain parts and ``(text, style)`` pairs; the texts must already be escaped."""
    out = Text()
    for part in parts:
        if isinstance(part, tuple):
            out.append(part[0], style=part[1])
        else:
            out.append(part)
    return out


COMMAND = re.compile(r"\((?P<command>(?:curl|wget|ckpt-tui|pip install) [^()]*)\)")
"""A shell command an error message gives in parentheses (``download it first (curl -LO URL)``)."""


def command_in(message: str) -> tuple[str, str | None]:
    """An error message with the first command it gives taken out (said to be below), and that command."""
    found = COMMAND.search(message)
    if found is None:
        return message, None
    return message[: found.start()] + "(the command below)" + message[found.end() :], found.group("command")


def continued(command: str, width: int = 68) -> str:
    """A shell command in lines of at most ``width`` (an argument longer stands alone), each but the last ended
    with `` \\``: the lines, copied from the terminal as they are, are still the one command."""
    try:
        words = shlex.split(command)
    except ValueError:
        return command
    quoted = [shlex.quote(word) for word in words]
    if " ".join(quoted) != command:
        return command  # (quoted otherwise than shlex would: shown as it is)
    lines: list[str] = []
    for word in quoted:
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return " \\\n".join(lines)
