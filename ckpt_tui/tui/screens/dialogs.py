"""Modal dialogs: confirm, prompt, edit preview, save as, progress, and the error screen (reports: ``report.py``).

Titles and bodies are ``Text`` (or ``markup=False`` strings) and wrap: a long key never cuts a title.
"""

from __future__ import annotations

import os
import threading
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.suggester import Suggester
from textual.widgets import Button, Input, ProgressBar, Static

from ckpt_tui.core.edits.tree_edits import Change
from ckpt_tui.core.operations.staged import blocker_words, code_blockers, sanitizable, sanitize_command
from ckpt_tui.core.runtime.safe_text import from_printable, printable, printable_name
from ckpt_tui.core.weights_only.verdict import CANNOT_TELL
from ckpt_tui.core.writers.judge import Outlook
from ckpt_tui.tui.suggesters import PathSuggester, path_candidates
from ckpt_tui.tui.text import command_in, continued, data


def _title(text: str | Text) -> Static:
    return Static(text if isinstance(text, Text) else data(text), classes="dialog-title", markup=False)


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question answering to ``y``, ``n`` and Escape (No is the default)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, question: str, detail: str | Text = "", loud: bool = False, purpose: str = "") -> None:
        super().__init__()
        self.question = question
        self.detail = detail
        self.loud = loud
        self.purpose = purpose

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog" + (" loud" if self.loud else "")):
            yield _title(self.question)
            if self.detail:
                body = self.detail if isinstance(self.detail, Text) else data(self.detail)
                yield Static(body, classes="dialog-body", markup=False)
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
        head = lines[0]
        # the question first, then the facts: "Apply: …: 16 changed?" read as doubt about the count
        # each line escaped on its own: the line breaks between them are ours, not the file's
        super().__init__(f"Apply? {head}", Text("\n").join(data(line) for line in lines[1:]))
        self.change = change


class PromptScreen(ModalScreen[str | None]):
    """Ask for one line of text; Escape cancels; → or Tab accepts a completion.

    The value is shown escaped (it may come from the file) and what is typed back is decoded the same
    way (:func:`from_printable`), so an unedited value answers exactly the value given. ``exact``
    keeps leading and trailing spaces (a key may hold them).
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel"),
        Binding("tab", "complete", "Complete", show=False),
    ]

    def __init__(
        self, title: str, value: str = "", hint: str = "", suggester: Suggester | None = None, exact: bool = False
    ) -> None:
        super().__init__()
        self.title_text = title
        self.value = value
        self.hint = hint
        self.suggester = suggester
        self.exact = exact
        self._offered: tuple[str, list[str]] | None = None
        """What the last tab found: the folder typed, and the names in it that fit."""
        self._turn = -1
        self._common = ""

    def answer(self, typed: str) -> str | None:
        """What was typed, as the file would hold it (the given value itself when unedited); None if empty."""
        if typed == printable_name(self.value):
            return self.value or None
        shown = printable_name(self.value)
        if self.value.endswith(os.sep) and typed.startswith(shown) and typed[len(shown) :].startswith((os.sep, "~")):
            typed = typed[len(shown) :]  # a whole path typed after the folder given: the path typed
        text = typed if self.exact else typed.strip()
        return from_printable(text) or None

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield _title(self.title_text)
            # a folder is where a file name is typed next, not a value to replace
            folder = self.value.endswith(os.sep)
            shown = printable_name(self.value)
            yield Input(shown, id="prompt-input", suggester=self.suggester, select_on_focus=not folder)
            if self.hint:
                # the field starts filled (the last answer, ./): how to empty it is said, not left to be found
                hint = self.hint + (" · ctrl+u clears · → or tab completes a file name" if self.suggester else "")
                yield Static(data(hint), classes="dialog-hint", markup=False)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(self.answer(event.value))

    def action_complete(self) -> None:
        """Tab, as a shell's: the common start of the names that fit what was typed, the names listed under the
        field; tab again takes each of them in turn."""
        field = self.query_one(Input)
        if not isinstance(self.suggester, PathSuggester):
            field.cursor_position = len(field.value)
            field.action_cursor_right()
            return
        offered = self._offered
        if offered is not None and field.value == offered[0] + offered[1][self._turn % len(offered[1])]:
            self._turn += 1
        elif offered is not None and field.value == self._common:
            self._turn = 0
        else:
            value = field.value
            names = path_candidates(value, self.suggester.base)
            if not names:
                return
            stem = value[: len(value) - len(value.rpartition(os.sep)[2])]
            self._offered, self._turn = (stem, names), -1
            self._common = stem + common_start(names)
            field.value = self._common
            field.cursor_position = len(field.value)
            self._list_names(names)
            if len(names) > 1:
                return
            self._offered = None
            return
        stem, names = offered
        field.value = stem + names[self._turn % len(names)]
        field.cursor_position = len(field.value)

    def _list_names(self, names: list[str]) -> None:
        """The names tab can complete to, under the field (one: nothing listed)."""
        listed = "" if len(names) < 2 else f"{len(names)} names (tab again takes each): " + "  ".join(names)
        found = self.query("#prompt-names")
        if found:
            found.first(Static).update(data(listed))
        elif listed:
            self.query_one(Vertical).mount(
                Static(data(listed), id="prompt-names", classes="dialog-hint", markup=False),
                after=self.query_one(Input),
            )

    def action_cancel(self) -> None:
        self.dismiss(None)


def common_start(names: list[str]) -> str:
    """The characters every one of ``names`` starts with (a shell's completion: ``cnn_step`` of
    ``cnn_step10.pth`` and ``cnn_step20.pth``)."""
    first, last = min(names), max(names)
    at = 0
    while at < min(len(first), len(last)) and first[at] == last[at]:
        at += 1
    return first[:at]


def format_line(path: str, outlook: Outlook | None = None) -> str:
    """Which format a path will be written in, and, for ``.pth``, what ``torch.load(weights_only=True)`` will
    make of it (``outlook``: the writer's own verdict of the tree; None while it is judged)."""
    if path.endswith(".safetensors"):
        return "format: .safetensors (one flat dict of tensors; tied weights recorded as aliases)"
    return f"format: .pth (torch zip; a name ending .safetensors writes safetensors): {outlook_words(path, outlook)}"


def outlook_words(path: str, outlook: Outlook | None) -> str:
    """What torch.load(weights_only=True) will make of the file written at ``path``, and the way out."""
    if outlook is None:
        return "judging whether torch.load(weights_only=True) will load it…"
    verdict = outlook.verdict
    if verdict is None:
        return f"ckpt-tui will not write it: {printable(outlook.refusal or '')}"
    if outlook.refusal is not None and code_blockers(verdict):
        return f"ckpt-tui will not write it, torch.load would REFUSE it: {blocker_words(verdict)} (d on it deletes it)"
    if verdict.loads:
        where = f" on a machine with {', '.join(verdict.devices[:3])}" if verdict.devices else ""
        return f"loads with torch.load(weights_only=True){where}"
    if verdict.answer == CANNOT_TELL:
        return f"CANNOT TELL whether torch.load(weights_only=True) will load it: {printable(verdict.unknown or '')}"
    way_out = f"; `{sanitize_command(path)}` makes it load" if sanitizable(verdict) else ""
    return f"torch.load(weights_only=True) will REFUSE it: {blocker_words(verdict)}{way_out}"


class SaveScreen(PromptScreen):
    """Save as: a path prefilled (next to the input, or the last one saved); the format follows its suffix."""

    def __init__(self, path: str, outlook: Outlook | None = None) -> None:
        # a path in another folder than the working one is shown as its folder above and its name in the field:
        # a long path would scroll its start out of the field, unmarked ("kpt-tui-demo…" for "/tmp/ckpt-tui-demo…")
        folder, name = os.path.split(path)
        self.folder = folder if os.path.isabs(path) and folder != os.getcwd() else ""
        super().__init__("Save as", name if self.folder else path, "", PathSuggester(self.folder))
        self.outlook = outlook
        """What torch.load(weights_only=True) makes of the tree once written as ``.pth`` (None: being judged)."""

    def answer(self, typed: str) -> str | None:
        """The path typed, a relative one in the folder shown."""
        text = super().answer(typed)
        return None if text is None else self.placed(text)

    def placed(self, path: str) -> str:
        """``path`` in the folder shown, unless absolute."""
        if not self.folder or os.path.isabs(os.path.expanduser(path)):
            return path
        return os.path.join(self.folder, path)

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield _title("Save as")
            if self.folder:
                yield Static(data(f"in {printable_name(self.folder)}{os.sep}"), id="save-folder", markup=False)
            yield Input(printable_name(self.value), id="save-path", suggester=self.suggester)
            yield Static(format_line(self.placed(self.value), self.outlook), id="save-format", markup=False)
            yield Static(
                "enter saves · escape cancels · ctrl+u clears · → or tab completes a file name · "
                "an existing file is replaced only after a confirmation",
                classes="dialog-hint",
                markup=False,
            )

    def on_input_changed(self, event: Input.Changed) -> None:
        self.query_one("#save-format", Static).update(format_line(self.placed(event.value.strip()), self.outlook))

    def show_outlook(self, outlook: Outlook) -> None:
        """The verdict of what will be written, once judged."""
        self.outlook = outlook
        typed = self.query_one("#save-path", Input).value.strip()
        self.query_one("#save-format", Static).update(format_line(self.placed(typed), outlook))


class ProgressScreen(ModalScreen[None]):
    """Long work with a progress bar; Escape asks the work to stop (through ``cancel``)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, cancel: threading.Event) -> None:
        super().__init__()
        self.title_text = title
        self.cancel = cancel

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield _title(self.title_text)
            yield ProgressBar(total=1.0, id="progress-bar")
            yield Static("escape cancels; nothing is left behind", classes="dialog-hint", markup=False)

    def advance(self, fraction: float) -> None:
        """Move the bar."""
        self.query_one("#progress-bar", ProgressBar).update(progress=fraction)

    def action_cancel(self) -> None:
        self.cancel.set()
        self.query_one(".dialog-hint", Static).update("cancelling…")


class ErrorScreen(Screen[None]):
    """The file could not be read: say why, and let the user quit. A command the message gives (download the
    file first) stands on its own line, wrapped only at its spaces, and ``y`` copies it whole."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q,escape,enter", "app.quit", "Quit"),
        Binding("y", "copy", "Copy the command", id="error.copy", tooltip="Copy the command (or the message)"),
    ]

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message
        self.body, self.command = command_in(message)

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog loud error"):
            yield _title("Cannot open this checkpoint")
            yield Static(data(self.body), id="error-message", classes="dialog-body", markup=False)
            if self.command is not None:
                shown = continued(printable(self.command))
                yield Static(Text(shown), id="error-command", classes="dialog-command", markup=False)
            copies = "the command" if self.command is not None else "the message"
            yield Static(f"y copies {copies} · q quits", classes="dialog-hint", markup=False)

    def action_copy(self) -> None:
        text = self.command or self.message
        self.app.copy_to_clipboard(text)
        # (the toast names it, not shows it: too narrow for a URL, it would break one mid-word)
        what = "the command" if self.command is not None else "the message"
        self.notify(f"{what}, {len(text)} characters, on one line", title="Copied", markup=False)
