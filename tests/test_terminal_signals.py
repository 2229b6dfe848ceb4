"""SIGTERM or SIGHUP to the browser puts the terminal back (main screen, cursor, no mouse reporting, its mode)
before the signal ends the process, as quitting does."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
import torch


def read_until(fd: int, wanted: bytes, process: subprocess.Popen[bytes], seconds: float = 60) -> bytes:
    """What the terminal shows until ``wanted`` appears (or the process ends)."""
    seen = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and wanted not in seen:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                seen += os.read(fd, 65536)
            except OSError:
                break
        elif process.poll() is not None:
            break
    return seen


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_puts_the_terminal_back(tmp_path: Path, signum: int) -> None:
    torch.save({"w": torch.ones(3)}, tmp_path / "f.pth")
    master, slave = os.openpty()
    mode = termios.tcgetattr(slave)
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "80", "LINES": "24"}
    process = subprocess.Popen(
        [sys.executable, "-m", "ckpt_tui", str(tmp_path / "f.pth")],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        start_new_session=True,
    )
    try:
        assert b"f.pth" in read_until(master, b"f.pth", process), "the browser did not start"
        time.sleep(0.5)  # (on screen, holding the terminal)
        process.send_signal(signum)
        after = read_until(master, b"\x1b[?1049l", process)
        process.wait(timeout=60)
        assert process.returncode == -signum
        assert b"\x1b[?1049l" in after and b"\x1b[?25h" in after and b"\x1b[?1003l" in after
        assert termios.tcgetattr(slave)[3] == mode[3]  # the local modes (echo, canonical input) as they were
    finally:
        if process.poll() is None:
            process.kill()
        os.close(master)
        os.close(slave)
