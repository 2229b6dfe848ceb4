"""What the compare report and the header's prefix findings say when a careful engineer would check them:
a group compared alone says so and gets no fix that reaches a corner of the model; the keys a fix leaves
over are named (a renamed and resized head paired); a prefix that is one of the model's submodules is no
wrapper to strip."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_tui import browser, cursor_data, header, loaded, settle
from torch import nn

from ckpt_tui.cli import main
from ckpt_tui.core.operations.compare import compare, load_reference
from ckpt_tui.core.operations.hints import ComparedModel
from ckpt_tui.core.operations.info import summarize
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.screens.compare import CompareScreen

SIZE = (80, 24)


def features() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 32), nn.BatchNorm1d(32))


class NetOld(nn.Module):
    """The model as trained: a 10-class head named ``fc``."""

    def __init__(self) -> None:
        super().__init__()
        self.features = features()
        self.fc = nn.Linear(32, 10)


class Net(nn.Module):
    """The model now: the same features, a 5-class head renamed ``head``."""

    def __init__(self) -> None:
        super().__init__()
        self.features = features()
        self.head = nn.Linear(32, 5)


@pytest.fixture
def story(tmp_path: Path) -> Path:
    """``best_model.pth`` (DataParallel's state_dict of NetOld, with AdamW and a scheduler) and
    ``net_current.pth`` (Net's state_dict)."""
    torch.manual_seed(0)
    wrapped = nn.DataParallel(NetOld())
    optimizer = torch.optim.AdamW(wrapped.parameters())
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 10)
    checkpoint = {"epoch": 3, "model": wrapped.state_dict(), "optimizer": optimizer.state_dict()}
    checkpoint["scheduler"] = scheduler.state_dict()
    torch.save(checkpoint, tmp_path / "best_model.pth")
    torch.save(Net().state_dict(), tmp_path / "net_current.pth")
    return tmp_path


def check(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str]:
    code = main(["check", *map(str, args)])
    return code, capsys.readouterr().out


# ---- the first report names what the fix leaves ---------------------------------------------------------


def test_a_renamed_and_resized_head_is_paired_and_dropped_in_the_first_fix(
    story: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = check(capsys, story / "best_model.pth", "--against", story / "net_current.pth")
    assert code == 1
    assert "after the fix 14/16" in out
    assert "fc.weight [10, 32], fc.bias [10] unexpected; head.weight [5, 32], head.bias [5] missing" in out
    assert "a renamed and resized head? the fix drops fc.*" in out
    command = next(line.strip() for line in out.splitlines() if line.strip().startswith("ckpt-tui convert"))
    assert "--drop module.fc.weight --drop module.fc.bias --strip-prefix module." in command
    # the printed command does what the report says: every key but the new head loads with strict=False
    fixed = story / "best_model.fixed.pth"
    assert main(command.split()[1:]) == 0
    state = torch.load(fixed)
    model = Net()
    result = model.load_state_dict(state, strict=False)
    assert sorted(result.missing_keys) == ["head.bias", "head.weight"] and not result.unexpected_keys


def test_the_keys_left_after_the_fix_are_named_with_shapes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    old = nn.DataParallel(NetOld()).state_dict()
    torch.save(old, tmp_path / "ddp.pth")
    reference = Net().state_dict()
    reference["extra.weight"] = torch.zeros(3, 3)
    torch.save(reference, tmp_path / "bigger.pth")
    code, out = check(capsys, tmp_path / "ddp.pth", "--against", tmp_path / "bigger.pth")
    assert code == 1
    left = next(line for line in out.splitlines() if "left after it" in line)
    assert "3 missing: head.weight [5, 32], head.bias [5], extra.weight [3, 3]" in left
    assert "2 unexpected: fc.weight [10, 32], fc.bias [10]" in left


def test_json_lists_the_swapped_head(story: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["check", str(story / "best_model.pth"), "--against", str(story / "net_current.pth"), "--json"])
    swapped = json.loads(capsys.readouterr().out)["suggestion"]["swapped_head"]
    assert swapped[0] == {
        "key": "module.fc.weight",
        "checkpoint": [10, 32],
        "reference_key": "head.weight",
        "reference": [5, 32],
    }


# ---- a part is no fix ------------------------------------------------------------------------------------


def test_two_head_keys_get_no_suggested_fix_into_a_16_key_model(story: Path) -> None:
    reference = load_reference(str(story / "net_current.pth"), None)
    # the group 'head.' as the browser compares it: its keys without the prefix, of another size
    resized = {"weight": torch.zeros(10, 32), "bias": torch.zeros(10)}
    torch.save(resized, story / "resized.pth")
    report = compare(open_checkpoint(story / "resized.pth").root, reference)
    assert report.suggestion is None  # never "add 'features.0.'": 2 keys that fit nothing there
    # of the right size: 'head.' added would place 2 of 16 keys, a part of the model, not a fix
    right = {"weight": torch.zeros(5, 32), "bias": torch.zeros(5)}
    torch.save(right, story / "right.pth")
    assert compare(open_checkpoint(story / "right.pth").root, reference).suggestion is None


def test_a_part_of_the_model_is_said_as_a_note(story: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save({"weight": torch.zeros(5, 32), "bias": torch.zeros(5)}, story / "head.pth")
    code, out = check(capsys, story / "head.pth", "--against", story / "net_current.pth")
    assert code == 1 and "suggested fix" not in out
    assert "note: with 'head.' added, 2 keys are the reference's head.* (2 of its 16 keys): a part of the model" in out


def test_check_against_agrees_that_a_part_has_no_fix(story: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save({"weight": torch.zeros(10, 32), "bias": torch.zeros(10)}, story / "part.pth")
    code, out = check(capsys, story / "part.pth", "--against", story / "net_current.pth")
    assert code == 1 and "suggested fix" not in out and "features.0." not in out


async def test_c_on_a_group_says_first_that_it_compared_only_the_group(story: Path) -> None:
    app = CkptApp(str(story / "best_model.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        browser(app).tree_view.reveal((("model",), None))
        await settle(pilot, "v")
        browser(app).tree_view.reveal((("model",), "module.fc."))
        await settle(pilot)
        assert cursor_data(app).group is not None
        await settle(pilot, "c")
        app.screen.query_one("Input").value = str(story / "net_current.pth")
        await settle(pilot, "enter")
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        title = screen.title_text
        assert title.startswith("Compared only the group 'module.fc.'")
        assert "(2 keys) with net_current.pth; g then c compares the whole file" in title
        assert screen.report.suggestion is None


# ---- a prefix that is the model's own submodule is no wrapper ------------------------------------------


def headless(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    state = {k: v for k, v in NetOld().state_dict().items() if not k.startswith("fc.")}
    torch.save(state, tmp_path / "headless.pth")
    return tmp_path / "headless.pth"


def test_without_a_reference_a_common_module_name_is_a_note_with_no_fix(tmp_path: Path) -> None:
    summary = summarize(open_checkpoint(headless(tmp_path)))
    found = next(f for f in summary.findings if f.kind == "prefix")
    assert found.severity == "info" and found.fix is None
    assert "the model's submodule .features, or a wrapper named so" in found.message


def test_with_the_model_compared_the_prefix_is_its_submodule(tmp_path: Path) -> None:
    keys = frozenset(Net().state_dict())
    summary = summarize(open_checkpoint(headless(tmp_path)), compared=ComparedModel("net_current.pth", keys))
    found = next(f for f in summary.findings if f.kind == "prefix")
    assert found.severity == "info" and found.fix is None
    assert "the model in net_current.pth has them so (14 keys fit as they are): its submodule" in found.message


def test_with_a_model_that_lacks_the_prefix_the_strip_is_offered(tmp_path: Path) -> None:
    keys = frozenset(k.removeprefix("features.") for k in Net().state_dict())
    summary = summarize(open_checkpoint(headless(tmp_path)), compared=ComparedModel("bare.pth", keys))
    found = next(f for f in summary.findings if f.kind == "prefix")
    assert found.severity == "warning" and found.fix is not None and found.fix.argument == "features."


def test_the_ddp_module_prefix_stays_a_warning_with_its_strip_after_a_compare(story: Path) -> None:
    keys = frozenset(Net().state_dict())
    checkpoint = open_checkpoint(story / "best_model.pth")
    alone = summarize(checkpoint).findings
    assert summarize(checkpoint, compared=ComparedModel("net_current.pth", keys)).findings == alone
    found = next(f for f in alone if f.kind == "inner-state-dict")
    assert found.severity == "warning" and found.fix is not None
    assert found.fix.pairs() == [("--extract", "model"), ("--strip-prefix", "module.")]


async def test_after_a_compare_the_header_offers_no_strip_of_a_submodule(tmp_path: Path) -> None:
    path = headless(tmp_path)
    torch.save(Net().state_dict(), tmp_path / "net_current.pth")
    app = CkptApp(str(path))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        assert "p strips it" not in header(app)
        await settle(pilot, "c")
        app.screen.query_one("Input").value = str(tmp_path / "net_current.pth")
        await settle(pilot, "enter", "escape")
        await loaded(pilot)
        shown = " ".join(header(app).split())
        assert "p strips it" not in shown and "its submodule, not a wrapper" in shown


async def test_the_browser_report_pairs_the_resized_head_in_the_fix_details(story: Path) -> None:
    app = CkptApp(str(story / "best_model.pth"))
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "c")
        app.screen.query_one("Input").value = str(story / "net_current.pth")
        await settle(pilot, "enter")
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        details = next(rows for title, rows in screen.sections if title.startswith("suggested fix, in detail"))
        said = " ".join(text.plain for _, text in details)
        assert "fc.weight [10, 32], fc.bias [10] unexpected; head.weight [5, 32], head.bias [5] missing" in said
        await settle(pilot, "f", "y")
        assert sorted(app.session.root) == sorted(k for k in Net().state_dict() if not k.startswith("head."))


# ---- keys of another size: a head to drop, or another model -------------------------------------------


class Lins(nn.Module):
    """lpips' five 1x1 projections; alexnet and vgg differ in every channel count but the first."""

    def __init__(self, channels: tuple[int, ...]) -> None:
        super().__init__()
        for index, width in enumerate(channels):
            setattr(self, f"lin{index}", nn.Sequential(nn.Dropout(), nn.Conv2d(width, 1, 1, bias=False)))


ALEX, VGG = (64, 192, 384, 256, 256), (64, 128, 256, 512, 512)


def test_most_keys_of_another_size_is_another_model_with_no_drop_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.save(Lins(ALEX).state_dict(), tmp_path / "alex.pth")
    torch.save(Lins(VGG).state_dict(), tmp_path / "vgg.pth")
    code, out = check(capsys, tmp_path / "alex.pth", "--against", tmp_path / "vgg.pth")
    assert code == 1
    assert "4 of 5 keys differ in shape, most of the model, not a head" in out
    assert "probably another model or variant" in out
    assert "suggested fix" not in out and "--drop" not in out and "classifier head" not in out
    assert out.count("lin1.1.weight: [1, 192, 1, 1] vs [1, 128, 1, 1]") == 1
    code = main(["check", str(tmp_path / "alex.pth"), "--against", str(tmp_path / "vgg.pth"), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and "suggestion" not in report


class Widened(nn.Module):
    """A body whose second layer is wider in one variant: a minority of keys, in the middle of the model."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.stem = nn.Linear(4, 8)
        self.mid = nn.Linear(8, hidden)
        self.post = nn.Linear(hidden, 8)
        self.blocks = nn.Sequential(*(nn.Linear(8, 8) for _ in range(4)))
        self.fc = nn.Linear(8, 3)


def test_a_minority_of_another_size_in_the_middle_is_no_head_to_drop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.save(Widened(16).state_dict(), tmp_path / "wide.pth")
    torch.save(Widened(8).state_dict(), tmp_path / "narrow.pth")
    code, out = check(capsys, tmp_path / "wide.pth", "--against", tmp_path / "narrow.pth")
    assert code == 1
    assert "3 of 16 keys differ in shape, not only at the end of the model, as a head is" in out
    assert "suggested fix" not in out and "--drop" not in out


class AuxNet(nn.Module):
    """inception's layout: an auxiliary classifier in the middle of the model, the main one at its end."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.early = nn.Linear(4, 8)
        self.aux = nn.Linear(8, classes)
        self.late = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8))
        self.fc = nn.Linear(8, classes)


def test_heads_of_one_new_class_count_are_dropped_wherever_they_stand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.save(AuxNet(10).state_dict(), tmp_path / "ten.pth")
    torch.save(AuxNet(3).state_dict(), tmp_path / "three.pth")
    code, out = check(capsys, tmp_path / "ten.pth", "--against", tmp_path / "three.pth")
    assert code == 1 and "differ in shape" not in out
    command = out.splitlines()[-1].strip()
    assert command.endswith("--drop aux.weight --drop aux.bias --drop fc.weight --drop fc.bias")
    # listed once: under the shape mismatches, which the fix then refers to
    assert out.count("aux.weight: [10, 8] vs [3, 8]") == 1
    assert "the shape mismatches above differ in size" in out
    assert main(command.split()[1:]) == 0
    model = AuxNet(3)
    result = model.load_state_dict(torch.load(tmp_path / "ten.fixed.pth", weights_only=True), strict=False)
    assert sorted(result.missing_keys) == ["aux.bias", "aux.weight", "fc.bias", "fc.weight"]
    assert not result.unexpected_keys


async def test_the_browser_says_another_model_and_offers_no_fix(tmp_path: Path) -> None:
    torch.save(Lins(ALEX).state_dict(), tmp_path / "alex.pth")
    torch.save(Lins(VGG).state_dict(), tmp_path / "vgg.pth")
    app = CkptApp(str(tmp_path / "alex.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "c")
        app.screen.query_one("Input").value = str(tmp_path / "vgg.pth")
        await settle(pilot, "enter")
        screen = app.screen
        assert isinstance(screen, CompareScreen) and screen.report is not None
        assert screen.report.suggestion is None and not screen.fixable
        said = " ".join(screen.summary.plain.split())
        assert "4 of 5 keys differ in shape, most of the model, not a head" in said and "--drop" not in said
