"""Saving and quitting from the browser: what lands on disk, saving over the input, every way out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from builders_tui import (
    browser,
    cursor_path,
    detail,
    fixed_state_dict,
    fixed_training_checkpoint,
    loaded,
    save_fixed_training,
    screen_text,
    settle,
    status,
)

from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.screens.dialogs import ConfirmScreen, SaveScreen
from ckpt_tui.tui.suggesters import complete_path

SIZE = (120, 36)


@pytest.fixture
def train_file(tmp_path: Path) -> Path:
    return save_fixed_training(tmp_path / "best_model.pth")


async def save_as(pilot, path: Path | str) -> None:
    """ctrl+s, type a path, enter."""
    await settle(pilot, "ctrl+s")
    assert isinstance(pilot.app.screen, SaveScreen)
    pilot.app.screen.query_one("#save-path").value = str(path)
    await settle(pilot, "enter")


async def test_save_as_writes_what_torch_loads_back(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "x", "y", "p", "y", "m", "enter", "y", "ctrl+s")
        # the folder above, the name in the field: a long path never scrolls its start out of it unmarked
        assert app.screen.query_one("#save-path").value == "best_model.fixed.pth"
        assert f"in {train_file.parent}{os.sep}" in screen_text(app)
        await settle(pilot, "enter")
        # the status line leads with the verdict of what was written, in one line
        assert app.session.unsaved == 0
        assert status(app).strip() == "loads with torch.load(weights_only=True) · saved best_model.fixed.pth, verified"
    saved = torch.load(train_file.parent / "best_model.fixed.pth", weights_only=True)
    expected = fixed_state_dict(prefix="")
    assert list(saved) == list(expected)
    assert all(torch.equal(saved[k], expected[k]) for k in expected)


async def test_save_as_safetensors_after_extract(train_file: Path) -> None:
    from safetensors.torch import load_file

    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "x", "y", "p", "y", "ctrl+s")
        app.screen.query_one("#save-path").value = str(train_file.parent / "weights.safetensors")
        await pilot.pause()
        assert "safetensors" in screen_text(app)
        await settle(pilot, "enter")
    loaded_back = load_file(train_file.parent / "weights.safetensors")
    assert "conv.weight" in loaded_back and loaded_back["head.weight"].shape == (10, 8)


async def test_replacing_the_input_asks_and_defaults_to_no(train_file: Path) -> None:
    before = train_file.read_bytes()
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "p", "y")
        await save_as(pilot, train_file)
        assert isinstance(app.screen, ConfirmScreen) and "INPUT" in app.screen.question
        await settle(pilot, "enter")  # the focused button is No
        assert train_file.read_bytes() == before and app.session.unsaved == 1


async def test_saving_over_the_input_reopens_it_keeping_cursor_and_open_lines(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        tree = await loaded(pilot)
        await settle(pilot, "j", "j", "p", "y", "l", "l", "j")  # model/conv.bias
        assert cursor_path(app) == ("model", "conv.bias")
        first = app.session
        await save_as(pilot, train_file)
        await settle(pilot, "y")
        await settle(pilot)
        assert app.session is not first and app.session.unsaved == 0
        assert "reopened best_model.pth" in status(app)
        assert cursor_path(app) == ("model", "conv.bias")
        assert next(n for n in tree.root.children if n.data.path == ("model",)).is_expanded
        await settle(pilot, "k", "enter")  # conv.weight's stats come from the new file
        stats = detail(app)
        assert "min       -1" in stats and "max       1" in stats and "NaN       0" in stats
        await settle(pilot, "g", "j", "d", "y")  # drop epoch and save over the input again
        await save_as(pilot, train_file)
        await settle(pilot, "y")
        await settle(pilot)
        assert "fails its CRC" not in screen_text(app) and "Not saved" not in screen_text(app)
        assert "no unsaved edits" in status(app)
    back = torch.load(train_file, weights_only=False, map_location="cpu")
    assert "epoch" not in back and next(iter(back["model"])) == "conv.weight"
    assert torch.equal(back["model"]["conv.weight"], fixed_training_checkpoint()["model"]["module.conv.weight"])


async def test_save_prompt_remembers_the_last_path(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        target = train_file.parent / "mine.pth"
        await save_as(pilot, target)
        await settle(pilot, "ctrl+s")
        assert app.screen.query_one("#save-path").value == target.name


async def test_path_prompts_complete_file_names_with_tab(train_file: Path) -> None:
    (train_file.parent / "reference_model.pth").write_bytes(b"")
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "D")
        field = app.screen.query_one("Input")
        assert field.value == str(train_file.parent) + os.sep
        field.value = str(train_file.parent / "refer")
        await settle(pilot)
        await settle(pilot, "tab")
        assert field.value == str(train_file.parent / "reference_model.pth")


async def test_tab_completes_the_common_start_lists_the_names_and_tab_again_takes_each(train_file: Path) -> None:
    for step in (10, 20, 30):
        (train_file.parent / f"cnn_step{step}.pth").write_bytes(b"")
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "D")
        field = app.screen.query_one("Input")
        field.value = str(train_file.parent / "cnn_s")
        await settle(pilot, "tab")
        # as a shell: the start they share, and the names listed (not the first one taken silently)
        assert field.value == str(train_file.parent / "cnn_step")
        assert "3 names (tab again takes each): cnn_step10.pth  cnn_step20.pth  cnn_step30.pth" in screen_text(app)
        await settle(pilot, "tab")
        assert field.value == str(train_file.parent / "cnn_step10.pth")
        await settle(pilot, "tab")
        assert field.value == str(train_file.parent / "cnn_step20.pth")
        await settle(pilot, "tab", "tab")
        assert field.value == str(train_file.parent / "cnn_step10.pth")


async def test_save_as_takes_a_name_typed_in_the_folder_shown_and_completes_it_there(train_file: Path) -> None:
    (train_file.parent / "best_run_b.pth").write_bytes(b"")
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "ctrl+s")
        field = app.screen.query_one("#save-path")
        field.value = "best_r"
        await settle(pilot, "tab")
        assert field.value == "best_run_b.pth"
        field.value = "copy.pth"
        await settle(pilot, "enter")
    assert (train_file.parent / "copy.pth").exists()


def test_path_completion_offers_the_shortest_match_and_folders_with_a_slash(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt.fixed.pth").write_bytes(b"")
    (tmp_path / ".hidden.pth").write_bytes(b"")
    assert complete_path(str(tmp_path / "ck")) == str(tmp_path / "ckpt") + os.sep
    assert complete_path(str(tmp_path / "ckpt.")) == str(tmp_path / "ckpt.fixed.pth")
    assert complete_path(str(tmp_path / "nothing")) is None
    assert complete_path(str(tmp_path) + os.sep) == str(tmp_path / "ckpt") + os.sep
    assert complete_path(str(tmp_path / ".h")) == str(tmp_path / ".hidden.pth")


# ---- every way out asks when edits are unsaved ----------------------------------------------------


@pytest.mark.parametrize("keys", [["q"], ["ctrl+q"], ["ctrl+c", "ctrl+q"]], ids=["q", "ctrl+q", "ctrl+c-ctrl+q"])
async def test_quit_keys_ask_before_losing_edits(train_file: Path, keys: list[str]) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "p", "y", *keys)
        assert isinstance(app.screen, ConfirmScreen) and "lose 1 unsaved edit" in app.screen.question
        await settle(pilot, "n")
        assert app.is_running and app.session.unsaved == 1 and app.screen is browser(app)
        await pilot.press(*keys)
        await pilot.press("y")
        await pilot.pause()
    assert app.return_code == 0


async def test_quit_from_the_command_palette_asks_before_losing_edits(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "p", "y", "ctrl+p")
        await pilot.press(*"quit")
        await pilot.pause(0.3)
        await settle(pilot, "enter")
        assert isinstance(app.screen, ConfirmScreen) and "unsaved" in app.screen.question
        await settle(pilot, "escape")
        assert app.is_running and app.session.unsaved == 1


async def test_ctrl_q_inside_a_dialog_still_asks(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "p", "y", "ctrl+s", "ctrl+q")
        assert isinstance(app.screen, ConfirmScreen) and "unsaved" in app.screen.question
        await settle(pilot, "ctrl+q")  # asking twice does not stack dialogs
        await settle(pilot, "n")
        assert isinstance(app.screen, SaveScreen)


async def test_quit_without_edits_exits_at_once(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0 and not app.is_running


async def test_quit_after_saving_does_not_ask(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "p", "y")
        await save_as(pilot, train_file.parent / "out.pth")
        await pilot.press("q")
        await pilot.pause()
    assert not app.is_running


async def test_save_as_proposes_the_next_free_name(train_file: Path) -> None:
    (train_file.parent / "best_model.fixed.pth").write_bytes(b"taken")
    (train_file.parent / "best_model.fixed-2.pth").write_bytes(b"taken")
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "p", "y", "ctrl+s")
        assert app.screen.query_one("#save-path").value == "best_model.fixed-3.pth"


async def test_not_saved_as_safetensors_names_the_browser_keys_not_cli_options(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=(160, 40), notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "ctrl+s")
        app.screen.query_one("#save-path").value = str(train_file.parent / "out.safetensors")
        await settle(pilot, "enter")
        await settle(pilot)
        assert "not saved" in status(app) and "x (extract)" in status(app) and "--extract" not in status(app)


async def test_after_saving_a_cast_the_detail_panel_says_where_the_cast_values_are(tmp_path: Path) -> None:
    torch.save({"w": torch.randn(4, 4)}, tmp_path / "m.pth")
    app = CkptApp(str(tmp_path / "m.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "t")
        prompt = pilot.app.screen.query_one("Input")
        prompt.value = "fp16"
        await settle(pilot, "enter", "y")
        assert app.session.root["w"].dtype == "float16"
        await save_as(pilot, tmp_path / "half.pth")
        assert app.session.unsaved == 0 and "saved half.pth" in status(app)
        await settle(pilot, "j", "enter")  # enter: the stats at once (without it, once the cursor rests)
        assert "the cast values were saved to" in detail(app) and "half.pth" in detail(app)
        assert "exist once" not in detail(app)
    assert torch.load(tmp_path / "half.pth", weights_only=True)["w"].dtype == torch.float16


async def test_one_rank_file_alone_is_never_saved_as_whole_tensors(tmp_path: Path) -> None:
    import shutil

    fixtures = Path(__file__).parent / "fixtures" / "torch_distributed" / "fsdp1_sharded"
    shutil.copy(fixtures / "model_rank0.pt", tmp_path / "model_rank0.pt")  # (its sibling is not there)
    app = CkptApp(str(tmp_path / "model_rank0.pt"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await save_as(pilot, tmp_path / "whole.safetensors")
        for _ in range(200):
            if "one rank of 2" in status(app):
                break
            await pilot.pause(0.02)
        assert "one rank of 2" in status(app) and "name every rank's file together" in status(app)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_rank0.pt"]


async def test_save_as_at_80x24_says_ctrl_u_clears_the_proposed_name_and_it_does(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "x", "y", "ctrl+s")
        assert isinstance(app.screen, SaveScreen)
        assert "ctrl+u clears" in screen_text(app)
        field = app.screen.query_one("#save-path")
        await settle(pilot, "end", "ctrl+u")
        assert field.value == ""
        await pilot.press(*str(train_file.parent / "weights.safetensors"))
        await settle(pilot, "enter")
    from safetensors.torch import load_file

    assert sorted(load_file(train_file.parent / "weights.safetensors")) == sorted(fixed_state_dict())
