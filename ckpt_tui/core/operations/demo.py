"""The built-in demo: a small DDP-style training checkpoint, and the bare model's state_dict beside it,
written with torch into a fresh private folder."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

DEMO_NAME = "demo_ddp_checkpoint.pth"
REFERENCE_NAME = "reference_model.pth"


@dataclass(frozen=True)
class Demo:
    """The demo's files: the training checkpoint and the reference (the model it should load into)."""

    checkpoint: Path
    reference: Path

    def welcome(self) -> str:
        """What the first screen says about them (the README's walkthrough follows it)."""
        return f"demo: {self.reference.name} beside it is the bare model: c, enter compares them"


def demo_folder() -> Path:
    """A fresh folder only this user can read (mkdtemp): no other user's files, no earlier run's saves."""
    return Path(tempfile.mkdtemp(prefix="ckpt-tui-demo-"))


def demo_files(folder: Path | None = None) -> Demo:
    """Where the demo's files go (a fresh private folder unless ``folder``), before anything is written: the
    browser paints at once and writes them in a worker."""
    target = folder or demo_folder()
    return Demo(target / DEMO_NAME, target / REFERENCE_NAME)


def write_demo(folder: Path | None = None) -> Demo:
    """Write the demo's files (:func:`write_files`) into ``folder`` or a fresh private one."""
    demo = demo_files(folder)
    write_files(demo)
    return demo


def write_files(demo: Demo) -> None:
    """Write a training checkpoint as DDP saves it (``module.``-prefixed weights, Adam, a scheduler, the
    run's argparse arguments) and the bare model's own ``state_dict()`` beside it."""
    import argparse

    import torch
    from torch import nn

    demo.checkpoint.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )
    wrapped = nn.DataParallel(model)
    optimizer = torch.optim.Adam(wrapped.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
    loss = wrapped(torch.randn(4, 3, 8, 8)).sum()
    loss.backward()
    optimizer.step()
    scheduler.step()
    checkpoint = {
        "epoch": 12,
        "best_acc": 0.913,
        "model": wrapped.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "args": argparse.Namespace(lr=1e-3, batch_size=128, arch="tinynet"),
    }
    _save(checkpoint, demo.checkpoint)
    # the model as inference code builds it: a fresh instance's keys and shapes, no wrapper
    _save(model.state_dict(), demo.reference)


def _save(value: object, path: Path) -> None:
    """``torch.save`` through a temporary name, so a half-written demo file never exists."""
    import torch

    tmp = path.with_suffix(".tmp")
    torch.save(value, tmp)
    tmp.replace(path)
