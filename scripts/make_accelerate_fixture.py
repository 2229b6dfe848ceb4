"""Write a small ``Accelerator.save_state`` folder on CPU with Accelerate itself.

Accelerate is not a test dependency, so its output is committed. To make it again, from the
repository root:

    python3 -m venv .venv-acc
    .venv-acc/bin/pip install torch==2.13.0 accelerate==1.15.0
    .venv-acc/bin/python scripts/make_accelerate_fixture.py tests/fixtures/accelerate

The folder holds what ``save_state`` wrote (``model.safetensors``, ``optimizer.bin``,
``scheduler.bin``, ``random_states_0.pkl``) and ``expected.pt``: each file as Accelerate's own
``load_state`` reads it (``torch.load`` / ``safetensors``), for the tests to compare with.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from safetensors.torch import load_file
from torch import nn


def main(out: Path) -> None:
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    for _ in range(2):
        loss = model(torch.randn(16, 4)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    folder = out / "save_state"
    shutil.rmtree(folder, ignore_errors=True)
    accelerator.save_state(str(folder))
    expected = {
        "model": load_file(folder / "model.safetensors"),
        "optimizer": torch.load(folder / "optimizer.bin", weights_only=True),
        "scheduler": torch.load(folder / "scheduler.bin", weights_only=True),
    }
    torch.save(expected, out / "save_state.expected.pt")
    print(sorted(p.name for p in folder.iterdir()))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
