"""The detail panel: the focused node's full path and what it is, a tensor's stats and histogram, then its storage.

The panel owns its stats: a short timer after the cursor settles, then a thread worker that posts
``Progress``/``StatsReady``/``Failed`` back to the panel. Each request has a number; a result
for any request but the newest is dropped, and a new request cancels the old worker.
"""

from __future__ import annotations

import re
import reprlib
from typing import TYPE_CHECKING, Any

from rich.console import Group as RichGroup
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.timer import Timer
from textual.widgets import ProgressBar, Static
from textual.worker import get_current_worker

from ckpt_tui.core.conventions.findings import tensor_problem
from ckpt_tui.core.errors import CkptError
from ckpt_tui.core.model.describe import Totals, count, counted, plural, scalar_text, shape, size
from ckpt_tui.core.model.grouping import Group
from ckpt_tui.core.model.keypath import KeyPath
from ckpt_tui.core.model.numpy_values import numpy_value
from ckpt_tui.core.model.tree import Opaque, Tensor, has_children, type_label
from ckpt_tui.core.runtime.safe_text import printable
from ckpt_tui.tui.messages import REDRAW_EVERY, Failed, Progress, ProgressPoster, StatsReady
from ckpt_tui.tui.plots import histogram, lines_text
from ckpt_tui.tui.text import broken, data, path_text
from ckpt_tui.tui.widgets.tree_view import child_count

if TYPE_CHECKING:  # numpy is imported only when stats are first computed
    from ckpt_tui.core.values.stats import TensorStats

STATS_DELAY = 0.15
HISTOGRAM_HEIGHT = 5
HISTOGRAM_WIDTH = 24


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def _grid() -> Table:
    table = Table.grid(padding=(0, 2))
    # one width for the names of every part of the panel, so the values line up from part to part
    table.add_column(style="italic", min_width=NAME_WIDTH)
    # a word wider than the panel (a path in a payload's call) breaks onto the next line, never cut with …
    table.add_column(overflow="fold")
    return table


NAME_WIDTH = len("elements")
"""The names' column of the panel's tables."""


def stats_table(stats: TensorStats, nonfinite: str | None = None) -> Table:
    """Min/max/mean/std, the L2 norm and the counts, as a two-column table (the first values: after the
    histogram, :func:`first_values`); ``nonfinite``: where a tensor with NaN or Inf holds them, said in one row
    in place of the two counts."""
    table = _grid()
    table.add_row("min", _number(stats.min))
    table.add_row("max", _number(stats.max))
    table.add_row("mean", _number(stats.mean))
    table.add_row("std", _number(stats.std))
    table.add_row("L2 norm", _number(stats.norm))
    if stats.nan or stats.inf:
        # (as stats says under its table: a max that leaves out +Inf must not read as the tensor's max)
        table.add_row("", Text("(these of the finite values)", style="italic"))
    if nonfinite is not None:
        # an index kept whole on the panel's narrow column: [3,5], never "[3," at a line's end
        whole = re.sub(r"\[[^\]]*\]", lambda index: index.group().replace(", ", ","), nonfinite)
        table.add_row("NaN/Inf", Text(f"(!) {whole}", style="bold red"))
    else:
        table.add_row(
            "NaN", Text(f"{stats.nan}" + ("  (!)" if stats.nan else ""), style="bold red" if stats.nan else "")
        )
        table.add_row(
            "Inf", Text(f"{stats.inf}" + ("  (!)" if stats.inf else ""), style="bold red" if stats.inf else "")
        )
    table.add_row("zeros", f"{stats.zeros} of {stats.count}")
    return table


def first_values(stats: TensorStats) -> Table:
    """The first values of the tensor, in storage order."""
    table = _grid()
    if stats.first:
        table.add_row("first", ", ".join(f"{v:.4g}" for v in stats.first[:8]))
    return table


def histogram_block(stats: TensorStats, log: bool) -> Text:
    """The histogram of the finite values as block bars, ``HISTOGRAM_HEIGHT`` lines, linear or log counts."""
    if not stats.histogram:
        return Text("")
    sample = f", sample of {stats.sampled}" if stats.sampled < stats.finite else ""
    title = Text("histogram", style="bold underline")
    title.append(f" ({'log' if log else 'linear'} counts{sample}; o: {'linear' if log else 'log'})", style="italic")
    bars = lines_text(histogram(stats.histogram, HISTOGRAM_HEIGHT, HISTOGRAM_WIDTH, log))
    low, high = _number(stats.min), _number(stats.max)
    axis = Text(low + " " * max(1, HISTOGRAM_WIDTH - len(low) - len(high)) + high, style="italic")
    return Text("\n").join([title, bars, axis])


def parts_text(tensor: Tensor) -> Text:
    """What a sparse or quantized tensor is stored as, a line a part (the parts' names are too long for a column)."""
    lines = [Text(f"stored as ({tensor.kind})", style="bold")]
    for name, part in tensor.parts() or ():
        if name in ("int_repr", "size"):  # the tensor's own shape, said above
            continue
        text = f"{shape(part.shape)} {part.dtype}" if isinstance(part, Tensor) else str(part).removeprefix("torch.")
        lines.append(Text.assemble((printable(name), "italic"), "  ", printable(text)))
    return Text("\n").join(lines)


def value_meta(value: Any, shared: int, totals: Totals | None) -> RenderableType:
    """The rows that say what one value is (every string from the file escaped); a tensor's storage rows
    come apart (:func:`storage_meta`), under its stats."""
    table = _grid()
    found = numpy_value(value, PANEL_VALUES)
    table.add_row("type", data(found.type_name if found is not None else type_label(value)))
    if isinstance(value, Tensor):
        table.add_row("shape", shape(value.shape))
        table.add_row("dtype", data(value.dtype))
        problem = tensor_problem(value)
        if problem:
            table.add_row("problem", data(problem, "bold red"))
    elif found is not None:
        table.add_row("dtype", data(found.dtype))
        if found.shape is not None:
            table.add_row("shape", shape(found.shape))
        table.add_row("values" if found.shape else "value", data(found.values_text()))
        # torch.load(weights_only=True) refuses it by this name (without add_safe_globals)
        table.add_row("global", data(value.global_name))
    elif isinstance(value, Opaque):
        table.add_row("global", data(value.global_name))
        table.add_row("executed", Text("no: recorded only", style="bold" if not value.safe else ""))
        # the whole call, wrapped in the panel: what a reviewer of a payload wants to read
        table.add_row("arguments", data(call_arguments(value.args)))
    elif not has_children(value):
        table.add_row("value", data(scalar_text(value, 400)))
    else:
        kids = child_count(value)  # a dict's length, not a step per child
        table.add_row("children", str(kids))
        if totals is not None and totals.tensors:
            add_below(table, totals.tensors, totals.parameters, totals.nbytes)
        elif totals is None and kids:
            table.add_row("tensors", Text("too many nodes below to count here (see the header)", style="italic"))
        metadata = getattr(value, "_metadata", None)
        if isinstance(metadata, dict):
            table.add_row("_metadata", f"{len(metadata)} (kept by .pth only)")
    return table


PANEL_VALUES = 64
"""The most values of a numpy array the panel shows (more: its dtype and shape only)."""
CALL_LIMIT = 2000
"""The most characters of a recorded call's arguments the panel shows (wrapped)."""

_WHOLE = reprlib.Repr()
_WHOLE.maxlevel, _WHOLE.maxlist, _WHOLE.maxtuple, _WHOLE.maxdict = 3, 8, 8, 6
_WHOLE.maxstring, _WHOLE.maxother, _WHOLE.maxlong = CALL_LIMIT, 80, 40


def call_arguments(args: tuple[Any, ...]) -> str:
    """A recorded call's arguments as Python, each string whole (``('echo PWNED > /tmp/x',)``), bounded."""
    plain = (str, bytes, int, float, bool, type(None))
    # an int: scalar_text bounds a huge one (str() of it raises past 4,300 digits)
    parts = [_WHOLE.repr(a) if isinstance(a, plain) and not isinstance(a, int) else scalar_text(a, 200) for a in args]
    text = "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
    return text if len(text) <= CALL_LIMIT else text[: CALL_LIMIT - 1] + "…"


def storage_meta(tensor: Tensor, shared: int) -> RenderableType:
    """Where a tensor's values are: device, size, layout in its record, what shares the record."""
    table = _grid()
    table.add_row("device", data(tensor.device, "bold" if "cuda" in tensor.device else ""))
    table.add_row("elements", f"{tensor.numel:,}")
    table.add_row("bytes", size(tensor.nbytes))
    if tensor.kind == "dense" or tensor.stride:
        table.add_row("stride", str(tensor.stride))
        table.add_row("offset", str(tensor.storage_offset))
    if tensor.storage is not None:
        table.add_row("storage", storage_text(tensor))
        if shared:
            table.add_row("shared", f"with {counted(shared, 'other tensor')}")
    if tensor.kind != "dense":
        return RichGroup(table, Text(""), parts_text(tensor))
    return table


def storage_text(tensor: Tensor) -> Text:
    """``record 6``, and the record's size where the tensor views only part of it."""
    storage = tensor.storage
    assert storage is not None
    whole = f" ({size(storage.nbytes)} in all)" if storage.nbytes != tensor.nbytes else ""
    return data(f"record {storage.key}{whole}")


def add_below(table: Table, tensors: int, elements: int, nbytes: int) -> None:
    """What every tensor below a node adds up to, one short line each (they fit the panel at 80 columns)."""
    # the short count, as the header gives it: the exact one of a 7B model would wrap the panel at 80 columns
    lines = [f"{tensors:,} {plural(tensors, 'tensor')}", f"{count(elements)} {plural(elements, 'element')}"]
    lines.append(size(nbytes))
    table.add_row("below", "\n".join(lines))


def group_meta(group: Group) -> Table:
    """The rows describing a module group."""
    table = _grid()
    table.add_row("type", "module group")
    table.add_row("keys", data(group.prefix + "*"))
    table.add_row("entries", str(len(group.entries)))
    add_below(table, group.tensors, group.parameters, group.nbytes)
    table.add_row("edits", Text("d x r y c t act on all its keys", style="italic"))
    return table


class DetailPanel(VerticalScroll):
    """Shows one node; tensor stats arrive from the panel's own worker."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.request = 0
        self.shown: tuple[Any, ...] | None = None
        self._timer: Timer | None = None
        self._tensor: Tensor | None = None
        self._byteorder = "little"
        self._stats: TensorStats | None = None
        self._nonfinite: str | None = None
        self._shown_meta: tuple[str, RenderableType] | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="detail-meta")
        yield ProgressBar(total=1.0, show_eta=False, id="detail-progress")
        yield Static(id="detail-stats")
        yield Static(id="detail-storage")

    def on_mount(self) -> None:
        self.query_one("#detail-progress").display = False

    # ---- what is shown ------------------------------------------------------------------

    def show_value(
        self, path: KeyPath, value: Any, *, shared: int = 0, totals: Totals | None = None, byteorder: str = "little"
    ) -> None:
        """Describe a value; a dense tensor's stats follow once the cursor rests on it."""
        key = (path, id(value), shared, totals)
        if key == self.shown:
            return
        self._new_request(key)
        self._meta(path_text(path), value_meta(value, shared, totals))
        if isinstance(value, Tensor):
            # what a user opens the panel for first (stats, histogram), where it lives after
            self.query_one("#detail-storage", Static).update(RichGroup(Text(""), storage_meta(value, shared)))
            if value.storage is None or value.kind != "dense":
                self._note(f"no stats for {value.kind} tensors")
                return
            self._tensor, self._byteorder = value, byteorder
            self._timer = self.set_timer(STATS_DELAY, self.stats_now)

    def show_group(self, path: KeyPath, group: Group) -> None:
        """Describe a module group of a flat state_dict."""
        key = (path, group.prefix, id(group))
        if key == self.shown:
            return
        self._new_request(key)
        title = path_text(path) + " › " + data(group.prefix.rstrip(".").replace(".", " › ")).plain
        self._meta(title, group_meta(group))

    def show_text(self, text: str) -> None:
        """A line in place of a node (while loading)."""
        self._new_request(None)
        self._shown_meta = None
        self.query_one("#detail-meta", Static).update(Text(text, style="italic"))

    def stats_now(self) -> None:
        """Compute the stats of the tensor shown, now."""
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        if self._tensor is None:
            return
        self._note("computing stats… (move the cursor to cancel)")
        self._compute_stats(self.request, self._tensor, self._byteorder)

    def _new_request(self, key: tuple[Any, ...] | None) -> None:
        self.request += 1
        self._stats, self._nonfinite = None, None
        self.shown = key
        self._tensor = None
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        self.workers.cancel_group(self, "stats")
        self.query_one("#detail-stats", Static).update("")
        self.query_one("#detail-storage", Static).update("")
        self.query_one("#detail-progress").display = False

    def _meta(self, title: str, table: RenderableType) -> None:
        self._shown_meta = (title, table)
        # a key path has no spaces: broken after whole keys, not wherever the line ends
        # the width with the scrollbar shown, whether it is now or not: the next node's rows may bring it
        width = (self.content_region.width or 29) - self.styles.scrollbar_size_vertical
        heading = Text(broken(title, width), style="bold")
        self.query_one("#detail-meta", Static).update(RichGroup(heading, Text(""), table))

    def on_resize(self) -> None:
        if self._shown_meta is not None:
            self._meta(*self._shown_meta)

    def _note(self, message: str) -> None:
        self.query_one("#detail-progress").display = False
        self.query_one("#detail-stats", Static).update(data(message, "italic"))

    # ---- the worker and its messages ------------------------------------------------------

    @work(thread=True, exclusive=True, group="stats", description="stats")
    def _compute_stats(self, request: int, tensor: Tensor, byteorder: str) -> None:
        """Stats off the UI thread; reports by message only."""
        from ckpt_tui.core.values.stats import tensor_stats  # numpy: imported when first needed

        worker = get_current_worker()
        poster = ProgressPoster(self.post_message, "stats", request, lambda: worker.is_cancelled, REDRAW_EVERY)
        progress = poster.fraction
        try:
            stats = tensor_stats(tensor, byteorder, cancelled=lambda: worker.is_cancelled, progress=progress)
        except CkptError as exc:
            self.post_message(Failed.of("stats", exc, request))
            return
        nonfinite = None
        if (stats.nan or stats.inf) and not worker.is_cancelled:
            from ckpt_tui.core.values.nonfinite import describe_nonfinite, locate_nonfinite

            # a second read of this tensor alone, for check's sentence: where its first NaN and Inf are
            where = locate_nonfinite(tensor, byteorder, lambda: worker.is_cancelled)
            nonfinite = describe_nonfinite(stats, where)
        if not worker.is_cancelled:
            self.post_message(StatsReady(request, stats, nonfinite))

    @on(Progress)
    def _stats_progress(self, message: Progress) -> None:
        if message.task != "stats" or message.request != self.request:
            return
        bar = self.query_one("#detail-progress", ProgressBar)
        bar.display = True
        bar.update(progress=message.fraction)

    @on(StatsReady)
    def _stats_ready(self, message: StatsReady) -> None:
        if message.request != self.request:
            return
        self._stats = message.stats
        self._nonfinite = message.nonfinite
        self.redraw_stats()

    def redraw_stats(self) -> None:
        """Draw the stats shown (again: after the histogram scale changed)."""
        stats = self._stats
        if stats is None:
            return
        log = bool(getattr(self.app, "histogram_log", False))
        self.query_one("#detail-progress").display = False
        # no "stats" heading: the rows name themselves, and at 80x24 the line lets every one show unscrolled
        self.query_one("#detail-stats", Static).update(
            RichGroup(stats_table(stats, self._nonfinite), Text(""), histogram_block(stats, log), first_values(stats))
        )

    @on(Failed)
    def _stats_failed(self, message: Failed) -> None:
        if message.task == "stats" and message.version == self.request:
            message.mark(self)
            self._note(f"no stats: {self._saved_elsewhere() or message.error}")

    def _saved_elsewhere(self) -> str | None:
        """Where the values an edit made (a cast) are once it was saved (the tree here keeps the source's)."""
        from ckpt_tui.core.model.made_bytes import made_records

        app = self.app
        saved = getattr(app, "last_saved", None)
        session = getattr(app, "session", None)
        storage = self._tensor.storage if self._tensor is not None else None
        if saved is None or session is None or session.unsaved or storage is None:
            return None
        made = made_records(storage.source)
        if made is None or made.made_on_save is None:
            return None
        return f"the {made.made_on_save} were saved to {saved}: open that file to read them"
