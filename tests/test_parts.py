"""Bytes by part (model, optimizer, EMA, other): what the layers view's bytes plot and "drop optimizer" use."""

from __future__ import annotations

from pathlib import Path

import torch
from builders import tiny_state_dict, training_checkpoint

from ckpt_tui.core.conventions.parts import split_parts
from ckpt_tui.core.readers.open import open_checkpoint


def nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def test_training_checkpoint_splits_into_model_optimizer_ema_and_other(tmp_path: Path) -> None:
    checkpoint = training_checkpoint()
    checkpoint["model_ema"] = {k: v.clone() for k, v in checkpoint["model"].items()}
    checkpoint["extra"] = torch.zeros(5)
    torch.save(checkpoint, tmp_path / "t.pth")
    parts = split_parts(open_checkpoint(str(tmp_path / "t.pth")).root)
    by_name = {part.name: part for part in parts.parts}
    assert by_name["model"].paths == [("model",)] and by_name["model"].nbytes == nbytes(checkpoint["model"])
    assert by_name["EMA"].paths == [("model_ema",)] and by_name["EMA"].nbytes == nbytes(checkpoint["model_ema"])
    assert by_name["optimizer"].paths == [("optimizer",)] and by_name["optimizer"].nbytes > 0
    assert ("extra",) in by_name["other"].paths and by_name["other"].nbytes == 20
    assert parts.without("optimizer") == parts.total - by_name["optimizer"].nbytes


def test_a_flat_state_dict_is_all_model_and_shared_storage_counts_once(tmp_path: Path) -> None:
    state = tiny_state_dict()
    state["tied"] = state["head.weight"]
    torch.save(state, tmp_path / "s.pth")
    parts = split_parts(open_checkpoint(str(tmp_path / "s.pth")).root)
    assert parts.get("model").nbytes == parts.total == nbytes(tiny_state_dict())
    assert parts.get("optimizer").nbytes == 0
