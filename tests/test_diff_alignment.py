"""``diff`` that understands wrappers: keys that match only under a subtree or without a wrapper prefix are
said so, with the exact command; long keys are shortened, their numbers and last components kept."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import torch
from torch import nn

from ckpt_tui.cli import main
from ckpt_tui.core.values.text_plots import shorten


def files(tmp_path: Path) -> tuple[str, str]:
    """A bare state_dict and the DDP training checkpoint it was extracted from."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    wrapped = nn.DataParallel(model)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9)
    wrapped(torch.randn(4, 4)).sum().backward()
    optimizer.step()
    run = {"model_state_dict": wrapped.state_dict(), "optimizer_state_dict": optimizer.state_dict(), "epoch": 1}
    torch.save(run, tmp_path / "run.pth")
    torch.save(model.state_dict(), tmp_path / "bare.pth")
    return str(tmp_path / "bare.pth"), str(tmp_path / "run.pth")


def test_diff_says_the_keys_match_under_a_subtree_without_the_wrapper_and_gives_the_command(tmp_path, capsys):
    bare, run = files(tmp_path)
    assert main(["diff", bare, run]) == 1
    text = capsys.readouterr().out
    note = next(line for line in text.splitlines() if line.startswith("note: the keys match"))
    assert """under ckpt["model_state_dict"] with 'module.' stripped in B: 9 of 9 tensors that way""" in note
    command = note.split("compare that way with ", 1)[1]
    assert command == f"ckpt-tui diff {bare} {run} --at-b model_state_dict --strip-prefix-b module."
    assert main(shlex.split(command)[1:]) == 0
    assert capsys.readouterr().out.startswith("identical")


def test_diff_the_other_way_round_names_side_a_and_json_has_the_options(tmp_path, capsys):
    bare, run = files(tmp_path)
    assert main(["diff", run, bare, "--json"]) == 1
    alignment = json.loads(capsys.readouterr().out)["alignment"]
    assert alignment["options"] == ["--at-a", "model_state_dict", "--strip-prefix-a", "module."]
    assert alignment["matched"] == alignment["total"] == 9 and alignment["before"] == 0


def test_no_note_when_the_keys_already_match(tmp_path, capsys):
    bare, _ = files(tmp_path)
    state = torch.load(bare, weights_only=True)
    state["extra"] = torch.ones(2)
    torch.save(state, tmp_path / "more.pth")
    assert main(["diff", bare, str(tmp_path / "more.pth"), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["alignment"] is None


def test_diff_stats_says_how_to_compare_the_model_weights(tmp_path, capsys):
    bare, run = files(tmp_path)
    assert main(["diff", bare, run, "--stats"]) == 1
    assert "compare that way with --at-b model_state_dict --strip-prefix-b module." in capsys.readouterr().out


def test_long_keys_are_shortened_keeping_their_numbers_and_last_components():
    key = "model_state_dict/module.layer1.0.conv1.weight"
    assert shorten(key, 30) == "…module.layer1.0.conv1.weight"
    assert shorten(key, 20) == "…yer1.0.conv1.weight"
    assert shorten('ckpt["optimizer_state_dict"]["state"][0]["step"]', 30) == '…["state"][0]["step"]'
    assert shorten("short.key", 30) == "short.key"
    assert all(len(shorten(key, width)) <= width for width in range(1, len(key)))


def test_a_key_of_a_side_taken_another_way_leads_back_to_its_path_in_the_file(tmp_path):
    """What the browser's realigned diff jumps by: each key of B taken under ``model_state_dict`` with
    ``module.`` stripped is found again at its place in the training checkpoint."""
    from ckpt_tui.core.model.tree import get
    from ckpt_tui.core.operations.diff import alignment, key_paths
    from ckpt_tui.core.readers.open import open_checkpoint

    bare, run = files(tmp_path)
    a, b = open_checkpoint(bare), open_checkpoint(run)
    found = alignment(a.root, b.root)
    assert found is not None
    taken = found.b.take(b.root)
    paths = key_paths(taken)
    assert set(paths) == set(torch.load(bare))
    for key, path in paths.items():
        source = found.b.source_path(b.root, path)
        assert source == ("model_state_dict", f"module.{key}")
        assert get(b.root, source) is get(taken, path)
