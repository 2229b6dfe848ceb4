"""Every ``--json`` document is strict JSON: a key holding lone surrogates (as a pickle may hold) is written
in a message's prose as its escape (``\\udcff``, as the key's ``{"repr": ...}`` path shows it), never as a
lone ``\\udcff`` JSON escape, which strict parsers (node's ``JSON.parse`` of UTF-16 pairs, Rust's serde)
refuse. The file is one torch.save writes, and torch.load reads the same key back."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from ckpt_tui.cli import main
from ckpt_tui.core.model.keypath import is_unicode

KEY = "w\udcff\ud83d"


def texts(data: Any) -> list[str]:
    """Every string of a parsed JSON document, dict keys included."""
    if isinstance(data, str):
        return [data]
    if isinstance(data, dict):
        return [*data, *(t for value in data.values() for t in texts(value))]
    if isinstance(data, list):
        return [t for value in data for t in texts(value)]
    return []


@pytest.mark.parametrize("command", ["check", "stats", "info"])
def test_messages_with_lone_surrogates_are_strict_json(tmp_path: Path, command: str) -> None:
    path = tmp_path / "odd.pth"
    torch.save({KEY: torch.tensor([1.0, float("nan")]), "ok": torch.ones(2)}, path)
    assert list(torch.load(path, weights_only=True)) == [KEY, "ok"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main([command, "--json", str(path)])
    document = json.loads(out.getvalue())
    assert all(map(is_unicode, texts(document)))
    if command == "check":
        (problem,) = document["problems"]
        assert problem["path"] == [{"repr": repr(KEY)}]
        assert "w\\udcff\\ud83d" in problem["message"] and "first NaN at [1]" in problem["message"]
