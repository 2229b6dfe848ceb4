"""Every key of the browser, described once: key, action, description, id, tooltip and group.

The footer, the help screen and the command palette are all generated from the bindings that are
active on the screen (``Screen.active_bindings``), so a key added here shows up everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from textual.binding import ActiveBinding, Binding, BindingType
from textual.dom import DOMNode

MOVE = Binding.Group("move")
VIEW = Binding.Group("view")
EDIT = Binding.Group("edit")
EDIT_ALONE = Binding.Group("edit", compact=True)
"""An edit key of its own in the footer: Textual merges neighbouring keys of one group into ``u s edit``."""
FILE = Binding.Group("file")
APP = Binding.Group("app")
GROUP_ORDER = (MOVE, VIEW, EDIT, FILE, APP)


def key(keys: str, action: str, description: str, group: Binding.Group, tooltip: str, show: bool = False) -> Binding:
    """One binding; its id is its action (so a keymap can rebind it)."""
    return Binding(keys, action, description, show=show, id=action, tooltip=tooltip, group=group)


TREE_BINDINGS: list[BindingType] = [
    key("down,j", "cursor_down", "Down", MOVE, "Move the cursor down one line"),
    key("up,k", "cursor_up", "Up", MOVE, "Move the cursor up one line"),
    key("right,l", "expand_or_child", "Expand / first child", MOVE, "Open the node, or go to its first child"),
    key("left,h", "collapse_or_parent", "Collapse / parent", MOVE, "Close the node, or go to its parent"),
    key("pagedown", "page_down", "Page down", MOVE, "Move the cursor one screen down"),
    key("pageup", "page_up", "Page up", MOVE, "Move the cursor one screen up"),
    key("home,g", "top", "Top", MOVE, "Go to the first line"),
    key("end,G", "bottom", "Bottom", MOVE, "Go to the last line (loads every page on the way)"),
    key("space", "toggle_node", "Expand / collapse", MOVE, "Open or close the node under the cursor"),
    key("shift+down", "cursor_next_sibling", "Next sibling", MOVE, "Skip to the next line at the same depth"),
    key("shift+up", "cursor_previous_sibling", "Previous sibling", MOVE, "Skip to the previous line at the same depth"),
    key("shift+left", "cursor_parent", "Parent", MOVE, "Go to the parent line"),
    key("enter", "select_cursor", "Stats now", VIEW, "Compute the focused tensor's stats without waiting"),
]

BROWSER_BINDINGS: list[BindingType] = [
    key("slash", "search", "Search", VIEW, "Find key paths containing some text", show=True),
    key("n", "next_match", "Next match", VIEW, "Go to the next search match"),
    key("N", "previous_match", "Previous match", VIEW, "Go to the previous search match"),
    key("p", "strip_prefix", "Strip prefix", EDIT, "Strip the keys' common wrapper prefix (module., ...)", show=True),
    key("question_mark,f1", "help", "Help", APP, "Every key, with what it does", show=True),
    key("u", "undo", "Undo", EDIT, "Undo the last edit", show=True),
    key(
        "s",
        "sanitize",
        "Sanitize",
        EDIT_ALONE,
        "Rewrite the data torch.load(weights_only=True) refuses (Namespace, numpy...) as plain data, as convert"
        " --sanitize does (shown where it applies)",
        show=True,
    ),
    key("ctrl+r", "redo", "Redo", EDIT, "Redo the last undone edit"),
    key("y", "copy_path", "Copy path", VIEW, "Copy the focused key path (or a group's prefix) to the clipboard"),
    key("v", "toggle_grouping", "Group by module", VIEW, "Show flat state_dicts as a tree of modules"),
    key("f", "findings", "All findings", VIEW, "List every finding about the file"),
    key("P", "add_prefix", "Add prefix", EDIT, "Put a prefix in front of every key of the state_dict"),
    key("x", "extract", "Extract as root", EDIT, "Keep only the focused subtree or group (as a state_dict)"),
    key("m", "remap", "Map devices", EDIT, "Rewrite the saved device tags (cuda:0 -> cpu)"),
    key("r", "rename", "Rename", EDIT, "Rename the focused key, or a group's prefix"),
    key("d", "delete", "Delete", EDIT, "Delete the focused key or subtree, or every key of a group"),
    key("t", "cast", "Cast dtype", EDIT, "Cast floating-point tensors (fp16, bf16, fp32) of the focused state_dict"),
    key("c", "compare", "Compare", FILE, "Compare with a checkpoint of the target model, or a keys file", show=True),
    key("D", "diff", "Diff", FILE, "Diff with another checkpoint"),
    key("C", "check_all", "Check all", FILE, "Read every tensor: NaN/Inf, unreadable records (escape cancels)"),
    key(
        "L",
        "layers",
        "Layers",
        VIEW,
        "Every tensor's statistics as a table, with plots: norms by layer, histogram, bytes by part",
        show=True,
    ),
    key("o", "histogram_log", "Histogram log/linear", VIEW, "Show histogram counts on a log or a linear scale"),
]

LAYERS_BINDINGS: list[BindingType] = [
    key("s", "sort_next", "Sort", VIEW, "Sort by the next column (a header click sorts by that column)", show=True),
    key("S", "sort_reverse", "Reverse sort", VIEW, "Reverse the sort order"),
    key("slash", "filter", "Filter", VIEW, "Show only tensors whose key path contains some text", show=True),
    key("p", "next_plot", "Plot", VIEW, "Switch the plot: norms by layer, histogram, bytes by part", show=True),
    key("o", "histogram_log", "Log counts", VIEW, "Show histogram counts on a log or a linear scale"),
    key(
        "z", "drop_optimizer", "Drop optimizer", EDIT, "Stage deleting the optimizer state (a preview first; u undoes)"
    ),
    key("question_mark,f1", "help", "Help", APP, "Every key, with what it does", show=True),
    key("escape,q", "close", "Back", APP, "Back to the tree (escape also cancels the reading)", show=True),
]

REPORT_BINDINGS: list[BindingType] = [
    key("f", "fix", "Apply the fix", EDIT, "Stage the suggested fix as one undoable edit (a preview first)"),
    key(
        "e",
        "fix_alternative",
        "Apply the alternative",
        EDIT,
        "Stage the alternative fix instead (the EMA weights) as one undoable edit (a preview first)",
    ),
    key("a", "realign", "Compare that way", VIEW, "Compare again where the keys match (a subtree, a prefix stripped)"),
    key("s", "layer_change", "Per-layer change", VIEW, "How far each layer moved: relative change, cosine, norms"),
    key("w", "swap", "Swap sides", VIEW, "Diff the other way round: the other file as A, changes relative to it"),
    key("question_mark,f1", "help", "Help", APP, "Every key of the report, with what it does"),
    key("escape,q", "close", "Close", APP, "Back to the tree (escape also cancels the work)", show=True),
]
"""The report screens (compare, diff, per-layer change); each hides the keys its report has no use for."""

APP_BINDINGS: list[BindingType] = [
    Binding(
        "ctrl+p",
        "command_palette",
        "Command palette",
        id="command_palette",
        tooltip="Search every action by name",
        group=APP,
        show=False,
        priority=True,
    ),
    key("ctrl+s", "save", "Save as", FILE, "Write the edited checkpoint to a new file (verified)", show=True),
    Binding("q", "quit", "Quit", id="quit", tooltip="Quit (asks first when edits are unsaved)", group=APP),
    Binding(
        "ctrl+q",
        "quit",
        "Quit",
        id="quit-now",
        tooltip="Quit (asks first when edits are unsaved)",
        group=APP,
        show=False,
        priority=True,
    ),
]

SCROLL_BINDINGS: list[BindingType] = [
    Binding("down,j", "scroll_down", "Down", show=False),
    Binding("up,k", "scroll_up", "Up", show=False),
    Binding("pagedown,space", "page_down", "Page down", show=False),
    Binding("pageup", "page_up", "Page up", show=False),
    Binding("home,g", "scroll_home", "Top", show=False),
    Binding("end,G", "scroll_end", "Bottom", show=False),
]

LIST_BINDINGS: list[BindingType] = [
    Binding("down,j", "cursor_down", "Down", show=False),
    Binding("up,k", "cursor_up", "Up", show=False),
    Binding("home,g", "first", "First", show=False),
    Binding("end,G", "last", "Last", show=False),
]
"""The report lists (compare, diff, findings): vim keys beside the arrows."""


@dataclass(frozen=True)
class KeyRow:
    """One line of help or one palette entry: all the keys of one action."""

    group: str
    keys: tuple[str, ...]
    description: str
    tooltip: str
    action: str
    namespace: DOMNode
    enabled: bool

    @property
    def key_text(self) -> str:
        """``j / ↓``: single ASCII keys (vim's) first."""
        return " / ".join(sorted(self.keys, key=lambda name: not (len(name) == 1 and name.isascii())))


def key_rows(active: dict[str, ActiveBinding]) -> list[KeyRow]:
    """The active bindings as rows, one per action, in group order then binding order (system keys left out)."""
    rows: dict[tuple[int, str], KeyRow] = {}
    for name, (namespace, binding, enabled, tooltip) in active.items():
        if binding.system:
            continue
        row_id = (id(namespace), binding.action)
        found = rows.get(row_id)
        if found is not None:
            rows[row_id] = replace(found, keys=(*found.keys, key_name(name)))
            continue
        group = binding.group.description if binding.group else "other"
        rows[row_id] = KeyRow(
            group,
            (key_name(name),),
            binding.description,
            tooltip or binding.tooltip,
            binding.action,
            namespace,
            enabled,
        )
    order = [group.description for group in GROUP_ORDER]
    return sorted(rows.values(), key=lambda row: order.index(row.group) if row.group in order else len(order))


_NAMES = {
    "question_mark": "?",
    "slash": "/",
    "pagedown": "PgDn",
    "pageup": "PgUp",
    "down": "↓",
    "up": "↑",
    "left": "←",
    "right": "→",
    "home": "Home",
    "end": "End",
}


def key_name(name: str) -> str:
    """A key as people write it: ``?``, ``/``, ``PgDn``, ``ctrl+s``."""
    return _NAMES.get(name, name)
