"""diff and diff --stats on many small tensors, compared in batches, report exactly what pair-by-pair reading does."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from builders import BATCHED_DTYPES, save_by_suffix, version_guard_aside

from ckpt_tui.core.operations import diff as diff_module
from ckpt_tui.core.operations.diff import diff
from ckpt_tui.core.operations.layer_change import layer_change
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.values import batched_values

DTYPES = BATCHED_DTYPES


def pair_states() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Two versions of many small tensors: equal, nudged, far apart, NaN/Inf on one or both sides,
    other dtypes and shapes, keys on one side only."""
    torch.manual_seed(0)
    a: dict[str, torch.Tensor] = {}
    b: dict[str, torch.Tensor] = {}
    for i in range(200):
        dtype = DTYPES[i % len(DTYPES)]
        tensor = (torch.randn(i % 9 + 1, i % 5 + 2) * [1.0, 1e-3, 1e4][i % 3]).to(dtype)
        other = tensor.clone()
        kind = i % 7
        if kind == 1 and dtype.is_floating_point:
            other = (other.double() * (1 + 1e-7)).to(dtype)  # close
        elif kind == 2:
            other = (other.double() + 3).to(dtype)  # far
        elif kind == 3 and dtype.is_floating_point:
            tensor.view(-1)[0] = math.nan
            other.view(-1)[0] = math.nan  # bit-identical with a NaN
        elif kind == 4 and dtype.is_floating_point:
            other.view(-1)[-1] = [math.nan, math.inf, -math.inf][i % 3]
        elif kind == 5 and dtype.is_floating_point:
            other = other.to(torch.float32 if dtype != torch.float32 else torch.float64)  # another dtype
        a[f"t{i}"], b[f"t{i}"] = tensor, other
    a["reshaped"], b["reshaped"] = torch.zeros(4, 6), torch.zeros(6, 4)
    a["only_a"], b["only_b"] = torch.ones(3), torch.ones(3)
    a["empty"], b["empty"] = torch.empty(0), torch.empty(0)
    a["cancel"] = torch.tensor([3e38, -3e38, 1.0])
    b["cancel"] = torch.tensor([3e38, -3e38, 2.0])
    return a, b


def both_ways(monkeypatch: pytest.MonkeyPatch, first: Path, second: Path) -> tuple[dict, dict, dict, dict]:
    """(diff, diff --stats) JSON read in batches, then pair by pair."""
    a, b = open_checkpoint(first), open_checkpoint(second)
    monkeypatch.setattr(batched_values, "BATCH_BYTES", 2000)  # many batches
    pair_by_pair: list[str] = []
    real = diff_module._compare_values
    monkeypatch.setattr(diff_module, "_compare_values", lambda x, *rest: pair_by_pair.append(x.dtype) or real(x, *rest))
    fast = diff(a, b).to_json(), layer_change(a, b).to_json()
    assert 0 < len(pair_by_pair) < 100  # most pairs were compared in batches
    monkeypatch.setattr(batched_values, "MIN_BATCHED", 1 << 30)  # no batches at all
    exact = diff(a, b).to_json(), layer_change(a, b).to_json()
    return fast[0], exact[0], fast[1], exact[1]


@pytest.mark.parametrize("suffixes", [(".pth", ".safetensors"), (".safetensors", ".safetensors"), (".pth", ".pth")])
def test_batched_diff_and_layer_change_equal_pair_by_pair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffixes: tuple[str, str]
) -> None:
    a, b = pair_states()
    if suffixes == (".pth", ".pth"):
        shared = torch.randn(40)
        a.update({"head": shared[:20], "tail": shared[20:], "tied": a["t0"], "cols": torch.randn(4, 6)[:, ::2]})
        b.update({"head": shared[:20] * 2, "tail": shared[20:], "tied": b["t0"], "cols": torch.randn(4, 6)[:, ::2]})
    first, second = save_by_suffix(a, tmp_path / f"a{suffixes[0]}"), save_by_suffix(b, tmp_path / f"b{suffixes[1]}")
    fast_diff, exact_diff, fast_change, exact_change = both_ways(monkeypatch, first, second)
    assert fast_diff == exact_diff
    assert fast_change == exact_change
    assert exact_diff["identical_tensors"] > 30 and len(exact_diff["value_changes"]) > 30
    assert sum(row["nonfinite"] > 0 for row in exact_change["layers"]) > 5


def test_truncated_file_pairs_are_unreadable_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = pair_states()
    first, second = save_by_suffix(a, tmp_path / "a.safetensors"), save_by_suffix(b, tmp_path / "b.safetensors")
    opened = open_checkpoint(first), open_checkpoint(second)
    version_guard_aside(opened[1].root)  # (a file cut after opening is refused; here, its short reads)
    whole = second.read_bytes()
    second.write_bytes(whole[: len(whole) - 300])  # cut after opening: the last reads come up short
    monkeypatch.setattr(batched_values, "BATCH_BYTES", 2000)
    fast = diff(*opened).to_json(), layer_change(*opened).to_json()
    monkeypatch.setattr(batched_values, "MIN_BATCHED", 1 << 30)
    exact = diff(*opened).to_json(), layer_change(*opened).to_json()
    assert fast == exact
    assert exact[0]["unreadable"]
