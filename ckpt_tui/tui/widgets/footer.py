"""The key footer: Textual's ``Footer``, rebuilt only when the keys it shows change.

Textual's footer recomposes (a new widget per key, each styled and laid out) at every change of the
screen's bindings: each focus move, each ``refresh_bindings``, each return from a dialog. On the
browser these changes almost never change what the footer shows (the tree's and the search field's
keys are not shown), yet the rebuilds were a third of a key's time on a 50,000-key file.
"""

from __future__ import annotations

from typing import Any

from textual.screen import Screen
from textual.widgets import Footer

Shown = tuple[tuple[Any, ...], ...]


class KeysFooter(Footer):
    """A ``Footer`` that recomposes only when the keys it would show (or their state) differ."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._shown: Shown | None = None

    def shown(self) -> Shown:
        """What :meth:`Footer.compose` draws, as data: every shown key with its description, state and group,
        then the command palette's key."""
        active = self.screen.active_bindings
        rows: list[tuple[Any, ...]] = []
        for name, (_, binding, enabled, tooltip) in active.items():
            if binding.show:
                group = (binding.group.description, binding.group.compact) if binding.group else None
                rows.append((name, binding.key, binding.action, binding.description, enabled, tooltip, group))
        palette = active.get(self.app.COMMAND_PALETTE_BINDING)
        if palette is not None:
            rows.append(("palette", palette.binding.description, palette.enabled, palette.tooltip))
        return tuple(rows)

    def bindings_changed(self, screen: Screen[Any]) -> None:
        """As ``Footer`` does, but the rebuild is skipped when nothing it shows changed."""
        self._bindings_ready = True
        if not screen.app.app_focus:
            return
        if self.is_attached and screen is self.screen:
            self.call_after_refresh(self._recompose_if_changed)

    def _recompose_if_changed(self) -> None:
        if not self.is_attached:
            return
        shown = self.shown()
        # several changes in one frame queue several rebuilds: the first one that finds a difference does it
        if shown == self._shown:
            return
        self._shown = shown
        self.refresh(recompose=True)
