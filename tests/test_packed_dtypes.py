"""Packed and opaque dtypes torch.load(weights_only=True) loads (``float4_e2m1fn_x2``, ``bits8``, ``bits16``,
``bits1x8``, ``bits2x4``, ``bits4x2``, the sub-byte integers ``int1``..``int7``/``uint1``..``uint7``, and a
``.safetensors`` F4 tensor, which the safetensors library loads as ``float4_e2m1fn_x2``): the tree shows their
shape, dtype and bytes as torch loads them, the verdict is torch's, a command that asks for values says in one
line that they cannot be decoded (a problem: ``check`` exits 1, whatever the format), and ``convert`` keeps
their bytes."""

from __future__ import annotations

import collections
import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_readers import StorageRef, pickle_with_pids, torch_zip_members, write_zip
from safetensors.torch import load_file, save_file

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


SUB_BYTE_INTS = [f"{kind}{bits}" for kind in ("int", "uint") for bits in range(1, 8)]


class _V3:
    """``torch._utils._rebuild_tensor_v3`` on an UntypedStorage: how a dtype without a storage class is pickled
    (torch.save refuses the sub-byte integers, "dtype torch.uint1 is not recognized"; torch.load loads them)."""

    def __init__(self, key: str, nbytes: int, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        stride = tuple(int(torch.tensor(shape[i + 1 :]).prod()) for i in range(len(shape)))
        storage = StorageRef(key=key, numel=nbytes, storage_type=torch.UntypedStorage)
        self.args = (storage, 0, shape, stride, False, collections.OrderedDict(), dtype)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return torch._utils._rebuild_tensor_v3, self.args


@pytest.mark.parametrize("name", SUB_BYTE_INTS)
def test_sub_byte_integers(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    data_pkl = pickle_with_pids({"t": _V3("0", 6, (2, 3), getattr(torch, name)), "n": _V3("1", 8, (2,), torch.float32)})
    records = {"0": bytes([1, 2, 3, 4, 5, 6]), "1": struct.pack("<2f", 1.0, 2.0)}
    path = write_zip(tmp_path / f"{name}.pth", torch_zip_members(data_pkl, records))
    loaded = torch.load(path, weights_only=True)["t"]
    assert loaded.dtype == getattr(torch, name) and loaded.untyped_storage().nbytes() == 6
    assert main(["info", "--json", str(path)]) == 0
    rows = {tuple(row["path"]): row for row in json.loads(capsys.readouterr().out)["tensors"]}
    assert rows[("t",)]["dtype"] == name and rows[("t",)]["shape"] == list(loaded.shape)
    assert rows[("t",)]["nbytes"] == loaded.numel() * loaded.element_size() == 6
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert f'ckpt["t"]: cannot read values of dtype {name}' in out and "torch.load loads it" in out
    assert main(["stats", str(path)]) == 1
    assert "cannot read values of dtype" in capsys.readouterr().out
    out_path = tmp_path / "out.pth"
    assert main(["convert", str(path), "-o", str(out_path)]) == 0
    written = torch.load(out_path, weights_only=True)["t"]
    assert written.dtype == loaded.dtype and written.view(torch.uint8).tolist() == loaded.view(torch.uint8).tolist()


def test_safetensors_fp4_is_read_as_the_library_loads_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "fp4.safetensors"
    packed = torch.arange(8, dtype=torch.uint8).reshape(2, 4).view(torch.float4_e2m1fn_x2)
    save_file({"t": packed, "n": torch.ones(2)}, path)
    loaded = load_file(path)["t"]
    assert main(["info", "--json", str(path)]) == 0
    rows = {tuple(row["path"]): row for row in json.loads(capsys.readouterr().out)["tensors"]}
    assert rows[("t",)]["dtype"] == "float4_e2m1fn_x2" and rows[("t",)]["shape"] == list(loaded.shape) == [2, 4]
    assert rows[("t",)]["nbytes"] == 8
    # the same exit as a .pth float4 tensor: the file is read, one tensor's values cannot be
    assert main(["check", str(path)]) == 1
    assert 'ckpt["t"]: cannot read values of dtype float4_e2m1fn_x2' in capsys.readouterr().out
    pth = tmp_path / "fp4.pth"
    torch.save({"t": packed}, pth)
    assert main(["check", str(pth)]) == 1
    converted = tmp_path / "converted.pth"
    assert main(["convert", str(path), "-o", str(converted)]) == 0
    written = torch.load(converted, weights_only=True)["t"]
    assert written.dtype == loaded.dtype and written.view(torch.uint8).tolist() == loaded.view(torch.uint8).tolist()


def test_safetensors_six_bit_floats_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    header = json.dumps({"t": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [0, 3]}}).encode()
    path = tmp_path / "fp6.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(3))
    assert main(["check", str(path)]) == 2
    assert "F6_E2M3" in capsys.readouterr().err
