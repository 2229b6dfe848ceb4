"""PEFT's modules_to_save (task_type=SEQ_CLS wraps the head): the fix keeps the copy that trained, under any
adapter name, and a LoRA model inside a Lightning checkpoint is named, with its whole fix, from the start
(real peft and Lightning state_dicts, made here)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import torch

from ckpt_tui.cli import main

peft = pytest.importorskip("peft")
tf = pytest.importorskip("transformers")
pl = pytest.importorskip("pytorch_lightning")

BERT = {
    "vocab_size": 50,
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 32,
    "num_labels": 3,
}


class Lit(pl.LightningModule):  # type: ignore[misc]
    """A LightningModule holding the PEFT model as .model, as the user's training script does."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model


def lora_run(tmp_path: Path, adapter: str) -> tuple[Path, dict[str, torch.Tensor]]:
    """A Lightning checkpoint of a LoRA'd BertForSequenceClassification whose head trained (the
    modules_to_save copy moved off the original), and the weights merge_and_unload() gives."""
    torch.manual_seed(0)
    base = tf.BertForSequenceClassification(tf.BertConfig(**BERT))
    config = peft.LoraConfig(task_type=peft.TaskType.SEQ_CLS, r=2, target_modules=["query", "value"])
    model = peft.get_peft_model(base, config, adapter_name=adapter)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if f"modules_to_save.{adapter}." in name:
                tensor.add_(1.0)
    lit = Lit(model)
    root = {
        "epoch": 1,
        "global_step": 4,
        "pytorch-lightning_version": pl.__version__,
        "state_dict": lit.state_dict(),
        "loops": {},
        "callbacks": {},
        "optimizer_states": [],
        "lr_schedulers": [],
    }
    assert f"model.base_model.model.classifier.modules_to_save.{adapter}.weight" in root["state_dict"]
    torch.save(root, tmp_path / "run.ckpt")
    merged = {k: v.clone() for k, v in model.merge_and_unload().state_dict().items()}
    torch.save({k: torch.zeros_like(v) for k, v in merged.items()}, tmp_path / "plain.pth")
    return tmp_path / "run.ckpt", merged


def info_json(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, Any]:
    assert main(["info", str(path), "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def run_printed(capsys: pytest.CaptureFixture[str], line: str) -> None:
    capsys.readouterr()
    assert main(shlex.split(line)[1:]) == 0
    capsys.readouterr()


def assert_fixed(path: Path, merged: dict[str, torch.Tensor]) -> None:
    """The fixed file loads strictly and holds the trained head; the LoRA'd layers are the base's (no merge)."""
    fixed = torch.load(path, weights_only=True)
    model = tf.BertForSequenceClassification(tf.BertConfig(**BERT))
    model.load_state_dict(fixed, strict=True)
    assert torch.equal(fixed["classifier.weight"], merged["classifier.weight"])
    assert torch.equal(fixed["classifier.bias"], merged["classifier.bias"])
    embedding = "bert.embeddings.word_embeddings.weight"
    assert torch.equal(fixed[embedding], merged[embedding])


@pytest.mark.parametrize("adapter", ["default", "task"])
def test_check_against_keeps_the_trained_head_and_drops_the_original(tmp_path, capsys, adapter):
    run, merged = lora_run(tmp_path, adapter)
    assert main(["check", str(run), "--against", str(tmp_path / "plain.pth"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    command = report["suggestion"]["command"]
    assert "--drop-keys '*.original_module.*'" in command
    assert f"--rename-infix modules_to_save.{adapter}=" in command
    assert "--drop " not in command
    notes = " ".join(report["notes"])
    assert f".modules_to_save.{adapter}." in notes and "without the fine-tune" in notes
    assert "merge_and_unload()" in notes
    run_printed(capsys, command)
    assert_fixed(tmp_path / "run.fixed.pth", merged)


def test_info_names_the_lora_layout_under_the_lightning_prefix_with_its_whole_fix(tmp_path, capsys):
    run, merged = lora_run(tmp_path, "default")
    found = info_json(capsys, run)["findings"]
    peft_finding = next(f for f in found if "a PEFT/LoRA model's" in f["message"])
    assert "'model.base_model.model.'" in peft_finding["message"]
    assert "without the fine-tune" in peft_finding["message"]
    assert main(["info", str(run)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("fix: "))
    assert "--extract state_dict" in line and "--strip-prefix model.base_model.model." in line
    run_printed(capsys, line.split(": ", 1)[1])
    assert_fixed(tmp_path / "run.fixed.pth", merged)


def test_a_lora_model_with_its_prefix_stripped_is_still_named_and_fits_nothing_as_it_is(tmp_path, capsys):
    run, merged = lora_run(tmp_path, "default")
    stripped = tmp_path / "stripped.pth"
    strip = ["convert", str(run), "-o", str(stripped), "--extract", "state_dict"]
    assert main([*strip, "--strip-prefix", "model.base_model.model."]) == 0
    capsys.readouterr()
    found = info_json(capsys, stripped)["findings"]
    assert any("a PEFT/LoRA model's" in f["message"] and f.get("fix") for f in found)
    assert main(["check", str(stripped), "--against", str(tmp_path / "plain.pth"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    # base_layer and lora_A keys are no BertFor* model's: the fix gives up no fit they do not have
    assert not any("fit as they are" in note for note in report["notes"])
    run_printed(capsys, report["suggestion"]["command"])
    assert_fixed(tmp_path / "stripped.fixed.pth", merged)


async def test_the_browser_header_names_the_lora_layout_when_the_file_opens(tmp_path):
    from builders_tui import header, loaded

    from ckpt_tui.tui.app import CkptApp

    run, _ = lora_run(tmp_path, "default")
    app = CkptApp(str(run))
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await loaded(pilot)
        await pilot.pause(0.5)
        assert "'model.base_model.model.', a PEFT/LoRA model's" in " ".join(header(app).split())


def test_a_peft_finding_names_the_keys_it_has_no_browser_key_for():
    from ckpt_tui.core.conventions.findings import Finding, Fix
    from ckpt_tui.tui.widgets.summary import finding_text

    fix = Fix("--extract", "state_dict", (("--drop-keys", "*.lora_A.*"), ("--strip-prefix", "base_model.model.")))
    text = finding_text(Finding("inner-state-dict", "the model weights are under x", "warning", fix=fix)).plain
    assert "x on it extracts it, then p strips it: part of the fix; c with your model stages all" in text


def test_an_adapter_folder_checked_against_the_base_model_is_offered_no_fix(tmp_path, capsys):
    # save_pretrained writes the adapters and the trained head only: two head keys reached is no model to load
    torch.manual_seed(0)
    base = tf.BertForSequenceClassification(tf.BertConfig(**BERT))
    torch.save({k: v.clone() for k, v in base.state_dict().items()}, tmp_path / "plain.pth")
    config = peft.LoraConfig(task_type=peft.TaskType.SEQ_CLS, r=2, target_modules=["query", "value"])
    peft.get_peft_model(base, config).save_pretrained(tmp_path / "adapter")
    assert main(["check", str(tmp_path / "adapter"), "--against", str(tmp_path / "plain.pth"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report.get("suggestion") is None
    assert any("adapter weights only" in note and "nothing here to fix" in note for note in report["notes"])
