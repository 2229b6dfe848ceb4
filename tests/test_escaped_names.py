"""A key holding the text ``\\x1b`` and one holding the ESC character never look alike: names are shown
with their backslashes escaped too, in ``info``, ``stats`` (and ``--csv``) and the browser's tree."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch
from builders_tui import loaded, settle

from ckpt_tui.cli import main
from ckpt_tui.core.runtime.safe_text import from_printable, printable_name
from ckpt_tui.tui.app import CkptApp

LOOKALIKES = ["a\\x1bb", "a\x1bb", "c\\u202ed", "c\u202ed", "e\\\\f", "e\\f"]


def run_cli(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(list(args))
    return code, out.getvalue()


@pytest.fixture
def lookalikes(tmp_path: Path) -> Path:
    path = tmp_path / "lookalikes.pth"
    torch.save({key: torch.full((2,), float(index)) for index, key in enumerate(LOOKALIKES)}, path)
    return path


def first_words(lines: list[str]) -> list[str]:
    """The first word of each line that shows one of the keys (each starts with ``a``, ``c`` or ``e``)."""
    return [line.split()[0] for line in lines if line[:1] in ("a", "c", "e")]


def test_each_name_is_shown_its_own_way_and_read_back() -> None:
    shown = [printable_name(key) for key in LOOKALIKES]
    assert len(set(shown)) == len(LOOKALIKES)
    assert shown[:2] == ["a\\\\x1bb", "a\\x1bb"]
    assert all(from_printable(text) == key for text, key in zip(shown, LOOKALIKES, strict=True))


def test_info_shows_lookalike_keys_apart(lookalikes: Path) -> None:
    code, out = run_cli("info", str(lookalikes))
    assert code == 0
    tree = out.split("\ntree\n", 1)[1]
    names = first_words([line.removeprefix("    ") for line in tree.splitlines()])
    assert names == [printable_name(key) for key in LOOKALIKES]
    assert "\x1b" not in out and "\u202e" not in out


def test_stats_and_csv_show_lookalike_keys_apart(lookalikes: Path) -> None:
    code, out = run_cli("stats", str(lookalikes))
    assert code == 0
    assert first_words(out.splitlines()) == [printable_name(key) for key in LOOKALIKES]
    code, out = run_cli("stats", "--csv", str(lookalikes))
    assert code == 0
    assert [line.split(",")[0] for line in out.splitlines()[1:]] == [printable_name(key) for key in LOOKALIKES]


def test_json_keeps_the_names_as_the_file_holds_them(lookalikes: Path) -> None:
    code, out = run_cli("stats", "--json", str(lookalikes))
    assert code == 0
    rows = json.loads(out)
    rows = rows["tensors"] if isinstance(rows, dict) else rows
    assert [row["path"][-1] for row in rows] == LOOKALIKES


async def test_browser_tree_shows_lookalike_keys_apart(lookalikes: Path) -> None:
    app = CkptApp(str(lookalikes))
    async with app.run_test(size=(120, 40)) as pilot:
        tree = await loaded(pilot)
        labels = [str(node.label).split()[0] for node in tree.root.children]
        assert labels == [printable_name(key) for key in LOOKALIKES]


async def test_renaming_a_key_with_a_literal_escape_keeps_it_literal(lookalikes: Path) -> None:
    app = CkptApp(str(lookalikes))
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "r")
        field = app.screen.query_one("Input")
        assert field.value == "a\\\\x1bb"
        field.value = field.value + "2"
        await settle(pilot, "enter", "y")
        assert list(app.session.root)[:2] == ["a\\x1bb2", "a\x1bb"]
