"""A view that repeats its stored elements (``expand``, stride 0) costs its storage in every reader of values.

A 1 KB file can hold ``torch.ones(1, 1).expand(1, 2**32)``: ``diff``, ``diff --stats``, a diff of ranks
and ``average`` read each stored element once with its count (as ``stats`` and ``check`` do); views laid
out differently on the two sides are not walked element by element; a ``.safetensors`` output, which
cannot hold views, refuses such a tensor (naming it, suggesting ``.pth``) and a ``.pth`` keeps the view.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ckpt_tui.cli import main

BIG = 2**32  # 16 GiB of float32 if it were ever materialised


def save(path: Path, value: float, rows: int = 1, cols: int = BIG, along: int = 1) -> Path:
    base = torch.full((rows, 1) if along == 1 else (1, cols), value)
    torch.save({"w": base.expand(rows, cols), "b": torch.arange(3.0) * value}, path)
    return path


def run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main([*map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_diff_of_a_file_with_itself_reads_the_storage_once(tmp_path: Path, capsys) -> None:
    path = save(tmp_path / "a.pth", 1.0)
    code, out, _ = run(capsys, "diff", path, path)
    assert code == 0 and "identical" in out


def test_diff_reports_the_change_of_a_repeated_view(tmp_path: Path, capsys) -> None:
    code, out, _ = run(capsys, "diff", save(tmp_path / "a.pth", 1.0), save(tmp_path / "b.pth", 3.0))
    assert code == 1 and "w: max |a-b| 2" in out and "NOT close" not in out


def test_diff_stats_weights_each_stored_element_by_its_count(tmp_path: Path, capsys) -> None:
    code, out, _ = run(
        capsys, "diff", "--stats", "--json", save(tmp_path / "a.pth", 1.0), save(tmp_path / "b.pth", 3.0)
    )
    rows = {row["path"][0]: row for row in json.loads(out)["layers"]}
    w = rows["w"]
    assert code == 1  # the files differ
    assert w["norm_a"] == pytest.approx(BIG**0.5) and w["norm_b"] == pytest.approx(3 * BIG**0.5)
    assert w["relative_change"] == pytest.approx(2.0) and w["cosine"] == pytest.approx(1.0)


def test_views_laid_out_differently_are_not_walked_element_by_element(tmp_path: Path, capsys) -> None:
    rows = save(tmp_path / "rows.pth", 3.0, rows=2**16, cols=2**16, along=1)  # stride (1, 0)
    cols = save(tmp_path / "cols.pth", 3.0, rows=2**16, cols=2**16, along=0)  # stride (0, 1)
    code, out, _ = run(capsys, "diff", rows, cols)
    assert "w: a view of 4294967296 elements over 65536 stored" in out and "not compared" in out
    code, out, _ = run(capsys, "diff", "--stats", rows, cols)
    assert code == 1 and "1 not compared" in out  # not shown equal
    code, _, err = run(capsys, "average", rows, cols, "-o", tmp_path / "avg.pth")
    assert code == 2 and "laid out differently" in err and not (tmp_path / "avg.pth").exists()


def test_a_diff_of_ranks_compares_repeated_views_by_their_storage(tmp_path: Path, capsys) -> None:
    a, b = save(tmp_path / "a.pth", 1.0), save(tmp_path / "b.pth", 3.0)
    code, out, _ = run(capsys, "diff", a, b, a)
    assert code == 1 and "max |rank - rank 0| = 2 (rank 1)" in out and "ranks 0,2" in out


def test_average_keeps_a_repeated_view_a_view(tmp_path: Path, capsys) -> None:
    a, b = save(tmp_path / "a.pth", 1.0), save(tmp_path / "b.pth", 3.0)
    code, _, err = run(capsys, "average", a, b, "-o", tmp_path / "avg.pth")
    assert code == 0, err
    assert (tmp_path / "avg.pth").stat().st_size < 4096
    out = torch.load(tmp_path / "avg.pth", weights_only=True)
    assert out["w"].shape == (1, BIG) and out["w"].stride() == (1, 0)
    assert out["w"][0, 0].item() == 2.0 and out["w"][0, -1].item() == 2.0
    assert torch.equal(out["b"], torch.arange(3.0) * 2)


def test_safetensors_output_refuses_a_view_far_larger_than_its_storage(tmp_path: Path, capsys) -> None:
    source = save(tmp_path / "a.pth", 1.0)
    code, _, err = run(capsys, "convert", source, "-o", tmp_path / "out.safetensors")
    assert code == 2 and err.count("\n") == 1
    assert "'w': a view of 4294967296 elements over 1 stored" in err and ".pth" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pth"]


def test_pth_output_keeps_the_view(tmp_path: Path, capsys) -> None:
    code, _, err = run(capsys, "convert", save(tmp_path / "a.pth", 1.0), "-o", tmp_path / "out.pth")
    assert code == 0, err
    out = torch.load(tmp_path / "out.pth", weights_only=True)["w"]
    assert out.shape == (1, BIG) and out.stride() == (1, 0) and out.untyped_storage().nbytes() == 4


def test_a_small_expand_is_still_written_to_safetensors(tmp_path: Path, capsys) -> None:
    torch.save({"w": torch.arange(4.0).expand(8, 4)}, tmp_path / "a.pth")
    code, _, err = run(capsys, "convert", tmp_path / "a.pth", "-o", tmp_path / "out.safetensors")
    assert code == 0, err
    from safetensors.torch import load_file

    assert torch.equal(load_file(tmp_path / "out.safetensors")["w"], torch.arange(4.0).expand(8, 4))


def test_diff_stats_counts_a_repeated_nan_as_often_as_the_view_holds_it(tmp_path: Path, capsys) -> None:
    """A multiplicity-counted view (overlapping rows) with a NaN: each count is the view's, as torch sees it."""
    a, b = torch.tensor([float("nan"), 1.0, 2.0]), torch.tensor([float("nan"), 1.0, 4.0])
    torch.save({"w": a.as_strided((5, 2), (0, 1))}, tmp_path / "a.pth")
    torch.save({"w": b.as_strided((5, 2), (0, 1))}, tmp_path / "b.pth")
    code, out, _ = run(capsys, "diff", "--stats", "--json", tmp_path / "a.pth", tmp_path / "b.pth")
    row = json.loads(out)["layers"][0]
    assert code == 1 and row["nonfinite"] == 5 and row["norm_a"] == pytest.approx(5**0.5)
    overlapping = torch.tensor([1.0, 2.0, 3.0, 4.0]).as_strided((3, 2), (1, 1))  # counts 1, 2, 2, 1
    torch.save({"w": overlapping}, tmp_path / "c.pth")
    code, out, _ = run(capsys, "diff", "--stats", "--json", tmp_path / "c.pth", tmp_path / "c.pth")
    row = json.loads(out)["layers"][0]
    assert row["norm_a"] == pytest.approx(float(overlapping.norm())) and row["relative_change"] == 0
    assert code == 0  # a file against itself: nothing moved
