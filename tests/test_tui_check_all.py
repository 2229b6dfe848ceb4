"""``C`` reads every tensor in a cancellable worker: NaN/Inf and unreadable records are marked in words."""

from __future__ import annotations

from pathlib import Path

import torch
from builders_tui import browser, cursor_path, header, loaded, screen_text, settle, status

from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.screens.findings import FindingsScreen


def with_bad_values(path: Path) -> Path:
    state = {
        "fine": torch.arange(4.0),
        "has_nan": torch.tensor([1.0, float("nan"), 2.0]),
        "has_inf": torch.tensor([float("inf"), 0.0]),
    }
    torch.save(state, path)
    return path


async def test_check_all_marks_the_tensors_with_nan_or_inf(tmp_path: Path) -> None:
    app = CkptApp(str(with_bad_values(tmp_path / "bad.pth")))
    async with app.run_test(size=(120, 30)) as pilot:
        await loaded(pilot)
        assert "!!" not in screen_text(app)
        await settle(pilot, "C")
        await settle(pilot)
        text = screen_text(app)
        assert "has_nan" in text and "!! NaN" in text and "!! Inf" in text
        assert "1 with NaN, 1 with Inf" in header(app) and "marked !!" in header(app)
        assert "2 marked" in status(app)
        fine_line = next(line for line in text.splitlines() if "fine" in line)
        assert "!!" not in fine_line
        # the header and the status line name the key that lists the marked tensors; enter goes to one
        assert "f lists them" in header(app) and "f lists them" in status(app)
        await settle(pilot, "f", "enter")
        assert cursor_path(app) in (("has_nan",), ("has_inf",))


async def test_check_all_marks_the_closed_lines_above_a_marked_tensor(tmp_path: Path) -> None:
    layers = {f"layer{i}.{name}": torch.ones(4) for i in range(6) for name in ("weight", "bias")}
    layers["layer1.weight"] = torch.tensor([1.0, float("nan"), 2.0, 3.0])
    path = tmp_path / "run.pth"
    torch.save({"epoch": 3, "state_dict": {"module": layers}, "optimizer": {"lr": 0.1}}, path)
    app = CkptApp(str(path))
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await settle(pilot, "C")
        await settle(pilot)
        assert "1 marked" in status(app)  # the tensor, not the lines above it
        lines = screen_text(app).splitlines()
        # "marked !! in the tree": the closed state_dict line says what lies below it
        assert any("state_dict" in line and "!! NaN below" in line for line in lines), "\n".join(lines)
        assert not any("optimizer" in line and "!!" in line for line in lines)
        await settle(pilot, "j", "j", "l", "j", "l")
        lines = screen_text(app).splitlines()
        assert any("module" in line and "!! NaN below" in line for line in lines)
        assert any("layer1.weight" in line and "!! NaN" in line for line in lines)
        await settle(pilot, "v")  # the module groups of the flat state_dict
        lines = screen_text(app).splitlines()
        assert any("layer1" in line and "module" in line and "!! NaN below" in line for line in lines)
        assert not any("layer0" in line and "!!" in line for line in lines)


async def test_check_all_on_a_clean_file_says_so(tmp_path: Path) -> None:
    path = tmp_path / "ok.pth"
    torch.save({"w": torch.ones(3)}, path)
    app = CkptApp(str(path))
    async with app.run_test(size=(120, 30)) as pilot:
        await loaded(pilot)
        await settle(pilot, "C")
        await settle(pilot)
        assert "no NaN/Inf" in header(app) and "nothing wrong" in status(app)


async def test_check_all_result_for_an_older_tree_is_dropped(tmp_path: Path) -> None:
    app = CkptApp(str(with_bad_values(tmp_path / "bad.pth")))
    async with app.run_test(size=(120, 30)) as pilot:
        await loaded(pilot)
        screen = browser(app)
        report_version = app.session.version
        app.session.version += 1  # as an edit would, while the check runs
        from ckpt_tui.core.operations.check import check_checkpoint
        from ckpt_tui.tui.screens.check_all import CheckOutcome

        # the check screen's outcome for the tree before the edit
        screen._check_finished(CheckOutcome(report_version, check_checkpoint(app.session.checkpoint)))
        await settle(pilot)
        assert screen.check is None


def with_nan_and_inf_in_one(path: Path) -> Path:
    both = torch.arange(10.0)
    both[2], both[5] = float("nan"), float("inf")
    state = {"both": both, "ok": torch.ones(3), "neg_inf": torch.tensor([float("-inf"), 1.0]).half()}
    torch.save(state, path)
    return path


async def test_check_all_counts_nan_and_inf_per_tensor_independently(tmp_path: Path) -> None:
    app = CkptApp(str(with_nan_and_inf_in_one(tmp_path / "nan.pth")))
    async with app.run_test(size=(120, 30)) as pilot:
        await loaded(pilot)
        await settle(pilot, "C")
        await settle(pilot)
        assert "1 with NaN, 2 with Inf" in header(app)


async def test_findings_list_what_check_all_found(tmp_path: Path) -> None:
    app = CkptApp(str(with_nan_and_inf_in_one(tmp_path / "nan.pth")))
    async with app.run_test(size=(120, 30), notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "f")
        assert app.screen is browser(app)  # nothing to list before the check
        await settle(pilot, "C")
        await settle(pilot, "f")
        assert isinstance(app.screen, FindingsScreen)
        shown = screen_text(app)
        assert 'ckpt["both"]: 1 NaN, 1 +Inf' in shown and 'ckpt["neg_inf"]: 1 -Inf of' in shown
        rows = app.screen.query_one("#findings-list")
        rows.highlighted = next(i for i, f in enumerate(app.screen.findings) if f.path == ("neg_inf",))
        await settle(pilot, "enter")
        assert browser(app).focused_data().path == ("neg_inf",)


async def test_check_all_marks_a_sparse_tensor_whose_indices_point_outside_it(tmp_path: Path) -> None:
    """torch.load accepts it (invariant checks are off by default); ``C`` must not say nothing is wrong."""
    path = tmp_path / "sparse.pth"
    indices = torch.tensor([[0, 5], [0, 0]])
    bad = torch.sparse_coo_tensor(indices, torch.ones(2), (2, 2), check_invariants=False)
    torch.save({"fine": torch.ones(2), "bad": bad}, path)
    app = CkptApp(str(path))
    async with app.run_test(size=(120, 30)) as pilot:
        await loaded(pilot)
        await settle(pilot, "C")
        await settle(pilot)
        text = screen_text(app)
        assert "!! bad indices" in next(line for line in text.splitlines() if "bad " in line)
        assert "1 sparse with indices outside it" in header(app)
        assert "1 marked" in status(app) and "nothing wrong" not in status(app)


async def test_check_all_of_a_file_replaced_since_it_was_opened_says_so(tmp_path: Path) -> None:
    import os

    path = tmp_path / "ok.pth"
    torch.save({"w": torch.ones(3)}, path)
    app = CkptApp(str(path))
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        os.replace(with_bad_values(tmp_path / "other.pth"), path)
        await settle(pilot, "C")
        await settle(pilot)
        # never the new file's NaN marks under the old file's tree
        assert "!!" not in screen_text(app)
        assert "changed on disk since it was opened" in status(app) + screen_text(app)


async def test_the_header_says_the_values_are_not_read_until_c_reads_them(tmp_path: Path) -> None:
    app = CkptApp(str(with_bad_values(tmp_path / "bad.pth")))
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        # on open nothing has read a value: a file with NaN must not read as clean
        unread = " ".join(header(app).split())
        assert "· values not read yet: C reads every tensor (NaN/Inf, broken records)" in unread
        shown = browser(app).query_one("#summary")
        assert shown.region.height <= 7 and "!!" not in screen_text(app)
        await settle(pilot, "C")
        await settle(pilot)
        read = " ".join(header(app).split())
        assert "not read yet" not in read and "every tensor read (3): 1 with NaN, 1 with Inf" in read
        # an edited tree is a tree C has not read: the line comes back, and C reads it
        browser(app).tree_view.reveal((("fine",), None))
        await settle(pilot, "d")
        await settle(pilot, "y")
        await settle(pilot)
        assert "values not read yet: C reads" in " ".join(header(app).split())


async def test_at_80_columns_a_marked_line_gives_up_the_marks_words_before_its_key(tmp_path: Path) -> None:
    """A long key with a mark, 80×24: the mark shrinks to ``!!`` (the header says what it means) and the key keeps
    its names whole (it was cut in the middle of a name: ``…2.self_a…ion.weight  [8, 8] fp32  !! NaN``)."""
    state = {f"module.encoder.{i}.self_attention.weight": torch.ones(8, 8) for i in range(4)}
    state["module.encoder.2.self_attention.weight"][0, 0] = float("nan")
    path = tmp_path / "run.pth"
    torch.save({"epoch": 3, "model_state_dict": state}, path)
    app = CkptApp(str(path))
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await settle(pilot, "C")
        await settle(pilot)
        lines = screen_text(app).splitlines()
        closed = next(line for line in lines if "─ ▶ model_state_dict" in line)
        assert "model_state_dict" in closed and "!!" in closed, closed
        await settle(pilot, "j", "j", "l")
        marked = [line for line in screen_text(app).splitlines() if "!!" in line and "[8, 8]" in line]
        assert len(marked) == 1 and "2.self_attention.weight  [8, 8] fp32  !!" in marked[0], marked
