"""NaN dict keys in diff: torch keeps two NaN keys apart (by identity); diff matches a NaN key with the one of
the same bits at the same place among them, so a file diffed with itself, or a copy, is identical."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from ckpt_tui.cli import main

NAN = float("nan")


def two_nan_keys(path: Path, second: torch.Tensor) -> Path:
    state = {float("nan"): torch.tensor([1.0, NAN, 3.0]), float("nan"): second}
    assert len(state) == 2
    torch.save(state, path)
    assert len(torch.load(path, weights_only=True)) == 2
    return path


def test_a_file_with_nan_keys_is_identical_to_itself_and_its_copy(tmp_path: Path, capsys) -> None:
    source = two_nan_keys(tmp_path / "a.pth", torch.tensor([4.0, 5.0, 6.0]))
    shutil.copy(source, tmp_path / "copy.pth")
    for other in (source, tmp_path / "copy.pth"):
        assert main(["diff", str(source), str(other)]) == 0
        assert capsys.readouterr().out.startswith("identical: 2 tensors")
    assert main(["diff", "--stats", str(source), str(tmp_path / "copy.pth")]) == 1  # (a NaN value: not unchanged)
    out = capsys.readouterr().out
    assert "2 layers compared" in out and "not compared" not in out


def test_nan_keys_are_matched_by_place_so_a_changed_value_is_found(tmp_path: Path, capsys) -> None:
    a = two_nan_keys(tmp_path / "a.pth", torch.tensor([4.0, 5.0, 6.0]))
    b = two_nan_keys(tmp_path / "b.pth", torch.tensor([4.0, 5.0, 7.0]))
    assert main(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "1 tensor differs in value" in out and "only in" not in out
