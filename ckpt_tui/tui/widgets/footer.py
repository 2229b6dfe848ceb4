"""The key footer: the keys that matter most now, as many as fit the width; rebuilt only when they change.

Textual's ``Footer`` lists every shown key in binding order and lets the row run off the right edge: at
80 columns the last keys (Save, Quit) were the ones lost. Here the keys are taken in the screen's order
of importance (:meth:`FooterOrder.footer_first`; Save, Help, Quit/Back first of all) until the width is
full, then shown in binding order, so a key keeps its place among the others as the set changes.

Textual's footer also recomposes (a new widget per key) at every change of the screen's bindings: each
focus move, each ``refresh_bindings``, each return from a dialog. On the browser these changes almost
never change what the footer shows, yet the rebuilds were a third of a key's time on a 50,000-key file:
here the footer is rebuilt only when the keys it would show differ.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

from rich.cells import cell_len
from textual import events
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

ALWAYS = ("save", "help", "quit", "close")
"""The actions shown whatever else is: saving, help, and the way out (``close`` on a screen over the tree)."""

PALETTE_WORD = "Commands"
"""The palette's key in the footer (help says "Command palette"): 7 columns more for the other keys."""


class Shown(NamedTuple):
    """One key as the footer draws it."""

    key: str
    display: str
    description: str
    action: str
    enabled: bool
    tooltip: str

    @property
    def width(self) -> int:
        """Columns it takes: `` key description `` (Footer's padding: one before and after the key, one after)."""
        return cell_len(self.display) + cell_len(self.description) + 3


@runtime_checkable
class FooterOrder(Protocol):
    """A screen that says which keys matter most now (after :data:`ALWAYS`)."""

    def footer_first(self) -> tuple[str, ...]:
        """Actions, most important first; the screen's other shown keys follow, in binding order."""
        ...


def fitted(keys: list[Shown], first: tuple[str, ...], width: int) -> list[Shown]:
    """The keys that fit ``width`` columns, taken by importance (:data:`ALWAYS`, then ``first``, then enabled
    before dimmed, then binding order) and given back in binding order."""
    order: dict[str, int] = {}
    for action in (*ALWAYS, *first):
        order.setdefault(action, len(order))

    def rank(item: tuple[int, Shown]) -> tuple[int, int, int]:
        index, shown = item
        return (order.get(shown.action, len(order)), 0 if shown.enabled else 1, index)

    ranked = sorted(enumerate(keys), key=rank)
    # Save, Help and the way out always stand, even on a terminal too narrow for them all
    taken = [(index, shown) for index, shown in ranked if shown.action in ALWAYS]
    used = sum(shown.width for _, shown in taken)
    for index, shown in ranked:
        if shown.action in ALWAYS:
            continue
        # the first key that does not fit ends the list: a less important, shorter key never takes its place
        if used + shown.width > width:
            break
        taken.append((index, shown))
        used += shown.width
    return [shown for _, shown in sorted(taken, key=lambda item: item[0])]


class KeysFooter(Footer):
    """A ``Footer`` of the keys that matter most and fit; it recomposes only when they (or their state) differ."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._shown: tuple[Any, ...] | None = None

    def candidates(self) -> list[Shown]:
        """Every shown key of the screen, one per action, in binding order (the palette's key left out)."""
        keys: dict[str, Shown] = {}
        for _, binding, enabled, tooltip in self.screen.active_bindings.values():
            if binding.show and binding.action not in keys and binding.action != "command_palette":
                display = self.app.get_key_display(binding)
                keys[binding.action] = Shown(
                    binding.key, display, binding.description, binding.action, enabled, tooltip or ""
                )
        return list(keys.values())

    def palette(self) -> Shown | None:
        """The command palette's key, docked at the right, or None where it is not offered."""
        active = self.screen.active_bindings.get(self.app.COMMAND_PALETTE_BINDING)
        if active is None or not self.show_command_palette or not self.app.ENABLE_COMMAND_PALETTE:
            return None
        _, binding, enabled, tooltip = active
        display = self.app.get_key_display(binding)
        return Shown(binding.key, display, PALETTE_WORD, binding.action, enabled, tooltip or binding.description)

    def shown(self) -> tuple[Any, ...]:
        """What :meth:`compose` draws, as data: the fitted keys, then the command palette's key."""
        palette = self.palette()
        # the palette's key is docked at the right edge: a one-column rule, then the key as any other is drawn
        # less its leading space
        room = self.app.size.width - (palette.width if palette is not None else 0)
        first = self.screen.footer_first() if isinstance(self.screen, FooterOrder) else ()
        return (*fitted(self.candidates(), first, room), palette)

    def compose(self) -> ComposeResult:
        if not self._bindings_ready:
            return
        *keys, palette = self._shown if self._shown is not None else self.shown()
        for shown in keys:
            yield FooterKey(
                shown.key, shown.display, shown.description, shown.action, not shown.enabled, shown.tooltip
            ).data_bind(compact=Footer.compact)
        if palette is not None:
            yield FooterKey(
                palette.key,
                palette.display,
                palette.description,
                palette.action,
                not palette.enabled,
                palette.tooltip,
                classes="-command-palette",
            )

    def bindings_changed(self, screen: Screen[Any]) -> None:
        """As ``Footer`` does, but the rebuild is skipped when nothing it shows changed."""
        self._bindings_ready = True
        if not screen.app.app_focus:
            return
        if self.is_attached and screen is self.screen:
            self.call_after_refresh(self._recompose_if_changed)

    def on_resize(self, event: events.Resize) -> None:
        # a wider terminal has room for more keys, a narrower one for fewer
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
