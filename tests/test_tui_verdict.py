"""The browser's header gives torch.load(weights_only=True)'s verdict on the file, with the blockers named."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from builders_tui import header, loaded, settle

from ckpt_tui.tui.app import CkptApp


async def test_the_header_names_what_weights_only_refuses(tmp_path: Path) -> None:
    path = tmp_path / "ns.pth"
    torch.save({"w": torch.ones(2), "args": argparse.Namespace(lr=0.1)}, path)
    app = CkptApp(str(path))
    async with app.run_test(size=(120, 30)) as pilot:
        await loaded(pilot)
        assert "torch.load REFUSES it" in header(app) and "argparse.Namespace" in header(app)
        await settle(pilot, "j", "j", "d", "y")  # deleting the Namespace is an edit: the file's verdict stays
        assert "argparse.Namespace" in header(app)


async def test_a_plain_state_dict_gets_no_warning(tmp_path: Path) -> None:
    path = tmp_path / "plain.pth"
    torch.save({"w": torch.ones(2)}, path)
    app = CkptApp(str(path))
    async with app.run_test(size=(120, 30)) as pilot:
        await loaded(pilot)
        assert "REFUSES" not in header(app)


async def test_a_collision_is_flagged_and_never_loads(tmp_path: Path) -> None:
    """Twin data.pkl members: the header says "cannot tell" and names the collision (never "loads")."""
    import io
    import zipfile

    from builders_readers import write_raw_zip

    buffer = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buffer)
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as archive:
        members = [(info.filename.encode(), archive.read(info)) for info in archive.infolist()]
    data = next(blob for name, blob in members if name.endswith(b"/data.pkl"))
    path = write_raw_zip(tmp_path / "twins.pth", [*members, (b"archive/DATA.PKL", data)])
    app = CkptApp(str(path))
    async with app.run_test(size=(160, 40)) as pilot:
        await loaded(pilot)
        shown = header(app)
        assert "CANNOT TELL" in shown and "weights_only: torch.load loads it" not in shown
        assert "collide" in shown


async def test_undo_and_redo_show_the_verdict_known_of_that_tree_without_judging_it_again(
    tmp_path: Path, monkeypatch
) -> None:
    """Each tree is judged once: an undo or redo comes back to a tree already counted and judged."""
    from ckpt_tui.tui.screens import browser as browser_module

    path = tmp_path / "ns.pth"
    torch.save({"w": torch.ones(2), "args": argparse.Namespace(lr=0.1)}, path)
    judged: list[object] = []
    counted: list[object] = []
    judge, summarize = browser_module.judge_tree, browser_module.staged_summary
    monkeypatch.setattr(browser_module, "judge_tree", lambda root, stop=None: judged.append(root) or judge(root, stop))
    monkeypatch.setattr(browser_module, "staged_summary", lambda *a: counted.append(a[1]) or summarize(*a))
    app = CkptApp(str(path))
    async with app.run_test(size=(120, 30)) as pilot:
        await loaded(pilot)
        await settle(pilot, "j", "j", "d", "y")  # the Namespace deleted: what is saved loads
        edited = header(app)
        assert "what you save loads" in edited and len(judged) == 1 and len(counted) == 2
        await settle(pilot, "u")
        assert "torch.load REFUSES it" in header(app) and "what you save" not in header(app)
        await settle(pilot, "ctrl+r")
        assert header(app) == edited
        assert len(judged) == 1 and len(counted) == 2  # neither counted nor judged again
        await settle(pilot, "u", "ctrl+r", "u")
        assert "torch.load REFUSES it" in header(app) and len(judged) == 1 and len(counted) == 2
