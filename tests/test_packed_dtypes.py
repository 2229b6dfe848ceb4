"""Packed and opaque dtypes torch.load(weights_only=True) loads (``float4_e2m1fn_x2``, ``bits8``, ``bits16``,
``bits1x8``, ``bits2x4``, ``bits4x2``): the tree shows their shape, dtype and bytes, the verdict is torch's, a
command that asks for values says in one line that they cannot be decoded, and ``convert`` keeps their bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ckpt_tui.cli import main

DTYPES = ["float4_e2m1fn_x2", "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2"]


def _save(tmp_path: Path, name: str) -> Path:
    dtype = getattr(torch, name)
    raw = torch.tensor([1, 2, 3, 4, 5, 6], dtype=torch.uint8)
    tensor = raw.view(torch.int16).view(dtype) if dtype.itemsize == 2 else raw.view(dtype)
    path = tmp_path / f"{name}.pth"
    torch.save({"t": tensor, "n": torch.tensor([1.0, 2.0])}, path)
    assert torch.load(path, weights_only=True)["t"].dtype == dtype
    return path


@pytest.mark.parametrize("name", DTYPES)
def test_tree_verdict_and_values(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    path = _save(tmp_path, name)
    expected = torch.load(path, weights_only=True)["t"]
    assert main(["info", "--json", str(path)]) == 0
    rows = {tuple(row["path"]): row for row in json.loads(capsys.readouterr().out)["tensors"]}
    row = rows[("t",)]
    assert row["dtype"] == name
    assert row["shape"] == list(expected.shape)
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert f'ckpt["t"]: cannot read values of dtype {name}' in out
    assert "torch.load loads it" in out
    assert "corrupt" not in out


@pytest.mark.parametrize("name", DTYPES)
def test_convert_keeps_the_bytes(tmp_path: Path, name: str) -> None:
    path = _save(tmp_path, name)
    out = tmp_path / "out.pth"
    assert main(["convert", str(path), "-o", str(out)]) == 0
    before, after = torch.load(path, weights_only=True)["t"], torch.load(out, weights_only=True)["t"]
    assert after.dtype == before.dtype and after.shape == before.shape
    assert after.view(torch.uint8).tolist() == before.view(torch.uint8).tolist()
