"""The weights_only verdict judges the bytes the tree was read from: a zip's pickle is read from the file once."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch

from ckpt_tui.cli import main
from ckpt_tui.core.readers import zip_archive
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.runtime import forked
from ckpt_tui.core.weights_only.verdict import ScanBeside, scan_file, verdict

GLOBAL = b"collections\nOrderedDict\n"
SWAPPED = b"collections\nOrderedDicX\n"
"""The same length, a global torch refuses: the pickle judged after the swap would be refused."""


def _count_pickle_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    real = zip_archive.read_member

    def counting(file: Any, entry: zip_archive.ZipEntry, *args: Any, **kwargs: Any) -> bytes:
        if entry.name.endswith("data.pkl"):
            reads.append(entry.name)
        return real(file, entry, *args, **kwargs)

    monkeypatch.setattr(zip_archive, "read_member", counting)
    return reads


def _state_dict_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.pth"
    torch.save(OrderedDict(w=torch.ones(3), b=torch.zeros(2)), path)
    return path


def test_check_reads_the_pickle_once_for_the_tree_and_the_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _state_dict_file(tmp_path)
    monkeypatch.setattr(forked, "fork", lambda work: None)  # the verdict in this process, where reads are counted
    reads = _count_pickle_reads(monkeypatch)
    assert main(["check", str(path)]) == 0
    assert "weights_only: torch.load loads it" in capsys.readouterr().out
    assert reads == ["model/data.pkl"]


def test_the_verdict_judges_the_pickle_as_read_even_if_the_file_changes(tmp_path: Path) -> None:
    path = _state_dict_file(tmp_path)
    checkpoint = open_checkpoint(path)
    raw = path.read_bytes()
    assert raw.count(GLOBAL) == 1
    path.write_bytes(raw.replace(GLOBAL, SWAPPED))  # the file changes after the tree was read
    assert "collections.OrderedDicX" in scan_file(str(path)).refused  # a fresh read sees the new bytes
    # the tree shown and the verdict come from the same bytes: in this process and in the forked child
    assert verdict(checkpoint).answer == "loads"
    assert verdict(checkpoint, ScanBeside.of(checkpoint)).answer == "loads"
    assert list(checkpoint.root) == ["w", "b"]


def test_the_verdict_of_a_changed_file_opened_again_is_the_new_files(tmp_path: Path) -> None:
    path = _state_dict_file(tmp_path)
    path.write_bytes(path.read_bytes().replace(GLOBAL, SWAPPED))
    judged = verdict(open_checkpoint(path))
    assert judged.answer == "refuses"
    assert [b.name for b in judged.blockers] == ["collections.OrderedDicX"]


@pytest.mark.parametrize("fork", [True, False])
def test_check_judges_what_it_read_when_the_file_changes_right_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fork: bool
) -> None:
    path = _state_dict_file(tmp_path)
    if not fork:
        monkeypatch.setattr(forked, "fork", lambda work: None)
    real = zip_archive.read_member

    def then_swapped(file: Any, entry: zip_archive.ZipEntry, *args: Any, **kwargs: Any) -> bytes:
        data = real(file, entry, *args, **kwargs)
        if entry.name.endswith("data.pkl"):  # the file changes as soon as its pickle was read
            path.write_bytes(path.read_bytes().replace(GLOBAL, SWAPPED))
        return data

    monkeypatch.setattr(zip_archive, "read_member", then_swapped)
    assert main(["check", str(path)]) == 0
    assert "weights_only: torch.load loads it" in capsys.readouterr().out
    assert SWAPPED in path.read_bytes()


def test_a_file_the_reader_refuses_after_its_pickle_gets_the_verdict_on_that_pickle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "model.pth"
    torch.save({"w": torch.ones(1000)}, path)
    raw = path.read_bytes()
    at = raw.index(b"M\xe8\x03", raw.index(b"cpu"))  # the storage's element count in its persistent id
    path.write_bytes(raw[:at] + b"M\xff\xff" + raw[at + 3 :])  # more bytes than the whole file: refused
    outputs = []
    for fork in (True, False):
        if not fork:
            monkeypatch.setattr(forked, "fork", lambda work: None)
        assert main(["check", str(path)]) == 2
        out, err = capsys.readouterr()
        assert "declares" in err and out.startswith("weights_only: torch.load REFUSES it")
        outputs.append(out)
    assert outputs[0] == outputs[1]
