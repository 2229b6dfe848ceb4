"""Values read through maps only under a read lease: a writer waits for the reader to let go, the reader sees it
waiting and stops (one line), a window never reaches past the file's end, and the figures read through maps are
those of positioned reads, bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ckpt_tui.cli import main
from ckpt_tui.core.errors import FileChanged, ReadError
from ckpt_tui.core.model import byte_source


def leased(path: Path) -> byte_source.LeasedFile:
    """The file under a lease; the test is skipped where this file system has none."""
    found = byte_source.lease(str(path), byte_source.version_of(str(path)))
    if found is None:
        pytest.skip("no read lease on this file system")
    return found


def truncating(path: Path) -> subprocess.Popen[bytes]:
    """Another process cutting ``path`` to nothing (it waits while a lease is held)."""
    return subprocess.Popen([sys.executable, "-c", "import os, sys; os.truncate(sys.argv[1], 0)", str(path)])


def test_a_writer_waits_for_the_reader_who_sees_it_and_lets_go(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"\1" * (1 << 20))
    reader = leased(path)
    try:
        assert bytes(reader.window(4096, 8)) == b"\1" * 8
        writer = truncating(path)
        for _ in range(2000):
            if not reader.held():
                break
            time.sleep(0.01)
        assert not reader.held()
        # the writer waits, so what was mapped is still the file's: touching it is safe
        assert writer.poll() is None
        assert path.stat().st_size == 1 << 20
        with pytest.raises(FileChanged):
            reader.window(0, 8)
    finally:
        reader.close()
    assert writer.wait(timeout=60) == 0
    assert path.stat().st_size == 0


def test_a_window_past_the_end_of_the_file_is_refused_never_mapped(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"\1" * 10_000)
    reader = leased(path)
    try:
        assert len(reader.window(9_000, 1_000)) == 1_000
        assert len(reader.window(10_000, 0)) == 0
        for start, length in [(9_000, 1_001), (20_000, 1), (-1, 4)]:
            with pytest.raises(ReadError, match="ends early"):
                reader.window(start, length)
    finally:
        reader.close()


def test_a_file_changed_before_the_lease_is_taken_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"\1" * 100)
    version = byte_source.version_of(str(path))
    path.write_bytes(b"\2" * 50)
    try:
        found = byte_source.lease(str(path), version)
    except FileChanged:
        return
    assert found is None  # (no lease on this file system: read with positioned reads, which check it)


def test_a_mapped_file_under_a_lease_sees_a_writer_waiting(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"\1" * (1 << 20))
    leased(path).close()
    mapped = byte_source.MappedFile(str(path), byte_source.version_of(str(path)))
    try:
        mapped.confirm()
        writer = truncating(path)
        for _ in range(2000):
            try:
                mapped.confirm()
            except FileChanged:
                break
            time.sleep(0.01)
        else:
            pytest.fail("the waiting writer was never seen")
        assert writer.poll() is None and path.stat().st_size == 1 << 20
    finally:
        mapped.close()
    assert writer.wait(timeout=60) == 0


def stats_json(capsys: pytest.CaptureFixture[str], a: Path, b: Path) -> dict[str, object]:
    code = main(["diff", "--stats", "--json", str(a), str(b)])
    assert code in (0, 1)
    found: dict[str, object] = json.loads(capsys.readouterr().out)
    return found


def test_figures_read_through_maps_are_those_of_positioned_reads_bit_for_bit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    base = torch.randn(3_500_000)
    a, b = tmp_path / "a.pth", tmp_path / "b.pth"
    # views at an offset in a larger storage, half precision beside single (several chunks each)
    torch.save({"w": base[1_000:], "h": base.half(), "bf": base.bfloat16()[7:]}, a)
    moved = base + 0.01 * torch.randn(3_500_000)
    torch.save({"w": moved[1_000:], "h": moved.half(), "bf": moved.bfloat16()[7:]}, b)
    leased(a).close()
    windows = []
    window = byte_source.LeasedFile.window

    def counted(self: byte_source.LeasedFile, start: int, length: int) -> memoryview:
        windows.append(length)
        return window(self, start, length)

    monkeypatch.setattr(byte_source.LeasedFile, "window", counted)
    through_maps = stats_json(capsys, a, b)
    assert len(windows) >= 12  # every chunk of the three pairs, on both sides
    monkeypatch.setattr(byte_source, "take_lease", lambda fd: False)
    read = stats_json(capsys, a, b)
    assert through_maps == read
