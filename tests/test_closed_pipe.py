"""A reader that leaves early (``| head -1``) never turns a verdict into "clean": the command exits as a process
SIGPIPE ends (141), or with its own code when its output was all written (was exit 0 for a file with a NaN, and for
two files that differ)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

import ckpt_tui

HERE = str(Path(ckpt_tui.__file__).resolve().parent.parent)
"""The checkout whose ckpt_tui these tests import: the child runs the same code."""


def _piped(tmp_path: Path, *argv: str) -> int:
    """The exit status of ``ckpt-tui ARGV | head -1`` (the pipe's first command)."""
    command = " ".join([sys.executable, "-m", "ckpt_tui", *argv]) + " | head -1 > /dev/null; echo ${PIPESTATUS[0]}"
    env = {**os.environ, "PYTHONPATH": HERE}
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert "Traceback" not in done.stderr, done.stderr
    return int(done.stdout.strip())


def test_a_closed_pipe_never_reads_as_clean(tmp_path: Path) -> None:
    # many rows: the output is larger than a pipe holds, so the writer meets the closed pipe
    values = {f"layer{i}.weight": torch.randn(4) for i in range(3000)}
    values["layer7.weight"][0] = float("nan")
    torch.save(values, tmp_path / "nan.pth")
    assert _piped(tmp_path, "stats", "nan.pth") in (1, 141)
    other = {key: value + 1 for key, value in values.items()}
    torch.save(other, tmp_path / "other.pth")
    assert _piped(tmp_path, "diff", "nan.pth", "other.pth") in (1, 141)
