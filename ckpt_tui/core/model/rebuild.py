"""Rebuild a tree with some of its nodes changed, keeping what the file's object graph keeps.

A checkpoint's tree is a graph: a dict can hold itself, a list can sit inside itself, an opaque
object's args or state can lead back to it, and two keys can hold the same object. Every edit goes
through :func:`rebuild`, which

- visits each object once (memo by ``id``), so shared objects stay shared and nothing is walked
  once per path;
- copies only the containers that lead to a change, and shares everything else with the input
  (the input is never modified, so undo keeps old versions for little);
- keeps cycles: a copied container that held itself holds its copy;
- never recurses: both passes use explicit stacks, so depth is bounded by memory, not by Python's
  recursion limit.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ckpt_tui.core.model.tree import Opaque, Tensor, TorchSize

Items = list[tuple[Any, Any]]
ItemsEdit = Callable[[Items], Iterable[tuple[Any, Any]]]
"""A change to one container: from its (key, value) pairs (values already rebuilt) to the new pairs.
For lists the keys are the indices; the new list holds the values in the order returned."""


@dataclass
class Rebuilt:
    """The new root, how many tensors changed, and the new version of every copied node (by old id)."""

    root: Any
    tensors_changed: int
    new_of: dict[int, Any] = field(default_factory=dict)

    def version_of(self, old: Any) -> Any:
        """What ``old`` became (itself when unchanged)."""
        return self.new_of.get(id(old), old)


def is_container(value: Any) -> bool:
    """A node whose children the rebuild follows."""
    if isinstance(value, TorchSize):
        return False
    return isinstance(value, (dict, list, tuple, Opaque))


def kids(node: Any) -> list[Any]:
    """The values below a container, in a fixed order (dict keys are not followed)."""
    if isinstance(node, dict):
        return list(node.values())
    if isinstance(node, (list, tuple)):
        return list(node)
    if isinstance(node, Opaque):
        out = [*node.args, *getattr(node, "kwargs", {}).values(), node.state]
        out += [*node.items.values(), *node.list_items]
        if node.callee is not None:
            out.append(node.callee)
        return out
    return []


def rebuild(
    root: Any,
    tensors: Callable[[Tensor], Tensor | None] | None = None,
    containers: dict[int, ItemsEdit] | None = None,
) -> Rebuilt:
    """A new tree with ``tensors`` applied to every tensor (None keeps it) and ``containers`` edits
    applied to the containers they name (by ``id``). Each object is converted once."""
    containers = containers or {}
    nodes, parents = _walk(root, with_tensors=tensors is not None)
    converted: dict[int, Any] = {}
    if tensors is not None:
        for key, node in nodes.items():
            if isinstance(node, Tensor):
                new = tensors(node)
                if new is not None:
                    converted[key] = new
    dirty = _dirty(set(converted) | (set(containers) & set(nodes)), parents)
    if id(root) not in dirty:
        return Rebuilt(root, 0)
    new_of = _copy(nodes, dirty, converted, containers)
    return Rebuilt(new_of[id(root)], len(converted), new_of)


def _walk(root: Any, with_tensors: bool) -> tuple[dict[int, Any], dict[int, list[int]]]:
    """Every container (and tensor, when asked) by id, and who holds each one."""
    nodes: dict[int, Any] = {id(root): root}
    parents: dict[int, list[int]] = {}
    stack = [root]
    skipped = _LEAVES if with_tensors else _LEAVES | {Tensor}
    while stack:
        node = stack.pop()
        below = kids(node)
        if skipped.issuperset(map(type, below)):
            continue  # nothing to follow: a state_dict of plain tensors, at C speed
        for kid in below:
            kind = type(kid)
            if kind in _LEAVES or (kind is Tensor and not with_tensors):
                continue  # the common kids, skipped at one lookup each (50,000 tensors in big files)
            if not (is_container(kid) or (with_tensors and isinstance(kid, Tensor))):
                continue
            parents.setdefault(id(kid), []).append(id(node))
            if id(kid) not in nodes:
                nodes[id(kid)] = kid
                stack.append(kid)
    return nodes, parents


_LEAVES = frozenset({str, int, float, bool, bytes, type(None)})


def _dirty(changed: set[int], parents: dict[int, list[int]]) -> set[int]:
    """The changed nodes and every node that leads to one."""
    dirty = set(changed)
    queue = list(changed)
    while queue:
        for parent in parents.get(queue.pop(), ()):
            if parent not in dirty:
                dirty.add(parent)
                queue.append(parent)
    return dirty


def _copy(
    nodes: dict[int, Any], dirty: set[int], converted: dict[int, Any], containers: dict[int, ItemsEdit]
) -> dict[int, Any]:
    """New versions of the dirty nodes: empty shells first (so cycles can close), then tuples
    (children first: a tuple is never its own ancestor without a mutable container between), then
    the shells are filled."""
    new_of: dict[int, Any] = dict(converted)
    for key in dirty:
        node = nodes[key]
        if key in new_of or isinstance(node, tuple):
            continue
        new_of[key] = _shell(node)

    def version(value: Any) -> Any:
        return new_of.get(id(value), value) if id(value) in dirty else value

    for key in _tuples_children_first(nodes, dirty):
        node = nodes[key]
        new_of[key] = tuple.__new__(type(node), [version(v) for v in node])
    for key in dirty:
        node = nodes[key]
        if key in converted or isinstance(node, tuple):
            continue
        _fill(new_of[key], node, version, containers.get(key), dirty)
    return new_of


def _tuples_children_first(nodes: dict[int, Any], dirty: set[int]) -> list[int]:
    order: list[int] = []
    done: set[int] = set()
    for start in dirty:
        if start in done or not isinstance(nodes[start], tuple):
            continue
        stack: list[tuple[int, bool]] = [(start, False)]
        while stack:
            key, expanded = stack.pop()
            if expanded:
                order.append(key)
                continue
            if key in done:
                continue
            done.add(key)
            stack.append((key, True))
            stack.extend(
                (id(v), False) for v in nodes[key] if isinstance(v, tuple) and id(v) in dirty and id(v) not in done
            )
    return order


def _has_dirty(values: Any, version: Callable[[Any], Any], dirty: set[int]) -> bool:
    """Whether any value changes (checked without building a list: most of a big state_dict does not).

    Only a dirty node changes, so values none of whose ids is dirty (checked at C speed) change nothing."""
    if dirty.isdisjoint(map(id, values)):
        return False
    return any(version(v) is not v for v in values if type(v) not in _LEAVES)


def _shell(node: Any) -> Any:
    if isinstance(node, OrderedDict):
        return OrderedDict()
    if isinstance(node, dict):
        return {}
    if isinstance(node, list):
        return []
    assert isinstance(node, Opaque)
    new = object.__new__(type(node))
    if hasattr(node, "__dict__"):
        new.__dict__.update(node.__dict__)
    for cls in type(node).__mro__:
        slots = getattr(cls, "__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(node, name):
                setattr(new, name, getattr(node, name))
    return new


def _fill(new: Any, node: Any, version: Callable[[Any], Any], edit: ItemsEdit | None, dirty: set[int]) -> None:
    if isinstance(node, dict):
        changed = _has_dirty(node.values(), version, dirty)
        items = [(k, version(v)) for k, v in node.items()] if changed else list(node.items())
        new.update(edit(items) if edit else items)
        metadata = getattr(node, "_metadata", None)
        if metadata is not None:
            new._metadata = metadata
    elif isinstance(node, list):
        items = [(i, version(v)) for i, v in enumerate(node)]
        new.extend(v for _, v in (edit(items) if edit else items))
    else:
        new.args = tuple(version(a) for a in node.args)
        new.kwargs = {k: version(v) for k, v in getattr(node, "kwargs", {}).items()}
        new.state = version(node.state)
        items = [(k, version(v)) for k, v in node.items.items()]
        # (the entries a mapping object holds: a Counter's, a defaultdict's)
        new.items = dict(edit(items) if edit else items)
        new.list_items = [version(v) for v in node.list_items]
        if node.callee is not None:
            new.callee = version(node.callee)
