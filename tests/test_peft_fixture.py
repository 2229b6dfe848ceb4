"""A LoRA run saved by Lightning's Trainer (peft, task_type=SEQ_CLS; committed, made by
scripts/make_peft_fixture.py): its fix keeps the head that trained, with no peft installed."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch

from ckpt_tui.cli import main


def run_printed(capsys: pytest.CaptureFixture[str], line: str) -> None:
    capsys.readouterr()
    assert main(shlex.split(line)[1:]) == 0
    capsys.readouterr()


FIXTURE = Path(__file__).parent / "fixtures" / "peft"


def test_a_trainer_saved_lora_run_fixes_to_the_trained_head_without_peft_installed(tmp_path, capsys):
    """The committed Trainer.save_checkpoint of a LoRA SEQ_CLS run (scripts/make_peft_fixture.py): the printed
    fix gives the reference's keys, the head merge_and_unload() keeps, and the base weights in the LoRA'd
    layers (the fine-tune there is not merged, as the note says)."""
    run = tmp_path / "lora_run.ckpt"
    run.write_bytes((FIXTURE / "lora_run.ckpt").read_bytes())
    assert main(["check", str(run), "--against", str(FIXTURE / "plain.pth"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert any("without the fine-tune" in note for note in report["notes"])
    run_printed(capsys, report["suggestion"]["command"])
    fixed = torch.load(tmp_path / "lora_run.fixed.pth", weights_only=True)
    merged = torch.load(FIXTURE / "merged.pth", weights_only=True)
    assert set(fixed) == set(torch.load(FIXTURE / "plain.pth", weights_only=True)) == set(merged)
    lora = {k for k in merged if ".query." in k or ".value." in k}
    assert {k for k in fixed if not torch.equal(fixed[k], merged[k])} == {k for k in lora if k.endswith("weight")}
    assert torch.equal(fixed["classifier.weight"], merged["classifier.weight"])
