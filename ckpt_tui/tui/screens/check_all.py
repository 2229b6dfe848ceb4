"""Check all (``C``): read every tensor of the staged tree (NaN/Inf, unreadable records, bad sparse
indices) in the screen's own worker, with a progress bar; escape cancels. Dismissed with the outcome,
which the browser turns into marks on the tree."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import ProgressBar, Static

from ckpt_tui.core.model.tree import Checkpoint
from ckpt_tui.core.operations.check import CheckReport
from ckpt_tui.tui.messages import Failed, Progress, ReportReady
from ckpt_tui.tui.screens.report import run_job

CANCELLED = "cancelled: nothing was marked"


@dataclass(frozen=True)
class CheckOutcome:
    """The check of the tree of session ``version``: its report, or why there is none."""

    version: int
    report: CheckReport | None
    error: str = ""


class CheckAllScreen(ModalScreen[CheckOutcome]):
    """Read every tensor of ``checkpoint`` (the staged tree of session ``version``)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]
    TASK = "check"

    def __init__(self, version: int, checkpoint: Checkpoint) -> None:
        super().__init__()
        self.version = version
        self.checkpoint = checkpoint

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static("Reading every tensor (NaN/Inf, unreadable records)", classes="dialog-title", markup=False)
            yield ProgressBar(total=1.0, id="progress-bar")
            yield Static("escape cancels; nothing is left behind", classes="dialog-hint", markup=False)

    def on_mount(self) -> None:
        self._check(self.checkpoint)

    @work(thread=True, exclusive=True, group="check", description="check")
    def _check(self, checkpoint: Checkpoint) -> None:
        """The full check off the UI thread; reports by message only (nothing once cancelled)."""
        from ckpt_tui.core.operations.check import check_checkpoint

        run_job(self.post_message, self.TASK, partial(check_checkpoint, checkpoint))

    @on(Progress)
    def _progress(self, message: Progress) -> None:
        if message.task == self.TASK:
            self.query_one("#progress-bar", ProgressBar).update(progress=message.fraction)

    @on(ReportReady)
    def _ready(self, message: ReportReady) -> None:
        if message.task == self.TASK:
            self.dismiss(CheckOutcome(self.version, message.report))

    @on(Failed)
    def _failed(self, message: Failed) -> None:
        if message.task == self.TASK:
            message.mark(self)
            self.dismiss(CheckOutcome(self.version, None, message.error))

    def action_cancel(self) -> None:
        self.workers.cancel_group(self, "check")
        self.dismiss(CheckOutcome(self.version, None, CANCELLED))
