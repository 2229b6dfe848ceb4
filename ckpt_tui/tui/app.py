"""``ckpt-tui FILE``: browse, check, fix and save a checkpoint over SSH."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Input, Static, Tree
from textual.worker import get_current_worker

from ckpt_tui.core import edits, process
from ckpt_tui.core.edits import Change
from ckpt_tui.core.errors import CkptError, EditError
from ckpt_tui.core.keypath import KeyPath, to_python, to_slash
from ckpt_tui.core.reading import open_checkpoint
from ckpt_tui.core.session import Session
from ckpt_tui.core.state_dicts import tensor_items
from ckpt_tui.core.summary import Summary, summarize
from ckpt_tui.core.tree import Checkpoint, Tensor, get, iter_nodes
from ckpt_tui.tui.screens.dialogs import (
    ConfirmScreen,
    ErrorScreen,
    HelpScreen,
    PreviewScreen,
    ProgressScreen,
    PromptScreen,
    ReportScreen,
    SaveScreen,
)
from ckpt_tui.tui.widgets.detail import DetailPanel
from ckpt_tui.tui.widgets.summary import SummaryHeader, summary_text
from ckpt_tui.tui.widgets.tree_view import MORE, CheckpointTree, NodeData

STATS_DELAY = 0.15
EDIT_ACTIONS = frozenset({"strip_prefix", "add_prefix", "extract", "remap", "rename", "delete", "cast", "undo", "redo"})
LOADED_ACTIONS = frozenset({"save", "compare", "diff"})

# (key, action, description, group, shown in the footer)
KEYS: list[tuple[str, str, str, str, bool]] = [
    ("question_mark,f1", "help", "Help", "app", True),
    ("slash", "search", "Search", "navigate", True),
    ("n", "next_match", "Next match", "navigate", False),
    ("N", "previous_match", "Previous match", "navigate", False),
    ("y", "copy_path", "Copy key path", "navigate", False),
    ("v", "toggle_grouping", "Group by module", "view", False),
    ("p", "strip_prefix", "Strip prefix", "edit", True),
    ("P", "add_prefix", "Add prefix", "edit", False),
    ("x", "extract", "Extract subtree as root", "edit", False),
    ("m", "remap", "Map devices", "edit", False),
    ("r", "rename", "Rename key", "edit", False),
    ("d", "delete", "Delete key or subtree", "edit", False),
    ("t", "cast", "Cast dtype", "edit", False),
    ("u", "undo", "Undo", "edit", True),
    ("ctrl+r", "redo", "Redo", "edit", False),
    ("c", "compare", "Compare with a model checkpoint or keys file", "file", False),
    ("D", "diff", "Diff with another checkpoint", "file", False),
    ("ctrl+s", "save", "Save as", "file", True),
    ("q", "quit_guarded", "Quit", "app", True),
]
TREE_KEYS = [
    ("j / k, ↓ / ↑", "Move down / up"),
    ("h / l, ← / →", "Collapse or parent / expand or first child"),
    ("g / G", "Top / bottom"),
    ("space", "Expand or collapse"),
    ("enter", "Details and stats now"),
]


class CkptApp(App[None]):
    """The checkpoint browser."""

    CSS_PATH = "app.tcss"
    TITLE = "ckpt-tui"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(key, action, description, show=shown, id=action) for key, action, description, _, shown in KEYS
    ]

    def __init__(self, path: str | list[str], readonly: bool = False, display_name: str | None = None) -> None:
        super().__init__()
        self.opened = path  # one path, or several rank files opened as one checkpoint
        self.path = path if isinstance(path, str) else path[0]
        self.readonly = readonly
        self.display_name = display_name or os.path.basename(self.path.rstrip("/")) or self.path
        self.session: Session | None = None
        self.summary: Summary | None = None
        self.matches: list[KeyPath] = []
        self.match_index = 0
        self._stats_timer: Timer | None = None
        self.note = ""
        self.shared_counts: dict[int, int] = {}

    # ---- layout and loading -----------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield SummaryHeader(f"opening {self.display_name}…", id="summary")
        with Horizontal(id="main"):
            yield CheckpointTree(id="tree")
            yield DetailPanel(id="detail")
        yield Input(placeholder="search key paths (enter: go, escape: close)", id="search")
        yield Static(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#search").display = False
        self.query_one(CheckpointTree).root.set_label(Text(f"reading {self.display_name} (metadata only)…", "italic"))
        self.update_status()
        self.load_checkpoint()

    @work(thread=True, exclusive=True, group="load")
    def load_checkpoint(self) -> None:
        """Read the file (metadata only) off the UI thread."""
        try:
            checkpoint = open_checkpoint(self.opened)
        except CkptError as exc:
            self.call_from_thread(self.push_screen, ErrorScreen(str(exc)))
            return
        process.freeze_gc()  # the tree lives as long as the session: keep it out of every collection
        self.call_from_thread(self.loaded, checkpoint)
        summary = summarize(checkpoint)
        self.call_from_thread(self.show_summary, summary)

    def loaded(self, checkpoint: Checkpoint) -> None:
        """Show a freshly read checkpoint (the summary follows from the same worker)."""
        self.session = Session(checkpoint)
        self.query_one(SummaryHeader).update(f"{self.display_name}: counting…")
        tree = self.query_one(CheckpointTree)
        tree.show(checkpoint.root, self.display_name)
        tree.focus()
        self.refresh_bindings()
        self.update_status()

    def show_summary(self, summary: Summary) -> None:
        """Totals and findings in the header; remember which storages are shared."""
        self.summary = summary
        self.query_one(SummaryHeader).update(summary_text(summary))
        counts: dict[int, int] = {}
        for _, tensor in summary.tensors:
            if tensor.storage is not None:
                counts[id(tensor.storage)] = counts.get(id(tensor.storage), 0) + 1
        self.shared_counts = counts

    # ---- the status line and action availability ----------------------------------------

    def update_status(self, message: str | None = None) -> None:
        """Focused path, unsaved edits (in words, not only colour), then the last note (kept until a key)."""
        if message is not None:
            self.note = message
        message = self.note
        parts = []
        node = self.focused_data()
        if node is not None:
            parts.append(to_python(node.path))
        if self.readonly:
            parts.append("[read-only]")
        elif self.session is not None:
            unsaved = self.session.unsaved
            parts.append(f"● {unsaved} unsaved edit{'s' if unsaved != 1 else ''}" if unsaved else "no unsaved edits")
        if message:
            parts.append(message)
        self.query_one("#status", Static).update(Text("  ·  ".join(parts)))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in EDIT_ACTIONS or action == "save":
            if self.readonly:
                return False
            if self.session is None:
                return None
        if action in LOADED_ACTIONS and self.session is None:
            return None
        if action == "undo" and self.session is not None and self.session.position == 0:
            return None
        if action == "redo" and self.session is not None and self.session.position + 1 >= len(self.session.versions):
            return None
        return True

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for key, action, description, group, _ in KEYS:
            if self.check_action(action, ()) is False:
                continue
            yield SystemCommand(f"{group}: {description}", f"key: {key.split(',')[0]}", self._runner(action))

    def _runner(self, action: str) -> Callable[[], Any]:
        return lambda: self.run_action(action)

    # ---- focus and details ------------------------------------------------------------

    def focused_data(self) -> NodeData | None:
        """The data of the tree line under the cursor."""
        try:
            node = self.query_one(CheckpointTree).cursor_node
        except Exception:
            return None
        return node.data if node is not None else None

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted[NodeData]) -> None:
        data = event.node.data
        if data is None or data.value is MORE:
            return
        self.show_details(data)
        if self._stats_timer is not None:
            self._stats_timer.stop()
        self.workers.cancel_group(self, "stats")
        if isinstance(data.value, Tensor) and data.group is None:
            self._stats_timer = self.set_timer(STATS_DELAY, lambda: self.compute_stats(data.value))
        self.update_status()

    def on_tree_node_selected(self, event: Tree.NodeSelected[NodeData]) -> None:
        data = event.node.data
        if data is not None and isinstance(data.value, Tensor):
            if self._stats_timer is not None:
                self._stats_timer.stop()
            self.compute_stats(data.value)

    def show_details(self, data: NodeData) -> None:
        """Fill the detail panel for a node."""
        detail = self.query_one(DetailPanel)
        value = data.group if data.group is not None else data.value
        shared = 0
        if isinstance(value, Tensor) and value.storage is not None:
            shared = self.shared_counts.get(id(value.storage), 1) - 1
        if data.group is not None:
            detail.show_group(data.path, data.group)
            return
        detail.show(data.path, value, shared)
        if isinstance(value, Tensor) and (value.storage is None or value.kind != "dense"):
            detail.show_message(f"no stats: the values of {value.kind} tensors are not in this file")

    @work(thread=True, exclusive=True, group="stats")
    def compute_stats(self, tensor: Tensor) -> None:
        """Stats in a worker; the next cursor move cancels it."""
        from ckpt_tui.core.stats import tensor_stats  # numpy: imported when first needed

        worker = get_current_worker()
        detail = self.query_one(DetailPanel)
        byteorder = self.session.checkpoint.byteorder if self.session else "little"
        last = [0.0]

        def progress(fraction: float) -> None:
            if fraction - last[0] >= 0.02 and not worker.is_cancelled:
                last[0] = fraction
                self.call_from_thread(detail.progress, fraction)

        try:
            stats = tensor_stats(tensor, byteorder, cancelled=lambda: worker.is_cancelled, progress=progress)
        except CkptError as exc:
            if not worker.is_cancelled:
                self.call_from_thread(detail.show_message, f"no stats: {exc}")
            return
        if not worker.is_cancelled:
            self.call_from_thread(detail.show_stats, stats)

    # ---- navigation actions -----------------------------------------------------------

    def action_help(self) -> None:
        rows = [("navigate", keys, description) for keys, description in TREE_KEYS]
        for key, action, description, group, _ in KEYS:
            if self.check_action(action, ()) is not False:
                rows.append((group, key.replace("question_mark", "?").replace("slash", "/"), description))
        rows.sort(key=lambda row: ["navigate", "view", "edit", "file", "app"].index(row[0]))
        self.push_screen(HelpScreen(rows))

    def action_copy_path(self) -> None:
        data = self.focused_data()
        if data is None:
            return
        text = to_python(data.path)
        self.copy_to_clipboard(text)
        self.update_status(f"copied {text}")
        self.notify(text, title="Copied key path")

    def action_toggle_grouping(self) -> None:
        tree = self.query_one(CheckpointTree)
        tree.grouped = not tree.grouped
        self.redraw(self.current_path())
        self.update_status("grouped by module path" if tree.grouped else "plain keys")

    def action_search(self) -> None:
        field = self.query_one("#search", Input)
        field.display = True
        field.value = ""
        field.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "search":
            return
        query = event.value.strip().lower()
        event.input.display = False
        self.query_one(CheckpointTree).focus()
        if not query or self.session is None:
            return
        self.matches = [p for p, _ in iter_nodes(self.session.root) if p and query in to_slash(p).lower()]
        self.match_index = 0
        if not self.matches:
            self.update_status(f"no key path contains {query!r}")
            return
        self.go_to_match()

    def on_key(self, event: Any) -> None:
        if event.key not in ("n", "N"):
            self.note = ""
        search = self.query_one("#search", Input)
        if event.key == "escape" and search.display:
            search.display = False
            self.query_one(CheckpointTree).focus()
            event.stop()

    def go_to_match(self) -> None:
        """Reveal the current match (expanding its ancestors)."""
        path = self.matches[self.match_index]
        self.query_one(CheckpointTree).reveal(path)
        self.update_status(f"match {self.match_index + 1}/{len(self.matches)}")

    def action_next_match(self) -> None:
        if self.matches:
            self.match_index = (self.match_index + 1) % len(self.matches)
            self.go_to_match()

    def action_previous_match(self) -> None:
        if self.matches:
            self.match_index = (self.match_index - 1) % len(self.matches)
            self.go_to_match()

    # ---- edits ------------------------------------------------------------------------

    def current_path(self) -> KeyPath:
        """The focused node's path (the root when nothing is focused)."""
        data = self.focused_data()
        return data.path if data is not None else ()

    def target_dict(self) -> KeyPath:
        """The state_dict a key edit applies to: the focused one, the one holding the focus, or the detected one."""
        assert self.session is not None
        path = self.current_path()
        for depth in range(len(path), -1, -1):
            value = get(self.session.root, path[:depth])
            if isinstance(value, dict) and tensor_items(value) is not None:
                return path[:depth]
        return edits.default_target(self.session.root)

    def propose(self, edit: Callable[[Any], tuple[Any, Change]], keep: KeyPath | None = None) -> None:
        """Preview an edit, then apply it if confirmed."""
        if self.session is None:
            return
        try:
            new_root, change = self.session.preview(edit)
        except CkptError as exc:
            self.notify(str(exc), title="Edit does not apply", severity="warning")
            return

        def answer(confirmed: bool | None) -> None:
            if confirmed and self.session is not None:
                self.session.apply(new_root, change)
                self.after_edit(keep, f"applied: {change.title}")

        self.push_screen(PreviewScreen(change), answer)

    def after_edit(self, keep: KeyPath | None, message: str) -> None:
        """Redraw the tree and recount after the tree changed."""
        self.redraw(keep)
        self.refresh_bindings()
        self.update_status(message)
        self.recount()

    def redraw(self, keep: KeyPath | None) -> None:
        if self.session is not None:
            self.query_one(CheckpointTree).show(self.session.root, self.display_name, keep)

    @work(thread=True, exclusive=True, group="summary")
    def recount(self) -> None:
        """Recompute the header's totals and findings for the edited tree."""
        if self.session is None:
            return
        edited = dataclasses.replace(self.session.checkpoint, root=self.session.root)
        summary = summarize(edited)
        self.call_from_thread(self.show_summary, summary)

    def ask(self, title: str, value: str, hint: str, then: Callable[[str], Any]) -> None:
        """Prompt for text, then continue."""

        def answer(text: str | None) -> None:
            if text:
                then(text)

        self.push_screen(PromptScreen(title, value, hint), answer)

    def action_strip_prefix(self) -> None:
        try:
            target = self.target_dict()
        except EditError as exc:
            self.notify(str(exc), severity="warning")
            return
        self.propose(lambda root: edits.strip_prefix(root, "auto", target), target)

    def action_add_prefix(self) -> None:
        try:
            target = self.target_dict()
        except EditError as exc:
            self.notify(str(exc), severity="warning")
            return
        self.ask(
            "Add a prefix to every key of " + to_python(target),
            "module.",
            "e.g. module. for DataParallel/DDP",
            lambda prefix: self.propose(lambda root: edits.add_prefix(root, prefix, target), target),
        )

    def action_extract(self) -> None:
        path = self.current_path()
        target: KeyPath | str = path if path else "auto"
        self.propose(lambda root: edits.extract(root, target), ())

    def action_remap(self) -> None:
        self.ask(
            "Map saved devices",
            "cpu",
            "cpu, cuda:0, or cuda:1=cuda:0,cuda:2=cpu",
            lambda spec: self.propose(lambda root: edits.remap_devices(root, spec), self.current_path()),
        )

    def action_rename(self) -> None:
        path = self.current_path()
        if not path or not isinstance(path[-1], str):
            self.notify("put the cursor on a named key to rename it", severity="warning")
            return
        old = path[-1]
        self.ask(
            f"Rename {old!r}",
            old,
            "the key keeps its place",
            lambda new: self.propose(lambda root: edits.rename(root, path, new), (*path[:-1], new)),
        )

    def action_delete(self) -> None:
        path = self.current_path()
        self.propose(lambda root: edits.delete(root, path), path[:-1])

    def action_cast(self) -> None:
        self.ask(
            "Cast floating-point tensors to",
            "float16",
            "float16, bfloat16 or float32",
            lambda dtype: self.propose(lambda root: edits.cast(root, dtype), self.current_path()),
        )

    def action_undo(self) -> None:
        if self.session is not None:
            change = self.session.undo()
            if change is not None:
                self.after_edit(self.current_path(), f"undone: {change.title}")

    def action_redo(self) -> None:
        if self.session is not None:
            change = self.session.redo()
            if change is not None:
                self.after_edit(self.current_path(), f"redone: {change.title}")

    # ---- compare and diff ---------------------------------------------------------------

    def compare_target(self) -> KeyPath:
        """What ``c`` compares: the dict or module under the cursor (or holding it), else the root."""
        assert self.session is not None
        path = self.current_path()
        for depth in range(len(path), -1, -1):
            value = get(self.session.root, path[:depth])
            if isinstance(value, dict) or (hasattr(value, "is_module") and value.is_module):
                return path[:depth]
        return ()

    def action_compare(self) -> None:
        if self.session is None:
            return
        folder = str(Path(self.path).parent) + os.sep
        self.ask(
            "Compare with (a checkpoint of the target model, or a text file of keys)",
            folder,
            "the report lists missing, unexpected and mismatched keys, and the fix",
            lambda reference: self.compare_worker(reference, self.compare_target()),
        )

    @work(thread=True, exclusive=True, group="compare")
    def compare_worker(self, reference_path: str, at: KeyPath) -> None:
        """Read the reference and compare, off the UI thread."""
        from ckpt_tui.core.compare import compare, load_reference

        assert self.session is not None
        try:
            report = compare(get(self.session.root, at), load_reference(reference_path, None))
        except CkptError as exc:
            self.call_from_thread(self.notify, str(exc), title="Cannot compare", severity="error")
            return
        self.call_from_thread(self.show_compare, report, at, reference_path)

    def show_compare(self, report: Any, at: KeyPath, reference_path: str) -> None:
        """The compare report as a screen."""
        from ckpt_tui.core.compare import apply_suggestion, fold_keys

        summary = (
            f"{'fits' if report.ok else 'does NOT fit'}: {report.matched}/{report.total} reference keys found, "
            f"{len(report.missing)} missing, {len(report.unexpected)} unexpected, "
            f"{len(report.shape_mismatches)} shape mismatches"
        )
        if report.suggestion is not None:
            summary += f"\nsuggested fix: {report.suggestion.describe()}\n  {report.suggestion.command(self.path)}"
        sections = [
            ("missing: in the reference, not here", [("", key) for key in fold_keys(report.missing)]),
            ("unexpected: here, not in the reference", [(key, key) for key in report.unexpected]),
            (
                "shape mismatches (here vs reference)",
                [(k, f"{k}: {list(a)} vs {list(b)}") for k, a, b in report.shape_mismatches],
            ),
            ("dtype mismatches (cast on load)", [(k, f"{k}: {a} vs {b}") for k, a, b in report.dtype_mismatches]),
        ]

        def done(result: tuple[str, str] | None) -> None:
            if result is None:
                return
            kind, key = result
            if kind == "jump" and key:
                self.query_one(CheckpointTree).reveal((*at, key))
            elif kind == "fix" and report.suggestion is not None:
                suggestion = report.suggestion

                def edit(root: Any) -> tuple[Any, Change]:
                    new_root, changes = apply_suggestion(root, at, suggestion)
                    examples = [e for change in changes for e in change.examples][:5]
                    return new_root, Change(suggestion.describe(), sum(c.count for c in changes), examples)

                self.propose(edit, ())

        title = f"Compare {to_python(at) if at else self.display_name} with {os.path.basename(reference_path)}"
        self.push_screen(ReportScreen(title, summary, sections, report.suggestion is not None), done)

    def action_diff(self) -> None:
        if self.session is None:
            return
        folder = str(Path(self.path).parent) + os.sep
        self.ask(
            "Diff with checkpoint",
            folder,
            "keys on one side only, shape/dtype changes, value differences",
            self.diff_worker,
        )

    @work(thread=True, exclusive=True, group="compare")
    def diff_worker(self, other_path: str) -> None:
        """Diff the (edited) checkpoint with another file, streamed, off the UI thread."""
        from ckpt_tui.core.diff import diff

        assert self.session is not None
        mine = dataclasses.replace(self.session.checkpoint, root=self.session.root)
        try:
            report = diff(mine, open_checkpoint(other_path))
        except CkptError as exc:
            self.call_from_thread(self.notify, str(exc), title="Cannot diff", severity="error")
            return
        self.call_from_thread(self.show_diff, report, other_path)

    def show_diff(self, report: Any, other_path: str) -> None:
        """The diff report as a screen; enter jumps to a key of this checkpoint."""
        from ckpt_tui.core.convert import resolve_path

        summary = (
            "identical"
            if report.identical
            else f"{report.identical_tensors} tensors identical, {len(report.value_changes)} differ in value, "
            f"{len(report.only_a)} only here, {len(report.only_b)} only there"
        )
        sections = [
            ("only here", [(k, k) for k in report.only_a]),
            ("only in the other file", [("", k) for k in report.only_b]),
            ("shape changes", [(k, f"{k}: {list(a)} → {list(b)}") for k, a, b in report.shape_changes]),
            ("dtype changes", [(k, f"{k}: {a} → {b}") for k, a, b in report.dtype_changes]),
            (
                "value changes",
                [
                    (d.key, f"{d.key}: max |a-b| {d.max_abs:.4g}, {'allclose' if d.close else 'NOT close'}")
                    for d in report.value_changes
                ],
            ),
            ("other values", [(k, f"{k}: {a} → {b}") for k, a, b in report.other_changes]),
        ]

        def done(result: tuple[str, str] | None) -> None:
            if result and result[0] == "jump" and result[1] and self.session is not None:
                with contextlib.suppress(CkptError):
                    self.query_one(CheckpointTree).reveal(resolve_path(self.session.root, result[1]))

        title = f"Diff {self.display_name} with {os.path.basename(other_path)}"
        self.push_screen(ReportScreen(title, summary, sections, False), done)

    # ---- saving and quitting ------------------------------------------------------------

    def default_save_path(self) -> str:
        """A new name next to the input: ``best_model.fixed.pth``."""
        source = Path(self.path)
        folder = source.parent if source.is_file() else source
        stem = source.name.split(".")[0] or "checkpoint"
        suffix = ".safetensors" if source.suffix == ".safetensors" else ".pth"
        return str(folder / f"{stem}.fixed{suffix}")

    def action_save(self) -> None:
        if self.session is None:
            return

        def chosen(choice: tuple[str, str] | None) -> None:
            if choice is None:
                return
            target, fmt = choice
            if not os.path.exists(target):
                self.start_save(target, fmt, force=False)
                return
            is_input = os.path.samefile(target, self.path) if os.path.exists(self.path) else False
            question = "Replace THE INPUT FILE?" if is_input else f"Replace {target}?"
            detail = "This overwrites the checkpoint you opened." if is_input else "The existing file will be replaced."
            self.push_screen(
                ConfirmScreen(question, detail + " (default: No)", loud=True),
                lambda yes: self.start_save(target, fmt, force=True) if yes else None,
            )

        self.push_screen(SaveScreen(self.default_save_path()), chosen)

    def start_save(self, target: str, fmt: str, force: bool) -> None:
        """Open the progress dialog and write in a worker."""
        screen = ProgressScreen(f"Saving {target}")
        self.push_screen(screen)
        self.save_worker(target, fmt, force, screen)

    @work(thread=True, exclusive=True, group="save")
    def save_worker(self, target: str, fmt: str, force: bool, screen: ProgressScreen) -> None:
        """Write, verify and rename into place; report the result."""
        from ckpt_tui.core.writers.save import save

        assert self.session is not None
        worker = get_current_worker()
        last = [0.0]

        def progress(done: int, total: int) -> None:
            fraction = done / total if total else 1.0
            if fraction - last[0] >= 0.02:
                last[0] = fraction
                self.call_from_thread(screen.advance, fraction)

        try:
            result = save(
                self.session.root,
                target,
                fmt,
                byteorder=self.session.checkpoint.byteorder,
                force=force,
                inputs=(self.session.checkpoint.path,),
                metadata=self.session.checkpoint.metadata,
                progress=progress,
                cancelled=lambda: screen.cancelled or worker.is_cancelled,
            )
        except CkptError as exc:
            self.call_from_thread(self.save_done, screen, None, str(exc))
            return
        self.call_from_thread(self.save_done, screen, result.line(), "")

    def save_done(self, screen: ProgressScreen, line: str | None, error: str) -> None:
        """Close the progress dialog and say what happened."""
        screen.dismiss()
        if line is None:
            self.notify(error, title="Not saved", severity="error", timeout=10)
            self.update_status(f"not saved: {error}")
            return
        assert self.session is not None
        self.session.mark_saved()
        self.notify(line, title="Saved", timeout=10)
        self.update_status(line)

    def action_quit_guarded(self) -> None:
        if self.session is None or not self.session.unsaved:
            self.exit()
            return
        count = self.session.unsaved
        self.push_screen(
            ConfirmScreen(f"Quit and lose {count} unsaved edit{'s' if count != 1 else ''}?", "(default: No)", True),
            lambda yes: self.exit() if yes else None,
        )
