"""A suggested fix puts every tensor into the module it came from, where shapes cannot tell modules apart: sibling
modules of one shape are paired by what their names say (``q_proj`` with ``query``, ``layers.1`` with ``layers.1``)
and numbered modules in the order of their numbers, the ones whose names already match included (a Sequential
whose activations were removed). Each fix is run and loaded strictly into the model, tensor by tensor."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from ckpt_tui.cli import main


class Attention(nn.Module):
    """Projections registered value, query, key: not the order a q, k, v checkpoint lists them in."""

    def __init__(self) -> None:
        super().__init__()
        self.value, self.query, self.key, self.out = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3)


class WithAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = Attention()


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(6, 6), nn.Linear(6, 6))
        self.head = nn.Linear(6, 2)


def mlp_without_activations() -> nn.Module:
    model = nn.Module()
    model.mlp = nn.Sequential(*[nn.Linear(16, 16) for _ in range(4)])
    return model


def convs_without_activations() -> nn.Module:
    model = nn.Module()
    model.features = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3), nn.Conv2d(8, 16, 3), nn.Conv2d(16, 16, 3), nn.Conv2d(16, 16, 3)
    )
    return model


def qkv_checkpoint() -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """An attention saved as q_proj, k_proj, v_proj, o_proj; where each of its tensors belongs."""
    saved: dict[str, torch.Tensor] = OrderedDict()
    home = {}
    for old, new in [("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value"), ("o_proj", "out")]:
        rows = 3 if old == "o_proj" else 8
        saved[f"attn.{old}.weight"], saved[f"attn.{old}.bias"] = torch.randn(rows, 8), torch.randn(rows)
        home |= {f"attn.{old}.weight": f"attention.{new}.weight", f"attn.{old}.bias": f"attention.{new}.bias"}
    return saved, home


def layers_saved_last_first() -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``encoder.layers.1`` saved before ``encoder.layers.0``."""
    model = Stack()
    state = model.state_dict()
    saved = OrderedDict()
    home = {}
    for old, new in [("encoder.layers.1", "enc.1"), ("encoder.layers.0", "enc.0"), ("head", "head")]:
        for leaf in ("weight", "bias"):
            saved[f"{old}.{leaf}"] = state[f"{new}.{leaf}"]
            home[f"{old}.{leaf}"] = f"{new}.{leaf}"
    return saved, home


Built = tuple[dict[str, torch.Tensor], dict[str, str]]
"""A checkpoint's tensors, and the model key each belongs under."""


def sequential_with_activations(layers: list[nn.Module]) -> Callable[[], Built]:
    """The same layers saved from a Sequential with a ReLU after each but the last (indices 0, 2, 4...)."""

    def build() -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        old = nn.Sequential()
        for index, layer in enumerate(layers):
            old.append(layer)
            if index < len(layers) - 1:
                old.append(nn.ReLU())
        saved = OrderedDict((f"{name_of(layers)}.{k}", v) for k, v in old.state_dict().items())
        home = {}
        for new_index, old_index in enumerate(range(0, 2 * len(layers), 2)):
            for leaf in ("weight", "bias"):
                home[f"{name_of(layers)}.{old_index}.{leaf}"] = f"{name_of(layers)}.{new_index}.{leaf}"
        return saved, home

    return build


def name_of(layers: list[nn.Module]) -> str:
    return "features" if isinstance(layers[0], nn.Conv2d) else "mlp"


def run_fix(
    tmp_path: Path, saved: dict[str, torch.Tensor], model: nn.Module, capsys: pytest.CaptureFixture[str]
) -> Path:
    """The fix ``check --against`` suggests, run: the fixed file."""
    torch.save(saved, tmp_path / "old.pth")
    torch.save(model.state_dict(), tmp_path / "model.pth")
    main(["check", str(tmp_path / "old.pth"), "--against", str(tmp_path / "model.pth"), "--json"])
    suggestion = json.loads(capsys.readouterr().out)["suggestion"]
    assert suggestion["full_match"], suggestion["message"]
    argv = suggestion["argv"]
    assert argv[:2] == ["ckpt-tui", "convert"]
    assert main(argv[1:]) == 0
    capsys.readouterr()
    return Path(argv[argv.index("--output") + 1])


@pytest.mark.parametrize(
    ("build", "make_model"),
    [
        (qkv_checkpoint, WithAttention),
        (layers_saved_last_first, Stack),
        (sequential_with_activations([nn.Linear(16, 16) for _ in range(4)]), mlp_without_activations),
        (sequential_with_activations(list(convs_without_activations().features)), convs_without_activations),
    ],
    ids=["q-k-v named", "layers saved last first", "mlp without its ReLUs", "convs without their ReLUs"],
)
def test_the_fix_puts_every_tensor_into_its_own_module(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    build: Callable[[], tuple[dict[str, torch.Tensor], dict[str, str]]],
    make_model: Callable[[], nn.Module],
) -> None:
    torch.manual_seed(0)
    saved, home = build()
    model = make_model()
    fixed = run_fix(tmp_path, saved, model, capsys)
    model.load_state_dict(torch.load(fixed, weights_only=True), strict=True)
    state = model.state_dict()
    for old, new in home.items():
        assert torch.equal(state[new], saved[old]), f"{old} was loaded into another module than {new}"


def test_a_key_named_metadata_is_unexpected_as_load_state_dict_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = nn.Linear(3, 2)
    state = model.state_dict()  # (its _metadata attribute is no key)
    torch.save(state, tmp_path / "ref.pth")
    torch.save(state, tmp_path / "plain.pth")
    assert main(["check", str(tmp_path / "plain.pth"), "--against", str(tmp_path / "ref.pth")]) == 0
    keyed = OrderedDict(state)
    keyed["_metadata"] = torch.tensor([float("nan"), 1.0])
    torch.save(keyed, tmp_path / "keyed.pth")
    capsys.readouterr()
    assert main(["check", str(tmp_path / "keyed.pth"), "--against", str(tmp_path / "ref.pth"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert not report["ok"] and report["unexpected"] == ["_metadata"]
    with pytest.raises(RuntimeError, match="_metadata"):
        model.load_state_dict(torch.load(tmp_path / "keyed.pth", weights_only=True), strict=True)


class TwoLayers(nn.Module):
    def __init__(self, first: str, second: str) -> None:
        super().__init__()
        setattr(self, first, nn.Linear(4, 4))
        setattr(self, second, nn.Linear(4, 4))


def suggestion_of(tmp_path: Path, saved: dict[str, torch.Tensor], model: nn.Module, capsys) -> dict[str, object]:
    torch.save(saved, tmp_path / "old.pth")
    torch.save(model.state_dict(), tmp_path / "model.pth")
    main(["check", str(tmp_path / "old.pth"), "--against", str(tmp_path / "model.pth"), "--json"])
    found: dict[str, object] = json.loads(capsys.readouterr().out)["suggestion"]
    return found


def test_modules_paired_by_order_alone_are_said_to_be_a_guess(tmp_path: Path, capsys) -> None:
    saved = TwoLayers("fc1", "fc2").state_dict()
    guessed = suggestion_of(tmp_path, saved, TwoLayers("proj_b", "proj_a"), capsys)
    assert guessed["paired_by_order"] == [
        {"module": "fc1", "reference_module": "proj_b"},
        {"module": "fc2", "reference_module": "proj_a"},
    ]
    assert main(["check", str(tmp_path / "old.pth"), "--against", str(tmp_path / "model.pth")]) == 1
    assert "paired by their order only: fc1.* → proj_b.*, fc2.* → proj_a.*" in capsys.readouterr().out
    # names that say which is which: no guess
    named = suggestion_of(tmp_path, TwoLayers("q_proj", "k_proj").state_dict(), TwoLayers("key", "query"), capsys)
    assert "paired_by_order" not in named


def test_shape_mismatches_the_fix_leaves_are_named_with_their_drop(tmp_path: Path, capsys) -> None:
    old = nn.Sequential(OrderedDict(ln=nn.LayerNorm(8), wide=nn.Linear(8, 8)))
    new = nn.Sequential(OrderedDict(norm=nn.LayerNorm(8), wide=nn.Linear(8, 16)))
    # (under a key, as a training script saves it: before the fix no key matches, so none is listed as mismatched)
    found = suggestion_of(tmp_path, {"model_state_dict": old.state_dict()}, new, capsys)  # type: ignore[dict-item]
    assert {row["key"] for row in found["shape_mismatches_left"]} == {"wide.weight", "wide.bias"}  # type: ignore[union-attr]
    main(["check", str(tmp_path / "old.pth"), "--against", str(tmp_path / "model.pth")])
    text = capsys.readouterr().out
    assert "shape mismatches left after it: wide.weight: [8, 8] vs [16, 8]" in text
    assert "strict=False) still raises on them" in text and "--drop wide.weight --drop wide.bias" in text
