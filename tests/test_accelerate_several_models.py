"""Accelerate's ``save_state`` after ``prepare(m1, m2, o1, o2)`` (the GAN pattern: ``model.safetensors``,
``model_1.safetensors``, ``optimizer.bin``, ``optimizer_1.bin``): each optimizer is compared with the save's models as
``load_state`` loads them (``optimizer_N`` into the N-th optimizer, which may hold any model's parameters), so a
save that resumes is never "saved for another model"; an optimizer shaped for no model of the save still is.

The folders are written by the real Accelerate on CPU, in a child process (its state is process-wide), which also
resumes them with ``load_state`` and steps once: the ground truth.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from test_distributed import run

pytest.importorskip("accelerate")

SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from torch import nn
    from accelerate import Accelerator

    out, safe = sys.argv[1], sys.argv[2] == "safetensors"
    torch.manual_seed(0)
    m1, m2 = nn.Linear(4, 3), nn.Linear(3, 2)
    if sys.argv[3] == "two":
        optimizers = [torch.optim.AdamW(m1.parameters()), torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9)]
    else:
        optimizers = [torch.optim.AdamW([*m1.parameters(), *m2.parameters()])]
    accelerator = Accelerator(cpu=True)
    m1, m2, *optimizers = accelerator.prepare(m1, m2, *optimizers)
    accelerator.backward(m2(m1(torch.randn(2, 4))).sum())
    for optimizer in optimizers:
        optimizer.step()
    accelerator.save_state(out, safe_serialization=safe)
    # the ground truth: load_state resumes it, and a step runs
    accelerator.load_state(out)
    accelerator.backward(m2(m1(torch.randn(2, 4))).sum())
    for optimizer in optimizers:
        optimizer.step()
    print("resumed")
    """
)


def _save_state(folder: Path, serialization: str, optimizers: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(folder), serialization, optimizers],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0 and "resumed" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize("serialization", ["safetensors", "bin"])
def test_two_models_and_two_optimizers_check_clean(tmp_path: Path, capsys: Any, serialization: str) -> None:
    folder = tmp_path / "state"
    _save_state(folder, serialization, "two")
    weights = "model{}.safetensors" if serialization == "safetensors" else "pytorch_model{}.bin"
    for name in (weights.format(""), weights.format("_1"), "optimizer.bin", "optimizer_1.bin"):
        assert (folder / name).is_file()
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 0, out
    assert "optimizer-shapes" not in out and "another model" not in out
    code, out, _ = run(capsys, "info", str(folder))
    assert 'optimizer state at ckpt["optimizer_1"]: SGD-style' in out and "another model" not in out
    # each model counted and named: Linear(4, 3) has 15 parameters, Linear(3, 2) 8
    first, second = ("model", "model_1") if serialization == "safetensors" else ("pytorch_model", "pytorch_model_1")
    header = {line.split(None, 1)[0]: line.split(None, 1)[1] for line in out.splitlines()[1:6]}
    assert header["layout"] == (
        f"Accelerate save_state: 2 models ({first}, {second}), 2 optimizers (optimizer, optimizer_1), "
        "1 RNG state (random_states_0)"
    )
    assert header["elements"].startswith(f"15 params ({first}) + 8 params ({second}) + 40 optimizer state + ")
    code, out, _ = run(capsys, "info", str(folder), "--json")
    assert json.loads(out)["models"] == [
        {"path": [first], "parameter_count": 15, "buffer_count": 0},
        {"path": [second], "parameter_count": 8, "buffer_count": 0},
    ]


def test_one_optimizer_over_both_models_checks_clean(tmp_path: Path, capsys: Any) -> None:
    folder = tmp_path / "state"
    _save_state(folder, "safetensors", "one")
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 0, out
    assert "another model" not in out


def test_an_optimizer_shaped_for_no_model_of_the_save_is_still_flagged(tmp_path: Path, capsys: Any) -> None:
    folder = tmp_path / "state"
    _save_state(folder, "safetensors", "two")
    other = torch.nn.Linear(5, 7)
    optimizer = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
    other(torch.randn(2, 5)).sum().backward()
    optimizer.step()
    torch.save(optimizer.state_dict(), folder / "optimizer_1.bin")
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 1
    assert (
        '[optimizer-shapes] optimizer at ckpt["optimizer_1"] holds state shaped [7, 5], [7] that no model parameter '
        "has: it was saved for another model" in out
    )
