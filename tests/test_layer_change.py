"""``diff A B --stats``: per-layer relative change, cosine and norms agree with torch in float64; a series of
files gives each layer's norm in each; the text fits 80 columns."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ckpt_tui.cli import main
from ckpt_tui.core.values.pair_sums import NARROW_BOUND, pair_sums
from ckpt_tui.core.values.stats import BLOCK_ELEMENTS


def fine_tuned(tmp_path: Path) -> tuple[str, str, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A model and a copy fine-tuned with its first layer frozen."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model[0].requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(5):
        model(torch.randn(8, 6)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    after = model.state_dict()
    a, b = tmp_path / "base.pth", tmp_path / "tuned.pth"
    torch.save(before, a)
    torch.save(after, b)
    return str(a), str(b), before, after


def stats_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code = main(["diff", *args, "--stats", "--json"])
    report = json.loads(capsys.readouterr().out)
    # the exit code is diff's: 0 only when no row moved, was left unmeasured or held NaN/Inf
    if "series" in report:  # three or more files: each layer with one norm in all of them
        still = all(None not in r["norms"] and len(set(r["norms"])) == 1 for r in report["series"])
    else:
        still = all(r["note"] is None and r["relative_change"] == 0 and not r["nonfinite"] for r in report["layers"])
    assert code == (0 if still else 1)
    return report


def torch_change(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float, float]:
    a, b = a.double().flatten(), b.double().flatten()
    finite = a.isfinite() & b.isfinite()
    a, b = a[finite], b[finite]
    norm_a, norm_b = a.norm().item(), b.norm().item()
    return (a - b).norm().item() / norm_a, torch.nn.functional.cosine_similarity(a, b, dim=0).item(), norm_a, norm_b


def test_relative_change_cosine_and_norms_agree_with_torch_float64_and_frozen_layers_are_zero(tmp_path, capsys):
    a, b, before, after = fine_tuned(tmp_path)
    layers = stats_json(capsys, a, b)["layers"]
    assert [row["path"] for row in layers] == [[k] for k in before]
    for row in layers:
        key = row["path"][0]
        relative, cosine, norm_a, norm_b = torch_change(before[key], after[key])
        assert row["relative_change"] == pytest.approx(relative, rel=1e-12, abs=1e-300)
        assert row["cosine"] == pytest.approx(cosine, rel=1e-12)
        assert row["norm_a"] == pytest.approx(norm_a, rel=1e-12)
        assert row["norm_b"] == pytest.approx(norm_b, rel=1e-12)
    frozen = {row["path"][0]: row for row in layers if row["path"][0].startswith("0.")}
    assert all(row["relative_change"] == 0.0 and row["cosine"] == 1.0 for row in frozen.values())
    moved = [row for row in layers if row["path"][0].startswith("2.")]
    assert all(row["relative_change"] > 0 for row in moved)


def test_nan_and_inf_positions_are_left_out_of_the_sums_and_counted(tmp_path, capsys):
    torch.manual_seed(1)
    x = torch.randn(100)
    y = x + 0.1 * torch.randn(100)
    x[3], y[7], y[9] = float("nan"), float("inf"), float("nan")
    torch.save({"w": x}, tmp_path / "a.pth")
    torch.save({"w": y}, tmp_path / "b.pth")
    (row,) = stats_json(capsys, str(tmp_path / "a.pth"), str(tmp_path / "b.pth"))["layers"]
    relative, cosine, norm_a, norm_b = torch_change(x, y)
    assert row["nonfinite"] == 3
    assert row["relative_change"] == pytest.approx(relative, rel=1e-12)
    assert row["cosine"] == pytest.approx(cosine, rel=1e-12)
    assert (row["norm_a"], row["norm_b"]) == pytest.approx((norm_a, norm_b), rel=1e-12)


def test_different_dtypes_compare_by_value(tmp_path, capsys):
    torch.manual_seed(2)
    x = torch.randn(64)
    torch.save({"w": x}, tmp_path / "a.pth")
    torch.save({"w": x.bfloat16()}, tmp_path / "b.pth")
    (row,) = stats_json(capsys, str(tmp_path / "a.pth"), str(tmp_path / "b.pth"))["layers"]
    relative, _cosine, _, _ = torch_change(x, x.bfloat16())
    assert 0 < row["relative_change"] < 1e-2
    assert row["relative_change"] == pytest.approx(relative, rel=1e-12)


def test_shape_changes_and_keys_on_one_side_are_rows_that_say_why(tmp_path, capsys):
    torch.save(
        {"head.weight": torch.ones(4, 8), "body.weight": torch.ones(3), "old": torch.ones(2)}, tmp_path / "a.pth"
    )
    torch.save(
        {"head.weight": torch.ones(10, 8), "body.weight": torch.zeros(3), "new": torch.ones(2)}, tmp_path / "b.pth"
    )
    layers = {r["path"][0]: r for r in stats_json(capsys, str(tmp_path / "a.pth"), str(tmp_path / "b.pth"))["layers"]}
    assert layers["head.weight"]["note"] == "shape [4, 8] in A, [10, 8] in B"
    assert layers["head.weight"]["relative_change"] is None
    assert layers["old"]["note"] == "only in A" and layers["new"]["note"] == "only in B"
    body = layers["body.weight"]
    assert body["relative_change"] == 1.0 and body["cosine"] is None and body["norm_b"] == 0.0
    assert main(["diff", str(tmp_path / "a.pth"), str(tmp_path / "b.pth"), "--stats"]) == 1
    text = capsys.readouterr().out
    assert "not compared (3):" in text and "head.weight: shape [4, 8] in A, [10, 8] in B" in text


def test_text_has_a_table_bars_in_module_order_and_the_extremes_within_80_columns(tmp_path, capsys):
    a, b, before, _ = fine_tuned(tmp_path)
    assert main(["diff", a, b, "--stats"]) == 1
    text = capsys.readouterr().out
    assert all(len(line) <= 80 for line in text.splitlines())
    assert text.startswith("per-layer change: 4 layers compared, 2 unchanged")
    plot = text.split("relative change by layer")[1].split("moved most")[0].splitlines()[1:]
    assert [line.split()[0] for line in plot] == list(before)
    assert "█" in plot[2] and "█" not in plot[0]
    most = text.split("moved most")[1].split("moved least")[0]
    assert most.splitlines()[1].strip().startswith("2.")


def test_at_and_strip_prefix_options_apply_as_in_diff(tmp_path, capsys):
    a, _b, before, after = fine_tuned(tmp_path)
    torch.save({"model": {f"module.{k}": v for k, v in after.items()}, "epoch": 3}, tmp_path / "train.pth")
    layers = stats_json(capsys, a, str(tmp_path / "train.pth"), "--at-b", "model", "--strip-prefix-b", "module.")[
        "layers"
    ]
    assert [r["path"][0] for r in layers] == list(before)
    assert all(r["note"] is None for r in layers)


def test_a_series_of_files_gives_each_layers_norm_in_each_file(tmp_path, capsys):
    torch.manual_seed(3)
    states = [{"a": torch.ones(4) * (i + 1), "b": torch.randn(2, 2)} for i in range(4)]
    states[2]["late"] = torch.ones(3)
    paths = []
    for index, state in enumerate(states):
        torch.save(state, tmp_path / f"e{index}.pth")
        paths.append(str(tmp_path / f"e{index}.pth"))
    data = stats_json(capsys, *paths)
    assert data["files"] == paths
    series = {row["path"][0]: row["norms"] for row in data["series"]}
    for key in ("a", "b"):
        assert series[key] == pytest.approx(
            [torch.linalg.vector_norm(s[key].double()).item() for s in states], rel=1e-12
        )
    assert series["late"] == [None, None, pytest.approx(math.sqrt(3)), None]
    assert main(["diff", *paths, "--stats"]) == 1
    text = capsys.readouterr().out
    assert all(len(line) <= 80 for line in text.splitlines())
    row_a = next(line for line in text.splitlines() if line.strip().startswith("a "))
    assert row_a.rstrip().endswith("▁▃▆█")
    assert "··▅·" in text  # one known value: mid-height


def test_rank_diff_without_stats_is_unchanged(tmp_path, capsys):
    for index in range(3):
        torch.save({"w": torch.ones(3)}, tmp_path / f"r{index}.pth")
    paths = [str(tmp_path / f"r{i}.pth") for i in range(3)]
    assert main(["diff", *paths, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["identical"] is True


async def test_browser_diff_report_shows_the_per_layer_change_on_s_and_jumps_to_a_layer(tmp_path):
    from builders_tui import cursor_path, loaded, settle

    from ckpt_tui.tui.app import CkptApp
    from ckpt_tui.tui.screens.diff import DiffScreen
    from ckpt_tui.tui.screens.report import Jump, ReportScreen

    a, b, _, _ = fine_tuned(tmp_path)
    app = CkptApp(a)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await settle(pilot, "D")
        app.screen.query_one("Input").value = b
        await settle(pilot, "enter")
        assert isinstance(app.screen, DiffScreen)
        await settle(pilot, "s")
        report = app.screen
        assert isinstance(report, ReportScreen) and report.title_text.startswith("Per-layer change from base.pth")
        headings = [heading for heading, _ in report.sections]
        assert headings[0] == "per layer" and headings[2:4] == ["moved most", "moved least"]
        rows = [str(text) for _, text in report.sections[1][1]]
        assert [r.split()[0] for r in rows] == ["0.weight", "0.bias", "2.weight", "2.bias"]
        width = report.query_one("#report-list").scrollable_content_region.width
        assert all(len(r) <= width for r in rows) and "█" in rows[2]  # each row fits the list, none cut
        most_key = report.sections[2][1][0][0]
        report.dismiss(Jump(report.path_of(most_key)))
        await settle(pilot)
        assert cursor_path(app) == (most_key,)


def test_moved_most_ranks_parameters_and_lists_buffers_and_counters_apart(tmp_path, capsys):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Flatten(), torch.nn.Linear(8 * 16, 4)
    )
    torch.save(model.state_dict(), tmp_path / "e1.pth")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(5):  # BatchNorm's running statistics move from 0/1 far more than the weights
        model(torch.randn(4, 3, 6, 6) * 3 + 2).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    torch.save(model.state_dict(), tmp_path / "e2.pth")
    layers = stats_json(capsys, str(tmp_path / "e1.pth"), str(tmp_path / "e2.pth"))["layers"]
    roles = {row["path"][0]: row["role"] for row in layers}
    assert roles["1.running_mean"] == "buffer" and roles["1.num_batches_tracked"] == "counter"
    assert roles["0.weight"] == roles["3.bias"] == "parameter"
    assert main(["diff", str(tmp_path / "e1.pth"), str(tmp_path / "e2.pth"), "--stats"]) == 1
    text = capsys.readouterr().out
    # (4 parameters: each is listed once, under moved most; moved least would only repeat them)
    ranked = text.split("moved most")[1].split("buffers and counters moved most")[0]
    apart = text.split("buffers and counters moved most")[1]
    assert "running" not in ranked and "num_batches_tracked" not in ranked
    assert "1.running_mean" in apart and "1.num_batches_tracked" in apart


def test_big_layers_summed_on_worker_threads_give_the_same_figures_bit_for_bit(tmp_path, capsys, monkeypatch):
    from ckpt_tui.core.operations import layer_change

    torch.manual_seed(3)
    big = torch.randn(5 * layer_change.CHUNK_ELEMENTS // 2)  # several chunks: summed on the worker threads
    moved = big + 0.01 * torch.randn(big.shape)
    moved[7] = float("nan")  # a NaN in one chunk: that chunk's sums over the finite positions only
    torch.save({"w": big, "small": torch.ones(3)}, tmp_path / "a.pth")
    torch.save({"w": moved, "small": torch.ones(3) * 2}, tmp_path / "b.pth")
    threaded = stats_json(capsys, str(tmp_path / "a.pth"), str(tmp_path / "b.pth"))
    monkeypatch.setattr(layer_change, "CHUNK_ELEMENTS", 1 << 62)  # every chunk summed in this thread
    alone = stats_json(capsys, str(tmp_path / "a.pth"), str(tmp_path / "b.pth"))
    assert threaded == alone
    row = threaded["layers"][0]
    assert row["nonfinite"] == 1
    relative, cosine, norm_a, norm_b = torch_change(big, moved)
    assert math.isclose(row["relative_change"], relative, rel_tol=1e-9)
    assert math.isclose(row["cosine"], cosine, rel_tol=1e-9)
    # (float32 values: summed narrow, within NARROW_BOUND)
    assert math.isclose(row["norm_a"], norm_a, rel_tol=3 * NARROW_BOUND)
    assert math.isclose(row["norm_b"], norm_b, rel_tol=3 * NARROW_BOUND)


def test_chunks_read_on_the_workers_give_the_figures_of_chunks_read_here(tmp_path, capsys, monkeypatch):
    from ckpt_tui.core.operations import layer_change
    from ckpt_tui.core.values.tensor_values import TensorReader

    torch.manual_seed(4)
    size = 5 * layer_change.CHUNK_ELEMENTS // 2
    storage = torch.randn(size + 11)
    # a view at an offset in its storage, a float16 side against a float32 one, a bfloat16 pair
    a = {"offset": storage[11:], "half": torch.randn(size), "bf16": torch.randn(size).bfloat16()}
    b = {"offset": storage[11:] * 0.5 + 0.1, "half": a["half"].half(), "bf16": (a["bf16"] * 1.01).bfloat16()}
    torch.save(a, tmp_path / "a.pth")
    torch.save(b, tmp_path / "b.pth")
    on_workers = stats_json(capsys, str(tmp_path / "a.pth"), str(tmp_path / "b.pth"))

    @contextlib.contextmanager
    def not_shared(self, mapped=False):
        yield None

    monkeypatch.setattr(TensorReader, "shared_reads", not_shared)  # read here, summed on the workers
    assert stats_json(capsys, str(tmp_path / "a.pth"), str(tmp_path / "b.pth")) == on_workers
    for row in on_workers["layers"]:
        key = row["path"][0]
        relative, cosine, _, _ = torch_change(a[key], b[key])
        assert math.isclose(row["relative_change"], relative, rel_tol=1e-4)
        assert math.isclose(row["cosine"], cosine, rel_tol=1e-4)


def adversarial_pair(kind: str, size: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Two vectors whose sums are hard to take accurately."""
    rng = np.random.default_rng(11)
    a = rng.standard_normal(size)
    if kind == "mixed magnitudes":  # 1e-30 to 1e30: every product of float32s is still exact in float64
        a *= 10.0 ** rng.uniform(-30, 30, size)
        b = rng.standard_normal(size) * 10.0 ** rng.uniform(-30, 30, size)
    elif kind == "near-equal":  # a fine-tuning step: the difference is ~1e-6 of the values
        b = a * (1 + 1e-6 * rng.standard_normal(size))
    elif kind == "cancelling":  # a·b sums to almost nothing, and b is nearly -a on every other element
        b = a * np.where(np.arange(size) % 2 == 0, 1.0, -1.0) * (1 + 1e-3 * rng.standard_normal(size))
    elif kind == "nearly opposite":  # b ≈ -a: the cosine is -1 + 1e-9
        b = -a * (1 + 1e-4 * rng.standard_normal(size))
    elif kind == "scaled":  # weight decay alone: b is a times a constant, the cosine 1 to float32's rounding
        b = a * 0.999
    elif kind == "constant":  # every value alike: float32 rounding errors all lean the same way
        a = np.full(size, 0.1)
        b = np.full(size, 0.1 + 1e-7)
    elif kind == "zero blocks":  # long runs of zeros on both sides (a pruned part), a frozen run, a moved run
        a[: size // 2] = 0.0
        b = a.copy()
        b[size // 2 : size // 2 + 200_000] += 1e-3 * rng.standard_normal(200_000)
    elif kind == "tiny":  # squares below float32's smallest normal (1e-38): summed in float64
        a *= 1e-22
        b = a * (1 + 1e-3 * rng.standard_normal(size))
    elif kind == "far apart norms":  # ‖b‖ = ‖a‖/1000
        b = 1e-3 * (a + rng.standard_normal(size))
    else:
        b = rng.standard_normal(size)
    numpy_dtype = np.float32 if dtype == torch.float32 else np.float64
    return torch.from_numpy(a.astype(numpy_dtype)), torch.from_numpy(b.astype(numpy_dtype))


def exact_sums(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float, float, float]:
    """Σa², Σb², Σ(a−b)², Σ(a+b)², Σab of float32 vectors, exactly rounded: every product of float32s, and
    their sum and difference, are exact in float64 (for values of like magnitude), and fsum adds them exactly."""
    wide_a, wide_b = a.double().numpy(), b.double().numpy()
    delta, total = wide_a - wide_b, wide_a + wide_b
    squares = (wide_a * wide_a, wide_b * wide_b, delta * delta, total * total, wide_a * wide_b)
    aa, bb, dd, ss, ab = (math.fsum(s.tolist()) for s in squares)
    return aa, bb, dd, ss, ab


KINDS = ["gaussian", "mixed magnitudes", "near-equal", "cancelling", "nearly opposite", "scaled", "constant"]
KINDS += ["zero blocks", "tiny", "far apart norms"]


def big_pair(tmp_path: Path, kind: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """An adversarial pair saved as a.pth and b.pth: float32 values, held as ``dtype``."""
    from ckpt_tui.core.operations import layer_change

    # a whole chunk summed on a worker thread, then a shorter one ending in a part of a block
    a, b = adversarial_pair(kind, layer_change.CHUNK_ELEMENTS + 3 * 65536 + 1234)
    torch.save({"w": a.to(dtype)}, tmp_path / "a.pth")
    torch.save({"w": b.to(dtype)}, tmp_path / "b.pth")
    return a, b


@pytest.mark.parametrize("kind", KINDS)
def test_a_big_float64_layers_sums_are_within_3e_15_of_the_exact_sums(tmp_path, capsys, kind):
    a, b = big_pair(tmp_path, kind, torch.float64)
    row = stats_json(capsys, str(tmp_path / "a.pth"), str(tmp_path / "b.pth"))["layers"][0]
    aa, bb, dd, _, ab = exact_sums(a, b)
    assert row["norm_a"] == pytest.approx(math.sqrt(aa), rel=3e-15)
    assert row["norm_b"] == pytest.approx(math.sqrt(bb), rel=3e-15)
    assert row["relative_change"] == pytest.approx(math.sqrt(dd / aa), rel=3e-15)
    assert row["cosine"] == pytest.approx(ab / math.sqrt(aa * bb), abs=3e-15)


@pytest.mark.parametrize("kind", KINDS)
def test_a_big_float32_layers_figures_are_within_the_narrow_bound_of_the_exact_ones(tmp_path, capsys, kind):
    a, b = big_pair(tmp_path, kind, torch.float32)
    row = stats_json(capsys, str(tmp_path / "a.pth"), str(tmp_path / "b.pth"))["layers"][0]
    aa, bb, dd, ss, ab = exact_sums(a, b)
    norm_a, norm_b = math.sqrt(aa), math.sqrt(bb)
    # every block summed narrow or wide: norms within 2.5 bounds (Σa², Σb² within 5 of each block's own),
    # the relative change within 3 (Σ(a−b)² within 1)
    assert row["norm_a"] == pytest.approx(norm_a, rel=3 * NARROW_BOUND)
    assert row["norm_b"] == pytest.approx(norm_b, rel=3 * NARROW_BOUND)
    assert row["relative_change"] == pytest.approx(math.sqrt(dd / aa), rel=3 * NARROW_BOUND, abs=0)
    # the cosine within 10 bounds absolute, and near 1 within 10 bounds times ‖a−b‖²/(‖a‖‖b‖) (‖a+b‖² near -1),
    # which is about twice 1 - cos for a change spread across the values (and a few float64 roundings)
    product = norm_a * norm_b
    cosine_bound = 10 * NARROW_BOUND * min(1.0, dd / product, ss / product) + 1e-15
    assert abs(row["cosine"] - ab / product) <= cosine_bound


@pytest.mark.parametrize(
    ("kind", "narrow"),
    [
        *[(kind, True) for kind in ("gaussian", "near-equal", "zero blocks")],
        # (nearly opposite: a cosine near -1 needs Σ(a+b)² to its own digits, which float64 gives)
        *[(kind, False) for kind in ("mixed magnitudes", "tiny", "far apart norms", "nearly opposite")],
    ],
)
def test_float32_blocks_are_summed_narrow_unless_their_sums_could_not_hold_the_bound(kind, narrow):
    a, b = adversarial_pair(kind, 8 * BLOCK_ELEMENTS + 5)
    found = pair_sums(a.numpy(), b.numpy())
    assert found.narrow is narrow
    aa, bb, dd, _, ab = exact_sums(a, b)
    if not narrow:  # squares past float32's range or below its normals, norms far apart, a+b small: as float64
        assert found.aa == pytest.approx(aa, rel=1e-15) and found.bb == pytest.approx(bb, rel=1e-15)
        assert found.dd == pytest.approx(dd, rel=1e-15) and found.ab == pytest.approx(ab, rel=1e-15, abs=1e-15 * aa)
    assert pair_sums(a.numpy(), b.numpy(), wide=True).narrow is False


def test_a_frozen_float32_layer_has_cosine_1_and_change_0(tmp_path, capsys):
    a, _ = adversarial_pair("gaussian", 3 * BLOCK_ELEMENTS)
    torch.save({"w": a}, tmp_path / "a.pth")
    torch.save({"w": a.clone()}, tmp_path / "b.pth")
    row = stats_json(capsys, str(tmp_path / "a.pth"), str(tmp_path / "b.pth"))["layers"][0]
    assert row["relative_change"] == 0.0 and row["cosine"] == 1.0 and row["norm_a"] == row["norm_b"]


def test_stats_exits_as_diff_does_0_identical_1_different(tmp_path, capsys):
    """Scripts read the exit code: --stats says 1 for files that differ, as plain diff does, and 0 for equal ones."""
    a, b, _, _ = fine_tuned(tmp_path)
    assert main(["diff", a, b]) == 1
    assert main(["diff", a, b, "--stats"]) == 1
    assert main(["diff", a, b, "--stats", "--json"]) == 1
    assert main(["diff", a, a]) == 0
    assert main(["diff", a, a, "--stats"]) == 0
    assert main(["diff", a, a, a, "--stats"]) == 0
    assert main(["diff", a, a, b, "--stats"]) == 1
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["diff", "--help"])
    assert done.value.code == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "exits as diff does: 0 when no layer moved, 1 when a layer or key differs" in said


def test_bit_identical_layers_have_cosine_exactly_1_in_the_json_and_the_text(tmp_path, capsys):
    # Σab/(√Σa²·√Σb²) of two equal vectors of ones rounds to 1 − 2.2e-16: √2·√2 is 2 + 4.4e-16
    weights = {"w64": torch.ones(2, dtype=torch.float64), "w32": torch.ones(2), "big": torch.randn(3 * BLOCK_ELEMENTS)}
    torch.save(weights, tmp_path / "a.pth")
    torch.save({key: value.clone() for key, value in weights.items()}, tmp_path / "b.pth")
    rows = stats_json(capsys, str(tmp_path / "a.pth"), str(tmp_path / "b.pth"))["layers"]
    assert [(row["relative_change"], row["cosine"]) for row in rows] == [(0.0, 1.0)] * 3
    assert main(["diff", str(tmp_path / "a.pth"), str(tmp_path / "b.pth"), "--stats"]) == 0
    out = capsys.readouterr().out
    assert "3 unchanged" in out and "1-" not in out


def test_a_run_of_large_layers_streams_and_a_layer_that_fails_to_read_is_its_own_row(
    tmp_path, capsys, monkeypatch
) -> None:
    from ckpt_tui.core.errors import ReadError
    from ckpt_tui.core.operations import layer_change

    torch.manual_seed(5)
    size = 5 * layer_change.CHUNK_ELEMENTS // 2
    a = {name: torch.randn(size + k) for k, name in enumerate(("first", "broken", "last"))}
    b = {name: value * 0.9 + 0.05 for name, value in a.items()}
    torch.save(a, tmp_path / "a.pth")
    torch.save(b, tmp_path / "b.pth")
    shared_chunk = layer_change._shared_chunk

    def failing(read_x, read_y, reader_x, reader_y):  # every chunk of "broken" but its first
        work = shared_chunk(read_x, read_y, reader_x, reader_y)
        if reader_x.numel != size + 1:
            return work

        def broken(begin: int, count: int):
            if begin:
                raise ReadError("tensor data ends early (file truncated?)")
            return work(begin, count)

        return broken

    monkeypatch.setattr(layer_change, "_shared_chunk", failing)
    rows = {
        row["path"][0]: row for row in stats_json(capsys, str(tmp_path / "a.pth"), str(tmp_path / "b.pth"))["layers"]
    }
    assert rows["broken"]["note"] == "unreadable: tensor data ends early (file truncated?)"
    assert rows["broken"]["relative_change"] is None
    for key in ("first", "last"):
        relative, cosine, norm_a, _ = torch_change(a[key], b[key])
        assert rows[key]["note"] is None
        assert math.isclose(rows[key]["relative_change"], relative, rel_tol=1e-4)
        assert math.isclose(rows[key]["cosine"], cosine, rel_tol=1e-4)
        assert math.isclose(rows[key]["norm_a"], norm_a, rel_tol=1e-5)
