"""SVG snapshots of the main screens (pytest-textual-snapshot; update with --snapshot-update)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from builders import save_cuda_tagged, training_checkpoint

from ckpt_tui.tui.app import CkptApp

SIZE = (120, 36)


def with_fixed_values(value: Any) -> Any:
    """Replace every float tensor's values with exact binary fractions.

    The values the stats panel shows must not depend on the CPU: a training step's float
    rounding differs between machines, so the screens are drawn from values that every
    machine computes exactly (eighths from -1 to 1).
    """
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        steps = torch.arange(value.numel(), dtype=torch.float64) % 17 - 8
        return (steps / 8).to(value.dtype).reshape(value.shape)
    if isinstance(value, dict):
        fixed = type(value)()
        for key, item in value.items():
            fixed[key] = with_fixed_values(item)
        if hasattr(value, "_metadata"):  # a state_dict's per-module versions
            fixed._metadata = value._metadata
        return fixed
    if isinstance(value, list):
        return [with_fixed_values(item) for item in value]
    return value


@pytest.fixture
def best_model(tmp_path: Path) -> Path:
    checkpoint = with_fixed_values(training_checkpoint())
    return save_cuda_tagged(checkpoint, tmp_path / "best_model.pth")


async def header_complete(pilot) -> None:
    """Wait until the header shows the whole summary (its height decides the tree's), then a repaint."""
    for _ in range(200):
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        if pilot.app.screen.query("#summary.-complete"):
            break
    await pilot.pause(0.1)


def settle(*keys: str):
    async def run_before(pilot) -> None:
        await header_complete(pilot)
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
        ("layers", ["L"]),
        ("layers-histogram", ["L", "j", "p", "o"]),
        ("layers-bytes", ["L", "p", "p"]),
    ],
)
def test_screen(snap_compare, best_model: Path, name: str, keys: list[str]) -> None:
    size = (80, 24) if name in ("narrow", "layers") else SIZE
    assert snap_compare(CkptApp(str(best_model)), run_before=settle(*keys), terminal_size=size)
