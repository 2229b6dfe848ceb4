"""``diff`` of tensors large enough to be compared chunk by chunk on the statistics threads (and block by block
in each chunk) says what it says of small ones, as torch computes it: the largest |a-b| over positions finite on
both sides and in their difference, allclose, and whether NaN positions differ."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from ckpt_tui.cli import main
from ckpt_tui.core.values.tensor_values import CHUNK_ELEMENTS

SIZE = 2 * CHUNK_ELEMENTS + 12_345  # three chunks, the last one short


def expected(a: torch.Tensor, b: torch.Tensor) -> tuple[float, bool, bool]:
    """(max |a-b| over the finite differences where neither side is NaN, allclose, NaN positions differ)."""
    nan_a, nan_b = a.isnan(), b.isnan()
    both = ~(nan_a | nan_b)
    delta = (a[both].double() - b[both].double()).abs()
    finite = delta[delta.isfinite()]
    largest = finite.max().item() if finite.numel() else 0.0
    mismatch = bool((nan_a != nan_b).any())
    close = not mismatch and bool((delta <= 1e-8 + 1e-5 * b[both].double().abs()).all())
    return largest, close, mismatch


def edited(base: torch.Tensor, kind: str) -> torch.Tensor:
    other = base.clone()
    if kind == "moved":
        other += 1e-3 * torch.randn_like(base)
    elif kind == "close":
        other *= 1 + 1e-7
    elif kind == "nan in one chunk":
        other[CHUNK_ELEMENTS + 5] = float("nan")
        other[7] += 0.5
    elif kind == "nan on both sides":
        base[SIZE - 3] = other[SIZE - 3] = float("nan")
        other[CHUNK_ELEMENTS] += 2.0
    elif kind == "inf in the last chunk":
        other[SIZE - 1] = float("inf")
        other[100] -= 0.25
    elif kind == "one element":
        other[CHUNK_ELEMENTS * 2 + 1] += 1.0
    return other


@pytest.mark.parametrize(
    "kind", ["moved", "close", "nan in one chunk", "nan on both sides", "inf in the last chunk", "one element"]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_a_chunked_diff_says_what_torch_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, dtype: torch.dtype
) -> None:
    if kind == "close" and dtype == torch.bfloat16:
        pytest.skip("a relative change of 1e-7 rounds away in bfloat16")
    torch.manual_seed(0)
    base = torch.randn(SIZE).to(dtype)
    other = edited(base, kind)
    torch.save({"w": base}, tmp_path / "a.pth")
    torch.save({"w": other}, tmp_path / "b.pth")
    assert main(["diff", "--json", str(tmp_path / "a.pth"), str(tmp_path / "b.pth")]) == 1
    (row,) = json.loads(capsys.readouterr().out)["value_changes"]
    largest, close, mismatch = expected(base, other)
    assert math.isclose(row["max_abs_diff"], largest, rel_tol=1e-12, abs_tol=0.0)
    assert (row["allclose"], row["nan_mismatch"]) == (close, mismatch)


def test_a_chunked_file_against_itself_is_identical(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save({"w": torch.randn(SIZE)}, tmp_path / "a.pth")
    torch.save({"w": torch.load(tmp_path / "a.pth")["w"]}, tmp_path / "b.pth")
    assert main(["diff", "--json", str(tmp_path / "a.pth"), str(tmp_path / "b.pth")]) == 0
    assert json.loads(capsys.readouterr().out)["identical"]
