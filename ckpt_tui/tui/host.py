"""What the screens need from the app, as a protocol: screens import this, never the app (which imports them)."""

from __future__ import annotations

from typing import Protocol

from ckpt_tui.core.edits.session import Session


class BrowserHost(Protocol):
    """The app as the browser screen sees it: the session, the options it was opened with, and a memory of
    answers to prompts."""

    path: str
    readonly: bool
    session: Session | None
    last_saved: str | None
    histogram_log: bool
    """Histograms (detail panel, layers view) count on a log scale."""

    def remember(self, prompt: str, value: str) -> None:
        """Keep the last path given to a prompt."""

    def remembered(self, prompt: str) -> str:
        """The last path given to a prompt, or the folder of the input."""

    def default_save_path(self) -> str:
        """A free name for a fixed copy of the input."""

    def action_save(self) -> None:
        """Ask where to save, then save."""

    def refresh_bindings(self) -> None:
        """Show the keys that apply now."""
