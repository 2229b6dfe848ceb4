"""A prefix taken off or put on every key at once, and whether a strip surely succeeds: what ``info``'s
fix line asks of a file, without the edits' machinery (:mod:`ckpt_tui.core.edits.tree_edits` runs them)."""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass
from typing import Any

from ckpt_tui.core.conventions.state_dicts import tensor_items
from ckpt_tui.core.model.tree import Opaque


def strips_cleanly(root: Any, prefix: str) -> bool:
    """Whether :func:`~ckpt_tui.core.edits.tree_edits.strip_prefix` of ``prefix`` succeeds on a root
    state_dict, known without running it: every key is a str that starts with the prefix and is longer
    (then no two keys become one)."""
    if not prefix or prefix == "auto" or not isinstance(root, dict) or _is_module(root):
        return False
    return tensor_items(root) is not None and KeyRenamer(strip=prefix).renames_every(list(root))


def _is_module(value: Any) -> bool:
    return isinstance(value, Opaque) and value.is_module


@dataclass(frozen=True)
class KeyRenamer:
    """A prefix taken off (the keys that start with it and are longer) or put on (every str key)."""

    strip: str = ""
    add: str = ""

    def all(self, keys: list[Any], every: bool) -> list[Any]:
        """The new name of every key, in one pass (50,000 keys without a call per key); ``every``:
        what :meth:`renames_every` says of them."""
        cut, head = self.strip, self.add
        n = len(cut)
        if every:  # the common case, at C speed
            if cut:
                return list(map(operator.getitem, keys, itertools.repeat(slice(n, None))))
            return list(map(head.__add__, keys))
        if cut:
            return [k[n:] if isinstance(k, str) and k.startswith(cut) and len(k) > n else k for k in keys]
        return [head + k if isinstance(k, str) else k for k in keys]

    def renames_every(self, keys: list[Any]) -> bool:
        """Whether every key is a str that gets a new name: then no two get the same one (a prefix
        taken off every key, or put on every key, keeps distinct keys distinct)."""
        if not keys or set(map(type, keys)) != {str}:
            return False
        cut = self.strip
        if not cut:
            return True
        # str keys that start with one text lie between the smallest and the largest of them, which both
        # start with it; a key that is the text itself is the smallest (two C passes, no call per key)
        low = min(keys)
        return low.startswith(cut) and max(keys).startswith(cut) and len(low) > len(cut)
