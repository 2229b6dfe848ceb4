"""The checkpoint tree: one line per node, children loaded on expand, optional module grouping."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from rich.text import Span, Text
from textual.binding import Binding, BindingType
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from ckpt_tui.core.describe import count, scalar_text, shape, size, totals
from ckpt_tui.core.grouping import Group, group_keys
from ckpt_tui.core.keypath import KeyPath, key_text
from ckpt_tui.core.state_dicts import tensor_items
from ckpt_tui.core.tree import Opaque, Tensor, children, has_children, is_global_ref, type_label

PAGE = 1000
MORE = object()  # the value of the "… N more" line
GROUP_MIN_KEYS = 8


@dataclass
class NodeData:
    """What a tree line stands for: a value at a path, or a module group inside a state_dict."""

    path: KeyPath
    value: Any
    group: Group | None = None
    loaded: bool = False
    pending: Iterator[tuple[Text, NodeData, bool]] | None = None
    remaining: int = 0
    more: TreeNode[NodeData] | None = None


def styled(parts: list[tuple[str, str]]) -> Text:
    """One Text from (text, style) parts, built in one step (cheap enough for 50,000 lines)."""
    plain: list[str] = []
    spans: list[Span] = []
    position = 0
    for text, style in parts:
        if style and text:
            spans.append(Span(position, position + len(text), style))
        plain.append(text)
        position += len(text)
    return Text("".join(plain), spans=spans)


def tensor_parts(tensor: Tensor) -> list[tuple[str, str]]:
    """``[64, 3, 7, 7] float32 cuda:0 36.9 kB`` with the device coloured and named."""
    device_style = "bold yellow" if tensor.device.startswith("cuda") else "green"
    return [
        (shape(tensor.shape), "cyan"),
        (" ", ""),
        (tensor.dtype, "magenta"),
        (" ", ""),
        (tensor.device, device_style),
        (" ", ""),
        (size(tensor.nbytes), "dim"),
    ]


def value_label(key: str, value: Any, with_totals: bool = True) -> Text:
    """A full tree line: key, type, and a short description (totals below containers unless asked not to)."""
    parts: list[tuple[str, str]] = [(key.replace("\n", "⏎").replace("\r", "⏎"), "bold"), ("  ", "")]
    unsafe = (isinstance(value, Opaque) or is_global_ref(value)) and not value.safe
    if isinstance(value, Tensor):
        parts.append((type_label(value) + " ", "dim"))
        parts += tensor_parts(value)
    elif has_children(value):
        kids = sum(1 for _ in children(value))
        parts.append((f"{type_label(value)} ({kids})", "dim"))
        found = totals(value) if with_totals else None
        if found is not None and found.tensors:
            parts.append((f"  {found.tensors} tensors · {count(found.parameters)} params · {size(found.nbytes)}", ""))
        if unsafe:
            parts.append(("  UNSAFE, not executed", "bold red"))
    else:
        parts.append((scalar_text(value, 70), "bold red" if unsafe else ""))
    return styled(parts)


def group_label(group: Group) -> Text:
    """A module group: ``attn  module · 4 tensors · 1.1M params · 4.2 MB``."""
    summary = f"  module · {group.tensors} tensors · {count(group.parameters)} params · {size(group.nbytes)}"
    return styled([(group.name, "bold blue"), (summary, "")])


class CheckpointTree(Tree[NodeData]):
    """A Tree over the checkpoint model that loads children when a node is expanded."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("h", "collapse_or_parent", "Collapse / parent", show=False),
        Binding("l", "expand_or_child", "Expand / child", show=False),
        Binding("left", "collapse_or_parent", "Collapse / parent", show=False),
        Binding("right", "expand_or_child", "Expand / child", show=False),
        Binding("g,home", "top", "Top", show=False),
        Binding("G,end", "bottom", "Bottom", show=False),
    ]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("checkpoint", **kwargs)
        self.grouped = False
        self.auto_expand = False
        self.guide_depth = 3

    def process_label(self, label: str | Text) -> Text:
        """Our labels are built single-line already; skip Tree's split-and-copy (it dominates 50k adds)."""
        if isinstance(label, Text):
            return label
        return super().process_label(label)

    def show(self, root: Any, name: str, keep: KeyPath | None = None) -> None:
        """Show a (new) tree; keep the cursor on ``keep`` when it still exists."""
        self.clear()
        self.root.set_label(value_label(name, root, with_totals=False))  # the header has the totals
        self.root.data = NodeData((), root)
        self.load(self.root)
        self.root.expand()
        if keep:
            self.reveal(keep)

    def load(self, node: TreeNode[NodeData]) -> None:
        """Add a node's first page of children; the rest come a page at a time as the cursor gets there."""
        data = node.data
        if data is None or data.loaded:
            return
        data.loaded = True
        entries = self._entries(data)
        data.pending = (self._line(data.path, prefix, entry) for prefix, entry in entries)
        data.remaining = len(entries)
        self._add_page(node)

    def _add_page(self, node: TreeNode[NodeData], limit: int | None = PAGE) -> None:
        data = node.data
        if data is None or data.pending is None:
            return
        if data.more is not None:
            data.more.remove()
            data.more = None
        for added, (label, child, expandable) in enumerate(data.pending, 1):
            node.add(label, child, allow_expand=expandable)
            data.remaining -= 1
            if limit is not None and added >= limit and data.remaining:
                text = f"… {data.remaining:,} more (the cursor here loads {min(PAGE, data.remaining):,} more)"
                data.more = node.add_leaf(styled([(text, "italic dim")]), NodeData(data.path, MORE))
                return
        data.pending = None

    def drain(self, node: TreeNode[NodeData]) -> None:
        """Add all of a node's children now (for search and jumps to the end)."""
        self.load(node)
        self._add_page(node, None)

    def _on_tree_node_highlighted(self, event: Tree.NodeHighlighted[NodeData]) -> None:
        data = event.node.data
        parent = event.node.parent
        if data is not None and data.value is MORE and parent is not None:
            self._add_page(parent)

    def _entries(self, data: NodeData) -> list[tuple[str, Any]]:
        """The children to show, cheaply: (group prefix to drop, Group or (key, value)); labels come later."""
        if data.group is not None:
            return [(data.group.prefix, entry) for entry in data.group.entries]
        value = data.value
        items = tensor_items(value) if self.grouped and isinstance(value, dict) else None
        if items is not None and len(items) >= GROUP_MIN_KEYS:
            return [("", entry) for entry in group_keys(items).entries]
        return [("", pair) for pair in children(value)]

    @staticmethod
    def _line(path: KeyPath, prefix: str, entry: Any) -> tuple[Text, NodeData, bool]:
        if isinstance(entry, Group):
            return group_label(entry), NodeData(path, entry, entry), True
        key, value = entry
        text = key_text(key)
        short = text[len(prefix) :] if prefix and text.startswith(prefix) else text
        return value_label(short, value), NodeData((*path, key), value), has_children(value)

    def _on_tree_node_expanded(self, event: Tree.NodeExpanded[NodeData]) -> None:
        self.load(event.node)

    # ---- navigation -------------------------------------------------------------------

    def action_collapse_or_parent(self) -> None:
        node = self.cursor_node
        if node is None:
            return
        if node.is_expanded and node.children:
            node.collapse()
        elif node.parent is not None:
            self.move_cursor(node.parent)

    def action_expand_or_child(self) -> None:
        node = self.cursor_node
        if node is None or not node.allow_expand:
            return
        if not node.is_expanded:
            self.load(node)
            node.expand()
        elif node.children:
            self.move_cursor(node.children[0])

    def action_top(self) -> None:
        self.move_cursor(self.root)

    def action_bottom(self) -> None:
        node = self.root
        while node.is_expanded and node.children:
            self.drain(node)
            node = node.children[-1]
        self.call_after_refresh(self._focus_node, node)

    def reveal(self, path: KeyPath) -> bool:
        """Expand the ancestors of ``path`` and put the cursor on it."""
        node = self.root
        while True:
            data = node.data
            if data is not None and data.path == path and data.group is None:
                self.call_after_refresh(self._focus_node, node)
                return True
            self.drain(node)
            node.expand()
            step = self._step_towards(node, path)
            if step is None:
                return False
            node = step

    def _focus_node(self, node: TreeNode[NodeData]) -> None:
        self.move_cursor(node)
        self.scroll_to_node(node, animate=False)

    def _step_towards(self, node: TreeNode[NodeData], path: KeyPath) -> TreeNode[NodeData] | None:
        for candidate in node.children:
            data = candidate.data
            if data is None:
                continue
            if data.group is not None:
                if data.path == path[: len(data.path)] and len(path) > len(data.path):
                    key = path[len(data.path)]
                    if isinstance(key, str) and key.startswith(data.group.prefix):
                        return candidate
            elif data.path == path[: len(data.path)]:
                return candidate
        return None
