"""The browser, driven headless with Pilot on real files: looking around (keys, panel, header, help)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from builders import many_keys
from builders_tui import (
    browser,
    cursor_data,
    cursor_path,
    detail,
    header,
    loaded,
    save_fixed_training,
    screen_text,
    settle,
    status,
    text_of,
)
from textual.widgets import OptionList

from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.messages import StatsReady, SummaryReady
from ckpt_tui.tui.screens.dialogs import ErrorScreen
from ckpt_tui.tui.screens.findings import FindingsScreen
from ckpt_tui.tui.screens.help import HelpBody, HelpScreen
from ckpt_tui.tui.widgets.tree_view import PAGE

SIZE = (120, 36)


@pytest.fixture
def train_file(tmp_path: Path) -> Path:
    return save_fixed_training(tmp_path / "best_model.pth")


async def test_open_shows_header_tree_and_status(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        tree = await loaded(pilot)
        top = header(app)
        assert "best_model.pth" in top and "cuda:0" in top and "'module.'" in top
        assert [str(n.label).split()[0] for n in tree.root.children] == [
            "epoch",
            "model",
            "optimizer",
            "scheduler",
            "args",
        ]
        assert status(app).startswith("ckpt") and "no unsaved edits" in status(app)


async def test_navigation_keys_move_expand_collapse_top_bottom(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        tree = await loaded(pilot)
        await pilot.press("j", "j")
        assert cursor_path(app) == ("model",)
        await pilot.press("l")
        assert tree.cursor_node.is_expanded and len(tree.cursor_node.children) == 9
        await pilot.press("l")
        assert cursor_path(app) == ("model", "module.conv.weight")
        await pilot.press("k")
        assert cursor_path(app) == ("model",)
        await pilot.press("h")
        assert not tree.cursor_node.is_expanded
        await pilot.press("space")
        assert tree.cursor_node.is_expanded
        await pilot.press("down", "left")
        assert cursor_path(app) == ("model",)
        await pilot.press("G")
        await pilot.pause()
        assert cursor_path(app) == ("args",)
        await pilot.press("g")
        assert cursor_path(app) == ()
        await pilot.press("pagedown")
        assert cursor_path(app) != ()
        await pilot.press("home")
        assert cursor_path(app) == ()


async def test_enter_shows_the_focused_tensors_stats(tmp_path: Path) -> None:
    weights = torch.arange(12.0).reshape(3, 4)
    torch.save({"w": weights}, tmp_path / "w.pth")
    app = CkptApp(str(tmp_path / "w.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "enter")
        shown = detail(app)
        assert 'ckpt["w"]' in shown and "[3, 4]" in shown
        assert "NaN       0" in shown and "Inf       0" in shown and "max       11" in shown and "min       0" in shown


@pytest.mark.parametrize("size", [SIZE, (80, 24)])
async def test_the_panel_says_where_the_first_nan_and_inf_are_as_check_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], size: tuple[int, int]
) -> None:
    from ckpt_tui.cli import main

    weights = torch.arange(12.0).reshape(3, 4)
    weights[1, 2] = float("nan")
    weights[2, 0], weights[2, 3] = float("-inf"), float("-inf")
    torch.save({"w": weights}, tmp_path / "nan.pth")
    assert main(["check", str(tmp_path / "nan.pth")]) == 1
    said = next(line for line in capsys.readouterr().out.splitlines() if '[nan] ckpt["w"]' in line).split(": ", 1)[1]
    assert said == "1 NaN, 2 -Inf of 12 values; first NaN at [1, 2], first Inf at [2, 0]"
    app = CkptApp(str(tmp_path / "nan.pth"))
    async with app.run_test(size=size, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "enter")
        shown = " ".join(detail(app).split())
        # check's sentence, its indices kept whole on the panel's narrow column
        assert "NaN/Inf (!) 1 NaN, 2 -Inf of 12 values; first NaN at [1,2], first Inf at [2,0]" in shown


async def test_stats_follow_the_cursor_without_enter(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await pilot.press("j", "j", "l", "l")
        await pilot.pause(0.5)  # the panel waits for the cursor to rest, then computes
        await settle(pilot)
        assert 'ckpt["model"]["module.conv.weight"]' in detail(app)
        assert "min       -1" in detail(app) and "max       1" in detail(app)
        await pilot.press("j")
        assert 'ckpt["model"]["module.conv.bias"]' in detail(app)
        assert "stats" not in detail(app).split("[8]")[-1].splitlines()[-1]  # the old stats are gone at once


async def test_a_stale_stats_result_is_dropped(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "l", "l", "enter")
        panel = browser(app).detail
        before = detail(app)
        old_request = panel.request
        await settle(pilot, "j")
        from ckpt_tui.core.values.stats import TensorStats

        late = TensorStats(count=1, finite=1, min=123.0, max=456.0, mean=0.0, std=0.0)
        panel.post_message(StatsReady(old_request, late))
        await pilot.pause()
        assert "456" not in detail(app) and before != detail(app)


async def test_a_summary_for_an_older_version_is_dropped(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        screen = browser(app)
        current = screen.summary
        assert current is not None and app.session is not None
        from ckpt_tui.core.operations.info import summarize

        stale = summarize(app.session.checkpoint)
        stale.parameter_count = 123_456_789
        screen.post_message(SummaryReady(app.session.version - 1, stale))
        await pilot.pause()
        assert screen.summary is current and "123" not in header(app).split("params")[0]


async def test_search_and_next_match(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "slash", *"head", "enter")
        assert cursor_path(app) == ("model", "module.head.weight")
        await settle(pilot, "n")
        assert cursor_path(app) == ("model", "module.head.bias")
        await settle(pilot, "N")
        assert cursor_path(app) == ("model", "module.head.weight")
        assert "match 1/2" in status(app)
        assert 'ckpt["model"]["module.head.weight"]' in detail(app)


async def test_copy_key_path_to_clipboard(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await pilot.press("j", "j", "l", "l", "y")
        assert app.clipboard == 'ckpt["model"]["module.conv.weight"]'
        assert "copied" in status(app)


async def test_50000_keys_are_paged_grouped_and_searchable(tmp_path: Path) -> None:
    torch.save(many_keys(50_000), tmp_path / "many.pth")
    app = CkptApp(str(tmp_path / "many.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        tree = await loaded(pilot)
        assert len(tree.root.children) == PAGE + 1  # a page, then "… 49,800 more"
        assert f"{50_000 - PAGE:,} more" in str(tree.root.children[-1].label)
        tree.move_cursor(tree.root.children[-1])  # reaching the line loads the next page
        await pilot.pause()
        assert len(tree.root.children) == 2 * PAGE + 1
        await settle(pilot, "G")
        assert cursor_path(app) == ("layers.12499.p3",)
        await settle(pilot, "v")
        assert str(tree.root.children[0].label).startswith("layers")
        assert "50000 tensors" in str(tree.root.children[0].label)
        await settle(pilot, "slash", *"layers.7.p2", "enter")
        assert cursor_path(app) == ("layers.7.p2",)
        await settle(pilot, "slash", *"layers.9000.p1", "enter")
        assert cursor_path(app) == ("layers.9000.p1",)


async def test_a_file_that_is_not_a_checkpoint_shows_why_and_q_quits(tmp_path: Path) -> None:
    (tmp_path / "bad.pth").write_bytes(b"not a checkpoint at all")
    app = CkptApp(str(tmp_path / "bad.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, ErrorScreen)
        assert "not a checkpoint" in screen_text(app) or "cannot" in screen_text(app).lower()
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0


async def test_help_lists_every_active_key_by_group(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "question_mark")
        assert isinstance(app.screen, HelpScreen)
        shown = text_of(app.screen.query_one("#help-text"))
        for group in ("move", "view", "edit", "file", "app"):
            assert f"\n{group}\n" in "\n" + shown
        words_shown = ("j / ↓", "Strip prefix", "ctrl+s", "Save as", "q / ctrl+q", "g / Home", "Delete", "Compare")
        for words in (*words_shown, "PgDn", "Stats now", "All findings", "Command palette", "ctrl+r"):
            assert words in shown, words
        tree_keys = {b.action for b in browser(app).tree_view._bindings.key_to_bindings.get("j", [])}
        assert tree_keys == {"cursor_down"}


async def test_help_scrolls_by_keyboard_to_its_end_at_80x24(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "question_mark")
        body = app.screen.query_one(HelpBody)
        assert body.max_scroll_y > 0, "help fits without scrolling: test a smaller terminal"
        # the last line of help, Quit's (the footer under the dialog shows the key too, not its tooltip)
        last = "asks first when edits are unsaved"
        assert last not in screen_text(app)
        await settle(pilot, "end")
        assert body.scroll_y == body.max_scroll_y and last in screen_text(app)
        await settle(pilot, "home")
        assert body.scroll_y == 0
        await settle(pilot, "j", "j")
        assert body.scroll_y == 2
        await settle(pilot, "k")
        assert body.scroll_y == 1
        await settle(pilot, "pagedown")
        assert body.scroll_y > 2
        await settle(pilot, "pageup")
        assert body.scroll_y == 1
        await settle(pilot, "escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_palette_lists_every_key_as_group_and_action(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for title in ("edit: Strip prefix", "file: Save as", "edit: Delete", "view: All findings", "move: Down",
                      "app: Quit", "app: Help"):  # fmt: skip
            assert title in titles, title
        assert titles.count("Quit") == 0, "one Quit entry, the guarded one"


async def test_running_a_palette_entry_runs_its_action(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        command = next(c for c in app.get_system_commands(app.screen) if c.title == "app: Help")
        await command.callback()
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)


async def test_findings_screen_lists_all_and_jumps_to_a_findings_key(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        # one finding per fact: a restatement kept for info --json is not listed
        # (the reader's note that torch refuses the Namespace is the header's weights_only line, listed first)
        findings = [f for f in browser(app).summary.shown_findings if f.kind != "weights-only-data"]
        assert len(findings) > 3 and "f lists them all" in header(app)
        await settle(pilot, "f")
        assert isinstance(app.screen, FindingsScreen)
        shown = screen_text(app)
        assert all(f.message[:40] in shown for f in findings)
        # the list opens with the header's weights_only refusal (this file holds an argparse.Namespace)
        assert app.screen.findings[0].kind == "weights-only"
        index = next(i for i, f in enumerate(app.screen.findings) if f.kind == "optimizer")
        app.screen.query_one("#findings-list").highlighted = index
        await settle(pilot, "enter")
        assert cursor_path(app) == ("optimizer",)
        assert cursor_data(app).group is None


# ---- read-only hides every edit -------------------------------------------------------------------

EDIT_WORDS = ("Strip prefix", "Undo", "Save as", "Rename", "Delete", "Cast dtype", "Add prefix", "Map devices")


async def test_readonly_hides_every_edit_from_footer_help_palette_and_header(train_file: Path) -> None:
    app = CkptApp(str(train_file), readonly=True)
    async with app.run_test(size=(160, 40), notifications=True) as pilot:
        await loaded(pilot)
        footer = text_of_footer(app)
        assert "Search" in footer and not any(words in footer for words in EDIT_WORDS)
        assert "strips it" not in header(app) and "extracts it" not in header(app)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "view: Search" in titles and not [t for t in titles if t.startswith("edit:") or "Save as" in t]
        await settle(pilot, "question_mark")
        shown = text_of(app.screen.query_one("#help-text"))
        assert "Search" in shown and not any(words in shown for words in EDIT_WORDS)


async def test_writable_header_names_the_key_that_fixes_a_finding(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=(160, 40), notifications=True) as pilot:
        await loaded(pilot)
        assert "x on it extracts it" in header(app)  # the first finding: extract (and strip) the model
        assert "Strip prefix" in text_of_footer(app)


def text_of_footer(app: CkptApp) -> str:
    """What the footer shows: every key it lists with its description."""
    from textual.widgets import Footer

    footer = browser(app).query_one(Footer)
    return " ".join(f"{key.key_display or key.key} {key.description}" for key in footer.query("FooterKey"))


# ---- a plain value shows its type and value, no counts ---------------------------------------------


async def test_detail_of_a_plain_value_shows_its_value_and_no_counts(train_file: Path) -> None:
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        browser(app).tree_view.reveal((("epoch",), None))
        await settle(pilot)
        assert cursor_path(app) == ("epoch",)
        shown = " ".join(detail(app).split())
        assert "type int" in shown and "value 3" in shown
        assert "tensors" not in shown and "children" not in shown and "too many" not in shown


async def test_detail_of_a_hostile_string_is_escaped_and_bounded(tmp_path: Path) -> None:
    torch.save({"s": "\x1b[31mRED\x07" + "x" * 2000, "w": torch.ones(1)}, tmp_path / "s.pth")
    app = CkptApp(str(tmp_path / "s.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j")
        assert cursor_path(app) == ("s",)
        shown = detail(app)
        assert r"\x1b[31mRED\x07" in shown and "\x1b" not in shown and "too many" not in shown
        assert shown.count("x") < 500


# ---- report lists move with j/k and g/G as well as the arrows ------------------------------------------


async def test_report_lists_move_with_vim_keys(train_file: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.pth"
    torch.save({"a": torch.ones(1), "b": torch.ones(2), "c": torch.ones(3), "d": torch.ones(4)}, other)
    app = CkptApp(str(train_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        for opening in (("f",), ("D",)):
            await settle(pilot, *opening)
            if opening == ("D",):
                app.screen.query_one("Input").value = str(other)
                await settle(pilot, "enter")
            rows = app.screen.query_one(OptionList)
            start = rows.highlighted
            await settle(pilot, "j", "j")
            assert rows.highlighted is not None and rows.highlighted > start
            moved = rows.highlighted
            await settle(pilot, "k")
            assert rows.highlighted < moved
            await settle(pilot, "G")
            last = rows.highlighted
            assert last == max(i for i, option in enumerate(rows.options) if not option.disabled)
            await settle(pilot, "g")
            assert rows.highlighted < last
            await settle(pilot, "escape")
            assert app.screen is browser(app)


def test_a_remote_files_prompts_offer_its_url_folder_not_a_broken_url() -> None:
    from ckpt_tui.tui.app import input_folder

    assert input_folder("https://127.0.0.1:8612/cnn_step30.pth") == "https://127.0.0.1:8612/"
    assert input_folder("hf://org/repo/run/model.safetensors") == "hf://org/repo/run/"
    assert input_folder("https://host/run/step_20/") == "https://host/run/"
    assert input_folder("cnn_step30.pth") == "./" and input_folder("/data/run/a.pth") == "/data/run/"
