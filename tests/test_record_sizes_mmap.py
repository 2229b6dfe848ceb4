"""A storage record of the wrong size: torch.load refuses it, torch.load(mmap=True) loads it; check says both."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from ckpt_tui.cli import main


def resized(path: Path, change: int) -> Path:
    """A torch.save of 12 floats whose storage record is ``change`` bytes longer (or shorter)."""
    source = path.with_suffix(".src")
    torch.save({"w": torch.arange(12, dtype=torch.float32)}, source)
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as new:
        for info in old.infolist():
            data = old.read(info)
            if info.filename.endswith("/data/0"):
                data = data[:change] if change < 0 else data + bytes(change)
            new.writestr(info.filename, data)
    return path


@pytest.mark.parametrize("change", [-8, -1, 1, 4])
def test_verdict_refuses_and_notes_what_mmap_does(change: int, tmp_path: Path, capsys: Any) -> None:
    path = resized(tmp_path / "w.pth", change)
    with pytest.raises(RuntimeError, match="does not match expected size"):
        torch.load(path, weights_only=True)
    assert torch.load(path, weights_only=True, mmap=True)["w"].shape == (12,)
    assert main(["check", str(path), "--json"]) == 1
    verdict = json.loads(capsys.readouterr().out)["weights_only"]
    assert verdict["answer"] == "refuses"
    assert any("torch.load(mmap=True)" in note and "does not compare sizes" in note for note in verdict["notes"])
