"""Command-line errors are one line with the way forward: what is missing and the command's form, the
command or option meant by a typo, the keys that are there when a path is not; exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from builders import ddp_state_dict, many_keys, training_checkpoint

from ckpt_tui.cli import main


@pytest.fixture
def run_file(tmp_path: Path) -> Path:
    path = tmp_path / "run.pth"
    checkpoint = training_checkpoint(model_key="model_state_dict")
    torch.save(checkpoint, path)
    return path


def error_of(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """The exit code and what went to stderr (one line is asserted)."""
    try:
        code = main([str(arg) for arg in args])
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err
    return code, captured.err.strip()


def test_a_missing_file_names_only_what_is_required_without_a_usage_dump(
    run_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = error_of(capsys, "diff", run_file)
    assert code == 2
    assert err.startswith("ckpt-tui diff: missing B (usage: ckpt-tui diff A B [C ...]")
    assert "required" not in err and "C," not in err


def test_a_missing_output_is_named_as_usage_writes_it(run_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = error_of(capsys, "average", run_file, run_file)
    assert code == 2 and err.startswith("ckpt-tui average: missing -o OUTPUT")


def test_a_mistyped_command_says_the_command_line_meant(run_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = error_of(capsys, "inof", run_file)
    assert code == 2
    assert err == f"ckpt-tui: inof: no such command or file; did you mean: ckpt-tui info {run_file}"


def test_a_file_named_like_a_command_still_opens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    torch.save(ddp_state_dict(), tmp_path / "inof")
    assert main(["inof"]) == 0  # no terminal under pytest: the browser prints the file's info
    assert "inof" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "meant"),
    [(["info", "{file}", "--jsn"], "--json"), (["check", "{file}", "--againts", "{file}"], "--against")],
)
def test_a_mistyped_option_says_the_option_meant(
    run_file: Path, capsys: pytest.CaptureFixture[str], args: list[str], meant: str
) -> None:
    code, err = error_of(capsys, *[arg.format(file=run_file) for arg in args])
    assert code == 2 and err.endswith(f"did you mean {meant}?")


def test_an_unknown_option_points_at_help(run_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = error_of(capsys, "info", run_file, "--zzz")
    assert code == 2 and err == "ckpt-tui info: no option --zzz (ckpt-tui info --help lists every option)"


def test_a_mistyped_stats_column_says_the_column_meant(run_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = error_of(capsys, "stats", run_file, "--sort", "nrom")
    assert code == 2 and "(did you mean norm?)" in err


def test_a_path_not_in_the_file_lists_the_keys_there(
    run_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = error_of(capsys, "convert", run_file, "-o", tmp_path / "out.pth", "--extract", "model")
    assert code == 2
    assert err.startswith("ckpt-tui: no key 'model' at the root (did you mean 'model_state_dict'?); keys there: ")
    assert "epoch" in err and "optimizer" in err
    assert not (tmp_path / "out.pth").exists()


def test_the_keys_listed_stop_at_ten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save({"model": many_keys(25)}, tmp_path / "many.pth")
    code, err = error_of(capsys, "convert", tmp_path / "many.pth", "--dry-run", "--drop", "model/nothing.here")
    assert code == 2
    listed = err.split("keys there: ")[1]
    assert listed.endswith(", … 15 more") and len(listed.split(", ")) == 11


def test_a_read_only_option_path_lists_the_keys_too(run_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = error_of(capsys, "stats", run_file, "--at", "model")
    assert code == 2 and "--at 'model': no key 'model' at the root" in err and "model_state_dict" in err
