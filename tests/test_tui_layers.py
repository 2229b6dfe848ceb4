"""The layers view (``L``): the table, sorting, filtering, jumping, marks, plots and the slimming preview."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from builders_tui import browser, cursor_path, detail, layered_checkpoint, loaded, screen_text, settle, status, text_of

from ckpt_tui.core.errors import Cancelled
from ckpt_tui.core.values import tensor_table
from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.screens.dialogs import PreviewScreen
from ckpt_tui.tui.screens.layers import LayersScreen, LayersTable

SIZE = (100, 32)


def layers(app: CkptApp) -> LayersScreen:
    screen = app.screen
    assert isinstance(screen, LayersScreen)
    return screen


def plot(app: CkptApp) -> str:
    return text_of(layers(app).query_one("#layers-plot"))


def title(app: CkptApp) -> str:
    return text_of(layers(app).query_one("#layers-title"))


def row_paths(app: CkptApp) -> list[str]:
    return ["/".join(str(k) for k in row.path) for row in layers(app).shown]


async def open_layers(pilot: Any) -> LayersScreen:
    await loaded(pilot)
    await settle(pilot, "L")
    await settle(pilot)
    return layers(pilot.app)


@pytest.fixture
def layered(tmp_path: Path) -> Path:
    return layered_checkpoint(tmp_path / "layers.pth")


async def test_L_shows_every_tensor_with_nan_norm_and_dead_marked_in_words(layered: Path) -> None:
    app = CkptApp(str(layered))
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_layers(pilot)
        table = screen.query_one(LayersTable)
        assert table.row_count == len(screen.rows) == 12 + 24
        text = screen_text(app)
        lines = [line for line in text.splitlines() if "layers." in line]
        line = {name: next(x for x in lines if f"model/layers.{name}.weight" in x) for name in "0234"}
        assert "!! norm" in line["2"] and "dead" in line["3"] and "!! NaN" in line["4"]
        assert "!!" not in line["0"] and "dead" not in line["0"]
        assert "3 marked" in title(app)


async def test_sort_keys_and_a_header_click_order_the_rows(layered: Path) -> None:
    app = CkptApp(str(layered))
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_layers(pilot)
        assert row_paths(app)[0] == "model/layers.0.weight"  # file order first
        await settle(pilot, "s", "s", "s")  # mark, path, norm
        assert screen.sort == "norm" and row_paths(app)[0] == "model/layers.2.weight"
        assert "by norm ▼" in title(app)
        await settle(pilot, "S")
        assert row_paths(app)[-1] == "model/layers.2.weight"
        table = screen.query_one(LayersTable)
        x = sum(col.get_render_width(table) for col in list(table.columns.values())[:3]) + 2  # the "min" header
        await pilot.click(LayersTable, offset=(x, 0))
        await settle(pilot)
        assert screen.sort == "min" and "by min ▼" in title(app)
        minimums = [row.value("min") for row in screen.shown if row.value("min") is not None]
        assert minimums == sorted(minimums, reverse=True)


async def test_filter_by_key_path_keeps_the_matching_rows(layered: Path) -> None:
    app = CkptApp(str(layered))
    async with app.run_test(size=SIZE) as pilot:
        await open_layers(pilot)
        await settle(pilot, "slash", *"layers.3", "enter")
        assert row_paths(app) == ["model/layers.3.weight", "model/layers.3.bias"]
        assert "filter 'layers.3'" in title(app)
        await settle(pilot, "slash", "backspace", "escape")
        assert len(row_paths(app)) > 2


async def test_enter_jumps_to_the_tensor_in_the_tree(layered: Path) -> None:
    app = CkptApp(str(layered))
    async with app.run_test(size=SIZE) as pilot:
        await open_layers(pilot)
        await settle(pilot, "j", "j", "j", "enter")
        assert app.screen is browser(app)
        await settle(pilot)
        assert cursor_path(app) == ("model", "layers.1.bias")


async def test_plots_norms_histogram_with_log_toggle_and_bytes(layered: Path) -> None:
    app = CkptApp(str(layered))
    async with app.run_test(size=SIZE) as pilot:
        await open_layers(pilot)
        norms = plot(app)
        assert "L2 norm by layer: model.layers.*.weight [4, 4] (6 tensors)" in norms
        assert "█" in norms and "x" in norms.splitlines()[-2] and "!" in norms.splitlines()[-2]
        await settle(pilot, "p")
        assert "histogram of model/layers.0.weight, linear counts" in plot(app)
        await settle(pilot, "o")
        assert "log counts" in plot(app)
        await settle(pilot, "p")
        parts = plot(app)
        assert "model" in parts and "optimizer" in parts and "drop optimizer: " in parts and "→" in parts


async def test_z_stages_dropping_the_optimizer_and_u_undoes_it(layered: Path) -> None:
    app = CkptApp(str(layered))
    async with app.run_test(size=SIZE) as pilot:
        await open_layers(pilot)
        await settle(pilot, "p", "p", "z")
        assert isinstance(app.screen, PreviewScreen)
        assert "drop the optimizer state (tensors" in screen_text(app)
        await settle(pilot, "y")
        assert app.session is not None and "optimizer" not in app.session.root
        # back in the table it was asked from, of the tree without the optimizer
        assert isinstance(app.screen, LayersScreen) and app.screen.root is app.session.root
        await settle(pilot, "escape")
        assert "1 unsaved edit" in status(app)
        await settle(pilot, "u")
        assert "optimizer" in app.session.root and "no unsaved edits" in status(app)


async def test_n_on_the_layers_views_drop_comes_back_to_the_table_and_changes_nothing(layered: Path) -> None:
    app = CkptApp(str(layered))
    async with app.run_test(size=SIZE) as pilot:
        await open_layers(pilot)
        await settle(pilot, "z", "n")
        assert isinstance(app.screen, LayersScreen) and app.session is not None and not app.session.edited


async def test_z_in_readonly_mode_says_why_and_changes_nothing(layered: Path) -> None:
    app = CkptApp(str(layered), readonly=True)
    async with app.run_test(size=SIZE) as pilot:
        await open_layers(pilot)
        await settle(pilot, "z")
        assert isinstance(app.screen, LayersScreen) and app.session is not None and not app.session.edited


async def test_escape_cancels_the_reading_and_closes(layered: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started = threading.Event()

    def slow(tensor: Any, byteorder: str, cancelled: Any, progress: Any) -> Any:
        started.set()
        while not cancelled():
            threading.Event().wait(0.01)
        raise Cancelled("stats cancelled")

    monkeypatch.setattr(tensor_table, "tensor_stats", slow)
    app = CkptApp(str(layered))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("L")
        assert started.wait(5)
        await pilot.press("escape")
        await settle(pilot)
        assert app.screen is browser(app)


async def test_detail_histogram_is_a_block_chart_and_o_switches_to_log_counts(layered: Path) -> None:
    app = CkptApp(str(layered))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "l", "j", "enter")
        shown = detail(app)
        assert "linear counts" in shown and "L2 norm" in shown
        assert sum(1 for line in shown.splitlines() if "█" in line) >= 2  # several lines of bars, not one
        await settle(pilot, "o")
        assert "log counts" in detail(app)


async def test_layers_view_fits_80x24_with_the_marks_visible(layered: Path) -> None:
    app = CkptApp(str(layered))
    async with app.run_test(size=(80, 24)) as pilot:
        await open_layers(pilot)
        await settle(pilot, "s")  # marked rows first
        text = screen_text(app)
        assert "!! NaN" in text and "!! norm" in text and "dead" in text
        assert "L2 norm by layer" in text


async def test_a_long_table_lists_the_first_rows_and_sorting_or_filtering_reaches_the_rest(
    layered: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckpt_tui.tui.screens import layers as layers_module

    monkeypatch.setattr(layers_module, "TABLE_LIMIT", 5)
    app = CkptApp(str(layered))
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_layers(pilot)
        table = screen.query_one(LayersTable)
        assert table.row_count == 5 and "first 5 listed" in title(app)
        assert "model/layers.5.weight" not in row_paths(app)[:5]
        await settle(pilot, "slash", *"layers.5", "enter")
        assert table.row_count == 2 and "first 5 listed" not in title(app)
        await settle(pilot, "G", "enter")
        assert cursor_path(app) == ("model", "layers.5.bias")


@pytest.fixture
def trained(tmp_path: Path) -> Path:
    """A training checkpoint as a tutorial saves it: a conv + BatchNorm model after SGD steps with momentum
    (the BatchNorm's ``num_batches_tracked`` counts 20 steps), its optimizer's state beside it."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(20):
        model(torch.randn(4, 3, 6, 6)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    path = tmp_path / "run.pth"
    torch.save(
        {"epoch": 1, "model_state_dict": model.state_dict(), "optimizer_state_dict": optimizer.state_dict()}, path
    )
    return path


async def test_the_norm_plot_of_every_tensor_leaves_out_integer_counters_and_optimizer_state(trained: Path) -> None:
    app = CkptApp(str(trained))
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_layers(pilot)
        assert screen.focused_row() is not None and len(screen.rows) == 9 + 6  # model tensors, momentum buffers
        norms = plot(app)
        # the counter (norm 20) would flatten every layer's bar; momentum is how the optimizer moved
        assert "L2 norm by layer: 8 tensors (integers and optimizer state left out), top " in norms
        bars = norms.splitlines()[-3]
        assert len(bars.split()) == 8
        # the model alone: only its counter is left out
        await settle(pilot, "slash", *"model", "enter")
        assert "L2 norm by layer: 8 tensors (integers left out)" in plot(app)


def test_a_path_that_fits_is_shown_whole_beside_one_that_is_shortened() -> None:
    from ckpt_tui.tui.screens.layers import CellTexts, fitted_paths

    paths = ["state_dict/module.conv1.weight", "state_dict/module.bn1.num_batches_tracked", "optimizer/state/0/buf"]
    texts = [CellTexts((), (), path, ()) for path in paths]
    shown = fitted_paths(texts, 0, 38)
    assert shown[0] == "state_dict/module.conv1.weight" and shown[2] == "optimizer/state/0/buf"
    assert len(shown[1]) <= 38 and shown[1].endswith("num_batches_tracked")


async def test_the_nan_the_layers_view_reads_marks_the_tree_when_it_closes(tmp_path: Path) -> None:
    import torch

    weights = {f"layer{i}.weight": torch.ones(4) for i in range(3)}
    weights["layer1.weight"] = torch.tensor([1.0, float("nan"), 2.0, 3.0])
    torch.save({"epoch": 3, "state_dict": weights}, tmp_path / "run.pth")
    app = CkptApp(str(tmp_path / "run.pth"))
    async with app.run_test(size=(80, 24)) as pilot:
        await open_layers(pilot)
        assert any("!! NaN" in line for line in screen_text(app).splitlines())
        await settle(pilot, "escape")
        lines = screen_text(app).splitlines()
        assert any("state_dict" in line and "!! NaN below" in line for line in lines)
        assert "1 tensor with NaN/Inf: marked !!" in " ".join(status(app).split())
        await settle(pilot, "j", "j", "l")
        assert any("layer1.weight" in line and "!! NaN" in line for line in screen_text(app).splitlines())
