"""A folder of files saved together (Accelerate's ``save_state``) opens as one checkpoint.

The fixture was written by Accelerate itself (scripts/make_accelerate_fixture.py), with each file
as Accelerate's ``load_state`` reads it beside it as ground truth.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from test_distributed import assert_same, run

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model.tree import Tensor, iter_tensors
from ckpt_tui.core.operations.check import check_checkpoint
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.values.stats import tensor_stats

ACCELERATE = Path(__file__).parent / "fixtures" / "accelerate"
FOLDER = ACCELERATE / "save_state"


def expected() -> dict[str, Any]:
    return torch.load(ACCELERATE / "save_state.expected.pt", weights_only=True)


def test_save_state_folder_opens_with_a_key_per_file() -> None:
    checkpoint = open_checkpoint(FOLDER)
    assert checkpoint.format == "folder"
    assert list(checkpoint.root) == ["model", "optimizer", "random_states_0", "scheduler"]
    want = expected()
    for key, tensor in want["model"].items():
        got = checkpoint.root["model"][key]
        assert isinstance(got, Tensor) and list(got.shape) == list(tensor.shape)
    assert checkpoint.root["scheduler"]["last_epoch"] == want["scheduler"]["last_epoch"]


def test_save_state_folder_values_equal_what_accelerate_loads() -> None:
    checkpoint = open_checkpoint(FOLDER)
    want = expected()
    for path, tensor in iter_tensors(checkpoint.root["model"]):
        stats = tensor_stats(tensor)
        values = want["model"][path[-1]].double()
        assert stats.min == values.min().item() and stats.max == values.max().item()


def test_save_state_folder_checks_clean_and_extracts_the_model(tmp_path: Path, capsys: Any) -> None:
    report = check_checkpoint(open_checkpoint(FOLDER))
    assert report.ok, [p.message for p in report.problems]
    out = tmp_path / "model.pth"
    code, _, err = run(capsys, "convert", str(FOLDER), "--extract", "auto", "-o", str(out))
    assert code == 0, err
    model = torch.load(out, weights_only=True)
    assert_same(dict(sorted(model.items())), dict(sorted(expected()["model"].items())))  # safetensors: any order
    code, _, err = run(capsys, "convert", str(FOLDER), "--extract", "optimizer", "-o", str(tmp_path / "o.pth"))
    assert code == 0, err
    assert_same(torch.load(tmp_path / "o.pth", weights_only=True), expected()["optimizer"])


def test_any_file_of_the_folder_still_opens_alone() -> None:
    assert open_checkpoint(FOLDER / "optimizer.bin").format == "zip"
    assert open_checkpoint(FOLDER / "model.safetensors").format == "safetensors"


def test_a_folder_with_a_broken_file_names_it(tmp_path: Path) -> None:
    shutil.copytree(FOLDER, tmp_path / "state")
    (tmp_path / "state" / "scheduler.bin").write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(ReadError, match=r"scheduler\.bin"):
        open_checkpoint(tmp_path / "state")


def test_a_folder_without_checkpoint_files_is_one_line(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    code, _, err = run(capsys, "info", str(tmp_path))
    assert code == 2 and err.count("\n") == 1
    assert err.endswith(": no checkpoint in this folder: 1 text file (notes.txt)\n")
