"""A report screen: core's report (:mod:`~ckpt_tui.core.operations.reports`), computed by the screen's own worker.

The screen opens at once with "working… (escape cancels)" and a progress bar; its worker gets what it
needs as a job made on the UI thread, and reports with typed messages (:class:`ReportReady`,
:class:`Progress`, :class:`Failed`). Escape cancels the worker and closes the screen. The report shows
as a summary (verdict, counts, notes) over a list of sections; enter on a row jumps to its key. The
screen is dismissed with a result the browser acts on (:data:`ReportResult`), or None.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import OptionList, ProgressBar, Static
from textual.widgets.option_list import Option
from textual.worker import get_current_worker

from ckpt_tui.core.errors import Cancelled, CkptError
from ckpt_tui.core.model.keypath import KeyPath
from ckpt_tui.core.runtime import process
from ckpt_tui.core.runtime.safe_text import printable
from ckpt_tui.tui.bindings import LIST_BINDINGS, REPORT_BINDINGS, key_rows
from ckpt_tui.tui.messages import Failed, Progress, ReportReady, worker_progress
from ckpt_tui.tui.screens.help import HelpScreen
from ckpt_tui.tui.text import data

if TYPE_CHECKING:
    from ckpt_tui.core.operations.compare import Suggestion
    from ckpt_tui.core.operations.diff import Alignment
    from ckpt_tui.core.operations.reports import Report as Described

Job = Callable[[Callable[[int, int], None], Callable[[], bool]], Any]
"""A report's work, run by the worker: called with a progress callback ``(done, total)`` (which raises
:class:`Cancelled` once the screen is closed) and a ``cancelled`` check; returns core's report."""

Section = tuple[str, list[tuple[Any, Text]]]
"""A report section: a heading and its rows (where enter on a row goes, or None: nowhere; the row's text)."""


@dataclass(frozen=True)
class Jump:
    """Go to this key path of the tree."""

    path: KeyPath


@dataclass(frozen=True)
class ApplyFix:
    """Stage ``suggestion`` at ``at`` as one undoable edit (after its preview)."""

    suggestion: Suggestion
    at: KeyPath


@dataclass(frozen=True)
class MeasureLayers:
    """Measure how far each layer moved from the tree to the file ``other``, both sides' keys taken as
    ``alignment`` takes them; from the file to the tree when ``swapped``."""

    other: str
    alignment: Alignment | None
    swapped: bool = False


ReportResult = Jump | ApplyFix | MeasureLayers


def report_body(described: Described, offers: Text | None = None) -> tuple[Text, list[Section]]:
    """A report core described as a report screen shows it: the verdict and counts, the notes (which lead the list
    instead where a fix is offered: :func:`_notes_listed`), what the screen ``offers``; then each section's rows
    (a row jumps to its ``path``, or else to its ``key``)."""
    from ckpt_tui.core.operations.reports import headline

    summary = Text(headline(described))
    if not _notes_listed(described, offers):
        for note in described.notes:
            summary.append(f"\nnote: {note}")
    if offers is not None:
        summary.append_text(offers)
    sections: list[Section] = [
        (section.title, [(row.path if row.path is not None else row.key, data(row.text)) for row in section.rows])
        for section in described.sections
    ]
    return summary, sections


def _notes_listed(described: Described, offers: Text | None) -> bool:
    """Whether a report's notes lead its list rather than its summary: where the summary offers a fix (what to do
    under the verdict, why under it: at 80×24 the summary's box holds a dozen lines, which a PEFT run's notes alone
    would fill, hiding the fix's key and command)."""
    return bool(described.fixes) and offers is not None and bool(offers.plain)


def row_width(app_width: int) -> int:
    """The characters of a report row: the dialog's width (app.tcss: the whole width up to 140), less its
    border, padding and the list's scrollbar."""
    return min(app_width, 140) - 6


def wrapped(text: Text, width: int) -> Text:
    """``text`` broken between words into lines of at most ``width`` characters, each after the first indented
    by two spaces: a report row that says something (a note, a finding) is read whole, never cut with "…". A
    word longer than a line (a key path) breaks where its components meet (``"]["``, ``.``, ``/``), not inside
    a name."""
    from rich.console import Console

    if text.cell_len <= width and "\n" not in text.plain:
        return text
    room = max(20, width - 2)
    lines = _broken_at_components(text, room).wrap(Console(width=width), room)
    return Text("\n  ").join(lines)


_COMPONENT_END = re.compile(r"(?<=[\].,/])(?=[^\s\].,/])")
"""Where a key path may break: after a component's end (``]``, ``.``, ``/``), before the next one."""


def _broken_at_components(text: Text, room: int) -> Text:
    """``text`` with each word longer than ``room`` split by a line break at component ends (as few as make each
    piece fit): Rich would otherwise fold it at the edge, mid-name."""
    plain = text.plain
    cuts: list[int] = []
    for word in re.finditer(r"\S+", plain):
        if word.end() - word.start() <= room:
            continue
        start = word.start()
        ends = [match.start() for match in _COMPONENT_END.finditer(plain, word.start(), word.end())]
        for index, end in enumerate(ends):
            following = ends[index + 1] if index + 1 < len(ends) else word.end()
            # break before the component that would not fit on the piece's line
            if following - start > room and end > start:
                cuts.append(end)
                start = end
    if not cuts:
        return text
    pieces = text.divide(cuts)
    return Text("\n").join(pieces)


def run_job(post: Callable[[Message], Any], task: str, job: Job) -> None:
    """Run ``job`` in the current worker and post its outcome: :class:`ReportReady`, :class:`Failed` with the
    one-line reason, or nothing once the worker is cancelled (the screen that started it is closed)."""
    worker = get_current_worker()

    def cancelled() -> bool:
        return worker.is_cancelled

    progress = worker_progress(post, task)
    try:
        report = job(progress, cancelled)
    except Cancelled:  # escape closed the screen: nothing to report
        return
    except CkptError as exc:
        post(Failed.of(task, exc))
        return
    except OSError as exc:
        post(Failed(task, f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")))
        return
    if not cancelled():
        # a report over 50,000 tensors stays alive while shown: aged here, not on the UI thread
        process.settle_young()
        post(ReportReady(task, report))


ONLY_THE_OTHER_SIDE = ("missing (",)
"""The headings of sections whose keys are the reference's alone (enter on one says there is nothing to go to)."""


class ReportList(OptionList):
    """A report's rows: arrows, j/k, Home/End, g/G, PgUp/PgDn; enter picks."""

    BINDINGS: ClassVar[list[BindingType]] = LIST_BINDINGS

    def _move_page(self, direction: Literal[-1, 1]) -> None:
        """PgDn/PgUp move the view a page, and the highlight with it: OptionList's own moves the highlight
        alone, and the view follows it only so far as to show it (2 lines at first, as people saw it)."""
        before = self.scroll_y
        super()._move_page(direction)
        page = self.scrollable_content_region.height
        self.scroll_to(y=max(0, min(before + direction * page, self.max_scroll_y)), animate=False, immediate=True)


class ReportScreen(ModalScreen[ReportResult | None]):
    """A report computed by the screen's worker, then shown; subclasses give the work (:meth:`job`), how the
    report shows (:meth:`shown`) and what its keys do."""

    BINDINGS: ClassVar[list[BindingType]] = REPORT_BINDINGS
    TASK: ClassVar[str] = "report"
    """Names the work in its messages (and ``Cannot TASK`` when it fails)."""

    def __init__(self, title: str, working: str) -> None:
        super().__init__()
        self.title_text = title
        self.working = working
        """What the worker does, in words (``diffing with other.pth``)."""
        self.report: Any = None
        self.summary = Text(f"{working}… (escape cancels)")
        self.sections: list[Section] = []
        self.targets: list[Any] = []
        self.heads: list[Text] = []
        """Each listed section's head: its heading, then its columns (a table's) on a second line."""
        self.option_heads: list[int] = []
        """For each option of the list, the head shown while it is the top line (see :meth:`show`)."""
        self.heading_options: dict[int, int] = {}
        """The options that are a later section's heading in the list, with that section's head."""

    # ---- layout --------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog report"):
            yield Static(data(self.title_text), classes="dialog-title", id="report-title", markup=False)
            yield Static(self.summary, classes="dialog-body", markup=False)
            yield ProgressBar(total=1.0, show_eta=False, id="report-progress")
            yield Static(id="report-head", markup=False)
            yield ReportList(id="report-list")
            yield Static("escape: cancel", classes="dialog-hint", markup=False)

    def on_mount(self) -> None:
        # the head follows the list: the heading (and a table's columns) of the section at its top
        self.watch(self.query_one(ReportList), "scroll_y", self._list_scrolled, init=False)
        self.start()

    # ---- the worker ----------------------------------------------------------------------------

    def start(self) -> None:
        """Compute the report (again): the working line and the progress bar until it is ready."""
        self.report = None
        self.summary = Text(f"{self.working}… (escape cancels)")
        self.query_one("#report-title", Static).update(data(self.title_text))
        self.query_one(".dialog-body", Static).update(self.summary)
        self.query_one("#report-progress", ProgressBar).update(progress=0)
        self.query_one("#report-progress").display = True
        self.query_one(ReportList).clear_options()
        self.query_one(ReportList).display = True
        self.heads, self.option_heads = [], []
        self.query_one("#report-head").display = False
        self.query_one(".dialog-hint", Static).update("escape: cancel")
        self._run(self.job())

    def job(self) -> Job:
        """The work, with its inputs taken now (on the UI thread)."""
        raise NotImplementedError

    @work(thread=True, exclusive=True, group="report", description="report")
    def _run(self, job: Job) -> None:
        """The report off the UI thread; reports by message only (nothing once the screen is closed)."""
        run_job(self.post_message, self.TASK, job)

    @on(Progress)
    def _progress(self, message: Progress) -> None:
        if message.task == self.TASK:
            self.query_one("#report-progress", ProgressBar).update(progress=message.fraction)

    @on(Failed)
    def _failed(self, message: Failed) -> None:
        if message.task != self.TASK:
            return
        message.mark(self)
        self.notify(printable(message.error), title=f"Cannot {self.TASK}", severity="error", markup=False)
        self.dismiss(None)

    @on(ReportReady)
    def _ready(self, message: ReportReady) -> None:
        if message.task != self.TASK:
            return
        self.report = message.report
        described = self.described(message.report)
        offers = self.offers(described)
        summary, sections = report_body(described, offers)
        # the summary keeps one line per fact: the explanations lead the list, under it, in one "notes" section:
        # the notes first where the summary offers a fix, else after the screen's own details
        listed = _notes_listed(described, offers)
        notes = [*(described.notes if listed else []), *described.asides]
        noted: list[Section] = [("notes", [(None, data(note)) for note in notes])] if notes else []
        leading = [*noted, *self.details(described)] if listed else [*self.details(described), *noted]
        counts = [len(rows) for _, rows in leading] + [section.count for section in described.sections]
        columns = [""] * len(leading) + [section.columns for section in described.sections]
        self.show(summary, [*leading, *sections], counts, columns)

    # ---- the report ------------------------------------------------------------------------------

    def described(self, report: Any) -> Described:
        """Core's description of the report, for this screen's width (it may retitle the screen)."""
        raise NotImplementedError

    def offers(self, described: Described) -> Text:
        """What the browser offers to do with the report, under core's notes (lines, each after a line break)."""
        return Text()

    def details(self, described: Described) -> list[Section]:
        """The screen's own sections that lead the list, before core's (a fix's details); core's notes and longer
        explanations (``asides``) are placed beside them in one "notes" section."""
        return []

    def hints(self) -> list[str]:
        """The keys that apply to the report shown, in words (after enter and escape)."""
        return []

    def show(
        self, summary: Text, sections: list[Section], counts: list[int] | None = None, columns: list[str] | None = None
    ) -> None:
        """Show a report: its summary over the rows of every section that has some, each headed by how many
        keys it stands for (``counts``, core's: a folded row stands for several; else its rows) and, for a
        table, its ``columns``.

        The head above the list is the heading of the section at the list's top, kept there as its rows
        scroll (as a table keeps its header): the first section's heading is the head alone; a later one's
        heading and columns open it in the list, and are the head from when the rule above them is the top line."""
        self.summary, self.sections, self.targets = summary, sections, []
        self.heads, self.option_heads, self.heading_options = [], [], {}
        options: list[Option | None] = []
        for index, (heading, rows) in enumerate(sections):
            if not rows:
                continue
            count = counts[index] if counts is not None else len(rows)
            # a long heading wraps (the head is as tall as the tallest one: a table's has its columns under it)
            title = wrapped(Text(f"{heading} ({count})", style="bold underline"), row_width(self.app.size.width))
            table = columns[index] if columns is not None else ""
            head = Text("\n").join([title, Text(table, style="bold")]) if table else title
            if self.heads:
                # the heading opens its section in the list; the head shows it once the rows above scroll off
                self.heading_options[len(self.targets)] = len(self.heads)
                options.append(Option(head, disabled=True))
                self.targets.append(None)
                self.option_heads.append(len(self.heads) - 1)
            self.heads.append(head)
            for target, text in rows:
                # a row that goes nowhere is prose (a note): wrapped; a key row is fitted to one line by core
                shown = text if target is not None else wrapped(text, row_width(self.app.size.width))
                options.append(Option(shown, id=f"row-{len(self.targets)}"))
                self.targets.append(target)
                self.option_heads.append(len(self.heads) - 1)
            options.append(None)
        self.query_one("#report-progress").display = False
        self.query_one("#report-title", Static).update(data(self.title_text))
        self.query_one(".dialog-body", Static).update(summary)
        listed = self.query_one(ReportList)
        listed.clear_options()
        listed.add_options(options)
        # a report with nothing to list (identical files) shows no empty box under its verdict
        listed.display = bool(options)
        self.query_one("#report-head").display = bool(options)
        self._list_scrolled()
        listed.action_first()
        listed.focus()
        # the keys this report offers first: at 80 columns the line holds them all
        hint = " · ".join([*self.hints(), "enter: go to key", "escape: close"])
        self.query_one(".dialog-hint", Static).update(hint)

    def _list_scrolled(self) -> None:
        """Show the head of the section at the list's top line; as tall as the tallest head, so that the list
        does not move as the head changes."""
        if not self.heads:
            return
        listed = self.query_one(ReportList)
        lines = listed._lines  # (option index, line in the option) per line of the list
        top = int(listed.scroll_y)
        option = lines[top][0] if 0 <= top < len(lines) else 0
        section = self.option_heads[option] if option < len(self.option_heads) else 0
        below = lines[top + 1][0] if 0 <= top < len(lines) - 1 else option
        # the top line is the rule that ends a section, or the next one's heading: none of the rows above is in
        # view, and the head is the section the view is in (as a table's header is)
        if below != option and below in self.heading_options:
            section = self.heading_options[below]
        elif option in self.heading_options:
            section = self.heading_options[option]
        head = self.heads[section]
        tallest = max(len(shown.plain.split("\n")) for shown in self.heads)
        padded = head.copy()
        padded.append("\n" * (tallest - len(head.plain.split("\n"))))
        self.query_one("#report-head", Static).update(padded)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        index = int((event.option.id or "row-0").removeprefix("row-"))
        target = self.targets[index] if index < len(self.targets) else None
        if target is None:
            self._says_why_not(event)
            return
        path = self.path_of(target)
        if path is None:
            self.notify(f"{printable(str(target))} is not in this checkpoint", severity="warning", markup=False)
            return
        self.dismiss(Jump(path))

    def _says_why_not(self, event: OptionList.OptionSelected) -> None:
        """Enter on a key only the other side has (a compare's missing key): say so (it did nothing, silently);
        a line of prose goes nowhere and says nothing."""
        at = event.option_index
        section = self.option_heads[at] if at < len(self.option_heads) else 0
        if at in self.heading_options or not self.heads[section].plain.startswith(ONLY_THE_OTHER_SIDE):
            return
        prompt = event.option.prompt
        shown = prompt.plain if isinstance(prompt, Text) else str(prompt)
        self.notify(
            f"{printable(shown.strip())} is in the reference only: there is no key of this checkpoint to go to",
            severity="warning",
            markup=False,
        )

    def path_of(self, target: Any) -> KeyPath | None:
        """Where a row's target is in the browser's tree (None: nowhere)."""
        return target if isinstance(target, tuple) else None

    # ---- keys --------------------------------------------------------------------------------------

    def not_yet(self) -> bool:
        """Whether the report is still being computed (and said so)."""
        if self.report is None:
            self.notify(f"{self.working}… (escape cancels)", markup=False)
            return True
        return False

    def action_fix(self) -> None:
        self.notify("no fix to apply here", severity="warning", markup=False)

    def action_realign(self) -> None:
        self.notify("nothing to compare another way here", severity="warning", markup=False)

    def action_layer_change(self) -> None:
        self.notify("no per-layer change for this report (D diffs, then s measures)", severity="warning", markup=False)

    def action_fix_alternative(self) -> None:
        self.notify("no alternative fix here", severity="warning", markup=False)

    def action_swap(self) -> None:
        self.notify("no sides to swap in this report (D diffs two files)", severity="warning", markup=False)

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(key_rows(self.active_bindings)))

    def action_close(self) -> None:
        self.workers.cancel_group(self, "report")
        self.dismiss(None)
