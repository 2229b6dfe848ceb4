"""What torch.load(weights_only=True) makes of a tree before it is saved is what the writer says after saving it,
and what the real torch.load does with the file; info names a refusal over plain data that its reader met."""

from __future__ import annotations

import argparse
import os
import pickle
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from builders import Payload, touch_command

from ckpt_tui.cli import main
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.writers.judge import judge_tree
from ckpt_tui.core.writers.save import save


def trees() -> dict[str, Any]:
    """Checkpoints torch loads, and ones it refuses over data."""
    state = OrderedDict(w=torch.ones(2, 3), b=torch.zeros(3))
    return {
        "state_dict": state,
        "training": {"model": state, "epoch": 3, "best": 0.5, "names": ["a", "b"]},
        "namespace": {"model": state, "args": argparse.Namespace(lr=0.1)},
        "numpy": {"model": state, "stats": np.array([1.0, 2.0]), "best": np.float64(0.5)},
        "parameter": {"p": torch.nn.Parameter(torch.ones(2))},
    }


def torch_loads(path: Path) -> bool:
    try:
        torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        return False
    return True


@pytest.mark.parametrize("name", list(trees()))
def test_the_verdict_before_saving_is_the_writers_and_torchs(tmp_path: Path, name: str) -> None:
    torch.save(trees()[name], tmp_path / "in.pth")
    checkpoint = open_checkpoint(str(tmp_path / "in.pth"))
    before = judge_tree(checkpoint.root)
    assert before.refusal is None and before.verdict is not None
    result = save(checkpoint.root, tmp_path / "out.pth")
    assert result.weights_only is not None
    assert result.weights_only.answer == before.verdict.answer
    assert [b.name for b in result.weights_only.blockers] == [b.name for b in before.verdict.blockers]
    assert before.verdict.loads is torch_loads(tmp_path / "out.pth")
    assert result.short().startswith("loads with" if before.verdict.loads else "torch.load(weights_only=True) REFUSES")


def test_code_is_judged_but_never_written(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    torch.save({"w": torch.ones(2), "payload": Payload(os.system, touch_command(canary))}, tmp_path / "in.pth")
    checkpoint = open_checkpoint(str(tmp_path / "in.pth"))
    outlook = judge_tree(checkpoint.root)
    assert outlook.refusal is not None and "posix.system" in outlook.refusal
    assert outlook.verdict is not None and outlook.verdict.loads is False
    assert [(b.name, b.kind) for b in outlook.verdict.blockers] == [("posix.system", "code")]
    assert not canary.exists()


def test_info_names_a_refusal_over_data_and_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "odd.pth"
    torch.save(trees()["namespace"] | {"stats": np.array([1.0])}, path)
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "weights_only=True" in line)
    assert line.strip() == (
        '! torch.load(weights_only=True) refuses it over data, not code: argparse.Namespace at ckpt["args"]; '
        'numpy at ckpt["stats"]'
    )
    command = next(line for line in out.splitlines() if "--sanitize" in line).split("fix: ")[1]
    argv = command.split()
    assert main(argv[1:]) == 0
    assert torch_loads(Path(argv[argv.index("--output") + 1]))


def test_info_of_a_file_torch_loads_says_nothing_of_weights_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.save(trees()["training"], tmp_path / "t.pth")
    main(["info", str(tmp_path / "t.pth")])
    assert "weights_only" not in capsys.readouterr().out


def test_check_of_safetensors_gives_no_torch_load_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import save_file

    save_file({"w": torch.ones(2)}, tmp_path / "m.safetensors")
    main(["check", str(tmp_path / "m.safetensors")])
    out = capsys.readouterr().out
    assert "torch.load loads it" not in out and "weights_only: n/a: safetensors has no pickle" in out


def test_a_verdict_that_cannot_be_made_never_fails_the_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckpt_tui.core.runtime import forked
    from ckpt_tui.core.writers import judge

    def broken(*args: Any) -> Any:
        raise RuntimeError("judging failed")

    monkeypatch.setattr(forked, "fork", lambda work: None)  # judged in this process
    monkeypatch.setattr(judge, "scan_written", broken)
    torch.save(trees()["state_dict"], tmp_path / "in.pth")
    result = save(open_checkpoint(str(tmp_path / "in.pth")).root, tmp_path / "out.pth")
    assert result.weights_only is not None and result.weights_only.answer == "cannot_tell"
    assert result.short().startswith("CANNOT TELL") and torch_loads(tmp_path / "out.pth")


def test_check_of_safetensors_shards_gives_no_torch_load_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from huggingface_hub import save_torch_state_dict

    folder = tmp_path / "hf"
    folder.mkdir()
    save_torch_state_dict({f"l{i}.weight": torch.ones(64, 64) for i in range(4)}, folder, max_shard_size="40KB")
    assert len(list(folder.glob("*.safetensors"))) > 1
    main(["check", str(folder)])
    out = capsys.readouterr().out
    assert "torch.load loads it" not in out and "weights_only: n/a: safetensors shards hold no pickle" in out


def test_the_saved_line_keeps_the_typed_name_whole_and_shortens_the_verdict_words(tmp_path: Path) -> None:
    torch.save(trees()["state_dict"], tmp_path / "in.pth")
    name = "fsdp_model.consolidated.fixed.pth"
    result = save(open_checkpoint(str(tmp_path / "in.pth")).root, tmp_path / name)
    assert result.short(100) == f"loads with torch.load(weights_only=True) · saved {name}, verified"
    assert result.short(78) == f"loads (weights_only) · saved {name}, verified"
    # only a name that does not fit beside the short words is cut, in its middle
    assert result.short(40).endswith("· saved fsdp….pth, verified")
