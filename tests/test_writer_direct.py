"""Large streamed records of a large file are written past the page cache (O_DIRECT): the file is byte for byte
the one written through the cache, a file system refusing direct writes gets them through the cache, and a write
stopped midway leaves nothing behind.

The thresholds are lowered so that small files take the path a gigabyte takes (several staging buffers, heads and
tails that share pages with the zip headers).
"""

from __future__ import annotations

import errno
import fcntl
import os
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ckpt_tui.cli import main
from ckpt_tui.core.writers import output

SIZES = [1, 1000, 5003, 300_007, 8192]
"""Element counts: records shorter than a page, a page and a bit, many staging buffers (and past the 1 MB from
which a convert streams a record), two staging buffers exactly."""


@pytest.fixture
def direct_for_small_files(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, bool]]:
    """Direct writes for every streamed record of 16 kB or more, staged 16 kB at a time; each turn asked for
    (on or off) and whether direct writes were on after it (never, where the file system has none)."""
    monkeypatch.setattr(output, "DIRECT_FROM", 0)
    monkeypatch.setattr(output, "DIRECT_RECORD", 16 << 10)
    monkeypatch.setattr(output, "STAGE", 16 << 10)
    turned: list[tuple[bool, bool]] = []
    real = output._set_direct

    def spied(fd: int, on: bool) -> bool:
        turned.append((on, real(fd, on)))
        return turned[-1][1]

    monkeypatch.setattr(output, "_set_direct", spied)
    return turned


def inputs(tmp_path: Path) -> list[str]:
    paths = []
    for seed in range(2):
        torch.manual_seed(seed)
        state = {f"w{index}": torch.randn(size) for index, size in enumerate(SIZES)}
        torch.save(state, tmp_path / f"in{seed}.pth")
        paths.append(str(tmp_path / f"in{seed}.pth"))
    return paths


def members(path: Path) -> list[tuple[str, int, int, bytes]] | bytes:
    """Each member's name (past the archive folder), place, CRC and bytes; the random serialization id left out
    (a .safetensors file: its bytes)."""
    if path.suffix == ".safetensors":
        return path.read_bytes()
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None
        return [
            (info.filename.split("/", 1)[1], info.header_offset, info.CRC, archive.read(info))
            for info in archive.infolist()
            if not info.filename.endswith("serialization_id")
        ]


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_records_written_past_the_page_cache_are_the_bytes_written_through_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct_for_small_files: list[tuple[bool, bool]], suffix: str
) -> None:
    paths = inputs(tmp_path)
    direct, cached = tmp_path / f"direct{suffix}", tmp_path / f"cached{suffix}"
    assert main(["average", *paths, "-o", str(direct), "--weights", "1,3"]) == 0
    assert (True, True) not in direct_for_small_files or direct_for_small_files[-1] == (False, False)  # off again
    monkeypatch.setattr(output, "_HAS_DIRECT", False)
    assert main(["average", *paths, "-o", str(cached), "--weights", "1,3"]) == 0
    assert members(direct) == members(cached)
    got = torch.load(direct, weights_only=True)
    for key, value in torch.load(paths[0], weights_only=True).items():
        other = torch.load(paths[1], weights_only=True)[key]
        assert torch.equal(got[key], (0.25 * value.double() + 0.75 * other.double()).float()), key


def test_a_safetensors_file_streamed_into_a_pth_past_the_page_cache_is_the_same_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct_for_small_files: list[tuple[bool, bool]]
) -> None:
    torch.manual_seed(3)
    state = {f"w{index}": torch.randn(size) for index, size in enumerate(SIZES)}
    save_file(state, tmp_path / "in.safetensors")
    assert main(["convert", str(tmp_path / "in.safetensors"), "-o", str(tmp_path / "direct.pth")]) == 0
    assert direct_for_small_files  # (asked for: the file system may have none)
    monkeypatch.setattr(output, "_HAS_DIRECT", False)
    assert main(["convert", str(tmp_path / "in.safetensors"), "-o", str(tmp_path / "cached.pth")]) == 0
    assert members(tmp_path / "direct.pth") == members(tmp_path / "cached.pth")
    got = torch.load(tmp_path / "direct.pth", weights_only=True)
    assert all(torch.equal(got[key], value) for key, value in state.items())


def test_a_file_system_refusing_direct_writes_gets_them_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct_for_small_files: list[tuple[bool, bool]]
) -> None:
    paths = inputs(tmp_path)
    refused = []
    pwrite = os.pwrite

    def refusing(fd: int, data: memoryview, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return pwrite(fd, data, offset)

    monkeypatch.setattr(output.os, "pwrite", refusing)
    assert main(["average", *paths, "-o", str(tmp_path / "refused.pth")]) == 0
    if (True, True) in direct_for_small_files:  # (a file system with no direct writes refuses them earlier)
        assert refused
    monkeypatch.setattr(output.os, "pwrite", pwrite)
    monkeypatch.setattr(output, "_HAS_DIRECT", False)
    assert main(["average", *paths, "-o", str(tmp_path / "cached.pth")]) == 0
    assert members(tmp_path / "refused.pth") == members(tmp_path / "cached.pth")


def test_a_direct_write_that_fails_midway_is_one_line_and_leaves_no_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    direct_for_small_files: list[tuple[bool, bool]],
) -> None:
    paths = inputs(tmp_path)
    pwrite = os.pwrite
    writes = []

    def failing(fd: int, data: memoryview, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            writes.append(offset)
            if len(writes) == 3:  # a write of the writer thread, while the next buffer fills
                raise OSError(errno.ENOSPC, "No space left on device")
        return pwrite(fd, data, offset)

    monkeypatch.setattr(output.os, "pwrite", failing)
    before = sorted(os.listdir(tmp_path))
    assert main(["average", *paths, "-o", str(tmp_path / "out.pth")]) == 2
    if (True, True) in direct_for_small_files:
        assert len(writes) >= 3 and capsys.readouterr().err.count("No space left on device") == 1
    assert sorted(os.listdir(tmp_path)) == before  # no output, no temporary file
    # the next write of the same process writes past the cache again, from the start
    monkeypatch.setattr(output.os, "pwrite", pwrite)
    assert main(["average", *paths, "-o", str(tmp_path / "out.pth")]) == 0
    assert len(torch.load(tmp_path / "out.pth", weights_only=True)) == len(SIZES)
