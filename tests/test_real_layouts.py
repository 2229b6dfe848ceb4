"""Layouts that real frameworks write: HF shard sets, wrappers around real ``module`` children,
quantized and sparse tensors, step counters, TorchScript archives. Each checked against torch."""

from __future__ import annotations

import copy
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from builders import write_safetensors, write_sharded_bin
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from ckpt_tui.cli import main


def run(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def metadata_of(path: Path) -> dict[str, str]:
    with safe_open(str(path), "pt") as file:
        return file.metadata()


# ---- 1. shard sets convert to one file: the index's numbers are not safetensors metadata ----------


def hf_shards(folder: Path, metadata: dict[str, str] | None = None) -> dict[str, torch.Tensor]:
    """Two shards as transformers' save_pretrained writes them: ``{"format": "pt"}`` in each, numbers in the index."""
    torch.manual_seed(0)
    state = {"a.weight": torch.randn(4, 4), "b.weight": torch.randn(4), "c.bias": torch.randn(3)}
    folder.mkdir()
    names = {"a.weight": "model-00001-of-00002.safetensors"}
    for key in state:
        names.setdefault(key, "model-00002-of-00002.safetensors")
    for name in dict.fromkeys(names.values()):
        part = {k: v for k, v in state.items() if names[k] == name}
        write_safetensors(part, folder / name, metadata or {"format": "pt"})
    index = {"metadata": {"total_size": 92, "total_parameters": 23}, "weight_map": names}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return state


def test_hf_shard_set_converts_to_one_safetensors(tmp_path: Path, capsys) -> None:
    state = hf_shards(tmp_path / "hf")
    code, _, err = run(capsys, "convert", tmp_path / "hf", "-o", tmp_path / "one.safetensors")
    assert code == 0, err
    loaded = load_file(tmp_path / "one.safetensors")
    assert sorted(loaded) == sorted(state) and all(torch.equal(loaded[k], v) for k, v in state.items())
    assert metadata_of(tmp_path / "one.safetensors") == {"format": "pt"}  # as transformers writes a merged file
    code, _, _ = run(capsys, "convert", tmp_path / "hf", "-o", tmp_path / "x.safetensors", "--extract", "auto")
    assert code == 0


def test_hf_shard_index_numbers_are_shown_by_info(tmp_path: Path, capsys) -> None:
    hf_shards(tmp_path / "hf")
    code, out, _ = run(capsys, "info", tmp_path / "hf")
    assert code == 0
    assert "total_size=92, total_parameters=23" in out
    code, out, _ = run(capsys, "info", "--json", tmp_path / "hf")
    assert json.loads(out)["index_metadata"] == {"total_size": "92", "total_parameters": "23"}


def test_shards_own_metadata_carries_over(tmp_path: Path, capsys) -> None:
    hf_shards(tmp_path / "hf", {"format": "pt", "producer": "x"})
    assert run(capsys, "convert", tmp_path / "hf", "-o", tmp_path / "one.safetensors")[0] == 0
    assert metadata_of(tmp_path / "one.safetensors") == {"format": "pt", "producer": "x"}


def test_bin_shard_set_converts_to_one_safetensors(tmp_path: Path, capsys) -> None:
    state = {"x.weight": torch.randn(3, 2), "y.weight": torch.randn(2)}
    (tmp_path / "bin").mkdir()
    index = write_sharded_bin(state, tmp_path / "bin")
    index.write_text(json.dumps({**json.loads(index.read_text()), "metadata": {"total_size": 32}}))
    assert run(capsys, "convert", index, "-o", tmp_path / "one.safetensors")[0] == 0
    loaded = load_file(tmp_path / "one.safetensors")
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


def test_own_max_shard_size_output_converts_back(tmp_path: Path, capsys) -> None:
    torch.manual_seed(0)
    tied = torch.randn(6, 4)
    state = {"emb.weight": tied, "head.weight": tied, "a": torch.randn(50, 4), "b": torch.randn(50)}
    torch.save(state, tmp_path / "src.pth")
    assert run(capsys, "convert", tmp_path / "src.pth", "-o", tmp_path / "sh", "--max-shard-size", "300B")[0] == 0
    assert (tmp_path / "sh" / "model.safetensors.index.json").exists()
    code, _, err = run(capsys, "convert", tmp_path / "sh", "-o", tmp_path / "one.safetensors")
    assert code == 0, err
    loaded = load_file(tmp_path / "one.safetensors")
    assert all(torch.equal(loaded[k], state[k]) for k in ("emb.weight", "a", "b"))
    # the tied copy stays recorded as safetensors' save_model records it
    assert metadata_of(tmp_path / "one.safetensors") == {"format": "pt", "head.weight": "emb.weight"}


# ---- 2. --strip-prefix auto strips one wrapper level, never a real submodule named module -------


class EmaV2(nn.Module):
    """timm's ModelEmaV2: the averaged copy is its child ``module``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.module = copy.deepcopy(model)


class Inner2(nn.Module):
    """A model whose only child is called ``module``."""

    def __init__(self) -> None:
        super().__init__()
        self.module = nn.Linear(8, 2)


def lightning(state: dict[str, torch.Tensor]) -> dict[str, Any]:
    return {"epoch": 0, "global_step": 2, "pytorch-lightning_version": "2.5.0", "state_dict": state, "loops": {}}


def strip_and_load(tmp_path: Path, capsys, saved: Any, model: nn.Module, *extra: str) -> str:
    """Convert with ``--strip-prefix auto`` and load the result into ``model`` strictly; the printed change."""
    torch.save(saved, tmp_path / "src.pth")
    code, out, err = run(capsys, "convert", tmp_path / "src.pth", "-o", tmp_path / "out.pth", *extra)
    assert code == 0, err
    model.load_state_dict(torch.load(tmp_path / "out.pth", weights_only=True), strict=True)
    return out


def test_data_parallel_around_ema_v2_strips_one_module(tmp_path: Path, capsys) -> None:
    saved = nn.DataParallel(EmaV2(nn.Linear(8, 2))).state_dict()
    out = strip_and_load(tmp_path, capsys, saved, EmaV2(nn.Linear(8, 2)), "--strip-prefix", "auto")
    assert "strip 'module.'" in out and "module.module.weight → module.weight" in out
    expected = OrderedDict(saved)
    torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(expected, "module.")
    assert list(torch.load(tmp_path / "out.pth", weights_only=True)) == list(expected)


def test_data_parallel_around_compiled_model_with_module_child(tmp_path: Path, capsys) -> None:
    saved = nn.DataParallel(torch.compile(Inner2())).state_dict()
    assert list(saved) == ["module._orig_mod.module.weight", "module._orig_mod.module.bias"]
    out = strip_and_load(tmp_path, capsys, saved, Inner2(), "--strip-prefix", "auto")
    assert "strip 'module._orig_mod.'" in out


def test_lightning_model_module_strips_only_model(tmp_path: Path, capsys) -> None:
    saved = lightning(OrderedDict(("model." + k, v) for k, v in Inner2().state_dict().items()))
    out = strip_and_load(tmp_path, capsys, saved, Inner2(), "--extract", "auto", "--strip-prefix", "auto")
    assert "strip 'model.'" in out


def test_lightning_compiled_model_module_strips_model_orig_mod(tmp_path: Path, capsys) -> None:
    compiled = torch.compile(Inner2())
    saved = lightning(OrderedDict(("model." + k, v) for k, v in compiled.state_dict().items()))
    out = strip_and_load(tmp_path, capsys, saved, Inner2(), "--extract", "auto", "--strip-prefix", "auto")
    assert "strip 'model._orig_mod.'" in out


def test_finding_and_against_agree_with_auto(tmp_path: Path, capsys) -> None:
    torch.save(nn.DataParallel(EmaV2(nn.Linear(8, 2))).state_dict(), tmp_path / "dp.pth")
    torch.save(EmaV2(nn.Linear(8, 2)).state_dict(), tmp_path / "plain.pth")
    code, out, _ = run(capsys, "info", "--json", tmp_path / "dp.pth")
    prefix = [f for f in json.loads(out)["findings"] if f["kind"] == "prefix"]
    assert prefix[0]["prefix"] == "module."
    code, out, _ = run(capsys, "check", "--json", tmp_path / "dp.pth", "--against", tmp_path / "plain.pth")
    assert json.loads(out)["suggestion"]["steps"] == ["strip 'module.'"]
    saved = lightning(OrderedDict(("model." + k, v) for k, v in Inner2().state_dict().items()))
    torch.save(saved, tmp_path / "l.ckpt")
    code, out, _ = run(capsys, "info", "--json", tmp_path / "l.ckpt")
    prefix = [f for f in json.loads(out)["findings"] if f["kind"] == "prefix"]
    assert prefix[0]["prefix"] == "model."
