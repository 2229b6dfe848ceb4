"""Quantized tensors: their integer values are finite by type, so a NaN or Inf in what they dequantize to
sits in the quantizer's scales. ``check`` reads those (per tensor and per channel) and reports them, as it
reports a NaN in a dense tensor; the oracle is ``dequantize()`` of what torch loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ckpt_tui.cli import main

NAN, INF = float("nan"), float("inf")


def _per_tensor(scale: float) -> torch.Tensor:
    return torch._make_per_tensor_quantized_tensor(torch.tensor([1, -2, 3], dtype=torch.int8), scale, 0)


def _per_channel(scales: list[float]) -> torch.Tensor:
    values = torch.ones(len(scales), 2, dtype=torch.int8)
    zero_points = torch.zeros(len(scales), dtype=torch.int64)
    return torch._make_per_channel_quantized_tensor(values, torch.tensor(scales, dtype=torch.float64), zero_points, 0)


CASES = {
    "per tensor 0.5": lambda: _per_tensor(0.5),
    "per tensor NaN": lambda: _per_tensor(NAN),
    "per tensor Inf": lambda: _per_tensor(INF),
    "per channel finite": lambda: _per_channel([0.5, 0.25]),
    "per channel one NaN": lambda: _per_channel([0.5, NAN]),
    "per channel one Inf": lambda: _per_channel([INF, 0.25]),
}


@pytest.mark.parametrize("name", CASES)
def test_a_quantized_tensor_whose_scales_make_nan_or_inf_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    path = tmp_path / "q.pth"
    torch.save({"q": CASES[name](), "w": torch.ones(2)}, path)
    dequantized = torch.load(path, weights_only=True)["q"].dequantize()
    bad = not bool(torch.isfinite(dequantized).all())
    assert bad == ("finite" not in name and "0.5" not in name)  # the cases say what they are
    code = main(["check", str(path), "--json"])
    problems = [p for p in json.loads(capsys.readouterr().out)["problems"] if p["kind"] in ("nan", "inf")]
    assert (code, len(problems)) == ((1, 1) if bad else (0, 0)), problems
    if bad:
        assert problems[0]["path"] == ["q"] and "quantizer scales" in problems[0]["message"]
