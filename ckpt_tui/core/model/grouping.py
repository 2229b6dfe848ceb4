"""Group a flat state_dict's dotted keys by module path: ``encoder › layers › 0 › attn``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ckpt_tui.core.model.tree import Tensor


@dataclass(eq=False)
class Group:
    """A module path inside a flat state_dict, with what lies below it.

    ``entries`` holds subgroups (as Group) and leaves (as ``(full key, value)``) in first-seen order.
    """

    name: str
    prefix: str
    entries: list[Group | tuple[str, Any]] = field(default_factory=list)
    tensors: int = 0
    parameters: int = 0
    nbytes: int = 0
    _groups: dict[str, Group] = field(default_factory=dict, repr=False)

    def add(self, value: Any) -> None:
        """Count a value below this group."""
        if isinstance(value, Tensor):
            self._count(value.numel, value.nbytes)

    def _count(self, parameters: int, nbytes: int) -> None:
        self.tensors += 1
        self.parameters += parameters
        self.nbytes += nbytes


def group_keys(items: Iterable[tuple[str, Any]]) -> Group:
    """Build the module tree of a state_dict's items (``a.b.weight`` → group a › b, leaf ``a.b.weight``).

    Each tensor's element and byte counts are taken once (per shape and dtype), then added to every
    group above it: 50,000 keys cost one pass (``items`` is taken once, in order: a caller may pass a
    generator that reports how far the pass has got).
    """
    root = Group("", "")
    sizes: dict[tuple[Any, ...], tuple[int, int]] = {}
    for key, value in items:
        counts = None
        if isinstance(value, Tensor):
            layout = (value.shape, value.dtype, value.sparse is None)
            counts = sizes.get(layout) if layout[2] else None
            if counts is None:
                counts = (value.numel, value.nbytes)
                if layout[2]:
                    sizes[layout] = counts
        parts = key.split(".")
        node = root
        if counts is not None:
            node._count(*counts)
        for depth, part in enumerate(parts[:-1]):
            sub = node._groups.get(part)
            if sub is None:
                sub = node._groups[part] = Group(part, ".".join(parts[: depth + 1]) + ".")
                node.entries.append(sub)
            node = sub
            if counts is not None:
                node._count(*counts)
        node.entries.append((key, value))
    return root
