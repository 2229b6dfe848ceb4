"""float64 values whose squares leave float64's range (past ~1e154, below ~1e-154): stats and diff --stats give
the figures torch gives on values scaled into range, and every --json output is strict JSON (no NaN tokens)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from ckpt_tui.cli import main
from ckpt_tui.cli.render import print_json


def strict(text: str) -> object:
    """JSON as a strict parser reads it (``NaN``/``Infinity`` refused)."""

    def refuse(token: str) -> None:
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def run_json(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, object]:
    code = main([str(arg) for arg in args])
    return code, strict(capsys.readouterr().out)


def scaled_norm(t: torch.Tensor) -> float:
    """torch's L2 norm of values scaled into range (torch's own overflows to inf for 1e300)."""
    top = t.abs().max().item()
    return torch.linalg.vector_norm(t / top).item() * top


@pytest.mark.parametrize("value", [1e300, 1e200, 1e-300, -3e-170])
@pytest.mark.parametrize("numel", [4, 5000])
def test_stats_of_float64_values_past_the_squares_range(tmp_path: Path, capsys, value: float, numel: int) -> None:
    torch.manual_seed(0)
    t = value * (1 + torch.rand(numel, dtype=torch.float64))
    t[0] = value  # (so ties to torch's std are not the only case: a spread too)
    torch.save({"w": t, "flat": torch.full((numel,), value, dtype=torch.float64)}, tmp_path / "x.pth")
    code, data = run_json(capsys, "stats", "--json", tmp_path / "x.pth")
    assert code == 0
    rows = {row["path"][0]: row for row in data["tensors"]}  # type: ignore[index]
    assert rows["flat"]["std"] == 0.0 and rows["flat"]["norm"] == pytest.approx(
        abs(value) * math.sqrt(numel), rel=1e-12
    )
    assert rows["w"]["norm"] == pytest.approx(scaled_norm(t), rel=1e-12)
    # torch.std overflows for these too: taken on the values scaled by |value|
    assert rows["w"]["std"] == pytest.approx((t / abs(value)).std().item() * abs(value), rel=1e-9)
    assert rows["w"]["mean"] == pytest.approx(t.mean().item(), rel=1e-12)


@pytest.mark.parametrize("value", [1e200, 1e-300])
@pytest.mark.parametrize("numel", [4, 5000, 2_500_000])  # (the last in chunks, each read by the thread summing it)
def test_diff_stats_of_float64_values_past_the_squares_range(tmp_path: Path, capsys, value: float, numel: int) -> None:
    a = torch.full((numel,), value, dtype=torch.float64)
    torch.save({"w": a}, tmp_path / "a.pth")
    torch.save({"w": a * 1.5}, tmp_path / "b.pth")
    code, data = run_json(capsys, "diff", "--stats", "--json", tmp_path / "a.pth", tmp_path / "b.pth")
    layer = data["layers"][0]  # type: ignore[index]
    assert code == 1
    assert layer["relative_change"] == pytest.approx(0.5, rel=1e-12) and layer["cosine"] == pytest.approx(1.0)
    assert layer["norm_a"] == pytest.approx(scaled_norm(a), rel=1e-12)
    assert layer["norm_b"] == pytest.approx(scaled_norm(a * 1.5), rel=1e-12)


@pytest.mark.parametrize("numel", [8, 2_500_000])
def test_an_all_nan_layer_has_no_relative_change(tmp_path: Path, capsys, numel: int) -> None:
    torch.save({"w": torch.full((numel,), float("nan")), "v": torch.ones(3)}, tmp_path / "a.pth")
    torch.save({"w": torch.ones(numel), "v": torch.ones(3)}, tmp_path / "b.pth")
    code, data = run_json(capsys, "diff", "--stats", "--json", tmp_path / "a.pth", tmp_path / "b.pth")
    rows = {row["path"][0]: row for row in data["layers"]}  # type: ignore[index]
    assert code == 1
    assert rows["w"]["relative_change"] is None and rows["w"]["cosine"] is None and rows["w"]["nonfinite"] == numel
    assert rows["v"]["relative_change"] == 0.0


def test_json_never_holds_nan_tokens(capsys) -> None:
    print_json({"x": float("nan"), "y": [float("inf"), 1.5, {"z": -float("inf")}]})
    assert strict(capsys.readouterr().out) == {"x": None, "y": [None, 1.5, {"z": None}]}


def test_the_norm_series_says_which_files_hold_nan_or_inf(tmp_path: Path, capsys) -> None:
    nan, inf = float("nan"), float("inf")
    torch.save({"w": torch.ones(4), "v": torch.ones(3)}, tmp_path / "s1.pth")
    torch.save({"w": torch.full((4,), nan), "v": torch.tensor([1.0, inf, 2.0])}, tmp_path / "s2.pth")
    torch.save({"w": torch.ones(4) * 2, "v": torch.ones(3)}, tmp_path / "s3.pth")
    files = [tmp_path / f"s{i}.pth" for i in (1, 2, 3)]
    code, data = run_json(capsys, "diff", "--stats", "--json", *files)
    rows = {row["path"][0]: row for row in data["series"]}  # type: ignore[index]
    assert code == 1
    assert rows["w"]["nonfinite"] == [0, 4, 0] and rows["w"]["norms"][1] is None
    assert rows["v"]["nonfinite"] == [0, 1, 0] and rows["v"]["norms"][1] == pytest.approx(math.sqrt(5))
    assert main(["diff", "--stats", *map(str, files)]) == 1
    out = capsys.readouterr().out
    assert "w in 2. (4 NaN/Inf), v in 2. (1 NaN/Inf)" in out
    assert "▁!█" in out  # w: the NaN file marked, not drawn absent
    # the header's columns stand apart, aligned with the rows' numbers
    head = next(line for line in out.splitlines() if line.split()[:1] == ["layer"])
    assert head.split() == ["layer", "first", "last", "last/first", "across"]
    row = next(line for line in out.splitlines() if line.split()[:1] == ["v"])
    assert row.index("×1") + 2 == head.index("last/first") + len("last/first")


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_magnitudes_are_float64_and_finite_where_torch_says_finite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dtype: torch.dtype
) -> None:
    """|3e38+3e38j| overflows complex64's float32 abs, |1e308+1e308j| float64's: both parts are finite, so
    torch.isfinite holds and neither is an Inf (was an Inf in stats and check, exit 1, for a finite complex64)."""
    big = 3e38 if dtype == torch.complex64 else 1e308
    torch.save({"c": torch.tensor([complex(big, big), 1 + 2j, -3j], dtype=dtype)}, tmp_path / "c.pth")
    loaded = torch.load(tmp_path / "c.pth", weights_only=True)["c"]
    assert bool(torch.isfinite(loaded).all())
    code, data = run_json(capsys, "stats", "--json", tmp_path / "c.pth")
    row = data["tensors"][0]  # type: ignore[index]
    assert code == 0 and row["nan"] == row["inf"] == 0
    assert row["min"] == loaded.to(torch.complex128).abs().min().item()  # 2.23606797749979, not float32's
    assert row["max"] == pytest.approx(min(loaded.to(torch.complex128).abs().max().item(), 1.7976931348623157e308))
    assert main(["check", str(tmp_path / "c.pth")]) == 0


@pytest.mark.parametrize("dtype", [torch.complex32, torch.complex64, torch.complex128])
def test_a_complex_element_with_an_inf_and_a_nan_part_counts_as_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dtype: torch.dtype
) -> None:
    """torch's isnan and isinf both hold for (Inf, NaN): stats counts it in each, and check finds both (was Inf
    only, from its magnitude)."""
    nan, inf = float("nan"), float("inf")
    values = [complex(inf, nan), 1 + 1j, complex(nan, 2), complex(-inf, 0), complex(nan, -inf)]
    torch.save({"c": torch.tensor(values, dtype=dtype)}, tmp_path / "c.pth")
    loaded = torch.load(tmp_path / "c.pth", weights_only=True)["c"]
    code, data = run_json(capsys, "stats", "--json", tmp_path / "c.pth")
    row = data["tensors"][0]  # type: ignore[index]
    assert code == 1
    assert (row["nan"], row["inf"]) == (int(torch.isnan(loaded).sum()), int(torch.isinf(loaded).sum()))
    code, report = run_json(capsys, "check", "--json", tmp_path / "c.pth")
    problem = report["problems"][0]  # type: ignore[index]
    assert code == 1 and problem["first_nan"] == torch.isnan(loaded).nonzero()[0].tolist()
