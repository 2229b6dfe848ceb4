"""Edits in the browser: previews, undo/redo, what follows the cursor, group rows as targets, read-only."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from builders_tui import (
    browser,
    cursor_data,
    cursor_path,
    detail,
    encoder_state_dict,
    fixed,
    fixed_state_dict,
    loaded,
    save_fixed_training,
    screen_text,
    settle,
    status,
)

from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.screens.dialogs import PreviewScreen, PromptScreen
from ckpt_tui.tui.screens.report import ReportScreen

SIZE = (120, 36)
GROUP = "encoder.layers.3."


@pytest.fixture
def train_file(tmp_path: Path) -> Path:
    return save_fixed_training(tmp_path / "best_model.pth")


@pytest.fixture
def encoder_file(tmp_path: Path) -> Path:
    torch.save(encoder_state_dict(), tmp_path / "encoder.pth")
    return tmp_path / "encoder.pth"


async def type_into_prompt(pilot, text: str) -> None:
    """Replace the prompt's text and submit it."""
    field = pilot.app.screen.query_one("Input")
    field.value = text
    await settle(pilot, "enter")


async def on_group(pilot, prefix: str = GROUP) -> None:
    """Switch to the module view and put the cursor on a group row."""
    await settle(pilot, "v")
    browser(pilot.app).tree_view.reveal(((), prefix))
    await settle(pilot)
    assert cursor_data(pilot.app).group is not None and cursor_data(pilot.app).group.prefix == prefix


# ---- previews, undo, redo and what follows the cursor ---------------------------------------


async def test_strip_prefix_moves_the_cursor_with_its_key_and_panel_and_status_follow(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "l", "l")
        assert cursor_path(app) == ("model", "module.conv.weight")
        await settle(pilot, "p")
        assert isinstance(app.screen, PreviewScreen)
        assert app.screen.change.count == 9
        assert ("module.conv.weight", "conv.weight") in app.screen.change.examples
        await settle(pilot, "y")
        assert cursor_path(app) == ("model", "conv.weight")
        assert 'ckpt["model"]["conv.weight"]' in detail(app)
        assert status(app).startswith('ckpt["model"]["conv.weight"]') and "● 1 unsaved edit" in status(app)
        assert "applied: strip 'module.'" in status(app)


async def test_undo_and_redo_update_tree_panel_and_status(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        tree = await loaded(pilot)
        await settle(pilot, "j", "j", "l", "l", "p", "y")
        await settle(pilot, "u")
        assert next(iter(app.session.root["model"])) == "module.conv.weight"
        # the cursor goes back to the key it was on when the edit was made, under its old name
        assert cursor_path(app) == ("model", "module.conv.weight")
        assert str(tree.cursor_node.label).split()[0] == "module.conv.weight"
        assert status(app).startswith('ckpt["model"]["module.conv.weight"]') and "no unsaved edits" in status(app)
        assert "undone: strip" in status(app)
        assert detail(app).startswith('ckpt["model"]["module.conv.weight"]')
        await settle(pilot, "ctrl+r")
        assert next(iter(app.session.root["model"])) == "conv.weight"
        assert "● 1 unsaved edit" in status(app) and "redone" in status(app)
        assert cursor_path(app) == ("model", "conv.weight") and str(tree.cursor_node.label).split()[0] == "conv.weight"
        await settle(pilot, "ctrl+r")
        assert "nothing to redo" in status(app)


async def test_an_edit_to_one_tensor_refreshes_the_panel_in_place(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "l", "l")
        assert "float32" in detail(app) and "cuda:0" in detail(app)
        await settle(pilot, "m", "enter", "y")
        assert cursor_path(app) == ("model", "module.conv.weight")
        assert "cuda:0" not in detail(app) and "cpu" in detail(app)
        await settle(pilot, "t")
        await type_into_prompt(pilot, "half")
        await settle(pilot, "y")
        assert "float16" in detail(app)


async def test_edits_keep_the_trees_open_lines(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        tree = await loaded(pilot)
        await settle(pilot, "j", "j", "l")  # open model
        await settle(pilot, "G")
        tree.reveal((("optimizer", "state", 0), None))
        await settle(pilot, "l")
        await settle(pilot, "g", "j")  # epoch
        await settle(pilot, "d", "y")
        opened = {n.data.path for n in tree.root.children if n.is_expanded}
        assert ("model",) in opened and ("optimizer",) in opened
        optimizer = next(n for n in tree.root.children if n.data.path == ("optimizer",))
        state = next(n for n in optimizer.children if n.data.path == ("optimizer", "state"))
        assert state.is_expanded and next(n for n in state.children if n.data.path[-1] == 0).is_expanded
        assert cursor_path(app) == ("model",)  # the line after the deleted one


async def test_every_edit_key_applies_its_edit(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "P")
        assert isinstance(app.screen, PromptScreen)
        await type_into_prompt(pilot, "ddp.")
        await settle(pilot, "y")
        assert next(iter(app.session.root["model"])) == "ddp.module.conv.weight"
        await settle(pilot, "m", "enter", "y")
        assert {t.device for t in app.session.root["model"].values()} == {"cpu"}
        await settle(pilot, "t", "enter", "y")
        # the prompt's own default on float32 weights: bfloat16 (float32's range, half the bytes)
        assert app.session.root["model"]["ddp.module.conv.weight"].dtype == "bfloat16"
        # and on 16-bit weights, back to float32 (never a narrower range by default)
        await settle(pilot, "t")
        assert pilot.app.screen.query_one("Input").value == "float32"
        await settle(pilot, "escape")
        assert cursor_path(app) == ("model",)
        await settle(pilot, "j")
        assert cursor_path(app) == ("optimizer",)
        await settle(pilot, "d", "y")
        assert "optimizer" not in app.session.root
        await settle(pilot, "g", "j")
        assert cursor_path(app) == ("epoch",)
        await settle(pilot, "r")
        await type_into_prompt(pilot, "last_epoch")
        await settle(pilot, "y")
        assert next(iter(app.session.root)) == "last_epoch" and cursor_path(app) == ("last_epoch",)
        await settle(pilot, "g", "j", "j", "x", "y")
        assert isinstance(app.session.root, dict) and "ddp.module.head.bias" in app.session.root
        assert app.session.unsaved == 6
        assert cursor_path(app) == ()


async def test_declining_a_preview_changes_nothing(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "p", "n")
        assert app.session.unsaved == 0 and "no unsaved edits" in status(app)


# ---- cast ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("typed", "dtype"), [("fp16", "float16"), ("half", "float16"), ("bf16", "bfloat16")])
async def test_cast_accepts_short_names_and_casts_the_model_not_the_optimizer(
    train_file: Path, typed: str, dtype: str
) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "t")
        assert 'ckpt["model"]' in screen_text(app)
        await type_into_prompt(pilot, typed)
        await settle(pilot, "y")
        model = app.session.root["model"]
        assert model["module.conv.weight"].dtype == dtype
        assert model["module.bn.num_batches_tracked"].dtype == "int64"
        assert app.session.root["optimizer"]["state"][0]["exp_avg"].dtype == "float32"


async def test_cast_to_an_unknown_dtype_says_why(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "t")
        await type_into_prompt(pilot, "int8")
        assert app.session.unsaved == 0 and "cannot cast to 'int8'" in screen_text(app)


# ---- group rows are targets of their own -------------------------------------------------------------


async def test_delete_on_a_group_deletes_that_groups_keys_only(encoder_file: Path) -> None:
    app = CkptApp(str(encoder_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await on_group(pilot)
        assert status(app).startswith("ckpt › encoder.layers.3.*")
        await settle(pilot, "d")
        assert isinstance(app.screen, PreviewScreen)
        assert app.screen.change.count == 6 and "encoder.layers.3." in app.screen.question
        await settle(pilot, "y")
        root = app.session.root
        assert not any(k.startswith(GROUP) for k in root) and len(root) == len(encoder_state_dict()) - 6
        assert "encoder.layers.2.attn.q.weight" in root and "head.bias" in root
        assert "encoder.layers.3" not in root._metadata and "encoder.layers.2" in root._metadata
        # the cursor stays with the group beside it (layer 3 was the last: layer 2)
        assert cursor_data(app).group is not None and cursor_data(app).group.prefix == "encoder.layers.2."


async def test_extract_on_a_group_gives_its_state_dict_with_the_prefix_stripped(encoder_file: Path) -> None:
    app = CkptApp(str(encoder_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await on_group(pilot)
        await settle(pilot, "x", "y")
        root = app.session.root
        assert list(root) == ["attn.q.weight", "attn.q.bias", "attn.k.weight", "attn.k.bias", "mlp.fc.weight",
                              "mlp.fc.bias"]  # fmt: skip
        assert dict(root._metadata) == {"": {"version": 1}}
        await settle(pilot, "ctrl+s")
        await type_into_prompt(pilot, str(encoder_file.parent / "layer3.pth"))
    saved = torch.load(encoder_file.parent / "layer3.pth", weights_only=True)
    assert list(saved) == list(root) and torch.equal(saved["mlp.fc.bias"], fixed((4,)))


async def test_rename_on_a_group_renames_its_prefix_in_place(encoder_file: Path) -> None:
    app = CkptApp(str(encoder_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await on_group(pilot)
        await settle(pilot, "r")
        assert isinstance(app.screen, PromptScreen) and app.screen.query_one("Input").value == GROUP
        await type_into_prompt(pilot, "encoder.layers.9")
        await settle(pilot, "y")
        keys = list(app.session.root)
        before = list(encoder_state_dict())
        assert keys == [k.replace(GROUP, "encoder.layers.9.") for k in before]
        assert "encoder.layers.9" in app.session.root._metadata
        assert cursor_data(app).group.prefix == "encoder.layers.9."


async def test_copy_on_a_group_copies_its_prefix(encoder_file: Path) -> None:
    app = CkptApp(str(encoder_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await on_group(pilot)
        await settle(pilot, "y")
        assert app.clipboard == GROUP


async def test_cast_on_a_group_casts_that_group_only(encoder_file: Path) -> None:
    app = CkptApp(str(encoder_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await on_group(pilot)
        await settle(pilot, "t")
        assert "the group 'encoder.layers.3.'" in screen_text(app)
        await type_into_prompt(pilot, "bf16")
        await settle(pilot, "y")
        dtypes = {k: v.dtype for k, v in app.session.root.items()}
        assert {d for k, d in dtypes.items() if k.startswith(GROUP)} == {"bfloat16"}
        assert {d for k, d in dtypes.items() if not k.startswith(GROUP)} == {"float32"}


async def test_compare_on_a_group_compares_that_groups_keys(encoder_file: Path, tmp_path: Path) -> None:
    reference = tmp_path / "keys.txt"
    reference.write_text("attn.q.weight [4, 4]\nattn.q.bias\nattn.k.weight\nattn.k.bias\nmlp.fc.weight\nmlp.fc.bias\n")
    app = CkptApp(str(encoder_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await on_group(pilot)
        await settle(pilot, "c")
        await type_into_prompt(pilot, str(reference))
        assert isinstance(app.screen, ReportScreen)
        assert "OK: 6/6" in app.screen.summary.plain


async def test_group_keys_never_act_on_the_parent(encoder_file: Path) -> None:
    app = CkptApp(str(encoder_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await on_group(pilot, "head.")
        await settle(pilot, "d")
        assert app.screen.change.count == 2 and "the root" not in app.screen.question.split("in")[0]
        await settle(pilot, "n", "x")
        assert "'head.'" in app.screen.question
        await settle(pilot, "n")
        assert app.session.unsaved == 0


# ---- read-only ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["p", "d", "x", "t", "u", "ctrl+s"])
async def test_readonly_edit_keys_say_why_they_do_nothing(train_file: Path, key: str) -> None:
    app = CkptApp(str(train_file), readonly=True)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", key)
        assert app.session.unsaved == 0 and app.screen is browser(app)
        assert "--readonly" in screen_text(app)
        assert "read-only" in status(app)


# ---- previews: one example per line -------------------------------------------------------------------


async def test_preview_shows_one_example_per_line_not_an_escaped_line_break(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "p")
        assert isinstance(app.screen, PreviewScreen)
        shown = screen_text(app)
        assert "\\x0a" not in shown
        examples = [line for line in shown.splitlines() if "→" in line]
        assert len(examples) >= 2 and all(line.count("→") == 1 for line in examples)


async def test_preview_escapes_a_key_but_breaks_lines_between_examples(tmp_path: Path) -> None:
    state = {f"module.k{i}\n": torch.ones(1) for i in range(3)}
    torch.save(state, tmp_path / "newline_keys.pth")
    app = CkptApp(str(tmp_path / "newline_keys.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "p")
        assert isinstance(app.screen, PreviewScreen)
        body = app.screen.query_one(".dialog-body").content.plain
        assert body.count("\n") == 2 and body.count("\\x0a") == 6  # the keys' own newlines stay escaped


async def test_compare_fix_command_is_on_its_own_line(train_file: Path, tmp_path: Path) -> None:
    reference = tmp_path / "reference.pth"
    torch.save(fixed_state_dict(prefix=""), reference)
    app = CkptApp(str(train_file))
    async with app.run_test(size=(160, 50), notifications=True) as pilot:
        await loaded(pilot)
        browser(app).tree_view.reveal((("epoch",), None))
        await settle(pilot, "d", "y")  # an edit first: the command then says what it assumes
        browser(app).tree_view.reveal((("model",), None))
        await settle(pilot, "c")
        await type_into_prompt(pilot, str(reference))
        await settle(pilot)
        assert isinstance(app.screen, ReportScreen)
        summary = app.screen.query_one(".dialog-body").content.plain.splitlines()
        assumes = next(i for i, line in enumerate(summary) if line.startswith("(this assumes"))
        assert summary[assumes + 1].startswith("ckpt-tui convert") and "--strip-prefix" in summary[assumes + 1]
        assert "\\x0a" not in screen_text(app)


# ---- an edit that changes nothing says so and records nothing --------------------------------------


async def no_edit_recorded(pilot, *steps: str) -> str:
    """Take the steps (``=text``: typed into the prompt), and return what the screen says; no preview opened,
    no edit recorded, nothing to undo."""
    app = pilot.app
    for step in steps:
        if step.startswith("="):
            await type_into_prompt(pilot, step[1:])
        else:
            await settle(pilot, step)
    assert not isinstance(app.screen, (PreviewScreen, PromptScreen))
    assert app.session.unsaved == 0 and not app.session.edited
    shown = screen_text(app)
    await settle(pilot, "u")
    assert "nothing to undo" in status(app)
    return shown


@pytest.mark.parametrize(
    ("steps", "said"),
    [
        (("t", "=float32"), "already float32"),  # the model's weights (the optimizer state is fp32 too)
        (("t", "=fp32"), "nothing to cast"),
        (("m", "=cuda:0"), "nothing to map"),  # the file was saved on cuda:0
    ],
)
async def test_a_cast_or_device_map_that_changes_nothing_says_so_and_records_no_edit(
    train_file: Path, steps: tuple[str, ...], said: str
) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        assert said in await no_edit_recorded(pilot, *steps)


async def test_a_group_cast_or_rename_that_changes_nothing_says_so_and_records_no_edit(encoder_file: Path) -> None:
    app = CkptApp(str(encoder_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await on_group(pilot)
        assert "already float32" in await no_edit_recorded(pilot, "t", "=fp32")
        assert "nothing to rename" in await no_edit_recorded(pilot, "r", "=encoder.layers.3")


async def test_a_rename_to_the_same_name_or_an_extract_of_a_flat_root_says_so_and_records_no_edit(
    encoder_file: Path,
) -> None:
    app = CkptApp(str(encoder_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        assert "nothing to extract" in await no_edit_recorded(pilot, "x")
        await settle(pilot, "j")
        assert "nothing to rename" in await no_edit_recorded(pilot, "r", "=embed.weight")


async def test_extract_on_a_plain_value_says_so_and_the_preview_of_an_extract_counts_no_changes(
    train_file: Path,
) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        browser(app).tree_view.reveal((("epoch",), None))
        await settle(pilot)
        assert 'nothing to extract: ckpt["epoch"] holds no tensor' in await no_edit_recorded(pilot, "x")
        browser(app).tree_view.reveal((("model",), None))
        await settle(pilot, "x")
        assert isinstance(app.screen, PreviewScreen)
        assert app.screen.question.startswith('Apply? extract ckpt["model"] (9 tensors)')
