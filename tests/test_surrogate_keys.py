"""A str key holding lone surrogates (``'\\ud83d\\ude00'``, which torch.save pickles and torch.load loads) and the
key ``'😀'`` are two keys: in ``--json`` the first is ``{"repr": "'\\\\ud83d\\\\ude00'"}`` (JSON's ``"\\ud83d\\ude00"``
decodes to ``😀``), and that repr in the Python path form (``ckpt['\\ud83d\\ude00']``) names it in ``--drop``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ckpt_tui.cli import main

PAIR = "\ud83d\ude00"


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "pair.pth"
    torch.save({PAIR: torch.tensor([1.0, float("nan")]), "😀": torch.tensor([4.0, 5.0])}, path)
    assert list(torch.load(path, weights_only=True)) == [PAIR, "😀"]
    return path


def test_json_paths_tell_the_keys_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path)
    assert main(["check", "--json", str(path)]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert [problem["path"] for problem in problems] == [[{"repr": repr(PAIR)}]]
    assert main(["stats", "--json", str(path)]) == 1
    paths = [row["path"] for row in json.loads(capsys.readouterr().out)["tensors"]]
    assert paths == [[{"repr": repr(PAIR)}], ["😀"]]
    assert main(["info", "--json", str(path)]) == 0
    assert [row["path"] for row in json.loads(capsys.readouterr().out)["tensors"]] == paths


def test_the_repr_round_trips_through_drop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path)
    assert main(["check", "--json", str(path)]) == 1
    (key,) = json.loads(capsys.readouterr().out)["problems"][0]["path"]
    out = tmp_path / "out.pth"
    assert main(["convert", str(path), "-o", str(out), "--drop", f"ckpt[{key['repr']}]"]) == 0
    assert list(torch.load(out, weights_only=True)) == ["😀"]
