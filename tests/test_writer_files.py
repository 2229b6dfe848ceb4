"""Where convert writes: permission bits kept, symlinks treated as existing paths, private temporary files."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from ckpt_tui.cli import main


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "in.pth"
    torch.save(OrderedDict((f"module.w{i}", torch.full((4,), float(i))) for i in range(3)), path)
    return path


def convert(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str]:
    code = main(["convert", *map(str, args)])
    return code, capsys.readouterr().err


def keys(path: Path) -> list[str]:
    return list(torch.load(path, weights_only=True))


@pytest.mark.parametrize("bits", [0o600, 0o640, 0o664, 0o400])
def test_force_keeps_the_permission_bits_of_the_file_it_replaces(
    tmp_path: Path, source: Path, capsys, bits: int
) -> None:
    target = tmp_path / "out.pth"
    target.write_bytes(b"old")
    target.chmod(bits)
    old_umask = os.umask(0o077 if bits & 0o060 else 0o022)  # a umask that would otherwise take bits away
    try:
        code, _ = convert(capsys, source, "-o", target, "--strip-prefix", "module.", "--force")
    finally:
        os.umask(old_umask)
    assert code == 0
    assert mode(target) == bits
    assert keys(target) == ["w0", "w1", "w2"]


def test_converting_a_private_file_over_itself_keeps_it_private(tmp_path: Path, source: Path, capsys) -> None:
    source.chmod(0o600)
    assert convert(capsys, source, "-o", source, "--strip-prefix", "module.", "--force")[0] == 0
    assert mode(source) == 0o600
    assert keys(source) == ["w0", "w1", "w2"]


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_a_new_file_gets_the_umask_default(tmp_path: Path, source: Path, umask: int) -> None:
    target = tmp_path / "new.pth"
    code = f"import os, sys; os.umask({umask}); from ckpt_tui.cli import main; sys.exit(main(sys.argv[1:]))"
    result = subprocess.run(
        [sys.executable, "-c", code, "convert", str(source), "-o", str(target)], capture_output=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert mode(target) == 0o666 & ~umask


def test_dangling_symlink_is_an_existing_path(tmp_path: Path, source: Path, capsys) -> None:
    link = tmp_path / "out.pth"
    missing = tmp_path / "elsewhere" / "gone.pth"
    link.symlink_to(missing)
    code, err = convert(capsys, source, "-o", link)
    assert code == 2 and "dangling symlink" in err and "--force" in err
    assert link.is_symlink() and not missing.exists()


def test_force_replaces_a_dangling_symlink_with_the_file_and_creates_nothing_where_it_pointed(
    tmp_path: Path, source: Path, capsys
) -> None:
    link = tmp_path / "out.pth"
    (tmp_path / "elsewhere").mkdir()
    missing = tmp_path / "elsewhere" / "gone.pth"
    link.symlink_to(missing)
    assert convert(capsys, source, "-o", link, "--force")[0] == 0
    assert not link.is_symlink() and link.is_file()
    assert not missing.exists()
    assert keys(link) == ["module.w0", "module.w1", "module.w2"]


def test_force_replaces_a_symlink_and_leaves_what_it_pointed_to_untouched(tmp_path: Path, source: Path, capsys) -> None:
    blob = tmp_path / "blobs" / "sha256-abc"
    blob.parent.mkdir()
    blob.write_bytes(b"a cached blob shared by other snapshots")
    blob.chmod(0o600)
    link = tmp_path / "model.pth"
    link.symlink_to(blob)
    code, err = convert(capsys, source, "-o", link)
    assert code == 2 and "symlink" in err
    assert convert(capsys, source, "-o", link, "--force")[0] == 0
    assert blob.read_bytes() == b"a cached blob shared by other snapshots"
    assert not link.is_symlink() and mode(link) == 0o600  # the bits of the file the link showed
    assert keys(link) == ["module.w0", "module.w1", "module.w2"]


def test_symlink_to_the_input_is_named_as_such_and_never_overwrites_it(tmp_path: Path, source: Path, capsys) -> None:
    before = source.read_bytes()
    link = tmp_path / "alias.pth"
    link.symlink_to(source)
    code, err = convert(capsys, source, "-o", link, "--strip-prefix", "module.")
    assert code == 2 and "symlink to the input" in err
    assert convert(capsys, source, "-o", link, "--strip-prefix", "module.", "--force")[0] == 0
    assert source.read_bytes() == before
    assert keys(link) == ["w0", "w1", "w2"]


def test_a_directory_or_device_is_never_replaced_even_with_force(tmp_path: Path, source: Path, capsys) -> None:
    folder = tmp_path / "folder.pth"
    folder.mkdir()
    code, err = convert(capsys, source, "-o", folder, "--force")
    assert code == 2 and "is a directory" in err and folder.is_dir()
    fifo = tmp_path / "pipe.pth"
    os.mkfifo(fifo)
    code, err = convert(capsys, source, "-o", fifo, "--force")
    assert code == 2 and "not a regular file" in err and stat.S_ISFIFO(fifo.lstat().st_mode)
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("suffix", ["pth", "safetensors"])
def test_progress_reaches_the_total_and_cancelling_leaves_nothing(tmp_path: Path, suffix: str) -> None:
    from ckpt_tui.core.errors import Cancelled
    from ckpt_tui.core.reading import open_checkpoint
    from ckpt_tui.core.writers.save import save

    state = OrderedDict((f"w{i}", torch.full((300, 1000), float(i))) for i in range(8))  # small and large records
    state["big"] = torch.zeros(1024, 1024)
    torch.save(state, tmp_path / "in.pth")
    root = open_checkpoint(tmp_path / "in.pth").root
    seen: list[tuple[int, int]] = []
    save(root, tmp_path / f"out.{suffix}", progress=lambda done, total: seen.append((done, total)))
    assert seen and all(done <= total for done, total in seen)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert seen[-1][0] == seen[-1][1] == sum(t.numel() * 4 for t in state.values())
    with pytest.raises(Cancelled):
        save(root, tmp_path / f"again.{suffix}", cancelled=lambda: len(seen) > 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.pth", f"out.{suffix}"]
