"""The checkpoint tree: one line per node, children loaded on expand, optional module grouping.

Labels are built only for the lines added (a page at a time); a container's totals are walked once
per tree (cached by object, within a budget), so no label walks a subtree that another already did.
Every string from the file is escaped and passed as ``Text``, never as markup.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

from rich.style import Style
from rich.text import Text
from textual.binding import BindingType
from textual.widgets import Tree
from textual.widgets._tree import TOGGLE_STYLE
from textual.widgets.tree import TreeNode

from ckpt_tui.core.conventions.state_dicts import tensor_items
from ckpt_tui.core.model.describe import Totals, counted, elements_text, opens, scalar_text, shape, size
from ckpt_tui.core.model.grouping import Group, group_keys
from ckpt_tui.core.model.keypath import KeyPath, key_text
from ckpt_tui.core.model.tree import (
    Opaque,
    Tensor,
    TorchSize,
    children,
    get,
    has_children,
    is_global_ref,
    iter_nodes,
    type_label,
)
from ckpt_tui.core.runtime.safe_text import printable, printable_name
from ckpt_tui.core.values.text_plots import shorten_all
from ckpt_tui.tui.bindings import TREE_BINDINGS
from ckpt_tui.tui.fitting import SHORT_DTYPES, Part, fitted, key_room, styled

# Every line added is laid out again on each change of the tree (Textual's Tree measures all its lines):
# a page is a few screens, so that showing a tree, a jump or an expand stays well within a key's 0.3 s
PAGE = 200
LISTING_RULE = 5000
"""Up to this many lines a listing's keys are shortened by one rule (:func:`shorten_all`); past it, each line
its own way (the rule reads every line of the listing at each layout)."""
JUMP = 100  # lines added around the target of a jump (G, search, a redraw keeping a deep cursor)
MORE = object()  # the value of the "… N more" line
GROUP_MIN_KEYS = 8
GROUP_STEP = 2000  # keys grouped between two progress reports (and two looks at a cancel)
GROUPINGS_KEPT = 16  # state_dicts whose module groups are kept across redraws (undo, redo)
LISTINGS_KEPT = 16  # containers of more than a page whose listings are kept across redraws (undo, redo, C)
TOTALS_BUDGET = 5000  # nodes one label's totals may walk; past it the label shows the child count only

RowId = tuple[KeyPath, str | None]
"""What a line stands for: a value's path, or (the state_dict's path, the group's prefix)."""

# Styles by role; under NO_COLOR nothing is dim and meaning is carried by words and bold/italic.
COLOR_STYLES = {
    "key": "bold",
    "type": "italic",
    "shape": "cyan",
    "dtype": "magenta",
    "device": "green",
    "gpu": "bold yellow",
    "size": "",
    "totals": "",
    "unsafe": "bold red",
    "group": "bold blue",
    "more": "italic",
}
MONO_STYLES = {role: "" for role in COLOR_STYLES} | {
    "key": "bold",
    "type": "italic",
    "gpu": "bold",
    "unsafe": "bold reverse",
    "group": "bold underline",
    "more": "italic",
}


@dataclass
class NodeData:
    """What a tree line stands for: a value at a path, a module group inside a state_dict, or a "… N more" line.

    A loaded container keeps its ``entries`` (what its lines show, in order); its lines are added a page
    at a time, anywhere in that order (a jump to the end or to a deep key adds only the page around it),
    and each range not added yet is one "… N more" line whose ``index``..``end`` say which entries it holds.
    """

    path: KeyPath
    value: Any
    group: Group | None = None
    loaded: bool = False
    index: int = 0
    """The line's place among its parent's entries (a "more" line: the first entry it holds)."""
    end: int = 0
    """A "more" line: one past the last entry it holds."""
    entries: list[Any] | None = None
    """A loaded container: its children to show, each a Group or a (key, value) pair."""
    by_key: dict[Any, int] | None = None
    """A loaded container: the place of each plain (key, value) entry, by key (built on the first jump)."""
    listing: Listing | None = None
    """A loaded big container: its listing, kept by the tree (``by_key`` is kept there once built)."""
    parts: list[Part] | None = None
    """The line's parts, to fit it into a narrow tree (the label is the whole line)."""

    @property
    def row_id(self) -> RowId:
        """The line's identity across redraws."""
        return (self.path, self.group.prefix if self.group is not None else None)

    @property
    def is_more(self) -> bool:
        """Whether this is a "… N more" line."""
        return self.value is MORE


@dataclass
class Listing:
    """A big container's children as the tree lists them (a page at a time), worked out once per container
    object: an undo, a redo or a check shows the very dicts it showed before, and an edit's worker lists the
    new tree's open dicts off the UI thread."""

    value: Any
    entries: list[Any]
    by_key: dict[Any, int] | None = None


def listing(value: Any) -> Listing:
    """The (key, value) pairs of a container, and (later) their places by key."""
    return Listing(value, child_pairs(value))


def listings_along(root: Any, paths: list[KeyPath]) -> dict[int, Listing]:
    """The listings of the big containers at ``paths`` in ``root`` (where they still are), by ``id``, their
    places by key worked out too; for a worker."""
    found: dict[int, Listing] = {}
    for path in paths[:LISTINGS_KEPT]:
        try:
            value = get(root, path)
        except (KeyError, IndexError, TypeError, AttributeError):
            continue
        if id(value) not in found and has_children(value) and child_count(value) > PAGE:
            made = listing(value)
            made.by_key = _places(made.entries)
            found[id(value)] = made
    return found


@dataclass
class ViewState:
    """What to keep when the tree is redrawn: the cursor's line and the expanded lines."""

    cursor: RowId = ((), None)
    expanded: set[RowId] = field(default_factory=set)


class TotalsCache:
    """Tensors, parameters and bytes below containers, each walked once (within a budget)."""

    def __init__(self, budget: int = TOTALS_BUDGET) -> None:
        self.budget = budget
        self._found: dict[int, tuple[Any, Totals | None]] = {}

    def get(self, value: Any) -> Totals | None:
        """The totals below ``value``, or None when they would take more than the budget to count."""
        hit = self._found.get(id(value))
        if hit is not None and hit[0] is value:
            return hit[1]
        result: Totals | None = Totals()
        if child_count(value) >= self.budget:  # past the budget before the walk is under way: no walk at all
            self._found[id(value)] = (value, None)
            return None
        for steps, (_, node) in enumerate(iter_nodes(value)):
            if steps >= self.budget:
                result = None
                break
            if isinstance(node, Tensor):
                assert result is not None
                result.tensors += 1
                result.parameters += node.numel
                result.nbytes += node.nbytes
        self._found[id(value)] = (value, result)
        return result


# When a line is too wide (fitting.py): bytes go first, then the device, then the counts of a container,
# then long names take their short forms (SHORTEN), then the word "Tensor" (the shape and dtype say it).
DROP_BYTES, DROP_DEVICE, DROP_COUNTS, DROP_TYPE = 5, 4, 3, 1


def tensor_parts(tensor: Tensor, styles: dict[str, str]) -> list[Part]:
    """`` [64, 3, 7, 7] float32 cuda:0 36.9 kB`` (the device tag escaped: it comes from the file)."""
    device = printable(tensor.device)
    dtype = printable(tensor.dtype)
    short = SHORT_DTYPES.get(tensor.dtype)
    return [
        Part(" " + shape(tensor.shape), styles["shape"]),
        # a dtype without a short form (qint8, float8_e4m3fn) stays whole: a line without its dtype says less
        Part(" " + dtype, styles["dtype"], short=" " + short if short else None, compact=short is not None),
        Part(" " + device, styles["gpu"] if device.startswith("cuda") else styles["device"], DROP_DEVICE, compact=True),
        Part(" " + size(tensor.nbytes), styles["size"], DROP_BYTES, compact=True),
    ]


def value_parts(
    key: str, value: Any, totals: TotalsCache | None = None, styles: dict[str, str] = COLOR_STYLES
) -> list[Part]:
    """A full tree line: key, type, and a short description (totals below containers when ``totals`` is given)."""
    parts: list[Part] = [Part(printable_name(key), styles["key"], key=True), Part(" ")]
    unsafe = (isinstance(value, Opaque) or is_global_ref(value)) and not value.safe
    if isinstance(value, Tensor):
        # a narrow line drops the word "Tensor" but keeps a sparse or quantized layout: the shape does not say it
        kind = f" {value.kind}" if value.kind != "dense" else None
        parts.append(Part(" " + type_label(value), styles["type"], DROP_TYPE, short=kind, compact=True))
        parts += tensor_parts(value, styles)
    elif opens(value):
        kids = child_count(value)
        parts.append(Part(f" {printable(type_label(value))} ({kids})", styles["type"]))
        found = totals.get(value) if totals is not None else None
        if found is not None and found.tensors:
            parts.append(Part(f"  {counted(found.tensors, 'tensor')}", styles["totals"], DROP_COUNTS))
            # compact: a narrow tree shows every container line's counts alike, not the ones with short keys
            parts.append(Part(f" · {elements_text(found.parameters)}", styles["totals"], DROP_DEVICE, compact=True))
            parts.append(Part(f" · {size(found.nbytes)}", styles["totals"], DROP_BYTES, compact=True))
        if unsafe:
            parts.append(Part("  UNSAFE, not executed", styles["unsafe"], end=True))
    else:
        parts.append(Part(" " + printable(scalar_text(value, 70)), styles["unsafe"] if unsafe else ""))
    return parts


def value_label(key: str, value: Any, totals: TotalsCache | None = None, styles: dict[str, str] = COLOR_STYLES) -> Text:
    """A full tree line as one Text (see ``value_parts``)."""
    return styled(value_parts(key, value, totals, styles))


MARK_ONLY = "  !!"
"""A full check's mark on a line too narrow for its words and the key whole."""


def marked_below(marks: list[str]) -> str:
    """A closed line's mark for the tensor marks below it: ``NaN below``, ``NaN, unreadable below`` (short: it
    sits beside the container's type in a narrow tree; the header counts them and ``f`` lists them)."""
    return ", ".join(dict.fromkeys(marks)) + " below"


def group_parts(group: Group, styles: dict[str, str] = COLOR_STYLES) -> list[Part]:
    """A module group: ``attn  module · 4 tensors · 1.1M params · 4.2 MB``."""
    return [
        Part(printable_name(group.name), styles["group"], key=True),
        Part("  module"),
        Part(f" · {counted(group.tensors, 'tensor')}", drop=DROP_COUNTS),
        Part(f" · {elements_text(group.parameters)}", drop=DROP_DEVICE),
        Part(f" · {size(group.nbytes)}", drop=DROP_BYTES),
    ]


def group_label(group: Group, styles: dict[str, str] = COLOR_STYLES) -> Text:
    """A module group's line as one Text (see ``group_parts``)."""
    return styled(group_parts(group, styles))


class CheckpointTree(Tree[NodeData], inherit_bindings=False):
    """A Tree over the checkpoint model that loads children when a node is expanded."""

    BINDINGS: ClassVar[list[BindingType]] = TREE_BINDINGS

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("checkpoint", **kwargs)
        self.grouped = False
        self.auto_expand = False
        self.guide_depth = 3
        self.totals = TotalsCache()
        self._groupings: dict[int, tuple[Any, Group | None]] = {}
        self._listings: dict[int, Listing] = {}
        self.styles_by_role = COLOR_STYLES
        self.target_node: TreeNode[NodeData] | None = None
        """Where a jump is about to put the cursor (it moves after the next refresh)."""
        self.wide_lines = 0
        """Lines shown that are wider than the tree: then every tensor line is compact (``[32, 3, 3, 3] fp32``;
        the panel has the type, device and bytes), so the column reads the same down the screen."""
        self._layout_width: int | None = None
        """The tree's width less its scrollbar, read once per layout of the lines (``_build``)."""
        self._short_keys: dict[tuple[int, int, int | None, bool], dict[int, str]] = {}
        """A listing's shortened keys, by ``id`` of their lines (by ``id`` of their parent line, its lines, the width,
        whether the view is narrow)."""
        self.markers: dict[int, str] = {}
        """What a full check found in a tensor, or below a container (by ``id`` of each): in words after its line."""

    def on_mount(self) -> None:
        if self.app.no_color:
            self.styles_by_role = MONO_STYLES

    def process_label(self, label: str | Text) -> Text:
        """Our labels are built single-line already; skip Tree's split-and-copy (it dominates 50k adds)."""
        if isinstance(label, Text):
            return label
        return Text(printable(label))  # never markup

    # ---- showing a tree -----------------------------------------------------------------

    def show(self, root: Any, name: str, view: ViewState | None = None) -> TreeNode[NodeData]:
        """Show a (new) tree, keeping the expanded lines and the cursor of ``view`` where they still exist (``name``:
        the file's name as the app shows it, escaped already)."""
        self.clear()
        self.target_node = None
        self.totals = TotalsCache()
        self._short_keys.clear()
        parts = value_parts(name, root, None, self.styles_by_role)  # the header has the totals
        # a file name, not a key: shown as given (a key's escaping would double the backslash of its \xff)
        parts[0] = parts[0]._replace(text=name)
        self.root.set_label(styled(parts))
        self.root.data = NodeData((), root, parts=parts)
        self.load(self.root)
        self.root.expand()
        if view is None:
            return self.root
        self._restore(self.root, view.expanded)
        return self.reveal(view.cursor)

    def view_state(self) -> ViewState:
        """The cursor's line and every expanded line, to restore after a redraw."""
        cursor = self.cursor_node
        state = ViewState()
        if cursor is not None and cursor.data is not None:
            state.cursor = cursor.data.row_id
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node.is_expanded and node.data is not None:
                state.expanded.add(node.data.row_id)
                stack.extend(node.children)
        return state

    def _restore(self, node: TreeNode[NodeData], expanded: set[RowId]) -> None:
        for kid in list(node.children):
            data = kid.data
            if data is not None and not data.is_more and data.row_id in expanded and kid.allow_expand:
                self.load(kid)
                kid.expand()
                self._restore(kid, expanded)

    def load(self, node: TreeNode[NodeData]) -> None:
        """Add a node's first page of children; the rest come a page at a time as the cursor gets there."""
        data = node.data
        if data is None or data.loaded or data.is_more:
            return
        data.loaded = True
        found = self._listing(data)
        if found is not None:
            data.listing, data.entries, data.by_key = found, found.entries, found.by_key
        else:
            data.entries = self._entries(data)
        if data.entries:
            more = self._more_line(node, data, 0, len(data.entries), None)
            self._open(node, more, 0, PAGE)

    def _more_line(
        self, node: TreeNode[NodeData], data: NodeData, start: int, end: int, before: int | None
    ) -> TreeNode[NodeData]:
        """A "… N more" line standing for entries ``start``..``end`` of ``node``."""
        parts = self._more_parts(end - start)
        label = styled(parts)
        more = NodeData(data.path, MORE, index=start, end=end, parts=parts)
        if before is None:
            return node.add(label, more, allow_expand=False)
        return node.add(label, more, before=before, allow_expand=False)

    def _more_parts(self, remaining: int) -> list[Part]:
        style = self.styles_by_role["more"]
        return [
            Part(f"… {remaining:,} more", style),
            Part(f" (the cursor here loads {min(PAGE, remaining):,} more)", style, DROP_TYPE),
        ]

    def _open(self, node: TreeNode[NodeData], more: TreeNode[NodeData], low: int, high: int) -> None:
        """Add the lines of entries ``low``..``high`` held by the "more" line ``more`` (cut to what it holds)."""
        data, gap = node.data, more.data
        assert data is not None and data.entries is not None and gap is not None
        low, high = max(low, gap.index), min(high, gap.end)
        if low >= high:
            return
        at = node.children.index(more)
        if low > gap.index:  # entries before the page stay behind a "more" line of their own
            self._more_line(node, data, gap.index, low, at)
            at += 1
        for place in range(low, high):
            prefix = data.group.prefix if data.group is not None else ""  # shown once, on the group line
            label, kid, expandable = self._line(data.path, prefix, data.entries[place])
            kid.index = place
            node.add(label, kid, before=at, allow_expand=expandable)
            at += 1
        # a new "more" line for what is left: the cursor stays on the line it was on, never follows the old one
        more.remove()
        if high < gap.end:
            self._more_line(node, data, high, gap.end, at)

    def _on_tree_node_highlighted(self, event: Tree.NodeHighlighted[NodeData]) -> None:
        data = event.node.data
        parent = event.node.parent
        if data is not None and data.is_more and parent is not None:
            self._open(parent, event.node, data.index, data.index + PAGE)

    def _entries(self, data: NodeData) -> list[Any]:
        """The children to show, cheaply: Groups or (key, value) pairs; labels come later."""
        if data.group is not None:
            return data.group.entries
        value = data.value
        if self.grouped and isinstance(value, dict):
            grouped = self._grouping(value)
            if grouped is not None:
                return grouped.entries
        return child_pairs(value)

    def _listing(self, data: NodeData) -> Listing | None:
        """The kept listing of a big plain container (listed now if it is not kept yet), None for others."""
        value = data.value
        if data.group is not None or (self.grouped and isinstance(value, dict) and self._grouping(value) is not None):
            return None
        hit = self._listings.get(id(value))
        if hit is not None and hit.value is value:
            return hit
        if child_count(value) <= PAGE:
            return None
        made = listing(value)
        self.remember_listings({id(value): made})
        return made

    def remember_listings(self, found: dict[int, Listing]) -> None:
        """Keep listings made elsewhere (an edit's worker lists the open containers of the tree it made; a
        search's lists the dicts on the way to its match, to look a key up in)."""
        for key, entry in found.items():
            kept = self._listings.get(key)
            if kept is not None and kept.value is entry.value:
                # the lines shown keep their listing; it takes the places of its keys if it has none yet
                kept.by_key = kept.by_key or entry.by_key
                continue
            if len(self._listings) >= LISTINGS_KEPT:
                self._listings.pop(next(iter(self._listings)))
            self._listings[key] = entry

    def _grouping(self, value: dict[Any, Any]) -> Group | None:
        """The module groups of a state_dict (None when not one, or too small), kept across redraws: an undo
        shows the very dict it showed before, so its groups are not counted again."""
        hit = self._groupings.get(id(value))
        if hit is not None and hit[0] is value:
            return hit[1]
        grouped = module_groups(value)
        self.remember_groupings({id(value): (value, grouped)})
        return grouped

    def knows_groups(self, value: Any) -> bool:
        """Whether the module groups of ``value`` are already counted (showing them costs nothing)."""
        hit = self._groupings.get(id(value))
        return hit is not None and hit[0] is value

    def remember_groupings(self, found: dict[int, tuple[Any, Group | None]]) -> None:
        """Keep module groups counted elsewhere (an edit's worker counts those of the tree it made)."""
        for key, entry in found.items():
            if len(self._groupings) >= GROUPINGS_KEPT:
                self._groupings.pop(next(iter(self._groupings)))
            self._groupings[key] = entry

    def _line(self, path: KeyPath, prefix: str, entry: Any) -> tuple[Text, NodeData, bool]:
        if isinstance(entry, Group):
            parts = group_parts(entry, self.styles_by_role)
            marked = self._marked_in(entry)
            if marked:
                parts.append(Part(f"  !! {marked_below(marked)}", "bold red", short=MARK_ONLY, end=True))
            return styled(parts), NodeData(path, entry, entry, parts=parts), True
        key, value = entry
        text = key_text(key)
        short = text[len(prefix) :] if prefix and text.startswith(prefix) else text
        parts = value_parts(short, value, self.totals, self.styles_by_role)
        # a container's mark (what its tensors hold) shows while it is closed as well as open
        marker = self.markers.get(id(value))
        if marker:
            parts.append(Part(f"  !! {marker}", "bold red", short=MARK_ONLY, end=True))
        return styled(parts), NodeData((*path, key), value, parts=parts), opens(value)

    def _marked_in(self, group: Group) -> list[str]:
        """The marks a full check left on the tensors below a module group."""
        if not self.markers:
            return []
        marked: list[str] = []
        for entry in group.entries:
            if isinstance(entry, Group):
                marked += self._marked_in(entry)
            elif isinstance(entry[1], Tensor) and id(entry[1]) in self.markers:
                marked.append(self.markers[id(entry[1])])
        return marked

    # ---- fitting lines into the tree's width --------------------------------------------

    def label_room(self, node: TreeNode[NodeData]) -> int | None:
        """The columns a node's label has (after the guides and the expand icon), None before the first layout."""
        # the vertical scrollbar's column is always kept: whether it shows depends on lines not built yet
        width = self._layout_width
        if width is None:
            width = self.size.width - self.styles.scrollbar_size_vertical
        if width <= 0:
            return None
        depth = 0
        parent = node.parent
        while parent is not None:
            depth += 1
            parent = parent.parent
        icon = len(self.ICON_NODE) if node.allow_expand else 0
        return max(width - depth * self.guide_depth - icon, 1)

    def render_label(self, node: TreeNode[NodeData], base_style: Style, style: Style) -> Text:
        """The label, fitted to the tree's width: shape and dtype stay whole, the key gives way in the middle."""
        room = self.label_room(node)
        data = node.data
        if room is None or data is None or data.parts is None:
            return super().render_label(node, base_style, style)
        compact = self.wide_lines > 0
        if not compact and self.process_label(node.label).cell_len <= room:
            return super().render_label(node, base_style, style)
        parts = data.parts
        short = self._listing_keys(node.parent, compact).get(id(node)) if node.parent is not None else None
        if short is not None:
            parts = [parts[0]._replace(text=short), *parts[1:]]
        label = fitted(parts, room, compact)
        label.stylize(style)
        if not node.allow_expand:
            return label
        icon = self.ICON_NODE_EXPANDED if node.is_expanded else self.ICON_NODE
        return Text.assemble((icon, base_style + TOGGLE_STYLE), label)

    def _listing_keys(self, parent: TreeNode[NodeData], compact: bool) -> dict[int, str]:
        """The keys of a listing (the lines under ``parent``) where some must be shortened, by ``id`` of their
        lines, shortened by one rule for the listing (:func:`shorten_all`: ``e.l.0.`` in every layer's key,
        not each line its own way); empty when every key fits, or past :data:`LISTING_RULE` lines."""
        asked = (id(parent), len(parent.children), self._layout_width, compact)
        found = self._short_keys.get(asked)
        if found is not None:
            return found
        found = {}
        lines: list[tuple[int, str, int]] = []
        if len(parent.children) <= LISTING_RULE:
            for kid in parent.children:
                room = self.label_room(kid)
                parts = kid.data.parts if kid.data is not None else None
                if room is None or not parts or not parts[0].key:
                    continue
                budget = key_room(parts, room, compact)
                text = parts[0].text
                lines.append((id(kid), text, len(text) if budget is None else budget))
        if any(len(text) > budget for _, text, budget in lines):
            shown = shorten_all([text for _, text, _ in lines], [budget for _, _, budget in lines])
            found = {line: short for (line, _, _), short in zip(lines, shown, strict=True)}
        self._short_keys[asked] = found
        return found

    def get_label_width(self, node: TreeNode[NodeData]) -> int:
        """What ``render_label`` takes, without fitting every line (the tree asks this of each line shown,
        each time it lays the lines out: the wide ones are counted here)."""
        icon = len(self.ICON_NODE) if node.allow_expand else 0
        room = self.label_room(node)
        natural = self.process_label(node.label).cell_len
        if room is None:
            return icon + natural
        if natural > room and node.data is not None and any(part.compact for part in node.data.parts or ()):
            self.wide_lines += 1
        return icon + min(natural, room)

    def _build(self) -> None:
        """Lay out the lines shown, counting again those too wide for the tree (Tree's own method, extended)."""
        self.wide_lines = 0
        # every line asks for the width: read it once (a widget's size is a dozen lookups)
        self._layout_width = self.size.width - self.styles.scrollbar_size_vertical
        try:
            super()._build()
        finally:
            self._layout_width = None

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
        self.scroll_home(animate=False)

    def action_bottom(self) -> None:
        node = self.root
        while node.is_expanded and node.children:
            last = node.children[-1]
            if last.data is not None and last.data.is_more:  # only the last page is added
                self._open(node, last, last.data.end - JUMP, last.data.end)
            node = node.children[-1]
        self.target_node = node
        self.call_after_refresh(self._focus_node, node)

    def reveal(self, row: RowId) -> TreeNode[NodeData]:
        """Expand the ancestors of a line and put the cursor on it, or on its nearest ancestor shown."""
        node = self.root
        while node.data is None or node.data.row_id != row:
            step = self._child_towards(node, row)
            if step is None:
                break
            node.expand()
            node = step
        self.target_node = node
        self.call_after_refresh(self._focus_node, node)
        return node

    def neighbour(self, node: TreeNode[NodeData]) -> RowId | None:
        """The line that takes ``node``'s place when it goes: the next one beside it, else the previous one."""
        data, parent = node.data, node.parent
        if data is None or parent is None or parent.data is None or parent.data.entries is None:
            return None
        entries = parent.data.entries
        for place in (data.index + 1, data.index - 1):
            if 0 <= place < len(entries):
                entry = entries[place]
                if isinstance(entry, Group):
                    return (parent.data.path, entry.prefix)
                return ((*parent.data.path, entry[0]), None)
        return None

    @property
    def cursor_target(self) -> TreeNode[NodeData] | None:
        """The line the cursor is on, or is about to be put on by a jump (what the panel and status show)."""
        return self.target_node if self.target_node is not None else self.cursor_node

    def _focus_node(self, node: TreeNode[NodeData]) -> None:
        if self.target_node is node:
            self.target_node = None
        if node.tree is self and (node is self.root or node.parent is not None):
            self.move_cursor(node)
            self.scroll_to_node(node, animate=False)

    def _child_towards(self, node: TreeNode[NodeData], row: RowId) -> TreeNode[NodeData] | None:
        """The child of ``node`` on the way to ``row``, adding only the page of children around it."""
        self.load(node)
        data = node.data
        if data is None or data.entries is None:
            return None
        place = _entry_towards(data, row)
        if place is None:
            return None
        kid = _line_at(node, place)
        if kid is not None and kid.data is not None and kid.data.is_more:
            self._open(node, kid, place - JUMP // 2, place - JUMP // 2 + JUMP)
            kid = _line_at(node, place)
        if kid is None or kid.data is None or kid.data.is_more:
            return None
        return kid


def module_groups(value: dict[Any, Any], progress: Callable[[int], object] | None = None) -> Group | None:
    """The module groups of a state_dict, or None when it is not one or too small to group; ``progress`` is
    called with the keys grouped so far, every :data:`GROUP_STEP` (it may raise ``Cancelled`` to stop)."""
    items = tensor_items(value)
    if items is None or len(items) < GROUP_MIN_KEYS:
        return None
    return group_keys(items if progress is None else _reporting(items, progress))


def _reporting(items: list[tuple[str, Any]], progress: Callable[[int], object]) -> Iterator[tuple[str, Any]]:
    """``items``, one by one, telling ``progress`` how many went by every :data:`GROUP_STEP`."""
    for done in range(0, len(items), GROUP_STEP):
        progress(done)
        yield from items[done : done + GROUP_STEP]
    progress(len(items))


def groupings_along(
    root: Any, paths: list[KeyPath], progress: Callable[[int, int], object] | None = None
) -> dict[int, tuple[Any, Group | None]]:
    """The module groups of the dicts at ``paths`` in ``root`` (where they still are), by ``id``; for a worker,
    which ``progress`` tells how many keys of them all are grouped (``(done, total)``; it may raise ``Cancelled``)."""
    dicts: dict[int, dict[Any, Any]] = {}
    for path in paths[:GROUPINGS_KEPT]:
        try:
            value = get(root, path)
        except (KeyError, IndexError, TypeError, AttributeError):
            continue
        if isinstance(value, dict):
            dicts.setdefault(id(value), value)
    total, done = sum(map(len, dicts.values())), 0
    found: dict[int, tuple[Any, Group | None]] = {}
    for key, value in dicts.items():
        report = None if progress is None else partial(_shifted, progress, done, total)
        found[key] = (value, module_groups(value, report))
        done += len(value)
    return found


def _shifted(progress: Callable[[int, int], object], before: int, total: int, done: int) -> None:
    """One dict's keys grouped so far, told as a share of all the dicts' (``before``: their keys ahead of it)."""
    progress(before + done, total)


def child_count(value: Any) -> int:
    """How many lines a container shows below it (a dict's or a list's length, without a walk)."""
    if isinstance(value, (dict, list, set, frozenset)):
        return len(value)
    if isinstance(value, tuple) and not isinstance(value, TorchSize):
        return len(value)
    return sum(1 for _ in children(value))


def child_pairs(value: Any) -> list[Any]:
    """The (key, child) pairs of a container, as ``children`` gives them: a dict's items and a list's
    places taken whole (50,000 keys in a few milliseconds, not a generator step each)."""
    if isinstance(value, dict):
        return list(value.items())
    if isinstance(value, list) or (isinstance(value, tuple) and not isinstance(value, TorchSize)):
        return list(enumerate(value))
    return list(children(value))


def _places(entries: list[Any]) -> dict[Any, int]:
    """The place of each plain (key, value) entry, by key (the first, where a key shows twice)."""
    if not any(isinstance(entry, Group) for entry in entries):
        # keys of one dict or one list are distinct: the whole index at C speed
        return {entry[0]: place for place, entry in enumerate(entries)}
    places: dict[Any, int] = {}
    for place, entry in enumerate(entries):
        if not isinstance(entry, Group):
            places.setdefault(entry[0], place)
    return places


def _line_at(node: TreeNode[NodeData], place: int) -> TreeNode[NodeData] | None:
    """The line of ``node`` showing entry ``place``, or the "more" line holding it."""
    kids = node.children
    found = bisect.bisect_right(kids, place, key=lambda kid: kid.data.index if kid.data is not None else 0) - 1
    return kids[found] if found >= 0 else None


def _entry_towards(data: NodeData, row: RowId) -> int | None:
    """The place among ``data``'s entries of the one that is ``row`` or leads to it."""
    assert data.entries is not None
    path, _ = row
    if len(path) > len(data.path) and path[: len(data.path)] == data.path:
        if data.by_key is None and data.listing is not None:
            data.by_key = data.listing.by_key  # found by a worker (a search's), if any
        if data.by_key is None:
            data.by_key = _places(data.entries)
            if data.listing is not None:
                data.listing.by_key = data.by_key
        keyed = data.by_key.get(path[len(data.path)])
        if keyed is not None:
            return keyed
    for place, entry in enumerate(data.entries):
        if isinstance(entry, Group) and _leads_to(NodeData(data.path, entry, entry), row):
            return place
    return None


def _leads_to(data: NodeData, row: RowId) -> bool:
    """Whether ``row`` is the line of ``data`` or below it."""
    path, prefix = row
    if data.group is None:
        return data.path == path[: len(data.path)] and len(data.path) <= len(path)
    if data.path == path and prefix is not None:
        return prefix.startswith(data.group.prefix)
    if data.path == path[: len(data.path)] and len(path) > len(data.path):
        key = path[len(data.path)]
        return isinstance(key, str) and key.startswith(data.group.prefix)
    return False
