"""A "written as it is" output holds everything the source holds: Python state, classes, metadata, hooks.

What torch writes for a tensor with attributes (``_rebuild_from_type_v2``) or a Parameter with attributes
(``_rebuild_parameter_with_state``) is written back the same way; anything the writer cannot write
faithfully refuses the write, naming where it sits (``tests/test_writer_refusal.py`` for payloads).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from builders_weights_only import Scaled
from builders_writer import floats, from_type, global_op, tensor_op, text, torch_load, write_zip_checkpoint

from ckpt_tui.cli import main
from ckpt_tui.core.readers.open import open_checkpoint


def convert(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main(["convert", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_tensor_and_parameter_attributes_are_written_back(tmp_path: Path, capsys) -> None:
    tagged = torch.arange(6.0)
    tagged.note = "ema"
    tagged.scales = {"a": [1, 2], "b": (3.5, None)}
    param = torch.nn.Parameter(torch.ones(3))
    param.tag = "frozen"
    torch.save({"t": tagged, "view": tagged[2:], "p": param, "plain": torch.zeros(2)}, tmp_path / "in.pth")
    code, out, err = convert(capsys, tmp_path / "in.pth", "-o", tmp_path / "out.pth")
    assert code == 0 and "written as it is" in out, err
    loaded = torch_load(tmp_path / "out.pth")
    assert loaded["t"].note == "ema" and loaded["t"].scales == {"a": [1, 2], "b": (3.5, None)}
    assert torch.equal(loaded["t"], tagged) and torch.equal(loaded["view"], tagged[2:])
    assert not hasattr(loaded["view"], "note")  # a view of it is its own tensor, without them, as in the source
    assert isinstance(loaded["p"], torch.nn.Parameter) and loaded["p"].tag == "frozen"
    assert type(loaded["plain"]) is torch.Tensor


def test_attributes_of_a_tensor_inside_a_training_checkpoint_survive_an_edit(tmp_path: Path, capsys) -> None:
    weight = torch.ones(2, 2)
    weight.origin = "teacher"
    torch.save({"model": {"module.w": weight}, "epoch": 3}, tmp_path / "in.pth")
    code, _, err = convert(capsys, tmp_path / "in.pth", "-o", tmp_path / "out.pth", "--strip-prefix", "module.")
    assert code == 0, err
    assert torch_load(tmp_path / "out.pth")["model"]["w"].origin == "teacher"


def test_a_tensor_subclass_is_refused_naming_its_class_not_written_as_a_plain_tensor(tmp_path: Path, capsys) -> None:
    torch.save({"s": torch.ones(2).as_subclass(Scaled)}, tmp_path / "in.pth")
    code, _, err = convert(capsys, tmp_path / "in.pth", "-o", tmp_path / "out.pth")
    assert code == 2 and "builders_weights_only.Scaled" in err and 'ckpt["s"].python_type' in err
    assert not (tmp_path / "out.pth").exists()


def test_a_tensor_subclass_in_safetensors_output_is_said_to_be_left_out(tmp_path: Path, capsys) -> None:
    torch.save({"s": torch.ones(2).as_subclass(Scaled)}, tmp_path / "in.pth")
    code, out, err = convert(capsys, tmp_path / "in.pth", "-o", tmp_path / "out.safetensors")
    assert code == 0, err
    assert "left out (safetensors holds tensor values only): tensor subclass of 's'" in out


@pytest.mark.parametrize(
    ("metadata", "read_back"),
    [
        (b"}(" + text("note") + b"\x88u", {"note": True}),  # not a conj/neg bit
        (b"]", []),  # not a dict (torch ignores it, being empty)
    ],
)
def test_tensor_metadata_that_is_not_flags_is_written_as_it_is(
    tmp_path: Path, capsys, metadata: bytes, read_back: object
) -> None:
    data = b"\x80\x02}(" + text("w") + tensor_op(metadata=metadata) + b"u."
    source = write_zip_checkpoint(tmp_path / "in.pth", data, {"0": floats(4)})
    code, _, err = convert(capsys, source, "-o", tmp_path / "out.pth")
    assert code == 0, err
    assert open_checkpoint(tmp_path / "out.pth").root["w"].metadata == read_back
    assert torch_load(tmp_path / "out.pth")["w"].tolist() == torch_load(source)["w"].tolist()


def test_from_type_with_a_plain_tensor_class_and_empty_state_is_the_plain_tensor(tmp_path: Path, capsys) -> None:
    data = b"\x80\x02}(" + text("w") + from_type(tensor_op(), global_op("torch.Tensor"), b"}") + b"u."
    source = write_zip_checkpoint(tmp_path / "in.pth", data, {"0": floats(4)})
    code, _, err = convert(capsys, source, "-o", tmp_path / "out.pth")
    assert code == 0, err
    loaded = torch_load(tmp_path / "out.pth")["w"]
    assert type(loaded) is torch.Tensor and loaded.tolist() == [0.0, 1.0, 2.0, 3.0]
