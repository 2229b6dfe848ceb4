"""Hints from what a file is, not one prefix: a Hugging Face body under ``model.`` loads as it is, and a
PEFT state_dict gets the fix ``check --model`` searches from, which reaches the base model's keys."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import torch

from ckpt_tui.cli import main

WIDTH, VOCAB = 8, 32
LAYER = ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")


def llama_style(tied: bool = True) -> dict[str, torch.Tensor]:
    """A LlamaForCausalLM-style state_dict (built with torch alone: the key layout of transformers'
    LlamaForCausalLM), the LM head tied to the embedding and so left out when ``tied``."""
    torch.manual_seed(0)
    state = {"model.embed_tokens.weight": torch.randn(VOCAB, WIDTH)}
    for index in range(2):
        state.update({f"model.layers.{index}.{name}.weight": torch.randn(WIDTH, WIDTH) for name in LAYER})
        state[f"model.layers.{index}.input_layernorm.weight"] = torch.ones(WIDTH)
    state["model.norm.weight"] = torch.ones(WIDTH)
    if not tied:
        state["lm_head.weight"] = torch.randn(VOCAB, WIDTH)
    return state


def peft_style(base: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A PeftModel's state_dict over ``base`` (the key layout peft gives a LoRA on q_proj and v_proj)."""
    out = {}
    for key, value in base.items():
        module = key.rsplit(".", 1)[0]
        if module.endswith(("q_proj", "v_proj")):
            out[f"base_model.model.{module}.base_layer.weight"] = value
            out[f"base_model.model.{module}.lora_A.default.weight"] = torch.randn(2, WIDTH)
            out[f"base_model.model.{module}.lora_B.default.weight"] = torch.zeros(WIDTH, 2)
        else:
            out[f"base_model.model.{key}"] = value
    return out


def info_json(capsys, path: Path) -> list[dict]:
    assert main(["info", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["findings"]


def test_a_hugging_face_body_under_model_is_not_called_lightning_nor_stripped(tmp_path, capsys):
    torch.save(llama_style(), tmp_path / "llama.pth")
    findings = info_json(capsys, tmp_path / "llama.pth")
    assert not any("Lightning" in f["message"] for f in findings)
    assert not any(f.get("fix") for f in findings)
    assert any(f["kind"] == "hf-body" for f in findings)
    assert main(["info", str(tmp_path / "llama.pth")]) == 0
    assert "--strip-prefix" not in capsys.readouterr().out


def test_a_lightning_checkpoint_still_gets_its_strip(tmp_path, capsys):
    state = {f"model.{k}": v for k, v in llama_style(tied=False).items()}
    torch.save(
        {"state_dict": state, "pytorch-lightning_version": "2.4.0", "epoch": 1, "loops": {}}, tmp_path / "l.ckpt"
    )
    findings = info_json(capsys, tmp_path / "l.ckpt")
    fixed = [f for f in findings if f.get("fix_options")]
    assert fixed and ["--strip-prefix", "model."] in fixed[0]["fix_options"]


def test_a_peft_state_dict_gets_the_fix_that_reaches_the_base_model(tmp_path, capsys):
    base = llama_style(tied=False)
    torch.save(peft_style(base), tmp_path / "peft.pth")
    torch.save(base, tmp_path / "base.pth")
    assert main(["info", str(tmp_path / "peft.pth")]) == 0
    text = capsys.readouterr().out
    command = next(line.split("fix: ", 1)[1] for line in text.splitlines() if "fix: " in line)
    assert "--strip-prefix base_model.model." in command and "--strip-prefix base_model. " not in command
    assert main(shlex.split(command)[1:]) == 0
    capsys.readouterr()
    assert main(["check", str(tmp_path / "peft.fixed.pth"), "--against", str(tmp_path / "base.pth")]) == 0


def bert_mlm(vocab: int = VOCAB) -> dict[str, torch.Tensor]:
    """BertForMaskedLM's key layout (built with torch alone, as transformers names it): the MLM decoder's
    weight and bias are tied to the word embedding and to ``cls.predictions.bias``."""
    torch.manual_seed(1)
    embedding, bias = torch.randn(vocab, WIDTH), torch.zeros(vocab)
    return {
        "bert.embeddings.word_embeddings.weight": embedding,
        "bert.embeddings.LayerNorm.weight": torch.ones(WIDTH),
        "bert.encoder.layer.0.attention.self.query.weight": torch.randn(WIDTH, WIDTH),
        "cls.predictions.bias": bias,
        "cls.predictions.transform.dense.weight": torch.randn(WIDTH, WIDTH),
        "cls.predictions.decoder.weight": embedding,
        "cls.predictions.decoder.bias": bias,
    }


def test_bert_mlm_decoder_weight_and_bias_are_known_as_tied(tmp_path, capsys):
    model = bert_mlm()
    torch.save(model, tmp_path / "model.pth")
    saved = {k: v for k, v in model.items() if not k.startswith("cls.predictions.decoder.")}  # as tied saving does
    torch.save(saved, tmp_path / "saved.pth")
    assert main(["check", str(tmp_path / "saved.pth"), "--against", str(tmp_path / "model.pth")]) == 1
    text = capsys.readouterr().out
    assert "cls.predictions.decoder.weight is absent from the file: the architecture ties it to " in text
    assert "ties it to bert.embeddings.word_embeddings.weight" in text
    assert (
        "cls.predictions.decoder.bias is absent from the file: the architecture ties it to cls.predictions.bias" in text
    )
    assert "2 tied to weights in the file, filled in by tie_weights(); none keeps the model's initial values" in text


def test_t5_encoder_embedding_is_known_as_tied_to_shared(tmp_path, capsys):
    shared = torch.randn(VOCAB, WIDTH)
    model = {
        "shared.weight": shared,
        "encoder.embed_tokens.weight": shared,
        "encoder.final_layer_norm.weight": torch.ones(WIDTH),
    }
    torch.save(model, tmp_path / "t5.pth")
    torch.save({k: v for k, v in model.items() if k != "encoder.embed_tokens.weight"}, tmp_path / "saved.pth")
    assert main(["check", str(tmp_path / "saved.pth"), "--against", str(tmp_path / "t5.pth"), "--json"]) == 1
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any(
        n.startswith("encoder.embed_tokens.weight is absent from the file: the architecture ties it to shared.weight")
        for n in notes
    )


def test_a_gpt2_style_body_under_transformer_is_not_offered_a_strip(tmp_path, capsys):
    """GPT2LMHeadModel's layout with its head tied (built with torch alone, as transformers names it)."""
    state = {"transformer.wte.weight": torch.randn(VOCAB, WIDTH), "transformer.wpe.weight": torch.randn(16, WIDTH)}
    state.update({f"transformer.h.{i}.attn.c_attn.weight": torch.randn(WIDTH, 3 * WIDTH) for i in range(2)})
    state["transformer.ln_f.weight"] = torch.ones(WIDTH)
    torch.save(state, tmp_path / "gpt2.pth")
    findings = info_json(capsys, tmp_path / "gpt2.pth")
    assert [f["kind"] for f in findings if f.get("prefix")] == ["hf-body"]
    assert not any(f.get("fix") for f in findings)


def test_adapters_beside_a_head_and_no_adapted_layer_s_base_weight_are_an_adapter_file(tmp_path, capsys):
    # peft's save_pretrained with modules_to_save=["lm_head"]: the LoRA pieces and the trained head, no base weights
    adapter = {
        f"base_model.model.model.layers.0.self_attn.{name}.lora_{part}.weight": torch.zeros(2, WIDTH)
        for name in ("q_proj", "v_proj")
        for part in "AB"
    }
    adapter["base_model.model.lm_head.weight"] = torch.zeros(VOCAB, WIDTH)
    torch.save(adapter, tmp_path / "adapter.pth")
    found = info_json(capsys, tmp_path / "adapter.pth")
    assert not any(f.get("fix") for f in found)
    assert any(
        "adapter weights only (4: lora_A, lora_B) and 1 tensor of modules_to_save" in f["message"] for f in found
    )
