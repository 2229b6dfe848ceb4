"""Legacy storage views (``_use_new_zipfile_serialization=False`` files from before torch 0.4 kept them)
take their dtype, offset and extent from the view's own storage type, as torch's ``legacy_load`` does:
in the reader's values, the weights_only verdict and what ``convert`` writes.

torch.save no longer writes views, so the files are assembled here: a pickle whose persistent ids
carry ``(view_key, offset, size)`` with a storage type other than their root's.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_readers import StorageRef, View, legacy_bytes, pickle_with_pids

from ckpt_tui.cli import main
from ckpt_tui.core.model.tree import Tensor, iter_tensors
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.values.tensor_values import TensorReader


def view(key: str, storage_type: Any, numel: int, at: tuple[str, int, int] | None, size: int, offset: int = 0) -> View:
    """A tensor of ``size`` elements, ``offset`` into the (view) storage the persistent id names."""
    return View(StorageRef(key=key, numel=numel, storage_type=storage_type, extra=(at,)), offset, (size,), (1,))


def views_file(path: Path) -> Path:
    """Root "0": float32 0..7 (32 bytes), first named as a FloatStorage; root "1": 16 bytes first named
    through a LongStorage view. Views typed int32, float16, float64 and int64, one clipped by the root's end."""
    tensors = {
        "plain": view("0", torch.FloatStorage, 8, None, 8),
        "as_int": view("0", torch.IntStorage, 8, ("v1", 2, 4), 4),
        "as_half": view("0", torch.HalfStorage, 16, ("v2", 3, 6), 4, offset=1),
        "as_double": view("0", torch.DoubleStorage, 4, ("v3", 1, 3), 3),
        "clipped": view("0", torch.IntStorage, 8, ("v4", 6, 10), 2),
        "long_root": view("1", torch.LongStorage, 2, ("v5", 1, 1), 1),
        "same_view_again": view("0", torch.ByteStorage, 32, ("v1", 0, 32), 4),
    }
    floats = struct.pack("<8f", *range(8))
    longs = struct.pack("<2q", 7, -3)
    return path.write_bytes(legacy_bytes(pickle_with_pids(tensors), ["0", "1"], [(8, floats), (2, longs)])) and path


def our_tensors(path: Path) -> dict[str, tuple[str, list[Any]]]:
    checkpoint = open_checkpoint(str(path))
    found = {}
    for key_path, tensor in iter_tensors(checkpoint.root):
        assert isinstance(tensor, Tensor)
        values = TensorReader(tensor, checkpoint.byteorder).first(tensor.shape[0]).tolist()
        found[str(key_path[-1])] = (tensor.dtype, values)
    return found


def torch_tensors(path: Path) -> dict[str, tuple[str, list[Any]]]:
    loaded = torch.load(path, weights_only=True)
    return {key: (str(value.dtype).removeprefix("torch."), value.tolist()) for key, value in loaded.items()}


@pytest.fixture
def legacy(tmp_path: Path) -> Path:
    return views_file(tmp_path / "views.pth")


def test_views_read_as_torch_reads_them(legacy: Path) -> None:
    theirs = torch_tensors(legacy)
    assert theirs["as_int"][0] == "int32" and theirs["as_double"][0] == "float64"  # the views' own types
    assert len(theirs["clipped"][1]) == 2
    assert our_tensors(legacy) == theirs


def test_each_views_storage_offset_is_torchs(legacy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tensor on a view sits on the view's own storage in torch: its storage_offset counts from the view's
    start (info --json gave the offset into the root: 3 for a view at 2 and a tensor at 1)."""
    loaded = torch.load(legacy, weights_only=True)
    assert main(["info", "--json", str(legacy)]) == 0
    rows = {row["path"][-1]: row for row in json.loads(capsys.readouterr().out)["tensors"]}
    assert {key: rows[key]["storage_offset"] for key in loaded} == {
        key: tensor.storage_offset() for key, tensor in loaded.items()
    }
    assert rows["as_half"]["storage_offset"] == 1


def test_verdict_on_views_agrees_with_torch(legacy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.load(legacy, weights_only=True)  # loads
    main(["check", "--json", str(legacy)])
    verdict = json.loads(capsys.readouterr().out)["weights_only"]
    assert verdict["answer"] == "loads", verdict


def test_converted_views_load_as_the_source(legacy: Path, tmp_path: Path) -> None:
    output = tmp_path / "out.pth"
    assert main(["convert", str(legacy), "-o", str(output)]) == 0
    source, written = torch.load(legacy, weights_only=True), torch.load(output, weights_only=True)
    assert source.keys() == written.keys()
    for key, tensor in source.items():
        assert written[key].dtype == tensor.dtype and torch.equal(written[key], tensor), key


def test_tensor_past_its_view_is_refused_as_torch_refuses_it(tmp_path: Path) -> None:
    """A tensor longer than its view's extent: torch's set_() on the view fails; ckpt-tui never reads
    the root's bytes past the view as if they were the tensor's."""
    tensors = {
        "plain": view("0", torch.FloatStorage, 8, None, 8),
        "long": view("0", torch.IntStorage, 8, ("v", 2, 2), 4),
    }
    path = tmp_path / "past.pth"
    path.write_bytes(legacy_bytes(pickle_with_pids(tensors), ["0"], [(8, struct.pack("<8f", *range(8)))]))
    with pytest.raises(RuntimeError):
        torch.load(path, weights_only=True)
    assert main(["check", str(path)]) in (1, 2)
