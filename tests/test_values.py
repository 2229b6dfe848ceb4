"""Reading tensor values: never outside the record, views that repeat elements read as their storage."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from builders_readers import write_view_file

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.operations.check import check_checkpoint
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.values.stats import tensor_stats
from ckpt_tui.core.values.tensor_values import TensorReader, decode


def assert_stats_match(stats, tensor: torch.Tensor) -> None:
    values = tensor.double().flatten()
    finite = values[torch.isfinite(values)]
    assert stats.count == values.numel()
    assert stats.nan == int(torch.isnan(values).sum())
    assert stats.inf == int(torch.isinf(values).sum())
    assert stats.zeros == int((values == 0).sum())
    assert stats.min == pytest.approx(float(finite.min()))
    assert stats.max == pytest.approx(float(finite.max()))
    assert stats.mean == pytest.approx(float(finite.mean()), rel=1e-9, abs=1e-12)
    assert stats.std == pytest.approx(float(finite.std()), rel=1e-9, abs=1e-12)
    assert sum(stats.histogram) == finite.numel()
    assert stats.first == pytest.approx(values[:16].tolist(), nan_ok=True)


def saved(tmp_path: Path, tensor: torch.Tensor, name: str = "t.pth"):
    torch.save({"w": tensor}, tmp_path / name)
    return open_checkpoint(tmp_path / name).root["w"]


def test_expanded_to_four_billion_elements_is_read_as_one(tmp_path: Path) -> None:
    tensor = saved(tmp_path, torch.full((1, 1), 2.5).expand(1, 2**32))
    assert (tmp_path / "t.pth").stat().st_size < 4096
    stats = tensor_stats(tensor)
    assert stats.count == stats.finite == 2**32
    assert (stats.min, stats.max, stats.mean, stats.std) == (2.5, 2.5, 2.5, 0.0)
    assert stats.histogram == [2**32]
    assert stats.first == [2.5] * 16
    report = check_checkpoint(open_checkpoint(tmp_path / "t.pth"))
    assert report.ok and report.checked == 1


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.tensor([[1.0], [math.nan], [-3.0]]).expand(3, 500),
        lambda: torch.tensor([[1.0, 2.0, math.inf]]).expand(400, 3),
        lambda: torch.arange(6.0).reshape(2, 1, 3).expand(2, 70, 3),
        lambda: torch.tensor(4.0).expand(7, 9),
    ],
    ids=["rows", "columns", "middle", "scalar"],
)
def test_partly_expanded_stats_match_torch(tmp_path: Path, make) -> None:
    tensor = make()
    assert_stats_match(tensor_stats(saved(tmp_path, tensor), chunk=7), tensor)


@pytest.mark.parametrize(
    ("size", "stride"),
    [((6, 5), (1, 1)), ((40, 40), (2, 1)), ((3, 4, 5), (1, 2, 1)), ((50, 3), (1, 1))],
)
def test_overlapping_views_count_every_index(tmp_path: Path, size, stride) -> None:
    torch.manual_seed(0)
    base = torch.randn(200)
    base[3] = math.nan
    tensor = base.as_strided(size, stride)
    assert_stats_match(tensor_stats(saved(tmp_path, tensor), chunk=16), tensor)


def test_huge_overlapping_view_of_a_small_storage_is_counted_not_walked(tmp_path: Path) -> None:
    path = write_view_file(tmp_path / "square.pth", 0, (2**20, 2**20), (1, 1), numel=2**21)
    stats = tensor_stats(open_checkpoint(path).root["w"])
    assert stats.count == 2**40
    assert stats.min == 0.0 and stats.max == 2**21 - 2
    # every element i is repeated min(i, 2**21 - 2 - i) + 1 times: symmetric around the middle
    assert stats.mean == pytest.approx(2**20 - 1)


@pytest.mark.parametrize(
    ("offset", "size", "stride", "words"),
    [
        (3, (4,), (-1,), "negative strides"),
        (0, (2,), (-1,), "negative strides"),
        (1, (2, 2), (2, -1), "negative strides"),
        (0, (2, 3), (-1, 1), "negative strides"),
        (1, (4,), (1,), "past the end"),
        (0, (2, 2), (3, 1), "past the end"),
        (0, (3,), (2**62,), "past the end"),
    ],
)
def test_views_outside_their_storage_are_refused(tmp_path: Path, offset, size, stride, words) -> None:
    path = write_view_file(tmp_path / "bad.pth", offset, size, stride)
    with pytest.raises(RuntimeError):
        torch.load(path, weights_only=True)
    tensor = open_checkpoint(path).root["w"]
    with pytest.raises(ReadError, match=words):
        TensorReader(tensor)
    report = check_checkpoint(open_checkpoint(path))
    assert not report.ok
    assert "unreadable" in [p.kind for p in report.problems]


@pytest.mark.parametrize(
    ("offset", "size", "stride"),
    [(0, (1,), (-1,)), (0, (0,), (-1,)), (0, (1, 2), (-3, 1)), (9, (0,), (1,)), (0, (3,), (0,))],
)
def test_views_torch_accepts_are_read(tmp_path: Path, offset, size, stride) -> None:
    path = write_view_file(tmp_path / "ok.pth", offset, size, stride)
    expected = torch.load(path, weights_only=True)["w"]
    tensor = open_checkpoint(path).root["w"]
    raw = list(TensorReader(tensor).chunks())
    values = decode(raw[0], "float32") if raw else []
    assert list(values) == expected.flatten().tolist()
    assert check_checkpoint(open_checkpoint(path)).ok


def test_check_and_convert_on_negative_strides_never_crash_or_leak(tmp_path: Path) -> None:
    path = write_view_file(tmp_path / "neg.pth", 0, (64,), (-1,), numel=4)
    check = subprocess.run([sys.executable, "-m", "ckpt_tui", "check", str(path)], capture_output=True, text=True)
    assert check.returncode == 1
    assert "negative strides" in check.stdout + check.stderr
    out = tmp_path / "out.safetensors"
    convert = subprocess.run(
        [sys.executable, "-m", "ckpt_tui", "convert", str(path), "-o", str(out)], capture_output=True, text=True
    )
    assert convert.returncode == 2
    assert "Traceback" not in convert.stderr and len(convert.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_chunks_have_the_same_boundaries_for_every_layout(tmp_path: Path) -> None:
    base = torch.arange(60.0).reshape(6, 10)
    torch.save({"c": base.t().contiguous(), "t": base.t()}, tmp_path / "l.pth")
    root = open_checkpoint(tmp_path / "l.pth").root
    sizes = {name: [len(c) for c in TensorReader(root[name]).chunks(7)] for name in ("c", "t")}
    assert sizes["c"] == sizes["t"] == [7] * 8 + [4]
    values = [v for c in TensorReader(root["t"]).chunks(7) for v in decode(c, "float32").tolist()]
    assert values == base.t().flatten().tolist()


def test_reads_stay_inside_a_record_followed_by_other_data(tmp_path: Path) -> None:
    # the storage record is followed by more records and the central directory; a view that fits the
    # record reads exactly its bytes, one that would reach past it is refused
    torch.save({"a": torch.arange(4.0), "b": torch.full((1000,), 7.0)}, tmp_path / "two.pth")
    root = open_checkpoint(tmp_path / "two.pth").root
    tensor = root["a"]
    tensor.shape, tensor.stride = (5,), (1,)
    with pytest.raises(ReadError, match="past the end"):
        TensorReader(tensor)


def test_chunks_read_into_reused_buffers_hold_the_same_values(tmp_path: Path) -> None:
    tensor = torch.randn(10_000)
    torch.save({"w": tensor}, tmp_path / "w.pth")
    reader = TensorReader(open_checkpoint(tmp_path / "w.pth").root["w"])
    fresh = [(raw.copy(), repeats) for raw, repeats in reader.distinct_chunks(999)]
    reused = [(raw.copy(), repeats) for raw, repeats in reader.distinct_chunks(999, reuse=3)]
    assert len(reused) == len(fresh) == 11
    for (a, ra), (b, rb) in zip(fresh, reused, strict=True):
        assert ra == rb == 1 and np.array_equal(a, b)
    assert np.array_equal(np.concatenate([raw for raw, _ in fresh]), tensor.numpy())
