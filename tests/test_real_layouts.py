"""Layouts that real frameworks write: HF shard sets, wrappers around real ``module`` children,
quantized and sparse tensors, step counters, TorchScript archives. Each checked against torch."""

from __future__ import annotations

import copy
import json
import warnings
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
    _, out, _ = run(capsys, "info", "--json", tmp_path / "dp.pth")
    prefix = [f for f in json.loads(out)["findings"] if f["kind"] == "prefix"]
    assert prefix[0]["prefix"] == "module."
    _, out, _ = run(capsys, "check", "--json", tmp_path / "dp.pth", "--against", tmp_path / "plain.pth")
    assert json.loads(out)["suggestion"]["steps"] == ["strip 'module.'"]
    saved = lightning(OrderedDict(("model." + k, v) for k, v in Inner2().state_dict().items()))
    torch.save(saved, tmp_path / "l.ckpt")
    _, out, _ = run(capsys, "info", "--json", tmp_path / "l.ckpt")
    prefix = [f for f in json.loads(out)["findings"] if f["kind"] == "prefix"]
    assert prefix[0]["prefix"] == "model."
    torch.save(Inner2().state_dict(), tmp_path / "inner.pth")
    _, out, _ = run(capsys, "check", "--json", tmp_path / "l.ckpt", "--against", tmp_path / "inner.pth")
    assert json.loads(out)["suggestion"]["steps"] == ["extract state_dict", "strip 'model.'"]
    compiled = OrderedDict(("model." + k, v) for k, v in torch.compile(Inner2()).state_dict().items())
    torch.save(lightning(compiled), tmp_path / "c.ckpt")
    _, out, _ = run(capsys, "check", "--json", tmp_path / "c.ckpt", "--against", tmp_path / "inner.pth")
    assert json.loads(out)["suggestion"]["steps"] == ["extract state_dict", "strip 'model._orig_mod.'"]
    _, out, _ = run(capsys, "info", "--json", tmp_path / "c.ckpt")
    assert [f["prefix"] for f in json.loads(out)["findings"] if f["kind"] == "prefix"] == ["model._orig_mod."]


# ---- 3. a whole pickled dynamic-quantized model: its packed weights are counted, never lost ------


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)


def quantized(model: nn.Module) -> nn.Module:
    with warnings.catch_warnings():  # torch.ao.quantization is deprecated
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def test_dynamic_quantized_module_tensors_are_counted(tmp_path: Path, capsys) -> None:
    torch.save(quantized(Plain()), tmp_path / "q.pth")
    _, out, _ = run(capsys, "info", "--json", tmp_path / "q.pth")
    report = json.loads(out)
    assert report["tensor_count"] == 4  # fc1/fc2: a qint8 weight and a float bias each, as torch holds them
    assert sorted(t["dtype"] for t in report["tensors"]) == ["float32", "float32", "qint8", "qint8"]
    assert "_packed_params" in report["tensors"][0]["path"]


@pytest.mark.parametrize("layers", [1, 3])
def test_extract_of_a_dynamic_quantized_model_loads_into_it(tmp_path: Path, capsys, layers: int) -> None:
    torch.manual_seed(0)
    model = quantized(nn.Sequential(*[nn.Linear(4, 4) for _ in range(layers)], nn.ReLU()))
    torch.save(model, tmp_path / "q.pth")
    code, _, err = run(capsys, "convert", tmp_path / "q.pth", "-o", tmp_path / "out.pth", "--extract", "auto")
    assert code == 0, err
    loaded = torch.load(tmp_path / "out.pth", weights_only=True)
    assert list(loaded) == list(model.state_dict())
    fresh = quantized(nn.Sequential(*[nn.Linear(4, 4) for _ in range(layers)], nn.ReLU()))
    fresh.load_state_dict(loaded, strict=True)
    x = torch.randn(3, 4)
    assert torch.equal(fresh(x), model(x))


def test_flat_quantized_state_dict_extract_auto_is_a_no_op(tmp_path: Path, capsys) -> None:
    model = quantized(Plain())
    torch.save(model.state_dict(), tmp_path / "sd.pth")
    code, out, err = run(capsys, "convert", tmp_path / "sd.pth", "-o", tmp_path / "o.pth", "--extract", "auto")
    assert code == 0, err
    assert "already is a flat state_dict" in err + out
    quantized(Plain()).load_state_dict(torch.load(tmp_path / "o.pth", weights_only=True), strict=True)
    wrapped = {"epoch": 1, "model": nn.DataParallel(model).state_dict()}
    torch.save(wrapped, tmp_path / "train.pth")
    args = ("--extract", "auto", "--strip-prefix", "auto")
    assert run(capsys, "convert", tmp_path / "train.pth", "-o", tmp_path / "w.pth", *args)[0] == 0
    quantized(Plain()).load_state_dict(torch.load(tmp_path / "w.pth", weights_only=True), strict=True)


def quantized_conv() -> nn.Module:
    return nn.Sequential(torch.ao.nn.quantized.Conv2d(2, 2, 1))


def dynamic_lstm() -> nn.Module:
    return nn.Sequential(torch.ao.nn.quantized.dynamic.LSTM(4, 4))


class CachedTensor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.cache = torch.randn(3)  # a plain attribute: not in torch's state_dict either


@pytest.mark.parametrize(("build", "count"), [(quantized_conv, 2), (dynamic_lstm, 4)])
def test_extract_refuses_a_module_whose_state_dict_would_lose_tensors(tmp_path: Path, capsys, build, count) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(build(), tmp_path / "m.pth")
    code, out, err = run(capsys, "convert", tmp_path / "m.pth", "-o", tmp_path / "out.pth", "--extract", "auto")
    assert code == 1
    assert f"holds {count} tensor{'s' if count > 1 else ''} outside its parameters and buffers" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out.pth").exists()
    code, out, _ = run(capsys, "info", "--json", tmp_path / "m.pth")
    assert json.loads(out)["tensor_count"] >= count


@pytest.mark.parametrize("attribute", ["tensor", "list", "dict"])
def test_extract_leaves_out_plain_tensor_attributes_as_torchs_state_dict_does(
    tmp_path: Path, capsys, attribute: str
) -> None:
    model = CachedTensor()
    if attribute == "list":
        model.cache = [torch.randn(2), torch.randn(2)]  # type: ignore[assignment]
    elif attribute == "dict":
        model.cache = {"a": torch.randn(2)}  # type: ignore[assignment]
    torch.save(model, tmp_path / "m.pth")
    code, _, err = run(capsys, "convert", tmp_path / "m.pth", "-o", tmp_path / "out.pth", "--extract", "auto")
    assert code == 0, err
    got = torch.load(tmp_path / "out.pth", weights_only=True)
    assert list(got) == list(model.state_dict())


def test_extract_of_a_plain_module_with_a_non_persistent_buffer_still_works(tmp_path: Path, capsys) -> None:
    model = nn.Linear(3, 2)
    model.register_buffer("scratch", torch.zeros(2), persistent=False)
    torch.save(model, tmp_path / "m.pth")
    code, _, err = run(capsys, "convert", tmp_path / "m.pth", "-o", tmp_path / "out.pth", "--extract", "auto")
    assert code == 0, err
    nn.Linear(3, 2).load_state_dict(torch.load(tmp_path / "out.pth", weights_only=True), strict=True)


# ---- 4, 5. sparse and quantized tensors: compared by their parts, their values checked -----------


def sparse_and_quantized(nan: bool = False) -> dict[str, torch.Tensor]:
    values = torch.tensor([float("nan") if nan else 2.0, 1.0])
    dense = torch.tensor([[1.0, 0.0], [0.0, 3.0]])
    with warnings.catch_warnings():  # quantized tensor creation is deprecated
        warnings.simplefilter("ignore")
        per_tensor = torch.quantize_per_tensor(torch.tensor([1.0, 2.0]), 0.1, 0, torch.qint8)
        per_channel = torch.quantize_per_channel(dense, torch.tensor([0.1, 0.2]), torch.tensor([0, 1]), 0, torch.quint8)
    return {
        "coo": torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 2]]), values, (3, 3)),
        "csr": dense.to_sparse_csr(),
        "csc": dense.to_sparse_csc(),
        "q": per_tensor,
        "qc": per_channel,
    }


def test_diff_of_a_sparse_and_quantized_file_with_itself_and_its_convert_output(tmp_path: Path, capsys) -> None:
    torch.save(sparse_and_quantized(), tmp_path / "a.pth")
    code, out, _ = run(capsys, "diff", tmp_path / "a.pth", tmp_path / "a.pth")
    assert code == 0 and out.startswith("identical")
    assert run(capsys, "convert", tmp_path / "a.pth", "-o", tmp_path / "b.pth")[0] == 0
    code, out, _ = run(capsys, "diff", tmp_path / "a.pth", tmp_path / "b.pth")
    assert code == 0 and out.startswith("identical")
    code, out, _ = run(capsys, "diff", "--stats", tmp_path / "a.pth", tmp_path / "b.pth")
    assert code == 0 and "0 layers" not in out and "unchanged" in out


def test_diff_tells_sparse_and_quantized_changes(tmp_path: Path, capsys) -> None:
    base = sparse_and_quantized()
    torch.save(base, tmp_path / "a.pth")
    changed = dict(base)
    changed["coo"] = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 2]]), torch.tensor([2.0, 5.0]), (3, 3))
    with warnings.catch_warnings():  # quantized tensor creation is deprecated
        warnings.simplefilter("ignore")
        changed["q"] = torch.quantize_per_tensor(torch.tensor([1.0, 2.0]), 0.2, 0, torch.qint8)
    torch.save(changed, tmp_path / "b.pth")
    code, out, _ = run(capsys, "diff", "--json", tmp_path / "a.pth", tmp_path / "b.pth")
    report = json.loads(out)
    assert code == 1
    assert [c["key"] for c in report["value_changes"]] == ['ckpt["coo"].values', 'ckpt["q"].int_repr']
    assert [c["key"] for c in report["other_changes"]] == ['ckpt["q"].scale']


def test_check_finds_nan_in_sparse_values(tmp_path: Path, capsys) -> None:
    torch.save(sparse_and_quantized(nan=True), tmp_path / "nan.pth")
    code, out, _ = run(capsys, "check", "--json", tmp_path / "nan.pth")
    report = json.loads(out)
    assert code == 1 and [p["kind"] for p in report["problems"]] == ["nan"]
    assert report["tensors_checked"] == 3  # the values parts of coo, csr, csc
    torch.save(sparse_and_quantized(), tmp_path / "ok.pth")
    assert run(capsys, "check", tmp_path / "ok.pth")[0] == 0


# ---- 6. a step counter saved as the next step to run ---------------------------------------------


@pytest.mark.parametrize(("offset", "flagged"), [(0, False), (1, False), (-1, False), (5, True)])
def test_step_counter_within_one_of_the_optimizer_step(tmp_path: Path, capsys, offset: int, flagged: bool) -> None:
    model = Plain()
    optimizer = torch.optim.Adam(model.parameters())
    for _ in range(3):
        model.fc2(torch.relu(model.fc1(torch.randn(2, 8)))).sum().backward()
        optimizer.step()
    saved = {"step": 3 + offset, "model_state": model.state_dict(), "optimizer_state": optimizer.state_dict()}
    torch.save(saved, tmp_path / "c.pth")
    code, out, _ = run(capsys, "check", tmp_path / "c.pth")
    assert ("step-mismatch" in out) is flagged
    assert code == (1 if flagged else 0)


# ---- 7. a TorchScript archive is converted only through --extract --------------------------------


@pytest.mark.parametrize("fmt", ["out.pth", "out.safetensors"])
def test_torchscript_convert_without_extract_refuses_in_one_line(tmp_path: Path, capsys, fmt: str) -> None:
    torch.jit.save(torch.jit.script(nn.Linear(3, 2)), str(tmp_path / "s.pt"))
    code, _, err = run(capsys, "convert", tmp_path / "s.pt", "-o", tmp_path / fmt)
    assert code == 2
    assert err == (
        "ckpt-tui: a TorchScript archive's module objects cannot be written as a checkpoint; "
        "use --extract auto for its weights\n"
    )
    assert not (tmp_path / fmt).exists()
    code, _, err = run(capsys, "convert", tmp_path / "s.pt", "-o", tmp_path / "w.pth", "--extract", "auto")
    assert code == 0, err
    nn.Linear(3, 2).load_state_dict(torch.load(tmp_path / "w.pth", weights_only=True), strict=True)
