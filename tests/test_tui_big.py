"""A state_dict of thousands of keys: jumps add only the page of lines around their target, and after an
edit, undo or redo the cursor keeps its key while the detail panel and the status line follow it."""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_tui import browser, cursor_data, cursor_path, detail, header, loaded, settle, status, text_of

from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.widgets.tree_view import PAGE

SIZE = (120, 36)
KEYS = 5000


def key(index: int) -> str:
    return f"module.layers.{index // 10}.sub{index % 10}.weight"


@pytest.fixture
def big_file(tmp_path: Path) -> Path:
    state = OrderedDict((key(i), torch.zeros(1)) for i in range(KEYS))
    torch.save(state, tmp_path / "big.pth")
    return tmp_path / "big.pth"


def lines_shown(app: CkptApp) -> int:
    return len(browser(app).tree_view.root.children)


async def search(pilot, text: str) -> None:
    await settle(pilot, "slash")
    browser(pilot.app).query_one("#search").value = text
    await settle(pilot, "enter")


async def test_bottom_adds_only_the_last_page(big_file: Path) -> None:
    app = CkptApp(str(big_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await settle(pilot, "G")
        assert cursor_path(app) == (key(KEYS - 1),)
        assert lines_shown(app) <= 2 * PAGE + 2  # the first page, a "more" line, the last page
        assert status(app).startswith(f'ckpt["{key(KEYS - 1)}"]')
        await settle(pilot, "k")
        assert cursor_path(app) == (key(KEYS - 2),)


async def test_search_and_next_match_add_only_the_page_around_the_match(big_file: Path) -> None:
    app = CkptApp(str(big_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await search(pilot, "layers.432.sub")
        assert cursor_path(app) == (key(4320),) and "match 1/10" in status(app)
        await settle(pilot, "n")
        assert cursor_path(app) == (key(4321),) and "match 2/10" in status(app)
        await settle(pilot, "N", "N")
        assert cursor_path(app) == (key(4329),)
        assert lines_shown(app) <= 2 * PAGE + 3
        await settle(pilot, "g", "j")  # the first page is still there, in order
        assert cursor_path(app) == (key(0),)


async def test_a_more_line_between_pages_loads_the_keys_it_stands_for(big_file: Path) -> None:
    app = CkptApp(str(big_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await settle(pilot, "G")
        browser(app).tree_view.move_cursor(browser(app).tree_view.root.children[PAGE])  # the "… more" line
        await settle(pilot)
        assert cursor_path(app) == (key(PAGE),)
        keys = [node.data.path[0] for node in browser(app).tree_view.root.children if not node.data.is_more]
        assert keys == sorted(keys, key=lambda k: int(k.split(".")[2]) * 10 + int(k.split(".")[3][3:]))


async def test_undo_and_redo_of_a_strip_keep_the_deep_cursor_with_panel_and_status(big_file: Path) -> None:
    app = CkptApp(str(big_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await search(pilot, "layers.432.sub1")
        await settle(pilot, "p", "y")
        stripped = key(4321).removeprefix("module.")
        assert cursor_path(app) == (stripped,)
        assert status(app).startswith(f'ckpt["{stripped}"]') and detail(app).startswith(f'ckpt["{stripped}"]')
        await settle(pilot, "u")
        assert cursor_path(app) == (key(4321),)
        assert status(app).startswith(f'ckpt["{key(4321)}"]') and "undone" in status(app)
        assert detail(app).startswith(f'ckpt["{key(4321)}"]')
        await settle(pilot, "ctrl+r")
        assert cursor_path(app) == (stripped,) and status(app).startswith(f'ckpt["{stripped}"]')
        assert detail(app).startswith(f'ckpt["{stripped}"]')


async def test_undo_of_a_group_delete_shows_the_groups_counts_again(big_file: Path) -> None:
    app = CkptApp(str(big_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await settle(pilot, "v")
        browser(app).tree_view.reveal(((), "module.layers.499."))
        await settle(pilot)
        assert cursor_data(app).group.prefix == "module.layers.499."
        assert "below 10 tensors" in " ".join(detail(app).split())
        await settle(pilot, "d", "y")
        assert len(app.session.root) == KEYS - 10
        await settle(pilot, "u")
        assert len(app.session.root) == KEYS
        assert cursor_data(app).group.prefix == "module.layers.499."
        assert "below 10 tensors" in " ".join(detail(app).split())
        assert status(app).startswith("ckpt › module.layers.499.*") and "no unsaved edits" in status(app)


async def test_the_root_detail_counts_every_key_from_the_summary(big_file: Path) -> None:
    """Past the browser's counting budget, the root's tensors, parameters and bytes come from the summary."""
    app = CkptApp(str(big_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        browser(app).tree_view.move_cursor(browser(app).tree_view.root)
        await settle(pilot)
        shown = detail(app)
        assert "too many nodes" not in shown
        assert "5,000" in shown and "children" in shown
        await settle(pilot, "p", "y")  # strip module.: a new tree, summed up again
        assert next(iter(browser(app).session.root)) == "layers.0.sub0.weight"
        browser(app).tree_view.move_cursor(browser(app).tree_view.root)
        await settle(pilot)
        assert "5,000" in detail(app) and "too many nodes" not in detail(app)


async def test_v_groups_the_keys_in_a_worker(big_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckpt_tui.tui.widgets import tree_view

    threads: list[bool] = []
    counted = tree_view.group_keys

    def recorded(items: Any) -> Any:
        threads.append(threading.current_thread() is threading.main_thread())
        return counted(items)

    monkeypatch.setattr(tree_view, "group_keys", recorded)
    app = CkptApp(str(big_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await settle(pilot, "v")
        assert threads == [False]  # counted once, off the UI thread
        assert browser(app).tree_view.grouped
        assert "grouped by module path" in status(app)
        await settle(pilot, "v", "v")
        assert threads == [False]  # regrouping reuses the count


def recording(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[bool]:
    """Replace ``module.name`` by a wrapper that records, per call, whether it ran on the UI thread."""
    threads: list[bool] = []
    original = getattr(module, name)

    def recorded(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread() is threading.main_thread())
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, recorded)
    return threads


async def test_p_computes_the_strip_in_a_worker_and_apply_undo_redo_count_in_one(
    big_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first p works out the edit off the UI thread; y, u and ctrl+r redraw one page of lines from
    listings made off the UI thread (or kept) and leave the header's totals (a walk of every tensor) to the
    summary's worker, which counts and judges each tree once."""
    from ckpt_tui.core.edits import tree_edits
    from ckpt_tui.core.operations import info
    from ckpt_tui.tui.screens import browser as browser_module
    from ckpt_tui.tui.widgets import tree_view

    stripped = recording(monkeypatch, tree_edits, "strip_prefix")
    summed = recording(monkeypatch, browser_module, "staged_summary")
    judged = recording(monkeypatch, browser_module, "judge_tree")  # what saving the edited tree would give
    viewed = recording(monkeypatch, info, "view_key")  # per tensor: the header's element count
    listed = recording(monkeypatch, tree_view, "child_pairs")  # per key: the lines' entries
    app = CkptApp(str(big_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        listed.clear()  # the file's own tree, listed when it is first shown
        await settle(pilot, "p")
        assert stripped == [False]
        await settle(pilot, "y")
        assert next(iter(app.session.root)) == key(0).removeprefix("module.")
        assert lines_shown(app) <= PAGE + 1
        await settle(pilot, "u", "ctrl+r")
        assert "redone" in status(app)
        assert summed and not any(summed)  # the first count, then one after y: u and ctrl+r come back to trees counted
        assert len(summed) == 2
        assert judged == [False]  # the edited tree (y), in the summary's worker; ctrl+r comes back to it
        assert not any(viewed)
        assert listed == [False]  # the stripped tree's keys, listed by the edit's worker; undo, redo reuse listings
        assert "5000 tensors" in header(app)


async def test_search_walks_the_keys_in_a_worker(big_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckpt_tui.tui.screens import browser as browser_module

    walked = recording(monkeypatch, browser_module, "iter_nodes")
    app = CkptApp(str(big_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await search(pilot, "layers.432.sub7")
        assert walked == [False]
        assert cursor_path(app) == (key(4327),)


async def test_layers_name_the_families_in_their_worker_and_the_plot_follows_the_cursor(
    big_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """L reads every tensor and names each row's family in its worker; moving down the table redraws the
    norm plot of the focused row's family without naming them again."""
    from ckpt_tui.core.conventions import layer_marks

    named = recording(monkeypatch, layer_marks, "families")
    app = CkptApp(str(big_file))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await settle(pilot, "L")
        await settle(pilot, "j", "j")
        plot = text_of(app.screen.query_one("#layers-plot"))
        assert "L2 norm by layer: module.layers.*.sub2.weight [1] (500 tensors)" in plot
        assert named and not any(named)
