"""One meaning in one place: the CLI and the browser name outputs, accept cast names and build fix
commands through the same core code, so what one face proposes the other agrees with."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
import torch
from builders_tui import browser, fixed_state_dict, fixed_training_checkpoint, loaded, save_fixed_training, settle

from ckpt_tui.cli import build_parser, main
from ckpt_tui.core.edits import tree_edits as edits
from ckpt_tui.core.edits.tree_edits import RenameRule
from ckpt_tui.core.errors import EditError
from ckpt_tui.core.operations.compare import Step, Suggestion
from ckpt_tui.core.runtime.shell import join_command
from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.screens.compare import fix_command
from ckpt_tui.tui.screens.dialogs import SaveScreen
from ckpt_tui.tui.screens.report import ReportScreen

SIZE = (160, 50)


def output_of(command: str) -> str:
    """The ``--output`` of a printed ``ckpt-tui convert`` command."""
    argv = shlex.split(command[command.index("ckpt-tui convert") :])
    return argv[argv.index("--output") + 1]


async def test_cli_browser_report_and_save_dialog_propose_the_same_free_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train_file = save_fixed_training(tmp_path / "best_model.pth")
    (tmp_path / "best_model.fixed.pth").write_bytes(b"taken")
    reference = tmp_path / "reference.pth"
    torch.save(fixed_state_dict(prefix=""), reference)
    free = str(tmp_path / "best_model.fixed-2.pth")
    # the CLI: info's fix and check --against's fix
    assert main(["info", str(train_file)]) == 0
    # (the model's fix: a fix that only sanitizes names its file .sanitized, as the browser does)
    said = capsys.readouterr().out.splitlines()
    info_fix = next(line for line in said if "ckpt-tui convert" in line and "--sanitize" not in line)
    assert main(["check", str(train_file), "--at", "model", "--against", str(reference)]) == 1
    check_fix = next(line for line in capsys.readouterr().out.splitlines() if "ckpt-tui convert" in line)
    assert output_of(info_fix) == output_of(check_fix) == free
    # the browser: the compare report's command, then the save dialog
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        browser(app).tree_view.reveal((("model",), None))
        await settle(pilot, "c")
        app.screen.query_one("Input").value = str(reference)
        await settle(pilot, "enter")
        assert isinstance(app.screen, ReportScreen)
        body = app.screen.query_one(".dialog-body").content.plain
        report_fix = next(line for line in body.splitlines() if line.startswith("ckpt-tui convert"))
        assert report_fix == check_fix[check_fix.index("ckpt-tui convert") :]
        await settle(pilot, "escape")
        browser(app).tree_view.reveal((("epoch",), None))
        await settle(pilot, "d", "y", "ctrl+s")
        assert isinstance(app.screen, SaveScreen)
        assert app.screen.query_one("#save-path").value == os.path.basename(free)


SUGGESTIONS = [
    [Step("drop", "head.weight")],
    [Step("rename", RenameRule.parse("module.=", anywhere=False))],
    [Step("rename", RenameRule.parse("attn=attention", anywhere=True))],
    [Step("add", "model.")],
    [Step("drop", "x"), Step("rename", RenameRule.parse("a.=b.", anywhere=False)), Step("add", "net.")],
]


@pytest.mark.parametrize("steps", SUGGESTIONS, ids=["drop", "rename-prefix", "rename-infix", "add", "chain"])
async def test_the_browsers_fix_command_is_cores_argv(tmp_path: Path, steps: list[Step]) -> None:
    train_file = save_fixed_training(tmp_path / "best_model.pth")
    suggestion = Suggestion(steps, 9, 9, 0, at=("model",))
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        command = fix_command(app, suggestion)
    assert command == [join_command(suggestion.argv(str(train_file)))]
    # and the command means the suggestion: the parser reads back each step
    args = build_parser().parse_args(shlex.split(command[0])[1:])
    assert args.drop == [s.arg for s in steps if s.kind == "drop"]
    assert [rule.describe() for rule in args.rename_rules] == [s.arg.describe() for s in steps if s.kind == "rename"]
    assert args.add_prefix == next((s.arg for s in steps if s.kind == "add"), None)


def test_every_cast_name_the_faces_accept_is_one_the_core_casts_to() -> None:
    from ckpt_tui.cli.parser import build_parser as parser

    for name in [*edits.CAST_NAMES, "torch.bfloat16", " HALF "]:
        dtype = edits.cast_dtype(name)
        assert parser().parse_args(["convert", "x.pth", "--dtype", name.strip()]).dtype == dtype
    for refused in ["double", "fp64", "int8"]:
        with pytest.raises(EditError):
            edits.cast_dtype(refused)


async def test_the_browser_refuses_a_cast_name_as_the_core_does(tmp_path: Path) -> None:
    train_file = save_fixed_training(tmp_path / "best_model.pth")
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "t")
        app.screen.query_one("Input").value = "double"
        await settle(pilot, "enter")
        assert any("cannot cast to 'double'" in str(n.message) for n in app._notifications)
        assert not browser(app).session.edited


FIXTURES = Path(__file__).parent / "fixtures"


def test_every_format_a_reader_makes_has_a_display_name() -> None:
    from ckpt_tui.core.model.formats import FORMAT_IDS, FORMAT_NAMES

    assert set(FORMAT_IDS) == set(FORMAT_NAMES)
    assert all(FORMAT_NAMES[name] != name or name == "safetensors" for name in FORMAT_IDS)


@pytest.mark.parametrize(
    ("folder", "name"),
    [
        (FIXTURES / "deepspeed" / "zero2_fp32" / "global_step2", "DeepSpeed checkpoint folder"),
        (FIXTURES / "accelerate" / "save_state", "folder of checkpoint files saved together"),
    ],
)
def test_info_names_the_format_in_words(folder: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(folder)]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("  format"))
    assert line.split(None, 1)[1].startswith(name + ",")


def test_one_progress_message_throttled_and_replacing_the_stale_one() -> None:
    from ckpt_tui.tui.messages import Progress, ProgressPoster

    posted: list[Progress] = []
    poster = ProgressPoster(posted.append, "check")  # type: ignore[arg-type]
    for done in range(1001):
        poster(done, 1000)
    assert 45 <= len(posted) <= 51 and posted[-1].fraction >= 0.98
    assert Progress("check", 0.1).can_replace(Progress("check", 0.2))
    assert not Progress("check", 0.1).can_replace(Progress("save", 0.2))
    assert not Progress("stats", 0.1, request=1).can_replace(Progress("stats", 0.2, request=2))
    stopped: list[Progress] = []
    ProgressPoster(stopped.append, "layers", cancelled=lambda: True)(5, 10)  # type: ignore[arg-type]
    assert stopped == []


async def test_the_browsers_diff_report_is_cores(tmp_path: Path) -> None:
    from ckpt_tui.core.operations.diff import diff
    from ckpt_tui.core.operations.reports import describe_diff, headline
    from ckpt_tui.core.readers.open import open_checkpoint

    train_file = save_fixed_training(tmp_path / "best_model.pth")
    other = fixed_training_checkpoint()
    del other["scheduler"]
    key = next(iter(other["model"]))
    other["model"][key] = other["model"][key] + 1
    other["model"]["extra.weight"] = torch.zeros(2)
    torch.save(other, tmp_path / "other.pth")
    report = diff(open_checkpoint(str(train_file)), open_checkpoint(str(tmp_path / "other.pth")))
    described = describe_diff(report, "best_model.pth", "other.pth")
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "D")
        app.screen.query_one("Input").value = str(tmp_path / "other.pth")
        await settle(pilot, "enter")
        assert isinstance(app.screen, ReportScreen)
        assert app.screen.query_one(".dialog-body").content.plain.splitlines()[0] == headline(described)
        shown = [(title, [text.plain for _, text in rows]) for title, rows in app.screen.sections if rows]
    assert shown == [(s.title, [row.text for row in s.rows]) for s in described.sections if s.rows]


async def test_the_browsers_compare_report_is_cores(tmp_path: Path) -> None:
    from ckpt_tui.core.operations.compare import compare_checkpoint, load_reference
    from ckpt_tui.core.operations.reports import describe_compare, headline
    from ckpt_tui.core.readers.open import open_checkpoint

    train_file = save_fixed_training(tmp_path / "best_model.pth")
    reference = fixed_state_dict(prefix="")
    reference["head.weight"] = torch.zeros(3)
    del reference[next(iter(reference))]
    torch.save(reference, tmp_path / "reference.pth")
    checkpoint = open_checkpoint(str(train_file))
    report = compare_checkpoint(checkpoint.root, ("model",), load_reference(str(tmp_path / "reference.pth"), None))
    described = describe_compare(report, "best_model.pth", "reference.pth", ("model",))
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        browser(app).tree_view.reveal((("model",), None))
        await settle(pilot, "c")
        app.screen.query_one("Input").value = str(tmp_path / "reference.pth")
        await settle(pilot, "enter")
        assert isinstance(app.screen, ReportScreen)
        assert app.screen.query_one(".dialog-body").content.plain.splitlines()[0] == headline(described)
        shown = [(title, [(t, text.plain) for t, text in rows]) for title, rows in app.screen.sections if rows]
    # core's notes and longer notes lead the list in one section (the summary keeps the verdict and the fix, with
    # its key and command), then the fix's details, then core's sections
    fix = described.fixes[0]
    details = [(None, detail) for detail in fix.details]
    notes = [(None, note) for note in [*described.notes, *described.asides]]
    leading = [("notes", notes), (f"{fix.title}, in detail", details)]
    core = [(s.title, [(row.path, row.text) for row in s.rows]) for s in described.sections if s.rows]
    assert shown == [section for section in leading if section[1]] + core


def test_every_convert_edit_option_means_one_field_both_ways(tmp_path: Path) -> None:
    """``ConvertOptions.argv`` (what a fix command prints) read back by the CLI's parser gives the same options."""
    from ckpt_tui.core.operations.convert import EDIT_OPTIONS, ConvertOptions

    options = ConvertOptions(
        extract="model",
        drop=["head.weight", "x"],
        drop_keys=["*.num_batches_tracked"],
        rename=["a=b"],
        strip_prefix="module.",
        rename_rules=[
            RenameRule.parse("enc.=encoder.", anywhere=False),
            RenameRule.parse("attn=attention", anywhere=True),
        ],
        rename_map="map.json",
        add_prefix="net.",
        at="/",
        map_location="cpu",
        dtype="bfloat16",
    )
    argv = options.argv()
    assert {word for word in argv if word.startswith("--")} == set(EDIT_OPTIONS)
    args = build_parser().parse_args(["convert", "x.pth", *argv])
    read = ConvertOptions(**{field: getattr(args, field) for field in EDIT_OPTIONS.values()})
    assert read.argv() == argv
    assert ConvertOptions.from_pairs(list(zip(argv[::2], argv[1::2], strict=True))).argv() == argv


def test_a_suggestions_options_are_the_pairs_it_states() -> None:
    steps = [Step("drop", "x"), Step("rename", RenameRule.parse("a.=b.", anywhere=False)), Step("add", "net.")]
    suggestion = Suggestion([Step("extract", ("model",)), *steps], 9, 9, 0, explicit_target=True)
    assert suggestion.pairs() == [
        ("--extract", "model"),
        ("--drop", "x"),
        ("--rename-prefix", "a.=b."),
        ("--add-prefix", "net."),
        ("--at", "/"),
    ]
    assert suggestion.options().argv() == [word for pair in suggestion.pairs() for word in pair]


def test_every_plain_data_class_is_a_class_to_the_scan() -> None:
    """The scan's classes named in lower case and the allowlist's plain data were two lists: a plain-data
    class added to one only was, to the scan, a function whose result has no known type."""
    import importlib

    from ckpt_tui.core.weights_only import scan, tables

    pytest.importorskip("numpy")
    for name in sorted(tables._PLAIN_DATA):
        module, _, short = name.rpartition(".")
        if module == "builtins" or module.startswith("omegaconf"):
            # builtins: torch's BUILD of dict, list... is not what the scan models for a class (left as the
            # differential tests hold it); omegaconf's names are all capitalised, and may not be installed
            continue
        try:
            found = getattr(importlib.import_module(module), short)
        except ImportError:
            continue  # (pathlib._local is Python 3.13's; files keep the name they were saved with)
        if isinstance(found, type):
            assert scan.builds_instance(name), name
    assert all(tables.data_global(name) is not None for name in tables.PLAIN_DATA_CLASSES)


def test_a_file_scan_is_a_pickle_scans_findings_and_travels_whole() -> None:
    """``FileScan`` and ``PickleScan`` share their findings' fields (one definition); the wire form the
    forked scan sends back keeps every field."""
    import dataclasses
    from collections import Counter

    from ckpt_tui.core.weights_only.scan import Findings, PickleScan
    from ckpt_tui.core.weights_only.verdict import FileScan

    shared = {f.name for f in dataclasses.fields(Findings)}
    assert shared <= {f.name for f in dataclasses.fields(PickleScan)}
    assert shared <= {f.name for f in dataclasses.fields(FileScan)}
    scan = FileScan("zip", reason="r", unknown="u", setitem_on_other=True, name_route=True)
    scan.absorb(PickleScan(refused=Counter({"os.system": 2}), usage={"os.system": {"reduce"}}), "data.pkl")
    scan.version_names, scan.devices = {"torch.uint4"}, {"cuda"}
    assert FileScan.from_wire(scan.to_wire()) == scan


def test_the_cli_progress_line_renders_cores_throttled_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The line on stderr is written per core's step (as the browser's messages are posted), not by a clock."""
    import io

    from ckpt_tui.cli import render

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    monkeypatch.setattr(render.ProgressLine, "DELAY", 0.0)
    with render.ProgressLine() as line:
        for done in range(1001):
            line.update(done * 1000, 1_000_000)
    shown = terminal.getvalue().split("\r")[1:-1]
    assert 45 <= len(shown) <= 51
    assert shown[-1].startswith("reading tensors: ") and shown[-1].endswith("of 1.0 MB (99%), ctrl+c stops ")


@pytest.mark.parametrize("kind", ["fifo", "folder", "too large"])
def test_a_keys_file_or_rename_map_is_read_in_one_place_and_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """Both are read by ``byte_source.read_small``: a FIFO is refused at once (it was waited on for ever)."""
    import os

    from ckpt_tui.core.errors import ReadError
    from ckpt_tui.core.operations.compare import read_keys_file
    from ckpt_tui.core.operations.convert import read_rename_map

    path = tmp_path / "given"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        with open(path, "wb") as file:
            file.truncate((64 << 20) + 1)
    for read in (read_keys_file, read_rename_map):
        with pytest.raises(ReadError, match=f"^{re.escape(str(path))}: "):
            read(str(path))
    torch.save(fixed_state_dict(prefix=""), tmp_path / "m.pth")
    assert main(["convert", str(tmp_path / "m.pth"), "-o", str(tmp_path / "o.pth"), "--rename-map", str(path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


async def test_info_and_the_header_say_the_values_are_unread_in_the_same_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from builders_tui import header

    from ckpt_tui.tui.bindings import BROWSER_BINDINGS
    from ckpt_tui.tui.widgets.summary import CHECK_KEY

    path = tmp_path / "nan.pth"
    torch.save({"w": torch.tensor([1.0, float("nan")])}, path)
    assert main(["info", str(path)]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("  values "))
    words = line.split(None, 1)[1]
    assert words == "not read yet: ckpt-tui check reads every tensor (NaN/Inf, broken records)"
    # the browser says it with its own key for check, and that key is the binding's
    assert any(getattr(b, "action", None) == "check_all" and b.key == CHECK_KEY for b in BROWSER_BINDINGS)
    app = CkptApp(str(path))
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        said = " ".join(header(app).split())
        assert "values " + words.replace("ckpt-tui check", CHECK_KEY) in said
