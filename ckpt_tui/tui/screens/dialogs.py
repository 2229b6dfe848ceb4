"""Modal dialogs: confirm, prompt, edit preview, save as, progress, help, and the error screen."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Input, Label, OptionList, ProgressBar, Static
from textual.widgets.option_list import Option

from ckpt_tui.core.edits import Change


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question answering to ``y``, ``n`` and Escape (No is the default)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, question: str, detail: str = "", loud: bool = False) -> None:
        super().__init__()
        self.question = question
        self.detail = detail
        self.loud = loud

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog" + (" loud" if self.loud else "")):
            yield Label(self.question, classes="dialog-title", markup=False)
            if self.detail:
                yield Static(self.detail, classes="dialog-body", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Yes (y)", id="yes", variant="error" if self.loud else "primary")
                yield Button("No (n)", id="no", variant="default")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)


class PreviewScreen(ConfirmScreen):
    """An edit's preview: how many keys change and a few ``old → new`` examples."""

    def __init__(self, change: Change) -> None:
        lines = change.lines()
        super().__init__(f"Apply: {lines[0]}?", "\n".join(lines[1:]))
        self.change = change


class PromptScreen(ModalScreen[str | None]):
    """Ask for one line of text; Escape cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, value: str = "", hint: str = "") -> None:
        super().__init__()
        self.title_text = title
        self.value = value
        self.hint = hint

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title", markup=False)
            yield Input(self.value, id="prompt-input")
            if self.hint:
                yield Static(self.hint, classes="dialog-hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


def format_line(path: str) -> str:
    """Which format a path will be written in, in words."""
    if path.endswith(".safetensors"):
        return "format: .safetensors (one flat dict of tensors; tied weights recorded as aliases)"
    return "format: .pth (torch zip, loads with torch.load(weights_only=True)); end the name in .safetensors for that"


class SaveScreen(ModalScreen[tuple[str, str] | None]):
    """Save as: a path prefilled next to the input; the format follows its suffix."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("Save as", classes="dialog-title")
            yield Input(self.path, id="save-path")
            yield Static(format_line(self.path), id="save-format", markup=False)
            yield Static(
                "enter saves · escape cancels · an existing file is replaced only after a confirmation",
                classes="dialog-hint",
            )

    def on_input_changed(self, event: Input.Changed) -> None:
        self.query_one("#save-format", Static).update(format_line(event.value.strip()))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        value = event.value.strip()
        if value:
            self.dismiss((value, "safetensors" if value.endswith(".safetensors") else "pth"))

    def action_cancel(self) -> None:
        self.dismiss(None)


class ProgressScreen(ModalScreen[None]):
    """Long work with a progress bar; Escape asks the work to stop."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str) -> None:
        super().__init__()
        self.title_text = title
        self.cancelled = False

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title", markup=False)
            yield ProgressBar(total=1.0, id="progress-bar")
            yield Static("escape cancels; nothing is left behind", classes="dialog-hint")

    def advance(self, fraction: float) -> None:
        """Move the bar."""
        self.query_one("#progress-bar", ProgressBar).update(progress=fraction)

    def action_cancel(self) -> None:
        self.cancelled = True


class HelpScreen(ModalScreen[None]):
    """Every key, generated from the bindings."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark,f1", "close", "Close")]

    def __init__(self, rows: list[tuple[str, str, str]]) -> None:
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        text = Text()
        current = ""
        for group, keys, description in self.rows:
            if group != current:
                text.append(f"\n{group}\n", style="bold underline")
                current = group
            text.append(f"  {keys:<16}", style="bold cyan")
            text.append(f"{description}\n")
        with Vertical(classes="dialog help"):
            yield Label("ckpt-tui keys (escape closes; ctrl+p searches every action)", classes="dialog-title")
            yield Static(text, id="help-text")

    def action_close(self) -> None:
        self.dismiss(None)


class ErrorScreen(Screen[None]):
    """The file could not be read: say why, and let the user quit."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("q,escape,enter", "app.quit", "Quit")]

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog loud"):
            yield Label("Cannot open this checkpoint", classes="dialog-title")
            yield Static(self.message, id="error-message", classes="dialog-body", markup=False)
            yield Static("q quits", classes="dialog-hint")


class ReportScreen(ModalScreen[tuple[str, str] | None]):
    """A compare or diff report: sections of keys; enter jumps to a key, ``f`` applies the fix."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "close", "Close"),
        Binding("f", "fix", "Apply the suggested fix"),
    ]

    def __init__(
        self, title: str, summary: str, sections: list[tuple[str, list[tuple[str, str]]]], fixable: bool
    ) -> None:
        super().__init__()
        self.title_text = title
        self.summary = summary
        self.sections = sections
        self.fixable = fixable

    def compose(self) -> ComposeResult:
        options: list[Option | None] = []
        for heading, rows in self.sections:
            if not rows:
                continue
            options.append(Option(Text(f"{heading} ({len(rows)})", style="bold underline"), disabled=True))
            options += [Option(text, id=f"{index}:{key}") for index, (key, text) in enumerate(rows)]
            options.append(None)
        with Vertical(classes="dialog report"):
            yield Label(self.title_text, classes="dialog-title", markup=False)
            yield Static(self.summary, classes="dialog-body", markup=False)
            yield OptionList(*options, id="report-list")
            hint = "enter: go to the key · escape: close" + (" · f: apply the suggested fix" if self.fixable else "")
            yield Static(hint, classes="dialog-hint")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        option_id = event.option.id or ""
        self.dismiss(("jump", option_id.partition(":")[2]))

    def action_fix(self) -> None:
        if self.fixable:
            self.dismiss(("fix", ""))

    def action_close(self) -> None:
        self.dismiss(None)
