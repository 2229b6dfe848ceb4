"""Crash-safe saves: SIGKILL, SIGTERM, SIGHUP and SIGINT mid-write, a size limit, a full disk, a read-only folder."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import random
import resource
import signal
import stat
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from ckpt_tui.cli import main


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def big_ddp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 300 MB, so a write takes long enough to be interrupted."""
    path = tmp_path_factory.mktemp("big") / "big.pth"
    torch.manual_seed(0)
    torch.save(OrderedDict((f"module.w{i}", torch.randn(1024, 1024)) for i in range(75)), path)
    return path


def convert_command(source: Path, target: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ckpt_tui",
        "convert",
        str(source),
        "-o",
        str(target),
        "--strip-prefix",
        "module.",
        "--force",
        *extra,
    ]


def test_sigkill_leaves_old_file_or_complete_new_one(big_ddp: Path, tmp_path: Path) -> None:
    source_digest = digest(big_ddp)
    target = tmp_path / "out.pth"
    previous = b"the previous complete file"
    rng = random.Random(0)
    killed_mid_write = 0
    for _ in range(8):
        target.write_bytes(previous)
        process = subprocess.Popen(
            convert_command(big_ddp, target), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".out.pth.*.tmp")) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)  # wait until the write is under way
        time.sleep(rng.uniform(0.0, 0.25))
        writing = bool(list(tmp_path.glob(".out.pth.*.tmp"))) and process.poll() is None
        process.send_signal(signal.SIGKILL)
        process.wait()
        if target.read_bytes()[: len(previous) + 1] == previous:
            killed_mid_write += writing
        else:
            loaded = torch.load(target, weights_only=True, mmap=True)  # only ever the complete new file
            assert list(loaded)[:2] == ["w0", "w1"] and len(loaded) == 75
        for leftover in tmp_path.glob(".out.pth.*.tmp"):
            leftover.unlink()  # a killed write leaves its hidden temporary file; never the target
    assert digest(big_ddp) == source_digest
    assert killed_mid_write >= 3


def no_bigger_than(limit: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_size_limit_gives_one_line_and_leaves_nothing(big_ddp: Path, tmp_path: Path) -> None:
    target = tmp_path / "out.pth"
    result = subprocess.run(
        convert_command(big_ddp, target),
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=no_bigger_than(50 << 20),
    )
    assert result.returncode == 2
    assert result.stderr.startswith("ckpt-tui: cannot write") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_device_target_is_never_replaced(tmp_path: Path, capsys) -> None:
    torch.save(OrderedDict(w=torch.zeros(10)), tmp_path / "small.pth")
    code = main(["convert", str(tmp_path / "small.pth"), "-o", "/dev/null", "--force"])
    assert code == 2 and "not a regular file" in capsys.readouterr().err
    assert Path("/dev/null").is_char_device()


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 1 MB tmpfs (needs the right to mount; skipped elsewhere)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)], capture_output=True)
    if result.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=False)


def test_full_disk_gives_one_line_and_leaves_nothing(tiny_disk: Path, tmp_path: Path, capsys) -> None:
    torch.save(OrderedDict(w=torch.zeros(1024, 1024)), tmp_path / "four_mb.pth")
    code = main(["convert", str(tmp_path / "four_mb.pth"), "-o", str(tiny_disk / "out.pth")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("ckpt-tui: cannot write") and "No space left" in err
    assert err.count("\n") == 1
    assert list(tiny_disk.iterdir()) == []


def test_output_in_a_read_only_folder_is_refused_in_one_line(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.save(OrderedDict(w=torch.zeros(10)), tmp_path / "small.pth")
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o500)
    if os.geteuid() == 0:  # root writes in a 0500 folder: the file system says no instead (as a read-only mount)
        real_open = os.open

        def read_only(path: str, *args: object, **kwargs: object) -> int:
            if str(path).startswith(str(folder)):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
            return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "open", read_only)
    code = main(["convert", str(tmp_path / "small.pth"), "-o", str(folder / "out.pth")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"ckpt-tui: cannot write in {folder}") and err.count("\n") == 1


def wait_for_temporary(folder: Path, process: subprocess.Popen[bytes], pattern: str = ".out.pth.*.tmp") -> Path | None:
    """The write's temporary file once it exists (None if the process ended first)."""
    deadline = time.monotonic() + 60
    while process.poll() is None and time.monotonic() < deadline:
        found = list(folder.glob(pattern))
        if found:
            return found[0]
        time.sleep(0.002)
    return None


WELL_UNDER_WAY = 1 << 20
"""Bytes of the temporary file after which a write is in its data (the test file writes about 150 MB)."""


def wait_mid_write(folder: Path, process: subprocess.Popen[bytes]) -> Path:
    """The write's temporary file once the write is in its data, with most of it still to go (a fixed sleep
    let a fast machine finish the write, and the process exited 0 before the signal came)."""
    temporary = wait_for_temporary(folder, process)
    assert temporary is not None, "the write ended before it could be interrupted"
    # past the start: a cast there holds the GIL, and would keep a worker thread's save going to the end
    with contextlib.suppress(FileNotFoundError):
        while process.poll() is None and temporary.stat().st_size < WELL_UNDER_WAY:
            time.sleep(0.001)
    assert process.poll() is None and temporary.exists(), "the write ended before it could be interrupted"
    return temporary


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_remove_the_temporary_file(big_ddp: Path, tmp_path: Path, signum: int) -> None:
    target = tmp_path / "out.pth"
    target.write_bytes(b"the previous file")
    target.chmod(0o600)
    process = subprocess.Popen(
        convert_command(big_ddp, target, "--dtype", "float16"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    temporary = wait_mid_write(tmp_path, process)
    assert stat.S_IMODE(temporary.stat().st_mode) == 0o600  # private from the start, like the file it replaces
    process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    assert process.returncode == -signum  # the process ends as the signal says, as the shell expects
    assert b"Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.pth"]
    assert target.read_bytes() == b"the previous file"


def test_sigint_removes_the_temporary_file_and_exits_130(big_ddp: Path, tmp_path: Path) -> None:
    target = tmp_path / "out.pth"
    process = subprocess.Popen(
        convert_command(big_ddp, target, "--dtype", "float16"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    wait_mid_write(tmp_path, process)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130 and err.decode().strip() == "ckpt-tui: interrupted"
    assert list(tmp_path.iterdir()) == []


THREAD_SAVE = """
import sys, threading
from ckpt_tui.core.operations.convert import ConvertOptions, convert
from ckpt_tui.core.writers.temp_files import remove_on_signals
remove_on_signals()  # what the entry point does; the save itself runs in a worker thread, as the browser's does
worker = threading.Thread(target=convert, args=(sys.argv[1], ConvertOptions(dtype="float16"), sys.argv[2]))
worker.start()
worker.join()
"""


def test_sigterm_removes_the_temporary_file_of_a_save_in_a_worker_thread(big_ddp: Path, tmp_path: Path) -> None:
    target = tmp_path / "out.pth"
    process = subprocess.Popen(
        [sys.executable, "-c", THREAD_SAVE, str(big_ddp), str(target)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    wait_mid_write(tmp_path, process)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGTERM
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_remove_a_set_of_shards_being_written(big_ddp: Path, tmp_path: Path, signum: int) -> None:
    target = tmp_path / "out"
    command = convert_command(big_ddp, target, "--format", "safetensors", "--max-shard-size", "40MB")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    folder = wait_for_temporary(tmp_path, process, ".out.*.tmp")
    assert folder is not None, "the write ended before it could be interrupted"
    # a few shards finished in the temporary folder, most still to go
    deadline = time.monotonic() + 60
    while process.poll() is None and len(list(folder.glob("*.safetensors"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert process.poll() is None, "the write ended before it could be interrupted"
    process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    assert process.returncode == -signum and b"Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_appears_at_the_output_meanwhile_is_left_as_it_is(big_ddp: Path, tmp_path: Path) -> None:
    target = tmp_path / "out.pth"
    process = subprocess.Popen(
        convert_command(big_ddp, target, "--dtype", "float16"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    wait_mid_write(tmp_path, process)
    target.write_bytes(b"written by someone else meanwhile")  # (a second convert, a cp)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 2
    assert err.decode().strip().splitlines() == [
        f"ckpt-tui: {target} appeared while it was written (another write to it?): left as it is; run again with "
        "--force to replace it"
    ]
    assert target.read_bytes() == b"written by someone else meanwhile"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.pth"]
