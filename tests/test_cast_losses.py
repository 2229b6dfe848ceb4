"""convert --dtype says what a narrower dtype could not hold, counted as torch's own cast loses it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ckpt_tui.cli.entry import main


@pytest.mark.parametrize(("option", "dtype"), [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_values_a_cast_cannot_hold_are_counted_as_torch_loses_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(4096, generator=gen, dtype=torch.float64) * torch.logspace(-50, 50, 4096, dtype=torch.float64)
    wide[:3] = torch.tensor([float("nan"), float("inf"), 0.0], dtype=torch.float64)
    torch.save({"w": wide, "ok": torch.ones(3)}, tmp_path / "a.pth")
    out = tmp_path / "a16.pth"
    assert main(["convert", str(tmp_path / "a.pth"), "-o", str(out), "--dtype", option]) == 0
    text = capsys.readouterr().out
    narrow = torch.load(out, weights_only=True)["w"]
    assert torch.equal(narrow.view(torch.int16), wide.to(dtype).view(torch.int16))
    overflowed = int((wide.isfinite() & narrow.isinf()).sum())
    flushed = int(((wide != 0) & ~wide.isnan() & (narrow == 0)).sum())
    assert overflowed and flushed
    assert f"{overflowed} finite values past its range became ±Inf" in text
    assert f"{flushed} nonzero values below its smallest became 0" in text and 'ckpt["w"]' in text


def test_a_cast_that_loses_nothing_says_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save({"w": torch.randn(64)}, tmp_path / "a.pth")
    assert main(["convert", str(tmp_path / "a.pth"), "-o", str(tmp_path / "b.pth"), "--dtype", "fp16"]) == 0
    assert "lost values" not in capsys.readouterr().out
