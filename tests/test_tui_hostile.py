"""Hostile files in the browser: strings from the file are text on every surface; exploding paths stay fast."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from builders_tui import (
    EVIL_CLASS,
    MARKUP_VALUES,
    browser,
    cursor_path,
    detail,
    header,
    loaded,
    markup_checkpoint,
    save_hostile_names,
    save_shared_lists,
    save_shared_modules,
    screen_text,
    settle,
    status,
)

from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.screens.dialogs import ErrorScreen, PromptScreen
from ckpt_tui.tui.screens.findings import FindingsScreen
from ckpt_tui.tui.screens.report import ReportScreen

SIZE = (160, 50)
RAW_CONTROLS = ("\x1b", "\x07", "\x9b", "\u202e")


@pytest.fixture
def hostile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # where app.screenshot('pwned.svg') would write
    return save_hostile_names(tmp_path / "hostile.pth")


def assert_inert(text: str) -> None:
    """No control character reaches the terminal."""
    for char in RAW_CONTROLS:
        assert char not in text, f"raw {char!r} on screen"


async def test_every_line_of_a_hostile_file_is_shown_as_written(hostile: Path) -> None:
    app = CkptApp(str(hostile))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        tree = await loaded(pilot)
        shown = screen_text(app)
        assert_inert(shown)
        assert "[/data/imagenet]" in shown and "[b]not bold[/b]" in shown
        assert r"red\x1b[31mRED\x07\x9b2J" in shown and r"abc\u202edcba" in shown
        labels = [str(node.label) for node in tree.root.children]
        assert labels[0].startswith("[/data/imagenet]  Tensor")
        for _ in range(len(labels) + 1):  # every line in the detail panel and the status line
            await settle(pilot, "j")
            assert_inert(screen_text(app))
            assert_inert(detail(app) + status(app))
        assert app.is_running


async def test_markup_values_are_shown_not_interpreted_in_the_panel(hostile: Path) -> None:
    app = CkptApp(str(hostile))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        tree = await loaded(pilot)
        for name, text in MARKUP_VALUES.items():
            tree.reveal(((f"value.{name}",), None))
            await settle(pilot)
            assert cursor_path(app) == (f"value.{name}",)
            shown = detail(app)
            assert_inert(shown)
            if name in ("path", "click", "bold"):
                assert repr(text) in shown, name


async def test_clicking_markup_from_the_file_runs_no_action(hostile: Path, tmp_path: Path) -> None:
    app = CkptApp(str(hostile))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        tree = await loaded(pilot)
        tree.reveal((("value.click",), None))
        await settle(pilot)
        screen = browser(app)
        for selector in ("#tree", "#detail", "#summary", "#status"):  # click every line of each
            region = screen.query_one(selector).region
            for y in range(region.height):
                for x in (2, 12, 24, 40):
                    if x < region.width:
                        await pilot.click(selector, offset=(x, y))
        await settle(pilot)
        assert app.is_running, "a click ran [@click=app.quit] from the file"
    assert not list(tmp_path.glob("pwned*")) and not list(Path.cwd().glob("*.svg"))


async def test_hostile_global_names_and_device_tags_in_header_panel_and_findings(hostile: Path) -> None:
    app = CkptApp(str(hostile))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        top = header(app)
        assert_inert(top)
        assert r"cpu\x1b[8m[/]" in top
        browser(app).tree_view.reveal((("object",), None))
        await settle(pilot)
        panel = detail(app)
        assert_inert(panel)
        assert EVIL_CLASS in panel and "[@click=app.quit]evil" in panel and "[/data/imagenet]" in panel
        await settle(pilot, "f")
        assert isinstance(app.screen, FindingsScreen)
        shown = screen_text(app)
        assert_inert(shown)
        assert "[@click=app.quit]evil" in shown


async def test_notifications_prompts_and_search_show_keys_as_written(hostile: Path) -> None:
    app = CkptApp(str(hostile))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        tree = await loaded(pilot)
        tree.reveal((("[b]not bold[/b]",), None))
        await settle(pilot, "y")
        assert app.clipboard == 'ckpt["[b]not bold[/b]"]'
        assert 'ckpt["[b]not bold[/b]"]' in screen_text(app)
        await settle(pilot, "r")
        assert isinstance(app.screen, PromptScreen)
        assert "Rename '[b]not bold[/b]'" in screen_text(app)
        app.screen.query_one("Input").value = "[/data/imagenet]"  # already a key: the error quotes both
        await settle(pilot, "enter")
        shown = screen_text(app)
        assert_inert(shown)
        assert "both '[/data/imagenet]'" in shown
        await settle(pilot, "slash", *"[/data", "enter")
        assert cursor_path(app) == ("[/data/imagenet]",) and "match 1/" in status(app)
        tree.reveal((("nested", "[red]inner[/red]", "\x1b[8mhidden"), None))
        await settle(pilot)
        assert_inert(status(app))
        assert r'ckpt["nested"]["[red]inner[/red]"]["\x1b[8mhidden"]' in status(app)


async def test_report_rows_show_keys_as_written(hostile: Path, tmp_path: Path) -> None:
    other = markup_checkpoint()
    other["[/other]"] = torch.zeros(1)
    torch.save(other, tmp_path / "other.pth")
    app = CkptApp(str(hostile))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "D")
        app.screen.query_one("Input").value = str(tmp_path / "other.pth")
        await settle(pilot, "enter")
        assert isinstance(app.screen, ReportScreen)
        shown = screen_text(app)
        assert_inert(shown)
        assert "[/other]" in shown


async def test_a_file_named_with_markup_fails_with_its_name_shown(tmp_path: Path) -> None:
    bad = tmp_path / "[@click=app.quit][b]bad\x1b[8m.pth"
    bad.write_bytes(b"garbage that is no checkpoint")
    app = CkptApp(str(bad))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, ErrorScreen)
        assert_inert(screen_text(app))


# ---- exploding paths: the browser stays responsive ------------------------------------------------


async def test_modules_sharing_children_60_deep_browse_and_quit(tmp_path: Path) -> None:
    path = save_shared_modules(tmp_path / "shared.pth", depth=60)
    app = CkptApp(str(path))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, *["l"] * 12)  # down the left branch, level by level
        assert len(cursor_path(app)) >= 5
        await settle(pilot, "v", "f", "escape", "slash", *"left", "enter")
        await settle(pilot, "G", "g")
        await pilot.press("q")
        await pilot.pause()
    assert not app.is_running


async def test_shared_lists_repeated_in_a_dict_browse_and_quit(tmp_path: Path) -> None:
    path = save_shared_lists(tmp_path / "lists.pth", depth=60, keys=200)
    app = CkptApp(str(path))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        tree = await loaded(pilot)
        assert len(tree.root.children) == 200
        await settle(pilot, *["l"] * 12)
        await settle(pilot, "slash", *"k199", "enter")
        assert cursor_path(app)[0] == "k199"
        await pilot.press("q")
        await pilot.pause()
    assert not app.is_running


# ---- prompts pre-filled with a key from the file give back that key ---------------------------------

CONTROL_KEY = "esc\x1b[2J\x1b]0;pwn\x07key"


@pytest.fixture
def control_keys(tmp_path: Path) -> Path:
    state = {CONTROL_KEY: torch.ones(1), "other": torch.zeros(1)}
    torch.save(state, tmp_path / "controls.pth")
    return tmp_path / "controls.pth"


async def test_rename_unedited_key_with_control_bytes_is_no_edit(control_keys: Path) -> None:
    app = CkptApp(str(control_keys))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "r")
        assert isinstance(app.screen, PromptScreen)
        shown = app.screen.query_one("Input").value
        assert shown == r"esc\x1b[2J\x1b]0;pwn\x07key"  # escaped on screen
        await settle(pilot, "enter")
        assert app.screen is browser(app) and app.session.unsaved == 0
        assert "unchanged" in status(app)


async def test_rename_edited_key_keeps_its_control_bytes(control_keys: Path) -> None:
    app = CkptApp(str(control_keys))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "r")
        field = app.screen.query_one("Input")
        field.value = field.value.removesuffix("key") + "k2"
        await settle(pilot, "enter", "y")
        assert list(app.session.root) == ["esc\x1b[2J\x1b]0;pwn\x07k2", "other"]
        assert_inert(screen_text(app))


async def test_search_typed_as_shown_finds_a_key_with_control_bytes(control_keys: Path) -> None:
    app = CkptApp(str(control_keys))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "G", "slash")
        browser(app).query_one("#search").value = r"\x07key"
        await settle(pilot, "enter")
        assert cursor_path(app) == (CONTROL_KEY,) and "match 1/1" in status(app)


async def test_group_rename_gives_back_the_prefix_as_the_file_holds_it_and_strip_asks_nothing(tmp_path: Path) -> None:
    prefix = "m\x1b."
    state = {f"{prefix}{name}.{leaf}": torch.ones(1) for name in "abcd" for leaf in ("weight", "bias")}
    state["x\x07.w"] = torch.ones(1)
    torch.save(state, tmp_path / "prefixed.pth")
    app = CkptApp(str(tmp_path / "prefixed.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "v")
        browser(app).tree_view.reveal(((), prefix))
        await settle(pilot, "r")
        assert app.screen.query_one("Input").value == r"m\x1b."
        await settle(pilot, "enter")  # unchanged: no edit
        assert app.screen is browser(app) and app.session.unsaved == 0
        await settle(pilot, "p")  # no wrapper prefix: said, and no prompt
        assert app.screen is browser(app) and app.session.unsaved == 0
        assert_inert(screen_text(app))
