"""SVG snapshots of the main screens (pytest-textual-snapshot; update with --snapshot-update)."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders import save_cuda_tagged, training_checkpoint

from ckpt_tui.tui.app import CkptApp

SIZE = (120, 36)


@pytest.fixture
def best_model(tmp_path: Path) -> Path:
    return save_cuda_tagged(training_checkpoint(), tmp_path / "best_model.pth")


def settle(*keys: str):
    async def run_before(pilot) -> None:
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        for key in keys:
            await pilot.press(key)
            await pilot.app.workers.wait_for_complete()
            await pilot.pause()
        await pilot.pause(0.2)

    return run_before


@pytest.mark.parametrize(
    ("name", "keys"),
    [
        ("tree", ["j", "j", "l"]),
        ("stats", ["j", "j", "l", "l", "enter"]),
        ("preview", ["j", "j", "p"]),
        ("help", ["question_mark"]),
        ("narrow", ["j", "j", "l"]),
    ],
)
def test_screen(snap_compare, best_model: Path, name: str, keys: list[str]) -> None:
    size = (80, 24) if name == "narrow" else SIZE
    assert snap_compare(CkptApp(str(best_model)), run_before=settle(*keys), terminal_size=size)
