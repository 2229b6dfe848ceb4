"""The browser says what is true now: after edits the header's weights_only line and unsafe globals describe the
tree as staged (or say they are about the file on disk), the save dialog and the save line give the verdict of
what will be written, and each is checked against the real ``torch.load(weights_only=True)``."""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import pathlib
import pickle
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch
from builders import Payload, touch_command
from builders_tui import header, loaded, screen_text, settle, status

from ckpt_tui.cli import main
from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.screens.dialogs import SaveScreen
from ckpt_tui.tui.screens.findings import FindingsScreen

NARROW = (80, 24)


@pytest.fixture
def odd_file(tmp_path: Path) -> Path:
    """Plain data torch refuses: a Namespace and numpy values beside the weights."""
    path = tmp_path / "odd_model.pth"
    args = argparse.Namespace(lr=0.1)
    torch.save({"state_dict": {"w": torch.ones(2)}, "args": args, "stats": np.array([1.0, 2.0])}, path)
    return path


@pytest.fixture
def payload_file(tmp_path: Path) -> tuple[Path, Path]:
    """Code: a payload that would create the canary if anything ran it."""
    canary = tmp_path / "canary"
    path = tmp_path / "downloaded_model.pth"
    torch.save({"model": {"w": torch.ones(2)}, "payload": Payload(os.system, touch_command(canary))}, path)
    return path, canary


def loads_weights_only(path: Path) -> bool:
    """What the real torch.load(weights_only=True) does with the file."""
    try:
        torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        return False
    return True


def save_line(app: CkptApp) -> str:
    """The save dialog's line about the format and the verdict, as shown."""
    assert isinstance(app.screen, SaveScreen)
    return " ".join(str(app.screen.query_one("#save-format").render()).split())


async def test_deleting_the_namespace_and_numpy_turns_the_refusal_into_loads(odd_file: Path) -> None:
    app = CkptApp(str(odd_file))
    async with app.run_test(size=NARROW) as pilot:
        await loaded(pilot)
        shown = " ".join(header(app).split())
        assert "! weights_only: torch.load REFUSES it: data, not code: argparse.Namespace, numpy" in shown
        assert "(s rewrites it as plain data)" in shown
        await settle(pilot, "j", "j", "d", "y")  # args
        shown = " ".join(header(app).split())
        # numpy is still in the staged tree: the line is about what saving it writes
        assert "weights_only, what you save: torch.load REFUSES it: data, not code: numpy" in shown
        assert "argparse" not in shown
        await settle(pilot, "j", "d", "y")  # stats
        shown = " ".join(header(app).split())
        assert "· weights_only: what you save loads with torch.load" in shown
        assert "your edits remove what the file on disk is refused over" in shown
        assert "REFUSES" not in shown
        await settle(pilot, "ctrl+s")
        assert "loads with torch.load(weights_only=True)" in save_line(app)
        await settle(pilot, "enter")
        assert status(app).startswith("loads with torch.load(weights_only=True) · saved odd_model.fixed.pth")
    assert loads_weights_only(odd_file.parent / "odd_model.fixed.pth")


async def test_save_dialog_on_a_file_torch_refuses_says_so_and_the_save_line_leads_with_it(odd_file: Path) -> None:
    app = CkptApp(str(odd_file))
    async with app.run_test(size=NARROW, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "ctrl+s")
        line = save_line(app)
        assert "torch.load(weights_only=True) will REFUSE it: data, not code: argparse.Namespace, numpy" in line
        assert "loads with" not in line
        command = line.split("`")[1]
        await settle(pilot, "enter")
        shown = status(app).rstrip("\n")
        # one line at 80 columns (less the status line's padding), the verdict first
        assert "\n" not in shown and len(shown) <= 78
        assert shown.startswith("torch.load(weights_only=True) REFUSES it · saved odd_model.fixed.pth")
        assert "data.pkl" not in screen_text(app)
    saved = odd_file.parent / "odd_model.fixed.pth"
    assert not loads_weights_only(saved)
    # the command the dialog gives makes the saved file load
    argv = shlex.split(command)
    assert argv[:3] == ["ckpt-tui", "convert", str(saved)]
    assert main(argv[1:]) == 0
    assert loads_weights_only(Path(argv[argv.index("--output") + 1]))


async def test_deleting_the_payload_clears_the_refusal_and_the_unsafe_global(payload_file: tuple[Path, Path]) -> None:
    path, canary = payload_file
    app = CkptApp(str(path))
    async with app.run_test(size=(120, 36)) as pilot:
        await loaded(pilot)
        shown = " ".join(header(app).split())
        assert (
            'weights_only: torch.load REFUSES it: CODE: posix.system at ckpt["payload"] (d on it deletes it)' in shown
        )
        await settle(pilot, "ctrl+s")
        line = save_line(app)
        assert "ckpt-tui will not write it" in line and 'CODE: posix.system at ckpt["payload"]' in line
        await settle(pilot, "escape", "j", "j", "d", "y")
        shown = " ".join(header(app).split())
        assert "what you save loads with torch.load" in shown and "CODE: posix.system" in shown
        # never "outside the tree, torch.load would run it" beside a clean save: the file on disk is named
        assert "outside the tree" not in shown and "would run it" not in shown.replace("of that file would run", "")
        await settle(pilot, "ctrl+s", "enter")
        assert status(app).startswith("loads with torch.load(weights_only=True)")
        await settle(pilot, "f")
        assert isinstance(app.screen, FindingsScreen)
        assert "the file on disk holds unsafe global posix.system" in screen_text(app)
    assert loads_weights_only(path.parent / "downloaded_model.fixed.pth")
    assert not canary.exists()


async def test_an_edit_that_adds_nothing_unsafe_adds_no_refusal(tmp_path: Path) -> None:
    path = tmp_path / "ddp.pth"
    torch.save({"module.w": torch.ones(2), "module.b": torch.zeros(2)}, path)
    app = CkptApp(str(path))
    async with app.run_test(size=NARROW) as pilot:
        await loaded(pilot)
        await settle(pilot, "p", "y")
        shown = " ".join(header(app).split())
        assert "REFUSES" not in shown and "!" not in shown.split("weights_only")[0][-3:]
        await settle(pilot, "ctrl+s")
        assert "loads with torch.load(weights_only=True)" in save_line(app)


async def test_f_lists_the_refusal_the_header_shows(odd_file: Path) -> None:
    app = CkptApp(str(odd_file))
    async with app.run_test(size=(120, 36)) as pilot:
        await loaded(pilot)
        await settle(pilot, "f")
        assert isinstance(app.screen, FindingsScreen)
        assert app.screen.findings[0].kind == "weights-only"
        assert "torch.load REFUSES it: data, not code: argparse.Namespace" in app.screen.findings[0].message


async def test_a_safetensors_file_gets_no_torch_load_verdict(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    path = tmp_path / "model.safetensors"
    save_file({"w": torch.ones(2)}, path)
    app = CkptApp(str(path))
    async with app.run_test(size=(120, 36)) as pilot:
        await loaded(pilot)
        shown = " ".join(header(app).split())
        assert "torch.load loads it" not in shown
        assert "n/a: safetensors has no pickle" in shown


async def test_s_sanitizes_in_the_browser_as_convert_sanitize_does(tmp_path: Path) -> None:
    """A Namespace, numpy arrays and scalars: s stages the CLI's --sanitize edit; the saved file loads, values as
    the CLI writes them; u undoes it."""
    path = tmp_path / "run.pth"
    args = argparse.Namespace(lr=0.1, name="run")
    saved = {"w": torch.ones(2), "args": args, "mean": np.array([1.5, 2.5], dtype=np.float32), "best": np.float64(0.25)}
    torch.save(saved, path)
    cli_out = tmp_path / "cli.pth"
    assert main(["convert", str(path), "-o", str(cli_out), "--sanitize"]) == 0
    app = CkptApp(str(path))
    async with app.run_test(size=NARROW) as pilot:
        await loaded(pilot)
        shown = " ".join(header(app).split())
        # the header names the key, not the shell
        assert "torch.load REFUSES it: data, not code: argparse.Namespace, numpy (s rewrites it as plain data)" in shown
        assert "convert" not in shown
        assert "sanitize" in {binding.action for _, binding, *_ in app.screen.active_bindings.values()}
        await settle(pilot, "s")
        await settle(pilot, "y")
        shown = " ".join(header(app).split())
        assert "weights_only: what you save loads with torch.load" in shown
        # nothing left to sanitize: the key leaves the footer and help, and a press says why
        assert "sanitize" not in {binding.action for _, binding, *_ in app.screen.active_bindings.values()}
        await settle(pilot, "s")
        assert "nothing to sanitize" in status(app)
        await settle(pilot, "u")
        assert "REFUSES" in " ".join(header(app).split())
        await settle(pilot, "ctrl+r", "ctrl+s", "enter")
    out = tmp_path / "run.fixed.pth"
    ours, cli = torch.load(out, weights_only=True), torch.load(cli_out, weights_only=True)
    assert ours["args"] == cli["args"] == {"lr": 0.1, "name": "run"}
    assert ours["best"] == cli["best"] == 0.25 and type(ours["best"]) is type(cli["best"])
    assert ours["mean"].dtype == cli["mean"].dtype == torch.float32
    assert torch.equal(ours["mean"], torch.tensor([1.5, 2.5])) and torch.equal(ours["mean"], cli["mean"])
    assert torch.equal(ours["w"], torch.ones(2))


@dataclasses.dataclass
class RunConfig:
    """What a training script drops into a checkpoint: its own config class."""

    lr: float = 0.1
    name: str = "run1"


async def test_s_sanitizes_a_config_class_a_path_and_a_defaultdict_as_the_cli_does(tmp_path: Path) -> None:
    """torch.load refuses them (the class as code to import, the rest as data, SETITEM into a defaultdict
    whatever is allowlisted): s is offered and makes the file load, as convert --sanitize does."""
    path = tmp_path / "run.pth"
    counts = collections.defaultdict(int, {"a": 1})
    torch.save({"w": torch.ones(2), "cfg": RunConfig(), "out": pathlib.PosixPath("/data/run1"), "counts": counts}, path)
    cli_out = tmp_path / "cli.pth"
    assert main(["convert", str(path), "-o", str(cli_out), "--sanitize"]) == 0
    app = CkptApp(str(path))
    async with app.run_test(size=NARROW) as pilot:
        await loaded(pilot)
        assert "REFUSES" in " ".join(header(app).split())
        assert "sanitize" in {binding.action for _, binding, *_ in app.screen.active_bindings.values()}
        await settle(pilot, "s")
        await settle(pilot, "y")
        assert "weights_only: what you save loads with torch.load" in " ".join(header(app).split())
        await settle(pilot, "ctrl+s", "enter")
    ours, cli = torch.load(tmp_path / "run.fixed.pth", weights_only=True), torch.load(cli_out, weights_only=True)
    assert ours["out"] == cli["out"] == "/data/run1"
    assert ours["counts"] == cli["counts"] == {"a": 1}
    assert ours["cfg"] == cli["cfg"]


async def test_s_is_not_offered_on_a_file_that_loads_or_read_only(odd_file: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain.pth"
    torch.save({"w": torch.ones(2)}, plain)
    app = CkptApp(str(plain))
    async with app.run_test(size=NARROW) as pilot:
        await loaded(pilot)
        assert "sanitize" not in {binding.action for _, binding, *_ in app.screen.active_bindings.values()}
        await settle(pilot, "s")
        assert "nothing to sanitize: torch.load(weights_only=True) loads it as it is" in status(app)
    app = CkptApp(str(odd_file), readonly=True)
    async with app.run_test(size=(160, 30)) as pilot:
        await loaded(pilot)
        # read-only: the command line is the way out
        assert "--sanitize` makes it load" in " ".join(header(app).split())
