"""Training state, audited: real optimizers and schedulers stepped with torch, saved as plain training dicts and in
the layout Lightning writes; ``info``, ``check`` and the browser header say what would make a resume go wrong."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_tui import header, loaded

from ckpt_tui.cli import main
from ckpt_tui.tui.app import CkptApp

STEPS = 6


def model(width: int = 8) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.BatchNorm1d(width), torch.nn.Linear(width, 2))


def trained(
    optimizer_name: str = "adam", steps: int = STEPS, scheduler_name: str = "step", width: int = 8
) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    """A model trained ``steps`` optimizer steps, its scheduler stepped once per step (OneCycle, Lambda) or
    every 3 steps (StepLR: an 'epoch' of 3 batches)."""
    net = model(width)
    groups = [{"params": net[0].parameters()}, {"params": [*net[1].parameters(), *net[2].parameters()], "lr": 1e-4}]
    if optimizer_name == "adam":
        optimizer: torch.optim.Optimizer = torch.optim.Adam(groups, lr=1e-3)
    elif optimizer_name == "adamw":
        optimizer = torch.optim.AdamW(groups, lr=1e-3)
    else:
        optimizer = torch.optim.SGD(groups, lr=0.1, momentum=0.9)
    if scheduler_name == "onecycle":
        scheduler: Any = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=[1e-2, 1e-3], total_steps=STEPS)
    elif scheduler_name == "lambda":
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.9**step)
    else:
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    for step in range(steps):
        net(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if scheduler_name != "step" or step % 3 == 2:
            scheduler.step()
    return net, optimizer, scheduler


def plain(net: torch.nn.Module, optimizer: Any, scheduler: Any, **counters: Any) -> dict[str, Any]:
    return {
        "model": net.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        **counters,
    }


def lightning(net: torch.nn.Module, optimizer: Any, scheduler: Any, epoch: int, global_step: int) -> dict[str, Any]:
    """The keys Lightning 2.x writes (no Lightning installed)."""
    return {
        "epoch": epoch,
        "global_step": global_step,
        "pytorch-lightning_version": "2.4.0",
        "state_dict": OrderedDict(("model." + k, v) for k, v in net.state_dict().items()),
        "loops": {"fit_loop": {"epoch_progress": {}}},
        "callbacks": {},
        "optimizer_states": [optimizer.state_dict()],
        "lr_schedulers": [scheduler.state_dict()],
        "hparams_name": "kwargs",
    }


def findings(tmp_path: Path, capsys: pytest.CaptureFixture[str], checkpoint: dict[str, Any]) -> list[dict[str, Any]]:
    path = tmp_path / "ckpt.pth"
    torch.save(checkpoint, path)
    assert main(["info", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["findings"]


def by_kind(found: list[dict[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for finding in found:
        out.setdefault(finding["kind"], []).append(finding["message"])
    return out


def warnings(found: list[dict[str, Any]]) -> list[str]:
    return [f["kind"] for f in found if f["severity"] == "warning"]


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_consistent_adam_checkpoint_has_notes_with_lr_groups_and_steps_and_no_warning(tmp_path, capsys, name):
    net, optimizer, scheduler = trained(name)
    found = findings(tmp_path, capsys, plain(net, optimizer, scheduler, epoch=2, global_step=STEPS))
    kinds = by_kind(found)
    assert warnings(found) == []
    assert kinds["optimizer"] == [
        'optimizer state at ckpt["optimizer"]: Adam-style, 2 param groups (lr 0.00025, 2.5e-05), 6 parameters, step 6'
    ]
    assert kinds["scheduler"] == ['LR scheduler state at ckpt["scheduler"]: last_epoch 2, lr 0.00025, 2.5e-05']
    assert optimizer.state_dict()["state"][0]["step"].item() == STEPS  # what the finding read from the file


def test_step_that_disagrees_with_global_step_is_a_warning_and_check_fails(tmp_path, capsys):
    net, optimizer, scheduler = trained()
    checkpoint = plain(net, optimizer, scheduler, epoch=2, global_step=10)
    kinds = by_kind(findings(tmp_path, capsys, checkpoint))
    assert kinds["step-mismatch"] == [
        'optimizer step 6 at ckpt["optimizer"] but global_step is 10: '
        "resuming pairs the schedule and bias correction with the wrong step"
    ]
    assert main(["check", str(tmp_path / "ckpt.pth")]) == 1
    assert "[step-mismatch]" in capsys.readouterr().out


def test_lightning_layout_consistent_and_mismatched(tmp_path, capsys):
    net, optimizer, scheduler = trained()
    found = findings(tmp_path, capsys, lightning(net, optimizer, scheduler, epoch=2, global_step=STEPS))
    assert warnings(found) == ["inner-state-dict"]  # extract and strip, one fix
    assert 'optimizer state at ckpt["optimizer_states"][0]: Adam-style' in by_kind(found)["optimizer"][0]
    assert by_kind(found)["scheduler"][0].startswith('LR scheduler state at ckpt["lr_schedulers"][0]: last_epoch 2')
    found = findings(tmp_path, capsys, lightning(net, optimizer, scheduler, epoch=2, global_step=12))
    assert "global_step is 12" in by_kind(found)["step-mismatch"][0]


def test_fresh_optimizer_never_stepped_while_epochs_ran_is_a_warning(tmp_path, capsys):
    net, optimizer, scheduler = trained(steps=0)
    found = findings(tmp_path, capsys, plain(net, optimizer, scheduler, epoch=3))
    kinds = by_kind(found)
    assert "never stepped (no state)" in kinds["optimizer"][0]
    assert kinds["optimizer-fresh"] == [
        'optimizer at ckpt["optimizer"] has no state (never stepped, or saved fresh) while the checkpoint says '
        "epoch 3: resuming restarts its moments"
    ]
    assert 'LR scheduler at ckpt["scheduler"] never stepped (last_epoch 0)' in kinds["scheduler-fresh"][0]


def test_optimizer_of_a_model_of_another_size_is_a_warning(tmp_path, capsys):
    _net, optimizer, scheduler = trained(width=16)
    checkpoint = plain(model(8), optimizer, scheduler, epoch=2, global_step=STEPS)
    kinds = by_kind(findings(tmp_path, capsys, checkpoint))
    assert "holds state shaped [16, 4], [16], [2, 16] that no model parameter has" in kinds["optimizer-shapes"][0]
    small = torch.nn.Linear(4, 2)
    checkpoint = plain(small, optimizer, scheduler, epoch=2, global_step=STEPS)
    kinds = by_kind(findings(tmp_path, capsys, checkpoint))
    assert kinds["optimizer-size"][0].startswith(
        'optimizer at ckpt["optimizer"] covers 6 parameters, the model holds 2'
    )
    with pytest.raises(ValueError):  # torch agrees: the state does not fit that model's optimizer
        torch.optim.Adam(small.parameters()).load_state_dict(optimizer.state_dict())


def test_optimizer_covering_fewer_parameters_than_the_model_is_a_note(tmp_path, capsys):
    net = model()
    optimizer = torch.optim.Adam(net[2].parameters())
    net(torch.randn(4, 4)).sum().backward()
    optimizer.step()
    found = findings(
        tmp_path, capsys, {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "global_step": 1}
    )
    assert warnings(found) == []
    assert by_kind(found)["optimizer-coverage"] == [
        'optimizer at ckpt["optimizer"] covers 2 of the model\'s 6 tensors (frozen parameters, buffers the file '
        "cannot tell from parameters, or several optimizers)"
    ]


def test_an_optimizer_over_the_biases_alone_is_not_taken_for_zero_partitions(tmp_path, capsys):
    """1-D state shaped as the model's biases is a plain optimizer over some parameters, not DeepSpeed's flat
    partitions (which have lengths no parameter has)."""
    net = model()
    optimizer = torch.optim.Adam([p for p in net.parameters() if p.dim() == 1])
    net(torch.randn(4, 4)).sum().backward()
    optimizer.step()
    found = findings(
        tmp_path, capsys, {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "global_step": 1}
    )
    assert not any("flat vector" in f["message"] or "ZeRO" in f["message"] for f in found), found
    assert by_kind(found)["optimizer-coverage"][0].startswith('optimizer at ckpt["optimizer"] covers ')


def test_plain_sgd_keeps_no_state_and_is_not_said_never_stepped(tmp_path, capsys):
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)  # (no momentum: no per-parameter state)
    for _ in range(3):
        net(torch.randn(4, 4)).sum().backward()
        optimizer.step()
    checkpoint = {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "global_step": 3}
    kinds = by_kind(findings(tmp_path, capsys, checkpoint))
    assert "no per-parameter state (none kept without momentum)" in kinds["optimizer"][0]
    assert "never stepped" not in kinds["optimizer"][0] and "optimizer-fresh" not in kinds


def test_sgd_with_momentum_is_described_without_steps(tmp_path, capsys):
    net, optimizer, scheduler = trained("sgd")
    found = findings(tmp_path, capsys, plain(net, optimizer, scheduler, epoch=2))
    assert warnings(found) == []
    assert (
        "SGD-style, 2 param groups (lr 0.025, 2.5e-05), 6 parameters, no per-parameter step"
        in by_kind(found)["optimizer"][0]
    )


def test_onecycle_at_its_total_steps_is_a_warning_torch_agrees_it_cannot_step(tmp_path, capsys):
    net, optimizer, scheduler = trained(scheduler_name="onecycle")
    kinds = by_kind(findings(tmp_path, capsys, plain(net, optimizer, scheduler, global_step=STEPS)))
    assert "last_epoch 6 of total_steps 6" in kinds["scheduler"][0]
    assert "stepping it again raises (OneCycleLR)" in kinds["scheduler-finished"][0]
    with pytest.raises(ValueError):
        scheduler.step()


def test_lambda_scheduler_says_its_functions_are_not_saved(tmp_path, capsys):
    net, optimizer, scheduler = trained(scheduler_name="lambda")
    saved = scheduler.state_dict()
    assert saved["lr_lambdas"] == [None, None]  # torch keeps only callable objects' __dict__, never a lambda
    kinds = by_kind(findings(tmp_path, capsys, plain(net, optimizer, scheduler, global_step=STEPS)))
    assert "its lr_lambda functions are not saved (resuming needs the same code)" in kinds["scheduler"][0]
    assert "scheduler-mismatch" not in kinds


def test_scheduler_matching_neither_epoch_nor_step_is_a_warning(tmp_path, capsys):
    net, optimizer, scheduler = trained()
    checkpoint = plain(net, optimizer, scheduler, epoch=5, global_step=STEPS)
    checkpoint["scheduler"]["last_epoch"] = 11
    kinds = by_kind(findings(tmp_path, capsys, checkpoint))
    assert "last_epoch 11, matching neither epoch 5 nor global_step 6" in kinds["scheduler-mismatch"][0]


def test_a_scheduler_stepped_per_epoch_is_no_mismatch(tmp_path, capsys):
    """chgnet's published checkpoints: CosineAnnealingLR stepped once per epoch, no epoch counter saved,
    the optimizer at step 996,744. Below every counter, a scheduler may step per epoch or every few steps."""
    net, optimizer, scheduler = trained(steps=12)  # StepLR stepped every 3 optimizer steps
    assert scheduler.last_epoch == 4
    kinds = by_kind(findings(tmp_path, capsys, plain(net, optimizer, scheduler)))
    assert "scheduler-mismatch" not in kinds
    kinds = by_kind(findings(tmp_path, capsys, plain(net, optimizer, scheduler, global_step=12)))
    assert "scheduler-mismatch" not in kinds


def test_a_scheduler_stepped_per_optimizer_step_is_no_mismatch(tmp_path, capsys):
    """OneCycle and warmup schedules step once per optimizer step; only the epoch is saved beside them."""
    net, optimizer, scheduler = trained(steps=12, scheduler_name="lambda")
    assert scheduler.last_epoch == 12
    kinds = by_kind(findings(tmp_path, capsys, plain(net, optimizer, scheduler, epoch=2)))
    assert "scheduler-mismatch" not in kinds


def test_zero_moment_buffers_are_found_by_check_not_by_info(tmp_path, capsys):
    net, optimizer, scheduler = trained()
    checkpoint = plain(net, optimizer, scheduler, epoch=2, global_step=STEPS)
    for entry in checkpoint["optimizer"]["state"].values():
        entry["exp_avg"].zero_()
    found = findings(tmp_path, capsys, checkpoint)
    assert warnings(found) == []  # info reads no moment buffer
    assert main(["check", str(tmp_path / "ckpt.pth"), "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    (zero,) = [p for p in problems if p["kind"] == "zero-moments"]
    assert zero["message"].startswith(
        '6 optimizer moment buffers are all zero: ckpt["optimizer"]["state"][0]["exp_avg"]'
    )
    assert zero["path"] == ["optimizer", "state", 0, "exp_avg"]


async def test_browser_header_shows_the_resume_warning(tmp_path):
    net, optimizer, scheduler = trained()
    path = tmp_path / "ckpt.pth"
    torch.save(plain(net, optimizer, scheduler, epoch=2, global_step=10), path)
    app = CkptApp(str(path))
    async with app.run_test(size=(160, 30)) as pilot:
        await loaded(pilot)
        top = header(app)
        assert '! optimizer step 6 at ckpt["optimizer"] but global_step is 10' in top


def test_a_tensor_beside_the_weights_leaves_them_found(tmp_path: Path, capsys: Any) -> None:
    # torch's general-checkpoint tutorial with the loss kept as a tensor: the weights are still the model's
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    path = tmp_path / "tutorial.pth"
    torch.save({"epoch": 3, "model_state_dict": model.state_dict(), "loss": torch.tensor(0.25)}, path)
    out = tmp_path / "model.safetensors"
    assert main(["convert", str(path), "--extract", "auto", "-o", str(out)]) == 0
    from safetensors.torch import load_file

    assert sorted(load_file(out)) == sorted(model.state_dict())
