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
    from ckpt_tui.core.readers.open import open_checkpoint
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


def _refused_and_link_kept(capsys, source: Path, link: Path, words: str) -> None:
    pointee = os.readlink(link)
    code, err = convert(capsys, source, "-o", link, "--force")
    assert code == 2 and words in err and err.count("\n") == 1
    assert link.is_symlink() and os.readlink(link) == pointee
    assert not list(link.parent.glob(".*.tmp"))


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_a_symlink_chain_to_a_fifo_is_refused_even_with_force(tmp_path: Path, source: Path, capsys, hops: int) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = fifo
    for hop in range(hops):
        (tmp_path / f"link{hop}").symlink_to(link.name)
        link = tmp_path / f"link{hop}"
    _refused_and_link_kept(capsys, source, link, "not a regular file")
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_a_symlink_to_a_socket_or_a_directory_is_refused_even_with_force(tmp_path: Path, source: Path, capsys) -> None:
    import socket

    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "sock"))
        (tmp_path / "to_sock.pth").symlink_to(tmp_path / "sock")
        _refused_and_link_kept(capsys, source, tmp_path / "to_sock.pth", "not a regular file")
    (tmp_path / "folder").mkdir()
    (tmp_path / "to_folder.pth").symlink_to(tmp_path / "folder")
    _refused_and_link_kept(capsys, source, tmp_path / "to_folder.pth", "a directory")
    assert list((tmp_path / "folder").iterdir()) == []


def test_a_symlink_to_a_device_through_a_link_is_refused(tmp_path: Path, source: Path, capsys) -> None:
    (tmp_path / "null").symlink_to("/dev/null")  # only ever a target of a refused write
    (tmp_path / "out.pth").symlink_to("null")
    _refused_and_link_kept(capsys, source, tmp_path / "out.pth", "not a regular file")
    assert Path("/dev/null").is_char_device()


def test_a_symlink_into_proc_is_refused_even_when_it_resolves_to_a_regular_file(
    tmp_path: Path, source: Path, capsys
) -> None:
    """``/dev/stdout`` -> ``/proc/self/fd/1``: with stdout redirected to a file it resolves to a regular file."""
    regular = tmp_path / "regular.txt"
    regular.write_text("kept")
    with regular.open() as handle:
        (tmp_path / "stdout_like").symlink_to(f"/proc/self/fd/{handle.fileno()}")
        _refused_and_link_kept(capsys, source, tmp_path / "stdout_like", "system path")
    assert regular.read_text() == "kept"


def test_a_new_file_under_a_link_to_a_system_folder_is_refused(tmp_path: Path, source: Path, capsys) -> None:
    (tmp_path / "dev").symlink_to("/dev")
    code, err = convert(capsys, source, "-o", tmp_path / "dev" / "ckpt_tui_never_written.pth", "--force")
    assert code == 2 and "system path" in err
    assert not Path("/dev/ckpt_tui_never_written.pth").exists()


def _bad_outputs(tmp_path: Path, source: Path) -> dict[str, Path]:
    """Output paths that cannot be written as asked: each is refused in one line."""
    (tmp_path / "a_file").write_bytes(b"x")
    (tmp_path / "folder").mkdir()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_bytes(b"x")
    links = {"dangling": tmp_path / "nowhere", "to_file": source, "to_folder": tmp_path / "folder"}
    for name, pointee in links.items():
        (tmp_path / name).symlink_to(pointee)
    return {
        "dangling link": tmp_path / "dangling",
        "link to a file": tmp_path / "to_file",
        "link to a folder": tmp_path / "to_folder",
        "under a file": tmp_path / "a_file" / "out",
        "under a dangling link": tmp_path / "dangling" / "out",
        "under a missing folder": tmp_path / "missing" / "out",
        "a file": tmp_path / "a_file",
        "a folder with files": tmp_path / "full",
    }


@pytest.mark.parametrize("shards", [False, True], ids=["one file", "shards"])
def test_every_bad_output_path_is_one_line_and_exit_2(tmp_path: Path, source: Path, capsys, shards: bool) -> None:
    for name, output in _bad_outputs(tmp_path, source).items():
        before = sorted(p.name for p in tmp_path.rglob("*"))
        extra = ["--max-shard-size", "100B"] if shards else []
        code = main(["convert", str(source), "-o", str(output), *extra])
        captured = capsys.readouterr()
        assert code == 2, name
        assert len(captured.err.strip().splitlines()) == 1 and "Traceback" not in captured.err, (name, captured.err)
        assert sorted(p.name for p in tmp_path.rglob("*")) == before, name
