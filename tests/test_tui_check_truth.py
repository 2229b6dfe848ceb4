"""After an edit, undo, redo or a save, the header, the ``!!`` marks and the findings describe the tree on
screen: a tree not read by ``C`` never shows an older tree's result."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_tui import browser, cursor_path, header, loaded, screen_text, settle, status
from test_tui_check_all import with_bad_values

from ckpt_tui.core.errors import Cancelled
from ckpt_tui.tui.app import CkptApp


async def test_delete_after_check_drops_the_old_result_and_undo_redo_bring_each_trees_own(tmp_path: Path) -> None:
    app = CkptApp(str(with_bad_values(tmp_path / "bad.pth")))
    async with app.run_test(size=(120, 30)) as pilot:
        await loaded(pilot)
        await settle(pilot, "C")
        await settle(pilot)
        assert "1 with NaN, 1 with Inf" in header(app)
        await settle(pilot, "G")
        assert cursor_path(app) == ("has_inf",)
        await settle(pilot, "d", "y")
        await settle(pilot)
        assert all(node.data.path != ("has_inf",) for node in browser(app).tree_view.root.children)
        assert "every tensor read" not in header(app) and "with Inf" not in header(app)
        assert "!!" not in screen_text(app)
        assert "C again to read the edited tree" in status(app)
        assert browser(app).check is None
        await settle(pilot, "u")
        await settle(pilot)
        # the file as read again: the result read of it is true of it
        assert "1 with NaN, 1 with Inf" in header(app)
        assert "!! NaN" in screen_text(app) and "!! Inf" in screen_text(app)
        await settle(pilot, "ctrl+r")
        await settle(pilot)
        assert "with Inf" not in header(app) and "!!" not in screen_text(app)
        assert "C again to read the edited tree" in status(app)
        # read the edited tree: its own result, kept for it
        await settle(pilot, "C")
        await settle(pilot)
        assert "1 with NaN" in header(app) and "Inf" not in header(app)
        await settle(pilot, "u")
        await settle(pilot, "ctrl+r")
        await settle(pilot)
        assert "1 with NaN" in header(app) and "!! NaN" in screen_text(app)


async def test_findings_after_an_edit_leave_out_the_old_check(tmp_path: Path) -> None:
    app = CkptApp(str(with_bad_values(tmp_path / "bad.pth")))
    async with app.run_test(size=(120, 30)) as pilot:
        await loaded(pilot)
        await settle(pilot, "C")
        await settle(pilot)
        await settle(pilot, "G", "d", "y")
        await settle(pilot)
        await settle(pilot, "f")
        await settle(pilot)
        # nothing left to list: the check's findings were of the tree before the delete
        assert app.screen is browser(app)
        assert "with NaN" not in header(app) and "values not read yet" in header(app)


async def test_cast_after_check_says_to_read_again(tmp_path: Path) -> None:
    app = CkptApp(str(with_bad_values(tmp_path / "bad.pth")))
    async with app.run_test(size=(120, 30)) as pilot:
        await loaded(pilot)
        await settle(pilot, "C")
        await settle(pilot)
        await settle(pilot, "G", "t")
        await settle(pilot)
        for key in "float16":
            await pilot.press(key)
        await settle(pilot, "enter", "y")
        await settle(pilot)
        assert "with Inf" not in header(app) and "!!" not in screen_text(app)
        assert "C again to read the edited tree" in status(app)


async def test_an_edit_stops_the_judge_of_the_tree_before_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A judge still running when the next edit lands stops, and its answer is never shown for the newer tree."""
    from ckpt_tui.tui.screens import browser as browser_module

    path = tmp_path / "many.pth"
    torch.save({f"layer{i}.weight": torch.ones(1) for i in range(3000)}, path)
    judge = browser_module.judge_tree
    held = threading.Event()
    stopped: list[str] = []

    def held_judge(root: Any, cancelled: Callable[[], bool]) -> Any:
        # the first edit's judge waits (as a slow judge of 50,000 keys would) until the next edit cancels it
        if not held.is_set():
            held.set()
            for _ in range(1000):
                if cancelled():
                    break
                time.sleep(0.01)
            try:
                return judge(root, cancelled)
            except Cancelled:
                stopped.append("cancelled")
                raise
        return judge(root, cancelled)

    monkeypatch.setattr(browser_module, "judge_tree", held_judge)
    app = CkptApp(str(path))
    async with app.run_test(size=(120, 30)) as pilot:
        await loaded(pilot)
        screen = browser(app)
        await settle(pilot, "G")
        await edit_without_waiting(pilot, "d")
        first = app.session.version
        for _ in range(500):  # the first edit's judge has started (and is held)
            if held.is_set():
                break
            await pilot.pause(0.01)
        await edit_without_waiting(pilot, "d")
        await settle(pilot)
        assert stopped == ["cancelled"]
        assert app.session.version != first and app.session.version in screen.outlooks
        assert first not in screen.outlooks


async def edit_without_waiting(pilot: Any, key: str) -> None:
    """Press an edit's key and confirm its preview, without waiting for the browser's other workers."""
    from ckpt_tui.tui.screens.dialogs import PreviewScreen

    version = pilot.app.session.version
    await pilot.press(key)
    for _ in range(500):
        if isinstance(pilot.app.screen, PreviewScreen):
            break
        await pilot.pause(0.01)
    await pilot.press("y")
    for _ in range(500):
        if pilot.app.session.version != version:
            break
        await pilot.pause(0.01)
