"""Every command ckpt-tui prints runs exactly one ckpt-tui command when pasted, whatever the file's
key names hold, and reaches what it promises. Each command is pasted through ``bash -c`` with a
logging ``ckpt-tui`` on PATH: the log is the canary for "exactly one command, these arguments"."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from builders import (
    TinyNet,
    compiled_state_dict,
    ddp_state_dict,
    lightning_checkpoint,
    save_cuda_tagged,
    save_whole_module,
    tiny_state_dict,
    training_checkpoint,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from printed_commands import Shell

from ckpt_tui.cli import main
from ckpt_tui.core.runtime.safe_text import printable
from ckpt_tui.core.runtime.shell import join_command, quote_arg

HOSTILE = [
    "$(touch PWNED)",
    "`touch PWNED`",
    "a; touch PWNED",
    "a && touch PWNED",
    "it's",
    'say "hi"',
    "two words",
    "new\nline; touch PWNED",
    "tab\there",
    "\x1b[8mhidden\x1b[0m",
    "\x1b]0;title\x07",
    "\u202eevil",
    "\x85c1",
    "-rf",
    "--force",
    "--output=/tmp/elsewhere",
    "!!",
    "$HOME",
    "*",
    "back\\slash",
    "~",
    "a|b>c<d",
    "#comment",
    "{a,b}",
    "ünïcödé",
]


def json_out(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict[str, Any]]:
    code = main(argv)
    return code, json.loads(capsys.readouterr().out)


def assert_inert(text: str) -> None:
    """Nothing in printed text can act on a terminal."""
    for line in text.splitlines():
        assert printable(line) == line, repr(line)


@pytest.mark.parametrize("name", HOSTILE, ids=[repr(n) for n in HOSTILE])
def test_extract_suggestion_with_a_hostile_key_runs_one_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    torch.save({name: ddp_state_dict(), "epoch": 1}, tmp_path / "train.pth")
    torch.save(tiny_state_dict(), tmp_path / "plain.pth")
    argv = ["check", str(tmp_path / "train.pth"), "--against", str(tmp_path / "plain.pth"), "--json"]
    code, report = json_out(capsys, argv)
    assert code == 1
    suggestion = report["suggestion"]
    assert suggestion["full_match"]
    main(["check", str(tmp_path / "train.pth"), "--against", str(tmp_path / "plain.pth")])
    text = capsys.readouterr().out
    assert_inert(text)
    printed = text.splitlines()[-1].strip()
    assert printed == suggestion["command"]
    shell = Shell(tmp_path)
    result = shell.paste(printed)
    assert result.returncode == 0, result.stderr
    assert shell.invocations() == [suggestion["argv"][1:]]
    assert not (tmp_path / "PWNED").exists() and not Path("/tmp/elsewhere").exists()
    capsys.readouterr()
    assert main(["check", str(tmp_path / "train.fixed.pth"), "--against", str(tmp_path / "plain.pth")]) == 0


def test_a_key_no_path_can_name_gets_no_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save({"": ddp_state_dict(), "epoch": 1}, tmp_path / "train.pth")
    torch.save(tiny_state_dict(), tmp_path / "plain.pth")
    argv = ["check", str(tmp_path / "train.pth"), "--against", str(tmp_path / "plain.pth"), "--json"]
    code, report = json_out(capsys, argv)
    assert code == 1 and "suggestion" not in report  # never a command that would not do what it says


@pytest.mark.parametrize("name", ["\ud800", "a\udcffb", "\udfff\ud83d"], ids=["high", "low", "pair-reversed"])
def test_a_key_with_a_lone_surrogate_round_trips_through_the_pasted_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """A pickle may hold any str; the printed command writes it as UTF-8 bytes, which ckpt-tui reads back."""
    torch.save({name: ddp_state_dict(), "epoch": 1}, tmp_path / "train.pth")
    torch.save(tiny_state_dict(), tmp_path / "plain.pth")
    main(["check", str(tmp_path / "train.pth"), "--against", str(tmp_path / "plain.pth")])
    printed = capsys.readouterr().out.splitlines()[-1].strip()
    assert_inert(printed)
    result = Shell(tmp_path).paste(printed)
    assert result.returncode == 0, result.stderr
    assert main(["check", str(tmp_path / "train.fixed.pth"), "--against", str(tmp_path / "plain.pth")]) == 0


def test_a_key_holding_nul_gets_a_comment_not_a_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No argv can carry NUL: the printed line says so and does nothing when pasted."""
    torch.save({"a\x00b": ddp_state_dict(), "epoch": 1}, tmp_path / "train.pth")
    torch.save(tiny_state_dict(), tmp_path / "plain.pth")
    main(["check", str(tmp_path / "train.pth"), "--against", str(tmp_path / "plain.pth")])
    printed = capsys.readouterr().out.splitlines()[-1].strip()
    assert printed.startswith("# ") and "NUL" in printed
    shell = Shell(tmp_path)
    assert shell.paste(printed).returncode == 0 and shell.invocations() == []


@pytest.mark.parametrize("name", HOSTILE[:13] + HOSTILE[14:], ids=[repr(n) for n in HOSTILE[:13] + HOSTILE[14:]])
def test_drop_suggestion_with_hostile_keys_runs_one_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    # a head of another size: the last key, and a minority of them (most keys of another size is another model)
    body = {"base.weight": torch.ones(3, 2), "base.bias": torch.ones(3), "mid.weight": torch.ones(3, 3)}
    state = {**body, f"{name}.weight": torch.ones(7, 3)}
    reference = {**body, f"{name}.weight": torch.ones(5, 3)}
    torch.save(state, tmp_path / "ckpt.pth")
    torch.save(reference, tmp_path / "ref.pth")
    main(["check", str(tmp_path / "ckpt.pth"), "--against", str(tmp_path / "ref.pth")])
    text = capsys.readouterr().out
    assert_inert(text)
    shell = Shell(tmp_path)
    assert shell.paste(text.splitlines()[-1].strip()).returncode == 0
    (invocation,) = shell.invocations()
    assert f"{name}.weight" in invocation or f"--drop={name}.weight" in invocation
    assert not (tmp_path / "PWNED").exists()
    assert list(torch.load(tmp_path / "ckpt.fixed.pth")) == list(body)


@pytest.mark.parametrize("name", ["$(touch PWNED)", "a;b", "it's", "-x", "\x1b[2J"])
def test_info_fix_hints_with_hostile_prefixes_run_one_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    prefix = name + "."
    torch.save({"run": {prefix + k: v for k, v in tiny_state_dict().items()}}, tmp_path / "f.pth")
    main(["info", str(tmp_path / "f.pth")])
    text = capsys.readouterr().out
    assert_inert(text)
    hints = [line.split(": ", 1)[1] for line in text.splitlines() if line.strip().startswith(("fix:", "if needed:"))]
    assert hints
    shell = Shell(tmp_path)
    for hint in hints:
        result = shell.paste(hint)
        assert result.returncode == 0, (hint, result.stderr)
        assert len(shell.invocations()) == 1
        (tmp_path / "f.fixed.pth").unlink()
    assert not (tmp_path / "PWNED").exists()


def test_input_paths_that_look_like_options_or_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "-dir $(touch PWNED)"
    folder.mkdir()
    torch.save(ddp_state_dict(), folder / "-weights; rm -rf x.pth")
    torch.save(tiny_state_dict(), tmp_path / "plain.pth")
    shell = Shell(folder)
    main(["check", str(folder / "-weights; rm -rf x.pth"), "--against", str(tmp_path / "plain.pth")])
    command = capsys.readouterr().out.splitlines()[-1].strip()
    assert shell.paste(command).returncode == 0
    assert len(shell.invocations()) == 1
    assert (folder / "-weights; rm -rf x.fixed.pth").exists()
    relative = Shell(folder)
    monkeypatch.chdir(folder)
    from ckpt_tui.core.operations.compare import Step, Suggestion

    suggestion = Suggestion([Step("strip", "module.")], 9, 9, 0)
    assert relative.paste(suggestion.command("-weights; rm -rf x.pth")).returncode == 0
    expected = ["./-weights; rm -rf x.pth", "--output", "./-weights; rm -rf x.fixed-2.pth"]
    assert relative.invocations()[0][1:4] == expected
    assert not (tmp_path / "PWNED").exists()


def test_a_file_name_that_is_not_utf8_is_named_by_its_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The printed fix names the very file (its bytes, not the UTF-8 of Python's stand-ins for them), and
    ``--json`` gives the exact name back in ``path_bytes``."""
    import base64
    import os

    name = os.fsdecode(b"bad\xff\xfename.pth")
    torch.save(ddp_state_dict(), tmp_path / name)
    main(["info", str(tmp_path / name)])
    out = capsys.readouterr().out
    assert "bad\\xff\\xfename.pth" in out.splitlines()[0]
    fix = next(line.split("fix: ", 1)[1] for line in out.splitlines() if "fix: " in line)
    assert "$'" in fix and "\\xff\\xfe" in fix and "\\xed" not in fix
    result = Shell(tmp_path).paste(fix)
    assert result.returncode == 0, result.stderr
    assert os.fsencode(tmp_path / os.fsdecode(b"bad\xff\xfename.fixed.pth")) in [
        os.fsencode(tmp_path / entry) for entry in os.listdir(tmp_path)
    ]
    for command in ("info", "check"):
        _, report = json_out(capsys, [command, "--json", str(tmp_path / name)])
        assert base64.b64decode(report["path_bytes"]) == os.fsencode(tmp_path / name)
        assert report["path"].endswith("bad\\xff\\xfename.pth")
    _, report = json_out(capsys, ["diff", "--stats", "--json", *[str(tmp_path / name)] * 3])
    assert [base64.b64decode(exact) for exact in report["files_bytes"]] == [os.fsencode(tmp_path / name)] * 3


def test_a_file_whose_records_are_missing_is_offered_no_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """convert reads every record it writes: a fix for a file cut short would fail as it is pasted."""
    whole = tmp_path / "whole.pth"
    torch.save({"model": ddp_state_dict()}, whole, _use_new_zipfile_serialization=False)
    data = whole.read_bytes()
    cut = tmp_path / "cut.pth"
    cut.write_bytes(data[: len(data) // 2])
    assert main(["info", str(cut)]) == 0
    out = capsys.readouterr().out
    assert "storage records are missing" in out and "no fix is offered" in out
    assert "fix:" not in out and "if needed:" not in out and "ckpt-tui convert" not in out
    _, report = json_out(capsys, ["info", "--json", str(cut)])
    assert all("fix" not in finding for finding in report["findings"])
    assert any(finding["kind"] == "prefix" for finding in report["findings"])
    torch.save(dict(tiny_state_dict()), tmp_path / "plain.pth")
    against = ["check", str(cut), "--against", str(tmp_path / "plain.pth")]
    assert main(against) == 1
    out = capsys.readouterr().out
    assert "suggested fix" in out and "ckpt-tui convert" not in out
    assert "# no command: 9 storage records are missing from the file" in out
    _, report = json_out(capsys, [*against, "--json"])
    assert report["suggestion"]["command"].startswith("# no command: 9 storage records are missing")
    assert "argv" not in report["suggestion"]


FIXTURES = {
    "ddp": lambda tmp: torch.save(ddp_state_dict(), tmp),
    "training checkpoint": lambda tmp: torch.save(training_checkpoint(), tmp),
    "compiled": lambda tmp: torch.save(compiled_state_dict(), tmp),
    "lightning": lambda tmp: torch.save(lightning_checkpoint(), tmp),
    "whole module": lambda tmp: save_whole_module(tmp),
    "whole DataParallel module": lambda tmp: save_whole_module(tmp, data_parallel=True),
    "saved on cuda": lambda tmp: save_cuda_tagged(training_checkpoint(), tmp),
}


@pytest.mark.parametrize("name", list(FIXTURES))
def test_every_info_fix_hint_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    source = tmp_path / "source.pth"
    FIXTURES[name](source)
    main(["info", str(source)])
    text = capsys.readouterr().out
    fixes = ("fix:", "if needed:", "all ")
    hints = [line.split(": ", 1)[1] for line in text.splitlines() if line.strip().startswith(fixes) and ": " in line]
    assert hints, text
    shell = Shell(tmp_path)
    for hint in hints:
        assert "--output" in hint and str(source) + " " not in hint.split("--output")[1]
        result = shell.paste(hint)
        assert result.returncode == 0, (hint, result.stderr)
        assert len(shell.invocations()) == 1
        # each hint names its own new file (.fixed, or .sanitized for a fix that only sanitizes)
        Path(hint.split("--output ")[1].split(" ")[0]).unlink()


@settings(max_examples=60, deadline=None)
@given(st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=30))
def test_quote_arg_round_trips_through_bash(text: str) -> None:
    quoted = quote_arg(text)
    assert printable(quoted) == quoted
    result = subprocess.run(["bash", "-c", "printf '%s' " + quoted], capture_output=True, timeout=30)
    assert result.stdout == text.encode("utf-8")


def test_join_command_keeps_arguments_apart() -> None:
    argv = ["ckpt-tui", "convert", "a b", "--extract=-x", "$(x)"]
    result = subprocess.run(
        ["bash", "-c", "printf '%s\\n' " + join_command(argv[2:])], capture_output=True, text=True, timeout=30
    )
    assert result.stdout.splitlines() == argv[2:]


def test_tinynet_is_the_reference_model() -> None:
    assert set(TinyNet().state_dict()) == set(tiny_state_dict())


def test_sanitize_is_offered_only_where_it_can_rewrite_every_blocker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--sanitize refuses code: a file whose blockers include code gets no sanitize command."""
    import argparse
    import collections

    torch.save({"w": torch.ones(2), "args": argparse.Namespace(lr=0.1)}, tmp_path / "data.pth")
    torch.save({"w": torch.ones(2), "make": collections.Counter}, tmp_path / "code.pth")
    main(["check", str(tmp_path / "data.pth")])
    data_text = capsys.readouterr().out
    main(["check", str(tmp_path / "code.pth")])
    code_text = capsys.readouterr().out
    assert "--sanitize" in data_text and "--sanitize" not in code_text
    command = next(line for line in data_text.splitlines() if "--sanitize" in line).split(":  ", 1)[1]
    assert Shell(tmp_path).paste(command).returncode == 0
    assert torch.load(tmp_path / "data.sanitized.pth", weights_only=True)["args"] == {"lr": 0.1}
