"""A ``collections.Counter`` holding tensors (``Counter.__reduce__`` pickles it as ``Counter(dict)``) shows as the
mapping ``torch.load`` builds: its keys are children (``ckpt["a"]``), not an ``args[0]`` dict; ``convert`` writes it
back equal under ``torch.load(weights_only=True)``, a Counter still."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from ckpt_tui.cli import main


def test_a_counter_shows_its_keys_and_converts_back_equal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = {"counts": Counter({"a": torch.tensor([5.0, float("nan"), 7.0]), "b": 3}), "w": torch.ones(2)}
    path = tmp_path / "c.pth"
    torch.save(saved, path)
    assert main(["info", "--json", str(path)]) == 0
    paths = [row["path"] for row in json.loads(capsys.readouterr().out)["tensors"]]
    assert ["counts", "a"] in paths
    assert main(["check", str(path)]) == 1
    assert 'ckpt["counts"]["a"]: 1 NaN' in capsys.readouterr().out
    out = tmp_path / "out.pth"
    assert main(["convert", str(path), "-o", str(out)]) == 0
    loaded = torch.load(out, weights_only=True)
    assert type(loaded["counts"]) is Counter and list(loaded["counts"]) == ["a", "b"]
    assert torch.allclose(loaded["counts"]["a"], saved["counts"]["a"], equal_nan=True) and loaded["counts"]["b"] == 3
    # an edit at the key the tree shows applies to the Counter torch builds
    dropped = tmp_path / "dropped.pth"
    assert main(["convert", str(path), "-o", str(dropped), "--drop", 'ckpt["counts"]["a"]']) == 0
    assert torch.load(dropped, weights_only=True)["counts"] == Counter({"b": 3})
