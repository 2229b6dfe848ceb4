"""The metadata-only reader, on real files of every format, and the findings it computes."""

from __future__ import annotations

import json
import struct
import zipfile
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from builders import (
    compiled_state_dict,
    ddp_state_dict,
    lightning_checkpoint,
    many_keys,
    rewrite_zip,
    save_cuda_tagged,
    save_whole_module,
    tiny_state_dict,
    training_checkpoint,
    write_dcp,
    write_safetensors,
    write_sharded_bin,
    write_sharded_safetensors,
    write_torchscript,
)

from ckpt_tui.cli.render import render_info
from ckpt_tui.core.model.keypath import Attr
from ckpt_tui.core.model.tree import Opaque, Tensor, get, iter_tensors
from ckpt_tui.core.operations.info import summarize
from ckpt_tui.core.readers.open import open_checkpoint


def kinds(path: Path) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for finding in summarize(open_checkpoint(path)).to_json()["findings"]:
        found.setdefault(finding["kind"], []).append(finding)
    return found


def test_zip_state_dict_matches_torch(tmp_path: Path) -> None:
    state = tiny_state_dict()
    torch.save(state, tmp_path / "plain.pth")
    ckpt = open_checkpoint(tmp_path / "plain.pth")
    assert ckpt.format == "zip"
    assert isinstance(ckpt.root, OrderedDict)
    assert list(ckpt.root) == list(state)
    assert ckpt.root._metadata == state._metadata
    for key, tensor in state.items():
        meta = ckpt.root[key]
        assert meta.shape == tuple(tensor.shape)
        assert meta.stride == tensor.stride()
        assert meta.dtype == str(tensor.dtype).removeprefix("torch.")
        assert meta.device == "cpu"


def test_top_folder_named_after_file_and_any_extension(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    torch.save(tiny_state_dict(), path)
    renamed = tmp_path / "renamed_on_disk.ckpt"
    path.rename(renamed)
    assert open_checkpoint(renamed).format == "zip"


def test_safetensors_name_with_zip_content_is_sniffed(tmp_path: Path) -> None:
    path = tmp_path / "actually_torch.safetensors"
    torch.save(tiny_state_dict(), path)
    assert open_checkpoint(path).format == "zip"


@pytest.mark.parametrize(
    ("builder", "prefix"),
    [(ddp_state_dict, "module."), (compiled_state_dict, "_orig_mod.")],
)
def test_wrapper_prefix_found(tmp_path: Path, builder, prefix: str) -> None:
    torch.save(builder(), tmp_path / "w.pth")
    found = kinds(tmp_path / "w.pth")["prefix"]
    assert found[0]["prefix"] == prefix
    assert found[0]["severity"] == "warning"


def test_training_checkpoint_findings(tmp_path: Path) -> None:
    torch.save(training_checkpoint(), tmp_path / "train.pth")
    found = kinds(tmp_path / "train.pth")
    assert found["inner-state-dict"][0]["path"] == ["model"]
    assert found["prefix"][0]["path"] == ["model"]
    assert found["prefix"][0]["prefix"] == "module."
    assert found["optimizer"][0]["path"] == ["optimizer"]
    assert found["scheduler"][0]["path"] == ["scheduler"]
    assert "unsafe-global" not in found  # argparse.Namespace is data


def test_inner_state_dict_decided_by_content(tmp_path: Path) -> None:
    ckpt = training_checkpoint(model_key="weights_of_the_run")
    torch.save(ckpt, tmp_path / "odd.pth")
    assert kinds(tmp_path / "odd.pth")["inner-state-dict"][0]["path"] == ["weights_of_the_run"]


def test_lightning_layout(tmp_path: Path) -> None:
    torch.save(lightning_checkpoint(), tmp_path / "l.ckpt")
    found = kinds(tmp_path / "l.ckpt")
    assert "lightning" in found
    assert found["inner-state-dict"][0]["path"] == ["state_dict"]
    assert found["prefix"][0]["prefix"] == "model."


def test_tensors_named_like_lightning_keys_are_not_a_lightning_checkpoint(tmp_path: Path) -> None:
    names = ["epoch", "state_dict", "optimizer_states", "pytorch-lightning_version"]
    torch.save({name: torch.zeros(1) for name in names}, tmp_path / "named.pth")
    assert "lightning" not in kinds(tmp_path / "named.pth")
    checkpoint = lightning_checkpoint()
    checkpoint["pytorch-lightning_version"] = torch.zeros(1)  # not a version: the layout still tells
    torch.save(checkpoint, tmp_path / "l.ckpt")
    assert kinds(tmp_path / "l.ckpt")["lightning"][0]["message"] == "a PyTorch Lightning checkpoint (version ?)"


def test_a_function_kept_as_a_value_is_shown_by_its_global_name(tmp_path: Path) -> None:
    """Its name, never a repr with a memory address (the same file reads the same every time)."""
    torch.save({"fn": torch._utils._rebuild_tensor_v2, "a": torch.zeros(1)}, tmp_path / "fn.pth")
    text = render_info(summarize(open_checkpoint(tmp_path / "fn.pth")), 2)
    assert "fn  function = torch._utils._rebuild_tensor_v2" in text
    assert "0x" not in text


def test_a_sparse_part_past_its_storage_is_a_bad_tensor(tmp_path: Path) -> None:
    """A sparse tensor's indices whose size reaches far past their 16-byte storage: named, not just summed."""
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 1]]), torch.ones(2), (3,))
    torch.save({"s": sparse}, tmp_path / "ok.pth")
    data = zipfile.ZipFile(tmp_path / "ok.pth").read("ok/data.pkl")
    bad = data.replace(b"K\x01K\x02\x86", b"K\x01\x8a\x08" + (2**62).to_bytes(8, "little") + b"\x86", 1)
    assert bad != data
    path = rewrite_zip(tmp_path / "ok.pth", tmp_path / "bad.pth", data_pkl=bad)
    messages = [finding["message"] for finding in kinds(path)["bad-tensor"]]
    assert messages == ['ckpt["s"].indices: needs 36893488147419103232 bytes of a 16-byte storage']


def test_adam_state_and_namespace_readable(tmp_path: Path) -> None:
    torch.save(training_checkpoint(), tmp_path / "train.pth")
    ckpt = open_checkpoint(tmp_path / "train.pth")
    state = ckpt.root["optimizer"]["state"]
    assert set(state[0]) == {"step", "exp_avg", "exp_avg_sq"}
    assert isinstance(state[0]["exp_avg"], Tensor)
    namespace = ckpt.root["args"]
    assert isinstance(namespace, Opaque) and namespace.global_name == "argparse.Namespace"
    assert namespace.state == {"lr": 1e-3, "arch": "tiny"}


def test_cuda_tagged_file_opens_on_cpu(tmp_path: Path) -> None:
    path = save_cuda_tagged(ddp_state_dict(), tmp_path / "gpu.pth")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError):
            torch.load(path, weights_only=True)
    info = summarize(open_checkpoint(path)).to_json()
    assert info["devices"] == {"cuda:0": info["tensor_count"]}
    assert {t["device"] for t in info["tensors"]} == {"cuda:0"}
    assert any(f["kind"] == "cuda-tensors" for f in info["findings"])


def test_tied_weights_and_views_share_storage(tmp_path: Path) -> None:
    base = torch.arange(12.0).reshape(3, 4)
    torch.save({"a": base, "b": base, "t": base.t(), "row": base[1], "cols": base[:, ::2]}, tmp_path / "tied.pth")
    root = open_checkpoint(tmp_path / "tied.pth").root
    assert root["a"].storage is root["b"].storage is root["t"].storage is root["row"].storage
    assert root["t"].stride == (1, 4)
    assert root["row"].offset == 4
    assert root["cols"].stride == (4, 2)


def test_dtypes_bf16_fp8_uint16_empty_scalar(tmp_path: Path) -> None:
    values = {
        "bf16": torch.ones(3, dtype=torch.bfloat16),
        "fp8": torch.zeros(4, dtype=torch.float8_e4m3fn),
        "u16": torch.zeros(2, dtype=torch.uint16),
        "empty": torch.zeros(0, 5),
        "scalar": torch.tensor(3.5),
        "param": nn_parameter(),
        "conj": torch.tensor([1 + 2j]).conj(),
    }
    torch.save(values, tmp_path / "dtypes.pth")
    root = open_checkpoint(tmp_path / "dtypes.pth").root
    assert root["bf16"].dtype == "bfloat16"
    assert root["fp8"].dtype == "float8_e4m3fn"
    assert root["u16"].dtype == "uint16"
    assert root["empty"].shape == (0, 5)
    assert root["scalar"].shape == ()
    assert root["param"].parameter
    assert root["conj"].metadata == {"conj": True}


def nn_parameter() -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.ones(2))


def test_20000_keys_are_all_listed_in_file_order(tmp_path: Path) -> None:
    torch.save(many_keys(20_000), tmp_path / "many.pth")
    info = summarize(open_checkpoint(tmp_path / "many.pth")).to_json()
    assert info["tensor_count"] == 20_000
    assert info["tensors"][-1]["path"] == ["layers.4999.p3"]


def test_whole_module_pickle_without_class(tmp_path: Path) -> None:
    path = save_whole_module(tmp_path / "whole.pt")
    ckpt = open_checkpoint(path)
    assert isinstance(ckpt.root, Opaque) and ckpt.root.is_module
    assert ckpt.root.global_name == "ghost_models.GhostNet"
    paths = [p for p, _ in iter_tensors(ckpt.root)]
    assert (Attr("scale"),) in paths
    assert (Attr("scratch"),) not in paths  # non-persistent buffer
    weight = get(ckpt.root, (Attr("encoder"), Attr("0"), Attr("weight")))
    assert weight.shape == (4, 4) and weight.parameter
    found = kinds(path)
    assert "module-pickle" in found
    assert any(f["global"] == "ghost_models.GhostNet" for f in found["unsafe-global"])


def test_a_whole_model_is_one_finding_and_torchscript_says_so(tmp_path: Path) -> None:
    """One module-pickle finding for the model, not one per submodule (silero-vad's TorchScript file gave 55)."""
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
    torch.save(net, tmp_path / "net.pt")
    torch.jit.save(torch.jit.script(net), str(tmp_path / "net.jit"))
    pickled = [f for f in summarize(open_checkpoint(tmp_path / "net.pt")).findings if f.kind == "module-pickle"]
    scripted = [f for f in summarize(open_checkpoint(tmp_path / "net.jit")).findings if f.kind == "module-pickle"]
    assert [f.path for f in pickled] == [()] and "a whole pickled nn.Module at the root" in pickled[0].message
    assert [f.path for f in scripted] == [()] and "a TorchScript module at the root" in scripted[0].message
    assert "without its code" in scripted[0].message


def test_data_parallel_module_pickle(tmp_path: Path) -> None:
    ckpt = open_checkpoint(save_whole_module(tmp_path / "dp.pt", data_parallel=True))
    assert ckpt.root.global_name == "torch.nn.parallel.data_parallel.DataParallel"
    assert get(ckpt.root, (Attr("module"), Attr("head"), Attr("weight"))).shape == (2, 4)


def test_legacy_format(tmp_path: Path) -> None:
    state = training_checkpoint()
    torch.save(state, tmp_path / "old.pth", _use_new_zipfile_serialization=False)
    ckpt = open_checkpoint(tmp_path / "old.pth")
    assert ckpt.format == "legacy"
    assert list(ckpt.root["model"]) == list(state["model"])
    assert ckpt.root["model"]["module.head.weight"].shape == (10, 8)


def test_plain_pickle(tmp_path: Path) -> None:
    import pickle

    (tmp_path / "p.pkl").write_bytes(pickle.dumps({"epoch": 3, "names": ["a", "b"]}, protocol=2))
    ckpt = open_checkpoint(tmp_path / "p.pkl")
    assert ckpt.format == "pickle"
    assert ckpt.root == {"epoch": 3, "names": ["a", "b"]}


def test_protocol_4(tmp_path: Path) -> None:
    torch.save(tiny_state_dict(), tmp_path / "p4.pth", pickle_protocol=4)
    assert list(open_checkpoint(tmp_path / "p4.pth").root) == list(tiny_state_dict())


def test_safetensors_header_only(tmp_path: Path) -> None:
    state = {k: v.contiguous() for k, v in tiny_state_dict().items()}
    state["bf"] = torch.ones(2, 3, dtype=torch.bfloat16)
    path = write_safetensors(state, tmp_path / "m.safetensors", metadata={"format": "pt"})
    ckpt = open_checkpoint(path)
    assert ckpt.format == "safetensors"
    assert ckpt.metadata == {"format": "pt"}
    assert set(ckpt.root) == set(state)
    assert ckpt.root["bf"].dtype == "bfloat16" and ckpt.root["bf"].shape == (2, 3)


@pytest.mark.parametrize("writer", [write_sharded_safetensors, write_sharded_bin])
def test_sharded_as_one_checkpoint(tmp_path: Path, writer) -> None:
    state = tiny_state_dict()
    index = writer(dict(state), tmp_path)
    for target in (index, tmp_path):
        ckpt = open_checkpoint(target)
        assert ckpt.format == "sharded"
        assert set(ckpt.root) == set(state)
        assert ckpt.root["head.weight"].shape == (10, 8)


def test_dcp_directory(tmp_path: Path) -> None:
    folder = write_dcp({"model": dict(tiny_state_dict()), "step": 7}, tmp_path / "dcp")
    ckpt = open_checkpoint(folder)
    assert ckpt.format == "dcp"
    assert ckpt.root["model"]["head.weight"].shape == (10, 8)
    assert ckpt.root["model"]["head.weight"].dtype == "float32"


def test_torchscript_lists_tensors_without_running(tmp_path: Path) -> None:
    ckpt = open_checkpoint(write_torchscript(tmp_path / "ts.pt"))
    assert ckpt.format == "torchscript"
    shapes = sorted(t.shape for _, t in iter_tensors(ckpt.root))
    assert shapes == [(2,), (2, 3)]


def test_summary_totals_are_those_of_a_walk_below_the_root(tmp_path: Path) -> None:
    from torch import nn

    from ckpt_tui.core.model.describe import totals

    shared = torch.ones(3, 4)
    listed = [shared, torch.zeros(5)]
    model = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    tree = {
        "a": shared,
        "b": shared,
        "lists": [listed, listed],
        "module": model,
        "sparse": torch.eye(4).to_sparse(),
        "nested": {"x": {"y": shared, "z": torch.arange(6, dtype=torch.int16)}},
        "meta": torch.empty(7, device="meta"),
    }
    path = tmp_path / "tricky.pt"
    torch.save(tree, path)
    checkpoint = open_checkpoint(path)
    assert summarize(checkpoint).totals() == totals(checkpoint.root)


@pytest.mark.parametrize(
    ("shape", "stride", "offset", "message"),
    [
        ((2, 3), (3, 2**63), 0, "a tensor stride does not fit in int64"),
        ((2, -3), (3, 1), 0, "a tensor size is negative"),
        ((2, True), (1, 1), 0, "a tensor size does not fit in int64"),
        ((2**40, 2**40), (1, 1), 0, "a tensor has more elements than int64 can count"),
        ((2, 3), (3, 1), -(2**63) - 1, "a tensor offset does not fit in int64"),
    ],
)
def test_a_bad_tensor_among_many_is_refused_as_when_alone(
    shape: tuple[int, ...], stride: tuple[int, ...], offset: int, message: str
) -> None:
    from ckpt_tui.core.errors import ReadError
    from ckpt_tui.core.model.tree import Storage, check_tree

    storage = Storage("0", "float32", "cpu", 6, None)
    bad = Tensor(storage, offset, shape, stride, "float32")
    many = {f"w{i}": Tensor(storage, 0, (2, 3), (3, 1), "float32") for i in range(50)}
    for tree in ({"bad": bad}, {**many, "bad": bad}, {"bad": bad, **many}):
        with pytest.raises(ReadError, match=message):
            check_tree(tree)
    check_tree(many)


def test_a_safetensors_entry_of_100000_dimensions_reads_in_linear_time(tmp_path: Path) -> None:
    header = json.dumps({"big": {"dtype": "U8", "shape": [1] * 100_000, "data_offsets": [0, 1]}}).encode()
    header += b" " * (-len(header) % 8)
    (tmp_path / "dims.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0")
    tensor = open_checkpoint(tmp_path / "dims.safetensors").root["big"]
    assert tensor.shape == (1,) * 100_000 and set(tensor.stride) == {1}
