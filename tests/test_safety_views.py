"""A view torch.load refuses (negative or mixed-sign strides, or reaching past its storage at either
end) is never called OK and never written: ``convert`` refuses it in every output format, with or
without a cast, and names ``--drop``. Views torch.load accepts convert to files equal to the source."""

from __future__ import annotations

import struct
import warnings
from pathlib import Path

import pytest
import torch
from builders_readers import legacy_bytes, legacy_view, pickle_with_pids, write_view_file

from ckpt_tui.cli import main

FOUR = struct.pack("<4f", 0.0, 1.0, 2.0, 3.0)

# (storage offset, size, stride) of a view of a 4-element float32 storage
REFUSED = {
    "negative_stride": (3, (4,), (-1,)),
    "negative_stride_below_the_record": (2, (4,), (-1,)),
    "mixed_sign_strides": (1, (2, 2), (2, -1)),
    "mixed_sign_below_the_record": (0, (2, 2), (2, -1)),
    "one_element_past_the_end": (1, (4,), (1,)),
    "huge_stride": (0, (2,), (2**62,)),
    "stride_past_int64": (0, (3,), (2**63 - 1,)),
    "offset_past_the_end": (4, (), ()),
    "stride_zero_past_the_end": (4, (5,), (0,)),
    "huge_offset": (2**62, (1,), (1,)),
}
ACCEPTED = {
    "transposed": (0, (2, 2), (1, 2)),
    "negative_stride_on_a_dimension_of_one": (3, (1, 1), (1, -1)),
    "stride_zero": (3, (2, 5), (0, 0)),
    "empty_with_a_huge_stride": (0, (0, 5), (2**62, 1)),
    "empty_past_the_end": (100, (0,), (1,)),
}


def view_file(folder: Path, layout: str, offset: int, size: tuple[int, ...], stride: tuple[int, ...]) -> Path:
    path = folder / f"{layout}.pth"
    if layout == "zip":
        return write_view_file(path, offset, size, stride)
    obj = pickle_with_pids({"w": legacy_view("0", 4, offset, size, stride)})
    path.write_bytes(legacy_bytes(obj, ["0"], [(4, FOUR)]))
    return path


def torch_load(path: Path) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(path, weights_only=False)["w"]


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out.out, out.err


@pytest.mark.parametrize("layout", ["zip", "legacy"])
@pytest.mark.parametrize("name", list(REFUSED))
def test_view_torch_refuses_is_never_ok_and_never_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], layout: str, name: str
) -> None:
    source = view_file(tmp_path, layout, *REFUSED[name])
    with pytest.raises(RuntimeError):
        torch_load(source)
    code, out, _ = run_cli(["check", str(source)], capsys)
    assert code == 1, out
    out_folder = tmp_path / "out"
    out_folder.mkdir()
    for target, extra in (("w.pth", []), ("half.pth", ["--dtype", "float16"]), ("w.safetensors", [])):
        code, _, err = run_cli(["convert", str(source), "-o", str(out_folder / target), *extra], capsys)
        assert code == 2, (target, err)
        assert err.count("\n") == 1
    assert list(out_folder.iterdir()) == []


def test_refusal_names_the_tensor_and_the_way_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = view_file(tmp_path, "zip", *REFUSED["one_element_past_the_end"])
    code, _, err = run_cli(["convert", str(source), "-o", str(tmp_path / "w.pth")], capsys)
    assert code == 2
    assert 'ckpt["w"]' in err and "--drop" in err
    code, _, err = run_cli(["convert", str(source), "-o", str(tmp_path / "w.pth"), "--drop", "w"], capsys)
    assert code == 0, err
    assert torch.load(tmp_path / "w.pth", weights_only=True) == {}


@pytest.mark.parametrize("layout", ["zip", "legacy"])
@pytest.mark.parametrize("name", list(ACCEPTED))
def test_view_torch_accepts_converts_to_equal_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], layout: str, name: str
) -> None:
    source = view_file(tmp_path, layout, *ACCEPTED[name])
    expected = torch_load(source)
    code, out, _ = run_cli(["check", str(source)], capsys)
    assert code == 0, out
    for target in ("w.pth", "w.safetensors"):
        code, _, err = run_cli(["convert", str(source), "-o", str(tmp_path / target)], capsys)
        assert code == 0, (target, err)
    assert torch.equal(torch.load(tmp_path / "w.pth", weights_only=True)["w"], expected)
    from safetensors.torch import load_file

    assert torch.equal(load_file(tmp_path / "w.safetensors")["w"], expected)
