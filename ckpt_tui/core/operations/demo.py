"""The built-in demo: a small DDP-style training checkpoint, written with torch."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def demo_path() -> Path:
    """Where the demo checkpoint lives (a per-user temporary folder)."""
    folder = Path(tempfile.gettempdir()) / f"ckpt-tui-demo-{os.getuid() if hasattr(os, 'getuid') else 0}"
    return folder / "demo_ddp_checkpoint.pth"


def write_demo(path: Path | None = None) -> Path:
    """Write a training checkpoint as DDP saves it: ``module.``-prefixed weights, Adam, a scheduler."""
    import argparse

    import torch
    from torch import nn

    target = path or demo_path()
    target.parent.mkdir(parents=True, exist_ok=True)
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
    tmp = target.with_suffix(".tmp")
    torch.save(checkpoint, tmp)
    tmp.replace(target)
    return target
