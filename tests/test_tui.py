"""The browser, driven headless with Pilot on real files: what a user sees and gets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from builders import many_keys, save_cuda_tagged, training_checkpoint

from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.screens.dialogs import ConfirmScreen, ErrorScreen, HelpScreen, PreviewScreen, PromptScreen, SaveScreen
from ckpt_tui.tui.widgets.tree_view import CheckpointTree

SIZE = (120, 36)


@pytest.fixture
def train_file(tmp_path: Path) -> Path:
    return save_cuda_tagged(training_checkpoint(), tmp_path / "best_model.pth")


async def loaded(pilot) -> CheckpointTree:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    return pilot.app.query_one(CheckpointTree)


def cursor_path(app: CkptApp) -> tuple:
    data = app.query_one(CheckpointTree).cursor_node.data
    return data.path


def text_of(widget) -> str:
    """What a Static shows, as plain text."""
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(widget.content)
    return console.export_text()


def status(app: CkptApp) -> str:
    return text_of(app.query_one("#status"))


async def test_open_shows_summary_tree_and_findings(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE) as pilot:
        tree = await loaded(pilot)
        header = text_of(app.query_one("#summary"))
        assert "27 tensors" in header and "cuda:0" in header and "module." in header
        assert [str(n.label).split()[0] for n in tree.root.children] == [
            "epoch",
            "model",
            "optimizer",
            "scheduler",
            "args",
        ]
        assert "no unsaved edits" in status(app)


async def test_navigation_keys(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE) as pilot:
        tree = await loaded(pilot)
        await pilot.press("j", "j")
        assert cursor_path(app) == ("model",)
        await pilot.press("l")  # expand
        assert tree.cursor_node.is_expanded and len(tree.cursor_node.children) == 9
        await pilot.press("l")  # first child
        assert cursor_path(app) == ("model", "module.conv.weight")
        await pilot.press("k")
        assert cursor_path(app) == ("model",)
        await pilot.press("h")  # collapse
        assert not tree.cursor_node.is_expanded
        await pilot.press("space")  # toggle
        assert tree.cursor_node.is_expanded
        await pilot.press("l", "h")  # child, then parent
        assert cursor_path(app) == ("model",)
        await pilot.press("G")
        await pilot.pause()
        assert cursor_path(app) == ("args",)
        await pilot.press("g")
        assert cursor_path(app) == ()


async def test_stats_in_detail_panel(tmp_path: Path) -> None:
    weights = torch.arange(12.0).reshape(3, 4)
    weights[0, 1] = float("nan")
    torch.save({"w": weights}, tmp_path / "nan.pth")
    app = CkptApp(str(tmp_path / "nan.pth"))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("j", "enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        stats = text_of(app.query_one("#detail-stats"))
        assert "NaN        1" in stats and "max        11" in stats and "min        0" in stats
        meta = text_of(app.query_one("#detail-meta"))
        assert 'ckpt["w"]' in meta and "[3, 4]" in meta


async def test_search_and_next_match(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("slash", *"head", "enter")
        await pilot.pause()
        assert cursor_path(app) == ("model", "module.head.weight")
        await pilot.press("n")
        await pilot.pause()
        assert cursor_path(app) == ("model", "module.head.bias")
        await pilot.press("N")
        await pilot.pause()
        assert cursor_path(app) == ("model", "module.head.weight")
        assert "match 1/2" in status(app)


async def test_copy_key_path(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("j", "j", "l", "l", "y")
        assert app.clipboard == 'ckpt["model"]["module.conv.weight"]'
        assert "copied" in status(app)


async def test_strip_prefix_preview_apply_undo_redo(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE) as pilot:
        tree = await loaded(pilot)
        await pilot.press("j", "j", "p")
        screen = app.screen
        assert isinstance(screen, PreviewScreen)
        assert screen.change.count == 9
        assert ("module.conv.weight", "conv.weight") in screen.change.examples
        await pilot.press("y")
        await pilot.pause()
        assert "● 1 unsaved edit" in status(app)
        model = next(n for n in tree.root.children if n.data.path == ("model",))
        tree.load(model)
        assert str(model.children[0].label).startswith("conv.weight")
        await pilot.press("u")
        await pilot.pause()
        assert next(iter(app.session.root["model"])) == "module.conv.weight"
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert next(iter(app.session.root["model"])) == "conv.weight"


async def test_preview_declined_changes_nothing(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("j", "j", "p", "n")
        assert app.session.unsaved == 0


async def test_every_edit_key(train_file: Path, tmp_path: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("j", "j")  # model
        await pilot.press("P")
        assert isinstance(app.screen, PromptScreen)
        await pilot.press("end", "ctrl+u", *"ddp.", "enter", "y")
        assert next(iter(app.session.root["model"])) == "ddp.module.conv.weight"
        await pilot.press("m")
        await pilot.press("enter", "y")  # default: cpu
        assert {t.device for t in app.session.root["model"].values()} == {"cpu"}
        await pilot.press("t", "enter", "y")  # default: float16
        assert app.session.root["model"]["ddp.module.conv.weight"].dtype == "float16"
        await pilot.pause()
        assert cursor_path(app) == ("model",)
        await pilot.press("j")  # optimizer
        assert cursor_path(app) == ("optimizer",)
        await pilot.press("d", "y")
        assert "optimizer" not in app.session.root
        await pilot.pause()
        await pilot.press("g", "j")  # epoch
        assert cursor_path(app) == ("epoch",)
        await pilot.press("r")
        await pilot.press("end", "ctrl+u", *"last_epoch", "enter", "y")
        assert next(iter(app.session.root)) == "last_epoch"
        await pilot.pause()
        await pilot.press("g", "j", "j", "x", "y")  # extract model
        assert isinstance(app.session.root, dict) and "ddp.module.head.bias" in app.session.root
        assert app.session.unsaved == 6


async def test_save_as_loads_back_with_torch(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("j", "j", "x", "y", "p", "y", "m", "enter", "y")
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, SaveScreen)
        assert app.screen.query_one("#save-path").value == str(train_file.parent / "best_model.fixed.pth")
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        saved = torch.load(train_file.parent / "best_model.fixed.pth", weights_only=True)
        expected = training_checkpoint()["model"]
        torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(expected, "module.")
        assert list(saved) == list(expected)
        assert all(torch.equal(saved[k], expected[k]) for k in expected)
        assert "no unsaved edits" in status(app) and "wrote" in status(app)
        assert app.session.unsaved == 0


async def test_replace_existing_asks_default_no(train_file: Path) -> None:
    before = train_file.read_bytes()
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("j", "j", "p", "y", "ctrl+s")
        field = app.screen.query_one("#save-path")
        field.value = str(train_file)
        await pilot.press("enter")
        assert isinstance(app.screen, ConfirmScreen) and "INPUT" in app.screen.question
        await pilot.press("enter")  # the focused button is No
        await pilot.pause()
        assert train_file.read_bytes() == before
        assert app.session.unsaved == 1


async def test_quit_guard(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("j", "j", "p", "y", "q")
        assert isinstance(app.screen, ConfirmScreen) and "unsaved" in app.screen.question
        await pilot.press("n")
        assert app.is_running
        await pilot.press("q", "y")
        await pilot.pause()
    assert app.return_code == 0


async def test_error_screen(tmp_path: Path) -> None:
    (tmp_path / "bad.pth").write_bytes(b"not a checkpoint at all")
    app = CkptApp(str(tmp_path / "bad.pth"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(app.screen, ErrorScreen)
        assert "not a checkpoint" in text_of(app.screen.query_one("#error-message"))
        await pilot.press("q")


async def test_readonly_hides_edits(train_file: Path) -> None:
    app = CkptApp(str(train_file), readonly=True)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("j", "j", "p", "d", "ctrl+s")
        assert app.session.unsaved == 0 and not isinstance(app.screen, (PreviewScreen, SaveScreen))
        assert "read-only" in status(app)


async def test_help_and_palette(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        help_text = text_of(app.screen.query_one("#help-text"))
        assert "Strip prefix" in help_text and "ctrl+s" in help_text
        await pilot.press("escape")
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "edit: Strip prefix" in titles and "file: Save as" in titles


async def test_group_by_module_and_many_keys(tmp_path: Path) -> None:
    torch.save(many_keys(50_000), tmp_path / "many.pth")
    app = CkptApp(str(tmp_path / "many.pth"))
    async with app.run_test(size=SIZE) as pilot:
        tree = await loaded(pilot)
        assert len(tree.root.children) == 1001  # a page, then "… 49,000 more"
        assert "49,000 more" in str(tree.root.children[-1].label)
        tree.move_cursor(tree.root.children[-1])  # reaching the line loads the next page
        await pilot.pause()
        assert len(tree.root.children) == 2001
        await pilot.press("G")
        await pilot.pause()
        assert cursor_path(app) == ("layers.12499.p3",)
        await pilot.press("v")
        await pilot.pause()
        assert str(tree.root.children[0].label).startswith("layers")
        assert "50000 tensors" in str(tree.root.children[0].label)
        await pilot.press("slash", *"layers.7.p2", "enter")
        await pilot.pause()
        assert cursor_path(app) == ("layers.7.p2",)


async def test_save_as_safetensors_after_extract(train_file: Path) -> None:
    from safetensors.torch import load_file

    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("j", "j", "x", "y", "p", "y", "ctrl+s")
        field = app.screen.query_one("#save-path")
        field.value = str(train_file.parent / "weights.safetensors")
        await pilot.pause()
        assert "safetensors" in text_of(app.screen.query_one("#save-format"))
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
    loaded_back = load_file(train_file.parent / "weights.safetensors")
    assert "conv.weight" in loaded_back and loaded_back["head.weight"].shape == (10, 8)


async def test_compare_screen_jump_and_fix(train_file: Path, tmp_path: Path) -> None:
    from builders import tiny_state_dict

    from ckpt_tui.tui.screens.dialogs import ReportScreen

    torch.save(tiny_state_dict(), tmp_path / "target.pth")
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("c")
        field = app.screen.query_one("#prompt-input")
        field.value = str(tmp_path / "target.pth")
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(app.screen, ReportScreen)
        assert "extract model and strip 'module.'" in app.screen.summary
        assert "9/9 keys match" in app.screen.summary
        await pilot.press("f")  # apply the fix: preview, then yes
        assert isinstance(app.screen, PreviewScreen)
        await pilot.press("y")
        await pilot.pause()
        assert list(app.session.root)[:2] == ["conv.weight", "conv.bias"]
        assert app.session.unsaved == 1
        await pilot.press("u")
        assert "model" in app.session.root


async def test_diff_screen(train_file: Path, tmp_path: Path) -> None:
    from ckpt_tui.tui.screens.dialogs import ReportScreen

    other = training_checkpoint()
    other["epoch"] = 4
    other["model"]["module.head.bias"] += 1.0
    torch.save(other, tmp_path / "other.pth")
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("D")
        app.screen.query_one("#prompt-input").value = str(tmp_path / "other.pth")
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(app.screen, ReportScreen)
        texts = [text for _, rows in app.screen.sections for _, text in rows]
        assert any(t.startswith("model/module.head.bias: max |a-b| 1") for t in texts)
        assert "epoch: 3 → 4" in texts
        app.screen.query_one("#report-list").highlighted = 1  # the first row: the value change
        await pilot.press("enter")
        await pilot.pause()
        assert cursor_path(app) == ("model", "module.head.bias")
