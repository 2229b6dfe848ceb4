"""The fix a compare report offers is one edit with two faces: ``f`` stages it in the browser (after its preview)
and the report prints the ``convert`` command for the file on disk. Both must do the same: the command, pasted as
a user pastes it, writes exactly the tree the preview stages (every drop, strip, rename and extract), and that file
loads into the reference model strictly, or with ``strict=False`` leaving exactly the keys the report says.

The files are what training code writes: a DataParallel run whose head was renamed and resized, a model whose two
heads changed class count, model keys at the root beside training state (torchtitan's step, DDP's prefix), and a
PEFT model's state_dict against its base model."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_tui import browser, loaded, settle
from printed_commands import Shell
from torch import nn

from ckpt_tui.cli import main
from ckpt_tui.core.operations.diff import leaves
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.screens.compare import CompareScreen


class Old(nn.Module):
    """As trained: a 10-class head named ``fc``."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16))
        self.fc = nn.Linear(16, 10)


class New(nn.Module):
    """As now: the same features, a 5-class head renamed ``head``."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16))
        self.head = nn.Linear(16, 5)


class TwoHeads(nn.Module):
    """An auxiliary head mid-model and the last one, both sized by the class count."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.early = nn.Linear(8, 8)
        self.aux = nn.Linear(8, classes)
        self.late = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
        self.fc = nn.Linear(8, classes)


def _titan_model() -> nn.Module:
    return nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 16), nn.LayerNorm(16))


def _renamed_head(folder: Path) -> nn.Module:
    torch.manual_seed(0)
    old = nn.DataParallel(Old())
    optimizer = torch.optim.AdamW(old.parameters())
    torch.save({"epoch": 3, "model": old.state_dict(), "optimizer": optimizer.state_dict()}, folder / "source.pth")
    return New()


def _new_class_count(folder: Path) -> nn.Module:
    torch.manual_seed(0)
    torch.save(TwoHeads(10).state_dict(), folder / "source.pth")
    return TwoHeads(3)


def _root_beside_training_state(folder: Path) -> nn.Module:
    torch.manual_seed(0)
    model = nn.DataParallel(_titan_model())
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randint(0, 50, (2, 3))).sum().backward()
    optimizer.step()
    state = {**model.state_dict(), "train_state": {"step": 1}, "loss_scale": torch.tensor(1.0)}
    torch.save(state, folder / "source.pth")
    return _titan_model()


def _peft_model(folder: Path) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    config = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    base = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config, num_key_value_heads=1, vocab_size=64))
    reference = transformers.LlamaForCausalLM(base.config)
    reference.load_state_dict(base.state_dict())
    model = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    torch.save(model.state_dict(), folder / "source.pth")
    return reference


CASES: dict[str, Callable[[Path], nn.Module]] = {
    "a renamed and resized head under DataParallel": _renamed_head,
    "two heads of a new class count": _new_class_count,
    "model keys at the root beside training state": _root_beside_training_state,
    "a PEFT model against its base model": _peft_model,
}


def _tree(root: Any) -> dict[tuple[Any, ...], str]:
    """Every leaf of a tree by its path: a tensor by its shape and dtype, any other value by its text."""
    shown = {}
    for path, value in leaves(root).items():
        shape = getattr(value, "shape", None)
        shown[tuple(path)] = f"{list(shape)} {value.dtype}" if shape is not None else repr(value)
    return shown


@pytest.mark.parametrize("name", list(CASES))
async def test_the_printed_command_writes_what_f_stages_and_it_loads_as_the_report_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    model = CASES[name](tmp_path)
    source, reference = tmp_path / "source.pth", tmp_path / "reference.pth"
    torch.save(model.state_dict(), reference)
    assert main(["check", str(source), "--against", str(reference), "--json"]) == 1
    suggestion = json.loads(capsys.readouterr().out)["suggestion"]
    # the browser's report on the same pair, its fix staged with f (after its preview)
    app = CkptApp(str(source))
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "c")
        app.screen.query_one("Input").value = str(reference)
        await settle(pilot, "enter")
        screen = app.screen
        assert isinstance(screen, CompareScreen) and screen.report is not None
        assert screen.report.suggestion is not None
        assert screen.report.suggestion.argv(str(source)) == suggestion["argv"]
        await settle(pilot, "f", "y")
        assert app.session is not None and app.session.edited
        staged = _tree(app.session.root)
    # the command, pasted as printed, writes exactly that tree
    shell = Shell(tmp_path)
    done = shell.paste(suggestion["command"])
    assert done.returncode == 0, done.stderr
    (output,) = [arg for argv in shell.invocations() for arg in argv[argv.index("--output") + 1 :][:1]]
    written = Path(tmp_path, output)
    assert _tree(open_checkpoint(str(written)).root) == staged
    # and it loads as the report says: strictly when it fits, else with strict=False leaving its missing keys
    state = torch.load(written, weights_only=True)
    if suggestion["full_match"]:
        model.load_state_dict(state, strict=True)
    else:
        result = model.load_state_dict(state, strict=False)
        assert sorted(result.missing_keys) == sorted(suggestion["missing"]) and not result.unexpected_keys


async def test_at_a_subtree_f_fixes_it_in_place_as_the_command_writes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _renamed_head(tmp_path)
    source, reference = tmp_path / "source.pth", tmp_path / "reference.pth"
    torch.save(model.state_dict(), reference)
    assert main(["check", str(source), "--against", str(reference), "--at", "model", "--json"]) == 1
    suggestion = json.loads(capsys.readouterr().out)["suggestion"]
    app = CkptApp(str(source))
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await loaded(pilot)
        browser(app).tree_view.reveal((("model",), None))
        await settle(pilot, "c")
        app.screen.query_one("Input").value = str(reference)
        await settle(pilot, "enter")
        await settle(pilot, "f", "y")
        assert app.session is not None
        staged = app.session.root
    # the rest of the file stays staged beside the fixed state_dict, which is what the command writes alone
    assert sorted(staged) == ["epoch", "model", "optimizer"]
    shell = Shell(tmp_path)
    assert shell.paste(suggestion["command"]).returncode == 0
    written = tmp_path / "source.fixed.pth"
    assert _tree(open_checkpoint(str(written)).root) == _tree(staged["model"])
    result = model.load_state_dict(torch.load(written, weights_only=True), strict=False)
    assert sorted(result.missing_keys) == sorted(suggestion["missing"]) == ["head.bias", "head.weight"]
