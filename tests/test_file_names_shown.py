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
from builders_tui import loaded, screen_text, settle, status

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


def test_diff_names_its_files_as_typed(files: Path, capsys) -> None:
    """A report's headline names the compared files as the error lines do (it read 'DIFFERENT (good\\udcfe...')."""
    torch.save({"w": torch.zeros(2)}, files / "other.pth")
    main(["diff", str(files / GOOD), str(files / "other.pth")])
    headline = capsys.readouterr().out.splitlines()[0]
    assert "good\\xfe\\xff.pth vs" in headline and "\\udc" not in headline, headline  # (a key k\udcff follows)


async def test_the_browser_names_an_opened_file_as_typed_in_its_header_tree_and_saves(files: Path) -> None:
    app = CkptApp(str(files / GOOD))
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await settle(pilot)
        lines = screen_text(app).splitlines()
        named = [line for line in lines if "good" in line]  # the header and the tree's root (a key k\udcff follows)
        assert len(named) == 2 and all("good\\xfe\\xff.pth" in line for line in named), lines
        assert not any("\\udc" in line or "good\\\\xfe" in line for line in named), named  # never escaped again
        await settle(pilot, "ctrl+s")
        await settle(pilot, "enter")
        await settle(pilot)
        assert "saved good\\xfe\\xff.fixed.pth" in status(app) and "\\udc" not in status(app), status(app)
    assert (files / os.fsdecode(b"good\xfe\xff.fixed.pth")).exists()
