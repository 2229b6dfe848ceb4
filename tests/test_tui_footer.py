"""The key footer: it lists the keys that act now, and is rebuilt only when that list changes."""

from __future__ import annotations

from pathlib import Path

from builders_tui import browser, fixed_state_dict, loaded, settle
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
