"""The staged tree's weights_only judge stops when told, at the next batch of entries: a newer edit never waits
on an older tree's pickle being written and scanned."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch

from ckpt_tui.core.errors import Cancelled
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.writers.judge import judge_tree


def many_keys(tmp_path: Path, count: int = 5000) -> Any:
    path = tmp_path / "many.pth"
    torch.save(OrderedDict((f"layer{i}.weight", torch.ones(1)) for i in range(count)), path)
    return open_checkpoint(str(path)).root


def test_a_judge_told_to_stop_stops_at_the_next_batch(tmp_path: Path) -> None:
    root = many_keys(tmp_path)
    asked: list[int] = []

    def after_two_batches() -> bool:
        asked.append(1)
        return len(asked) > 2

    with pytest.raises(Cancelled):
        judge_tree(root, after_two_batches)
    assert len(asked) == 3  # asked once a batch of 1000 entries: stopped at the third


def test_a_judge_not_stopped_gives_the_same_verdict(tmp_path: Path) -> None:
    root = many_keys(tmp_path)
    asked: list[int] = []
    outlook = judge_tree(root, lambda: asked.append(1) is None and False)
    assert outlook.refusal is None and outlook.verdict is not None
    assert outlook.verdict == judge_tree(root).verdict
    assert len(asked) >= 5  # 5000 entries: at least once a batch
