"""Group a flat state_dict's dotted keys by module path: ``encoder › layers › 0 › attn``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ckpt_tui.core.tree import Tensor


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
            self.tensors += 1
            self.parameters += value.numel
            self.nbytes += value.nbytes


def group_keys(items: list[tuple[str, Any]]) -> Group:
    """Build the module tree of a state_dict's items (``a.b.weight`` → group a › b, leaf ``a.b.weight``)."""
    root = Group("", "")
    for key, value in items:
        parts = key.split(".")
        node = root
        node.add(value)
        for depth, part in enumerate(parts[:-1]):
            sub = node._groups.get(part)
            if sub is None:
                sub = node._groups[part] = Group(part, ".".join(parts[: depth + 1]) + ".")
                node.entries.append(sub)
            node = sub
            node.add(value)
        node.entries.append((key, value))
    return root
