"""Shared test setup: the builders module is importable from every test file."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def pytest_addoption(parser):  # type: ignore[no-untyped-def]
    parser.addoption("--long", action="store_true", default=False, help="run the long fuzzing runs")


def pytest_configure(config):  # type: ignore[no-untyped-def]
    import os

    if config.getoption("--long"):
        os.environ["CKPT_TUI_LONG_FUZZ"] = "1"
