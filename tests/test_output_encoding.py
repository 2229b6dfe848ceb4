"""Output to a stream that cannot encode every character (``PYTHONIOENCODING=ascii``, a latin-1 locale): the
tree's glyphs and the file's own key names come out as backslash escapes, never as a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _run(encoding: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONIOENCODING": encoding, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tui", *args],
        capture_output=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        encoding="utf-8",
        errors="replace",
        check=False,
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("enc") / "ckpt.pth"
    torch.save({"poids_é": torch.ones(2, 3), "层": torch.tensor([float("nan"), 1.0])}, path)
    return path


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
@pytest.mark.parametrize(("command", "code"), [("info", 0), ("check", 1), ("stats", 1)])
def test_every_command_writes_escapes_not_a_traceback(saved: Path, encoding: str, command: str, code: int) -> None:
    done = _run(encoding, command, str(saved))
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == code, (done.stdout, done.stderr)
    assert "\\u5c42" in done.stdout  # the key 层, escaped


def test_an_error_line_with_a_non_ascii_name_is_one_line(tmp_path: Path) -> None:
    done = _run("ascii", "info", str(tmp_path / "missing_é.pth"))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
