"""The layers view: every tensor's statistics as a table (``stats`` in the browser), and plots.

The screen owns its worker: it reads every tensor of the tree it was given (each view once, in
bounded memory) with a progress bar, and escape cancels. The table sorts by any column (``s`` cycles,
``S`` reverses, a header click picks one), filters by key path (``/``), and enter goes back to the tree
on that tensor. Rows whose values hold NaN/Inf, whose norm is far from their siblings', or that are all
zero are marked in words. Below the table, one plot at a time (``p`` switches): the L2 norm of the
focused tensor's family layer by layer, the focused tensor's histogram (``o``: log counts), or the
bytes by part with the "drop optimizer" figure (``z`` stages that edit, undoable in the tree).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from rich.cells import cell_len
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Input, ProgressBar, Static
from textual.widgets.data_table import RowKey
from textual.worker import get_current_worker

from ckpt_tui.core.errors import Cancelled, CkptError
from ckpt_tui.core.model.describe import shape, size
from ckpt_tui.core.model.keypath import KeyPath, to_slash
from ckpt_tui.core.runtime.safe_text import printable
from ckpt_tui.core.values.text_plots import shared_start, shorten, shorten_all
from ckpt_tui.tui.bindings import LAYERS_BINDINGS, key_rows
from ckpt_tui.tui.fitting import SHORT_DTYPES, Column, fit_columns
from ckpt_tui.tui.messages import REDRAW_EVERY, Failed, LayersReady, Progress, ProgressPoster
from ckpt_tui.tui.plots import bar, column_chart, histogram, lines_text
from ckpt_tui.tui.screens.help import HelpScreen
from ckpt_tui.tui.widgets.footer import KeysFooter

if TYPE_CHECKING:  # numpy-backed: imported by the worker
    from ckpt_tui.core.conventions.parts import Parts
    from ckpt_tui.core.values.tensor_table import TensorRow

PLOTS = ("norms", "histogram", "bytes")
TABLE_COLUMNS = (
    "mark",
    "path",
    "norm",
    "min",
    "max",
    "mean",
    "std",
    "absmax",
    "zeros",
    "nan",
    "inf",
    "shape",
    "dtype",
    "numel",
)
SORTS: tuple[str | None, ...] = (None, *TABLE_COLUMNS)
"""``s`` cycles through these: file order first, then every column."""
PRIORITY = (
    *("mark", "path", "norm", "std", "absmax", "dtype", "shape", "mean", "min", "max", "zeros", "nan", "inf", "numel"),
)
"""What a narrow table keeps, most needed first (the column sorted by comes right after the path): the numbers
that show a broken layer before the ones its mark already says (NaN, Inf) or that the tree shows."""
TEXT_COLUMNS = frozenset({"mark", "path", "shape", "dtype"})
LABELS = {"nan": "NaN", "inf": "Inf", "zeros": "zeros%"}
PATH_WIDTH = 34
PATH_MIN = 30
"""A narrow table drops columns before it shortens a key path below this."""
TABLE_LIMIT = 1000
"""Rows put in the table at most (the first of the sorted, filtered list): a DataTable of 50,000 rows takes
seconds to fill, and sorting or filtering brings any tensor to the top."""
PLOT_HEIGHT = 5
EVERY_TENSOR = "every tensor shown"
"""The norm plot's rows when the focused tensor has no family."""
OFF_NORMS = {"integer": "integers", "optimizer state": "optimizer state"}
"""What the norm plot of every tensor leaves out, in its title's words."""
CELL_COLUMNS = TABLE_COLUMNS[2:]
"""The columns whose text is the row's own (not its mark, not its path): worked out once per row shown."""

ROWS_PAGE = 100
"""Rows added to the table at a time: the first fill builds a few screens of them, the rest follow the cursor."""


class CellTexts(NamedTuple):
    """A row's texts in :data:`CELL_COLUMNS`, whole and compact, its key path's, and their widths."""

    whole: tuple[str, ...]
    compact: tuple[str, ...]
    path: str
    widths: tuple[int, ...]
    """The cells of ``whole`` then ``compact``, then the path, each in terminal cells."""


def number(value: float | None, digits: int = 6) -> str:
    """A statistic with 6 significant digits (``-`` for none), as ``stats`` prints it."""
    return "-" if value is None else f"{value:.{digits}g}"


def cell_text(row: TensorRow, column: str, compact: bool = False) -> str:
    """One cell of a row but its mark and path; ``compact``: 4 significant digits and short dtype names."""
    value = row.value(column)
    if column == "zeros":
        return "-" if value is None else f"{100 * value:.4g}"
    if column == "shape":
        return shape(value)
    if column == "dtype":
        return printable(SHORT_DTYPES.get(value, value) if compact else value)
    if isinstance(value, float):
        return number(value, 4 if compact else 6)
    return "-" if value is None else str(value)


def row_texts(row: TensorRow) -> CellTexts:
    """A row's cells but its mark and path, whole and compact (the worker makes those of the first rows shown)."""
    whole = tuple(cell_text(row, c) for c in CELL_COLUMNS)
    compact = tuple(cell_text(row, c, True) for c in CELL_COLUMNS)
    path = printable(to_slash(row.path)) or "(root)"
    return CellTexts(whole, compact, path, tuple(map(cell_len, (*whole, *compact, path))))


def off_norms(rows: list[TensorRow], parts: Parts) -> dict[int, str]:
    """The rows a norm plot of every tensor leaves out, by ``id`` of the row: integer and bool tensors (a step
    counter's norm is its count, in the thousands, and would flatten every layer's bar) and optimizer state
    (its norms say how the optimizer moved, not what the layers hold)."""
    from ckpt_tui.core.conventions.training_state import tensor_role

    optimizer = [tuple(path) for path in parts.get("optimizer").paths]
    found = {}
    for row in rows:
        role = tensor_role(row.path, row.tensor)
        if role == "counter":
            found[id(row)] = "integer"
        elif role == "optimizer state" or any(tuple(row.path[: len(top)]) == top for top in optimizer):
            found[id(row)] = "optimizer state"
    return found


def fitted_paths(texts: list[CellTexts], cut: int, width: int) -> list[str]:
    """The rows' paths (less their shared start, ``cut`` characters) in ``width``: a path that fits is shown
    whole (not ``s/module.conv1.weight`` for ``state_dict/module.conv1.weight`` because a longer path under it
    does not fit); those that do not are shortened by one rule among them (``shorten_all``), so they read alike."""
    paths = [cells.path[cut:] for cells in texts]
    over = [at for at, path in enumerate(paths) if len(path) > width]
    for at, short in zip(over, shorten_all([paths[at] for at in over], width), strict=True):
        paths[at] = short
    return paths


def short_path(path: KeyPath, width: int = PATH_WIDTH) -> str:
    """A key path that fits ``width``: shortened in the middle, its last components kept."""
    return shorten(printable(to_slash(path)) or "(root)", width)


class LayersTable(DataTable[Any]):
    """The table, with the vim keys the tree has."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("g", "scroll_top", "Top", show=False),
        Binding("G", "scroll_bottom", "Bottom", show=False),
    ]

    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        # every column is given its width (refill): measuring each cell of 1,000 new rows again (most of the
        # time the first fill took the UI thread) would only confirm it
        fixed = all(not column.auto_width for column in self.columns.values())
        super()._update_dimensions(() if fixed else new_rows)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.waiting: list[Any] = []
        """The rows to show, added a page at a time (``fill``)."""
        self.cells_of: Callable[[Any], list[Text]] = lambda row: []

    def fill(self, rows: list[Any], cells: Callable[[Any], list[Text]]) -> None:
        """Show ``rows`` (after clearing those shown), each made into cells by ``cells`` as it is added: a page
        now, the others as the cursor gets near them."""
        self.clear()
        self.waiting, self.cells_of = rows, cells
        self.reach(0)

    def reach(self, index: int) -> None:
        """Add the rows up to ``index`` and a page past it (those not added yet)."""
        added = self.row_count
        if index < added - ROWS_PAGE // 2:  # well inside the rows added
            return
        end = min(len(self.waiting), max(index + 1 + ROWS_PAGE // 2, added + ROWS_PAGE))
        if end > added:
            self.add_rows([self.cells_of(row) for row in self.waiting[added:end]])

    def action_scroll_bottom(self) -> None:
        self.reach(len(self.waiting) - 1)
        super().action_scroll_bottom()


class LayersScreen(Screen[tuple[str, Any] | None]):
    """Per-tensor statistics of the whole tree; dismissed with ``("jump", path)``, ``("drop", paths)`` or None."""

    BINDINGS: ClassVar[list[BindingType]] = LAYERS_BINDINGS

    def __init__(self, root: Any, byteorder: str, readonly: bool = False, log: bool = False) -> None:
        super().__init__()
        self.root = root
        self.byteorder = byteorder
        self.readonly = readonly
        self.log_counts = log
        self.rows: list[TensorRow] = []
        self.marks: dict[int, str] = {}
        self.parts: Parts | None = None
        self.families: dict[str, list[TensorRow]] = {}
        self.family_of: dict[int, str] = {}
        self.texts: dict[int, CellTexts] = {}
        """Each row's cell texts, by ``id`` of the row, made when the row is first listed."""
        self.off_norms: dict[int, str] = {}
        """The rows the norm plot of every tensor leaves out (counters, optimizer state), by ``id`` of the row."""
        self.under = ""
        self.paths: dict[int, str] = {}
        """Each listed row's path as the table shows it (by id of the row): fitted by one rule for the column."""
        """The start every listed row's path shares: the path column's heading, left out of its rows."""
        self.shown: list[TensorRow] = []
        self.sort: str | None = None
        self.reverse = False
        self.filter = ""
        self.plot = "norms"
        self.ready = False

    def compose(self) -> ComposeResult:
        yield Static("reading every tensor… (escape cancels)", id="layers-title", markup=False)
        yield ProgressBar(total=1.0, show_eta=False, id="layers-progress")
        yield LayersTable(id="layers-table", cursor_type="row")
        yield Static(id="layers-plot", markup=False)
        yield Input(placeholder="filter key paths (enter or escape: back to the table)", id="layers-filter")
        yield KeysFooter()

    def on_mount(self) -> None:
        self.query_one("#layers-filter").display = False
        self._compute(self.root, self.byteorder)

    # ---- the worker ---------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="layers", description="layers")
    def _compute(self, root: Any, byteorder: str) -> None:
        """Every tensor's row, the marks and the bytes by part, off the UI thread; reports by message only."""
        from ckpt_tui.core.conventions.layer_marks import families, marks
        from ckpt_tui.core.conventions.parts import split_parts
        from ckpt_tui.core.values.tensor_table import tensor_paths, tensor_rows

        worker = get_current_worker()
        progress = ProgressPoster(
            self.post_message, "layers", cancelled=lambda: worker.is_cancelled, every=REDRAW_EVERY
        )
        try:
            rows = list(tensor_rows(tensor_paths(root), byteorder, lambda: worker.is_cancelled, progress))
            parts = split_parts(root)
        except Cancelled:  # escape closed the screen: nothing to report
            return
        except CkptError as exc:
            self.post_message(Failed.of("layers", exc))
            return
        if worker.is_cancelled:
            return
        # the norm plot follows the cursor: each row's family is named here, once, not on each move
        family_of = families(rows)
        members: dict[str, list[TensorRow]] = {}
        for row in rows:
            members.setdefault(family_of[id(row)], []).append(row)
        # the cells of the rows listed first, written here rather than on the UI thread
        texts = {id(row): row_texts(row) for row in rows[:TABLE_LIMIT]}
        self.post_message(LayersReady(rows, marks(rows), parts, members, family_of, texts, off_norms(rows, parts)))

    @on(Progress)
    def _progress(self, message: Progress) -> None:
        if message.task == "layers":
            self.query_one("#layers-progress", ProgressBar).update(progress=message.fraction)

    @on(LayersReady)
    def _ready(self, message: LayersReady) -> None:
        self.rows, self.marks, self.parts = message.rows, message.marks, message.parts
        self.families, self.family_of = message.families, message.family_of
        self.texts = dict(message.texts)
        self.off_norms = message.off_norms
        self.ready = True
        self.query_one("#layers-progress").display = False
        self.refill()
        self.query_one(LayersTable).focus()

    @on(Failed)
    def _failed(self, message: Failed) -> None:
        if message.task != "layers":
            return
        message.mark(self)
        self.query_one("#layers-progress").display = False
        self.query_one("#layers-title", Static).update(Text(f"layers: {printable(message.error)} (escape: back)"))

    # ---- the table ----------------------------------------------------------------------------

    def refill(self) -> None:
        """Show the rows that pass the filter, in the chosen order; keep the cursor on its tensor."""
        from ckpt_tui.core.values.tensor_table import sort_rows

        table = self.query_one(LayersTable)
        focused = self.focused_row()
        needle = self.filter.lower()
        rows = [row for row in self.rows if not needle or needle in to_slash(row.path).lower()]
        if self.sort == "mark":
            rows.sort(key=lambda row: (id(row) not in self.marks, self.marks.get(id(row), "")))
        elif self.sort is not None:
            rows = sort_rows(rows, self.sort)
        if self.reverse:
            rows.reverse()
        self.shown = rows
        listed = rows[:TABLE_LIMIT]
        labels = {column: self._label(column) for column in TABLE_COLUMNS}
        texts = [self._texts(row) for row in listed]
        # the start every listed path shares heads the path column, said once: the rows' room goes to the rest
        self.under = shared_start([cells.path for cells in texts])
        if self.under:
            labels["path"] = self.under + labels["path"][len("path") :]
        columns = {column: self._column(column, labels[column], listed, texts) for column in TABLE_COLUMNS}
        shown, path_width, compact = fit_columns(
            list(columns.values()), self._priority(), "path", self._room(), PATH_MIN
        )
        cut = len(self.under)
        self.paths = {id(row): path for row, path in zip(listed, fitted_paths(texts, cut, path_width), strict=True)}
        table.clear(columns=True)
        for column in shown:
            found = columns[column]
            # each column's width given: the table need not measure 1,000 rows' cells to find it
            width = path_width if column == "path" else found.compact if compact else found.width
            text = shorten(labels[column], width) if column == "path" else labels[column]
            label = Text(text, justify="left" if column in TEXT_COLUMNS else "right")
            table.add_column(label, key=column, width=width)
        table.fill(listed, lambda row: self._cells(row, self._texts(row), shown, path_width, compact))
        if focused is not None and focused in listed:
            table.reach(rows.index(focused))
            table.move_cursor(row=rows.index(focused), animate=False)
        self.show_title()
        self.show_plot()

    def _label(self, column: str) -> str:
        arrow = (" ▲" if self._ascending() else " ▼") if column == self.sort else ""
        return LABELS.get(column, column) + arrow

    def _priority(self) -> list[str]:
        """The columns by need: the one sorted by stays whatever else a narrow table drops."""
        keep = [self.sort] if self.sort not in (None, "mark", "path") else []
        return ["mark", "path", *keep, *(column for column in PRIORITY[2:] if column not in keep)]

    def _room(self) -> int:
        """The table's columns: the screen's width (the table's own shrinks while it shows a scrollbar), less the
        vertical scrollbar it may show."""
        table = self.query_one(LayersTable)
        return (self.size.width or self.app.size.width) - table.styles.scrollbar_size_vertical

    def _texts(self, row: TensorRow) -> CellTexts:
        """The row's cell texts (made now if the worker did not)."""
        found = self.texts.get(id(row))
        if found is None:
            found = self.texts[id(row)] = row_texts(row)
        return found

    def _column(self, column: str, label: str, rows: list[TensorRow], texts: list[CellTexts]) -> Column:
        """How wide the column's cells are, whole and compact (``texts``: the rows' cell texts)."""
        if column == "mark":
            marks = [self._mark(row) for row in rows]
            return Column(column, max(map(cell_len, [label, *marks])), max(map(cell_len, [label, *marks])))
        if column == "path":
            widest = max([cell_len(label), *(cells.widths[-1] - cell_len(self.under) for cells in texts)])
            return Column(column, widest, widest)
        at = CELL_COLUMNS.index(column)
        whole = max([cell_len(label), *(cells.widths[at] for cells in texts)])
        compact = max([cell_len(label), *(cells.widths[len(CELL_COLUMNS) + at] for cells in texts)])
        return Column(column, whole, compact)

    def _mark(self, row: TensorRow) -> str:
        return self.marks.get(id(row), "" if row.stats is not None else "n/a")

    def _ascending(self) -> bool:
        natural = self.sort in ("path", "dtype", "mark")
        return natural != self.reverse

    def _cells(
        self, row: TensorRow, texts: CellTexts, columns: list[str], path_width: int, compact: bool
    ) -> list[Text]:
        cells = []
        for column in columns:
            if column == "mark":
                mark = self._mark(row)
                cells.append(Text(mark, style="bold" if mark.startswith("!!") else ""))
            elif column == "path":
                path = self.paths.get(id(row))
                cells.append(Text(path if path is not None else shorten(texts.path[len(self.under) :], path_width)))
            else:
                text = (texts.compact if compact else texts.whole)[CELL_COLUMNS.index(column)]
                cells.append(Text(text, justify="left" if column in TEXT_COLUMNS else "right"))
        return cells

    def focused_row(self) -> TensorRow | None:
        """The tensor under the table's cursor."""
        table = self.query_one(LayersTable)
        if not self.shown or table.cursor_row < 0 or table.cursor_row >= min(len(self.shown), table.row_count):
            return None
        return self.shown[table.cursor_row]

    def show_title(self) -> None:
        """One line: counts, order, filter, and the focused tensor's path (or why it has no stats), shortened in
        the middle to the width left."""
        order = "file order" if self.sort is None else f"by {self.sort} {'▲' if self._ascending() else '▼'}"
        marked = len(self.marks)  # marks are by id of the rows: each a row of this table
        parts = [f"{len(self.shown)}/{len(self.rows)} tensors", order, f"{marked} marked"]
        if len(self.shown) > TABLE_LIMIT:
            parts[0] += f" (first {TABLE_LIMIT} listed: sort or filter for the others)"
        if self.filter:
            parts.append(f"filter {self.filter!r}")
        title = self.query_one("#layers-title", Static)
        row = self.focused_row()
        if row is not None:
            reason = f" ({row.reason})" if row.reason else ""
            room = (title.content_region.width or self.app.size.width - 2) - len(" · ".join(parts)) - 3 - len(reason)
            parts.append(short_path(row.path, max(room, 12)) + reason)  # its end, not the line's cut
        title.update(Text(" · ".join(parts)))

    def on_resize(self) -> None:
        if self.ready:
            self.refill()

    @on(DataTable.RowHighlighted)
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.query_one(LayersTable).reach(event.cursor_row)
        self.show_title()
        self.show_plot()

    @on(DataTable.RowSelected)
    def _selected(self, event: DataTable.RowSelected) -> None:
        row = self.focused_row()
        if row is not None:
            self.dismiss(("jump", row.path))

    @on(DataTable.HeaderSelected)
    def _header(self, event: DataTable.HeaderSelected) -> None:
        column = str(event.column_key.value)
        if column == self.sort:
            self.reverse = not self.reverse
        else:
            self.sort, self.reverse = column, False
        self.refill()

    # ---- the plots ----------------------------------------------------------------------------

    def show_plot(self) -> None:
        """Draw the current plot for the focused tensor."""
        if not self.ready:
            return
        width = max(20, self.query_one("#layers-plot").size.width or self.app.size.width - 2)
        draw = {"norms": self.norm_plot, "histogram": self.histogram_plot, "bytes": self.bytes_plot}[self.plot]
        self.query_one("#layers-plot", Static).update(draw(width))

    def family_rows(self) -> tuple[str, list[TensorRow]]:
        """The focused tensor's family (the same key with other layer numbers), in file order; else every row shown."""
        row = self.focused_row()
        if row is not None:
            name = self.family_of.get(id(row), "")
            members = self.families.get(name, [])
            if len(members) > 1:
                return name, members
        shown = set(map(id, self.shown))
        return EVERY_TENSOR, [r for r in self.rows if id(r) in shown]

    def norm_plot(self, width: int) -> Text:
        """(a) L2 norm by layer, in file (module) order: jumps and dead layers show at once."""
        name, rows = self.family_rows()
        left_out = ""
        if name == EVERY_TENSOR:
            kept = [row for row in rows if id(row) not in self.off_norms]
            if kept and len(kept) < len(rows):
                kinds = dict.fromkeys(self.off_norms[id(row)] for row in rows if id(row) in self.off_norms)
                left_out = " and ".join(OFF_NORMS[kind] for kind in kinds) + " left out"
                rows = kept
        focused = self.focused_row()
        norms = [row.stats.norm if row.stats is not None else None for row in rows]
        marks = []
        for row in rows:
            mark = self.marks.get(id(row), "")
            marks.append("^" if row is focused else "x" if mark == "dead" else "!" if mark else " ")
        top = max((n for n in norms if n is not None), default=0.0)
        if left_out:
            # the counts first: "every tensor shown" and the words of what is left out take a line's width
            title = Text(f"L2 norm by layer: {len(rows)} tensors ({left_out}), top {number(top, 4)}", style="bold")
        else:
            counts = f" ({len(rows)} tensors), top {number(top)}"
            title = Text(
                f"L2 norm by layer: {shorten(printable(name), width - 18 - len(counts))}{counts}", style="bold"
            )
        legend = Text("^ focused  ! marked  x dead (all zero) · p: next plot", style="italic")
        return Text("\n").join([title, lines_text(column_chart(norms, PLOT_HEIGHT, width, marks=marks)), legend])

    def histogram_plot(self, width: int) -> Text:
        """(b) The focused tensor's histogram, linear or log counts."""
        row = self.focused_row()
        stats = row.stats if row is not None else None
        if row is None or stats is None or not stats.histogram:
            reason = row.reason if row is not None and row.reason else "no finite values"
            return Text(f"histogram: {printable(reason)} · p: next plot", style="italic")
        scale = "log" if self.log_counts else "linear"
        title = Text(f"histogram of {short_path(row.path, width - 22)}, {scale} counts", style="bold")
        chart = lines_text(histogram(stats.histogram, PLOT_HEIGHT, width, self.log_counts))
        low, high = number(stats.min), number(stats.max)
        span = len(stats.histogram) * max(1, width // len(stats.histogram))
        axis = Text(low + " " * max(1, span - len(low) - len(high)) + high)
        other = "linear" if self.log_counts else "log"
        legend = Text(f"o: {other} counts · p: next plot", style="italic")
        return Text("\n").join([title, chart, axis, legend])

    def bytes_plot(self, width: int) -> Text:
        """(c) Tensor bytes by part, and what dropping the optimizer state leaves."""
        parts = self.parts
        if parts is None:
            return Text("")
        lines = [Text("tensor bytes by part", style="bold")]
        top = max((p.nbytes for p in parts.parts), default=0)
        bar_width = max(10, width - 34)
        for part in parts.parts:
            line = Text(f"{part.name:<10} ")
            line.append(bar(part.nbytes, top, bar_width))
            line.append(f" {size(part.nbytes):>9}  {part.tensors} tensors")
            lines.append(line)
        optimizer = parts.get("optimizer")
        if optimizer.nbytes:
            preview = f"drop optimizer: {size(parts.total)} → {size(parts.without('optimizer'))}"
            lines.append(Text(f"{preview}   z: stage it (u undoes it in the tree)", style="bold"))
        else:
            lines.append(Text("no optimizer state in this file", style="italic"))
        return Text("\n").join(lines)

    # ---- actions ------------------------------------------------------------------------------

    def action_sort_next(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        self.reverse = False
        self.refill()

    def action_sort_reverse(self) -> None:
        self.reverse = not self.reverse
        self.refill()

    def action_filter(self) -> None:
        field = self.query_one("#layers-filter", Input)
        field.display = True
        field.value = self.filter
        field.focus()

    @on(Input.Changed, "#layers-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.filter = event.value.strip()
        if self.ready:
            self.refill()

    @on(Input.Submitted, "#layers-filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        self._close_filter()

    def _close_filter(self) -> None:
        self.query_one("#layers-filter").display = False
        self.query_one(LayersTable).focus()

    def action_next_plot(self) -> None:
        self.plot = PLOTS[(PLOTS.index(self.plot) + 1) % len(PLOTS)]
        self.show_plot()

    def action_histogram_log(self) -> None:
        self.log_counts = not self.log_counts
        if self.plot != "histogram":
            self.plot = "histogram"
        self.show_plot()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (action == "drop_optimizer" and self.readonly)  # hidden while read-only; z still says why

    def on_key(self, event: Any) -> None:
        if self.readonly and event.key == "z" and not isinstance(self.focused, Input):
            event.stop()
            self.action_drop_optimizer()

    def action_drop_optimizer(self) -> None:
        if self.readonly:
            self.notify("Editing is off: the file was opened with --readonly", title="Read-only", markup=False)
            return
        if self.parts is None:
            return
        optimizer = self.parts.get("optimizer")
        if not optimizer.paths or not optimizer.nbytes:
            self.notify("no optimizer state in this file", markup=False)
        else:
            self.dismiss(("drop", (list(optimizer.paths), parts_figure(self.parts))))

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(key_rows(self.active_bindings), self.readonly))

    def action_close(self) -> None:
        if self.query_one("#layers-filter").display:
            self._close_filter()
            return
        self.workers.cancel_group(self, "layers")
        self.dismiss(None)


def parts_figure(parts: Parts) -> str:
    """``tensors 4.1 GB → 1.4 GB``: the slimming the optimizer drop gives."""
    return f"tensors {size(parts.total)} → {size(parts.without('optimizer'))}"
