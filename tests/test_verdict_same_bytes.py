"""The weights_only verdict judges the bytes the tree was read from: a zip's or legacy file's pickle is read from the
file once."""

from __future__ import annotations

import contextlib
import io
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from ckpt_tui.cli import main
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.readers import read_once, zip_archive
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
    _judged_as_read_and_check_refuses(path, capsys)


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


# ---- the legacy format (torch.save(..., _use_new_zipfile_serialization=False)) ------------------------------


def _legacy_file(tmp_path: Path) -> Path:
    path = tmp_path / "legacy.pth"
    torch.save(OrderedDict(w=torch.ones(300), b=torch.zeros(2)), path, _use_new_zipfile_serialization=False)
    return path


def _pickle_reads(monkeypatch: pytest.MonkeyPatch, path: Path) -> list[int]:
    """For each stream or mapping of ``path`` opened after this call: how far into the file it read (a
    mapping: the whole file)."""
    reads: list[int] = []
    real_stream, real_prefix = places.open_stream, places.prefix

    class Counted(io.BufferedReader):
        def read(self, size: int | None = -1) -> bytes:
            data = super().read(size)
            reads[self.slot] = max(reads[self.slot], self.tell())
            return data

        slot = 0

    def stream(name: str) -> Any:
        if places.absolute(name) != places.absolute(str(path)):
            return real_stream(name)
        counted = Counted(io.FileIO(name, "rb"))
        counted.slot = len(reads)
        reads.append(0)
        return counted

    @contextlib.contextmanager
    def prefix(name: str, length: int) -> Iterator[Any]:
        if places.absolute(name) == places.absolute(str(path)):
            reads.append(path.stat().st_size)
        with real_prefix(name, length) as data:
            yield data

    monkeypatch.setattr(places, "open_stream", stream)
    monkeypatch.setattr(places, "prefix", prefix)
    return reads


def test_check_reads_a_legacy_files_pickles_once_for_the_tree_and_the_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _legacy_file(tmp_path)
    monkeypatch.setattr(forked, "fork", lambda work: None)  # the verdict in this process, where reads are counted
    reads = _pickle_reads(monkeypatch, path)
    assert main(["check", str(path)]) == 0
    assert "weights_only: torch.load loads it" in capsys.readouterr().out
    # the format's detection reads the first block; only the reader reads the pickles (the whole small file)
    past_the_head = [read for read in reads if read > 512]
    assert past_the_head == [path.stat().st_size]


def test_the_verdict_judges_a_legacy_pickle_as_read_even_if_the_file_changes(tmp_path: Path) -> None:
    path = _legacy_file(tmp_path)
    checkpoint = open_checkpoint(path)
    raw = path.read_bytes()
    assert raw.count(GLOBAL) == 1
    path.write_bytes(raw.replace(GLOBAL, SWAPPED))
    assert "collections.OrderedDicX" in scan_file(str(path)).refused  # a fresh read sees the new bytes
    assert verdict(checkpoint).answer == "loads"
    assert verdict(checkpoint, ScanBeside.of(checkpoint)).answer == "loads"
    assert list(checkpoint.root) == ["w", "b"]
    judged = verdict(open_checkpoint(path))  # opened again: the new file's verdict
    assert judged.answer == "refuses"
    assert [b.name for b in judged.blockers] == ["collections.OrderedDicX"]


@pytest.mark.parametrize("fork", [True, False])
def test_check_judges_the_legacy_pickles_it_read_when_the_file_changes_right_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fork: bool
) -> None:
    path = _legacy_file(tmp_path)
    if not fork:
        monkeypatch.setattr(forked, "fork", lambda work: None)
    real = read_once.ReadOnce._fill
    filled: list[int] = []

    def then_swapped(self: read_once.ReadOnce, wanted: int) -> None:
        real(self, wanted)
        filled.append(len(self.kept))
        path.write_bytes(path.read_bytes().replace(GLOBAL, SWAPPED))  # the file changes as soon as it was read

    monkeypatch.setattr(read_once.ReadOnce, "_fill", then_swapped)
    _judged_as_read_and_check_refuses(path, capsys)
    assert filled[0] == len(path.read_bytes())  # (the whole file was read at once)


def test_a_legacy_file_the_reader_refuses_gets_the_verdict_on_the_pickles_it_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "legacy.pth"
    torch.save({"w": torch.ones(1000)}, path, _use_new_zipfile_serialization=False)
    raw = path.read_bytes()
    at = raw.index(b"M\xe8\x03", raw.index(b"cpu"))  # the storage's element count in its persistent id
    path.write_bytes(raw[:at] + b"M\xff\xff" + raw[at + 3 :])  # more bytes than the whole file: refused
    outputs = []
    for fork in (True, False):
        if not fork:
            monkeypatch.setattr(forked, "fork", lambda work: None)
        reads = _pickle_reads(monkeypatch, path)
        assert main(["check", str(path)]) == 2
        out, err = capsys.readouterr()
        assert "declares" in err and out.startswith("weights_only: torch.load REFUSES it")
        outputs.append(out)
        assert len([read for read in reads if read > 512]) == 1, (fork, reads)
    assert outputs[0] == outputs[1]


def test_a_legacy_pickle_past_what_the_reader_read_is_read_on(tmp_path: Path) -> None:
    """The reader stops at the first pickle it refuses; torch.load's scan reads on from there (never again
    what the reader read)."""
    path = _legacy_file(tmp_path)
    raw = path.read_bytes()
    read = read_once.PickleBytes(str(path), len(raw), raw[:40])
    assert scan_file(str(path), pickles=read).to_wire() == scan_file(str(path)).to_wire()


def test_read_once_answers_a_second_look_from_memory() -> None:
    """The unpickler's second look for unsafe globals (after a refusal) seeks back: never read again."""
    asked: list[int] = []

    class Counting(io.BytesIO):
        def read(self, size: int | None = -1) -> bytes:
            data = super().read(size)
            asked.append(len(data))
            return data

    raw = bytes(range(256)) * 1000
    once = read_once.ReadOnce(Counting(raw), len(raw))
    stream = io.BufferedReader(once, buffer_size=read_once.CHUNK)
    first = stream.read(100_000)
    stream.seek(10)
    assert stream.read(50_000) == raw[10:50_010] and first == raw[:100_000]
    assert stream.read() == raw[50_010:]
    assert sum(asked) == len(raw) and bytes(once.kept) == raw


def _judged_as_read_and_check_refuses(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``path`` changes as soon as its pickle is read: the verdict (in check's child as soon as the pickle is
    read, or here without fork) is of the bytes read, and check reads no value from the file it became."""
    beside = ScanBeside()
    with read_once.when_pickle_read(beside.start):
        checkpoint = open_checkpoint(str(path))
    assert verdict(checkpoint, beside).loads is True
    assert SWAPPED in path.read_bytes()
    path.write_bytes(path.read_bytes().replace(SWAPPED, GLOBAL))
    # refused in one line: its tree would be another file's than its values
    assert main(["check", str(path)]) == 2
    out, err = capsys.readouterr()
    assert "changed on disk since it was opened" in err and "loads it" not in out
