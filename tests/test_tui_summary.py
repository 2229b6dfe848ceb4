"""The browser's header (``tui/widgets/summary.py``): what it says of findings it has no room for."""

from __future__ import annotations

from pathlib import Path

import torch
from builders import ddp_state_dict

from ckpt_tui.core.operations.info import summarize
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.tui.widgets.summary import summary_text


def test_findings_with_no_room_are_counted_without_more_when_none_is_shown(tmp_path: Path) -> None:
    torch.save(ddp_state_dict(), tmp_path / "m.pth")
    summary = summarize(open_checkpoint(str(tmp_path / "m.pth")))
    assert len(summary.shown_findings) == 1
    # no finding above it: "1 more" than nothing reads wrong
    assert summary_text(summary, limit=0).plain.splitlines()[-1] == "  … 1 finding: f lists it"
    shown = summary_text(summary, limit=1).plain
    assert "start with 'module.'" in shown and "…" not in shown
