"""The detail panel: the focused node's full path, metadata, storage sharing and stats."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Group as RichGroup
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import ProgressBar, Static

from ckpt_tui.core.describe import count, scalar_text, shape, size, totals
from ckpt_tui.core.findings import tensor_problem
from ckpt_tui.core.grouping import Group
from ckpt_tui.core.keypath import KeyPath, to_python
from ckpt_tui.core.tree import Opaque, Tensor, children, type_label

if TYPE_CHECKING:  # numpy is imported only when stats are first computed
    from ckpt_tui.core.stats import TensorStats

BARS = " ▁▂▃▄▅▆▇█"


def histogram_text(counts: list[int]) -> str:
    """A one-line histogram of block characters."""
    top = max(counts) if counts else 0
    if not top:
        return ""
    return "".join(BARS[min(8, round(8 * c / top)) if c else 0] for c in counts)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def stats_table(stats: TensorStats) -> Table:
    """Min/max/mean/std and the counts, as a two-column table."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="dim")
    table.add_column()
    table.add_row("min", _number(stats.min))
    table.add_row("max", _number(stats.max))
    table.add_row("mean", _number(stats.mean))
    table.add_row("std", _number(stats.std))
    nan_style = "bold red" if stats.nan else ""
    inf_style = "bold red" if stats.inf else ""
    table.add_row("NaN", Text(f"{stats.nan}" + ("  (!)" if stats.nan else ""), style=nan_style))
    table.add_row("Inf", Text(f"{stats.inf}" + ("  (!)" if stats.inf else ""), style=inf_style))
    table.add_row("zeros", f"{stats.zeros} of {stats.count}")
    if stats.histogram:
        sample = f" (sample of {stats.sampled})" if stats.sampled < stats.finite else ""
        table.add_row("histogram", Text(histogram_text(stats.histogram), style="cyan"))
        table.add_row("", Text(f"{_number(stats.min)} … {_number(stats.max)}{sample}", style="dim"))
    if stats.first:
        table.add_row("first", ", ".join(f"{v:.4g}" for v in stats.first[:8]))
    return table


class DetailPanel(VerticalScroll):
    """Shows one node; tensor stats arrive from a worker."""

    def compose(self) -> ComposeResult:
        yield Static(id="detail-meta")
        yield ProgressBar(total=1.0, show_eta=False, id="detail-progress")
        yield Static(id="detail-stats")

    def on_mount(self) -> None:
        self.query_one("#detail-progress").display = False

    def show(self, path: KeyPath, value: Any, shared: int = 0) -> None:
        """Describe a node; clear old stats."""
        self.query_one("#detail-meta", Static).update(self._meta(path, value, shared))
        self.query_one("#detail-stats", Static).update("")
        self.query_one("#detail-progress").display = False

    def _meta(self, path: KeyPath, value: Any, shared: int) -> RichGroup:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="dim")
        table.add_column()
        table.add_row("type", type_label(value))
        if isinstance(value, Tensor):
            table.add_row("shape", shape(value.shape))
            table.add_row("dtype", value.dtype)
            table.add_row("device", Text(value.device, style="bold yellow" if "cuda" in value.device else ""))
            table.add_row("elements", f"{value.numel:,}")
            table.add_row("bytes", size(value.nbytes))
            table.add_row("stride", str(value.stride))
            table.add_row("offset", str(value.offset))
            if value.storage is not None:
                storage = f"record {value.storage.key}, {size(value.storage.nbytes)}"
                table.add_row("storage", storage + (f", shared with {shared} other tensors" if shared else ""))
            problem = tensor_problem(value)
            if problem:
                table.add_row("problem", Text(problem, style="bold red"))
        elif isinstance(value, Opaque):
            table.add_row("global", value.global_name)
            table.add_row("executed", Text("no: recorded only", style="bold" if not value.safe else ""))
            table.add_row("arguments", scalar_text(value.args, 200))
        else:
            kids = sum(1 for _ in children(value))
            found = totals(value)
            table.add_row("children", str(kids))
            if found.tensors:
                table.add_row("tensors", f"{found.tensors:,}")
                table.add_row("parameters", f"{count(found.parameters)} ({found.parameters:,})")
                table.add_row("bytes", size(found.nbytes))
            if not kids:
                table.add_row("value", scalar_text(value, 400))
            metadata = getattr(value, "_metadata", None)
            if metadata is not None:
                table.add_row("_metadata", f"{len(metadata)} entries (kept on save)")
        return RichGroup(Text(to_python(path), style="bold"), Text(""), table)

    def show_group(self, path: KeyPath, group: Group) -> None:
        """Describe a module group of a flat state_dict."""
        table = Table.grid(padding=(0, 2))
        table.add_column(style="dim")
        table.add_column()
        table.add_row("type", "module group")
        table.add_row("keys under", group.prefix + "*")
        table.add_row("entries", str(len(group.entries)))
        table.add_row("tensors", f"{group.tensors:,}")
        table.add_row("parameters", f"{count(group.parameters)} ({group.parameters:,})")
        table.add_row("bytes", size(group.nbytes))
        title = Text(f"{to_python(path)} › {group.prefix.rstrip('.').replace('.', ' › ')}", style="bold")
        self.query_one("#detail-meta", Static).update(RichGroup(title, Text(""), table))
        self.query_one("#detail-stats", Static).update("")
        self.query_one("#detail-progress").display = False

    def progress(self, fraction: float) -> None:
        """Stats progress for a big tensor."""
        bar = self.query_one("#detail-progress", ProgressBar)
        bar.display = True
        bar.update(progress=fraction)
        self.query_one("#detail-stats", Static).update(Text("computing stats… (move the cursor to cancel)", "dim"))

    def show_stats(self, stats: TensorStats) -> None:
        """The finished stats."""
        self.query_one("#detail-progress").display = False
        self.query_one("#detail-stats", Static).update(
            RichGroup(Text("stats", style="bold underline"), stats_table(stats))
        )

    def show_message(self, message: str) -> None:
        """A one-line note in place of stats (e.g. why they cannot be computed)."""
        self.query_one("#detail-progress").display = False
        self.query_one("#detail-stats", Static).update(Text(message, style="italic"))
