"""What ckpt-tui's ``fp32_weights`` of a committed DeepSpeed fixture holds: DeepSpeed's zero_to_fp32 output, plus
the frozen parameters DeepSpeed's ZeRO-1 does not list (its zero_to_fp32 leaves them out; ckpt-tui takes them from
the module as saved, widened to fp32, after the buffers as the listed ones are)."""

from __future__ import annotations

from pathlib import Path

import torch

DEEPSPEED = Path(__file__).parent / "fixtures" / "deepspeed"


def expected_fp32_weights(case: str) -> dict[str, torch.Tensor]:
    """The fixture's ``expected_fp32.pt``, with the module's frozen parameters where DeepSpeed did not list them."""
    want: dict[str, torch.Tensor] = torch.load(DEEPSPEED / case / "expected_fp32.pt", weights_only=False)
    states = torch.load(sorted((DEEPSPEED / case / "global_step2").glob("*model_states.pt"))[0], weights_only=False)
    if states.get("frozen_param_shapes") is not None or "frozen.weight" in want:
        return want
    frozen = {name: states["module"][name].float() for name in ("frozen.weight", "frozen.bias")}
    buffers = [(name, value) for name, value in want.items() if name in states["buffer_names"]]
    rest = [(name, value) for name, value in want.items() if name not in states["buffer_names"]]
    return dict(buffers + list(frozen.items()) + rest)
