"""``stats`` exits as ``check`` does: NaN/Inf in a sparse tensor's values or a quantized tensor's scales and a
tensor torch.load refuses are problems found (exit 1); a sparse tensor's first NaN is a position in it."""

from __future__ import annotations

import argparse
import json
import struct
import warnings
from pathlib import Path

import pytest
import torch
from builders_weights_only import Rebuilt, checked_answer, torch_answer
from builders_writer import global_op, storage_pid, text, write_zip_checkpoint

from ckpt_tui.cli import main

NAN = float("nan")


def run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str]:
    code = main([str(arg) for arg in args])
    return code, capsys.readouterr().out


def first_nan(tensor: torch.Tensor) -> list[int]:
    """Where torch says the first NaN is."""
    return torch.isnan(tensor.to_dense()).nonzero()[0].tolist()


@pytest.mark.parametrize(
    "tensor",
    [
        torch.sparse_coo_tensor(torch.tensor([[1, 0], [1, 1]]), torch.tensor([2.0, NAN]), (2, 2)),
        torch.sparse_coo_tensor(torch.tensor([[2, 0, 1]]), torch.tensor([[NAN, 1.0], [1.0, 2.0], [3.0, NAN]]), (3, 2)),
        torch.tensor([[0.0, 0.0, 1.0], [0.0, NAN, 0.0]]).to_sparse_csr(),
        torch.tensor([[0.0, 0.0, 1.0], [NAN, 0.0, 0.0]]).to_sparse_csc(),
    ],
    ids=["coo-unsorted", "coo-dense-part", "csr", "csc"],
)
def test_a_sparse_tensor_holding_nan_is_a_problem_at_torchs_position(
    tmp_path: Path, capsys, tensor: torch.Tensor
) -> None:
    torch.save({"sp": tensor}, tmp_path / "sp.pth")
    code, out = run(capsys, "stats", "--json", tmp_path / "sp.pth")
    assert code == 1
    assert json.loads(out)["problems"][0]["first_nan"] == first_nan(tensor)
    code, out = run(capsys, "check", "--json", tmp_path / "sp.pth")
    assert code == 1 and json.loads(out)["problems"][0]["first_nan"] == first_nan(tensor)


def test_a_quantized_tensor_with_a_nan_scale_is_a_problem(tmp_path: Path, capsys) -> None:
    q = torch.quantize_per_tensor(torch.tensor([1.0, 2.0]), scale=NAN, zero_point=0, dtype=torch.qint8)
    torch.save({"q": q}, tmp_path / "q.pth")
    assert torch.isnan(torch.load(tmp_path / "q.pth", weights_only=True)["q"].dequantize()).all()
    code, out = run(capsys, "stats", tmp_path / "q.pth")
    assert code == 1 and "quantizer scales" in out


def test_a_tensor_torch_refuses_is_a_problem_and_a_clean_file_is_not(tmp_path: Path, capsys) -> None:
    # a [2] view starting at element 3 of a 4-element storage: past its end
    view = (
        global_op("torch._utils._rebuild_tensor_v2")
        + b"("
        + storage_pid("0", 4)
        + b"K\x03K\x02\x85K\x01\x85\x89"
        + global_op("collections.OrderedDict")
        + b")Rt"
        + b"R"
    )
    source = write_zip_checkpoint(
        tmp_path / "past.pth", b"\x80\x02}(" + text("a") + view + b"u.", {"0": struct.pack("<4f", 1, 2, 3, 4)}
    )
    with pytest.raises(RuntimeError):
        torch.load(source, weights_only=True)
    code, out = run(capsys, "stats", source)
    assert code == 1 and "unreadable:" in out
    torch.save({"w": torch.ones(2), "sp": torch.ones(2, 2).to_sparse()}, tmp_path / "clean.pth")
    assert run(capsys, "stats", tmp_path / "clean.pth")[0] == 0


def _quantized_past_its_storage() -> Rebuilt:
    """A per-channel qint8 [3, 4] tensor as torch.save wrote it, its size made [3, 5] over the 12-byte storage."""
    scales, zero_points = torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0, 1, 2])
    q = torch.quantize_per_channel(torch.randn(3, 4), scales, zero_points, 0, torch.qint8)
    func, args = q.__reduce_ex__(2)
    return Rebuilt(func, (args[0], args[1], (3, 5), (5, 1), *args[4:]))


def _coo_values_of_the_wrong_size() -> Rebuilt:
    """A hybrid COO tensor of size [3, 3, 5] whose values are [3, 2] (torch's constructor wants [3, 5])."""
    indices = torch.tensor([[0, 1, 2], [2, 0, 1]])
    return Rebuilt(torch._utils._rebuild_sparse_tensor, (torch.sparse_coo, (indices, torch.ones(3, 2), (3, 3, 5))))


def _encrypted_flag(path: Path) -> None:
    """Set the 'encrypted' bit of storage record 1's central directory entry."""
    data = bytearray(path.read_bytes())
    entry = data.index(b"PK\x01\x02")
    while not data[entry + 46 : entry + 46 + struct.unpack_from("<H", data, entry + 28)[0]].endswith(b"/data/1"):
        entry = data.index(b"PK\x01\x02", entry + 4)
    data[entry + 8] |= 1
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("kind", ["quantized past its storage", "COO values of the wrong size", "encrypted record"])
def test_a_file_torch_refuses_for_a_tensor_or_record_is_a_problem_in_stats_as_in_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    path = tmp_path / "refused.pth"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "quantized past its storage":
            torch.save({"w": _quantized_past_its_storage()}, path)
        elif kind == "COO values of the wrong size":
            torch.save({"s": _coo_values_of_the_wrong_size()}, path)
        else:
            torch.save({"a": torch.arange(6.0), "b": torch.arange(100.0, 106.0)}, path)
            _encrypted_flag(path)
    assert torch_answer(path) == "refuses"
    assert checked_answer(path, capsys) == "refuses"
    code, out = run(capsys, "stats", path)
    assert code == 1 and "! [weights-only] torch.load(weights_only=True) refuses it: " in out
    code, out = run(capsys, "stats", "--json", path)
    assert code == 1 and [p["kind"] for p in json.loads(out)["problems"]] == ["weights-only"]


def test_globals_to_allowlist_are_checks_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # torch.load(weights_only=False) loads every value shown, and check names the global
    torch.save({"w": torch.ones(2), "args": argparse.Namespace(lr=0.1)}, tmp_path / "args.pth")
    assert torch_answer(tmp_path / "args.pth") == "refuses"
    assert run(capsys, "stats", tmp_path / "args.pth")[0] == 0
    assert run(capsys, "check", tmp_path / "args.pth")[0] == 1
