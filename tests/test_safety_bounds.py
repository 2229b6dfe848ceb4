"""Sizes are checked before anything is written or read, and what torch.load accepts is not refused:
a stride-0 view as big as a disk, an empty view whose offset lies past its record, a keys file
saved in the wrong encoding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from builders_readers import write_view_file

from ckpt_tui.cli import main


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out.out, out.err


def test_expanded_tensor_is_refused_as_safetensors_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a stride-0 view: 4 bytes in the file, 4 PiB once every element is written out
    source = tmp_path / "expanded.pth"
    torch.save({"w": torch.ones(1, 1).expand(1, 2**50)}, source)
    out_folder = tmp_path / "out"
    out_folder.mkdir()
    code, _, err = run_cli(["convert", str(source), "-o", str(out_folder / "w.safetensors")], capsys)
    assert code == 2
    assert err.count("\n") == 1 and "a view of 1125899906842624 elements over 1 stored" in err and ".pth" in err
    assert list(out_folder.iterdir()) == []  # no temporary file, no output


def test_expanded_tensor_is_checked_and_kept_as_a_view_in_pth(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "expanded.pth"
    torch.save({"w": torch.full((1, 1), 2.0).expand(3, 2**40)}, source)
    code, out, _ = run_cli(["check", str(source)], capsys)
    assert code == 0, out
    target = tmp_path / "copy.pth"
    code, _, _ = run_cli(["convert", str(source), "-o", str(target)], capsys)
    assert code == 0
    assert target.stat().st_size < 10_000
    loaded = torch.load(target, weights_only=True)["w"]
    assert loaded.shape == (3, 2**40) and loaded.stride() == (0, 0)
    assert float(loaded[2, 2**40 - 1]) == 2.0


def test_small_expanded_tensor_is_written_out_in_full_as_safetensors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import load_file

    source = tmp_path / "expanded.pth"
    torch.save({"w": torch.arange(3.0).reshape(3, 1).expand(3, 1000)}, source)
    target = tmp_path / "w.safetensors"
    code, _, _ = run_cli(["convert", str(source), "-o", str(target)], capsys)
    assert code == 0
    assert torch.equal(load_file(target)["w"], torch.arange(3.0).reshape(3, 1).expand(3, 1000))


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_empty_view_with_an_offset_past_its_record_converts_as_torch_loads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], suffix: str
) -> None:
    source = write_view_file(tmp_path / "empty.pth", offset=100, size=(0,), stride=(1,))
    assert torch.load(source, weights_only=True)["w"].shape == (0,)  # torch accepts it
    code, out, _ = run_cli(["check", str(source)], capsys)
    assert code == 0, out
    target = tmp_path / f"out{suffix}"
    code, _, err = run_cli(["convert", str(source), "-o", str(target)], capsys)
    assert code == 0, err
    if suffix == ".pth":
        loaded = torch.load(target, weights_only=True)["w"]
    else:
        from safetensors.torch import load_file

        loaded = load_file(target)["w"]
    assert loaded.shape == (0,) and loaded.dtype == torch.float32


@pytest.mark.parametrize(
    "content",
    [
        b"a [2]\n\xff\xfe b\n",
        b"encoder.weight [4, 4]\nd\xe9coder.weight [4]\n",  # latin-1, not UTF-8
    ],
)
def test_keys_file_in_the_wrong_encoding_names_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    checkpoint = tmp_path / "model.pth"
    torch.save({"a": torch.ones(2)}, checkpoint)
    keys = tmp_path / "keys.txt"
    keys.write_bytes(content)
    code, _, err = run_cli(["check", str(checkpoint), "--against", str(keys)], capsys)
    assert code == 2
    assert "not UTF-8 text" in err and "line 2" in err
    assert err.count("\n") == 1


def test_binary_reference_is_still_called_not_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = tmp_path / "model.pth"
    torch.save({"a": torch.ones(2)}, checkpoint)
    reference = tmp_path / "noise.bin"
    reference.write_bytes(bytes(range(256)) * 4)
    code, _, err = run_cli(["check", str(checkpoint), "--against", str(reference)], capsys)
    assert code == 2
    assert "not a checkpoint" in err


def test_a_safetensors_output_larger_than_the_free_space_is_refused_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil
    from collections import namedtuple

    source = tmp_path / "small.pth"
    torch.save({"w": torch.arange(4.0).expand(8, 4)}, source)  # a modest repeat: written out in full
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _folder: usage(1000, 990, 10))
    code, _, err = run_cli(["convert", str(source), "-o", str(tmp_path / "w.safetensors")], capsys)
    assert code == 2 and err.count("\n") == 1 and "needs" in err and "free" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.pth"]
