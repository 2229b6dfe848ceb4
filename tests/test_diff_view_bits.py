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
