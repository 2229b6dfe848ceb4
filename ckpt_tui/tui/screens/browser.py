"""The browser screen: the summary header, the tree, the detail panel, search and the status line.

It owns everything about looking at the session's tree and proposing edits to it. The App owns the
session itself, reading the file, saving and quitting. Workers started here get their inputs as
arguments and post typed messages back; a result for an older session version is dropped.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar, cast

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Input, Static, Tree
from textual.worker import get_current_worker

from ckpt_tui.core.conventions.state_dicts import common_prefix, inner_state_dict, tensor_items
from ckpt_tui.core.edits import group_edits
from ckpt_tui.core.edits import tree_edits as edits
from ckpt_tui.core.edits.sanitize import sanitize
from ckpt_tui.core.edits.session import Session
from ckpt_tui.core.edits.tree_edits import Change
from ckpt_tui.core.errors import Cancelled, CkptError, EditError, NothingChanges
from ckpt_tui.core.model.describe import Totals
from ckpt_tui.core.model.keypath import KeyPath, to_python, to_slash
from ckpt_tui.core.model.numpy_values import numpy_value
from ckpt_tui.core.model.tree import Checkpoint, Opaque, Tensor, get, has_children, iter_nodes, iter_tensors
from ckpt_tui.core.operations.check import CheckReport
from ckpt_tui.core.operations.hints import ComparedModel
from ckpt_tui.core.operations.info import Summary
from ckpt_tui.core.operations.staged import staged_summary
from ckpt_tui.core.runtime import process
from ckpt_tui.core.runtime.safe_text import from_printable, printable
from ckpt_tui.core.weights_only.verdict import Verdict, verdict
from ckpt_tui.core.writers.judge import Outlook, judge_tree
from ckpt_tui.tui import targets
from ckpt_tui.tui.bindings import APP_BINDINGS, BROWSER_BINDINGS, EDIT, EDIT_ALONE, key_rows
from ckpt_tui.tui.host import BrowserHost
from ckpt_tui.tui.messages import (
    REDRAW_EVERY,
    GroupingReady,
    PreviewReady,
    Progress,
    SearchFound,
    StagedJudged,
    SummaryReady,
    worker_progress,
)
from ckpt_tui.tui.screens.check_all import CheckAllScreen, CheckOutcome
from ckpt_tui.tui.screens.compare import CompareScreen
from ckpt_tui.tui.screens.dialogs import PreviewScreen, PromptScreen, SaveScreen
from ckpt_tui.tui.screens.diff import DiffScreen
from ckpt_tui.tui.screens.findings import FindingsScreen
from ckpt_tui.tui.screens.help import HelpScreen
from ckpt_tui.tui.screens.layer_change import LayerChangeScreen
from ckpt_tui.tui.screens.layers import LayersScreen
from ckpt_tui.tui.screens.report import ApplyFix, Jump, MeasureLayers, ReportResult
from ckpt_tui.tui.suggesters import PathSuggester
from ckpt_tui.tui.targets import Relocate, Target
from ckpt_tui.tui.text import data, path_text, where
from ckpt_tui.tui.widgets.detail import DetailPanel
from ckpt_tui.tui.widgets.footer import KeysFooter
from ckpt_tui.tui.widgets.summary import (
    Judged,
    SummaryHeader,
    check_findings,
    listed_findings,
    sanitize_applies,
    sanitize_unavailable,
    strip_applies,
    verdict_finding,
)
from ckpt_tui.tui.widgets.tree_view import (
    CheckpointTree,
    NodeData,
    RowId,
    ViewState,
    groupings_along,
    listings_along,
    marked_below,
)

EDIT_ACTIONS = frozenset(b.action for b in BROWSER_BINDINGS if isinstance(b, Binding) and b.group in (EDIT, EDIT_ALONE))
"""The browser's edit keys' actions, as the bindings group them (hidden while read-only)."""
SESSION_ACTIONS = EDIT_ACTIONS | {"compare", "diff", "search", "next_match", "previous_match", "findings", "layers"}
MAX_MATCHES = 100_000
STALE_LINE = "CHANGED ON DISK since opened: tree is stale, values refused; open it again"
"""The header's first line once a read of values found the file changed on disk (fits 80 columns)."""
READONLY_KEYS = {
    name: binding.action
    for binding in [*BROWSER_BINDINGS, *APP_BINDINGS]
    if isinstance(binding, Binding) and (binding.action in EDIT_ACTIONS or binding.action == "save")
    for name in binding.key.split(",")
}
"""The edit keys (hidden while read-only), by key name, to their actions."""

Edit = Callable[[Any], tuple[Any, Change]]
JOBS = {"grouping": "grouping keys", "search": "searching", "preview": "computing the edit"}
"""The browser's long work, by worker group, as the status line says it."""


@dataclasses.dataclass(frozen=True)
class Proposal:
    """How to go on with an edit once computed: where its cursor goes, and what to do if it does not apply."""

    relocate: Relocate
    failed: Callable[[str], Any] | None = None
    cursor: RowId | None = None
    """Where the cursor goes instead of where ``relocate`` puts it (a deleted line's neighbour)."""
    loads: str | None = None
    """How the edited tree loads into the model compared with (a compare's fix says it; None: as before)."""
    then: Callable[[], Any] | None = None
    """What comes after the preview is answered, yes or no (the view the edit was asked from, again)."""


@dataclasses.dataclass
class Known:
    """What the browser worked out about one tree of the session. A tree never changes (an edit builds a new one)
    and undo and redo come back to the same tree object, so what was counted and judged of it still holds."""

    root: Any
    summary: SummaryReady | None = None
    counted_with: tuple[bool, ComparedModel | None] | None = None
    """Whether the tree was edited, and the model compared with, when ``summary`` was counted."""
    outlook: Outlook | None = None
    check: CheckReport | None = None
    """What reading every tensor (C) of this tree found, once read."""
    markers: dict[int, str] = dataclasses.field(default_factory=dict)
    """The tree's ``!!`` marks from ``check``, by ``id`` of each tensor."""
    loads: str = ""
    """How it loads into the model last compared with, where a staged fix leaves keys to strict=False (the
    status line keeps it: the report that said so is closed)."""


class BrowserScreen(Screen[None]):
    """Browse the checkpoint, look at values, and stage edits."""

    BINDINGS: ClassVar[list[BindingType]] = BROWSER_BINDINGS

    def __init__(self, display_name: str, first_text: str = "") -> None:
        super().__init__()
        self.display_name = display_name
        self.first_text = first_text
        """What the screen says until the file is read, when there is more to do first (writing the demo)."""
        self.summary: Summary | None = None
        self.verdicts: dict[str, Verdict] = {}  # by file path: the file on disk does not change with edits
        self.outlooks: dict[int, Outlook] = {}
        """By session version: what torch.load(weights_only=True) makes of that tree once saved as ``.pth``."""
        self.known: dict[int, Known] = {}
        """By ``id`` of a tree's root (held there, so the id stays its own): its summary and verdict once known."""
        self.check: CheckReport | None = None  # the full check (C) of the current tree, once read
        self.sanitize_applies = False  # whether the header says torch.load refuses data that s rewrites
        self.strip_applies = False  # whether a finding names a prefix that p strips
        # whether any tree of this file was read with C: an edited tree not read yet is then said to need it
        self.checked_once = False
        # the model last compared with (c): the header's prefix findings take its keys as evidence
        self.compared: ComparedModel | None = None
        self.storage_users: dict[int, int] = {}
        self.matches: list[KeyPath] = []
        self.match_index = 0
        self.edit_views: dict[int, tuple[ViewState, Relocate]] = {}
        """By the session position an edit made: the view before it and how it moves the cursor (undo/redo)."""
        self.note = ""
        self.note_leads = False
        self.job: str | None = None
        """The browser's long work now running (a worker group: ``grouping``, ``search``, ``preview``)."""
        self.job_text = ""
        self.job_serial = 0

    @property
    def ckpt_app(self) -> BrowserHost:
        """The app, as far as this screen needs it."""
        return cast("BrowserHost", self.app)

    @property
    def session(self) -> Session | None:
        """The app's editing session (None while the file is read)."""
        return self.ckpt_app.session

    @property
    def tree_view(self) -> CheckpointTree:
        """The tree widget."""
        return self.query_one(CheckpointTree)

    @property
    def detail(self) -> DetailPanel:
        """The detail panel."""
        return self.query_one(DetailPanel)

    # ---- layout --------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield SummaryHeader(f"opening {self.display_name}…", id="summary")
        with Horizontal(id="main"):
            yield CheckpointTree(id="tree")
            yield DetailPanel(id="detail")
        yield Input(placeholder="search key paths (enter: go, escape: close)", id="search")
        yield Static(id="status", markup=False)
        yield KeysFooter()

    def on_mount(self) -> None:
        self.query_one("#search").display = False
        self.query_one(SummaryHeader).readonly = self.ckpt_app.readonly
        if self.session is None:
            self.show_reading(self.first_text or f"reading {self.display_name} (metadata only)…")

    def show_reading(self, text: str) -> None:
        """Empty the tree while the file is (re)read."""
        self.tree_view.clear()
        self.tree_view.root.set_label(data(text, "italic"))
        self.tree_view.root.data = None
        self.query_one(SummaryHeader).show_text(text)
        self.detail.show_text(text)
        self.update_status()

    def show_session(self, note: str = "", view: ViewState | None = None) -> None:
        """Show the session's tree (keeping ``view``), then count it in a worker."""
        session = self.session
        if session is None:
            return
        self.query_one(SummaryHeader).show_text(f"{self.display_name}: counting…")
        self.edit_views = {}
        self.known = {}
        # a (re)read file is a new tree: an earlier check's result and marks are not about it
        self.check, self.checked_once = None, False
        self.tree_view.markers = {}
        self.tree_view.show(session.root, self.display_name, view)
        self.tree_view.focus()
        self.refresh_bindings()
        self.update_status(note)
        self.recount()
        self.call_after_refresh(self.follow_cursor)

    # ---- the summary -----------------------------------------------------------------------

    def recount(self) -> None:
        """Recompute the header's totals and findings for the current tree (taken as they are where this tree
        was counted and judged before: an undo or a redo comes back to a tree the browser has seen)."""
        session = self.session
        if session is None:
            return
        # what runs for the tree shown before is not wanted: its summary and judge stop at their next batch
        self.workers.cancel_group(self, "summary")
        self.workers.cancel_group(self, "judge")
        known = self.known_of(session)
        if known.outlook is not None:
            self.outlooks.setdefault(session.version, known.outlook)
        judge = session.edited and session.version not in self.outlooks
        counted = known.summary
        if counted is not None and known.counted_with == (session.edited, self.compared):
            self._show_summary(counted)
            if judge:
                self._judge(session.version, session.root)
            return
        on_disk = self.verdicts.get(session.checkpoint.path)
        self._summarize(
            session.version, session.root, session.checkpoint, session.edited, on_disk, judge, self.compared
        )

    def known_of(self, session: Session) -> Known:
        """What is known of the session's current tree; what is known of trees no longer in its history goes."""
        root = session.root
        found = self.known.get(id(root))
        if found is not None and found.root is root:
            return found
        alive = {id(tree) for tree, _ in session.versions}
        self.known = {key: known for key, known in self.known.items() if key in alive}
        found = self.known[id(root)] = Known(root)
        return found

    @work(thread=True, exclusive=True, group="summary", description="summary")
    def _summarize(
        self,
        version: int,
        root: Any,
        on_disk: Checkpoint,
        edited: bool,
        known: Verdict | None,
        judge: bool,
        compared: ComparedModel | None = None,
    ) -> None:
        """Totals and findings off the UI thread, the file's weights_only verdict once, then (``judge``) what
        torch.load(weights_only=True) makes of the edited tree once saved; reports by message only."""
        summary = staged_summary(on_disk, root, edited, compared)
        summary.distinct_elements()  # the header's element count, worked out here rather than on the UI thread
        targets.is_state_dict(root)  # what p and P ask first, answered here rather than on the UI thread
        process.settle_young()
        users = storage_users(summary)
        self.post_message(SummaryReady(version, summary, known or verdict(on_disk), users, (edited, compared)))
        if judge:
            # after the totals: on 50,000 keys writing and judging the pickle takes seconds
            self._judge_now(version, root)

    @on(SummaryReady)
    def _summary_ready(self, message: SummaryReady) -> None:
        if self.session is None or message.version != self.session.version:
            return
        known = self.known_of(self.session)
        known.summary, known.counted_with = message, message.counted_with
        self._show_summary(message)

    def _show_summary(self, message: SummaryReady) -> None:
        assert self.session is not None
        self.summary = message.summary
        if message.weights_only is not None:
            self.verdicts[self.session.checkpoint.path] = message.weights_only
        self.show_header()
        self.storage_users = message.storage_users or {}
        self.follow_cursor()

    def judged(self) -> Judged:
        """The weights_only verdicts known for the current tree: the file's, and what saving it gives."""
        session = self.session
        if session is None:
            return Judged()
        on_disk = self.verdicts.get(session.checkpoint.path)
        return Judged(on_disk, session.edited, self.outlooks.get(session.version))

    def show_header(self) -> None:
        """The header for the current summary, verdicts and check (and the ``s`` key where it now applies)."""
        if self.summary is not None:
            judged = self.judged()
            self.query_one(SummaryHeader).show(self.summary, judged, self.check)
            applies = (sanitize_applies(judged), strip_applies(self.summary))
            if applies != (self.sanitize_applies, self.strip_applies):
                self.sanitize_applies, self.strip_applies = applies
                self.refresh_bindings()

    def judge_for_save(self) -> Outlook | None:
        """What saving the current tree as ``.pth`` gives, if known; else judged in a worker (``StagedJudged``)."""
        session = self.session
        if session is None:
            return None
        known = self.outlooks.get(session.version)
        if known is None:
            self._judge(session.version, session.root)
        return known

    @work(thread=True, exclusive=True, group="judge", description="judge")
    def _judge(self, version: int, root: Any) -> None:
        self._judge_now(version, root)

    def _judge_now(self, version: int, root: Any) -> None:
        """Judge ``root`` in this worker and report it for ``version``; nothing once the worker is cancelled
        (a newer tree is shown: its judge runs instead)."""
        worker = get_current_worker()
        try:
            outlook = judge_tree(root, lambda: worker.is_cancelled)
        except Cancelled:
            return
        if not worker.is_cancelled:
            self.post_message(StagedJudged(version, outlook))

    @on(StagedJudged)
    def _staged_judged(self, message: StagedJudged) -> None:
        if self.session is None or message.version != self.session.version:
            return
        self.outlooks[message.version] = message.outlook
        self.known_of(self.session).outlook = message.outlook
        if self.session.edited:
            self.show_header()
        if isinstance(self.app.screen, SaveScreen):
            self.app.screen.show_outlook(message.outlook)

    # ---- the cursor, the detail panel and the status line ------------------------------------

    def focused_data(self) -> NodeData | None:
        """The data of the tree line under the cursor (None on a "… more" line)."""
        node = self.tree_view.cursor_target
        if node is None or node.data is None or node.data.is_more:
            return None
        return node.data

    def focused_target(self) -> Target | None:
        """What the line under the cursor stands for."""
        found = self.focused_data()
        if found is None:
            return None
        return Target(found.path, found.group.prefix if found.group is not None else None)

    @on(Tree.NodeHighlighted)
    def _highlighted(self, event: Tree.NodeHighlighted[NodeData]) -> None:
        self.follow_cursor()

    @on(Tree.NodeSelected)
    def _selected(self, event: Tree.NodeSelected[NodeData]) -> None:
        self.follow_cursor()
        self.detail.stats_now()

    def follow_cursor(self) -> None:
        """Show the focused line in the detail panel and the status line."""
        found = self.focused_data()
        session = self.session
        if found is not None and session is not None:
            if found.group is not None:
                self.detail.show_group(found.path, found.group)
            else:
                value = found.value
                shared = 0
                if isinstance(value, Tensor) and value.storage is not None:
                    shared = max(0, self.storage_users.get(id(value.storage), 1) - 1)
                totals = self.totals_below(value) if has_children(value) else None
                self.detail.show_value(
                    found.path, value, shared=shared, totals=totals, byteorder=session.checkpoint.byteorder
                )
        self.update_status()

    def totals_below(self, value: Any) -> Totals | None:
        """Tensors, parameters and bytes below a container: the summary's for the tree it summed up
        (the root of 50,000 keys is past the browser's counting budget), else counted within the budget."""
        summary = self.summary
        if summary is not None and summary.checkpoint.root is value:
            return summary.totals()
        return self.tree_view.totals.get(value)

    def mark_stale(self, error: str) -> None:
        """The file changed on disk since it was opened: the header says the tree is the file as it was (its
        values are refused), and the status line why."""
        self.query_one(SummaryHeader).mark_stale(STALE_LINE)
        self.update_status(error, lead=True)

    def update_status(self, note: str | None = None, lead: bool = False) -> None:
        """Focused path, unsaved edits (in words, not only colour), then the last note (kept until a key); a
        ``lead`` note (a save's verdict) is the whole line until a key."""
        if note is not None:
            self.note = note
            self.note_leads = lead
        if self.note and self.note_leads:
            self.query_one("#status", Static).update(Text(printable(self.note)))
            return
        parts: list[str] = []
        target = self.focused_target()
        if target is not None:
            parts.append(path_text(target.path) + (f" › {printable(target.prefix)}*" if target.prefix else ""))
        if self.ckpt_app.readonly:
            parts.append("read-only")
        elif self.session is not None:
            unsaved = self.session.unsaved
            parts.append(f"● {unsaved} unsaved edit{'s' if unsaved != 1 else ''}" if unsaved else "no unsaved edits")
            loads = self.known_of(self.session).loads
            if loads:
                parts.append(loads)
        if self.note:
            parts.append(printable(self.note))
        self.query_one("#status", Static).update(Text("  ·  ".join(parts)))

    def on_key(self, event: Any) -> None:
        if event.key not in ("n", "N"):
            self.note = ""
        if self.ckpt_app.readonly and not isinstance(self.focused, Input):
            action = READONLY_KEYS.get(event.key)
            if action is not None:  # an edit key, hidden while read-only: say why it does nothing
                event.stop()
                if action == "save":
                    self.ckpt_app.action_save()
                else:
                    self.editable(action)
                return
        if event.key == "s" and not self.sanitize_applies and not isinstance(self.focused, Input):
            event.stop()
            self.nothing_to_do(sanitize_unavailable(self.judged()))
            return
        if event.key == "p" and not self.strip_applies and not isinstance(self.focused, Input):
            event.stop()
            self.action_strip_prefix()
            return
        search = self.query_one("#search", Input)
        if event.key == "escape" and search.display:
            search.display = False
            self.tree_view.focus()
            event.stop()
        elif event.key == "escape" and self.job is not None:
            event.stop()
            self.cancel_job()

    # ---- the browser's own long work (v, search, an edit's preview): status line, percentage, escape ------

    def start_job(self, task: str, doing: str | None = None) -> None:
        """Say on the status line that ``task`` is running in its worker (escape cancels it)."""
        self.job = task
        self.job_text = doing or JOBS[task]
        self.job_serial += 1
        self.update_status(f"{self.job_text}…")
        # the way out is offered once the work takes a moment: a quick one leaves the line as long as it was (a
        # longer line may wrap, and each wrap lays the whole screen out again)
        self.set_timer(REDRAW_EVERY, partial(self._offer_cancel, task, self.job_serial))

    def _offer_cancel(self, task: str, serial: int) -> None:
        if self.job == task and self.job_serial == serial and "escape cancels" not in self.note:
            self.update_status(f"{self.job_text}… · escape cancels")

    def job_done(self, task: str) -> bool:
        """Whether a result of ``task`` is still wanted (its job was not cancelled or replaced); ends the job."""
        if self.job != task:
            return False
        self.job = None
        return True

    def cancel_job(self) -> None:
        """Stop the running job's worker (escape): nothing it finds is shown."""
        task = self.job
        if task is None:
            return
        self.job = None
        self.workers.cancel_group(self, task)
        self.update_status(f"{self.job_text}: cancelled, nothing changed")

    @on(Progress)
    def _job_progress(self, message: Progress) -> None:
        if message.task == self.job:
            # the status line alone is redrawn: one widget, a few times a second
            self.update_status(f"{self.job_text}… {message.fraction:.0%} · escape cancels")

    # ---- availability ----------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in EDIT_ACTIONS and self.ckpt_app.readonly:
            return False  # hidden from the footer, help and the palette; a press still says why (on_key)
        if action == "sanitize" and not self.sanitize_applies:
            return False  # shown only where torch.load refuses data it rewrites; a press still says why (on_key)
        if action == "strip_prefix" and not self.strip_applies:
            return False  # shown only where a finding names a prefix; a press still strips one or says why (on_key)
        if action in SESSION_ACTIONS and self.session is None:
            return None
        return True

    def footer_first(self) -> tuple[str, ...]:
        """The keys the footer keeps first after Save, Help and Quit: Undo while there is an edit to undo,
        Sanitize where it applies (the header points at it), then the browser's everyday keys, Compare first
        (why a checkpoint does not fit its model is what most open it for)."""
        first = ["undo"] if self.session is not None and self.session.can_undo else []
        if self.sanitize_applies:
            first.append("sanitize")
        return (*first, "compare", "strip_prefix", "search", "layers", "undo")

    def editable(self, action: str) -> bool:
        """Whether an edit may start now; if not, say why (never silence)."""
        if self.ckpt_app.readonly:
            name = next((b.description for b in BROWSER_BINDINGS if isinstance(b, Binding) and b.action == action), "")
            self.notify(
                f"{name or 'Editing'} is off: the file was opened with --readonly (browse only, nothing is saved)",
                title="Read-only",
                severity="warning",
                markup=False,
            )
            return False
        return self.session is not None

    def warn(self, message: str, title: str = "Edit does not apply") -> None:
        """A notification in plain text (messages may quote keys from the file)."""
        self.notify(printable(message), title=title, severity="warning", markup=False)

    def nothing_to_do(self, message: str) -> None:
        """A key with nothing to act on says so (status line and a notification) and opens no prompt:
        a prompt would swallow the keys typed next."""
        self.update_status(message)
        self.notify(printable(message), title="Nothing to do", markup=False)

    # ---- viewing actions -----------------------------------------------------------------------

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(key_rows(self.active_bindings), self.ckpt_app.readonly))

    def action_findings(self) -> None:
        if self.summary is None:
            self.warn("still counting: the findings follow in a moment", "Findings")
            return
        judged = self.judged()
        refusal = verdict_finding(judged, self.summary.checkpoint.path, self.ckpt_app.readonly)
        findings = [
            *([refusal] if refusal is not None else []),
            *listed_findings(self.summary, judged.on_disk is not None),
            *(check_findings(self.check) if self.check is not None else []),
        ]
        if not findings:
            self.notify("no findings: nothing unusual about this file", markup=False)
            return

        def jump(path: KeyPath | None) -> None:
            if path is not None:
                self.tree_view.reveal((path, None))

        self.app.push_screen(FindingsScreen(findings, self.ckpt_app.readonly), jump)

    def action_copy_path(self) -> None:
        target = self.focused_target()
        if target is None:
            return
        text = target.prefix if target.prefix is not None else to_python(target.path)
        self.app.copy_to_clipboard(text)
        self.update_status(f"copied {text}")
        title = "Copied the group's prefix" if target.is_group else "Copied key path"
        self.notify(printable(text), title=title, markup=False)

    def action_toggle_grouping(self) -> None:
        session = self.session
        if session is None:
            return
        if self.tree_view.grouped:
            self._show_grouped(False)
            return
        # the groups of a 50,000-key state_dict take most of a second: counted in a worker, shown when ready
        open_dicts = [(), *(row[0] for row in self.tree_view.view_state().expanded if row[1] is None)]
        if all(self.tree_view.knows_groups(value) for value in _dicts_at(session.root, open_dicts)):
            self._show_grouped(True)
            return
        self.start_job("grouping")
        self._count_groups(session.version, session.root, sorted(set(open_dicts), key=len))

    @work(thread=True, exclusive=True, group="grouping", description="module groups")
    def _count_groups(self, version: int, root: Any, paths: list[KeyPath]) -> None:
        """The module groups of the open state_dicts, off the UI thread, with progress (escape cancels);
        reports by message only."""
        try:
            found = groupings_along(root, paths, worker_progress(self.post_message, "grouping"))
        except Cancelled:
            return
        process.settle_young()
        self.post_message(GroupingReady(version, found))

    @on(GroupingReady)
    def _grouping_ready(self, message: GroupingReady) -> None:
        if not self.job_done("grouping"):
            return
        if self.session is None or message.version != self.session.version:
            self.update_status("the checkpoint changed while its keys were grouped: press v again")
            return
        self.tree_view.remember_groupings(message.groupings)
        self._show_grouped(True)

    def _show_grouped(self, grouped: bool) -> None:
        view = self.tree_view.view_state()
        self.tree_view.grouped = grouped
        self.redraw(view)
        self.update_status("grouped by module path" if grouped else "plain keys")

    def action_search(self) -> None:
        field = self.query_one("#search", Input)
        field.display = True
        field.value = ""
        field.focus()

    @on(Input.Submitted, "#search")
    def _search_submitted(self, event: Input.Submitted) -> None:
        query = from_printable(event.value.strip()).lower()
        event.input.display = False
        self.tree_view.focus()
        if not query or self.session is None:
            return
        self.start_job("search", f"searching for {query!r}")
        self._search(self.session.version, self.session.root, query)

    @work(thread=True, exclusive=True, group="search", description="search")
    def _search(self, version: int, root: Any, query: str) -> None:
        """Every key path containing ``query``, off the UI thread (escape cancels), and the places of the keys
        of the big dicts on the way to the first match (a jump looks its key up there); reports by message only."""
        worker = get_current_worker()
        matches: list[KeyPath] = []
        said_whole: set[KeyPath] = set()
        for step, (path, value) in enumerate(iter_nodes(root)):
            if step % 2000 == 0 and worker.is_cancelled:
                return
            # a numpy value's line says it whole: the pickled call below it has no lines to go to
            if said_whole and any(path[:depth] in said_whole for depth in range(1, len(path))):
                continue
            if isinstance(value, Opaque) and numpy_value(value) is not None:
                said_whole.add(path)
            if path and query in to_slash(path).lower():
                matches.append(path)
                if len(matches) >= MAX_MATCHES:
                    break
        listings = listings_along(root, [matches[0][:depth] for depth in range(len(matches[0]))]) if matches else {}
        if not worker.is_cancelled:
            self.post_message(SearchFound(version, query, matches, listings))

    @on(SearchFound)
    def _search_found(self, message: SearchFound) -> None:
        if not self.job_done("search"):
            return
        if self.session is None or message.version != self.session.version:
            self.update_status("the checkpoint changed while searching: search again")
            return
        self.tree_view.remember_listings(message.listings)
        self.matches = message.matches
        self.match_index = 0
        if not self.matches:
            self.update_status(f"no key path contains {message.query!r}")
            return
        self.go_to_match()

    def go_to_match(self) -> None:
        """Reveal the current match (expanding its ancestors)."""
        self.tree_view.reveal((self.matches[self.match_index], None))
        self.update_status(f"match {self.match_index + 1}/{len(self.matches)}")

    def action_next_match(self) -> None:
        if not self.matches:
            self.nothing_to_do("no matches to go through: / searches the key paths")
            return
        self.match_index = (self.match_index + 1) % len(self.matches)
        self.go_to_match()

    def action_previous_match(self) -> None:
        if not self.matches:
            self.nothing_to_do("no matches to go through: / searches the key paths")
            return
        self.match_index = (self.match_index - 1) % len(self.matches)
        self.go_to_match()

    # ---- proposing and applying edits ---------------------------------------------------------

    def propose(
        self,
        edit: Edit,
        relocate: Relocate = targets.keep,
        failed: Callable[[str], Any] | None = None,
        cursor: RowId | None = None,
        loads: str | None = None,
        then: Callable[[], Any] | None = None,
    ) -> None:
        """Compute an edit in a worker, preview it, then apply it if confirmed (to the tree it was computed from).

        ``failed`` is called with the reason when the edit does not apply (the default warns); ``cursor`` is
        where the cursor goes afterwards (by default where ``relocate`` takes it); ``loads``: how the new tree
        loads into the compared model (else as the tree it was made from); ``then``: called once the preview is
        answered.
        """
        session = self.session
        if session is None:
            return
        self.start_job("preview")
        # the open lines, where the new tree's module groups (when grouped) and big dicts will be shown
        view = self.tree_view.view_state()
        shown = [relocate(row)[0] for row in view.expanded if row[1] is None]
        grouped = self.tree_view.grouped
        proposal = Proposal(relocate, failed, cursor, loads, then)
        self._preview(session.version, session.root, edit, proposal, shown, grouped)

    @work(thread=True, exclusive=True, group="preview", description="edit preview")
    def _preview(
        self, version: int, root: Any, edit: Edit, proposal: Proposal, shown: list[KeyPath], grouped: bool
    ) -> None:
        """Run an edit on ``root`` off the UI thread (edits build a new tree), and count the module groups (or
        list the big dicts) the tree will show of it; reports by message only."""
        try:
            new_root, change = edit(root)
        except NothingChanges as exc:
            new_root, change = root, Change(str(exc), 0)
        except (CkptError, KeyError) as exc:
            self.post_message(PreviewReady(version, None, None, str(exc), proposal, {}))
            return
        paths = sorted(shown, key=len)
        try:
            # the new tree's groups: the long part of an edit of a grouped 50,000-key state_dict (a percentage)
            groupings = (
                groupings_along(new_root, paths, worker_progress(self.post_message, "preview")) if grouped else {}
            )
        except Cancelled:
            return
        listings = listings_along(new_root, paths)
        # the new tree stays alive (undo keeps it): aged here, not walked by a collection on the UI thread
        process.settle_young()
        if not get_current_worker().is_cancelled:
            self.post_message(PreviewReady(version, new_root, change, "", proposal, groupings, listings))

    @on(PreviewReady)
    def _preview_ready(self, message: PreviewReady) -> None:
        if not self.job_done("preview"):
            return
        session = self.session
        if session is None or message.version != session.version:
            self.update_status("the checkpoint changed while the edit was computed: try it again")
            return
        self.update_status("")
        proposal: Proposal = message.proposal
        if message.change is None:
            if proposal.failed is not None:
                proposal.failed(message.error)
            else:
                self.warn(message.error)
            return
        if not message.change.count:  # a cast to the dtype it has, a map to the device it is on: no edit to record
            note = "; ".join(message.change.notes) or message.change.title
            (proposal.failed or self.nothing_to_do)(note)
            return
        version, new_root, change, groupings = message.version, message.root, message.change, message.groupings

        def answer(confirmed: bool | None) -> None:
            settle(confirmed)
            if proposal.then is not None and self.session is not None:
                proposal.then()

        def settle(confirmed: bool | None) -> None:
            if not confirmed or self.session is None:
                return
            if self.session.version != version:
                self.warn("the checkpoint changed meanwhile; try the edit again")
                return
            view = self.tree_view.view_state()
            self.tree_view.remember_groupings(groupings)
            self.tree_view.remember_listings(message.listings)
            # an edit on top of a fix that needs strict=False still needs it; a new fix says for itself
            loads = self.known_of(self.session).loads if proposal.loads is None else proposal.loads
            self.session.apply(new_root, change)
            self.known_of(self.session).loads = loads
            self.edit_views = {p: v for p, v in self.edit_views.items() if p < self.session.position}
            self.edit_views[self.session.position] = (view, proposal.relocate)
            self.after_edit(view, proposal.relocate, f"applied: {change.title}", proposal.cursor)

        self.app.push_screen(PreviewScreen(change), answer)

    def after_edit(self, view: ViewState, relocate: Relocate, note: str, cursor: RowId | None = None) -> None:
        """Redraw with the open lines and the cursor carried over (or put on ``cursor``), recount, and follow
        the cursor."""
        view = ViewState(cursor or relocate(view.cursor), {relocate(row) for row in view.expanded})
        note = self.take_check(note)
        # the footer is rebuilt only when what it shows changes: Undo moves up there after the first edit
        self.refresh_bindings()
        self.redraw(view)
        self.update_status(note)
        self.query_one(SummaryHeader).show_text(f"{self.display_name}: counting…", hold=True)
        self.recount()

    def take_check(self, note: str) -> str:
        """Make the check result and ``!!`` marks those of the current tree (its own, or none), and say in
        ``note`` when a tree of this file was read but this one was not."""
        assert self.session is not None
        # only the tree that was read is described by the result: never an older tree's numbers
        known = self.known_of(self.session)
        self.check = known.check
        self.tree_view.markers = known.markers
        if self.check is None and self.checked_once:
            return f"{note}; C again to read the edited tree" if note else "C again to read the edited tree"
        return note

    def redraw(self, view: ViewState) -> None:
        """Show the session's current tree with ``view``; the panel and status follow the new cursor."""
        if self.session is None:
            return
        self.tree_view.show(self.session.root, self.display_name, view)
        self.call_after_refresh(self.follow_cursor)

    def ask(
        self, title: str, value: str, hint: str, then: Callable[[str], Any], paths: bool = False, exact: bool = False
    ) -> None:
        """Prompt for text (shown escaped, typed escapes decoded; ``exact`` keeps spaces, for keys), then continue."""

        def answer(text: str | None) -> None:
            if text:
                then(text)

        suggester = PathSuggester() if paths else None
        self.app.push_screen(PromptScreen(title, value, hint, suggester, exact), answer)

    def key_edit_target(self) -> KeyPath | None:
        """The state_dict ``p``/``P`` edit (the one focused, holding the cursor, or detected), or None (said why)."""
        assert self.session is not None
        target = self.focused_target()
        try:
            return targets.state_dict_at(self.session.root, target.path if target else ())
        except EditError as exc:
            self.warn(str(exc))
            return None

    def action_strip_prefix(self) -> None:
        if not self.editable("strip_prefix"):
            return
        at = self.key_edit_target()
        if at is None or self.session is None:
            return
        root = self.session.root

        def nothing_to_strip(error: str) -> None:
            shared = common_prefix(k for k, _ in (tensor_items(get(root, at)) or []))
            hint = " (v groups by module; x on a group keeps it as the root)" if shared else ""
            self.nothing_to_do(f"nothing to strip: {error}{hint}")

        # the header's "p strips it" names a prefix (a Lightning module's net.): p strips that one, so the hint
        # and the key never disagree; otherwise the wrapper prefix p finds on its own
        self._strip(at, self._named_strip(at) or "auto", nothing_to_strip)

    def _named_strip(self, at: KeyPath) -> str | None:
        """The prefix a shown finding's fix strips from the keys of the dict at ``at`` (None: no finding does)."""
        summary = self.summary
        if summary is None:
            return None
        for finding in summary.shown_findings:
            pairs = finding.fix.pairs() if finding.fix else []
            where = () if finding.path is None else tuple(finding.path)
            if where != tuple(at) or any(option == "--extract" for option, _ in pairs):
                continue
            strips = [argument for option, argument in pairs if option == "--strip-prefix" and argument != "auto"]
            if strips:
                return strips[0]
        return None

    def _strip(self, at: KeyPath, prefix: str, failed: Callable[[str], Any] | None = None) -> None:
        assert self.session is not None
        root = self.session.root
        shown: list[str] = [prefix]

        def strip(key: str) -> str | None:
            if shown[0] == "auto":  # what "auto" strips (the edit's worker works it out first)
                shown[0] = edits.wrapper_prefix_at(root, at) or ""
            return key[len(shown[0]) :] if shown[0] and key.startswith(shown[0]) else None

        def edit(tree: Any) -> tuple[Any, Change]:
            done = edits.strip_prefix(tree, prefix, at)
            if shown[0] == "auto":
                # a look at every key: here in the worker, not when the cursor is relocated on the UI thread
                shown[0] = edits.wrapper_prefix_at(root, at) or ""
            return done

        self.propose(edit, targets.renamed_keys(at, strip), failed)

    def action_add_prefix(self) -> None:
        if not self.editable("add_prefix"):
            return
        at = self.key_edit_target()
        if at is None:
            return

        def add(prefix: str) -> None:
            relocate = targets.renamed_keys(at, lambda k: prefix + k)
            self.propose(lambda root: edits.add_prefix(root, prefix, at), relocate)

        self.ask(
            f"Add a prefix to every key of {where(at)}", "module.", "e.g. module. for DataParallel/DDP", add, exact=True
        )

    def action_extract(self) -> None:
        if not self.editable("extract"):
            return
        target = self.focused_target() or Target(())
        if target.prefix is not None:
            prefix = target.prefix
            self.propose(
                lambda root: group_edits.extract_group(root, target.path, prefix),
                targets.extracted_group(target.path, prefix),
            )
            return
        if not target.path:
            assert self.session is not None
            found = inner_state_dict(self.session.root)
            self.propose(lambda root: edits.extract(root, "auto"), targets.extracted(found or ()))
            return
        if not self._tensors_below(target):  # extract epoch = 1: the weights would all go
            self.nothing_to_do(f"nothing to extract: {target.describe()} holds no tensor")
            return
        self.propose(lambda root: edits.extract(root, target.path), targets.extracted(target.path))

    def action_remap(self) -> None:
        if not self.editable("remap"):
            return
        self.ask(
            "Map the saved devices of every tensor",
            "cpu",
            "cpu, cuda:0, or cuda:1=cuda:0,cuda:2=cpu",
            lambda spec: self.propose(lambda root: edits.remap_devices(root, spec)),
        )

    def action_rename(self) -> None:
        if not self.editable("rename"):
            return
        target = self.focused_target()
        if target is None or (not target.path and target.prefix is None):
            self.warn("put the cursor on a named key (or a module group) to rename it")
            return
        if target.prefix is not None:
            self._rename_group(target.path, target.prefix)
            return
        path = target.path
        old = path[-1]
        if not isinstance(old, str):
            self.warn(f"{where(path)} is not a named key: only dict keys can be renamed")
            return

        def rename(new: str) -> None:
            if new == old:
                self.nothing_to_do("the name is unchanged: nothing to rename")
                return
            relocate = targets.renamed_keys(path[:-1], lambda k: new if k == old else None)
            self.propose(lambda root: edits.rename(root, path, new), relocate)

        self.ask(
            f"Rename {data(repr(old)).plain} in {where(path[:-1])} to",
            old,
            "the key keeps its place · \\x1b-style escapes stand for the characters shown so",
            rename,
            exact=True,
        )

    def _rename_group(self, path: KeyPath, prefix: str) -> None:
        def rename(new: str) -> None:
            new_prefix = new if new.endswith(".") else new + "."
            if new_prefix == prefix:
                self.nothing_to_do("the prefix is unchanged: nothing to rename")
                return
            relocate = targets.renamed_keys(
                path, lambda k: new_prefix + k[len(prefix) :] if k.startswith(prefix) else None
            )
            self.propose(lambda root: group_edits.rename_group(root, path, prefix, new_prefix), relocate)

        self.ask(
            f"Rename the group prefix {data(repr(prefix)).plain} of {where(path)} to",
            prefix,
            "every key under the group gets the new prefix and keeps its place",
            rename,
            exact=True,
        )

    def action_delete(self) -> None:
        if not self.editable("delete"):
            return
        target = self.focused_target()
        line = self.tree_view.cursor_target
        if target is None or line is None:
            self.warn("put the cursor on a key to delete it")
            return
        # the cursor stays with the line beside the deleted one (it went to the root from the last key)
        beside = self.tree_view.neighbour(line)
        relocate = targets.deleted(target)
        if target.prefix is not None:
            prefix = target.prefix
            self.propose(lambda root: group_edits.delete_group(root, target.path, prefix), relocate, cursor=beside)
            return
        self.propose(lambda root: edits.delete(root, target.path), relocate, cursor=beside)

    def action_cast(self) -> None:
        if not self.editable("cast"):
            return
        assert self.session is not None
        target = self.focused_target() or Target(())
        if target.prefix is None:
            try:
                target = Target(targets.state_dict_at(self.session.root, target.path))
            except EditError:
                target = Target(())

        def cast_to(text: str) -> None:
            try:
                dtype = edits.cast_dtype(text)
            except EditError as exc:
                self.warn(str(exc))
                return
            if target.prefix is not None:
                prefix = target.prefix
                self.propose(lambda root: group_edits.cast_group(root, target.path, prefix, dtype))
            else:
                self.propose(lambda root: edits.cast(root, dtype, target.path or "all"))

        what = "the whole checkpoint" if not target.path and target.prefix is None else target.describe()
        floats = self._float_dtypes(target)
        if floats == []:
            self.nothing_to_do(f"nothing to cast: no floating-point tensor in {what}")
            return
        self.ask(
            f"Cast the floating-point tensors of {what} to",
            _cast_default(floats or []),
            "float16 (fp16, half) · bfloat16 (bf16) · float32 (fp32)",
            cast_to,
        )

    def action_sanitize(self) -> None:
        if not self.editable("sanitize"):
            return
        # the edit convert --sanitize makes, on the whole tree: the cursor stays on the line it is on
        self.propose(sanitize)

    def _tensors_below(self, target: Target) -> bool:
        """Whether ``target`` holds a tensor."""
        value = self._target_value(target)
        if value is None:
            return True  # the edit itself says what is wrong
        return next(iter_tensors(value), None) is not None

    def _float_dtypes(self, target: Target) -> list[str] | None:
        """The dtype of each floating-point tensor ``target`` holds (one walk), or None where it cannot be had (the
        edit itself then says what is wrong)."""
        value = self._target_value(target)
        if value is None:
            return None
        return [tensor.dtype for _, tensor in iter_tensors(value) if tensor.dtype in edits.CASTABLE]

    def _target_value(self, target: Target) -> Any:
        """The value an edit of ``target`` acts on (a group's keys as a state_dict), or None where it cannot be had."""
        assert self.session is not None
        root = self.session.root
        try:
            if target.prefix is not None:
                return group_edits.group_state_dict(root, target.path, target.prefix)
            return get(root, target.path)
        except (CkptError, KeyError, IndexError, TypeError):
            return None

    def action_undo(self) -> None:
        if not self.editable("undo") or self.session is None:
            return
        view = self.tree_view.view_state()
        undone = self.session.position
        change = self.session.undo()
        if change is None:
            self.update_status("nothing to undo")
            return
        before = self.edit_views.get(undone)  # where the cursor was when the edit was made
        self.after_edit(before[0] if before else view, targets.keep, f"undone: {change.title}")

    def action_redo(self) -> None:
        if not self.editable("redo") or self.session is None:
            return
        view = self.tree_view.view_state()
        change = self.session.redo()
        if change is None:
            self.update_status("nothing to redo")
            return
        made = self.edit_views.get(self.session.position)
        self.after_edit(view, made[1] if made else targets.keep, f"redone: {change.title}")

    # ---- compare and diff -----------------------------------------------------------------------

    def action_compare(self) -> None:
        session = self.session
        if session is None:
            return
        target = self.focused_target() or Target(())
        if target.prefix is None:
            target = Target(targets.container_at(session.root, target.path))
        self.ask(
            f"Compare {target.describe()} with (a checkpoint of the target model, or a text file of keys)",
            self.ckpt_app.remembered("compare"),
            "the report lists missing, unexpected and mismatched keys, and the fix",
            lambda reference: self._start_compare(reference, target),
            paths=True,
        )

    def _start_compare(self, reference: str, target: Target) -> None:
        assert self.session is not None
        self.ckpt_app.remember("compare", reference)
        screen = CompareScreen(self.ckpt_app, self.session.root, target, reference, self.display_name)
        self.app.push_screen(screen, lambda result: self._compare_closed(screen, result))

    def _compare_closed(self, screen: CompareScreen, result: ReportResult | None) -> None:
        """A compare of a whole state_dict (not a group's keys) makes its model the header's evidence."""
        report = screen.report
        if report is not None and not screen.target.is_group:
            self.compared = ComparedModel(os.path.basename(screen.reference), report.reference_keys())
            self.recount()
        self._report_closed(result)

    def _report_closed(self, result: ReportResult | None) -> None:
        """A report screen's result: go to a key, stage the fix, or measure each layer."""
        if isinstance(result, Jump):
            self.tree_view.reveal((result.path, None))
        elif isinstance(result, ApplyFix):
            self._apply_suggestion(result.suggestion, result.at)
        elif isinstance(result, MeasureLayers) and self.session is not None:
            mine = dataclasses.replace(self.session.checkpoint, root=self.session.root)
            screen = LayerChangeScreen(mine, result.other, self.display_name, result.alignment, result.swapped)
            self.app.push_screen(screen, self._report_closed)

    def _apply_suggestion(self, suggestion: Any, at: KeyPath) -> None:
        from ckpt_tui.core.operations.compare import apply_suggestion

        if not self.editable("strip_prefix"):
            return

        def edit(root: Any) -> tuple[Any, Change]:
            new_root, changes = apply_suggestion(root, at, suggestion)
            examples = [e for change in changes for e in change.examples][:5]
            # the keys renamed or dropped (an extract counts as 1, no key); what an extract leaves out is said, and
            # an extract alone, which renames nothing, is still one edit (never "nothing to do")
            count = sum(change.count for change in changes if change.examples) or sum(c.count for c in changes)
            notes = [note for change in changes for note in change.notes]
            return new_root, Change(suggestion.describe(), count, examples, notes)

        extracts = any(step.kind == "extract" for step in suggestion.steps)
        self.propose(edit, targets.extracted(at) if extracts else targets.keep, loads=strict_words(suggestion))

    def action_diff(self) -> None:
        if self.session is None:
            return
        self.ask(
            "Diff with checkpoint",
            self.ckpt_app.remembered("diff"),
            "keys on one side only, shape/dtype changes, value differences; on the report, s measures how far "
            "each layer moved",
            self._start_diff,
            paths=True,
        )

    def _start_diff(self, other: str) -> None:
        assert self.session is not None
        self.ckpt_app.remember("diff", other)
        # the staged tree, with the user's pending edits, not the file on disk
        mine = dataclasses.replace(self.session.checkpoint, root=self.session.root)
        self.app.push_screen(DiffScreen(mine, other, self.display_name), self._report_closed)

    # ---- the layers view (L) and the histogram scale (o) -------------------------------------

    def action_layers(self) -> None:
        """Every tensor's statistics as a table with plots; enter comes back on a tensor, ``z`` stages a drop."""
        session = self.session
        if session is None:
            return
        screen = LayersScreen(
            session.root, session.checkpoint.byteorder, self.ckpt_app.readonly, self.ckpt_app.histogram_log
        )

        def done(result: tuple[str, Any] | None) -> None:
            self.ckpt_app.histogram_log = screen.log_counts
            self.detail.redraw_stats()
            self._keep_layer_marks(screen)
            if result is None:
                return
            kind, value = result
            if kind == "jump":
                self.tree_view.reveal((value, None))
            elif kind == "drop":
                paths, figure = value
                # the preview answered, the table it was asked from comes back (of the tree as it is then)
                self._drop_parts(paths, figure, then=self.action_layers)

        self.app.push_screen(screen, done)

    def _keep_layer_marks(self, screen: LayersScreen) -> None:
        """What the layers view read (every tensor's NaN/Inf) marks the tree as C does, where C has not marked
        this tree yet: a user who saw ``!! NaN`` there does not come back to a tree that looks clean."""
        session = self.session
        if session is None or screen.root is not session.root or not screen.rows:
            return
        known = self.known_of(session)
        if known.check is not None:
            return
        tensors, containers = layer_markers(session.root, screen.rows)
        markers = {**tensors, **containers}
        if not tensors or known.markers == markers:
            return
        known.markers = self.tree_view.markers = markers
        self.tree_view.show(session.root, self.display_name, self.tree_view.view_state())
        count = len(tensors)
        self.update_status(f"the layers view read {count} tensor{'s' if count != 1 else ''} with NaN/Inf: marked !!")

    def _drop_parts(self, paths: list[KeyPath], figure: str, then: Callable[[], Any] | None = None) -> None:
        """Stage deleting every path (the optimizer state) as one undoable edit, after its preview (``then`` once
        it is answered)."""
        if not self.editable("delete"):
            return

        def edit(root: Any) -> tuple[Any, Change]:
            for path in paths:
                root, _ = edits.delete(root, path)
            examples = [(to_slash(path), "(deleted)") for path in paths]
            return root, Change(f"drop the optimizer state ({figure})", len(paths), examples)

        self.propose(edit, targets.keep, then=then)

    def action_histogram_log(self) -> None:
        self.ckpt_app.histogram_log = not self.ckpt_app.histogram_log
        self.detail.redraw_stats()
        self.update_status(f"histogram counts: {'log' if self.ckpt_app.histogram_log else 'linear'}")

    # ---- reading every tensor (C) ---------------------------------------------------------

    def action_check_all(self) -> None:
        """Read every tensor of the tree as it is now, in a worker with a progress bar (escape cancels)."""
        session = self.session
        if session is None:
            return
        edited = dataclasses.replace(session.checkpoint, root=session.root)
        self.app.push_screen(CheckAllScreen(session.version, edited), self._check_finished)

    def _check_finished(self, outcome: CheckOutcome | None) -> None:
        if outcome is None or self.session is None or outcome.version != self.session.version:
            return  # the tree changed while it was read: the result is for an older tree
        if outcome.report is None:
            self.update_status(outcome.error)
            return
        self.check = outcome.report
        self.checked_once = True
        tensors, containers = check_markers(self.session.root, outcome.report)
        markers = {**tensors, **containers}
        known = self.known_of(self.session)
        known.check, known.markers = outcome.report, markers
        if markers != self.tree_view.markers:  # a clean file's lines stay as they are: no redraw of the tree
            self.tree_view.markers = markers
            self.tree_view.show(self.session.root, self.display_name, self.tree_view.view_state())
        self.show_header()
        marked = len(tensors)
        self.update_status(
            f"every tensor read: {marked} marked !! (f lists them)" if marked else "every tensor read: nothing wrong"
        )


def _cast_default(floats: list[str]) -> str:
    """The cast the prompt offers first: to float32 where the floats are 16-bit already (a narrower default
    would lose range: bf16 to fp16 overflows past 65504), else to bfloat16 (fp32's range, half the bytes)."""
    narrow = sum(dtype in ("float16", "bfloat16") for dtype in floats)
    return "float32" if floats and 2 * narrow >= len(floats) else "bfloat16"


def strict_words(suggestion: Any) -> str:
    """How the tree a compare's fix stages loads into the model (the status line keeps it): ``loads with
    strict=False: head.weight, head.bias keep the model's initial values``; empty where it loads strictly."""
    if suggestion.full:
        return ""
    parts = []
    if suggestion.missing:
        keeps = "keeps" if len(suggestion.missing) == 1 else "keep"
        parts.append(f"{_few(suggestion.missing)} {keeps} the model's initial values")
    if suggestion.unexpected:
        parts.append(f"it ignores {_few(suggestion.unexpected)}")
    count = suggestion.shape_mismatches
    if count:
        mismatches = f"{count} shape mismatch{'es' if count != 1 else ''}"
        return f"does not load yet: load_state_dict raises on {mismatches} even with strict=False"
    return printable("loads with strict=False only: " + "; ".join(parts))


def _few(keys: list[str], shown: int = 3) -> str:
    """A few keys, ``and N more``."""
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return ", ".join(keys[:shown]) + more


def storage_users(summary: Summary) -> dict[int, int]:
    """How many listed tensors view each storage, by ``id`` of the storage (for the panel's "shared with")."""
    users: Counter[int] = Counter(id(tensor.storage) for _, tensor in summary.tensors if tensor.storage is not None)
    return dict(users)


def check_markers(root: Any, report: CheckReport) -> tuple[dict[int, str], dict[int, str]]:
    """What the check found, by ``id`` of each tensor it names, and by ``id`` of each container above one (for
    the tree's markers: a collapsed line says what its lines hold)."""
    words = {"nan": "NaN", "inf": "Inf", "unreadable": "unreadable", "sparse-indices": "bad indices"}
    found = []
    for problem in report.problems:
        if problem.kind not in words or problem.path is None:
            continue
        word = "NaN and Inf" if problem.kind == "nan" and problem.detail.get("inf") else words[problem.kind]
        found.append((problem.path, word))
    return path_markers(root, found)


def layer_markers(root: Any, rows: list[Any]) -> tuple[dict[int, str], dict[int, str]]:
    """The NaN/Inf the layers view read in each tensor (its rows), marked as a check (C) marks them."""
    found = []
    for row in rows:
        stats = row.stats
        if stats is not None and (stats.nan or stats.inf):
            found.append((row.path, "NaN and Inf" if stats.nan and stats.inf else "NaN" if stats.nan else "Inf"))
    return path_markers(root, found)


def path_markers(root: Any, found: list[tuple[KeyPath, str]]) -> tuple[dict[int, str], dict[int, str]]:
    """Marks (``NaN``) by ``id`` of each tensor at the paths, and by ``id`` of each container above one."""
    markers: dict[int, str] = {}
    below: dict[int, list[str]] = {}
    for path, word in found:
        try:
            tensor = get(root, path)
            # the root's line is always open: the lines between it and the tensor are marked
            containers = [get(root, path[:depth]) for depth in range(1, len(path))]
        except (KeyError, IndexError, TypeError):
            continue
        if id(tensor) not in markers:
            for container in containers:
                below.setdefault(id(container), []).append(word)
        markers[id(tensor)] = word
    return markers, {container: marked_below(words) for container, words in below.items()}


def _dicts_at(root: Any, paths: list[KeyPath]) -> list[dict[Any, Any]]:
    """The dicts at ``paths`` in ``root`` (paths that no longer lead to a dict are left out)."""
    found = []
    for path in paths:
        try:
            value = get(root, path)
        except (KeyError, IndexError, TypeError, AttributeError):
            continue
        if isinstance(value, dict):
            found.append(value)
    return found
