"""The browser's header (``tui/widgets/summary.py``): what it says of findings it has no room for, where its
totals break, and which facts are the file's once the tree is edited."""

from __future__ import annotations

import io
from pathlib import Path

import torch
from builders import TinyNet, ddp_state_dict
from builders_tui import save_fixed_training
from rich.console import Console
from rich.text import Text

from ckpt_tui.core.operations.info import summarize
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.tui.widgets.summary import Judged, fitted_summary, summary_text


def test_findings_with_no_room_are_counted_without_more_when_none_is_shown(tmp_path: Path) -> None:
    torch.save(ddp_state_dict(), tmp_path / "m.pth")
    summary = summarize(open_checkpoint(str(tmp_path / "m.pth")))
    assert len(summary.shown_findings) == 1
    # no finding above it: "1 more" than nothing reads wrong
    assert summary_text(summary, limit=0).plain.splitlines()[-1] == "  … 1 finding: f lists it"
    shown = summary_text(summary, limit=1).plain
    assert "start with 'module.'" in shown and "…" not in shown


def test_the_unread_values_line_gives_way_to_a_warning(tmp_path: Path) -> None:
    torch.save(ddp_state_dict(), tmp_path / "m.pth")
    warned = summarize(open_checkpoint(str(tmp_path / "m.pth")))
    torch.save({"model": TinyNet().state_dict()}, tmp_path / "n.pth")
    noted = summarize(open_checkpoint(str(tmp_path / "n.pth")))
    assert [f.severity for f in warned.shown_findings] == ["warning"]
    assert [f.severity for f in noted.shown_findings] == ["info"]

    def lines(text: Text) -> int:
        return len(text.plain.splitlines())

    unread = "values not read yet: C reads every tensor"
    for summary in (warned, noted):
        assert unread in fitted_summary(summary, 4, lines).plain  # room for both
    # one line short: a warning stays and the values line goes
    assert unread not in fitted_summary(warned, 3, lines).plain
    assert "start with 'module.'" in fitted_summary(warned, 3, lines).plain


def test_the_totals_break_between_phrases_never_inside_a_count(tmp_path: Path) -> None:
    summary = summarize(open_checkpoint(str(save_fixed_training(tmp_path / "best_model.pth"))))
    lines = summary_text(summary, width=78).plain.splitlines()
    assert all(len(line) <= 78 for line in lines[:3])
    assert lines[0].endswith(" · 27 tensors")
    assert lines[1] == "330 params (model) + 17 in buffers + 666 optimizer state"
    assert lines[2].startswith("4.1 kB in tensors · dtypes ")


def test_an_edited_tree_says_the_size_is_the_files_and_the_counts_are_staged(tmp_path: Path) -> None:
    summary = summarize(open_checkpoint(str(save_fixed_training(tmp_path / "best_model.pth"))))
    first = summary_text(summary, weights_only=Judged(edited=True), width=200).plain.splitlines()[0]
    assert " kB on disk · as edited: 27 tensors · 330 params (model)" in first
    assert "on disk" not in summary_text(summary, weights_only=Judged(), width=200).plain


def test_a_hidden_warning_is_always_counted_the_first_findings_keys_go_first(tmp_path: Path) -> None:
    from builders_tui import fixed_training_checkpoint, save_cuda_tagged

    path = save_cuda_tagged(fixed_training_checkpoint(), tmp_path / "gpu_run.pth")
    summary = summarize(open_checkpoint(str(path)))
    console = Console(width=78, file=io.StringIO())

    def lines(text: Text) -> int:
        return len(text.wrap(console, 78))

    warnings = [f for f in summary.shown_findings if f.severity == "warning"]
    assert len(warnings) >= 2
    for room in range(3, 9):
        shown = fitted_summary(summary, room, lines, width=78).plain
        hidden = [f for f in summary.shown_findings if f.message[:30] not in " ".join(shown.split())]
        if any(finding.severity == "warning" for finding in hidden):
            assert "more finding" in shown or "findings: f lists" in shown or "finding: f lists" in shown, room
