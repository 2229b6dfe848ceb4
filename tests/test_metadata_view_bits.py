"""Tensor metadata read as torch.load reads it: a ``neg``/``conj`` key sets its bit whatever its value, and
metadata that is not a dict is a tensor torch refuses (one line, never a traceback)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from builders_writer import global_op, storage_pid, text, torch_load, write_zip_checkpoint

from ckpt_tui.cli import main


def run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def with_metadata(path: Path, metadata: bytes, record: bytes, numel: int, storage: str = "torch.FloatStorage") -> Path:
    """``{'a': _rebuild_tensor_v2(storage, 0, (numel,), (1,), False, OrderedDict(), metadata)}``."""
    tensor = (
        global_op("torch._utils._rebuild_tensor_v2")
        + b"("
        + storage_pid("0", numel, storage)
        + b"K\x00K"
        + bytes([numel])
        + b"\x85K\x01\x85\x89"
        + global_op("collections.OrderedDict")
        + b")R"
        + metadata
        + b"tR"
    )
    return write_zip_checkpoint(path, b"\x80\x02}(" + text("a") + tensor + b"u.", {"0": record})


NEG_FALSE = b"}(" + text("neg") + b"\x89u"
CONJ_FALSE = b"}(" + text("conj") + b"\x89u"
NEG_TRUE = b"}(" + text("neg") + b"\x88u"


def stats_row(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, object]:
    code, out, err = run(capsys, "stats", "--json", path)
    assert code == 0, err
    row: dict[str, object] = json.loads(out)["tensors"][0]
    return row


def test_a_neg_key_set_to_false_still_negates_as_torch_loads_it(tmp_path: Path, capsys) -> None:
    source = with_metadata(tmp_path / "negfalse.pth", NEG_FALSE, struct.pack("<6f", -2, -1, 0, 1, 2, 3), 6)
    loaded = torch_load(source)["a"]
    assert loaded.is_neg()
    expected = loaded.resolve_neg().double()
    row = stats_row(capsys, source)
    assert (row["min"], row["max"], row["mean"]) == (expected.min().item(), expected.max().item(), -0.5)
    # a plain file of the values torch loads is the same file to diff, and so is the {"neg": True} twin
    torch.save({"a": loaded.resolve_neg()}, tmp_path / "plain.pth")
    with_metadata(tmp_path / "negtrue.pth", NEG_TRUE, struct.pack("<6f", -2, -1, 0, 1, 2, 3), 6)
    for other in ("plain.pth", "negtrue.pth"):
        code, out, err = run(capsys, "diff", source, tmp_path / other)
        assert code == 0 and out.startswith("identical"), out + err
    code, out, err = run(capsys, "diff", "--stats", "--json", source, tmp_path / "plain.pth")
    layer = json.loads(out)["layers"][0]
    assert code == 0 and layer["relative_change"] == 0.0 and layer["cosine"] == pytest.approx(1.0), out + err


def test_a_neg_false_tensor_is_converted_and_averaged_as_torch_loads_it(tmp_path: Path, capsys) -> None:
    from safetensors.torch import load_file

    source = with_metadata(tmp_path / "negfalse.pth", NEG_FALSE, struct.pack("<6f", -2, -1, 0, 1, 2, 3), 6)
    loaded = torch_load(source)["a"].resolve_neg()
    code, _, err = run(capsys, "convert", source, "-o", tmp_path / "out.safetensors")
    assert code == 0, err
    assert torch.equal(load_file(tmp_path / "out.safetensors")["a"], loaded)
    torch.save({"a": loaded}, tmp_path / "plain.pth")
    code, _, err = run(capsys, "average", source, tmp_path / "plain.pth", "-o", tmp_path / "avg.pth")
    assert code == 0, err
    assert torch.equal(torch_load(tmp_path / "avg.pth")["a"].resolve_neg(), loaded)


def test_a_conj_key_set_to_false_still_conjugates(tmp_path: Path, capsys) -> None:
    record = struct.pack("<6f", 1, 2, 3, 4, 5, -6)
    source = with_metadata(tmp_path / "conjfalse.pth", CONJ_FALSE, record, 3, "torch.ComplexFloatStorage")
    loaded = torch_load(source)["a"]
    assert loaded.is_conj()
    torch.save({"a": loaded.resolve_conj()}, tmp_path / "plain.pth")
    code, out, err = run(capsys, "diff", source, tmp_path / "plain.pth")
    assert code == 0 and out.startswith("identical"), out + err


def test_a_negated_uint8_tensor_wraps_as_torch_negates_it(tmp_path: Path, capsys) -> None:
    source = with_metadata(tmp_path / "u8.pth", NEG_TRUE, bytes([0, 1, 2, 3, 250, 0]), 6, "torch.ByteStorage")
    expected = torch_load(source)["a"].resolve_neg().double()
    assert expected.tolist() == [0, 255, 254, 253, 6, 0]
    row = stats_row(capsys, source)
    assert (row["min"], row["max"], row["mean"]) == (0.0, 255.0, expected.mean().item())


@pytest.mark.parametrize("metadata", [b"K\x05", text("neg")], ids=["int", "str"])
def test_metadata_that_is_not_a_dict_is_a_tensor_torch_refuses(tmp_path: Path, capsys, metadata: bytes) -> None:
    source = with_metadata(tmp_path / "bad.pth", metadata, struct.pack("<4f", 1, 2, 3, 4), 4)
    with pytest.raises(Exception, match="expected dict"):
        torch_load(source)
    code, out, err = run(capsys, "stats", source)
    assert code == 1
    assert "Traceback" not in out + err
    assert "tensor metadata is of type" in out and "torch.load refuses it" in out
    _, out, err = run(capsys, "diff", "--stats", source, source)
    assert "Traceback" not in out + err and "torch.load refuses it" in out


def test_a_bool_tensor_with_the_neg_bit_is_unreadable_as_in_torch(tmp_path: Path, capsys) -> None:
    """torch.load loads it, then cannot read its values ("neg_cpu" not implemented for 'Bool'): stats says the
    tensor is unreadable (exit 1), never a table of the raw bools."""
    neg = b"}(" + text("neg") + b"\x88u"
    path = with_metadata(tmp_path / "b.pth", neg, b"\x01\x00\x01", 3, "torch.BoolStorage")
    loaded = torch_load(path)["a"]
    with pytest.raises(RuntimeError):
        loaded.tolist()
    code, out, _ = run(capsys, "stats", path)
    assert code == 1 and "unreadable: a bool tensor saved with the neg bit" in out, out
