"""What workers report, as typed messages.

A worker never reads or changes a widget: it gets what it needs as arguments and posts one of these
to the widget that started it (``post_message`` is thread-safe), which handles it with ``@on``.
Each result carries the version it was computed for (the session's version, or the detail panel's
request number); the handler drops a result whose version is no longer current. A report screen's
result needs none: the screen was given the tree it reports on, and its worker ends with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from textual.message import Message
from textual.worker import get_current_worker

from ckpt_tui.core.errors import Cancelled, CkptError, FileChanged
from ckpt_tui.core.model.keypath import KeyPath
from ckpt_tui.core.model.tree import Checkpoint
from ckpt_tui.core.operations.info import Summary
from ckpt_tui.core.runtime.progress import ProgressThrottle
from ckpt_tui.core.weights_only.verdict import Verdict
from ckpt_tui.core.writers.judge import Outlook

if TYPE_CHECKING:  # numpy-backed: imported by the workers when first needed
    from ckpt_tui.core.conventions.parts import Parts
    from ckpt_tui.core.values.stats import TensorStats
    from ckpt_tui.core.values.tensor_table import TensorRow


@dataclass
class Progress(Message, bubble=False):
    """How far a long task has got (0..1): ``task`` names it (``save``, ``check``, ``diff``, ``layer-change``,
    ``layers``, ``stats``), ``request`` the detail panel's request for ``stats``. A newer one of the same
    task replaces one still queued: a slow screen skips to the latest."""

    task: str
    fraction: float
    request: int = 0

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, Progress) and (message.task, message.request) == (self.task, self.request)


REDRAW_EVERY = 0.4
"""Seconds between two progress redraws of a screen's bar: each redraw costs the UI thread a frame, and 50
of them were most of what a 2-second read of 50,000 tensors cost it (a bar moving 2.5 times a second still
reads as moving)."""


class ProgressPoster(ProgressThrottle):
    """A worker's progress callback: core's throttled :class:`ProgressStep`, posted as :class:`Progress`;
    ``every``: at least that many seconds apart, the first that long after the poster is made (the browser's
    bars pass :data:`REDRAW_EVERY`: the stats of a small tensor, done sooner, flash no bar in the panel)."""

    def __init__(
        self,
        post: Callable[[Message], object],
        task: str,
        request: int = 0,
        cancelled: Callable[[], bool] | None = None,
        every: float = 0.0,
    ) -> None:
        super().__init__(lambda step: post(Progress(step.task, step.fraction, step.request)), task, request, cancelled)
        self.every = every
        self.posted_at = time.monotonic()

    def fraction(self, fraction: float, done: int = 0, total: int = 0) -> None:
        """Report ``fraction`` when it is a step past the last one reported and ``every`` seconds after it."""
        if self.every and time.monotonic() - self.posted_at < self.every:
            return
        last = self.last
        super().fraction(fraction, done, total)
        if self.last != last:
            self.posted_at = time.monotonic()


def worker_progress(post: Callable[[Message], object], task: str) -> Callable[[int, int], None]:
    """The current worker's progress callback ``(done, total)``: posts :class:`Progress` for ``task`` (a step
    and :data:`REDRAW_EVERY` apart), and raises ``Cancelled`` once the worker is cancelled (escape), so that
    the work stops at its next step even where core takes no cancel check."""
    worker = get_current_worker()
    poster = ProgressPoster(post, task, cancelled=lambda: worker.is_cancelled, every=REDRAW_EVERY)

    def progress(done: int, total: int) -> None:
        if worker.is_cancelled:
            raise Cancelled(f"{task} cancelled")
        poster(done, total)

    return progress


@dataclass
class Failed(Message, bubble=False):
    """A worker's task could not be done: ``task`` names it (``open``, ``reopen``, ``stats``, ``compare``,
    ``diff``, ``layer-change``, ``check``, ``layers``), ``error`` says why in one line, ``version`` is the
    session version or the detail panel's request it was for."""

    task: str
    error: str
    version: int = 0
    stale: bool = False
    """The file changed on disk since it was opened (its values are refused): the tree is no longer the file's."""

    @classmethod
    def of(cls, task: str, error: CkptError, version: int = 0) -> Failed:
        """The message for a worker's error (``stale`` when the file changed on disk)."""
        return cls(task, str(error), version, isinstance(error, FileChanged))

    def mark(self, widget: Any) -> None:
        """Tell the app, when the file changed on disk, so that it marks the tree as no longer the file's."""
        if self.stale:
            widget.app.post_message(FileChangedOnDisk(self.error))


@dataclass
class FileChangedOnDisk(Message, bubble=False):
    """A worker found the file changed on disk since it was opened: the app marks the tree stale."""

    error: str


@dataclass
class CheckpointOpened(Message, bubble=False):
    """The file was read (metadata only); ``reopened`` after a save replaced it."""

    checkpoint: Checkpoint
    reopened: bool


@dataclass
class SummaryReady(Message, bubble=False):
    """Totals and findings for the tree of session ``version``."""

    version: int
    summary: Summary
    weights_only: Verdict | None = None
    """Whether torch.load(weights_only=True) loads the file on disk (computed once per file)."""
    storage_users: dict[int, int] | None = None
    """How many listed tensors view each storage, by ``id`` of the storage (counted in the worker)."""
    counted_with: tuple[bool, Any] | None = None
    """Whether the tree was edited, and the model compared with (the findings' evidence), as counted."""


@dataclass
class StagedJudged(Message, bubble=False):
    """What ``torch.load(weights_only=True)`` makes of the tree of session ``version`` once saved as ``.pth``."""

    version: int
    outlook: Outlook


@dataclass
class SearchFound(Message, bubble=False):
    """The key paths of session ``version`` that contain ``query`` (at most ``MAX_MATCHES``)."""

    version: int
    query: str
    matches: list[KeyPath]
    listings: dict[int, Any] = field(default_factory=dict)
    """The big dicts on the way to the first match, listed with their keys' places (``tree_view.Listing``)."""


@dataclass
class PreviewReady(Message, bubble=False):
    """An edit computed on the tree of session ``version``: its result and change, or why it does not apply."""

    version: int
    root: Any
    change: Any
    error: str
    proposal: Any
    """What the browser needs to apply it (the relocation, what to do on an error)."""
    groupings: dict[int, Any]
    """Module groups of the new tree's open state_dicts, counted here (when the tree is grouped)."""
    listings: dict[int, Any] = field(default_factory=dict)
    """The new tree's open big containers, listed here (``tree_view.Listing`` by ``id`` of the container)."""


@dataclass
class GroupingReady(Message, bubble=False):
    """Module groups of the open state_dicts of session ``version``, counted off the UI thread for ``v``."""

    version: int
    groupings: dict[int, Any]


@dataclass
class StatsReady(Message, bubble=False):
    """The stats of detail request ``request``."""

    request: int
    stats: TensorStats
    nonfinite: str | None = None
    """Where a tensor with NaN or Inf holds them, in ``check``'s words (None: it holds none)."""


@dataclass
class ReportReady(Message, bubble=False):
    """A report screen's worker is done: core's report (``task``: ``compare``, ``diff``, ``layer-change``,
    ``check``) for the tree the screen was given."""

    task: str
    report: Any


@dataclass
class SaveFinished(Message, bubble=False):
    """A save of the tree of session ``version`` ended: the result line, or the error."""

    version: int
    target: str
    line: str | None
    error: str
    replaced_source: bool
    short: str = ""
    """The result in one line, its weights_only verdict first (the status line's)."""


@dataclass
class LayersReady(Message, bubble=False):
    """Every tensor's row for the layers view, their marks (by ``id`` of the row) and the bytes by part."""

    rows: list[TensorRow]
    marks: dict[int, str]
    parts: Parts
    families: dict[str, list[TensorRow]] = field(default_factory=dict)
    """The rows of each family (the same key with other layer numbers), by its name, in file order."""
    family_of: dict[int, str] = field(default_factory=dict)
    """Each row's family name, by ``id`` of the row."""
    texts: dict[int, Any] = field(default_factory=dict)
    """The cell texts of the rows listed first (``layers.CellTexts``), by ``id`` of the row."""
    off_norms: dict[int, str] = field(default_factory=dict)
    """The rows left out of the norm-by-layer plot of every tensor, by ``id`` of the row: what each is
    (``integer``, ``optimizer state``)."""
