"""Key paths: where a value sits in the tree, as a tuple of keys from the root."""

from __future__ import annotations

from dataclasses import dataclass


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
            parts.append(f"[{key!r}]")
    return "".join(parts)


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
    return str(key)


def to_json(path: KeyPath) -> list[str | int]:
    """JSON form: a list of keys from the root (ints for list indices)."""
    return [key if isinstance(key, (str, int)) and not isinstance(key, bool) else key_text(key) for key in path]
