"""``diff`` of tensors large enough to be compared chunk by chunk on the statistics threads (and block by block
in each chunk) says what it says of small ones, as torch computes it: the largest |a-b| over positions finite on
both sides and in their difference, allclose, and whether NaN or Inf positions differ (a NaN or an Inf agrees only
with itself at the same place)."""

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
    """(max |a-b| over the positions finite on both sides, allclose, NaN/Inf positions differ), allclose as
    torch.allclose(equal_nan=True) has it."""
    a, b = a.double(), b.double()
    finite = a.isfinite() & b.isfinite()
    agree = (a == b) | (a.isnan() & b.isnan())
    delta = (a[finite] - b[finite]).abs()
    counted = delta[delta.isfinite()]
    largest = counted.max().item() if counted.numel() else 0.0
    mismatch = bool((~finite & ~agree).any())
    close = torch.allclose(a, b, rtol=1e-5, atol=1e-8, equal_nan=True)
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
    elif kind == "inf on both sides":
        base[5] = other[5] = float("inf")
        other[CHUNK_ELEMENTS + 1] *= 1 + 1e-7
    elif kind == "+inf against -inf":
        base[CHUNK_ELEMENTS + 2], other[CHUNK_ELEMENTS + 2] = float("inf"), float("-inf")
    elif kind == "one element":
        other[CHUNK_ELEMENTS * 2 + 1] += 1.0
    return other


@pytest.mark.parametrize(
    "kind",
    [
        "moved",
        "close",
        "nan in one chunk",
        "nan on both sides",
        "inf in the last chunk",
        "inf on both sides",
        "+inf against -inf",
        "one element",
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_a_chunked_diff_says_what_torch_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, dtype: torch.dtype
) -> None:
    if kind in ("close", "inf on both sides") and dtype == torch.bfloat16:
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
