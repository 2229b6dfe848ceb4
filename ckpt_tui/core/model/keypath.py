"""Key paths: where a value sits in the tree, as a tuple of keys from the root."""

from __future__ import annotations

import base64
import math
import os
import types
from dataclasses import dataclass
from typing import Any

from ckpt_tui.core.runtime.safe_text import printable_path


@dataclass(frozen=True, slots=True)
class Attr:
    """An attribute step: a module's parameter/submodule, or an object's pickled state entry."""

    name: str


Key = str | int | Attr | object
KeyPath = tuple[Key, ...]


def to_python(path: KeyPath, root: str = "ckpt") -> str:
    """Render as Python that reaches the value: ``ckpt["model"]["module.fc.weight"]``."""
    parts = [root]
    for key in path:
        if isinstance(key, Attr):
            parts.append(f".{key.name}" if key.name.isidentifier() else f"[{key.name!r}]")
        elif isinstance(key, str):
            parts.append("[" + _quote(key) + "]")
        else:
            parts.append(f"[{_named(key) or repr(key)}]")
    return "".join(parts)


def _named(key: object) -> str | None:
    """The global a function or class used as a key stands for (``torch._utils._rebuild_tensor_v2``):
    shown by name, never as a repr with a memory address; None for any other key."""
    if isinstance(key, (types.FunctionType, type)):
        name = getattr(key, "global_name", None)
        return name if isinstance(name, str) else None
    return None


def _quote(text: str) -> str:
    """Double-quoted Python string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_slash(path: KeyPath) -> str:
    """Render as the CLI's ``/``-separated form: ``model/module.fc.weight``."""
    return "/".join(key_text(key) for key in path)


def key_text(key: Key) -> str:
    """One key as plain text."""
    if isinstance(key, Attr):
        return key.name
    return _named(key) or str(key)


def to_json(path: KeyPath) -> list[Any]:
    """JSON form: a list of keys from the root: a str key as a string, an int (a list index or an int key) as
    a number; ``None``, a bool and a float key as JSON's null, true/false and number; a module's attribute as
    its name; any other key (bytes, a tuple, a str holding lone surrogates) as ``{"repr": "b'x'"}``. Two keys of
    one dict never share a form (``None`` and ``'None'`` are ``null`` and ``"None"``)."""
    return [_json_key(key) for key in path]


def _json_key(key: Key) -> Any:
    if isinstance(key, str) and not is_unicode(key):
        # JSON's "\ud83d\ude00" decodes to the pair's one character: the repr keeps '\ud83d\ude00' apart from '😀'
        return {"repr": repr(key)}
    if isinstance(key, (str, int, float)) or key is None:
        # (bool is an int: JSON's true and false keep it apart from 1 and 0)
        return key if not isinstance(key, float) or math.isfinite(key) else {"repr": repr(key)}
    if isinstance(key, Attr):
        return key.name
    return {"repr": _named(key) or repr(key)}


def is_unicode(text: str) -> bool:
    """Whether ``text`` is valid Unicode (holds no lone surrogate, which UTF-8 cannot encode, nor a pybind11
    argument take, nor strict JSON hold)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def json_text(text: str) -> str:
    """Prose for a JSON document: each lone surrogate written as its escape (``\\udcc3``, as a key's
    ``repr`` shows it), since strict JSON parsers refuse a lone ``\\udcc3`` escape."""
    return text if is_unicode(text) else text.encode("utf-8", "backslashreplace").decode("utf-8")


def file_path_json(path: str | list[str], field: str = "path") -> dict[str, Any]:
    """A file's ``path`` (or ``field``) for a JSON document: the name as it is; a name that is not UTF-8 (bytes
    Python holds as lone surrogates) as shown in text lines (``bad\\xff.pth``) with ``path_bytes`` beside it,
    the exact name in base64 (as ripgrep's ``--json`` gives such a name), from which a consumer gets the file back.
    A list of names: a list each, ``path_bytes`` for all of them when one is not UTF-8."""
    names = [path] if isinstance(path, str) else path
    if all(is_unicode(name) for name in names):
        return {field: path}
    shown = [printable_path(name) for name in names]
    exact = [base64.b64encode(os.fsencode(name)).decode("ascii") for name in names]
    if isinstance(path, str):
        return {field: shown[0], f"{field}_bytes": exact[0]}
    return {field: shown, f"{field}_bytes": exact}


def glob_escape(text: str) -> str:
    """``text`` as a glob that matches only itself."""
    return "".join(f"[{c}]" if c in "*?[]" else c for c in text)
