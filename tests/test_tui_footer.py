"""The key footer: it lists the keys that act now, and is rebuilt only when that list changes."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from builders_tui import browser, cursor_data, fixed_state_dict, loaded, settle, status
from textual.widgets._footer import FooterKey

from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.widgets.footer import KeysFooter

SIZE = (100, 30)


def saved(tmp_path: Path) -> Path:
    import torch

    torch.save(fixed_state_dict(), tmp_path / "model.pth")
    return tmp_path / "model.pth"


def footer_keys(app: CkptApp) -> list[FooterKey]:
    return list(browser(app).query_one(KeysFooter).query(FooterKey))


def footer_text(app: CkptApp) -> str:
    return " ".join(
        f"{key.key}:{key.description}{'(off)' if key.has_class('-disabled') else ''}" for key in footer_keys(app)
    )


async def test_footer_lists_the_browser_keys_and_save_once_the_file_is_read(tmp_path: Path) -> None:
    app = CkptApp(str(saved(tmp_path)))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await settle(pilot)
        shown = footer_text(app)
        for words in ("slash:Search", "p:Strip prefix", "u:Undo", "L:Layers", "ctrl+s:Save as"):
            assert words in shown
        assert "(off)" not in shown.split("ctrl+s:Save as")[1][:5]


async def test_footer_drops_the_letter_keys_while_typing_a_search_and_brings_them_back(tmp_path: Path) -> None:
    app = CkptApp(str(saved(tmp_path)))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await settle(pilot, "slash")
        # p, u, L type into the search field now: the footer does not offer them
        typing = footer_text(app)
        assert "p:Strip prefix" not in typing and "u:Undo" not in typing and "L:Layers" not in typing
        browser(app).query_one("#search").value = "fc1"
        await settle(pilot, "enter")
        assert "p:Strip prefix" in footer_text(app) and "u:Undo" in footer_text(app)


async def test_footer_keeps_its_keys_when_what_it_shows_does_not_change(tmp_path: Path) -> None:
    app = CkptApp(str(saved(tmp_path)))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await settle(pilot)
        before = footer_keys(app)
        # a dialog opened and closed, a move, and a refresh of the bindings: the same keys, the same widgets
        await settle(pilot, "question_mark")
        await settle(pilot, "escape", "j")
        browser(app).refresh_bindings()
        await settle(pilot)
        after = footer_keys(app)
        assert [key.key for key in after] == [key.key for key in before]
        assert all(a is b for a, b in zip(after, before, strict=True))


async def test_footer_of_a_readonly_browser_offers_no_edit_key(tmp_path: Path) -> None:
    app = CkptApp(str(saved(tmp_path)), readonly=True)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await settle(pilot, "j")
        shown = footer_text(app)
        assert "slash:Search" in shown and "L:Layers" in shown
        assert "p:Strip prefix" not in shown and "u:Undo" not in shown and "ctrl+s" not in shown


# ---- at 80 columns: the keys that matter most, Save, Help and Quit always --------------------------------

NARROW = (80, 24)


def visible(app: CkptApp) -> list[str]:
    """The footer's keys drawn wholly inside the screen, as ``key:Description``."""
    width = app.size.width
    return [f"{key.key}:{key.description}" for key in footer_keys(app) if key.region.right <= width and key.region]


def assert_save_help_quit(app: CkptApp) -> None:
    shown = visible(app)
    for words in ("ctrl+s:Save as", "question_mark:Help", "q:Quit", "ctrl+p:Commands"):
        assert words in shown, (words, shown)


def namespace_file(tmp_path: Path) -> Path:
    """A state_dict beside an argparse.Namespace: torch.load(weights_only=True) refuses it, s sanitizes it."""
    import argparse

    import torch

    torch.save({"model": fixed_state_dict(""), "args": argparse.Namespace(lr=0.1)}, tmp_path / "ns.pth")
    return tmp_path / "ns.pth"


async def test_footer_at_80_columns_keeps_save_help_and_quit_while_the_file_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckpt_tui.tui import app as app_module

    gate = threading.Event()
    opened = app_module.open_checkpoint

    def slow(path: str) -> Any:
        assert gate.wait(20), "the test never let the read finish"
        return opened(path)

    monkeypatch.setattr(app_module, "open_checkpoint", slow)
    app = CkptApp(str(namespace_file(tmp_path)))
    async with app.run_test(size=NARROW) as pilot:
        await pilot.pause(0.2)
        assert app.session is None
        assert_save_help_quit(app)
        saving = next(key for key in footer_keys(app) if key.key == "ctrl+s")
        assert saving.has_class("-disabled")  # nothing to save yet: shown dimmed
        gate.set()
        await loaded(pilot)
        await settle(pilot)
        assert app.session is not None
        assert_save_help_quit(app)


async def test_footer_at_80_columns_fits_every_state_of_the_browser(tmp_path: Path) -> None:
    app = CkptApp(str(namespace_file(tmp_path)))
    async with app.run_test(size=NARROW) as pilot:
        await loaded(pilot)
        await settle(pilot)
        # torch.load refuses the Namespace: s is offered, beside Save, Help and Quit
        assert "s:Sanitize" in visible(app)
        assert_save_help_quit(app)
        # the cursor on a dict, then on a tensor
        await settle(pilot, "j")
        assert cursor_data(app).value is not None
        assert_save_help_quit(app)
        await settle(pilot, "l", "j")
        assert "tensor" in type(cursor_data(app).value).__name__.lower()
        assert_save_help_quit(app)
        # an edit pending: Undo comes first after Save, Help and Quit
        await settle(pilot, "d", "y")
        assert app.session is not None and app.session.can_undo
        assert "u:Undo" in visible(app)
        assert_save_help_quit(app)
        # every key drawn lies within the 80 columns, none under the palette's key
        palette = next(key for key in footer_keys(app) if key.has_class("-command-palette"))
        for key in footer_keys(app):
            if key is not palette:
                assert key.region.right <= palette.region.x, key.key


async def test_footer_without_an_edit_leaves_undo_for_a_wider_terminal(tmp_path: Path) -> None:
    app = CkptApp(str(saved(tmp_path)))
    async with app.run_test(size=NARROW) as pilot:
        await loaded(pilot)
        await settle(pilot)
        assert "u:Undo" not in visible(app)
        assert_save_help_quit(app)
        # why a checkpoint does not fit its model is what most open it for: c is there at 80 columns
        assert "c:Compare" in visible(app)
        await pilot.resize_terminal(120, 30)
        await settle(pilot)
        assert "u:Undo" in visible(app) and "L:Layers" in visible(app)


async def test_strip_prefix_is_offered_where_a_prefix_is_named_and_a_press_elsewhere_says_why(tmp_path: Path) -> None:
    """``p`` follows ``s``'s rule: in the footer only where a finding names a prefix the keys share (DDP's
    ``module.``); on a bare state_dict it is not offered, and a press says there is nothing to strip. Once the
    prefix is stripped the footer drops it."""
    import torch

    torch.save(fixed_state_dict(prefix=""), tmp_path / "bare.pth")
    app = CkptApp(str(tmp_path / "bare.pth"))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await settle(pilot)
        assert " p:" not in footer_text(app) and "Strip prefix" not in footer_text(app), footer_text(app)
        await settle(pilot, "p")
        assert "nothing to strip" in status(app), status(app)
    app = CkptApp(str(saved(tmp_path)))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await settle(pilot)
        assert "p:Strip prefix" in footer_text(app), footer_text(app)
        await settle(pilot, "p", "y")
        await settle(pilot)
        assert "Strip prefix" not in footer_text(app), footer_text(app)
