"""Help: every active key of the browser, generated from its bindings, scrollable by keyboard."""

from __future__ import annotations

from itertools import groupby
from typing import ClassVar

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ckpt_tui.tui.bindings import SCROLL_BINDINGS, KeyRow

KEY_WIDTH = 14
"""The keys' column (a wider key widens it, for its group only)."""

TAB_ROW = "Next panel (from the tree: the side panel, where ↓ PgDn scroll the stats); shift+tab goes back"
"""What tab does, said once in place of the framework's "Focus Next" and "Focus Previous"."""

_FRAMEWORK_NOISE = {"screen.copy_text", "app.focus_previous"}
"""Framework keys help leaves out: copying selected text (y copies a path), shift+tab (said on tab's line)."""


def help_text(rows: list[KeyRow], readonly: bool = False) -> Group:
    """The keys under their group headings: keys, then what it does, wrapped under itself on a narrow
    screen (never cut); edit keys are marked when the browser is read-only."""
    parts: list[RenderableType] = []
    for group, grouped in groupby(rows, key=lambda row: row.group):
        if parts:
            parts.append(Text())
        parts.append(Text(group, style="bold underline"))
        grid = Table.grid()
        grid.add_column(min_width=KEY_WIDTH + 2, no_wrap=True, style="bold")
        grid.add_column(ratio=1, overflow="fold")
        for row in grouped:
            if row.action in _FRAMEWORK_NOISE:
                continue
            grid.add_row(f"  {row.key_text}  ", _description(row, readonly))
        parts.append(grid)
    return Group(*parts)


def _description(row: KeyRow, readonly: bool) -> Text:
    if row.action == "app.focus_next":
        return Text(TAB_ROW)
    text = Text(row.description)
    if readonly and row.group == "edit":
        text.append("  (off: read-only)", style="italic")
    elif not row.enabled:
        text.append("  (not now)", style="italic")
    if row.tooltip and row.tooltip != row.description:
        text.append(f" · {row.tooltip}", style="italic")
    return text


class HelpBody(VerticalScroll, can_focus=True):
    """The scrolling part of help: arrows, j/k, PgUp/PgDn, Home/End, g/G."""

    BINDINGS: ClassVar[list[BindingType]] = SCROLL_BINDINGS


class HelpScreen(ModalScreen[None]):
    """Every key, generated from the active bindings of the screen it was opened from."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark,f1", "close", "Close")]

    def __init__(self, rows: list[KeyRow], readonly: bool = False) -> None:
        super().__init__()
        self.rows = rows
        self.readonly = readonly

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog help"):
            yield Static(
                "Keys · ↑↓ j k PgUp PgDn scroll · escape closes · ctrl+p: any action",
                classes="dialog-title",
                markup=False,
            )
            with HelpBody(id="help-body"):
                yield Static(help_text(self.rows, self.readonly), id="help-text")

    def on_mount(self) -> None:
        self.query_one(HelpBody).focus()

    def action_close(self) -> None:
        self.dismiss(None)
