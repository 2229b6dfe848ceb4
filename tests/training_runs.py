"""Real (tiny) training runs saved as training checkpoints, with faults planted on request.

A small ResNet, a small transformer and a tiny Hugging Face GPT-2 (pre-LayerNorm blocks, Conv1D
weights stored [in, out], token embeddings tied to the LM head or not: ``gpt2``, ``gpt2-untied``),
trained on random data with AdamW or SGD with momentum, with or without CPU autocast (bf16), saved
as ``{"epoch", "model_state_dict", "optimizer_state_dict", "scheduler_state_dict"}``. The faults are
planted the way they happen: a NaN in a weight, one layer scaled by 50, one layer zeroed, one layer
whose gradient is always 0 (frozen: its moments stay 0).
"""

from __future__ import annotations

import torch
from torch import nn

FAULTS = ("nan", "scaled", "zeroed", "frozen")
FAULTY = {
    "resnet": "stages.1.1.conv1.weight",
    "transformer": "encoder.layers.2.linear1.weight",
    "gpt2": "transformer.h.2.mlp.c_fc.weight",
    "gpt2-untied": "transformer.h.2.mlp.c_fc.weight",
}
"""The parameter each fault is planted in (a repeated block, so it has siblings)."""
PLANTED = ("nan", "scaled", "zeroed")
"""Faults planted in a trained checkpoint; ``frozen`` is trained that way."""


class Block(nn.Module):
    """A ResNet basic block."""

    def __init__(self, inp: int, out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inp, out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out)
        self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out)
        self.down = (
            nn.Sequential(nn.Conv2d(inp, out, 1, stride, bias=False), nn.BatchNorm2d(out))
            if stride != 1 or inp != out
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    """Stem, two stages of three blocks, pooled head."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.stages = nn.Sequential(
            nn.Sequential(Block(8, 8, 1), Block(8, 8, 1), Block(8, 8, 1)),
            nn.Sequential(Block(8, 16, 2), Block(16, 16, 1), Block(16, 16, 1), Block(16, 16, 1)),
        )
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.stages(self.stem(x)).mean((2, 3)))


class Transformer(nn.Module):
    """Token and position embeddings, four encoder layers, a tied LM head."""

    def __init__(self, vocab: int = 64, width: int = 32, length: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.randn(length, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.encoder(self.embed(x) + self.position)))


def gpt2(tied: bool) -> nn.Module:
    """A four-block GPT-2 from transformers, at GPT-2's own initialisation."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=64,
        n_positions=16,
        n_embd=32,
        n_layer=4,
        n_head=4,
        tie_word_embeddings=tied,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config)


class _Logits(nn.Module):
    """A GPT-2 that returns its logits, as the other models do."""

    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.model = gpt2(tied)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=x).logits


def _model(kind: str) -> nn.Module:
    if kind == "resnet":
        return ResNet()
    if kind == "transformer":
        return Transformer()
    return _Logits(tied=kind == "gpt2")


def _batch(kind: str, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    if kind == "resnet":
        return torch.randn(8, 3, 12, 12, generator=generator), torch.randint(0, 10, (8,), generator=generator)
    tokens = torch.randint(0, 64, (8, 17), generator=generator)
    return tokens[:, :-1], tokens[:, 1:]


def train(kind: str, optimizer: str = "adamw", amp: bool = False, frozen: bool = False, steps: int = 20) -> dict:
    """Train a ``kind`` model for ``steps`` steps; the training checkpoint as ``torch.save`` takes it.
    ``frozen``: the gradient of :data:`FAULTY`'s parameter is always 0, so its moments stay 0."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is faster, and the same on any machine
    try:
        return _train(kind, optimizer, amp, frozen, steps)
    finally:
        torch.set_num_threads(threads)


def _train(kind: str, optimizer: str, amp: bool, frozen: bool, steps: int) -> dict:
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    model = _model(kind)
    # the checkpoint holds the GPT-2 itself, as save_pretrained and training loops keep it
    inner = model.model if isinstance(model, _Logits) else model
    if frozen:
        dict(inner.named_parameters())[FAULTY[kind]].register_hook(torch.zeros_like)
    opt: torch.optim.Optimizer
    if optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=max(1, steps // 3), gamma=0.5)
    model.train()
    for _ in range(steps):
        x, y = _batch(kind, generator)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            out = model(x)
        loss = nn.functional.cross_entropy(out.float().reshape(-1, out.shape[-1]), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
    return {
        "epoch": 3,
        "model_state_dict": inner.state_dict(),
        "optimizer_state_dict": opt.state_dict(),
        "scheduler_state_dict": schedule.state_dict(),
    }


def planted(checkpoint: dict, kind: str, fault: str) -> dict:
    """The checkpoint with ``fault`` (nan, scaled, zeroed) planted in :data:`FAULTY`'s weight after training."""
    weights = dict(checkpoint["model_state_dict"])
    weight = weights[FAULTY[kind]].clone()
    if fault == "nan":
        weight.view(-1)[3] = float("nan")
    elif fault == "scaled":
        weight.mul_(50)
    else:
        weight.zero_()
    weights[FAULTY[kind]] = weight
    return {**checkpoint, "model_state_dict": weights}
