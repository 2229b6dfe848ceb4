"""What a tree line stands for when a key acts on it, and where the cursor goes after an edit.

A line is a value at a path, or a module group (the keys of a state_dict under one prefix). Edits
act on exactly that: never on the parent of a group. After an edit renames or moves keys, the
``Relocate`` functions here map the lines the user had open to where they are now.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ckpt_tui.core.conventions.state_dicts import tensor_items
from ckpt_tui.core.edits import tree_edits as edits
from ckpt_tui.core.model.keypath import KeyPath
from ckpt_tui.core.model.tree import Opaque, get
from ckpt_tui.tui.text import data, where

RowId = tuple[KeyPath, str | None]
Relocate = Callable[[RowId], RowId]


@dataclass(frozen=True)
class Target:
    """A value's path, or a module group: the state_dict's path and the group's prefix."""

    path: KeyPath
    prefix: str | None = None

    @property
    def is_group(self) -> bool:
        """Whether this is a module group."""
        return self.prefix is not None

    @property
    def row(self) -> RowId:
        """The tree line it is."""
        return (self.path, self.prefix)

    def describe(self) -> str:
        """``ckpt["model"]`` or ``the group 'encoder.' of ckpt["model"]`` (escaped)."""
        if self.prefix is not None:
            return f"the group {data(repr(self.prefix)).plain} of {where(self.path)}"
        return where(self.path)


KNOWN_DICTS = 16
"""How many dicts :func:`is_state_dict` remembers (the current tree's and those of the last edits)."""
_known: dict[int, tuple[Any, bool]] = {}
_known_lock = threading.Lock()


def is_state_dict(value: Any) -> bool:
    """Whether ``value`` is a dict that key edits act on (a state_dict), remembered per dict object.

    Trees are never changed in place (an edit builds a new one), so the answer holds while the dict lives;
    the summary's worker asks first of a big root, so that ``p`` does not look at 50,000 values on the UI
    thread.
    """
    if not isinstance(value, dict):
        return False
    known = _known.get(id(value))
    if known is not None and known[0] is value:
        return known[1]
    answer = tensor_items(value) is not None
    with _known_lock:  # the summary's worker and the UI thread both ask
        if len(_known) >= KNOWN_DICTS:
            _known.pop(next(iter(_known)))
        # the dict is held with its answer: its id is not reused while it is here
        _known[id(value)] = (value, answer)
    return answer


def state_dict_at(root: Any, path: KeyPath) -> KeyPath:
    """The state_dict a key edit applies to: the one at ``path``, the one holding it, or the detected one."""
    for depth in range(len(path), -1, -1):
        if is_state_dict(get(root, path[:depth])):
            return path[:depth]
    return edits.default_target(root)


def container_at(root: Any, path: KeyPath) -> KeyPath:
    """What compare looks at: the dict or module at ``path`` or holding it, else the root."""
    for depth in range(len(path), -1, -1):
        value = get(root, path[:depth])
        if isinstance(value, dict) or (isinstance(value, Opaque) and value.is_module):
            return path[:depth]
    return ()


# ---- where lines go after an edit ----------------------------------------------------------


def keep(row: RowId) -> RowId:
    """Lines stay where they are (the tree falls back to the nearest ancestor still there)."""
    return row


def renamed_keys(dict_path: KeyPath, rename: Callable[[str], str | None]) -> Relocate:
    """Lines at or below a renamed key of the dict at ``dict_path`` follow the new name."""
    depth = len(dict_path)

    def relocate(row: RowId) -> RowId:
        path, prefix = row
        key = path[depth] if len(path) > depth else None
        if path[:depth] == dict_path and isinstance(key, str):
            new = rename(key)
            if new is not None:
                return ((*dict_path, new, *path[depth + 1 :]), prefix)
        if path == dict_path and prefix is not None:
            new = rename(prefix)
            if new is not None:
                return (path, new)
        return row

    return relocate


def extracted(subtree: KeyPath) -> Relocate:
    """Lines below an extracted subtree lose its path; lines outside it go to the new root."""
    depth = len(subtree)

    def relocate(row: RowId) -> RowId:
        path, prefix = row
        if path[:depth] == subtree:
            return (path[depth:], prefix)
        return ((), None)

    return relocate


def extracted_group(dict_path: KeyPath, group_prefix: str) -> Relocate:
    """Lines in an extracted group become top-level keys (the prefix stripped)."""
    depth = len(dict_path)

    def relocate(row: RowId) -> RowId:
        path, prefix = row
        if path == dict_path and prefix is not None and prefix.startswith(group_prefix) and prefix != group_prefix:
            return ((), prefix[len(group_prefix) :])
        if len(path) > depth and path[:depth] == dict_path:
            key = path[depth]
            if isinstance(key, str) and key.startswith(group_prefix):
                return ((key[len(group_prefix) :], *path[depth + 1 :]), prefix)
        return ((), None)

    return relocate


def deleted(target: Target) -> Relocate:
    """Lines in a deleted key or group go to the line that held it (the enclosing group, when grouped)."""
    depth = len(target.path)
    if target.prefix is None:
        parent = target.path[:-1]
        key = target.path[-1] if target.path else None
        holder: RowId = (parent, _enclosing_group(key) if isinstance(key, str) else None)
    else:
        holder = (target.path, _enclosing_group(target.prefix.rstrip(".")))

    def relocate(row: RowId) -> RowId:
        path, prefix = row
        if target.prefix is None:
            return holder if path[:depth] == target.path else row
        inside = path == target.path and prefix is not None and prefix.startswith(target.prefix)
        key = path[depth] if len(path) > depth else None
        below = path[:depth] == target.path and isinstance(key, str) and key.startswith(target.prefix)
        return holder if inside or below else row

    return relocate


def _enclosing_group(key: str) -> str | None:
    """The module group a dotted key sits in: ``encoder.layers.3.attn.weight`` → ``encoder.layers.3.attn.``."""
    head, dot, _ = key.rpartition(".")
    return head + dot if dot else None
