"""The batched NaN/Inf scan answers exactly as reading each tensor on its own does."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from builders import version_guard_aside, write_safetensors

from ckpt_tui.core.model.tree import iter_tensors
from ckpt_tui.core.operations import check as check_module
from ckpt_tui.core.operations.check import check_checkpoint
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.values import finite_scan
from ckpt_tui.core.values.stats import tensor_stats

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.uint8, torch.bool]


def mixed_state() -> dict[str, torch.Tensor]:
    """Small tensors of several dtypes, some with one NaN or Inf anywhere in them, some views."""
    torch.manual_seed(0)
    state: dict[str, torch.Tensor] = {}
    for i in range(120):
        dtype = DTYPES[i % len(DTYPES)]
        tensor = (torch.randn(i % 7 + 1, i % 5 + 1) * 3).to(dtype)
        if dtype.is_floating_point and i % 4 == 0:
            flat = tensor.view(-1)
            flat[(i * 7) % flat.numel()] = [math.nan, math.inf, -math.inf][i % 3]
        state[f"t{i}"] = tensor
    big = torch.randn(1100, 1100)  # larger than the window scan's small views
    big[1000, 3] = math.nan
    state["big_nan"] = big
    state["big_clean"] = torch.randn(1100, 1100).to(torch.bfloat16)
    return state


def exact(path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """The check report with every tensor read the per-tensor way."""
    monkeypatch.setattr(finite_scan, "all_finite", lambda tensors, *a, **k: [None] * len(tensors))
    report = check_checkpoint(open_checkpoint(path)).to_json()
    monkeypatch.undo()
    return report


@pytest.mark.parametrize("in_child", [True, False], ids=["scan-in-child", "scan-here"])
@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_check_report_equals_the_per_tensor_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str, in_child: bool
) -> None:
    if not in_child:
        monkeypatch.setattr(check_module.forked, "fork", lambda work: None)
    monkeypatch.setattr(finite_scan, "LARGE", 4096)
    state = mixed_state()
    path = tmp_path / f"m{suffix}"
    if suffix == ".pth":
        shared = torch.arange(40.0)
        shared[30] = math.inf
        state.update({"head": shared[:20], "tail": shared[20:], "again": shared[20:]})
        torch.save(state, path)
    else:
        write_safetensors(state, path)
    fast = check_checkpoint(open_checkpoint(path)).to_json()
    monkeypatch.undo()
    assert fast == exact(path, monkeypatch)
    assert sum(p["kind"] in ("nan", "inf") for p in fast["problems"]) >= 15


def test_scan_agrees_with_torch_per_tensor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(finite_scan, "LARGE", 4096)
    monkeypatch.setattr(finite_scan, "READ_CHUNK", 3 * 4096 + 100)  # large views in many unaligned reads
    monkeypatch.setattr(finite_scan, "WINDOW", 2048)  # many windows, views cut across none of them
    state = mixed_state()
    torch.save(state, tmp_path / "m.pth")
    tensors = [t for _, t in iter_tensors(open_checkpoint(tmp_path / "m.pth").root)]
    found = finite_scan.all_finite(tensors)
    for tensor, clean, original in zip(tensors, found, state.values(), strict=True):
        has_bad = bool((~torch.isfinite(original.double())).any())
        assert clean is (None if has_bad else True)
        if clean:
            assert tensor_stats(tensor).inf + tensor_stats(tensor).nan == 0


def test_truncated_file_reports_as_the_per_tensor_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = {f"t{i}": torch.randn(64) for i in range(50)}
    path = write_safetensors(state, tmp_path / "cut.safetensors")
    whole = path.read_bytes()
    opened = open_checkpoint(path)
    path.write_bytes(whole[: len(whole) - 1000])  # cut after opening: the reads come up short
    # (check refuses a file changed since it was opened: test_changed_on_disk.py; here, the short reads)
    opened.opened_version = None
    version_guard_aside(opened.root)
    fast = check_checkpoint(opened).to_json()
    monkeypatch.setattr(finite_scan, "all_finite", lambda tensors, *a, **k: [None] * len(tensors))
    assert fast == check_checkpoint(opened).to_json()
    assert any(p["kind"] == "unreadable" for p in fast["problems"])


def test_views_the_scan_does_not_answer_go_the_exact_way(tmp_path: Path) -> None:
    base = torch.arange(24.0).reshape(4, 6)
    base[0, 0] = math.nan
    torch.save({"t": base.t(), "cols": base[:, 1::2], "fp8": torch.ones(4).to(torch.float8_e4m3fn)}, tmp_path / "v.pth")
    tensors = [t for _, t in iter_tensors(open_checkpoint(tmp_path / "v.pth").root)]
    assert finite_scan.all_finite(tensors) == [None, None, None]
    report = check_checkpoint(open_checkpoint(tmp_path / "v.pth"))
    assert [p.message for p in report.problems] == ['ckpt["t"]: 1 NaN of 24 values; first NaN at [0, 0]']
