"""The browser's long work on many keys (``v``'s grouping, a search, ``L``, ``C``): off the UI thread, with a
percentage on the status line or the screen's bar, escape cancels it, and the result is what it was."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_tui import browser, cursor_path, loaded, settle, status
from rich.cells import cell_len

from ckpt_tui.tui import messages
from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.screens.layers import CELL_COLUMNS, ROWS_PAGE, LayersScreen, LayersTable, cell_text
from ckpt_tui.tui.widgets import tree_view

SIZE = (120, 36)
KEYS = 5000


def key(index: int) -> str:
    return f"module.layers.{index // 10}.sub{index % 10}.weight"


@pytest.fixture
def big_file(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    state = OrderedDict((key(i), torch.randn(2) * (1 + i % 7)) for i in range(KEYS))
    torch.save(state, tmp_path / "big.pth")
    return tmp_path / "big.pth"


class Gate:
    """Holds a worker at a point until the test opens it: ``reached`` is set when the worker gets there."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.opened = threading.Event()
        self.threads: list[bool] = []

    def hold(self) -> None:
        self.threads.append(threading.current_thread() is threading.main_thread())
        self.reached.set()
        assert self.opened.wait(20), "the test never opened the gate"


async def until(pilot: Any, done: Any) -> None:
    """Let the app run until ``done()`` holds (a worker reached its gate, a message was handled)."""
    for _ in range(500):
        if done():
            return
        await pilot.pause(0.01)
    raise AssertionError("never happened")


async def test_v_shows_how_far_the_grouping_is_and_escape_cancels_it(
    big_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate()
    grouped = tree_view.group_keys

    def held(items: Iterable[tuple[str, Any]]) -> Any:
        listed = iter(items)
        first = [next(listed) for _ in range(tree_view.GROUP_STEP + 1)]  # a step done: a percentage posted
        if not gate.opened.is_set():
            gate.hold()
        return grouped([*first, *listed])

    monkeypatch.setattr(tree_view, "group_keys", held)
    monkeypatch.setattr(messages, "REDRAW_EVERY", 0.0)  # the percentage at once, however fast the machine
    app = CkptApp(str(big_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("v")
        await until(pilot, gate.reached.is_set)
        await until(pilot, lambda: "40%" in status(app))
        assert "grouping keys… 40% · escape cancels" in status(app)
        assert gate.threads == [False]
        await pilot.press("escape")
        gate.opened.set()
        await settle(pilot)
        assert "grouping keys: cancelled, nothing changed" in status(app)
        assert not browser(app).tree_view.grouped
        assert not browser(app).tree_view.knows_groups(app.session.root)
        line = browser(app).tree_view.root.children[0]
        assert line.data.path == (key(0),)  # the plain keys, as before
        # pressed again, it groups: the same groups a direct count gives
        await settle(pilot, "v")
        assert browser(app).tree_view.grouped and "grouped by module path" in status(app)
        shown = browser(app).tree_view.root.children[0].data.group
        assert shown is not None and (shown.prefix, shown.tensors) == ("module.", KEYS)
        direct = tree_view.module_groups(app.session.root)
        assert direct is not None and [g.prefix for g in direct.entries] == [shown.prefix]


async def test_escape_cancels_a_search_and_the_cursor_stays(big_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckpt_tui.tui.screens import browser as browser_module

    gate = Gate()
    walk = browser_module.iter_nodes

    def held(root: Any) -> Iterator[Any]:
        for step, node in enumerate(walk(root)):
            if step == 1 and not gate.opened.is_set():
                gate.hold()
            yield node

    monkeypatch.setattr(browser_module, "iter_nodes", held)
    app = CkptApp(str(big_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await settle(pilot, "j")
        before = cursor_path(app)
        await settle(pilot, "slash")
        browser(app).query_one("#search").value = "layers.432.sub7"
        await pilot.press("enter")
        await until(pilot, gate.reached.is_set)
        await until(pilot, lambda: "escape cancels" in status(app))  # offered once the search takes a moment
        assert "searching for 'layers.432.sub7'… · escape cancels" in status(app)
        await pilot.press("escape")
        gate.opened.set()
        await settle(pilot)
        assert "cancelled, nothing changed" in status(app)
        assert cursor_path(app) == before and browser(app).matches == []
        # the same search, not cancelled, finds its key
        await settle(pilot, "slash")
        browser(app).query_one("#search").value = "layers.432.sub7"
        await settle(pilot, "enter")
        assert cursor_path(app) == (key(4327),) and "match 1/1" in status(app)
        assert gate.threads == [False]


async def test_the_search_finds_the_places_of_the_keys_off_the_ui_thread(
    big_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The jump to a match in a dict of 5,000 keys looks its key up in places worked out by the search's worker."""
    threads: list[bool] = []
    places = tree_view._places

    def recorded(entries: list[Any]) -> dict[Any, int]:
        threads.append(threading.current_thread() is threading.main_thread())
        return places(entries)

    monkeypatch.setattr(tree_view, "_places", recorded)
    app = CkptApp(str(big_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await settle(pilot, "slash")
        browser(app).query_one("#search").value = "layers.432.sub"
        await settle(pilot, "enter")
        assert cursor_path(app) == (key(4320),)
        await settle(pilot, "n", "n")
        assert cursor_path(app) == (key(4322),)
        assert threads == [False]


async def test_layers_table_shows_the_cells_its_worker_wrote_in_columns_as_wide_as_them(big_file: Path) -> None:
    app = CkptApp(str(big_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await settle(pilot, "L")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, LayersScreen)
        table = screen.query_one(LayersTable)
        assert len(screen.texts) == 1000  # the first rows' cells, made by the worker
        assert table.row_count == ROWS_PAGE  # a page of them in the table; the others as the cursor goes
        await settle(pilot, "pagedown", "pagedown", "pagedown", "pagedown")
        assert ROWS_PAGE < table.row_count < 1000
        await settle(pilot, "G")
        assert table.row_count == 1000 and table.cursor_row == 999
        await settle(pilot, "g")
        columns = [str(column.key.value) for column in table.ordered_columns]
        for index in (0, 1, 517, 999):
            row = screen.shown[index]
            cells = [cell.plain for cell in table.get_row_at(index)]
            for column, cell in zip(columns, cells, strict=True):
                if column in CELL_COLUMNS:
                    assert cell in (cell_text(row, column), cell_text(row, column, True))
        for column in table.ordered_columns:
            name = str(column.key.value)
            if name in CELL_COLUMNS:  # as wide as its widest cell or its label, as the table would measure it
                widest = max(cell_len(cell.plain) for cell in table.get_column(column.key))
                assert column.width == max(widest, cell_len(column.label.plain))
        await settle(pilot, "s", "s", "s")  # sorted by norm: rows the worker did not write, made here
        assert screen.sort == "norm"
        norms = [row.stats.norm for row in screen.shown[:1000]]
        assert norms == sorted(norms, reverse=True)  # the largest first
        first = [cell.plain for cell in table.get_row_at(0)]
        assert cell_text(screen.shown[0], "norm", True) in first or cell_text(screen.shown[0], "norm") in first


async def test_check_all_on_a_clean_file_keeps_the_lines_shown(big_file: Path) -> None:
    app = CkptApp(str(big_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        lines = list(browser(app).tree_view.root.children[:50])
        await settle(pilot, "C")
        await settle(pilot)
        assert "every tensor read: nothing wrong" in status(app)
        assert list(browser(app).tree_view.root.children[:50]) == lines  # not rebuilt: nothing to mark


def test_progress_redraws_are_spaced_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(messages.time, "monotonic", lambda: clock[0])
    posted: list[messages.Progress] = []
    poster = messages.ProgressPoster(posted.append, "layers", every=messages.REDRAW_EVERY)  # type: ignore[arg-type]
    for done in range(1, 1001):
        clock[0] += 0.001  # a second in all: 2 redraws, not 50
        poster(done, 1000)
    fractions = [p.fraction for p in posted]  # here a fraction is the second it was reached at
    assert len(fractions) == 2 and fractions[0] >= messages.REDRAW_EVERY - 0.001  # none in the first moment
    assert all(later - earlier >= messages.REDRAW_EVERY - 0.001 for earlier, later in pairwise(fractions))
