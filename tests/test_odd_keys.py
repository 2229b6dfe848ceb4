"""Keys that are not strings (None, a bool, a float, bytes, a tuple) beside the strings that print alike:
``--json`` paths keep them apart, and the Python form messages print names each for an edit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ckpt_tui.cli.entry import main

KEYS = [None, "None", 1, "1", True, "True", 0.5, "0.5", (1, 2), "(1, 2)", b"x", "b'x'"]


def odd_keys(path: Path) -> Path:
    # (True and 1 are one dict key in Python: True is saved under its own dict)
    state = {key: torch.full((1,), float(i)) for i, key in enumerate(KEYS) if key is not True}
    state["flags"] = {True: torch.ones(1), "True": torch.zeros(1)}
    torch.save(state, path)
    return path


def test_json_paths_keep_each_key_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = odd_keys(tmp_path / "k.pth")
    assert main(["info", "--json", str(path)]) == 0
    paths = [json.dumps(t["path"]) for t in json.loads(capsys.readouterr().out)["tensors"]]
    assert len(paths) == len(set(paths)) == len(KEYS) + 1
    assert "[null]" in paths and '["None"]' in paths and '["flags", true]' in paths and '[{"repr": "b\'x\'"}]' in paths
    assert main(["stats", "--json", str(path)]) == 0
    assert [json.dumps(t["path"]) for t in json.loads(capsys.readouterr().out)["tensors"]] == paths


@pytest.mark.parametrize(
    ("python", "gone"),
    [
        ("ckpt[None]", None),
        ('ckpt["None"]', "None"),
        ("ckpt[0.5]", 0.5),
        ("ckpt[(1, 2)]", (1, 2)),
        ("ckpt[b'x']", b"x"),
    ],
)
def test_the_python_form_names_the_one_key_for_an_edit(tmp_path: Path, python: str, gone: object) -> None:
    path = odd_keys(tmp_path / "k.pth")
    out = tmp_path / "out.pth"
    assert main(["convert", str(path), "-o", str(out), "--drop", python]) == 0
    loaded = torch.load(out, weights_only=True)
    before = torch.load(path, weights_only=True)
    assert gone not in loaded and set(before) - set(loaded) == {gone}
    flags = tmp_path / "flags.pth"
    assert main(["convert", str(path), "-o", str(flags), "--drop", "ckpt['flags'][True]"]) == 0
    assert list(torch.load(flags, weights_only=True)["flags"]) == ["True"]


def test_info_names_every_place_of_refused_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np = pytest.importorskip("numpy")
    state = {"w": torch.ones(2), "mean": np.zeros(3, np.float32), "rng": ("MT", np.arange(4, dtype=np.uint32))}
    torch.save(state, tmp_path / "n.pth")
    assert main(["info", str(tmp_path / "n.pth")]) == 0
    assert 'numpy at ckpt["mean"], ckpt["rng"][1]' in capsys.readouterr().out
