"""Short human text for values and sizes, shared by the CLI and the TUI."""

from __future__ import annotations

import re
import reprlib
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import humanize

from ckpt_tui.core.model.numpy_values import numpy_value
from ckpt_tui.core.model.tree import (
    Device,
    Opaque,
    Symbol,
    Tensor,
    TorchSize,
    children,
    has_children,
    is_global_ref,
    type_label,
    view_key,
)


class _BoundedRepr(reprlib.Repr):
    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 4000:  # str() raises past 4,300 digits; such an int is never worth printing
            return f"<int of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_REPR = _BoundedRepr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 3, 8, 8, 6
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 80, 80, 40


def short_repr(value: Any) -> str:
    """``repr`` bounded in depth and length, whatever a hostile file nests."""
    return _REPR.repr(value)


def size(nbytes: int) -> str:
    """Bytes as ``97.5 MB`` (decimal units, as file managers show); under a kilobyte ``36 B``."""
    # (humanize writes "36 Bytes" and "1 Byte": a unit unlike every other size shown beside it)
    if 0 <= nbytes < 1000:
        return f"{nbytes} B"
    return humanize.naturalsize(nbytes, format="%.1f")


def count(number: int) -> str:
    """A count as ``25.6M``."""
    if number < 10_000:
        return str(number)
    return humanize.metric(number, precision=3).replace(" ", "")


def counted(number: int, noun: str) -> str:
    """``1 tensor``, ``2 tensors``: a count and its noun, plural unless the count is one."""
    return f"{number} {plural(number, noun)}"


_NUMBERED = re.compile(r"(.*?)(\d+)-of-(\d+)(.*)", re.DOTALL)
FOLDED_FROM = 3
"""Numbered names (``model-00001-of-00009.safetensors`` …) are folded from this many on."""


def folded_names(names: list[str]) -> str:
    """Names joined by ", "; a run numbered 1…N of N (save_pretrained's shards), in order, as its brace expansion,
    ``model-{00001..00009}-of-00009.safetensors`` (what bash expands back to the names)."""
    found = [_NUMBERED.fullmatch(name) for name in names]
    if len(names) < FOLDED_FROM or any(match is None for match in found):
        return ", ".join(names)
    parts = [match.groups() for match in found if match is not None]
    prefix, first, total, suffix = parts[0]
    width = len(first)
    same = all((p[0], p[2], p[3], len(p[1])) == (prefix, total, suffix, width) for p in parts)
    if not same or [int(p[1]) for p in parts] != list(range(1, len(names) + 1)) or int(total) != len(names):
        return ", ".join(names)
    return f"{prefix}{{{parts[0][1]}..{parts[-1][1]}}}-of-{total}{suffix}"


def plural(number: int, noun: str) -> str:
    """``noun`` for one, its plural for any other count (a count written another way goes before it): ``tensors``,
    ``prefixes``, ``entries``."""
    if number == 1:
        return noun
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2:-1] not in ("a", "e", "i", "o", "u"):
        return noun[:-1] + "ies"
    return noun + "s"


def shape(dims: tuple[int, ...]) -> str:
    """A shape as ``[64, 3, 7, 7]``."""
    return "[" + ", ".join(str(d) for d in dims) + "]"


@dataclass
class Totals:
    """What a container holds: tensors, parameters and bytes below it."""

    tensors: int = 0
    parameters: int = 0
    nbytes: int = 0

    def add(self, other: Totals) -> None:
        """Add another container's totals to these."""
        self.tensors += other.tensors
        self.parameters += other.parameters
        self.nbytes += other.nbytes


class TreeTotals:
    """Totals below every container of one tree, from one walk of it.

    Each tensor object counts once, in the first container (depth first, in stored order) where it is
    reached; each container is walked once. For a tree that is exactly what lies below each container;
    with shared objects every count stays bounded by the file (never multiplied by the paths to a
    shared list), and the root's totals equal the file's distinct tensors.
    """

    def __init__(self, root: Any) -> None:
        self._found: dict[int, tuple[Any, Totals]] = {}
        counted: set[tuple[Any, ...]] = set()
        frames: list[tuple[Any, Iterator[tuple[Any, Any]], Totals]] = [(root, children(root), Totals())]
        self._found[id(root)] = (root, frames[0][2])
        while frames:
            _, kids, found = frames[-1]
            step = next(kids, None)
            if step is None:
                frames.pop()
                if frames:
                    frames[-1][2].add(found)
                continue
            kid = step[1]
            if isinstance(kid, Tensor):
                if view_key(kid) not in counted:  # tied weights: one set of values under two names
                    counted.add(view_key(kid))
                    found.tensors += 1
                    found.parameters += kid.numel
                    found.nbytes += kid.nbytes
            elif id(kid) not in self._found and has_children(kid):
                below = Totals()
                self._found[id(kid)] = (kid, below)
                frames.append((kid, children(kid), below))

    def of(self, value: Any) -> Totals:
        """Totals below ``value``: from this tree when it is in it, else from a walk of ``value`` alone."""
        if isinstance(value, Tensor):
            return Totals(1, value.numel, value.nbytes)
        found = self._found.get(id(value))
        if found is not None and found[0] is value:
            return found[1]
        return TreeTotals(value).of(value) if has_children(value) else Totals()


def totals(value: Any) -> Totals:
    """Tensors, parameters and bytes below a value (each tensor object once; one walk of ``value``)."""
    return TreeTotals(value).of(value)


def tensor_text(tensor: Tensor) -> str:
    """``[64, 3, 7, 7] float32 cuda:0 36.9 kB``."""
    return f"{shape(tensor.shape)} {tensor.dtype} {tensor.device} {size(tensor.nbytes)}"


def scalar_text(value: Any, limit: int = 60) -> str:
    """A leaf value in one line, cut to ``limit`` characters."""
    if isinstance(value, Symbol):
        text = value.qualname
    elif isinstance(value, Device):
        text = f"torch.device({str(value)!r})"
    elif isinstance(value, TorchSize):
        text = f"torch.Size({list(value)})"
    elif isinstance(value, Opaque):
        found = numpy_value(value)
        if found is not None:
            text = found.text()
        else:
            args = ", ".join(scalar_text(a, 40) for a in value.args)
            text = f"{value.global_name}({args})" + ("" if value.safe else "  [not executed]")
    elif is_global_ref(value):
        text = type_label(value) + ("" if value.safe else "  [not executed]")
    elif isinstance(value, bytes):
        text = f"{len(value)} bytes"
    elif isinstance(value, types.FunctionType):  # a stand-in (torch._utils._rebuild_tensor_v2 as a value)
        text = getattr(value, "global_name", value.__name__)
    else:
        text = short_repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def opens(value: Any) -> bool:
    """Whether a value is shown with its children below it: a container or a recorded object, but not a numpy
    array or scalar (its line says what it is: the pickled call that makes it is numpy's business)."""
    return has_children(value) and numpy_value(value) is None


def elements_text(number: int) -> str:
    """What a container's total counts, named: every element of every tensor below it (parameters,
    buffers and optimizer state alike), ``2.09M elements``; ``info`` splits the file's total by kind."""
    return f"{count(number)} elements"


def container_text(value: Any, found: Totals) -> str:
    """A container's text after its key: type, children, and ``found``, the totals below it."""
    kids = len(value) if isinstance(value, dict) else sum(1 for _ in children(value))  # a dict shows each item
    extra = (
        f" · {counted(found.tensors, 'tensor')} · {elements_text(found.parameters)} · {size(found.nbytes)}"
        if found.tensors
        else ""
    )
    return f"{type_label(value)} ({kids}){extra}"


def value_text(value: Any, tree_totals: TreeTotals | None = None) -> str:
    """The text after a key in the tree: type and, for tensors, shape/dtype/device/size.

    Pass the :class:`TreeTotals` of the whole tree when labelling many of its nodes (one walk in all).
    """
    if isinstance(value, Tensor):
        return f"{type_label(value)} {tensor_text(value)}"
    found = numpy_value(value)
    if found is not None:
        return found.text()
    if has_children(value):
        return container_text(value, tree_totals.of(value) if tree_totals is not None else totals(value))
    if isinstance(value, (dict, list, tuple, set, frozenset)) and not isinstance(value, TorchSize):
        return f"{type_label(value)} (empty)"
    if isinstance(value, Opaque) or is_global_ref(value):
        return scalar_text(value, 100)
    return f"{type_label(value)} = {scalar_text(value)}"
