"""Shared test setup: the builders module is importable from every test file."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def pytest_addoption(parser):  # type: ignore[no-untyped-def]
    parser.addoption("--long", action="store_true", default=False, help="run the long fuzzing runs")


def pytest_configure(config):  # type: ignore[no-untyped-def]
    import os

    if config.getoption("--long"):
        os.environ["CKPT_TUI_LONG_FUZZ"] = "1"


@pytest.fixture(autouse=True)
def _no_remote_store_left_open() -> Iterator[None]:
    """Each test starts as a new process would: no remote store opened by an earlier test (a CLI run in this
    process would otherwise count that test's fetches as its own, and print them)."""
    yield
    from ckpt_tui.core.model import byte_source

    byte_source._opened_stores.clear()
