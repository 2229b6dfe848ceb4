"""Commands ckpt-tui prints for the user to paste: every argument quoted so that pasting runs exactly
one ``ckpt-tui`` command with exactly these arguments, whatever the file's key names hold.

Plain text is quoted with :func:`shlex.quote`. Text holding characters that must not reach a
terminal (ESC, newlines, bidi overrides: whatever :func:`~ckpt_tui.core.runtime.safe_text.printable` would
escape) is written in bash's ANSI-C quoting, ``$'…\\x1b…'``, with those characters as ``\\xHH``
escapes of their UTF-8 bytes: the printed line stays inert on screen, and bash and zsh rebuild the
exact bytes when it is pasted. A file's name is an :class:`OsPath`: its bytes that are not UTF-8 (which Python
holds as lone surrogates, ``surrogateescape``) are written as those very bytes (``$'bad\\xff.pth'``), so the
pasted command names the same file; a key's lone surrogate is written as its UTF-8 (``surrogatepass``) bytes,
which :func:`from_argv` reads back. An option whose value starts with ``-`` is written ``--opt=value``
and a path that starts with ``-`` as ``./-path``, so neither can be read as an option.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from ckpt_tui.core.runtime.safe_text import printable


class OsPath(str):
    """A file's name as the OS gave it: a byte that is not UTF-8 is the lone surrogate U+DC80-U+DCFF
    (``os.fsdecode``), quoted as that byte."""


def quote_arg(text: str) -> str:
    """One shell word that stands for exactly ``text`` (for an :class:`OsPath`, exactly its bytes)."""
    if printable(text) == text:
        return shlex.quote(text)
    os_name = isinstance(text, OsPath)
    return "$'" + "".join(_ansi_c_char(char, os_name) for char in text) + "'"


def _ansi_c_char(char: str, os_name: bool = False) -> str:
    if os_name and 0xDC80 <= ord(char) <= 0xDCFF:
        # the byte the OS gave, which Python's surrogateescape held as this lone surrogate
        return f"\\x{ord(char) - 0xDC00:02x}"
    if char == "\\":
        return "\\\\"
    if char == "'":
        return "\\'"
    if char == "!":  # never history expansion, whatever the shell's settings
        return "\\x21"
    if printable(char) == char:
        return char
    data = char.encode("utf-8", "surrogatepass")
    return "".join(f"\\x{byte:02x}" for byte in data)


def join_command(argv: Iterable[str]) -> str:
    """A command line from its arguments, each quoted.

    No command line can hold a NUL character (the shell and the kernel end an argument there): a
    command that needs one is printed as a shell comment that says so, which does nothing if pasted.
    """
    args = list(argv)
    if any("\x00" in arg for arg in args):
        return "# no shell command can pass a key holding a NUL character (\\x00): rename that key first"
    return " ".join(quote_arg(arg) for arg in args)


def from_argv(text: str) -> str:
    """A key as typed on the command line, as the file holds it.

    Python decodes command-line bytes that are not UTF-8 as lone surrogates (``surrogateescape``);
    :func:`quote_arg` writes a key holding a lone surrogate (as pickles may) as its UTF-8 bytes, so
    those bytes are read back as that surrogate here. Any other text is returned as it is.
    """
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "surrogatepass")
    except UnicodeError:
        return text


def option(name: str, value: str) -> list[str]:
    """``--name value``, or ``--name=value`` when the value could be taken for an option."""
    if value.startswith("-") or not value:
        joined = f"{name}={value}"
        return [OsPath(joined) if isinstance(value, OsPath) else joined]
    return [name, value]


def path_arg(path: str) -> OsPath:
    """A positional path that cannot be taken for an option, quoted from the OS's bytes."""
    return OsPath("./" + path if path.startswith("-") else path)
