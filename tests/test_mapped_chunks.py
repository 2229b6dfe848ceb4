"""Big tensors' chunks are read into reused buffers (no map: a file cut short is never a SIGBUS), and a written
chunk's CRC is taken while it is written: the figures and the bytes written stay what they were, and a file
cut short is one line."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch
from builders import version_guard_aside
from safetensors.torch import load_file, save_file

from ckpt_tui.cli import main
from ckpt_tui.core.errors import FileChanged, ReadError
from ckpt_tui.core.operations.layer_change import layer_change
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.values.pair_sums import NARROW_BOUND
from ckpt_tui.core.values.stats import tensor_stats
from ckpt_tui.core.values.tensor_values import CHUNK_ELEMENTS


def big_pair(tmp_path: Path) -> tuple[Path, Path]:
    """Two .safetensors files whose tensor ``big`` spans several read chunks."""
    paths = []
    for seed in range(2):
        torch.manual_seed(seed)
        path = tmp_path / f"m{seed}.safetensors"
        save_file({"big": torch.randn(5 * CHUNK_ELEMENTS // 2 + 7), "small": torch.randn(3)}, path)
        paths.append(path)
    return paths[0], paths[1]


def test_a_big_tensor_cut_short_after_opening_is_unreadable_in_one_line(tmp_path: Path) -> None:
    first, second = big_pair(tmp_path)
    opened = open_checkpoint(str(first)), open_checkpoint(str(second))
    whole = second.read_bytes()
    second.write_bytes(whole[: len(whole) - 4096])  # the last chunk's map would reach past the file's end
    with pytest.raises(FileChanged):
        layer_change(*opened)
    with pytest.raises(FileChanged):
        tensor_stats(opened[1].root["big"])
    version_guard_aside(opened[1].root)  # read anyway: the last chunk is a short read, in one line
    rows = {row.key: row for row in layer_change(*opened).layers}
    assert rows["big"].note is not None and "ends early" in rows["big"].note
    with pytest.raises(ReadError, match="ends early"):
        tensor_stats(opened[1].root["big"])


def test_figures_of_mapped_chunks_equal_torch_in_float64(tmp_path: Path) -> None:
    first, second = big_pair(tmp_path)
    a, b = (open_checkpoint(str(p)) for p in (first, second))
    row = next(r for r in layer_change(a, b).layers if r.key == "big")
    x, y = load_file(first)["big"].double(), load_file(second)["big"].double()
    # float32 layers are summed in float32 segments: within the documented bound of the exact figures
    bound = 3 * NARROW_BOUND
    assert row.norm_a == pytest.approx(float(x.norm()), rel=bound)
    assert row.norm_b == pytest.approx(float(y.norm()), rel=bound)
    assert row.relative_change == pytest.approx(float((x - y).norm() / x.norm()), rel=bound)
    assert row.cosine == pytest.approx(float(x @ y / (x.norm() * y.norm())), abs=bound)


def test_an_averaged_big_tensor_is_written_with_crcs_that_check(tmp_path: Path) -> None:
    states = []
    for seed in range(2):
        torch.manual_seed(seed)
        states.append({"big": torch.randn(5 * CHUNK_ELEMENTS // 2 + 7), "small": torch.randn(3)})
    paths = []
    for index, state in enumerate(states):
        torch.save(state, tmp_path / f"s{index}.pth")
        paths.append(str(tmp_path / f"s{index}.pth"))
    out = tmp_path / "soup.pth"
    assert main(["average", *paths, "-o", str(out)]) == 0
    with zipfile.ZipFile(out) as archive:
        assert archive.testzip() is None  # every record's bytes match the CRC in its header
    loaded = torch.load(out, weights_only=True)
    want = ((states[0]["big"].double() * 0.5) + states[1]["big"].double() * 0.5).float()
    assert torch.equal(loaded["big"], want)
