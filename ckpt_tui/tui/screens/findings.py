"""All findings about the file, one per line; enter goes to the key a finding is about."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from ckpt_tui.core.conventions.findings import Finding
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.keypath import KeyPath
from ckpt_tui.tui.screens.report import ReportList, row_width, wrapped
from ckpt_tui.tui.widgets.summary import finding_text


class FindingsScreen(ModalScreen[KeyPath | None]):
    """Every finding, warnings first; the header shows only the first few."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,f", "close", "Close"),
    ]

    def __init__(self, findings: list[Finding], readonly: bool = False) -> None:
        super().__init__()
        self.findings = findings
        self.readonly = readonly

    def compose(self) -> ComposeResult:
        warnings = sum(1 for f in self.findings if f.severity == "warning")
        title = f"{counted(len(self.findings), 'finding')} ({counted(warnings, 'warning')}, marked !)"
        width = row_width(self.app.size.width)
        texts = [wrapped(finding_text(finding, self.readonly), width) for finding in self.findings]
        options = [Option(text, id=f"finding-{i}") for i, text in enumerate(texts)]
        with Vertical(classes="dialog report"):
            yield Static(title, classes="dialog-title", markup=False)
            yield ReportList(*options, id="findings-list")
            yield Static("enter: go to the key it is about · escape: close", classes="dialog-hint", markup=False)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        finding = self.findings[int((event.option.id or "finding-0").removeprefix("finding-"))]
        if finding.path is not None:
            self.dismiss(finding.path)
        else:
            self.notify("this finding is about the whole file", markup=False)

    def action_close(self) -> None:
        self.dismiss(None)
