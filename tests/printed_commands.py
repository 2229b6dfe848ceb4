"""Run the commands ckpt-tui prints exactly as a user pastes them: through ``bash -c``, with a
``ckpt-tui`` on PATH that logs each invocation's arguments (a canary for "exactly one command ran")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SHIM = """#!/bin/sh
exec {python} -c 'import json, os, sys
with open(os.environ["CKPT_TUI_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
from ckpt_tui.cli import main
raise SystemExit(main(sys.argv[1:]))' "$@"
"""


class Shell:
    """A folder with a logging ``ckpt-tui`` on PATH, where printed commands are pasted."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.bin = folder / ".shim-bin"
        self.bin.mkdir(exist_ok=True)
        shim = self.bin / "ckpt-tui"
        shim.write_text(SHIM.format(python=sys.executable))
        shim.chmod(0o755)
        self.log = folder / ".shim-log"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(REPO),
            "CKPT_TUI_LOG": str(self.log),
        }

    def paste(self, command: str) -> subprocess.CompletedProcess[str]:
        """Run ``command`` as bash would run it pasted at a prompt, in the folder."""
        self.log.unlink(missing_ok=True)
        return subprocess.run(
            ["bash", "-c", command], cwd=self.folder, env=self.env(), capture_output=True, text=True, timeout=300
        )

    def invocations(self) -> list[list[str]]:
        """The argument lists of every ckpt-tui run since the last paste."""
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]
