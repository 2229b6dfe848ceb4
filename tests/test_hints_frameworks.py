"""Hints on files the frameworks write themselves (transformers ``save_pretrained``, peft, Lightning's
``Trainer``), built in tmp_path: every fix shown keeps the match with the model the file fits, and the
layout named is the one that saved it. Each test is skipped when its framework is not installed."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from ckpt_tui.cli import main
from ckpt_tui.core.operations.hints import KEY_OPTIONS

FIXTURES = Path(__file__).parent / "fixtures"
LLAMA = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 64,
}


def findings(capsys: pytest.CaptureFixture[str], path: Path) -> list[dict[str, Any]]:
    assert main(["info", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["findings"]


def key_fixes(found: list[dict[str, Any]]) -> list[list[str]]:
    """Every fix option that changes keys, over all findings."""
    return [pair for f in found for pair in f.get("fix_options", []) if pair[0] in KEY_OPTIONS]


def fix_command(capsys: pytest.CaptureFixture[str], path: Path) -> str:
    assert main(["info", str(path)]) == 0
    text = capsys.readouterr().out
    return next(line.split(": ", 1)[1] for line in text.splitlines() if line.strip().startswith("fix: "))


def tiny_models() -> dict[str, Any]:
    tf = pytest.importorskip("transformers")
    bert = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32}
    text = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    return {
        "Llama-style model": tf.LlamaForCausalLM(tf.LlamaConfig(**LLAMA, tie_word_embeddings=True)),
        "Llama-style model (Llama, Mistral": tf.MistralForCausalLM(tf.MistralConfig(**LLAMA, tie_word_embeddings=True)),
        "model whose body is its .transformer": tf.BloomForCausalLM(
            tf.BloomConfig(hidden_size=16, n_layer=1, n_head=2, vocab_size=64)
        ),
        "GPT2LMHeadModel": tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=64)),
        "BertFor*": tf.BertForMaskedLM(tf.BertConfig(**bert, vocab_size=64)),
        "CLIPTextModelWithProjection": tf.CLIPTextModel(tf.CLIPTextConfig(**text)),
        "WhisperForConditionalGeneration": tf.WhisperForConditionalGeneration(
            tf.WhisperConfig(
                d_model=16,
                encoder_layers=1,
                decoder_layers=1,
                encoder_attention_heads=2,
                decoder_attention_heads=2,
                encoder_ffn_dim=32,
                decoder_ffn_dim=32,
                vocab_size=64,
                num_mel_bins=8,
                max_source_positions=16,
                max_target_positions=16,
                pad_token_id=1,
                bos_token_id=2,
                eos_token_id=2,
                decoder_start_token_id=3,
            )
        ),
    }


def test_save_pretrained_files_get_no_fix_that_changes_their_keys_and_their_layout_named(tmp_path, capsys):
    for name, model in tiny_models().items():
        model.save_pretrained(tmp_path / name)
        found = findings(capsys, tmp_path / name / "model.safetensors")
        assert key_fixes(found) == [], name
        assert not any("Lightning" in f["message"] or "wrapper" in f["message"] for f in found), name
        named = [f["message"] for f in found if f["kind"] == "hf-body"]
        assert all(f"Hugging Face {name}" in message for message in named), (name, named)
        # keys under one first component get the finding that names their layout (BERT's cls. head beside
        # bert., and CLIPTextModel's keys saved without text_model., share none: nothing to name)
        with safe_open(str(tmp_path / name / "model.safetensors"), "pt") as saved:
            shared = len({key.split(".", 1)[0] for key in saved.keys()}) == 1  # noqa: SIM118 (safe_open is not iterable)
        assert len(named) == shared, (name, named)


def test_a_clip_text_encoder_keeps_its_text_model_prefix(tmp_path, capsys):
    """CLIP's text tower as Stable Diffusion ships it (transformers 4's CLIPTextModel: text_model.*), taken
    from a real CLIPModel: text_model. is the model's own, not a wrapper to strip."""
    tf = pytest.importorskip("transformers")
    text = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    vision = {**text, "image_size": 16, "patch_size": 8}
    model = tf.CLIPModel(tf.CLIPConfig(text_config=text, vision_config=vision, projection_dim=8))
    tower = {k: v for k, v in model.state_dict().items() if k.startswith("text_model.")}
    torch.save(tower, tmp_path / "text_encoder.pth")
    found = findings(capsys, tmp_path / "text_encoder.pth")
    assert [f["kind"] for f in found if f.get("prefix") == "text_model."] == ["hf-body"]
    assert key_fixes(found) == []


def test_a_ddp_wrapped_hugging_face_model_gets_the_strip_that_reaches_it(tmp_path, capsys):
    tf = pytest.importorskip("transformers")
    model = tf.LlamaForCausalLM(tf.LlamaConfig(**LLAMA))
    torch.save({f"module.{k}": v for k, v in model.state_dict().items()}, tmp_path / "ddp.pth")
    torch.save(model.state_dict(), tmp_path / "model.pth")
    command = fix_command(capsys, tmp_path / "ddp.pth")
    assert "--strip-prefix module." in command
    assert main(shlex.split(command)[1:]) == 0
    capsys.readouterr()
    assert main(["check", str(tmp_path / "ddp.fixed.pth"), "--against", str(tmp_path / "model.pth")]) == 0


def lightning_checkpoint(tmp_path: Path, inner: torch.nn.Module, attribute: str = "model") -> Path:
    """A Lightning Trainer's checkpoint of a LightningModule holding ``inner`` as ``.<attribute>``."""
    pl = pytest.importorskip("pytorch_lightning")

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            setattr(self, attribute, inner)

        def training_step(self, batch: Any, _: int) -> torch.Tensor:
            return sum((p.float() ** 2).sum() for p in self.parameters()) * 1e-3

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    trainer = pl.Trainer(
        max_steps=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(2, 1)), batch_size=1)
    trainer.fit(Module(), data)
    trainer.save_checkpoint(tmp_path / "run.ckpt")
    return tmp_path / "run.ckpt"


def test_a_lightning_module_holding_a_llama_body_gets_the_strip_to_the_body(tmp_path, capsys):
    """Its keys (model.embed_tokens, model.layers.N) also read as LlamaForCausalLM's; Lightning's own keys
    say model. is the LightningModule's attribute, and the strip keeps the fit with the body's layout."""
    tf = pytest.importorskip("transformers")
    body = tf.LlamaModel(tf.LlamaConfig(**LLAMA))
    path = lightning_checkpoint(tmp_path, body)
    torch.save(body.state_dict(), tmp_path / "body.pth")
    command = fix_command(capsys, path)
    assert "--extract state_dict" in command and "--strip-prefix model." in command
    assert main(shlex.split(command)[1:]) == 0
    capsys.readouterr()
    assert main(["check", str(tmp_path / "run.fixed.pth"), "--against", str(tmp_path / "body.pth")]) == 0


def test_a_peft_adapter_file_is_named_and_offered_no_fix_that_empties_it(tmp_path, capsys):
    peft = pytest.importorskip("peft")
    tf = pytest.importorskip("transformers")
    base = tf.LlamaForCausalLM(tf.LlamaConfig(**LLAMA))
    torch.save({k: v.clone() for k, v in base.state_dict().items()}, tmp_path / "base.pth")
    model = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    model.save_pretrained(tmp_path / "adapter")
    adapter = str(tmp_path / "adapter" / "adapter_model.safetensors")
    found = findings(capsys, Path(adapter))
    assert not any(f.get("fix") for f in found)
    assert any("adapter weights only" in f["message"] for f in found)
    assert main(["check", adapter, "--against", str(tmp_path / "base.pth"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert "suggestion" not in report
    assert any("adapter weights only" in note for note in report["notes"])


def test_a_peft_adapter_file_with_modules_to_save_is_an_adapter_file_offered_no_fix(tmp_path, capsys):
    # modules_to_save puts the trained head (base_model.model.lm_head.weight) beside the adapters: no base weights
    peft = pytest.importorskip("peft")
    tf = pytest.importorskip("transformers")
    base = tf.LlamaForCausalLM(tf.LlamaConfig(**LLAMA))
    config = peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"])
    peft.get_peft_model(base, config).save_pretrained(tmp_path / "adapter")
    found = findings(capsys, tmp_path / "adapter" / "adapter_model.safetensors")
    assert not any(f.get("fix") for f in found)
    assert any("adapter weights only" in f["message"] and "modules_to_save" in f["message"] for f in found)


def test_a_peft_model_state_dict_gets_the_fix_that_reaches_the_base_model(tmp_path, capsys):
    peft = pytest.importorskip("peft")
    tf = pytest.importorskip("transformers")
    base = tf.LlamaForCausalLM(tf.LlamaConfig(**LLAMA))
    torch.save({k: v.clone() for k, v in base.state_dict().items()}, tmp_path / "base.pth")
    model = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    torch.save(model.state_dict(), tmp_path / "lora.pth")
    command = fix_command(capsys, tmp_path / "lora.pth")
    assert main(shlex.split(command)[1:]) == 0
    capsys.readouterr()
    assert main(["check", str(tmp_path / "lora.fixed.pth"), "--against", str(tmp_path / "base.pth")]) == 0


def test_a_deepspeed_submodule_prefix_is_not_offered_a_strip(capsys):
    """ZeRO-2's frozen_param_fragments hold the model's own frozen.* keys: stripping frozen. would lose
    the fit with the model weights in the same folder (DeepSpeed wrote it; see its fixture script)."""
    found = findings(capsys, FIXTURES / "deepspeed" / "zero2_bf16")
    frozen = [f for f in found if f.get("prefix") == "frozen."]
    assert frozen and not any(f.get("fix") for f in frozen)
    assert "a submodule of the model" in frozen[0]["message"]


def test_compare_names_the_body_it_strips_and_what_the_fix_gives_up(tmp_path, capsys):
    """A LlamaForCausalLM checked against a LlamaModel: the fix strips model., named as the body (not a
    wrapper), and the report says it gives up the fit with the head model to reach the reference."""
    tf = pytest.importorskip("transformers")
    model = tf.LlamaForCausalLM(tf.LlamaConfig(**LLAMA, tie_word_embeddings=True))
    model.save_pretrained(tmp_path / "causal")
    torch.save(model.model.state_dict(), tmp_path / "body.pth")
    checked = ["check", str(tmp_path / "causal" / "model.safetensors"), "--against", str(tmp_path / "body.pth")]
    assert main([*checked, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    notes = report["notes"]
    assert any("'model.': the body of a Hugging Face Llama-style model" in note for note in notes)
    assert any(note.startswith("the fix gives up the fit with a Hugging Face Llama-style model") for note in notes)
    assert not any("wrapper" in note for note in notes)
    command = report["suggestion"]["argv"]
    assert main(command[1:]) == 0
    capsys.readouterr()
    assert main(["check", command[command.index("--output") + 1], "--against", str(tmp_path / "body.pth")]) == 0


def test_a_lightning_module_holding_its_model_as_net_gets_one_combined_fix(tmp_path, capsys):
    """Lightning's own keys beside the state_dict say its one first component is the LightningModule's
    attribute: .net gets the same extract-and-strip as .model, and the result loads into the net."""
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    path = lightning_checkpoint(tmp_path, net, "net")
    torch.save(net.state_dict(), tmp_path / "net.pth")
    command = fix_command(capsys, path)
    assert "--extract state_dict" in command and "--strip-prefix net." in command
    assert main(shlex.split(command)[1:]) == 0
    capsys.readouterr()
    assert main(["check", str(tmp_path / "run.fixed.pth"), "--against", str(tmp_path / "net.pth")]) == 0


def test_a_fix_never_pairs_same_shaped_tensors_by_a_name_sorted_order(tmp_path, capsys):
    """transformers writes ViT's file with its old names (encoder.layer.N.attention.attention.query) and
    builds the model with new ones (layers.N.attention.q_proj): query, key and value are all [16, 16], and
    the file lists them by name. A rename that reaches the reference must put each tensor where the
    model has it: every key the fixed file shares with the model holds the model's own values."""
    tf = pytest.importorskip("transformers")
    config = tf.ViTConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=16, patch_size=8
    )
    model = tf.ViTForImageClassification(config)
    model.save_pretrained(tmp_path / "vit")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    torch.save(state, tmp_path / "model.pth")
    checked = ["check", str(tmp_path / "vit" / "model.safetensors"), "--against", str(tmp_path / "model.pth")]
    assert main([*checked, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    suggestion = report.get("suggestion")
    if suggestion is None:
        return
    argv = suggestion["argv"]
    assert main(argv[1:]) == 0
    capsys.readouterr()
    from safetensors.torch import load_file

    fixed = load_file(argv[argv.index("--output") + 1])
    shared = [key for key in fixed if key in state]
    assert shared
    assert [key for key in shared if not torch.equal(fixed[key], state[key])] == []


def test_the_browser_header_offers_no_key_for_a_fix_that_was_not_offered():
    """The browser's findings come from the same summary: the frozen. prefix of a ZeRO-2 folder is listed
    without 'p strips it' (stripping it would lose the fit with the folder's own model weights)."""
    from ckpt_tui.core.operations.info import summarize
    from ckpt_tui.core.readers.open import open_checkpoint
    from ckpt_tui.tui.widgets.summary import finding_text

    summary = summarize(open_checkpoint(str(FIXTURES / "deepspeed" / "zero2_bf16")))
    frozen = [f for f in summary.findings if f.prefix == "frozen."]
    assert frozen
    assert all("strips it" not in finding_text(f).plain for f in frozen)
    assert any("x on it extracts it" in finding_text(f).plain for f in summary.findings)


def test_an_averaged_model_is_named_and_its_fix_reaches_the_model(tmp_path, capsys):
    """torch.optim.swa_utils.AveragedModel keeps the model as .module and n_averaged beside it: not
    DataParallel; the fix drops the counter and strips module. (both for the file and inside a dict)."""
    from torch.optim.swa_utils import AveragedModel

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    averaged = AveragedModel(model)
    averaged.update_parameters(model)
    torch.save(model.state_dict(), tmp_path / "model.pth")
    torch.save(averaged.state_dict(), tmp_path / "swa.pth")
    torch.save({"epoch": 3, "model": averaged.state_dict()}, tmp_path / "run.pth")
    for name in ("swa", "run"):
        found = findings(capsys, tmp_path / f"{name}.pth")
        assert any("AveragedModel" in f["message"] for f in found)
        assert not any("DataParallel" in f["message"] for f in found)
        command = fix_command(capsys, tmp_path / f"{name}.pth")
        assert main(shlex.split(command)[1:]) == 0
        capsys.readouterr()
        assert main(["check", str(tmp_path / f"{name}.fixed.pth"), "--against", str(tmp_path / "model.pth")]) == 0
        capsys.readouterr()


def test_a_peft_state_dict_inside_a_training_dict_gets_its_whole_fix_with_the_extract(tmp_path, capsys):
    peft = pytest.importorskip("peft")
    tf = pytest.importorskip("transformers")
    base = tf.LlamaForCausalLM(tf.LlamaConfig(**LLAMA))
    torch.save({k: v.clone() for k, v in base.state_dict().items()}, tmp_path / "base.pth")
    model = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    torch.save({"epoch": 1, "model": model.state_dict()}, tmp_path / "run.pth")
    command = fix_command(capsys, tmp_path / "run.pth")
    assert "--extract model" in command and "--drop-keys" in command and "--rename-infix" in command
    assert main(shlex.split(command)[1:]) == 0
    capsys.readouterr()
    assert main(["check", str(tmp_path / "run.fixed.pth"), "--against", str(tmp_path / "base.pth")]) == 0


def test_compiled_submodules_get_the_rename_with_the_rest_of_the_fix(tmp_path, capsys):
    """model.block = torch.compile(block) leaves _orig_mod inside the block's keys; saved wrapped in
    DataParallel inside a training dict, one command extracts, strips module. and takes _orig_mod out,
    and the result loads."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, tmp_path / "model.pth")
    model[0], model[2] = torch.compile(model[0]), torch.compile(model[2])
    assert any("._orig_mod." in key for key in model.state_dict())
    torch.save(model.state_dict(), tmp_path / "compiled.pth")
    wrapped = torch.nn.DataParallel(model).state_dict()  # on CPU it only adds module., as DDP does
    torch.save({"epoch": 2, "model": wrapped}, tmp_path / "run.pth")
    for name in ("compiled", "run"):
        command = fix_command(capsys, tmp_path / f"{name}.pth")
        assert "--rename-infix _orig_mod=" in command
        assert main(shlex.split(command)[1:]) == 0
        capsys.readouterr()
        assert main(["check", str(tmp_path / f"{name}.fixed.pth"), "--against", str(tmp_path / "model.pth")]) == 0
        capsys.readouterr()


def test_a_whole_model_compiled_inside_ddp_on_a_gpu_gets_one_fix_that_loads_on_cpu(tmp_path, capsys):
    """DDP(torch.compile(model)) saved on a GPU with an AveragedModel EMA beside it: the '_orig_mod' right after
    'module.' is the whole model's compile (no rename of submodules), said as the compare report says it; info's
    one command extracts the live weights, strips both wrappers and maps the GPU tags (the EMA's own tidy left
    out), and check --against's fixes map the tags too: each written file loads on a CPU machine, strictly."""
    from builders import save_cuda_tagged

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, tmp_path / "model.pth")
    compiled = torch.compile(model)
    ema = torch.optim.swa_utils.AveragedModel(model)
    wrapped = torch.nn.DataParallel(compiled).state_dict()  # on CPU it only adds module., as DDP does
    assert all(key.startswith("module._orig_mod.") for key in wrapped)
    save_cuda_tagged({"model": wrapped, "ema": ema.state_dict(), "step": 5}, tmp_path / "run.pth")
    assert main(["info", str(tmp_path / "run.pth")]) == 0
    text = capsys.readouterr().out
    assert "saved from torch.compile inside DataParallel/DDP" in text and "submodules replaced" not in text
    assert "--rename-infix" not in text
    combined = next(line for line in text.splitlines() if " fixes in one" in line)
    assert "not the one at ema" in combined
    command = combined.split(": ", 1)[1]
    assert "--extract model --strip-prefix module._orig_mod. --map-location cpu" in command
    assert main([*shlex.split(command)[1:], "-o", str(tmp_path / "info.pth")]) == 0
    assert main(["check", str(tmp_path / "run.pth"), "--against", str(tmp_path / "model.pth")]) == 1
    commands = [line.strip() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("ckpt-tui")]
    assert len(commands) == 2 and all(c.endswith("--map-location cpu") for c in commands)
    for index, command in enumerate(commands):
        assert main([*shlex.split(command)[1:], "-o", str(tmp_path / f"{index}.pth")]) == 0
    for name in ("info", "0", "1"):
        loaded = torch.load(tmp_path / f"{name}.pth", weights_only=True)
        assert {tensor.device.type for tensor in loaded.values()} == {"cpu"}
        model.load_state_dict(loaded, strict=True)


def test_a_lightning_deepspeed_folder_gets_one_fix_for_its_weights(tmp_path, capsys):
    """Lightning's DeepSpeed strategy (its fixture written by Lightning and DeepSpeed themselves): the model
    states carry Lightning's keys, so the weights' net. is the LightningModule's attribute; the one fix
    extracts and strips it, giving zero_to_fp32's weights less net."""
    folder = tmp_path / "run"
    shutil.copytree(FIXTURES / "frameworks" / "lightning_deepspeed", folder)
    found = findings(capsys, folder / "checkpoint")
    assert [f["kind"] for f in found if f["severity"] == "warning" and f.get("fix")] == ["inner-state-dict"]
    command = fix_command(capsys, folder / "checkpoint")
    assert "--extract fp32_weights --strip-prefix net." in command
    assert main(shlex.split(command)[1:]) == 0
    capsys.readouterr()
    fixed = torch.load(folder / "checkpoint.fixed.pth")
    expected = torch.load(FIXTURES / "frameworks" / "lightning_deepspeed.expected.pt", weights_only=False)
    expected = expected.get("state_dict", expected)
    assert sorted(fixed) == sorted(k.removeprefix("net.") for k in expected)
    assert all(torch.equal(fixed[k.removeprefix("net.")], v) for k, v in expected.items())


@pytest.mark.parametrize("family", ["DistilBert", "Roberta", "Electra"])
def test_a_head_of_another_task_is_dropped_never_renamed_into_the_reference_s_head(tmp_path, capsys, family):
    # an MLM checkpoint against the same family's sequence classifier: DistilBERT's vocab_transform and
    # pre_classifier are both [dim, dim], yet from_pretrained drops the one and initialises the other afresh
    tf = pytest.importorskip("transformers")
    config = getattr(tf, f"{family}Config")(
        vocab_size=64,
        hidden_size=16,
        dim=16,
        hidden_dim=32,
        num_hidden_layers=1,
        n_layers=1,
        num_attention_heads=2,
        n_heads=2,
        intermediate_size=32,
        embedding_size=16,
        num_labels=3,
    )
    torch.manual_seed(0)
    getattr(tf, f"{family}ForMaskedLM")(config).save_pretrained(tmp_path / "mlm")
    classifier = getattr(tf, f"{family}ForSequenceClassification")(config)
    torch.save(classifier.state_dict(), tmp_path / "ref.pt")
    _, info = getattr(tf, f"{family}ForSequenceClassification").from_pretrained(
        tmp_path / "mlm", num_labels=3, output_loading_info=True
    )
    assert main(["check", str(tmp_path / "mlm"), "--against", str(tmp_path / "ref.pt"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    suggestion = report["suggestion"]
    assert all(step.startswith("drop ") for step in suggestion["steps"]), suggestion["steps"]
    # what is left is what from_pretrained leaves missing: the new head, freshly initialised
    assert sorted(suggestion["missing"]) == sorted(info["missing_keys"])
    assert "freshly initialised" in suggestion["other_task_head"]
    assert any("head of another task" in note for note in report["notes"])
    assert main(suggestion["argv"][1:]) == 0
    capsys.readouterr()
    fixed = tmp_path / "mlm" / "model.fixed.safetensors"
    loaded = classifier.load_state_dict(dict(_safetensors(fixed)), strict=False)
    assert sorted(loaded.missing_keys) == sorted(info["missing_keys"]) and not loaded.unexpected_keys


def _safetensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), "pt") as file:
        return {key: file.get_tensor(key) for key in file.keys()}  # noqa: SIM118 - safe_open has no __iter__
