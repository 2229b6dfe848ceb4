"""A file replaced, rewritten or cut short after it was opened is never read under the tree of the file it was:
every command that reads values says so in one line (exit 2) and writes nothing, the browser marks its tree
stale, and nothing reads through a map that a truncation would turn into a SIGBUS.

Each command runs in a child process (a crash shows as a signal), with the file changed right after the
command opened it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from builders_tui import detail, header, loaded, settle, status
from safetensors.torch import save_file

from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.screens.browser import STALE_LINE

CHANGED = "changed on disk since it was opened; open it again"

# run a command, changing the file named first as soon as the command has opened it (HOW: replaced, rewritten,
# truncated), or with a hook that cuts it short in the middle of a read (HOOK)
CHILD = textwrap.dedent(
    """
    import contextlib, os, subprocess, sys, time
    from ckpt_tui.core.readers import open as opening
    from ckpt_tui.cli import main

    target, how, hook, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    other = target + ".other"

    def change():
        if how == "replaced":
            os.replace(other, target)
        elif how == "rewritten":
            with open(target, "r+b") as file:  # the same file, new bytes
                file.write(open(other, "rb").read())
                file.truncate()
            os.utime(target, ns=(0, os.stat(target).st_mtime_ns + 10**9))  # (a rewrite within the clock's tick)
        elif how == "truncated":
            os.truncate(target, os.path.getsize(target) // 2)

    original = opening._guarded

    def guarded(text, read):
        opened = original(text, read)
        if how != "none" and os.path.abspath(text) == os.path.abspath(target) and not os.path.exists(target + ".done"):
            open(target + ".done", "w").close()
            change()
        return opened

    opening._guarded = guarded
    if os.environ.get("NO_LEASE"):  # values read with positioned reads only, as where no lease can be had
        import ckpt_tui.core.model.byte_source as places

        places.take_lease = lambda fd: False
    if hook != "none":
        import ckpt_tui.core.values.tensor_values as values
        import ckpt_tui.core.values.finite_scan as scan

        def cut():
            # by another process, as a writer would: under a read lease the truncate waits for the reader to let
            # go (cut here it would wait for this very thread); on until it is seen waiting, or has cut the file
            if not os.path.exists(target + ".cut"):
                open(target + ".cut", "w").close()
                code = "import os, sys; os.truncate(sys.argv[1], 4096)"
                node = f":{os.stat(target).st_ino} "  # (this file's lease only: other processes take theirs)
                writer = subprocess.Popen([sys.executable, "-c", code, target])
                for _ in range(2000):
                    with open("/proc/locks") as locks:
                        waiting = any("BREAKING" in line and node in line for line in locks)
                    if waiting:
                        open(target + ".waited", "w").close()
                    if waiting or writer.poll() is not None:
                        break
                    time.sleep(0.01)

        if hook == "chunk":  # contiguous reads: after the first chunk
            contiguous = values.TensorReader._contiguous

            def cut_after_first(self, *a, **k):
                for n, chunk in enumerate(contiguous(self, *a, **k)):
                    yield chunk
                    if n == 0 and chunk.size > 100_000:
                        cut()

            values.TensorReader._contiguous = cut_after_first
            shared = values.TensorReader.shared_reads

            # (reads that workers share: the file is cut after the first big one)
            @contextlib.contextmanager
            def cut_after_first_shared(self, *a, **k):
                with shared(self, *a, **k) as read:
                    if read is None:
                        yield None
                        return

                    def reading(element, count, buffer):
                        got = read(element, count, buffer)
                        if count > 100_000:
                            cut()
                        return got

                    yield reading

            values.TensorReader.shared_reads = cut_after_first_shared
        elif hook == "strided":  # a strided view's chunks
            release = values._RecordView.release_pages

            def cut_after(self):
                cut()
                release(self)

            values._RecordView.release_pages = cut_after
        elif hook == "scan":  # check's scan of a large view
            finite = scan._chunk_finite

            def cut_then(*a):
                cut()
                return finite(*a)

            scan._chunk_finite = cut_then
    sys.exit(main(args))
    """
)


def run(
    tmp_path: Path, target: Path, how: str, *args: str, hook: str = "none", leases: bool = True
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    if not leases:
        env["NO_LEASE"] = "1"
    command = [sys.executable, str(script), str(target), how, hook, *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


def state(value: float) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        "w": torch.full((64, 64), value),
        "big": torch.full((5 << 20,), value),  # 20 MB: read in chunks, and by check's large-view scan
        "t": torch.full((300, 200), value).t(),  # a strided view (in a .pth)
    }


def save(values: dict[str, torch.Tensor], path: Path) -> Path:
    if path.suffix == ".safetensors":
        save_file({k: v.contiguous() for k, v in values.items()}, path)
    else:
        torch.save(values, path)
    return path


def files(tmp_path: Path, suffix: str) -> tuple[Path, Path]:
    """A file of ones (with its replacement of NaNs beside it, ``.other``) and a second file to compare with."""
    first = save(state(1.0), tmp_path / f"a{suffix}")
    save(state(float("nan")), Path(f"{first}.other"))
    return first, save(state(2.0), tmp_path / f"b{suffix}")


COMMANDS = {
    "stats": lambda a, b, out: ["stats", a],
    "check": lambda a, b, out: ["check", a],
    "diff": lambda a, b, out: ["diff", a, b],
    "diff --stats": lambda a, b, out: ["diff", "--stats", a, b],
    "average": lambda a, b, out: ["average", a, b, "-o", out],
    "convert": lambda a, b, out: ["convert", a, "-o", out],
}


@pytest.mark.parametrize("how", ["replaced", "rewritten", "truncated"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_command_reading_values_of_a_file_changed_after_opening_refuses_in_one_line(
    tmp_path: Path, command: str, how: str
) -> None:
    suffix = ".safetensors" if how == "rewritten" else ".pth"
    first, second = files(tmp_path, suffix)
    out = tmp_path / f"out{suffix}"
    result = run(tmp_path, first, how, *COMMANDS[command](str(first), str(second), str(out)))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.strip().splitlines() == [f"ckpt-tui: {first}: the file {CHANGED}"]
    assert "nan" not in result.stdout.lower()  # never the new file's values under the old tree
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_a_file_left_alone_reads_as_before(tmp_path: Path) -> None:
    first, _ = files(tmp_path, ".pth")
    out = tmp_path / "out.pth"
    assert run(tmp_path, first, "none", "convert", str(first), "-o", str(out)).returncode == 0
    assert torch.equal(torch.load(out, weights_only=True)["t"], state(1.0)["t"])
    assert run(tmp_path, first, "none", "check", str(first)).returncode == 0


def test_reading_a_mapped_file_that_another_process_cut_short_is_a_sigbus(tmp_path: Path) -> None:
    # why nothing reads values through a map: the kernel kills the reader, no message, no cleanup
    path = tmp_path / "f.bin"
    path.write_bytes(b"\1" * (1 << 20))
    code = (
        "import mmap, subprocess, sys; f = open(sys.argv[1], 'rb');"
        "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ);"
        "subprocess.run(['truncate', '-s', '0', sys.argv[1]], check=True); print(m[(1 << 20) - 1])"
    )
    result = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, timeout=60)
    assert result.returncode == -signal.SIGBUS


def leases_here(tmp_path: Path) -> bool:
    """Whether files in ``tmp_path`` can be held under a read lease (Linux, a local file system)."""
    from ckpt_tui.core.model import byte_source

    probe = tmp_path / "lease-probe"
    probe.write_bytes(b"x")
    leased = byte_source.lease(str(probe), byte_source.version_of(str(probe)))
    if leased is None:
        return False
    leased.close()
    return True


@pytest.mark.parametrize(
    ("command", "hook", "leases"),
    [
        ("stats", "chunk", True),
        ("diff --stats", "chunk", True),  # (read through maps under a lease: the writer waits)
        ("diff --stats", "chunk", False),
        ("average", "chunk", True),
        ("average", "chunk", False),
        ("stats", "strided", True),
        ("check", "scan", True),
    ],
)
def test_a_file_cut_short_while_its_values_are_read_is_one_line_never_a_crash(
    tmp_path: Path, command: str, hook: str, leases: bool
) -> None:
    first, second = files(tmp_path, ".pth")
    if hook == "strided":
        save({"t": torch.randn(2000, 1500).t()}, first)  # two chunks of a strided view
    out = tmp_path / "out.pth"
    args = COMMANDS[command](str(first), str(second), str(out))
    result = run(tmp_path, first, "none", *args, hook=hook, leases=leases)
    assert result.returncode >= 0, f"killed by signal {-result.returncode}"
    assert (tmp_path / "a.pth.cut").exists()  # the hook ran: the file was cut in the middle of the read
    # the cut waited for the reader's lease exactly where values are read through maps
    mapped = command in ("diff --stats", "average") and leases and leases_here(tmp_path)
    assert (tmp_path / "a.pth.waited").exists() == mapped
    if hook == "strided":
        # the view's bytes were read whole before the cut: its figures are the file's as opened
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.strip().splitlines() == [f"ckpt-tui: {first}: the file {CHANGED}"]
    assert not out.exists()


async def test_the_browser_marks_a_tree_whose_file_changed_and_shows_no_values_of_the_new_one(tmp_path: Path) -> None:
    path = tmp_path / "ok.pth"
    torch.save({"a": torch.ones(3), "b": torch.full((4,), 7.0)}, path)
    torch.save({"a": torch.full((3,), float("nan")), "b": torch.full((4,), float("nan"))}, tmp_path / "other.pth")
    app = CkptApp(str(path))
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        os.replace(tmp_path / "other.pth", path)
        await settle(pilot, "j")
        await settle(pilot, "j")
        # (the side panel reads the focused tensor after a short pause: on a busy machine after settle returns)
        for _ in range(500):
            if CHANGED in detail(app):
                break
            await pilot.pause(0.01)
        assert "nan" not in detail(app).lower()
        assert CHANGED in detail(app)
        assert STALE_LINE in header(app)
        assert CHANGED in status(app)


def test_no_value_reader_maps_the_file() -> None:
    # (the one map left: a strided view spanning more than READ_WHOLE, checked before each chunk; docs/safety.md;
    # anonymous memory, mmap.mmap(-1, ...), maps no file: the writer's page-aligned buffers)
    root = Path(__file__).resolve().parent.parent / "ckpt_tui" / "core"
    file_map = re.compile(r"mmap\.mmap\((?!-1,)")
    mapping = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if file_map.search(p.read_text()))
    assert mapping == ["model/byte_source.py"], mapping
    assert shutil.which("truncate")


def test_a_rewrite_that_puts_the_old_modification_time_back_is_still_seen(tmp_path: Path) -> None:
    """os.utime sets the modification time, never the change time: the version holds both."""
    import os

    from ckpt_tui.core.model import byte_source

    path = tmp_path / "t.pth"
    torch.save({"w": torch.zeros(64)}, path)
    before = byte_source.version_of(str(path))
    info = os.stat(path)
    data = bytearray(path.read_bytes())
    # past the file system clock's tick (at most 10 ms): a rewrite within one tick is what no version sees
    time.sleep(0.05)
    path.write_bytes(bytes(data))  # the same bytes, rewritten in place
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == info.st_mtime_ns and os.stat(path).st_size == info.st_size
    assert byte_source.version_of(str(path)) != before
