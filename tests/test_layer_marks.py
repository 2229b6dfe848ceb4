"""Marks on real (tiny) training runs: none on a healthy run, each planted fault and nothing else."""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

import pytest
import torch
from training_runs import FAULTY, PLANTED, planted, train

from ckpt_tui.cli import main
from ckpt_tui.core.conventions.layer_marks import families, marks
from ckpt_tui.core.model.keypath import to_slash
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.values.tensor_table import tensor_paths, tensor_rows

RUNS = list(itertools.product(("resnet", "transformer", "gpt2", "gpt2-untied"), ("adamw", "sgd"), (False, True)))
MOMENTS = {"adamw": ("exp_avg", "exp_avg_sq"), "sgd": ("momentum_buffer",)}


@functools.cache
def trained(kind: str, optimizer: str, amp: bool, frozen: bool = False, steps: int = 20) -> dict:
    return train(kind, optimizer, amp, frozen=frozen, steps=steps)


def marked(tmp_path: Path, checkpoint: dict) -> dict[str, str]:
    torch.save(checkpoint, tmp_path / "run.pth")
    rows = list(tensor_rows(tensor_paths(open_checkpoint(str(tmp_path / "run.pth")).root)))
    found = marks(rows)
    return {to_slash(row.path): found[id(row)] for row in rows if id(row) in found}


def state_index(checkpoint: dict, key: str) -> int:
    """The optimizer's index of a parameter: its place among the model's parameters."""
    names = [k for k, v in checkpoint["model_state_dict"].items() if v.is_floating_point() and "running" not in k]
    return names.index(key)


@pytest.mark.parametrize(("kind", "optimizer", "amp"), RUNS)
def test_a_healthy_training_run_has_no_marks(tmp_path, kind, optimizer, amp):
    assert marked(tmp_path, trained(kind, optimizer, amp)) == {}


@pytest.mark.parametrize(("kind", "optimizer", "amp"), RUNS)
def test_each_planted_fault_is_marked_and_nothing_else(tmp_path, kind, optimizer, amp):
    clean = trained(kind, optimizer, amp)
    key = f"model_state_dict/{FAULTY[kind]}"
    expected = {"nan": "!! NaN", "scaled": "!! norm", "zeroed": "dead"}
    for fault in PLANTED:
        assert marked(tmp_path, planted(clean, kind, fault)) == {key: expected[fault]}, fault
    frozen = trained(kind, optimizer, amp, frozen=True)
    index = state_index(frozen, FAULTY[kind])
    assert marked(tmp_path, frozen) == {
        f"optimizer_state_dict/state/{index}/{moment}": "dead" for moment in MOMENTS[optimizer]
    }


@pytest.mark.parametrize("kind", ["gpt2", "gpt2-untied"])
def test_a_gpt2_after_three_adamw_steps_has_no_marks_and_each_planted_fault_is_marked(tmp_path, kind):
    clean = trained(kind, "adamw", False, steps=3)
    assert marked(tmp_path, clean) == {}
    key = f"model_state_dict/{FAULTY[kind]}"
    expected = {"nan": "!! NaN", "scaled": "!! norm", "zeroed": "dead"}
    for fault in PLANTED:
        assert marked(tmp_path, planted(clean, kind, fault)) == {key: expected[fault]}, fault
    frozen = trained(kind, "adamw", False, frozen=True, steps=3)
    index = state_index(frozen, FAULTY[kind])
    assert marked(tmp_path, frozen) == {f"optimizer_state_dict/state/{index}/{m}": "dead" for m in MOMENTS["adamw"]}


def test_moments_spread_by_depth_as_gradients_do_are_not_marked(tmp_path):
    # GPT-2 small after 3 AdamW steps: the first pre-LayerNorm block's bias moments are 11 times the
    # median of the 12 blocks' (squares 116 times), falling smoothly with depth; a healthy run
    checkpoint = trained("gpt2", "adamw", False, steps=3)
    optimizer = checkpoint["optimizer_state_dict"]
    first = state_index(checkpoint, "transformer.h.0.attn.c_attn.bias")
    state = {index: dict(moments) for index, moments in optimizer["state"].items()}
    state[first] = {
        **state[first],
        "exp_avg": state[first]["exp_avg"] * 12,
        "exp_avg_sq": state[first]["exp_avg_sq"] * 120,
    }
    spread = {**checkpoint, "optimizer_state_dict": {**optimizer, "state": state}}
    assert marked(tmp_path, spread) == {}
    # two orders of magnitude past its family is still marked (a squared moment: four)
    state[first] = {
        **state[first],
        "exp_avg": state[first]["exp_avg"] * 30,
        "exp_avg_sq": state[first]["exp_avg_sq"] * 900,
    }
    assert marked(tmp_path, spread) == {
        f"optimizer_state_dict/state/{first}/exp_avg": "!! norm",
        f"optimizer_state_dict/state/{first}/exp_avg_sq": "!! norm",
    }


def test_biases_spread_by_depth_as_their_updates_are_not_marked(tmp_path):
    # GPT-2 small after 3 SGD steps: the first block's zero-initialised c_attn.bias is 9.6 times its
    # family's median, being the sum of its updates; a weight that far is marked
    checkpoint = trained("gpt2", "sgd", False, steps=3)
    weights = dict(checkpoint["model_state_dict"])
    weights["transformer.h.0.attn.c_attn.bias"] = weights["transformer.h.0.attn.c_attn.bias"] * 12
    assert marked(tmp_path, {**checkpoint, "model_state_dict": weights}) == {}
    weights["transformer.h.0.attn.c_attn.bias"] = weights["transformer.h.0.attn.c_attn.bias"] * 30
    weights["transformer.h.0.attn.c_attn.weight"] = weights["transformer.h.0.attn.c_attn.weight"] * 12
    assert marked(tmp_path, {**checkpoint, "model_state_dict": weights}) == {
        "model_state_dict/transformer.h.0.attn.c_attn.bias": "!! norm",
        "model_state_dict/transformer.h.0.attn.c_attn.weight": "!! norm",
    }


def test_moments_are_siblings_only_of_the_same_parameter_across_blocks(tmp_path):
    checkpoint = trained("transformer", "adamw", False)
    torch.save(checkpoint, tmp_path / "run.pth")
    rows = list(tensor_rows(tensor_paths(open_checkpoint(str(tmp_path / "run.pth")).root)))
    named = families(rows)
    by_path = {to_slash(row.path): named[id(row)] for row in rows}
    index = state_index(checkpoint, "encoder.layers.1.linear1.weight")
    moment = by_path[f"optimizer_state_dict/state/{index}/exp_avg"]
    assert moment == (
        "optimizer_state_dict.state: exp_avg of model_state_dict.encoder.layers.*.linear1.weight [64, 32]"
    )
    siblings = [path for path, name in by_path.items() if name == moment]
    assert len(siblings) == 4  # the four layers' linear1, no other moment of another shape or parameter
    assert by_path["model_state_dict/encoder.layers.1.linear1.weight"] == (
        "model_state_dict.encoder.layers.*.linear1.weight [64, 32]"
    )


def test_moments_without_their_model_are_siblings_by_moment_and_shape(tmp_path):
    checkpoint = trained("transformer", "adamw", False)
    torch.save({"optimizer": checkpoint["optimizer_state_dict"]}, tmp_path / "opt.pth")
    rows = list(tensor_rows(tensor_paths(open_checkpoint(str(tmp_path / "opt.pth")).root)))
    named = families(rows)
    assert {named[id(row)] for row in rows if row.shape == (64, 32) and row.path[-1] == "exp_avg"} == {
        "optimizer.state: exp_avg [64, 32]"
    }
    assert marks(rows) == {}


def test_stats_on_a_healthy_run_prints_no_mark(tmp_path, capsys):
    torch.save(trained("resnet", "adamw", False), tmp_path / "run.pth")
    assert main(["stats", str(tmp_path / "run.pth")]) == 0
    out = capsys.readouterr().out
    assert "!!" not in out and "dead" not in out
