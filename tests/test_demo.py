"""``ckpt-tui demo`` writes into a fresh private folder, with the bare model's state_dict beside the
training checkpoint, and the README's walkthrough (c, enter, f, y, ctrl+s, enter) works on it as told."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
import torch
from builders_tui import header, loaded, settle, status
from torch import nn

from ckpt_tui.cli import main
from ckpt_tui.core.operations.demo import demo_files, write_demo, write_files
from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.screens.compare import CompareScreen
from ckpt_tui.tui.screens.dialogs import ErrorScreen


def demo_model() -> nn.Sequential:
    """The demo's model, as inference code would build it."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


def test_each_demo_gets_a_fresh_private_folder() -> None:
    first, second = write_demo(), write_demo()
    try:
        assert first.checkpoint.parent != second.checkpoint.parent
        assert stat.S_IMODE(os.stat(first.checkpoint.parent).st_mode) == 0o700
        assert sorted(p.name for p in first.checkpoint.parent.iterdir()) == [
            "demo_ddp_checkpoint.pth",
            "reference_model.pth",
        ]
    finally:
        for demo in (first, second):
            for path in demo.checkpoint.parent.iterdir():
                path.unlink()
            demo.checkpoint.parent.rmdir()


def test_the_reference_is_the_bare_models_state_dict(tmp_path: Path) -> None:
    demo = write_demo(tmp_path)
    reference = torch.load(demo.reference, weights_only=True)
    model = demo_model()
    assert model.load_state_dict(reference) is not None  # strict: every key and shape
    assert list(reference) == list(model.state_dict())


def test_demo_print_says_where_both_files_are(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--print"]) == 0
    err = capsys.readouterr().err
    assert "demo_ddp_checkpoint.pth" in err and "reference_model.pth" in err and "--against" in err
    folder = Path(err.split("demo checkpoint written to ", 1)[1].split(",", 1)[0]).parent
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()


async def test_the_readme_walkthrough_on_the_demo_saves_a_file_that_loads_strictly(tmp_path: Path) -> None:
    demo = write_demo(tmp_path)
    app = CkptApp(str(demo.checkpoint), welcome=demo.welcome())
    app.remember("compare", str(demo.reference))
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await loaded(pilot)
        assert "reference_model.pth beside it is the bare model: c, enter compares them" in " ".join(
            status(app).split()
        )
        await settle(pilot, "c", "enter")
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        assert screen.report.suggestion is not None and screen.report.suggestion.full
        assert screen.report.suggestion.matched == screen.report.suggestion.total == 16
        await settle(pilot, "f", "y", "ctrl+s", "enter")
    saved = torch.load(tmp_path / "demo_ddp_checkpoint.fixed.pth", weights_only=True)
    assert str(demo_model().load_state_dict(saved)) == "<All keys matched successfully>"


async def test_the_demo_paints_before_its_files_are_written_and_says_so(tmp_path: Path) -> None:
    demo = demo_files(tmp_path)
    go = threading.Event()

    def write() -> None:
        assert go.wait(30)
        write_files(demo)

    app = CkptApp(str(demo.checkpoint), welcome=demo.welcome(), prepare=("writing the demo files…", write))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert "writing the demo files…" in header(app)
        assert not demo.checkpoint.exists()
        go.set()
        await loaded(pilot)
        assert "46 tensors" in header(app)
        assert "c, enter compares them" in " ".join(status(app).split())


async def test_demo_files_that_cannot_be_written_say_why_in_one_line(tmp_path: Path) -> None:
    def write() -> None:
        raise PermissionError(13, "Permission denied")

    app = CkptApp(str(tmp_path / "demo.pth"), prepare=("writing the demo files…", write))
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        assert isinstance(app.screen, ErrorScreen)
        assert "writing the demo files failed: Permission denied" in app.screen.message
