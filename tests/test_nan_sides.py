"""A layer that went NaN between two saves (as a run diverging leaves it): diff --stats and diff (the CLI, and
the browser's per-layer and diff reports, written by the same functions) say which side holds how many, marked
``!``, and the headline's median and the layers that moved are over the layers actually compared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ckpt_tui.cli import main
from ckpt_tui.core.model.tree import Checkpoint
from ckpt_tui.core.operations.diff import diff
from ckpt_tui.core.operations.layer_change import layer_change
from ckpt_tui.core.operations.reports import describe_diff, describe_layer_change, render_text
from ckpt_tui.core.readers.open import open_checkpoint


def two_steps(tmp_path: Path) -> tuple[Path, Path]:
    """Step A; step B with 0.weight frozen, 1.weight all NaN, 2.weight 3 NaN and moved, 2.bias moved."""
    torch.manual_seed(0)
    a = {
        "0.weight": torch.randn(8, 8),
        "1.weight": torch.randn(64, 32),
        "2.weight": torch.randn(16),
        "2.bias": torch.randn(4),
    }
    b = {key: value.clone() for key, value in a.items()}
    b["1.weight"].fill_(float("nan"))
    b["2.weight"] += 0.5
    b["2.weight"][:3] = float("nan")
    b["2.bias"] += 0.1
    torch.save({"step": 1, "model": a}, tmp_path / "a.pt")
    torch.save({"step": 2, "model": b}, tmp_path / "b.pt")
    return tmp_path / "a.pt", tmp_path / "b.pt"


def opened(path: Path) -> Checkpoint:
    return open_checkpoint(str(path))


def test_stats_rows_say_which_side_holds_the_nan_and_the_headline_counts_only_what_was_compared(tmp_path, capsys):
    a, b = two_steps(tmp_path)
    assert main(["diff", str(a), str(b), "--stats"]) == 1
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0].startswith("per-layer change: 3 layers compared, 1 unchanged, median relative change ")
    assert lines[0].endswith(", 1 not compared: all NaN/Inf on a side")
    assert not lines[0].endswith("median relative change 0")
    table = text.split("per layer", 1)[1].split("relative change by layer", 1)[0]
    row = next(line for line in table.splitlines() if line.strip().startswith("1.weight"))
    assert row.rstrip().endswith("! all 2048 NaN in B") and " - " not in row
    partial = next(line for line in table.splitlines() if line.strip().startswith("2.weight"))
    assert partial.rstrip().endswith("! 3 NaN in B")
    most = text.split("moved most", 1)[1].split("\n\n", 1)[0].split("moved least", 1)[0]
    assert "0.weight" not in most and "1.weight" not in most
    assert "2.weight: " in most and "! 3 NaN in B" in most


def test_stats_json_gives_each_sides_counts(tmp_path, capsys):
    a, b = two_steps(tmp_path)
    assert main(["diff", str(a), str(b), "--stats", "--json"]) == 1
    rows = {row["path"][-1]: row for row in json.loads(capsys.readouterr().out)["layers"]}
    assert rows["1.weight"]["nonfinite_sides"] == {"nan_a": 0, "inf_a": 0, "nan_b": 2048, "inf_b": 0}
    assert rows["2.weight"]["nonfinite_sides"]["nan_b"] == 3
    assert rows["0.weight"]["nonfinite_sides"] is None


def test_value_rows_say_all_nan_in_b_not_max_difference_0(tmp_path, capsys):
    a, b = two_steps(tmp_path)
    assert main(["diff", str(a), str(b)]) == 1
    text = capsys.readouterr().out
    assert "model/1.weight: ! all 2048 NaN in B\n" in text
    assert "model/2.weight: ! 3 NaN in B; max |a-b| 0.5 where both are finite" in text
    assert "max |a-b| 0, NaN positions differ" not in text


def test_a_value_that_became_inf_is_a_difference_not_within_allclose(tmp_path, capsys):
    """A value that went to Inf, or +Inf against -Inf, is said as the NaN are, never 'within allclose' (torch's
    allclose is False: an error that is not finite is never within the tolerance); an Inf both sides hold at the
    same place agrees."""
    a = {"went_inf": torch.tensor([1.0, 2.0, 3.0]), "signs": torch.tensor([float("inf"), 2.0])}
    a["same_inf"] = torch.tensor([float("inf"), 2.0, 3.0])
    b = {"went_inf": torch.tensor([1.0, float("inf"), 3.0]), "signs": torch.tensor([float("-inf"), 2.0])}
    b["same_inf"] = torch.tensor([float("inf"), 2.0, 3.5])
    torch.save(a, tmp_path / "a.pth")
    torch.save(b, tmp_path / "b.pth")
    assert main(["diff", str(tmp_path / "a.pth"), str(tmp_path / "b.pth")]) == 1
    text = capsys.readouterr().out
    assert "went_inf: ! 1 Inf in B; max |a-b| 0 where both are finite" in text, text
    assert "signs: ! 1 Inf in A, 1 Inf in B; max |a-b| 0 where both are finite" in text, text
    assert "same_inf: max |a-b| 0.5\n" in text and "within allclose" not in text, text
    assert main(["diff", str(tmp_path / "a.pth"), str(tmp_path / "b.pth"), "--json"]) == 1
    rows = {row["key"]: row for row in json.loads(capsys.readouterr().out)["value_changes"]}
    for key in a:
        assert rows[key]["allclose"] == torch.allclose(a[key], b[key], equal_nan=True), key
    assert rows["went_inf"]["nan_mismatch"] and rows["signs"]["nan_mismatch"] and not rows["same_inf"]["nan_mismatch"]


@pytest.mark.parametrize("width", [60, 80])
def test_the_browsers_reports_say_the_same_in_their_width(tmp_path, width):
    a, b = two_steps(tmp_path)
    first, second = opened(a), opened(b)
    stats = render_text(describe_layer_change(layer_change(first, second), "a.pt", "b.pt", width))
    values = render_text(describe_diff(diff(first, second), "a.pt", "b.pt", width=width))
    assert "! all 2048 NaN in B" in stats and "! all 2048 NaN in B" in values
    assert "1 not compared: all NaN/Inf on a side" in stats
    table = stats.split("per layer", 1)[1].split("moved most", 1)[0]
    assert all(len(line) <= width + 2 for line in table.splitlines() if line.startswith("  "))


def test_a_layer_whose_value_became_inf_or_nan_is_not_counted_unchanged_nor_moved_least(tmp_path, capsys):
    """Its finite positions did not move, but it changed: the headline's 'unchanged' leaves it out, and 'moved
    least' never lists it; a layer holding the same Inf on both sides (a mask buffer) is unchanged."""
    base = {f"l{i}.weight": torch.arange(8.0) + i for i in range(4)}
    base["mask"] = torch.tensor([0.0, float("-inf"), float("-inf"), 0.0])
    moved = {key: value.clone() for key, value in base.items()}
    moved["l0.weight"][3] = float("inf")
    moved["l1.weight"][5] = float("nan")
    moved["l2.weight"][0] += 0.5
    torch.save(base, tmp_path / "a.pth")
    torch.save(moved, tmp_path / "b.pth")
    assert main(["diff", "--stats", str(tmp_path / "a.pth"), str(tmp_path / "b.pth")]) == 1
    text = capsys.readouterr().out
    assert "5 layers compared, 2 unchanged" in text, text  # l3 and the mask
    least = text.split("moved least", 1)[1] if "moved least" in text else ""
    assert "l0.weight" not in least and "l1.weight" not in least, text
