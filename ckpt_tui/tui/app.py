"""``ckpt-tui FILE``: browse, check, fix and save a checkpoint over SSH.

The App owns reading the file, the editing session, saving and quitting; the BrowserScreen owns
looking at the tree and staging edits. Workers here get their inputs as arguments and post typed
messages back (``tui/messages.py``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from textual import on, work
from textual.app import App, SystemCommand
from textual.binding import BindingType
from textual.notifications import Notify
from textual.screen import Screen

from ckpt_tui.core.edits.session import Session
from ckpt_tui.core.errors import CkptError
from ckpt_tui.core.model import byte_source
from ckpt_tui.core.model.describe import counted, size
from ckpt_tui.core.model.tree import iter_tensors
from ckpt_tui.core.operations.convert import fixed_output_path
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.runtime import process
from ckpt_tui.core.runtime.safe_text import printable, printable_path, with_file_names
from ckpt_tui.core.writers.judge import Outlook
from ckpt_tui.tui.bindings import APP_BINDINGS, key_rows
from ckpt_tui.tui.host import BrowserHost
from ckpt_tui.tui.messages import CheckpointOpened, Failed, FileChangedOnDisk, Progress, ProgressPoster, SaveFinished
from ckpt_tui.tui.screens.browser import BrowserScreen
from ckpt_tui.tui.screens.dialogs import ConfirmScreen, ErrorScreen, ProgressScreen, SaveScreen, outlook_words
from ckpt_tui.tui.screens.layers import LayersScreen
from ckpt_tui.tui.widgets.tree_view import ViewState

if TYPE_CHECKING:
    from ckpt_tui.core.writers.save import WriteResult


class CkptApp(App[None]):
    """The checkpoint browser."""

    CSS_PATH = "app.tcss"
    TITLE = "ckpt-tui"
    BINDINGS: ClassVar[list[BindingType]] = APP_BINDINGS

    def __init__(
        self,
        path: str | list[str],
        readonly: bool = False,
        display_name: str | None = None,
        welcome: str = "",
        prepare: tuple[str, Callable[[], object]] | None = None,
    ) -> None:
        super().__init__()
        self.welcome = welcome
        """The status line's first note (the demo says where its files are)."""
        self.prepare = prepare
        """What makes the file before it is read (the demo writes its files), run in the open worker, and what
        the screen says meanwhile: the app paints first."""
        self.opened = path  # one path, or several rank files opened as one checkpoint
        self.path = path if isinstance(path, str) else path[0]
        self.readonly = readonly
        # the file as a user types its name (bytes that are not UTF-8 as \xff): it is shown, never opened
        self.display_name = display_name or printable_path(os.path.basename(self.path.rstrip("/")) or self.path)
        self.session: Session | None = None
        self.last_saved: str | None = None
        self.saving = False
        self._progress: ProgressScreen | None = None
        self._reopen_view: ViewState | None = None
        self._remembered: dict[str, str] = {}
        self.histogram_log = False
        """Histograms (detail panel, layers view) count on a log scale."""

    @property
    def browser(self) -> BrowserScreen:
        """The browser screen (the bottom of the screen stack)."""
        screen = self.screen_stack[0]
        assert isinstance(screen, BrowserScreen)
        return screen

    def get_default_screen(self) -> Screen[Any]:
        return BrowserScreen(self.display_name, self.prepare[0] if self.prepare else "")

    def on_mount(self) -> None:
        self._open(self.path, False)

    def push_screen(self, screen: Any, *args: Any, **kwargs: Any) -> Any:
        """Push ``screen``; a toast still shown is cleared first, so it never sits over the dialog or help that
        opens (what it said stays in the status line)."""
        self.clear_notifications()
        return super().push_screen(screen, *args, **kwargs)

    def _on_notify(self, event: Notify) -> None:
        """A new notification replaces the one shown: they stacked three deep over dialogs."""
        self.clear_notifications()
        super()._on_notify(event)

    # ---- reading the file -------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="open", description="open")
    def _open(self, path: str, reopened: bool) -> None:
        """Read the file (metadata only) off the UI thread, made first where the app was given how; reports by
        message only."""
        if self.prepare is not None and not reopened:
            try:
                self.prepare[1]()
            except OSError as exc:
                self.post_message(Failed("open", f"{self.prepare[0].rstrip('…')} failed: {exc.strerror or exc}"))
                return
        try:
            checkpoint = open_checkpoint(path if reopened else self.opened)
        except CkptError as exc:
            self.post_message(Failed("reopen" if reopened else "open", str(exc)))
            return
        process.freeze_gc()  # the tree lives as long as the session: keep it out of every collection
        self.post_message(CheckpointOpened(checkpoint, reopened))

    @on(CheckpointOpened)
    def _opened(self, message: CheckpointOpened) -> None:
        self.session = Session(message.checkpoint)
        note = "" if message.reopened else self.welcome
        if message.reopened:
            note = f"reopened {self.display_name} after saving over it (undo starts here)"
        self.browser.show_session(note, self._reopen_view)
        self._reopen_view = None
        self.refresh_bindings()

    @on(Failed)
    def _open_failed(self, message: Failed) -> None:
        if message.task not in ("open", "reopen"):
            return
        self.session = None
        error = message.error
        if message.task == "reopen":
            error = f"saved, but reading the saved file back failed: {error}"
        self.push_screen(ErrorScreen(self.named_files(error)))

    @on(FileChangedOnDisk)
    def _file_changed(self, message: FileChangedOnDisk) -> None:
        self.browser.mark_stale(message.error)

    # ---- what the browser needs from the app ---------------------------------------------------

    def remember(self, prompt: str, value: str) -> None:
        """Keep the last path given to a prompt."""
        self._remembered[prompt] = value

    def remembered(self, prompt: str) -> str:
        """The last path given to a prompt, or the folder of the input (a URL's folder for a remote file:
        ``https://host/``, not ``https:/host/``, which Path makes of it)."""
        return self._remembered.get(prompt, input_folder(self.path))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "save" and self.readonly:
            return False  # hidden; ctrl+s still says why (the browser's on_key)
        if action == "save" and self.session is None:
            return None
        return True

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        """The palette: every active key of the screen, titled ``group: Action``, then Textual's own."""
        rows = key_rows(screen.active_bindings) if isinstance(screen, (BrowserScreen, LayersScreen)) else []
        seen = set()
        for row in rows:
            if row.action in seen or row.action == "command_palette":
                continue
            seen.add(row.action)
            help_text = f"{row.tooltip} (key: {row.key_text})"
            yield SystemCommand(f"{row.group}: {row.description}", help_text, self._runner(row.action, row.namespace))
        for command in super().get_system_commands(screen):
            if command.title != "Quit" or "quit" not in seen:
                yield command

    def _runner(self, action: str, namespace: Any) -> Any:
        return lambda: self.run_action(action, namespace)

    # ---- saving ---------------------------------------------------------------------------

    def default_save_path(self) -> str:
        """A free name beside the input, as every suggested command names it: ``best_model.fixed.pth``,
        else ``best_model.fixed-2.pth``…"""
        return fixed_output_path(self.path)

    def source_files(self) -> set[str]:
        """Every file this session reads tensor bytes from (the input, or its shards)."""
        files = {os.path.abspath(self.path)}
        if self.session is not None:
            files |= {os.path.abspath(path) for path in self.session.checkpoint.input_files()}
            for _, tensor in iter_tensors(self.session.checkpoint.root):
                source = getattr(tensor.storage, "source", None)
                path = getattr(source, "path", "")
                if isinstance(path, str) and path:
                    files.add(os.path.abspath(path))
        return files

    def replaces_source(self, target: str) -> bool:
        """Whether writing ``target`` would replace a file the session still reads from."""
        if not os.path.exists(target):
            return False
        for source in self.source_files():
            try:
                if os.path.isfile(source) and os.path.samefile(source, target):
                    return True
            except OSError:
                continue
        return False

    def action_save(self) -> None:
        if self.readonly:
            self.notify(
                "Saving is off: the file was opened with --readonly (browse only, nothing is saved)",
                title="Read-only",
                severity="warning",
                markup=False,
            )
            return
        if self.session is None or self.saving:
            return

        def chosen(target: str | None) -> None:
            if not target:
                return
            self.remember("save", target)
            if not os.path.lexists(target):
                self._start_save(target, force=False)
                return
            is_source = self.replaces_source(target)
            question = "Replace THE INPUT FILE?" if is_source else f"Replace {printable(target)}?"
            detail = (
                "This overwrites the checkpoint you opened; it is read back afterwards."
                if is_source
                else "The existing file will be replaced."
            )
            self.push_screen(
                ConfirmScreen(question, detail + " (default: No)", loud=True),
                lambda yes: self._start_save(target, force=True) if yes else None,
            )

        outlook = self.browser.judge_for_save()
        path = self._remembered.get("save", self.default_save_path())
        self.push_screen(SaveScreen(path, outlook), chosen)

    def _start_save(self, target: str, force: bool) -> None:
        """Open the progress dialog and write in a worker."""
        session = self.session
        if session is None:
            return
        cancel = threading.Event()
        self._progress = ProgressScreen(f"Saving {printable(target)}", cancel)
        self.push_screen(self._progress)
        self.saving = True
        self._save(
            session.version,
            session.root,
            target,
            "safetensors" if target.endswith(".safetensors") else "pth",
            force,
            session.checkpoint.byteorder,
            session.checkpoint.path,
            cancel,
            self.replaces_source(target),
        )

    @work(thread=True, exclusive=True, group="save", description="save")
    def _save(
        self,
        version: int,
        root: Any,
        target: str,
        fmt: str,
        force: bool,
        byteorder: str,
        source: str,
        cancel: threading.Event,
        replaces_source: bool,
    ) -> None:
        """Write, verify and rename into place; reports by message only."""
        from ckpt_tui.core.writers.save import save

        metadata = self.session.checkpoint.metadata if self.session is not None else {}
        refused = self.session.checkpoint.unwritable() if self.session is not None else None
        if refused:
            self.post_message(SaveFinished(version, target, None, refused, False))
            return

        progress = ProgressPoster(self.post_message, "save")
        try:
            result = save(
                root,
                target,
                fmt,
                byteorder=byteorder,
                force=force,
                inputs=(source, *self.source_files()),
                metadata=metadata,
                progress=progress,
                cancelled=cancel.is_set,
            )
        except CkptError as exc:
            self.post_message(SaveFinished(version, target, None, str(exc), False))
            return
        width = max(self.size.width - 2, 40)  # the status line's padding
        self.post_message(SaveFinished(version, target, saved_words(result), "", replaces_source, result.short(width)))

    @on(Progress)
    def _save_progress(self, message: Progress) -> None:
        if message.task == "save" and self._progress is not None and self._progress.is_attached:
            self._progress.advance(message.fraction)

    @on(SaveFinished)
    def _save_finished(self, message: SaveFinished) -> None:
        self.saving = False
        if self._progress is not None and self._progress.is_attached:
            self._progress.dismiss()
        self._progress = None
        if message.line is None:
            error = self.named_files(browser_words(message.error))
            self.notify(printable(error), title="Not saved", severity="error", timeout=10, markup=False)
            self.browser.update_status(f"not saved: {error}")
            return
        # the status line leads with the weights_only verdict in one line; the notification has it all
        self.notify(printable(self.named_files(browser_words(message.line))), title="Saved", timeout=15, markup=False)
        if self.session is not None and self.session.version == message.version:
            self.session.mark_saved()
            self.last_saved = message.target
        self.browser.update_status(self.named_files(message.short), lead=True)
        if message.replaced_source:
            self._reopen()

    def named_files(self, error: str) -> str:
        """A line (an error, a save's outcome) with the files opened and saved named as given: bytes that are not
        UTF-8 as ``\\xff``."""
        opened = [self.opened] if isinstance(self.opened, str) else list(self.opened)
        return with_file_names(error, [*opened, *([self.last_saved] if self.last_saved else [])])

    def _reopen(self) -> None:
        """The file under the session was replaced: read it again, keeping the cursor and open lines."""
        self._reopen_view = self.browser.tree_view.view_state()
        self.session = None
        self.last_saved = None
        self.browser.show_reading(f"reading {self.display_name} again (it was just replaced)…")
        self.refresh_bindings()
        self._open(self.path, True)

    # ---- quitting ---------------------------------------------------------------------------

    async def action_quit(self) -> None:
        """Every way out (q, ctrl+q, the palette's Quit) asks first when edits are unsaved or a save runs."""
        if self.saving:
            question = "A save is under way. Stop it and quit?"
        elif self.session is not None and self.session.unsaved and not self.readonly:
            count = self.session.unsaved
            question = f"Quit and lose {count} unsaved edit{'s' if count != 1 else ''}?"
        else:
            self.exit()
            return
        if isinstance(self.screen, ConfirmScreen) and self.screen.purpose == "quit":
            return  # already asking

        def answer(yes: bool | None) -> None:
            if yes:
                if self._progress is not None:
                    self._progress.cancel.set()
                self.exit()

        self.push_screen(ConfirmScreen(question, "(default: No)", loud=True, purpose="quit"), answer)


def input_folder(path: str) -> str:
    """The folder of ``path`` with its separator, as a prompt offers it (a local path's as given, ``./``)."""
    if not byte_source.is_remote(path):
        return str(Path(path).parent) + os.sep
    folder = byte_source.parent(path.rstrip("/"))
    return (folder if "://" in folder else path.rstrip("/")) + "/"


CLI_OPTIONS_AS_KEYS = {"--extract": "x (extract)", "--drop": "d (delete)"}


def saved_words(result: WriteResult) -> str:
    """A save's notification: what torch.load(weights_only=True) makes of the file first, then what was written
    (a ``.safetensors``: the writer's whole line, with what the format left out)."""
    if result.weights_only is None:
        return result.line()
    lead = outlook_words(result.path, Outlook(result.weights_only))
    tensors = counted(result.tensors, "tensor")
    return f"{lead}; wrote {result.path} ({tensors}, {size(result.nbytes)}), read back and verified"


def browser_words(error: str) -> str:
    """A writer's error as the browser says it: the keys that do what a named CLI option does."""
    for option, keys in CLI_OPTIONS_AS_KEYS.items():
        error = error.replace(option, keys)
    return error


if TYPE_CHECKING:

    def _is_a_host(app: CkptApp) -> BrowserHost:
        """mypy checks here that the app gives the screens what :class:`BrowserHost` says."""
        return app
