"""The CLI contract: JSON fields, exit codes, one-line errors, and what it imports."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from builders import ddp_state_dict, rewrite_zip, save_cuda_tagged, tiny_state_dict, training_checkpoint

from ckpt_tui.cli import main


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code = main(list(args))
    return code, json.loads(capsys.readouterr().out)


def test_info_json_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save_cuda_tagged(training_checkpoint(), tmp_path / "train.pth")
    code, info = run_json(capsys, "info", "--json", str(path))
    assert code == 0
    assert info["format"] == "zip"
    assert info["file_bytes"] == path.stat().st_size
    tensors = info["tensors"]
    assert info["tensor_count"] == len(tensors) == 9 + 18 + 0
    assert info["parameter_count"] == sum(math.prod(t["shape"]) for t in tensors)
    assert info["devices"] == {"cuda:0": len(tensors)}
    assert info["dtypes"] == {"float32": 26, "int64": 1}
    first = tensors[0]
    assert first["path"] == ["model", "module.conv.weight"]
    assert first["shape"] == [8, 3, 3, 3] and first["dtype"] == "float32" and first["device"] == "cuda:0"
    assert first["nbytes"] == 8 * 3 * 3 * 3 * 4 and isinstance(first["storage"], str)
    kinds = {f["kind"] for f in info["findings"]}
    assert {"prefix", "inner-state-dict", "optimizer", "cuda-tensors"} <= kinds
    prefix = next(f for f in info["findings"] if f["kind"] == "prefix")
    assert prefix["prefix"] == "module." and prefix["path"] == ["model"]


def test_info_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(ddp_state_dict(), tmp_path / "ddp.pth")
    assert main(["info", str(tmp_path / "ddp.pth")]) == 0
    out = capsys.readouterr().out
    assert "torch zip checkpoint" in out
    assert "start with 'module.'" in out
    assert "module.head.weight  Tensor [10, 8] float32 cpu" in out


def test_check_clean_and_nan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(tiny_state_dict(), tmp_path / "ok.pth")
    assert main(["check", str(tmp_path / "ok.pth")]) == 0
    state = tiny_state_dict()
    state["head.bias"][3] = float("nan")
    state["head.weight"][0, 0] = float("inf")
    torch.save(state, tmp_path / "nan.pth")
    capsys.readouterr()
    code, report = run_json(capsys, "check", "--json", str(tmp_path / "nan.pth"))
    assert code == 1 and not report["ok"]
    by_path = {tuple(p["path"]): p for p in report["problems"]}
    assert by_path[("head.bias",)]["nan"] == 1
    assert by_path[("head.weight",)]["inf"] == 1


def test_check_missing_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(tiny_state_dict(), tmp_path / "full.pth")
    broken = rewrite_zip(tmp_path / "full.pth", tmp_path / "broken.pth", drop="data/2")
    assert main(["check", str(broken)]) == 1
    out = capsys.readouterr().out
    assert "missing" in out and "data/2" in out


def bad_inputs(tmp_path: Path) -> dict[str, Path]:
    torch.save(tiny_state_dict(), tmp_path / "good.pth")
    good = (tmp_path / "good.pth").read_bytes()
    (tmp_path / "empty.pth").write_bytes(b"")
    (tmp_path / "truncated.pth").write_bytes(good[: len(good) // 2])
    (tmp_path / "random.pth").write_bytes(os.urandom(4096))
    (tmp_path / "notes.pth").write_text("these are not weights\n")
    (tmp_path / "folder").mkdir()
    (tmp_path / "header.safetensors").write_bytes((10**9).to_bytes(8, "little") + b"{}")
    (tmp_path / "cut.safetensors").write_bytes((40).to_bytes(8, "little") + b'{"a":{"dtype":"F32","shape":[4],')
    legacy = tmp_path / "legacy.pth"
    torch.save(tiny_state_dict(), legacy, _use_new_zipfile_serialization=False)
    (tmp_path / "legacy_cut.pth").write_bytes(legacy.read_bytes()[:300])
    return {
        "missing": tmp_path / "nope.pth",
        "directory": tmp_path / "folder",
        **{p.stem: p for p in tmp_path.iterdir() if p.stem in {"empty", "truncated", "random", "notes"}},
        "header": tmp_path / "header.safetensors",
        "cut": tmp_path / "cut.safetensors",
        "legacy_cut": tmp_path / "legacy_cut.pth",
    }


@pytest.mark.parametrize("command", ["info", "check"])
def test_bad_inputs_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    for name, path in bad_inputs(tmp_path).items():
        assert main([command, str(path)]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("ckpt-tui: ") and err.count("\n") == 1, (name, err)
        assert "Traceback" not in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_permissions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(tiny_state_dict(), tmp_path / "locked.pth")
    (tmp_path / "locked.pth").chmod(0)
    assert main(["info", str(tmp_path / "locked.pth")]) == 2
    assert "permission denied" in capsys.readouterr().err


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)


def test_help_imports_neither_torch_nor_textual() -> None:
    code = (
        "import sys; from ckpt_tui.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules and 'textual' not in sys.modules and 'numpy' not in sys.modules"
    )
    result = run("-c", code)
    assert result.returncode == 0, result.stderr
    assert "ckpt-tui FILE" in result.stdout


@pytest.mark.parametrize("columns", [80, 120])
def test_help_wraps_its_command_list_to_the_terminal_between_words(
    columns: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckpt_tui.cli.parser import COMMAND_LINES, COMMANDS

    monkeypatch.setenv("COLUMNS", str(columns))
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= columns
    # every word of the hand-written list is whole on some line: wrapped between words, never inside one
    words = set(out.split())
    for form, meaning in COMMAND_LINES:
        assert set(form.split()) <= words and set(meaning.split()) <= words
    assert "ckpt-tui convert FILE -o OUT  fix and save; edits apply in this order:" in out
    assert {line.split()[1] for line in out.splitlines() if line.startswith("  ckpt-tui ")} >= set(COMMANDS) - {"open"}


def test_core_never_imports_textual() -> None:
    code = (
        "import sys, pkgutil, importlib, ckpt_tui.core\n"
        "for m in pkgutil.walk_packages(ckpt_tui.core.__path__, 'ckpt_tui.core.'):\n"
        "    importlib.import_module(m.name)\n"
        "assert 'ckpt_tui.core.weights_only.scan' in sys.modules, 'the wings were not walked'\n"
        "assert 'textual' not in sys.modules, 'core imported textual'"
    )
    result = run("-c", code)
    assert result.returncode == 0, result.stderr


def test_info_does_not_import_torch(tmp_path: Path) -> None:
    torch.save(ddp_state_dict(), tmp_path / "ddp.pth")
    code = (
        "import sys; from ckpt_tui.cli import main\n"
        f"assert main(['info', '--json', {str(tmp_path / 'ddp.pth')!r}]) == 0\n"
        f"assert main(['info', {str(tmp_path / 'ddp.pth')!r}]) == 0\n"
        "assert 'torch' not in sys.modules\n"
        "writers = [m for m in sys.modules if m.startswith('ckpt_tui.core.writers.')]\n"
        "assert not writers, writers  # info names a fix; only a command that writes loads the writers"
    )
    result = run("-c", code)
    assert result.returncode == 0, result.stderr


def test_info_of_a_pth_imports_only_what_it_needs(tmp_path: Path) -> None:
    torch.save(ddp_state_dict(), tmp_path / "ddp.pth")
    unneeded = ["numpy", "orjson", "textual", "concurrent.futures", "signal", "shutil", "pickletools"]
    # text output needs no json; argparse's help no textwrap; local paths no pathlib or urllib
    unneeded += ["json", "textwrap", "pathlib", "urllib.parse"]
    # a file imports its own reader only (the detection table's probes need none)
    readers = ["sharded", "safetensors_file", "dcp", "deepspeed", "folder", "hf_dcp", "rank_set", "legacy"]
    unneeded += [f"ckpt_tui.core.readers.{name}" for name in [*readers, "embedded_zip", "torchscript"]]
    # the fix line needs convert's options, not its pipeline (no dry run for a prefix every key has)
    unneeded += ["ckpt_tui.core.operations.convert", "ckpt_tui.core.edits.tree_edits", "ckpt_tui.core.model.rebuild"]
    unneeded += ["ckpt_tui.core.conventions.training_state"]  # (no optimizer or scheduler in it)
    code = (
        # (what the interpreter imported before, e.g. an editable install's finder, is not info's doing)
        "import sys; before = set(sys.modules); from ckpt_tui.cli import main\n"
        f"assert main(['info', {str(tmp_path / 'ddp.pth')!r}]) == 0\n"
        f"print(sorted(name for name in {unneeded!r} if name in sys.modules and name not in before))"
    )
    result = run("-c", code)
    assert result.returncode == 0, result.stderr
    assert "fix: ckpt-tui convert" in result.stdout  # (a finding with its fix was printed)
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_diff_without_narrowing_options_imports_no_convert(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(3)}, tmp_path / "a.pth")
    torch.save({"w": torch.zeros(3)}, tmp_path / "b.pth")
    for stats in ([], ["--stats"]):
        code = (
            "import sys; from ckpt_tui.cli import main\n"
            f"assert main(['diff', {str(tmp_path / 'a.pth')!r}, {str(tmp_path / 'b.pth')!r}, *{stats!r}]) == 1\n"
            "print([m for m in ('ckpt_tui.core.operations.convert', 'ckpt_tui.core.writers.save') if m in sys.modules])"
        )
        result = run("-c", code)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip().splitlines()[-1] == "[]"


def test_info_of_a_clean_pth_imports_no_fix_checks(tmp_path: Path) -> None:
    torch.save(tiny_state_dict(), tmp_path / "plain.pth")
    unneeded = ["ckpt_tui.core.operations.hints", "ckpt_tui.core.operations.convert_options"]
    code = (
        "import sys; from ckpt_tui.cli import main\n"
        f"assert main(['info', {str(tmp_path / 'plain.pth')!r}]) == 0\n"
        f"print(sorted(name for name in {unneeded!r} if name in sys.modules))"
    )
    result = run("-c", code)
    assert result.returncode == 0, result.stderr
    assert "findings" not in result.stdout  # (nothing to say: no fix to check)
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_python_dash_m_runs_the_cli(tmp_path: Path) -> None:
    torch.save(ddp_state_dict(), tmp_path / "ddp.pth")
    result = run("-m", "ckpt_tui", "info", "--json", str(tmp_path / "ddp.pth"))
    assert result.returncode == 0 and json.loads(result.stdout)["tensor_count"] == 9
    bad = run("-m", "ckpt_tui", "info", str(tmp_path / "nothing.pth"))
    assert (
        bad.returncode == 2 and bad.stderr.strip() == f"ckpt-tui: {tmp_path / 'nothing.pth'}: no such file or directory"
    )


# ---- the command line itself ------------------------------------------------------------------


def test_readonly_before_the_file_and_no_terminal_prints_info(tmp_path: Path) -> None:
    from ckpt_tui.cli import with_command

    assert with_command(["--readonly", "x.pth"]) == ["open", "x.pth", "--readonly"]
    assert with_command(["x.pth", "--readonly"]) == ["open", "x.pth", "--readonly"]
    assert with_command(["--readonly", "demo"]) == ["demo", "--readonly"]
    assert with_command(["--readonly"]) == ["demo", "--readonly"]
    assert with_command(["info", "--readonly"]) == ["info", "--readonly"]
    torch.save(ddp_state_dict(), tmp_path / "ddp.pth")
    for argv in (["--readonly", str(tmp_path / "ddp.pth")], [str(tmp_path / "ddp.pth")]):
        result = subprocess.run(
            [sys.executable, "-m", "ckpt_tui", *argv],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert "torch zip checkpoint" in result.stdout and "module.head.weight" in result.stdout


def hostile_strings_checkpoint(tmp_path: Path) -> Path:
    """Keys, values and a location tag that carry terminal escapes."""
    state = {
        "\x1b]0;owned\x07conv.weight": torch.ones(2),
        "note": "\x1b[2J\x1b[31mred\x9b1m",
        "\u202eeulav": torch.zeros(1),
    }
    return save_cuda_tagged(state, tmp_path / "escapes.pth", device="cpu\x1b[8m")


def test_control_characters_from_the_file_are_escaped_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ckpt_tui.core.runtime.safe_text import printable

    path = hostile_strings_checkpoint(tmp_path)
    torch.save({"conv.weight": torch.ones(3)}, tmp_path / "ref.pth")
    runs = [
        ["info", str(path)],
        ["check", str(path)],
        ["check", str(path), "--against", str(tmp_path / "ref.pth")],
        ["diff", str(path), str(tmp_path / "ref.pth")],
        ["convert", str(path), "--dry-run", "--map-location", "cpu\x1b[8m=cpu"],
        ["convert", str(path), "--dry-run", "--rename", "\x1b]0;owned\x07conv.weight=\x1b[1mx"],
        ["convert", str(path), "--dry-run", "--extract", "\x1b[5mnothing"],
    ]
    for argv in runs:
        main(argv)
        captured = capsys.readouterr()
        for stream in (captured.out, captured.err):
            for line in stream.splitlines():
                assert printable(line) == line, (argv, line)
    main(["info", str(path)])
    out = capsys.readouterr().out
    assert "cpu\\x1b[8m" in out and "\\x1b]0;owned\\x07conv.weight" in out
    main(["info", "--json", str(path)])
    raw = capsys.readouterr().out
    assert "\x1b" not in raw and json.loads(raw)["devices"] == {"cpu\x1b[8m": 2}  # JSON stays JSON


def test_keys_file_with_invalid_utf8_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(tiny_state_dict(), tmp_path / "plain.pth")
    for name, data in {
        "early.txt": b"conv.weight\n\xff\xfe bad\n",
        "late.txt": b"conv.weight [8, 3, 3, 3]\n" * 40 + b"head.bias \xc3\x28\n",
        "nul.txt": b"conv.weight\x00\n",
    }.items():
        (tmp_path / name).write_bytes(data)
        assert main(["check", str(tmp_path / "plain.pth"), "--against", str(tmp_path / name)]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("ckpt-tui: ") and err.count("\n") == 1 and "Traceback" not in err, (name, err)


def test_diff_lists_the_keys_of_one_list_in_one_notation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(training_checkpoint(), tmp_path / "train.pth")
    torch.save({"epoch": 3}, tmp_path / "bare.pth")
    assert main(["diff", str(tmp_path / "train.pth"), str(tmp_path / "bare.pth")]) == 1
    out = capsys.readouterr().out
    listed = out.split("only in A", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    # optimizer state has int keys, which only the Python form names: then every key of the list has it
    assert '  ckpt["model"]["module.conv.weight"]' in listed and '  ckpt["optimizer"]["state"][0]["step"]' in listed
    assert all(line.startswith('  ckpt["') for line in listed if not line.startswith("  … and")), listed
    assert main(["diff", str(tmp_path / "train.pth"), str(tmp_path / "bare.pth"), "--json"]) == 1
    assert "model/module.conv.weight" in json.loads(capsys.readouterr().out)["only_in_a"]  # the JSON keys as they were


def test_diff_subtrees_with_prefixes_per_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(training_checkpoint(), tmp_path / "train.pth")
    fixed = {k.removeprefix("module."): v for k, v in training_checkpoint()["model"].items()}
    torch.save(fixed, tmp_path / "fixed.pth")
    train, plain = str(tmp_path / "train.pth"), str(tmp_path / "fixed.pth")
    assert main(["diff", train, plain, "--at-a", "model", "--strip-prefix-a", "module."]) == 0
    assert "identical: 9 tensors" in capsys.readouterr().out
    assert main(["diff", plain, train, "--at-b", "model", "--strip-prefix-b", "module."]) == 0
    capsys.readouterr()
    assert main(["diff", train, plain, "--at-a", "model"]) == 1
    assert "only in A" in capsys.readouterr().out
    assert main(["diff", train, plain, "--at-a", "nothing"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["check", train, "--at", "nothing", "--against", plain]) == 2
    assert "--at 'nothing'" in capsys.readouterr().err
    assert main(["diff", train, plain, "--at-a", "model", "--strip-prefix-a", "zzz."]) == 2
    assert "--strip-prefix-a" in capsys.readouterr().err


def test_cli_text_names_no_browser_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save_cuda_tagged(training_checkpoint(), tmp_path / "train.pth")
    main(["info", str(path)])
    out = capsys.readouterr().out
    assert "ckpt-tui convert" in out
    for browser_word in ("press", "`p`", "'p'", " p strips", "key p"):
        assert browser_word not in out


def test_a_single_tensor_is_counted_in_the_singular(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``1 tensor``, ``1 problem``, ``1 record``: every count the commands print agrees with its noun."""
    path = tmp_path / "one.pth"
    torch.save({"module.w": torch.tensor([float("nan"), 1.0])}, path)
    assert main(["check", str(path)]) == 1
    assert f"{path}: 1 tensor read: 1 problem" in capsys.readouterr().out
    assert main(["info", str(path)]) == 0
    assert "(root) dict (1) · 1 tensor · 2 elements" in capsys.readouterr().out
    assert main(["convert", str(path), "-o", str(tmp_path / "out.pth")]) == 0
    assert "(pth, 1 tensor, 1 record, " in capsys.readouterr().out


def test_every_command_the_parser_knows_has_one_handler() -> None:
    from ckpt_tui.cli.commands import HANDLERS
    from ckpt_tui.cli.parser import COMMANDS, build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    assert set(COMMANDS) == set(HANDLERS) == set(subparsers.choices or {})


def test_numpys_blas_runs_on_the_calling_thread_unless_the_user_chose_a_count(tmp_path: Path) -> None:
    # (a BLAS thread pool beside the stats workers only spins, taking a core from them)
    torch.save({"w": torch.randn(4, 4)}, tmp_path / "w.pth")
    code = (
        "import os, sys; from ckpt_tui.cli import main\n"
        f"assert main(['check', {str(tmp_path / 'w.pth')!r}]) == 0\n"
        "print(os.environ.get('OPENBLAS_NUM_THREADS'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    chosen = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert chosen.stdout.strip().splitlines()[-1] == "1", chosen.stderr
    env["OPENBLAS_NUM_THREADS"] = "3"
    kept = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert kept.stdout.strip().splitlines()[-1] == "3", kept.stderr


def test_info_on_a_terminal_wraps_its_sentences_to_its_width_and_leaves_commands_whole(tmp_path: Path) -> None:
    from ckpt_tui.cli.render import render_info
    from ckpt_tui.core.operations.info import summarize
    from ckpt_tui.core.readers.open import open_checkpoint

    torch.save({"model": ddp_state_dict(), "epoch": 3}, tmp_path / "a-long-name-for-a-ddp-checkpoint.pth")
    summary = summarize(open_checkpoint(str(tmp_path / "a-long-name-for-a-ddp-checkpoint.pth")))
    piped, shown = render_info(summary).splitlines(), render_info(summary, width=80).splitlines()
    command = next(line for line in piped if "ckpt-tui convert" in line)
    assert command in shown and len(command) > 80  # one line to copy, as the terminal folds it
    # the sentences: the values line and the findings (the path and the tree are names, left as they are)
    sentences = shown[shown.index(next(x for x in shown if x.startswith("  values"))) : shown.index("tree")]
    assert all(len(line) <= 80 for line in sentences if line != command)
    assert len(sentences) > len(
        piped[piped.index(next(x for x in piped if x.startswith("  values"))) : piped.index("tree")]
    )
    # the same words, only the line breaks differ
    assert " ".join(" ".join(piped).split()) == " ".join(" ".join(shown).split())
