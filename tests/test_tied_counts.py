"""Tied weights (one storage view saved under two names) count once, as ``model.parameters()`` counts them.

A GPT-2-style model whose ``lm_head.weight`` is its ``wte.weight`` showed 163M params for GPT-2 small's 124M.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ckpt_tui.cli import main
from ckpt_tui.core.model.describe import totals
from ckpt_tui.core.operations.info import summarize
from ckpt_tui.core.readers.open import open_checkpoint


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = torch.nn.Embedding(100, 8)
        self.h = torch.nn.Linear(8, 8)
        self.lm_head = torch.nn.Linear(8, 100, bias=False)
        self.lm_head.weight = self.wte.weight


@pytest.mark.parametrize("wrapped", [False, True])
def test_tied_weights_count_once_on_every_surface(
    tmp_path: Path, wrapped: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    model = Tied()
    expected = sum(p.numel() for p in model.parameters())
    state = model.state_dict()
    saved = {"model_state_dict": {"module." + k: v for k, v in state.items()}, "epoch": 1} if wrapped else state
    path = tmp_path / "tied.pth"
    torch.save(saved, path)
    checkpoint = open_checkpoint(path)
    summary = summarize(checkpoint)
    assert summary.model.parameters == expected
    assert summary.counts_text() == f"{expected} params (model)"
    assert totals(checkpoint.root).parameters == expected
    assert main(["info", "--json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["model_parameter_count"] == expected
