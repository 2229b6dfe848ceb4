"""Help: every active key of the browser, generated from its bindings, scrollable by keyboard."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ckpt_tui.tui.bindings import SCROLL_BINDINGS, KeyRow

KEY_WIDTH = 14
"""The keys' column (wider keys take two spaces more than they need, on their line only)."""


def help_text(rows: list[KeyRow], readonly: bool = False) -> Text:
    """One line a key under the group headings: keys, what it does, then more words (cut at the edge
    of a narrow screen); edit keys are marked when the browser is read-only."""
    text = Text()
    current = ""
    for row in rows:
        if row.group != current:
            text.append(("\n" if current else "") + f"{row.group}\n", style="bold underline")
            current = row.group
        text.append(f"  {row.key_text:<{max(KEY_WIDTH, len(row.key_text) + 2)}}", style="bold")
        text.append(row.description)
        if readonly and row.group == "edit":
            text.append("  (off: read-only)", style="italic")
        elif not row.enabled:
            text.append("  (not now)", style="italic")
        if row.tooltip and row.tooltip != row.description:
            text.append(f" · {row.tooltip}", style="italic")
        text.append("\n")
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
