"""Write small DeepSpeed ZeRO 1/2/3 checkpoints on CPU with DeepSpeed itself, and zero_to_fp32's output.

DeepSpeed is too heavy for the normal test run, so its fixtures are committed. To make them again
(2 gloo processes on CPU, a torch optimizer, no compiled ops), from the repository root:

    python3 -m venv .venv-ds
    DS_BUILD_OPS=0 .venv-ds/bin/pip install torch==2.13.0 deepspeed==0.19.8
    DS_ACCELERATOR=cpu .venv-ds/bin/python scripts/make_deepspeed_fixtures.py tests/fixtures/deepspeed

Each case folder holds what ``engine.save_checkpoint`` wrote (``latest``, ``global_step2/``...) and
``expected_fp32.pt``: DeepSpeed's own ``convert_zero_checkpoint_to_fp32_state_dict`` output on it. The
model has a tied weight (``head.weight`` is ``embed.weight``) and a frozen layer (``frozen``).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch
import torch.multiprocessing as mp
from torch import nn

WORLD = 2
CASES = {  # name: (zero stage, bf16)
    "zero1_fp32": (1, False),
    "zero2_fp32": (2, False),
    "zero2_bf16": (2, True),
    "zero3_fp32": (3, False),
    "zero3_bf16": (3, True),
}


class TiedNet(nn.Module):
    """Embedding tied to the output head, a frozen layer, a buffer; sizes that need padding."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.frozen = nn.Linear(6, 6)
        self.body = nn.Linear(6, 7)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 7))
        self.back = nn.Linear(7, 6)
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight
        for parameter in self.frozen.parameters():
            parameter.requires_grad = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(x).mean(1)
        hidden = self.back(torch.relu(self.body(self.frozen(hidden)) * self.scale.to(hidden.dtype)))
        return self.head(hidden)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker(rank: int, port: int, stage: int, bf16: bool, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_WORLD_SIZE=str(WORLD),
    )
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = TiedNet()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.01)
    config = {
        "train_micro_batch_size_per_gpu": 3,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": bf16},
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    generator = torch.Generator().manual_seed(10 + rank)
    for _ in range(2):
        batch = torch.randint(0, 11, (3, 4), generator=generator)
        loss = engine(batch).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(out)


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/deepspeed")
    out.mkdir(parents=True, exist_ok=True)
    from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict

    for name, (stage, bf16) in CASES.items():
        target = out / name
        shutil.rmtree(target, ignore_errors=True)
        mp.spawn(_worker, args=(_free_port(), stage, bf16, str(target)), nprocs=WORLD, join=True)
        for script in [*target.glob("zero_to_fp32.py"), *target.glob("zero_to_torch.py")]:
            script.unlink()  # DeepSpeed copies its converter beside the checkpoint; not ours to commit
        with tempfile.TemporaryDirectory() as converted:
            convert_zero_checkpoint_to_fp32_state_dict(str(target), converted, max_shard_size=None)
            shutil.move(os.path.join(converted, "pytorch_model.bin"), target / "expected_fp32.pt")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
