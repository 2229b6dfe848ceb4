"""The model weights at the root beside training state, as torchtitan saves a step with ``dcp.save``: its model
keys at the root (``CheckpointManager._flattened_model_states_sd``), ``optimizer`` flattened by torch
(``flatten_optimizer_state_dict=True``), ``lr_scheduler``, ``dataloader`` and ``train_state`` beside them.

``info`` counts the model's parameters and the optimizer's state; ``convert --extract auto`` keeps the model's
keys and says what it leaves out.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from ckpt_tui.cli import main


def titan_step(folder: Path, layers: int, loss_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """A torchtitan-style step saved with dcp.save in one process (no process group); the model's state_dict.
    ``loss_scale`` 0: every gradient is zero, so AdamW's moments stay all zero."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 16), *[nn.Linear(16, 16) for _ in range(layers)], nn.LayerNorm(16))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    for _ in range(2):
        (model(torch.randint(0, 50, (4, 3))).square().mean() * loss_scale).backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    weights = get_model_state_dict(model)
    state = {
        **weights,
        "optimizer": get_optimizer_state_dict(
            model, optimizer, options=StateDictOptions(flatten_optimizer_state_dict=True)
        ),
        "lr_scheduler": scheduler.state_dict(),
        "dataloader": {"world_size": 1},
        "train_state": {"step": 2, "ntokens_seen": 24},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(folder))
    return {key: value.detach().clone() for key, value in weights.items()}


def optimizer_elements(weights: dict[str, torch.Tensor]) -> int:
    """AdamW's state: exp_avg and exp_avg_sq shaped as each parameter, and a 0-d step each."""
    return sum(2 * tensor.numel() + 1 for tensor in weights.values())


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# a few layers: the root is 4 dicts beside a few tensors; many: the root is mostly tensors (a state_dict by count)
@pytest.mark.parametrize("layers", [1, 40])
def test_info_counts_the_model_at_the_root_and_the_flattened_optimizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], layers: int
) -> None:
    weights = titan_step(tmp_path / "step-2", layers)
    params = sum(tensor.numel() for tensor in weights.values())
    code, out, err = run(capsys, "info", str(tmp_path / "step-2"))
    assert code == 0, err
    elements = next(line for line in out.splitlines() if line.lstrip().startswith("elements")).split()[1:]
    # (no "other": every tensor is the model's or the optimizer's; larger counts are shown rounded, 11.7k)
    assert elements[1:4] == ["params", "(model)", "+"] and elements[5:] == ["optimizer", "state"]
    if layers == 1:
        assert (elements[0], elements[4]) == (str(params), str(optimizer_elements(weights)))
    assert f"the model weights are the {len(weights)} tensors at the root, beside optimizer, lr_scheduler" in out
    # the flattened optimizer is audited as the optimizer it flattens
    parameters = len([key for key in weights if key.endswith(("weight", "bias"))])
    assert (
        f'optimizer state at ckpt["optimizer"]: Adam-style, 1 param group (lr 0.01), {parameters} parameters, step 2'
        in out
    )
    code, out, _ = run(capsys, "info", "--json", str(tmp_path / "step-2"))
    found: dict[str, Any] = json.loads(out)
    assert found["model_parameter_count"] == params
    assert found["optimizer_state_count"] == optimizer_elements(weights)
    fixes = [f.get("fix_options") for f in found["findings"] if f["kind"] == "inner-state-dict"]
    assert fixes == [[["--extract", "auto"]]]


@pytest.mark.parametrize("layers", [1, 40])
def test_extract_auto_keeps_the_model_keys_and_says_what_it_drops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], layers: int
) -> None:
    weights = titan_step(tmp_path / "step-2", layers)
    out_file = tmp_path / "model.safetensors"
    code, out, err = run(capsys, "convert", str(tmp_path / "step-2"), "--extract", "auto", "-o", str(out_file))
    assert code == 0, err
    assert f"extract the model weights at the root ({len(weights)} tensors)" in out
    assert 'drops the optimizer state at ckpt["optimizer"]' in out and 'ckpt["train_state"]' in out
    got = load_file(out_file)
    assert got.keys() == weights.keys() and all(torch.equal(got[key], weights[key]) for key in weights)
    # the model loads from it, strictly
    model = nn.Sequential(nn.Embedding(50, 16), *[nn.Linear(16, 16) for _ in range(layers)], nn.LayerNorm(16))
    model.load_state_dict(got, strict=True)


def test_a_state_dict_beside_a_loss_tensor_is_still_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # torch's general-checkpoint tutorial: the tensors at the root are the loss, not the model
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "ckpt.pth"
    torch.save(
        {"model_state_dict": model.state_dict(), "optimizer": optimizer.state_dict(), "loss": torch.tensor(0.5)}, path
    )
    code, out, _ = run(capsys, "info", str(path))
    assert code == 0 and 'the model weights are under ckpt["model_state_dict"]' in out
    assert "tensors at the root" not in out


def test_a_flattened_optimizer_reads_as_the_optimizer_it_flattens() -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from ckpt_tui.core.conventions.state_dicts import is_flat_optimizer, unflattened_optimizer

    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    groups = [{"params": model[0].parameters(), "lr": 0.1}, {"params": model[1].parameters(), "weight_decay": 0.5}]
    optimizer = torch.optim.AdamW(groups, lr=0.01, betas=(0.8, 0.9))
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    flat = get_optimizer_state_dict(model, optimizer, options=options)
    assert is_flat_optimizer(flat) and "state.0.weight.exp_avg" in flat
    nested = unflattened_optimizer(flat)
    assert [(g["params"], g["lr"], g["weight_decay"]) for g in nested["param_groups"]] == [
        (["0.weight", "0.bias"], 0.1, 0.01),
        (["1.weight", "1.bias"], 0.01, 0.5),
    ]
    assert torch.equal(nested["state"]["1.bias"]["exp_avg"], optimizer.state[model[1].bias]["exp_avg"])
    assert not is_flat_optimizer(model.state_dict()) and not is_flat_optimizer(optimizer.state_dict())


def test_check_finds_all_zero_moments_in_the_flattened_optimizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ckpt_tui.core.conventions.training_state import tensor_role
    from ckpt_tui.core.model.tree import iter_tensors
    from ckpt_tui.core.readers.open import open_checkpoint

    weights = titan_step(tmp_path / "trained", 1)
    code, out, _ = run(capsys, "check", str(tmp_path / "trained"))
    assert code == 0 and "zero-moments" not in out, out
    # the same run with every gradient zero: AdamW's exp_avg and exp_avg_sq stay zero, as in the nested layout
    titan_step(tmp_path / "zero", 1, loss_scale=0.0)
    code, out, _ = run(capsys, "check", str(tmp_path / "zero"))
    assert code == 1, out
    problem = next(line for line in out.splitlines() if "[zero-moments]" in line)
    assert f"{2 * len(weights)} optimizer moment buffers are all zero: " in problem
    assert 'ckpt["optimizer"]["state.0.weight.exp_avg"], ckpt["optimizer"]["state.0.weight.exp_avg_sq"]' in problem
    # each flattened entry is optimizer state to the reports (its float step counter too), never a parameter
    tensors = dict(iter_tensors(open_checkpoint(str(tmp_path / "zero")).root))
    roles = {path[-1]: tensor_role(path, tensor, ()) for path, tensor in tensors.items() if path[0] == "optimizer"}
    assert roles["state.0.weight.exp_avg"] == roles["state.0.weight.step"] == "optimizer state"
    # a model's own submodule named state (its key state.fc.weight) is no optimizer state
    assert tensor_role(("state.fc.weight",), tensors[("0.weight",)]) == "parameter"
