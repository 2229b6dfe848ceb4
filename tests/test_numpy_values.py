"""numpy arrays and scalars in a checkpoint are shown as what they are (``ndarray float32 [3] = [...]``,
``numpy float64 = 0.93``), in ``info``, the tree and the side panel alike; torch.load's verdict on them is
unchanged."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from builders_tui import browser, detail, loaded, screen_text, settle, status

from ckpt_tui.cli import main
from ckpt_tui.tui.app import CkptApp


def numpy_file(path: Path) -> Path:
    """Weights beside numpy values as training scripts leave them: a mean, a best score, numpy's RNG state."""
    np.random.seed(0)
    torch.save(
        {
            "w": torch.ones(2),
            "mean": np.array([0.485, 0.456, 0.406], dtype=np.float32),
            "best": np.float64(0.93),
            "steps": np.int64(1200),
            "grid": np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3)),
            "big_endian": np.array([1.5, -2.25], dtype=">f4"),
            "names": np.array(["ab", "c"]),
            "rng": np.random.get_state(),
        },
        path,
    )
    return path


def info_lines(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """``info``'s tree lines, by key."""
    assert main(["info", str(path), "--depth", "3"]) == 0
    out = capsys.readouterr().out
    lines = out[out.index("\ntree\n") :].splitlines()[2:]
    return {line.split()[0]: line.strip().split("  ", 1)[1] for line in lines if "  " in line.strip()}


def test_info_shows_numpy_values_as_arrays_and_scalars(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shown = info_lines(numpy_file(tmp_path / "np.pth"), capsys)
    assert shown["mean"] == "ndarray float32 [3] = [0.485, 0.456, 0.406]"
    assert shown["best"] == "numpy float64 = 0.93"
    assert shown["steps"] == "numpy int64 = 1200"
    # a Fortran-ordered array's values in the order numpy indexes them; a big-endian one read as such
    assert shown["grid"] == "ndarray int64 [2, 3] = [[0, 1, 2], [3, 4, 5]]"
    assert shown["big_endian"] == "ndarray float32 [2] = [1.5, -2.25]"
    assert shown["names"] == "ndarray U2 [2] = ['ab', 'c']"
    # too many values for a line: its dtype and shape
    assert shown["1"] == "ndarray uint32 [624]"
    assert not any("_reconstruct" in line or "args[0]" in line for line in shown.values())


def test_the_weights_only_verdict_on_numpy_is_unchanged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = numpy_file(tmp_path / "np.pth")
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "weights_only: torch.load REFUSES it" in out and "numpy._core.multiarray._reconstruct" in out
    assert "numpy._core.multiarray.scalar (2×) at" in out


def test_numpy_1_names_are_read_the_same(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # numpy < 2 pickles its arrays and scalars from numpy.core (numpy 2 still loads those names)
    values = {"mean": np.array([0.5, 0.25], dtype=np.float32), "best": np.float64(0.93)}
    raw = pickle.dumps(values, protocol=2).replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")
    assert b"numpy._core" not in raw
    loaded_back = pickle.loads(raw)
    assert loaded_back["best"] == 0.93 and loaded_back["mean"].tolist() == [0.5, 0.25]
    path = tmp_path / "old_numpy.pkl"
    path.write_bytes(raw)
    shown = info_lines(path, capsys)
    assert shown["mean"] == "ndarray float32 [2] = [0.5, 0.25]"
    assert shown["best"] == "numpy float64 = 0.93"


async def test_the_browser_says_the_same_as_info(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = numpy_file(tmp_path / "np.pth")
    said = info_lines(path, capsys)
    app = CkptApp(str(path))
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        browser(app).tree_view.reveal((("mean",), None))
        await settle(pilot)
        mean_line = next(line for line in screen_text(app).splitlines() if "─ mean " in line)
        assert "ndarray float32 [3] = [0.485" in mean_line and "▶" not in mean_line  # a value, not a node to open
        panel = " ".join(detail(app).split())
        assert "type numpy.ndarray dtype float32 shape [3] values [0.485, 0.456, 0.406]" in panel
        assert "global numpy._core.multiarray._reconstruct" in panel
        browser(app).tree_view.reveal((("best",), None))
        await settle(pilot)
        best_line = next(line for line in screen_text(app).splitlines() if "─ best " in line)
        assert said["best"] in best_line
        panel = " ".join(detail(app).split())
        assert "type numpy.float64 dtype float64 value 0.93" in panel


async def test_search_does_not_lead_into_a_numpy_values_pickled_call(tmp_path: Path) -> None:
    path = numpy_file(tmp_path / "np.pth")
    app = CkptApp(str(path))
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await settle(pilot, "slash")
        for key in "args":  # each numpy value's call has args[0], args[1]
            await pilot.press(key)
        await settle(pilot, "enter")
        await settle(pilot)
        assert "no key path contains 'args'" in status(app)
