"""A file whose name is not UTF-8 is named in a one-line error as a user types it (``bad\\xff.pth``, the byte in
``$'…'``), never as the lone surrogate Python holds (``bad\\udcff.pth``), in the CLI and in the browser; a key
with such a character is the file's data and keeps its own escape."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from builders_tui import screen_text, settle

from ckpt_tui.cli import main
from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.screens.dialogs import ErrorScreen

BAD = os.fsdecode(b"bad\xff.pth")
GOOD = os.fsdecode(b"good\xfe\xff.pth")


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / BAD).write_bytes(b"not a checkpoint at all\n")
    torch.save({"w": torch.ones(2), os.fsdecode(b"k\xff"): torch.zeros(1)}, tmp_path / GOOD)
    return tmp_path


def error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code in (1, 2) and len(err.splitlines()) == 1, (code, err)
    return err


@pytest.mark.parametrize("command", ["info", "check", "stats"])
def test_a_file_that_is_no_checkpoint_is_named_as_typed(files: Path, capsys, command: str) -> None:
    err = error_line(capsys, [command, str(files / BAD)])
    assert "bad\\xff.pth" in err and "\\udcff" not in err, err


def test_a_missing_file_in_a_missing_folder_is_named_as_typed(tmp_path: Path, capsys) -> None:
    err = error_line(capsys, ["info", str(tmp_path / os.fsdecode(b"dir\xff") / BAD)])
    assert "dir\\xff/bad\\xff.pth" in err and "\\udc" not in err, err


def test_convert_names_its_output_and_the_names_made_from_the_input_as_typed(files: Path, capsys) -> None:
    out = files / os.fsdecode(b"out\xff.pth")
    out.write_bytes(b"x")
    err = error_line(capsys, ["convert", str(files / GOOD), "-o", str(out)])
    assert "out\\xff.pth exists" in err and "\\udc" not in err, err
    # a key the file holds keeps its escape: it is data, not a name typed on the command line
    err = error_line(capsys, ["convert", str(files / GOOD), "-o", str(files / "x.pth"), "--drop", "nokey"])
    assert "k\\udcff" in err, err


def test_the_process_prints_the_line_on_any_locale(files: Path) -> None:
    """The real process, with an ASCII locale: one line, exit 2, no UnicodeEncodeError."""
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONIOENCODING": "ascii"}
    done = subprocess.run(
        [sys.executable, "-m", "ckpt_tui", "info", os.fsencode(files / BAD)], env=env, capture_output=True, timeout=60
    )
    assert done.returncode == 2 and done.stderr.count(b"\n") == 1, done.stderr
    assert b"bad\\xff.pth" in done.stderr and b"Traceback" not in done.stderr


async def test_the_browser_names_a_file_it_cannot_open_as_typed(files: Path) -> None:
    app = CkptApp(str(files / BAD))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, ErrorScreen)
        text = screen_text(app)
        assert "bad\\xff.pth" in text and "\\udcff" not in text, text
