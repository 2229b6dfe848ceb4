"""Where a tensor's NaN and Inf are, as torch indexes them: check's message and JSON, and stats' exit code."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ckpt_tui.core.operations.check import check_checkpoint
from ckpt_tui.core.readers.open import open_checkpoint


def _first_place(t: torch.Tensor, mask: torch.Tensor) -> list[int] | None:
    """torch's own answer: the first True of the mask in row-major order, as an index."""
    hits = mask.reshape(-1).nonzero()
    if not len(hits):
        return None
    flat = int(hits[0])
    return [int(i) for i in torch.unravel_index(torch.tensor(flat), t.shape)] if t.dim() else []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_first_nan_and_inf_are_where_torch_finds_them(tmp_path: Path, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(7)
    tensors = {}
    for n in range(12):
        shape = tuple(int(s) for s in torch.randint(1, 6, (1 + n % 3,), generator=gen))
        t = torch.randn(shape, generator=gen)
        flat = t.reshape(-1)
        picks = torch.randint(0, flat.numel(), (3,), generator=gen)
        flat[picks[0]] = math.nan if n % 4 else flat[picks[0]]
        flat[picks[1]] = math.inf if n % 3 else -math.inf
        tensors[f"t{n}"] = t.to(dtype)
    # a transposed view: positions are those of the view torch loads, not of its storage
    tensors["view"] = tensors["t5"].reshape(-1)[:4].reshape(2, 2).t() if tensors["t5"].numel() >= 4 else tensors["t5"]
    torch.save(tensors, tmp_path / "f.pth")
    report = check_checkpoint(open_checkpoint(tmp_path / "f.pth")).to_json()
    loaded = torch.load(tmp_path / "f.pth", weights_only=True)
    by_key = {p["path"][0]: p for p in report["problems"]}
    for key, t in loaded.items():
        wide = t.double()
        expected_nan, expected_inf = _first_place(wide, wide.isnan()), _first_place(wide, wide.isinf())
        if expected_nan is None and expected_inf is None:
            assert key not in by_key
            continue
        problem = by_key[key]
        assert problem["first_nan"] == expected_nan and problem["first_inf"] == expected_inf, key
        signs = (problem["posinf"], problem["neginf"])
        assert signs == (int((wide == math.inf).sum()), int((wide == -math.inf).sum()))


def test_check_says_the_sign_and_place_in_one_line(tmp_path: Path) -> None:
    w = torch.tensor([[1.0, math.nan], [math.inf, -math.inf]])
    torch.save({"w": w, "b": torch.tensor(-math.inf)}, tmp_path / "f.pth")
    messages = [p.message for p in check_checkpoint(open_checkpoint(tmp_path / "f.pth")).problems]
    assert messages == [
        'ckpt["w"]: 1 NaN, 2 Inf (1 +Inf, 1 -Inf) of 4 values; first NaN at [0, 1], first Inf at [1, 0]',
        'ckpt["b"]: 1 -Inf of 1 values; first Inf at []',
    ]


def _stats(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "ckpt_tui", "stats", str(path), *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_stats_exits_1_on_nan_or_inf_as_the_readme_says(tmp_path: Path) -> None:
    torch.save({"w": torch.tensor([1.0, math.inf, -2.0]), "ok": torch.ones(2)}, tmp_path / "bad.pth")
    torch.save({"ok": torch.ones(2)}, tmp_path / "good.pth")
    text = _stats(tmp_path / "bad.pth")
    assert text.returncode == 1, text.stderr
    # min and max are of the finite values; the table says so under it
    assert "of the finite values" in text.stdout
    as_json = _stats(tmp_path / "bad.pth", "--json")
    assert as_json.returncode == 1
    row = json.loads(as_json.stdout)["tensors"][0]
    assert (row["posinf"], row["neginf"], row["min"], row["max"]) == (1, 0, -2.0, 1.0)
    assert _stats(tmp_path / "bad.pth", "--csv").returncode == 1
    good = _stats(tmp_path / "good.pth")
    assert good.returncode == 0 and "finite" not in good.stdout
