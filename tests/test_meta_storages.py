"""Storages a persistent id places on ``meta``: torch reads the record, makes a meta storage without data (which
``set_`` grows), and keeps none of it for the key's later uses, which read the record again at their own location."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_readers import StorageRef, View, pickle_with_pids, torch_zip_members, write_zip

from ckpt_tui.cli import main
from ckpt_tui.core.operations.check import check_checkpoint
from ckpt_tui.core.readers.open import open_checkpoint

DATA = struct.pack("<2f", float("nan"), 1.0)
CASES = {
    "meta_then_cpu": [("a", "meta", 0, (1,), (1,)), ("b", "cpu", 0, (2,), (1,))],
    "cpu_then_meta": [("a", "cpu", 0, (2,), (1,)), ("b", "meta", 0, (1,), (1,))],
    "meta_past_its_storage": [("a", "meta", 0, (4,), (1,))],
    "meta_twice": [("a", "meta", 0, (2,), (1,)), ("b", "meta", 1, (1,), (1,))],
}


def build(path: Path, uses: list[tuple[str, str, int, tuple[int, ...], tuple[int, ...]]]) -> Path:
    """One record of two float32 values, each use a view of it under the key "0" at its own location."""
    root = {
        key: View(StorageRef(numel=2, location=where), offset, size, stride)
        for key, where, offset, size, stride in uses
    }
    return write_zip(path, torch_zip_members(pickle_with_pids(root), {"0": DATA}))


@pytest.mark.parametrize("case", CASES)
def test_devices_values_and_verdict_are_torchs(case: str, tmp_path: Path, capsys: Any) -> None:
    path = build(tmp_path / f"{case}.pth", CASES[case])
    loaded = torch.load(path, weights_only=True)
    checkpoint = open_checkpoint(path)
    for key, tensor in loaded.items():
        assert checkpoint.root[key].device == tensor.device.type, key
    report = check_checkpoint(checkpoint)
    assert report.weights_only is not None and report.weights_only.loads
    nan_keys = {key for key, t in loaded.items() if t.device.type == "cpu" and bool(t.isnan().any())}
    assert {p.path[-1] for p in report.problems if p.kind == "nan"} == nan_keys
    # a convert with no edits writes what torch loads: meta stays meta, data stays data
    out = tmp_path / "out.pth"
    assert main(["convert", str(path), "-o", str(out)]) == 0
    again = torch.load(out, weights_only=True)
    for key, tensor in loaded.items():
        assert again[key].device == tensor.device, key
        if tensor.device.type == "cpu":
            assert torch.equal(again[key].nan_to_num(), tensor.nan_to_num()), key


@pytest.mark.parametrize("numel", [-1, 2**63, 10**30, 2.0])
@pytest.mark.parametrize("location", ["cpu", "cpu:0", "meta"])
def test_a_later_use_of_a_key_is_its_first_storage_whatever_it_says(
    numel: object, location: str, tmp_path: Path
) -> None:
    # torch's loaded_storages is looked up before a use's size or location is read
    again = StorageRef(numel=numel, location=location)  # type: ignore[arg-type]
    root = {"a": View(StorageRef(numel=2), 0, (2,), (1,)), "b": View(again, 0, (1,), (1,))}
    path = write_zip(tmp_path / "again.pth", torch_zip_members(pickle_with_pids(root), {"0": DATA}))
    loaded = torch.load(path, weights_only=True)
    checkpoint = open_checkpoint(path)
    assert checkpoint.root["b"].storage is checkpoint.root["a"].storage
    assert checkpoint.root["b"].device == loaded["b"].device.type == "cpu"
    report = check_checkpoint(checkpoint)
    assert report.weights_only is not None and report.weights_only.loads
    assert {p.path[-1] for p in report.problems if p.kind == "nan"} == {"a", "b"}


def test_safetensors_says_why_it_cannot_hold_a_meta_tensor(tmp_path, capsys):
    """A meta tensor is shape and dtype only: a .safetensors output is refused for the reason that holds (it said
    float32 dense tensors cannot be written); .pth keeps it, as torch loads it."""
    path = tmp_path / "meta.pt"
    torch.save({"m": torch.empty(3, 4, device="meta")}, path)
    assert main(["convert", str(path), "-o", str(tmp_path / "m.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "a tensor with no values (a meta tensor" in err and "float32 dense" not in err, err
    assert main(["convert", str(path), "-o", str(tmp_path / "m.pth")]) == 0
    loaded = torch.load(tmp_path / "m.pth", weights_only=True)["m"]
    assert loaded.is_meta and loaded.shape == (3, 4) and loaded.dtype == torch.float32
