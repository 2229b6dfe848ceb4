"""Edits of a module group: the keys of a flat state_dict under one dotted prefix (``encoder.layers.3.``).

Each takes a tree, the path of the state_dict and the group's prefix, and returns a new tree plus a
Change, like the edits in :mod:`ckpt_tui.core.edits.tree_edits`. ``_metadata`` (torch's per-module versions) follows
the keys: its entries for the group are dropped, renamed or carried along with them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from ckpt_tui.core.edits.tree_edits import EXAMPLES, Change, Result, cast
from ckpt_tui.core.errors import EditError, NothingChanges
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.keypath import KeyPath, to_python
from ckpt_tui.core.model.rebuild import Items, rebuild
from ckpt_tui.core.model.tree import get, iter_tensors


def _where(path: KeyPath) -> str:
    return to_python(path) if path else "the root"


def _in_group(key: Any, prefix: str) -> bool:
    return isinstance(key, str) and key.startswith(prefix)


def _state_dict(root: Any, path: KeyPath, prefix: str) -> dict[Any, Any]:
    """The dict holding the group; EditError if it is not a dict or holds no key of the group."""
    if not prefix:
        raise EditError("a group needs a non-empty prefix")
    state = get(root, path)
    if not isinstance(state, dict):
        raise EditError(f"{_where(path)} is not a dict")
    if not any(_in_group(key, prefix) for key in state):
        raise EditError(f"no key of {_where(path)} starts with {prefix!r}")
    return state


def _is_group_module(name: Any, prefix: str) -> bool:
    """Whether a ``_metadata`` entry (a module name) is the group's module or inside it."""
    return isinstance(name, str) and (name == prefix.rstrip(".") or name.startswith(prefix))


def _replaced(root: Any, state: dict[Any, Any], items: Items, metadata: Any = None) -> Any:
    """A new root where the dict ``state`` holds ``items`` (and ``metadata`` as ``_metadata`` when given)."""
    rebuilt = rebuild(root, containers={id(state): lambda _: items})
    if metadata is not None:
        rebuilt.version_of(state)._metadata = metadata
    return rebuilt.root


def group_items(root: Any, path: KeyPath, prefix: str) -> list[tuple[str, Any]]:
    """The (key, value) pairs of the group, in stored order."""
    return [(key, value) for key, value in _state_dict(root, path, prefix).items() if _in_group(key, prefix)]


def group_state_dict(root: Any, path: KeyPath, prefix: str) -> OrderedDict[str, Any]:
    """The group as a state_dict of its own: keys with the prefix stripped, ``_metadata`` carried."""
    state = _state_dict(root, path, prefix)
    new: OrderedDict[str, Any] = OrderedDict(
        (key[len(prefix) :], value) for key, value in state.items() if _in_group(key, prefix)
    )
    metadata = getattr(state, "_metadata", None)
    if isinstance(metadata, dict):
        bare = prefix.rstrip(".")
        new._metadata = OrderedDict(  # type: ignore[attr-defined]
            ("" if name == bare else name[len(prefix) :], value)
            for name, value in metadata.items()
            if _is_group_module(name, prefix)
        )
    return new


def delete_group(root: Any, path: KeyPath, prefix: str) -> Result:
    """Remove every key of the group (and its ``_metadata`` entries)."""
    state = _state_dict(root, path, prefix)
    kept = [(key, value) for key, value in state.items() if not _in_group(key, prefix)]
    removed = [key for key in state if _in_group(key, prefix)]
    metadata = getattr(state, "_metadata", None)
    if isinstance(metadata, dict):
        metadata = OrderedDict((name, value) for name, value in metadata.items() if not _is_group_module(name, prefix))
    examples = [(key, "(deleted)") for key in removed[:EXAMPLES]]
    title = f"delete the {len(removed)} keys under {prefix!r} in {_where(path)}"
    return _replaced(root, state, kept, metadata), Change(title, len(removed), examples)


def extract_group(root: Any, path: KeyPath, prefix: str) -> Result:
    """Make the group the new root: a state_dict of its keys with the prefix stripped."""
    new = group_state_dict(root, path, prefix)
    tensors = sum(1 for _ in iter_tensors(new))
    return new, Change(
        f"extract the keys under {prefix!r} of {_where(path)}, prefix stripped ({counted(tensors, 'tensor')})", 1
    )


def rename_group(root: Any, path: KeyPath, prefix: str, new_prefix: str) -> Result:
    """Replace the group's prefix with ``new_prefix`` in each of its keys, keeping their places."""
    state = _state_dict(root, path, prefix)
    if new_prefix == prefix:
        raise NothingChanges(f"the prefix is already {prefix!r}")
    items: list[tuple[Any, Any]] = []
    seen: dict[Any, Any] = {}
    examples: list[tuple[str, str]] = []
    changed = 0
    for key, value in state.items():
        new_key = new_prefix + key[len(prefix) :] if _in_group(key, prefix) else key
        if new_key != key:
            changed += 1
            if len(examples) < EXAMPLES:
                examples.append((key, new_key))
        if new_key in seen:
            raise EditError(f"renaming would make {seen[new_key]!r} and {key!r} both {new_key!r}")
        seen[new_key] = key
        items.append((new_key, value))
    metadata = getattr(state, "_metadata", None)
    if isinstance(metadata, dict):
        old_bare, new_bare = prefix.rstrip("."), new_prefix.rstrip(".")
        metadata = OrderedDict(
            (_renamed_module(name, prefix, old_bare, new_prefix, new_bare), value) for name, value in metadata.items()
        )
    title = f"rename the group {prefix!r} to {new_prefix!r} in {_where(path)}"
    return _replaced(root, state, items, metadata), Change(title, changed, examples)


def _renamed_module(name: Any, prefix: str, old_bare: str, new_prefix: str, new_bare: str) -> Any:
    if not isinstance(name, str):
        return name
    if name == old_bare:
        return new_bare
    if name.startswith(prefix):
        return new_prefix + name[len(prefix) :]
    return name


def cast_group(root: Any, path: KeyPath, prefix: str, dtype: str) -> Result:
    """Cast the group's floating-point tensors to ``dtype`` (see :func:`ckpt_tui.core.edits.tree_edits.cast`)."""
    state = _state_dict(root, path, prefix)
    members = {key: value for key, value in state.items() if _in_group(key, prefix)}
    cast_members, change = cast(members, dtype)
    items = [(key, cast_members.get(key, value)) for key, value in state.items()]
    change.title = f"{change.title} under {prefix!r} in {_where(path)}"
    return _replaced(root, state, items), change
