"""One round to a fit: a DDP training checkpoint's fixes reach a loadable state_dict in one command,
and a head of another size is named, dropped and said to keep the model's fresh init."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import torch
from torch import nn

from ckpt_tui.cli import main


def net(classes: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16, 16), nn.Linear(16, classes)
    )


def ddp_run(tmp_path: Path) -> Path:
    """A training checkpoint saved the way DataParallel/DDP users save it."""
    model = nn.DataParallel(net(10))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 3, 6, 6)).sum().backward()
    optimizer.step()
    path = tmp_path / "run.pth"
    torch.save(
        {"epoch": 2, "model_state_dict": model.state_dict(), "optimizer_state_dict": optimizer.state_dict()}, path
    )
    return path


def run_printed(command: str) -> int:
    argv = shlex.split(command)
    assert argv[:2] == ["ckpt-tui", "convert"]
    return main(argv[1:])


def test_info_gives_one_fix_that_extracts_and_strips_and_the_result_fits(tmp_path, capsys):
    run = ddp_run(tmp_path)
    torch.save(net(10).state_dict(), tmp_path / "bare.pth")
    assert main(["info", str(run)]) == 0
    text = capsys.readouterr().out
    fixes = [line.split("fix: ", 1)[1] for line in text.splitlines() if "fix: " in line or "if needed: " in line]
    assert len(fixes) == 1 and "--extract model_state_dict" in fixes[0] and "--strip-prefix module." in fixes[0]
    assert run_printed(fixes[0]) == 0
    capsys.readouterr()
    assert main(["check", str(tmp_path / "run.fixed.pth"), "--against", str(tmp_path / "bare.pth")]) == 0
    net(10).load_state_dict(torch.load(tmp_path / "run.fixed.pth", weights_only=True))


def test_info_json_lists_every_option_of_the_combined_fix(tmp_path, capsys):
    assert main(["info", str(ddp_run(tmp_path)), "--json"]) == 0
    findings = json.loads(capsys.readouterr().out)["findings"]
    combined = [f for f in findings if f.get("fix_options") and len(f["fix_options"]) == 2]
    assert combined[0]["fix_options"] == [["--extract", "model_state_dict"], ["--strip-prefix", "module."]]


def test_check_names_a_head_of_another_size_in_the_first_run_and_drops_it(tmp_path, capsys):
    run = ddp_run(tmp_path)
    torch.save(net(100).state_dict(), tmp_path / "other_head.pth")
    assert main(["check", str(run), "--against", str(tmp_path / "other_head.pth")]) == 1
    text = capsys.readouterr().out
    assert "5.weight: [10, 16] vs [100, 16]" in text and "5.bias: [10] vs [100]" in text
    assert "keeps the model's fresh init for 5.weight, 5.bias" in text
    command = next(line.strip() for line in text.splitlines() if line.strip().startswith("ckpt-tui convert"))
    assert "--drop module.5.weight" in command and "--drop module.5.bias" in command
    assert run_printed(command) == 0
    model = net(100)
    fresh = model[5].weight.clone()
    result = model.load_state_dict(torch.load(tmp_path / "run.fixed.pth", weights_only=True), strict=False)
    assert sorted(result.missing_keys) == ["5.bias", "5.weight"] and not result.unexpected_keys
    assert torch.equal(model[5].weight, fresh)


def test_check_json_names_the_resized_keys(tmp_path, capsys):
    run = ddp_run(tmp_path)
    torch.save(net(100).state_dict(), tmp_path / "other_head.pth")
    assert main(["check", str(run), "--against", str(tmp_path / "other_head.pth"), "--json"]) == 1
    suggestion = json.loads(capsys.readouterr().out)["suggestion"]
    assert {"key": "module.5.weight", "checkpoint": [10, 16], "reference": [100, 16]} in suggestion["resized"]
