"""Files that are not checkpoints get one line naming what they are (exit 2): a symlink loop, a numpy
``.npy`` or a GGUF file named ``.pth`` (both start with a byte that is a pickle opcode), a ``/proc`` file
whose size reads 0 though it holds text."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest

from ckpt_tui.cli import main


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    return err


def test_symlink_loop_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.symlink(tmp_path / "b.pth", tmp_path / "a.pth")
    os.symlink(tmp_path / "a.pth", tmp_path / "b.pth")
    assert "a symlink loop" in _one_line(capsys, ["info", str(tmp_path / "a.pth")])
    assert "no such file" in _one_line(capsys, ["info", str(tmp_path / "none.pth")])


def test_numpy_file_named_pth(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "a.npy"
    np.save(path, np.arange(4, dtype=np.float32))
    path = path.rename(tmp_path / "a.pth")
    for command in ("info", "check"):
        assert "a numpy array file (.npy), not a torch checkpoint" in _one_line(capsys, [command, str(path)])


def test_gguf_file_named_pth(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.pth"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
    assert "a GGUF file (llama.cpp), not a torch checkpoint" in _one_line(capsys, ["info", str(path)])


@pytest.mark.parametrize(
    ("head", "named"),
    [
        (b"\x89HDF\r\n\x1a\n" + bytes(64), "an HDF5 file (Keras, h5py)"),
        (None, "a bzip2-compressed file (decompress it first)"),
        (b"lCRF" + bytes(64), "a CRFsuite model"),
    ],
)
def test_hdf5_bzip2_and_crfsuite_files_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], head: bytes | None, named: str
) -> None:
    # weights files published beside PyPI packages' torch files: each said for what it is, not "corrupt pickle"
    import bz2
    import pickle

    path = tmp_path / "weights.pth"
    path.write_bytes(head if head is not None else bz2.compress(pickle.dumps({"a": 1})))
    for command in ("info", "check"):
        assert f"{named}, not a torch checkpoint" in _one_line(capsys, [command, str(path)])


@pytest.mark.skipif(not os.path.exists("/proc/version"), reason="needs Linux /proc")
def test_proc_file_with_size_zero_is_text_not_empty(capsys: pytest.CaptureFixture[str]) -> None:
    assert os.path.getsize("/proc/version") == 0
    assert "a text file, not a checkpoint" in _one_line(capsys, ["info", "/proc/version"])
    assert main(["check", "/proc/version"]) == 2
    assert "an empty file" not in capsys.readouterr().out


def test_a_torch_export_archive_is_named_with_the_loader_that_reads_it(tmp_path, capsys):
    # torch.export.save writes a zip of raw weight records described by JSON: no data.pkl, no torch.save checkpoint
    import torch

    exported = torch.export.export(torch.nn.Linear(2, 3), (torch.ones(1, 2),))
    torch.export.save(exported, tmp_path / "model.pt2")
    assert main(["info", str(tmp_path / "model.pt2")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "a torch.export archive (.pt2)" in err and "torch.export.load reads it" in err
