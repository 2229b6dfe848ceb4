"""Stats read on demand from the file agree with torch on the same tensors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from builders import write_safetensors

from ckpt_tui.core.errors import Cancelled
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.values.stats import tensor_stats


def assert_matches(stats, tensor: torch.Tensor) -> None:
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64])
def test_stats_match_torch(tmp_path: Path, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    tensor = (torch.randn(300, 70) * 5).to(dtype)
    torch.save({"w": tensor}, tmp_path / "s.pth")
    stats = tensor_stats(open_checkpoint(tmp_path / "s.pth").root["w"], chunk=4096)
    assert_matches(stats, tensor)


def test_nan_inf_and_views(tmp_path: Path) -> None:
    base = torch.arange(24.0).reshape(4, 6)
    base[0, 0] = math.nan
    base[1, 1] = math.inf
    base[2, 2] = -math.inf
    views = {"base": base, "t": base.t(), "cols": base[:, ::2], "row": base[2]}
    torch.save(views, tmp_path / "v.pth")
    root = open_checkpoint(tmp_path / "v.pth").root
    for name, tensor in views.items():
        assert_matches(tensor_stats(root[name], chunk=5), tensor)
    assert tensor_stats(root["t"]).first[:4] == pytest.approx(base.t().flatten()[:4].tolist(), nan_ok=True)


def test_fp8_values(tmp_path: Path) -> None:
    tensor = torch.tensor([0.5, -2.0, 448.0, 0.0, 1.125]).to(torch.float8_e4m3fn)
    torch.save({"f": tensor, "e5": tensor.float().to(torch.float8_e5m2)}, tmp_path / "f.pth")
    root = open_checkpoint(tmp_path / "f.pth").root
    assert tensor_stats(root["f"]).first == tensor.float().tolist()
    assert tensor_stats(root["e5"]).first == tensor.float().to(torch.float8_e5m2).float().tolist()


def test_safetensors_and_legacy_values(tmp_path: Path) -> None:
    tensor = torch.randn(50, 3).to(torch.bfloat16)
    write_safetensors({"x": tensor}, tmp_path / "x.safetensors")
    torch.save({"x": tensor}, tmp_path / "x.pth", _use_new_zipfile_serialization=False)
    for name in ("x.safetensors", "x.pth"):
        assert_matches(tensor_stats(open_checkpoint(tmp_path / name).root["x"]), tensor)


def test_cancel_between_chunks(tmp_path: Path) -> None:
    torch.save({"w": torch.zeros(10_000)}, tmp_path / "c.pth")
    tensor = open_checkpoint(tmp_path / "c.pth").root["w"]
    calls: list[float] = []
    with pytest.raises(Cancelled):
        tensor_stats(tensor, cancelled=lambda: len(calls) >= 2, progress=calls.append, chunk=1000)
    assert len(calls) == 2


@pytest.mark.parametrize(
    "values",
    [[1.0, 1.0, 1.0], [1e-308, 1.0000000000000002e-308], [-1.7e308, 1.7e308], [0.0, 5e-324]],
)
def test_histogram_survives_degenerate_ranges(tmp_path: Path, values: list[float]) -> None:
    tensor = torch.tensor(values, dtype=torch.float64)
    torch.save({"w": tensor}, tmp_path / "d.pth")
    stats = tensor_stats(open_checkpoint(tmp_path / "d.pth").root["w"])
    assert sum(stats.histogram) == len(values)
    assert stats.min == min(values) and stats.max == max(values)


def test_stats_over_many_chunks_and_blocks_match_torch(tmp_path: Path) -> None:
    torch.manual_seed(0)
    mixed = torch.cat([torch.randn(150_000), torch.zeros(100_000), torch.randn(50_000) * 1e3])
    mixed[[7, 200_000, 299_999]] = torch.tensor([math.nan, math.inf, -math.inf])
    tensors = {
        "near_one": 1 + 1e-6 * torch.randn(300_000, dtype=torch.float64),  # mean dwarfs the spread
        "layer_norm": 1 + 0.05 * torch.randn(300_000),  # sums of squares minus n*mean^2, 3 digits short
        "constant": torch.full((300_000,), 0.1),
        "mixed": mixed,
        "bf16": torch.randn(300_000).to(torch.bfloat16),
        "f16": (torch.randn(300_000) * 1000).half(),
        "neg": torch.randn(300_000).neg(),
    }
    torch.save(tensors, tmp_path / "m.pth")
    root = open_checkpoint(tmp_path / "m.pth").root
    for name, tensor in tensors.items():
        stats = tensor_stats(root[name], chunk=70_000)  # several chunks, summarised on the worker threads
        assert_matches(stats, tensor)
        finite = tensor.double()[torch.isfinite(tensor.double())]
        assert stats.norm == pytest.approx(float(finite.norm()), rel=1e-12)
        assert stats.first == tensor.double()[:16].tolist() or name == "mixed"


def test_results_do_not_depend_on_chunking(tmp_path: Path) -> None:
    torch.manual_seed(1)
    tensor = torch.randn(400_000)
    tensor[::1000] = 0.0
    torch.save({"w": tensor}, tmp_path / "w.pth")
    leaf = open_checkpoint(tmp_path / "w.pth").root["w"]
    whole, chunked = tensor_stats(leaf), tensor_stats(leaf, chunk=30_000)
    assert chunked.histogram == whole.histogram and sum(whole.histogram) == 400_000
    assert (
        (chunked.zeros, chunked.min, chunked.max)
        == (whole.zeros, whole.min, whole.max)
        == (400, float(tensor.min()), float(tensor.max()))
    )
    assert chunked.std == pytest.approx(whole.std, rel=1e-12)
    assert tensor_stats(leaf, chunk=30_000) == chunked  # the same figures on every run


@pytest.mark.parametrize("copies", [1, 300])  # binned by binary search / by numpy's arithmetic
def test_histogram_counts_values_on_bin_edges_like_numpy(tmp_path: Path, copies: int) -> None:
    edges = np.linspace(-3.0, 5.0, 25)
    between = np.random.default_rng(0).uniform(-3.0, 5.0, 50)
    tensor = torch.tensor(np.tile(np.concatenate([edges, edges[1:-1], between]), copies))
    torch.save({"w": tensor}, tmp_path / "e.pth")
    stats = tensor_stats(open_checkpoint(tmp_path / "e.pth").root["w"])
    assert stats.histogram == np.histogram(tensor.numpy(), bins=edges)[0].tolist()


def test_bool_bytes_other_than_0_and_1_read_as_torch_reads_them(tmp_path: Path) -> None:
    # a bool storage byte of 2 is True in torch (1 as a number); stats never show it as 2
    import random
    import struct
    import zipfile

    rng = random.Random(7)
    for index in range(20):
        raw = bytes(rng.choice([0, 1, 2, 7, 255]) for _ in range(rng.randint(2, 9)))
        path = tmp_path / f"b{index}.pth"
        torch.save({"w": torch.zeros(len(raw), dtype=torch.bool)}, path)
        with zipfile.ZipFile(path) as source:
            members = {info.filename: source.read(info) for info in source.infolist()}
        record = next(name for name in members if name.endswith("/data/0"))
        members[record] = raw
        with zipfile.ZipFile(path, "w") as target:
            for name, data in members.items():
                target.writestr(name, data)
        loaded = torch.load(path, weights_only=True)["w"]
        assert struct.pack(f"{len(raw)}B", *raw) == bytes(loaded.view(torch.uint8).tolist())
        stats = tensor_stats(open_checkpoint(path).root["w"])
        assert_matches(stats, loaded)
