"""A sharded set whose shards hold a key the index does not map to them, against the real loaders.

transformers' ``from_pretrained`` and accelerate's ``load_checkpoint_in_model`` read every shard the
index names, whole, in name order, each over the last: the value loaded is the last shard's copy,
whatever the weight_map says. ckpt-tui shows the weight_map's copy, so it must flag the set.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from ckpt_tui.cli import main

INDEX = "model.safetensors.index.json"


class Two(torch.nn.Module):
    """A module with the parameters the sets below hold."""

    def __init__(self, names: tuple[str, ...] = ("a", "b")) -> None:
        super().__init__()
        for name in names:
            self.register_parameter(name, torch.nn.Parameter(torch.zeros(2)))


def _set(folder: Path, shards: dict[str, dict[str, torch.Tensor]], weight_map: dict[str, str], bin_: bool) -> Path:
    folder.mkdir()
    for name, state in shards.items():
        if bin_:
            torch.save(state, folder / name)
        else:
            save_file(state, str(folder / name))
    index = folder / ("pytorch_model.bin.index.json" if bin_ else INDEX)
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index


def _accelerate(index: Path, names: tuple[str, ...] = ("a", "b")) -> dict[str, list[float]]:
    accelerate_utils = pytest.importorskip("accelerate.utils")
    model = Two(names)
    accelerate_utils.load_checkpoint_in_model(model, str(index))
    return {name: getattr(model, name).tolist() for name in names}


def _findings(capsys: pytest.CaptureFixture[str], folder: Path) -> list[dict[str, Any]]:
    assert main(["info", "--json", str(folder)]) == 0
    return [f for f in json.loads(capsys.readouterr().out)["findings"] if f["kind"] == "readers-disagree"]


@pytest.mark.parametrize("bin_", [False, True], ids=["safetensors", "bin"])
def test_a_key_in_two_shards_is_flagged_naming_the_copy_the_loaders_end_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bin_: bool
) -> None:
    suffix = ".bin" if bin_ else ".safetensors"
    s1, s2 = f"s1{suffix}", f"s2{suffix}"
    shards = {s1: {"a": torch.full((2,), 99.0)}, s2: {"a": torch.ones(2), "b": torch.full((2,), 2.0)}}
    index = _set(tmp_path / "set", shards, {"a": s1, "b": s2}, bin_)
    loaded = _accelerate(index)
    assert loaded["a"] == [1.0, 1.0]  # s2's copy, not the weight_map's
    assert main(["check", str(tmp_path / "set")]) == 1
    out = capsys.readouterr().out
    assert "[readers-disagree]" in out
    assert f"the weight_map naming {s1} (shown here), the loaders ending with {s2}'s copy" in out
    assert main(["check", "--json", str(tmp_path / "set")]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [p["kind"] for p in report["problems"]] == ["readers-disagree"]
    assert len(_findings(capsys, tmp_path / "set")) == 1
    # a rewrite would pick one copy for the user: refused in one line
    assert main(["convert", str(tmp_path / "set"), "-o", str(tmp_path / "out.pth")]) == 2
    assert "readers disagree" in capsys.readouterr().err
    assert not (tmp_path / "out.pth").exists()


def test_a_key_in_two_shards_is_flagged_even_where_the_loaders_agree_with_the_weight_map(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The weight_map's shard is last in name order here, so the loaders end with the copy shown, but only by
    the shards' names: still flagged."""
    shards = {
        "s1.safetensors": {"a": torch.ones(2), "b": torch.full((2,), 2.0)},
        "s2.safetensors": {"a": torch.full((2,), 99.0)},
    }
    index = _set(tmp_path / "set", shards, {"a": "s2.safetensors", "b": "s1.safetensors"}, False)
    assert _accelerate(index)["a"] == [99.0, 99.0]
    found = _findings(capsys, tmp_path / "set")
    assert len(found) == 1 and "the loaders ending with s2.safetensors's copy" in found[0]["message"]


def test_a_key_missing_from_the_weight_map_but_in_a_shard_is_flagged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shards = {
        "s1.safetensors": {"a": torch.ones(2)},
        "s2.safetensors": {"b": torch.full((2,), 2.0), "c": torch.full((2,), 7.0)},
    }
    index = _set(tmp_path / "set", shards, {"a": "s1.safetensors", "b": "s2.safetensors"}, False)
    assert _accelerate(index, ("a", "b", "c"))["c"] == [7.0, 7.0]  # loaded, though the index never lists it
    found = _findings(capsys, tmp_path / "set")
    assert len(found) == 1
    assert "not in the weight_map (not shown here): 'c' in s2.safetensors" in found[0]["message"]
    assert main(["check", str(tmp_path / "set")]) == 1
    capsys.readouterr()


def test_a_set_whose_shards_hold_only_their_mapped_keys_is_not_flagged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shards = {"s1.safetensors": {"a": torch.ones(2)}, "s2.safetensors": {"b": torch.full((2,), 2.0)}}
    _set(tmp_path / "set", shards, {"a": "s1.safetensors", "b": "s2.safetensors"}, False)
    assert _findings(capsys, tmp_path / "set") == []
    assert main(["check", str(tmp_path / "set")]) == 0
    capsys.readouterr()


# ---- a weight_map that names the wrong shard, or a key no shard holds: as from_pretrained loads it ----------


def _gpt2_set(folder: Path) -> dict[str, str]:
    """A real ``save_pretrained`` set of several shards (a tiny GPT-2); its weight_map."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=12, n_positions=4)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder, max_shard_size="1KB")
    weight_map: dict[str, str] = json.loads((folder / INDEX).read_text())["weight_map"]
    assert len(set(weight_map.values())) >= 3
    return weight_map


def _from_pretrained(folder: Path) -> dict[str, torch.Tensor]:
    """What transformers' own loader makes of the folder (no key missing or unexpected)."""
    import transformers

    model, info = transformers.GPT2LMHeadModel.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.state_dict()


def _shown(folder: Path) -> dict[str, torch.Tensor]:
    """Each tensor ckpt-tui shows for the set, with its values as read."""
    from ckpt_tui.core.readers.open import open_checkpoint
    from ckpt_tui.core.values.tensor_values import TensorReader

    checkpoint = open_checkpoint(str(folder))
    shown = {}
    for key, tensor in checkpoint.root.items():
        values = TensorReader(tensor, checkpoint.byteorder).first(tensor.numel)
        shown[key] = torch.from_numpy(values.copy()).reshape(tensor.shape)
    return shown


@pytest.mark.parametrize("lie", ["wrong shard", "no shard holds it"])
def test_a_weight_map_entry_no_shard_backs_is_read_as_from_pretrained_reads_it(
    lie: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "gpt2"
    weight_map = _gpt2_set(folder)
    key = "transformer.h.0.ln_1.bias"
    holder = weight_map[key]
    other = next(name for name in sorted(set(weight_map.values())) if name != holder)
    if lie == "wrong shard":
        weight_map[key] = other
    else:
        weight_map["ghost.weight"] = other
    (folder / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    loaded = _from_pretrained(folder)
    shown = _shown(folder)
    assert set(shown) <= set(loaded) and "ghost.weight" not in shown
    for name, values in shown.items():
        assert torch.equal(values, loaded[name]), name
    assert main(["check", str(folder)]) == 1
    finding = next(line for line in capsys.readouterr().out.splitlines() if "[readers-disagree]" in line)
    if lie == "wrong shard":
        assert f"{key!r} mapped to {other}, in {holder}; shown from that shard" in finding
        assert f'set its weight_map entry in the index to "{key}": "{holder}"' in finding
    else:
        assert f"no shard holds (not shown here): 'ghost.weight' mapped to {other}" in finding
        assert "remove it from the index's weight_map" in finding
    # convert refuses a set readers disagree on, in that same line
    assert main(["convert", str(folder), "-o", str(tmp_path / "out.safetensors")]) == 2
    assert finding.split("] ", 1)[1] in capsys.readouterr().err


def test_a_safetensors_set_missing_a_shard_is_not_called_a_weights_only_refusal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shards = {"s1.safetensors": {"a": torch.ones(2)}, "s2.safetensors": {"b": torch.full((2,), 2.0)}}
    _set(tmp_path / "set", shards, {"a": "s1.safetensors", "b": "s2.safetensors"}, False)
    (tmp_path / "set" / "s2.safetensors").unlink()
    assert main(["check", "--json", str(tmp_path / "set")]) == 2
    captured = capsys.readouterr()
    judged = json.loads(captured.out)["weights_only"]
    assert judged["answer"] is None and "safetensors shards hold no pickle" in judged["reason"]
    assert "'s2.safetensors' is missing" in judged["reason"] and "is missing" in captured.err
