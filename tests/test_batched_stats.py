"""Statistics of many small tensors read in batches equal the per-tensor pass's, figure for figure."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from builders import BATCHED_DTYPES, save_by_suffix, version_guard_aside, write_safetensors

from ckpt_tui.core.errors import Cancelled
from ckpt_tui.core.model.tree import iter_tensors
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.values import batched_values, tensor_table
from ckpt_tui.core.values.batched_stats import batched_stats
from ckpt_tui.core.values.stats import TensorStats, tensor_stats
from ckpt_tui.core.values.tensor_table import tensor_paths, tensor_rows

DTYPES = BATCHED_DTYPES
EXACT = ("count", "finite", "nan", "posinf", "neginf", "zeros", "min", "max", "absmax", "histogram", "sampled")
CLOSE = ("mean", "std", "norm")


def mixed_state() -> dict[str, torch.Tensor]:
    """Small tensors of several dtypes and ranges: NaN/Inf, empty, constant, shifted, views, tied."""
    torch.manual_seed(0)
    state: dict[str, torch.Tensor] = {}
    for i in range(160):
        dtype = DTYPES[i % len(DTYPES)]
        scale = [1.0, 1e-3, 1e4, 3.0][i % 4]
        tensor = (torch.randn(i % 9 + 1, i % 7 + 1) * scale + (i % 5) * scale).to(dtype)
        if dtype.is_floating_point and i % 6 == 0:
            tensor.view(-1)[(i * 7) % tensor.numel()] = [math.nan, math.inf, -math.inf][i % 3]
        state[f"t{i}"] = tensor
    state["empty"] = torch.empty(0, 4)
    state["constant"] = torch.full((5, 5), 2.5)
    state["zeros"] = torch.zeros(33)
    state["one"] = torch.tensor([7.0])
    state["near_one"] = 1 + torch.randn(300) * 1e-6  # the mean dwarfs the spread
    state["edges"] = torch.linspace(-1, 1, 49)  # values on the bin edges
    state["huge"] = torch.tensor([3e38, -3e38, 1.0])  # sums overflow float32 but not float64
    state["tiny"] = torch.tensor([1e-44, 2e-44, 0.0])  # subnormal range
    state["big"] = torch.randn(600, 600)  # more than the batch: the per-tensor pass
    state["many"] = torch.randn(40000)
    return state


def assert_same(fast: TensorStats, exact: TensorStats) -> None:
    for name in EXACT:
        assert getattr(fast, name) == getattr(exact, name), name
    for name in CLOSE:
        assert getattr(fast, name) == pytest.approx(getattr(exact, name), rel=0, abs=0), name
    assert np.array_equal(np.array(fast.first), np.array(exact.first), equal_nan=True)


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_batched_stats_equal_the_per_tensor_pass(tmp_path: Path, suffix: str) -> None:
    path = save_by_suffix(mixed_state(), tmp_path / f"m{suffix}")
    tensors = [t for _, t in iter_tensors(open_checkpoint(path).root)]
    found = batched_stats(tensors)
    answered = 0
    for tensor, fast in zip(tensors, found, strict=True):
        if fast is not None:
            assert_same(fast, tensor_stats(tensor))
            answered += 1
    assert answered >= 120


def test_views_with_nan_or_inf_or_not_row_major_go_the_exact_way(tmp_path: Path) -> None:
    base = torch.arange(24.0).reshape(4, 6)
    state = {"t": base.t(), "cols": base[:, 1::2], "row": base[1], "nan": torch.tensor([1.0, math.nan])}
    state["fp8"] = torch.ones(4).to(torch.float8_e4m3fn)
    state["neg"] = torch.randn(3, dtype=torch.complex64).conj().imag
    torch.save(state, tmp_path / "v.pth")
    tensors = [t for _, t in iter_tensors(open_checkpoint(tmp_path / "v.pth").root)]
    found = dict(zip(state, batched_stats(tensors), strict=True))
    assert found["row"] is not None
    assert [k for k, v in found.items() if v is None] == ["t", "cols", "nan", "fp8", "neg"]


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_stats_rows_equal_rows_read_one_by_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str) -> None:
    state = mixed_state()
    if suffix == ".pth":
        shared = torch.randn(40)
        state.update({"head": shared[:20], "tail": shared[20:], "again": shared[20:], "tied": state["t3"]})
    path = save_by_suffix(state, tmp_path / f"m{suffix}")
    monkeypatch.setattr(batched_values, "BATCH_BYTES", 3000)  # many batches
    tensors = tensor_paths(open_checkpoint(path).root)
    seen: list[tuple[int, int]] = []
    fast = list(tensor_rows(tensors, progress=lambda done, total: seen.append((done, total))))
    monkeypatch.setattr(tensor_table, "planned_stats", lambda *a: {})
    exact = list(tensor_rows(tensors))
    assert [row.path for row in fast] == [row.path for row in exact]
    for a, b in zip(fast, exact, strict=True):
        assert a.reason == b.reason
        assert (a.stats is None) == (b.stats is None)
        if a.stats is not None and b.stats is not None:
            assert_same(a.stats, b.stats)
    assert seen[-1][0] == seen[-1][1] == sum(t.nbytes for _, t in tensors)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)


def test_truncated_file_rows_say_unreadable_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensor_table, "MIN_BATCHED", 1)
    path = write_safetensors({f"t{i}": torch.randn(64) for i in range(50)}, tmp_path / "cut.safetensors")
    whole = path.read_bytes()
    opened = open_checkpoint(path)
    version_guard_aside(opened.root)  # (a file cut after opening is refused: test_file_changed.py; here, short reads)
    tensors = tensor_paths(opened.root)
    path.write_bytes(whole[: len(whole) - 1000])  # cut after opening: the reads come up short
    fast = [(row.stats, row.reason) for row in tensor_rows(tensors)]
    monkeypatch.setattr(tensor_table, "planned_stats", lambda *a: {})
    exact = [(row.stats, row.reason) for row in tensor_rows(tensors)]
    assert [reason for _, reason in fast] == [reason for _, reason in exact]
    assert sum(reason is not None for _, reason in fast) == 4
    assert fast[0][0] is not None
    assert_same(fast[0][0], exact[0][0])  # type: ignore[arg-type]


def test_batches_can_be_cancelled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensor_table, "MIN_BATCHED", 1)
    monkeypatch.setattr(tensor_table, "tensor_stats", None)  # never reached: the first batch is cancelled
    path = write_safetensors({f"t{i}": torch.randn(64) for i in range(50)}, tmp_path / "c.safetensors")
    tensors = tensor_paths(open_checkpoint(path).root)
    with pytest.raises(Cancelled):
        list(tensor_rows(tensors, cancelled=lambda: True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_ranges_whose_bin_width_underflows_are_binned_as_the_per_tensor_pass_bins_them(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    """Subnormal ranges (an Adam ``exp_avg_sq`` after one step): the bin width underflows in the stored
    type; the histogram is still the per-tensor one, and it comes at once (this once looped forever)."""
    tiny = [
        torch.tensor([1.4e-45, 0.0, 0.0, 0.0]),
        torch.tensor([0.0, 1e-45, 3e-45, 5e-45, 7e-45]),
        torch.tensor([1e-40, 1e-39, 0.0]),
        torch.tensor([1e-38, 3e-38, 2e-38]),
        torch.tensor([-3e38, 3e38, 0.0]),
    ]
    state = {f"tiny{i}": t.to(dtype) for i, t in enumerate(tiny)}
    state.update({f"p{i}": torch.randn(4).to(dtype) for i in range(100)})  # enough views to batch
    torch.save(state, tmp_path / "m.pth")
    rows = list(tensor_rows(tensor_paths(open_checkpoint(tmp_path / "m.pth").root)))
    for row in rows:
        alone = tensor_stats(row.tensor)
        assert row.stats is not None
        assert (row.stats.histogram, row.stats.min, row.stats.max) == (alone.histogram, alone.min, alone.max)
