"""``diff`` compares the values torch loads: a tensor saved with its neg or conj view bit set loads negated or
conjugated, so it equals the materialised tensor (was "DIFFERENT ... max |a-b| 0") and differs from a tensor
saved with the same bytes and no bit (was "identical"). The oracle is ``torch.equal`` of the loaded tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ckpt_tui.cli import main

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int16]
COMPLEX = [torch.complex64, torch.complex128]


def _values(dtype: torch.dtype) -> torch.Tensor:
    base = torch.tensor([1.5, -2.25, 3.0, 7.0]) if dtype.is_floating_point else torch.tensor([1, -2, 3, 7])
    if dtype.is_complex:
        return torch.complex(torch.tensor([1.5, -2.0, 3.0]), torch.tensor([0.5, 4.0, -1.0])).to(dtype)
    return base.to(dtype)


def _viewed(dtype: torch.dtype, bit: str) -> torch.Tensor:
    values = _values(dtype)
    return values._neg_view() if bit == "neg" else values.conj()


CASES = [(dtype, "neg") for dtype in DTYPES + COMPLEX] + [(dtype, "conj") for dtype in COMPLEX]


@pytest.mark.parametrize(("dtype", "bit"), CASES, ids=str)
def test_diff_agrees_with_torch_equal_on_view_bits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dtype: torch.dtype, bit: str
) -> None:
    viewed = _viewed(dtype, bit)
    assert viewed.is_neg() or viewed.is_conj()
    files = {
        "viewed": {"w": viewed},
        "materialised": {"w": viewed.resolve_neg().resolve_conj().clone()},
        "same bytes, no bit": {"w": _values(dtype)},
    }
    paths = {}
    for name, obj in files.items():
        paths[name] = tmp_path / f"{name.replace(' ', '_').replace(',', '')}.pth"
        torch.save(obj, paths[name])
    loaded = {name: torch.load(path, weights_only=True)["w"] for name, path in paths.items()}
    for other in ("materialised", "same bytes, no bit"):
        equal = torch.equal(loaded["viewed"], loaded[other])
        assert main(["diff", str(paths["viewed"]), str(paths[other])]) == (0 if equal else 1), (other, equal)
        said = capsys.readouterr().out
        assert said.startswith("identical") == equal, said
    assert torch.equal(loaded["viewed"], loaded["materialised"])
    assert not torch.equal(loaded["viewed"], loaded["same bytes, no bit"])


def test_a_converted_copy_of_a_neg_tensor_is_identical_to_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "neg.pth"
    torch.save({"w": _viewed(torch.float32, "neg")}, source)
    out = tmp_path / "neg.safetensors"
    assert main(["convert", str(source), "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["diff", str(source), str(out)]) == 0


def _base_and_view(dtype: torch.dtype, bit: str) -> dict[str, torch.Tensor]:
    """A tensor and its neg or conj view saved together: one storage, two tensors torch loads as other values."""
    base = _values(dtype)
    viewed = base._neg_view() if bit == "neg" else base.conj()
    assert viewed.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    return {"w": base, "w_view": viewed}


def _loaded_equal(path: Path, expected: dict[str, torch.Tensor]) -> None:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        got = load_file(str(path))
    else:
        got = torch.load(path, weights_only=True)
    assert set(got) == set(expected), got
    for key, value in expected.items():
        assert torch.equal(got[key], value.resolve_neg().resolve_conj()), (key, got[key], value)


BASE_AND_VIEW = [(torch.float32, "neg"), (torch.bfloat16, "neg"), (torch.complex64, "conj"), (torch.complex64, "neg")]


@pytest.mark.parametrize(("dtype", "bit"), BASE_AND_VIEW, ids=str)
def test_a_view_with_a_bit_is_no_tie_of_its_base(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dtype: torch.dtype, bit: str
) -> None:
    """Written as .safetensors (one file and HF shards), averaged and counted, ``w_view`` is its own values
    (was stored as a tie of ``w``: ``w_view = w`` in __metadata__, its sign or conjugation lost)."""
    saved = _base_and_view(dtype, bit)
    source = tmp_path / "both.pth"
    torch.save(saved, source)
    expected = torch.load(source, weights_only=True)
    one = tmp_path / "one.safetensors"
    assert main(["convert", str(source), "-o", str(one)]) == 0
    assert "tied" not in capsys.readouterr().out
    _loaded_equal(one, expected)
    assert main(["diff", str(source), str(one)]) == 0, capsys.readouterr().out
    capsys.readouterr()
    shards = tmp_path / "shards"
    argv = ["convert", str(source), "-o", str(shards), "--format", "safetensors", "--max-shard-size", "8"]
    assert main(argv) == 0
    capsys.readouterr()
    assert len(list(shards.glob("model-*.safetensors"))) == 2
    assert main(["diff", str(source), str(shards)]) == 0, capsys.readouterr().out
    capsys.readouterr()
    averaged = tmp_path / "avg.pth"
    assert main(["average", str(source), str(source), "-o", str(averaged)]) == 0
    capsys.readouterr()
    _loaded_equal(averaged, expected)
    assert main(["info", "--json", str(source)]) == 0
    import json

    counted = json.loads(capsys.readouterr().out)
    assert counted["model_parameter_count"] == sum(t.numel() for t in expected.values()), counted
