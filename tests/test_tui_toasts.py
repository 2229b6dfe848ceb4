"""A toast never sits over a dialog or the help that opens after it."""

from __future__ import annotations

from pathlib import Path

import torch
from builders_tui import loaded, settle

from ckpt_tui.tui.app import CkptApp


async def test_a_toast_is_cleared_when_help_opens(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(2)}, tmp_path / "a.pth")
    app = CkptApp(str(tmp_path / "a.pth"))
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await loaded(pilot)
        app.notify("Saved: a long message about the file just written", timeout=30)
        await pilot.pause()
        assert len(app._notifications) == 1
        await settle(pilot, "question_mark")
        assert app.screen is not app.browser
        assert len(app._notifications) == 0
