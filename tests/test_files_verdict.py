"""Files checked together (a folder, or several files on the command line): torch.load reads each on its own,
so every file's verdict counts; ``check`` exits 1 when any file is refused or cannot be told, and both the
text and the JSON say which file. The oracle is the real ``torch.load(weights_only=True)`` of each file."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from builders import torch_loads

from ckpt_tui.cli import main


def _model() -> dict[str, torch.Tensor]:
    return {"w": torch.ones(2, 3), "b": torch.zeros(3)}


def _nested() -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])


def _ranks(folder: Path, second: object) -> list[Path]:
    """rank0.pt loads; rank1.pt holds ``second`` beside the same model."""
    folder.mkdir()
    first, other = folder / "rank0.pt", folder / "rank1.pt"
    torch.save({"model": _model(), "epoch": 1}, first)
    torch.save({"model": _model(), "epoch": 1, "extra": second}, other)
    return [first, other]


SECONDS = {
    "numpy RNG state": (np.random.get_state()[1][:4], "refuses", "refused"),
    "a nested tensor": (_nested(), "cannot_tell", "cannot tell"),
}


@pytest.mark.parametrize("given", ["folder", "files"])
@pytest.mark.parametrize("second", SECONDS)
def test_a_file_torch_refuses_among_others_makes_check_fail_and_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], given: str, second: str
) -> None:
    value, answer, word = SECONDS[second]
    files = _ranks(tmp_path / "ckpts", value)
    assert torch_loads(files[0])
    assert not torch_loads(files[1]) or answer == "cannot_tell"
    args = [str(tmp_path / "ckpts")] if given == "folder" else [str(p) for p in files]
    assert main(["check", *args]) == 1
    out = capsys.readouterr().out
    assert f"[1 of 2 files: rank1.pt {word}]" in out
    assert main(["check", *args, "--json"]) == 1
    verdict = json.loads(capsys.readouterr().out)["weights_only"]
    assert verdict["answer"] == answer
    assert [(Path(f["path"]).name, f["answer"]) for f in verdict["files"]] == [
        ("rank0.pt", "loads"),
        ("rank1.pt", answer),
    ]


@pytest.mark.parametrize("given", ["folder", "files"])
def test_files_that_all_load_are_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str], given: str) -> None:
    files = _ranks(tmp_path / "ckpts", [1, 2])
    assert all(map(torch_loads, files))
    args = [str(tmp_path / "ckpts")] if given == "folder" else [str(p) for p in files]
    assert main(["check", *args, "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)["weights_only"]
    assert verdict["answer"] == "loads"
    assert [f["answer"] for f in verdict["files"]] == ["loads", "loads"]


def test_accelerates_rng_states_are_read_by_its_own_load_not_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Accelerate's load_state reads random_states_0.pkl with numpy allowlisted: no refusal of the folder."""
    folder = tmp_path / "save_state"
    folder.mkdir()
    torch.save(_model(), folder / "pytorch_model.bin")
    torch.save({"step": 3, "numpy_random_seed": np.random.get_state()}, folder / "random_states_0.pkl")
    assert not torch_loads(folder / "random_states_0.pkl")
    assert main(["check", str(folder), "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)["weights_only"]
    assert {Path(f["path"]).name: f["answer"] for f in verdict["files"]} == {
        "pytorch_model.bin": "loads",
        "random_states_0.pkl": "n/a",
    }
