"""Write a Hugging Face Trainer checkpoint of a run with ``deepspeed=`` (ZeRO-2) on CPU, with the real Trainer and
DeepSpeed: ``checkpoint-2/`` holds ``model.safetensors`` beside DeepSpeed's own save (``latest``, ``global_step2/``)
and the Trainer's state (``trainer_state.json``, ``scheduler.pt``, ``rng_state.pth``, ``training_args.bin``).

DeepSpeed is too heavy for the normal test run, so the folder is committed, less the two scripts DeepSpeed copies
beside its save (``zero_to_fp32.py``, ``zero_to_torch.py``: its code, not the save). From the repository root:

    python3 -m venv .venv-ds
    DS_BUILD_OPS=0 .venv-ds/bin/pip install torch==2.13.0 deepspeed==0.19.8 transformers==5.24.0 accelerate==1.15.0
    DS_ACCELERATOR=cpu .venv-ds/bin/python scripts/make_trainer_deepspeed_fixture.py \
        tests/fixtures/frameworks/trainer_deepspeed
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29631", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")

import deepspeed
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Eight random sequences of 8 tokens, each its own label."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 97, (8,))
        return {"input_ids": ids, "labels": ids}


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/frameworks/trainer_deepspeed")
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=97, n_positions=16))
    config = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
    }
    with tempfile.TemporaryDirectory() as run:
        args = TrainingArguments(
            output_dir=run, max_steps=2, save_steps=2, per_device_train_batch_size=2, report_to=[], deepspeed=config
        )
        Trainer(model=model, args=args, train_dataset=Tokens()).train()
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(Path(run) / "checkpoint-2", out / "checkpoint-2")
    for script in ("zero_to_fp32.py", "zero_to_torch.py"):
        (out / "checkpoint-2" / script).unlink(missing_ok=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
