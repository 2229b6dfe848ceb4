"""What the CLI prints fits a terminal of 80 columns and reads as a careful engineer would want it (a new
user's walk at 80×24): per-layer rows never wrap (a cosine near 1 is said in its column), the bar plot is
scaled by the parameters (a step counter does not shrink every weight to a sliver), the norm series lists
the model apart from its optimizer state, sentences wrap between words, ``info`` gives its fixes as one
command too, a dry run says nothing was written, and ``--rename`` of a module's name names the option meant."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from ckpt_tui.cli import main
from ckpt_tui.core.operations.reports import COSINE_WIDTH, cosine_text, render_text
from ckpt_tui.core.values.text_plots import wrapped


def _training(path: Path, step: int, scale: float) -> None:
    """A training checkpoint at ``step``: every float tensor of one start times ``1 + scale`` (a relative
    change of ``scale`` between two steps), a BatchNorm step counter, SGD momentum."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    state = {key: value.clone() for key, value in model.state_dict().items()}
    for key, value in state.items():
        if value.is_floating_point():
            state[key] = (torch.rand(value.shape) + 0.5) * (1 + scale)
    state["1.num_batches_tracked"].fill_(step)
    optimizer = {
        "state": {i: {"momentum_buffer": torch.full((4,), scale * i + 1.0)} for i in range(3)},
        "param_groups": [{"lr": 0.001 * step, "params": [0, 1, 2]}],
    }
    torch.save({"state_dict": state, "optimizer": optimizer, "epoch": step}, path)


@pytest.mark.parametrize("cosine", [1.0, 0.99978, 0.9999951, 0.99999990, 1 - 3.5e-12, -0.99999990, 0.5, -1.0])
def test_a_cosine_fits_its_column(cosine: float) -> None:
    text = cosine_text(cosine)
    assert len(text) <= COSINE_WIDTH, text
    # "1" only for 1 itself; any other cosine shows how far from 1 it is
    assert (text == "1") == (cosine == 1.0), text


def test_diff_stats_rows_fit_and_bars_scale_by_the_parameters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for step, scale in ((20, 0.0), (30, 1e-3)):
        _training(tmp_path / f"s{step}.pth", step, scale)
    monkeypatch.setattr("ckpt_tui.cli.commands.terminal_width", lambda: 80)
    assert main(["diff", str(tmp_path / "s20.pth"), str(tmp_path / "s30.pth"), "--stats"]) == 1
    out = capsys.readouterr().out
    assert all(len(line) <= 80 for line in out.splitlines()), [line for line in out.splitlines() if len(line) > 80]
    assert "▶ past it" in " ".join(out.split())
    # the counter moved by half (20 → 30): past the parameters' full bar, it ends in ▶, and some weight's bar is full
    counter = next(line for line in out.splitlines() if "num_batches_tracked" in line and "█" in line)
    assert "▶" in counter
    assert any(line.count("█") > 30 and "▶" not in line for line in out.splitlines())


def test_the_norm_series_lists_the_model_apart_from_its_optimizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for step, scale in ((10, 0.0), (20, 1e-3), (30, 2e-3)):
        _training(tmp_path / f"s{step}.pth", step, scale)
    files = [str(tmp_path / f"s{step}.pth") for step in (10, 20, 30)]
    assert main(["diff", *files, "--stats"]) == 1
    out = capsys.readouterr().out
    model, apart = out.split("optimizer state and other tensors")
    assert "under state_dict/" in model and "momentum_buffer" not in model
    assert re.search(r"^  0\.weight ", model, re.M), model
    assert 'under ckpt["optimizer"]["state"]' in apart and apart.count("momentum_buffer") == 3


def test_sentences_wrap_between_words() -> None:
    line = "per-layer change: 16 layers of the model and 10 other tensors compared, 2 unchanged, median 0.00192"
    lines = wrapped(line, 80, 2)
    assert len(lines) == 2 and all(len(part) <= 80 for part in lines)
    assert " ".join(part.strip() for part in lines) == line


def test_render_text_wraps_its_sentences_and_keeps_rows() -> None:
    from ckpt_tui.core.operations.reports import Report, Row, Section

    long = "word " * 30
    report = Report("T", "per-layer change", True, long.strip(), [long.strip()], [Section(long, [Row("x" * 78)], 1)])
    lines = render_text(report, width=80).splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert "  " + "x" * 78 in lines


def test_info_gives_every_fix_as_one_command_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ckpt_tui.core.operations.demo import write_demo

    demo = write_demo(tmp_path)
    assert main(["info", str(demo.checkpoint)]) in (0, 1)
    out = capsys.readouterr().out
    fixes = re.findall(r"fix: (ckpt-tui convert .*)", out)
    outputs = [re.search(r"--output (\S+)", fix).group(1) for fix in fixes]  # type: ignore[union-attr]
    assert len(fixes) == 2 and len(set(outputs)) == 2, fixes  # the sanitized copy is named apart
    combined = re.search(r"all 2 fixes in one: ckpt-tui convert (.*)", out)
    assert combined is not None, out
    argv = combined.group(1).split()
    assert main(["convert", *argv]) == 0
    capsys.readouterr()
    written = Path(argv[argv.index("--output") + 1])
    reference = torch.load(demo.reference, weights_only=True)
    model = torch.load(written, weights_only=True)
    assert set(model) == set(reference)


def test_a_dry_run_says_nothing_was_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "m.pth"
    torch.save({"fc.weight": torch.ones(2, 2), "fc.bias": torch.ones(2)}, source)
    out = tmp_path / "o.pth"
    assert main(["convert", str(source), "-o", str(out), "--dry-run", "--rename-prefix", "fc.=head."]) == 0
    assert "dry run: nothing written" in capsys.readouterr().out
    assert not out.exists()


def test_rename_of_a_module_name_points_at_rename_prefix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "m.pth"
    torch.save({"fc.weight": torch.ones(2, 2), "fc.bias": torch.ones(2)}, source)
    assert main(["convert", str(source), "-o", str(tmp_path / "o.pth"), "--rename", "fc=head"]) == 2
    said = capsys.readouterr().err
    assert "use --rename-prefix fc.=head." in said, said
    rule = said.split("use ")[1].strip().split()
    assert main(["convert", str(source), "-o", str(tmp_path / "o.pth"), *rule]) == 0
    assert set(torch.load(tmp_path / "o.pth", weights_only=True)) == {"head.weight", "head.bias"}


def test_average_lists_the_values_that_differ_in_one_notation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for step, scale in ((10, 0.0), (20, 1e-3)):
        _training(tmp_path / f"s{step}.pth", step, scale)
    files = [str(tmp_path / f"s{step}.pth") for step in (10, 20)]
    assert main(["average", *files, "-o", str(tmp_path / "avg.pth")]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "between the files; the first" in line)
    listed = line.split("kept: ")[1].split(", ")
    assert len(listed) == 2 and all(key.startswith("ckpt[") for key in listed), listed


def test_a_training_checkpoint_to_safetensors_names_the_extract_that_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _training(tmp_path / "t.pth", 10, 0.0)
    assert main(["convert", str(tmp_path / "t.pth"), "-o", str(tmp_path / "t.safetensors")]) == 2
    said = capsys.readouterr().err
    assert "use --extract state_dict (the model weights are there)" in said, said
    assert (
        main(["convert", str(tmp_path / "t.pth"), "-o", str(tmp_path / "t.safetensors"), "--extract", "state_dict"])
        == 0
    )
