"""A ``.pth`` state_dict keeps the columns' promise (``FlatColumns``) or gets no columns.

``torch.save(model.state_dict())`` is summed up from columns, as a safetensors file is. Every case
here is compared with the walked path on the same tree, as text and JSON; the layouts the columns
cannot promise (shared storages, views, GPU tags, Parameters, an odd ``_metadata``, a missing
record) are walked, and say what they said before.
"""

from __future__ import annotations

import collections
import dataclasses
import struct
import zipfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from builders import rewrite_zip, save_cuda_tagged
from builders_readers import summaries
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.operations.check import check_checkpoint
from ckpt_tui.core.readers.open import open_checkpoint

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int8, torch.bool]
DTYPES += [torch.uint16, torch.float8_e4m3fn]  # written with _rebuild_tensor_v3
KEY_PARTS = ["module", "_orig_mod", "model", "layer", "bn", "0", "weight", "bias", "running_mean", "running_var"]
KEY_PARTS += ["num_batches_tracked", "state_dict", "loops", "last_epoch", "_metadata", "é"]


@settings(
    max_examples=40,
    deadline=timedelta(seconds=10),
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    keys=st.lists(st.lists(st.sampled_from(KEY_PARTS), min_size=1, max_size=4), min_size=1, max_size=10),
    dtypes=st.lists(st.sampled_from(DTYPES), min_size=10, max_size=10),
    shapes=st.lists(st.lists(st.integers(0, 3), max_size=3), min_size=10, max_size=10),
    ordered=st.booleans(),
)
def test_columns_say_what_the_walk_says(
    tmp_path: Path, keys: list[list[str]], dtypes: list[torch.dtype], shapes: list[list[int]], ordered: bool
) -> None:
    names = list(dict.fromkeys(".".join(parts) for parts in keys))
    state = {name: torch.zeros(shapes[i], dtype=dtypes[i]) for i, name in enumerate(names)}
    path = tmp_path / "model.pth"
    torch.save(collections.OrderedDict(state) if ordered else state, path)
    chosen, walked = summaries(path, columns=True)
    assert chosen == walked


def test_a_module_state_dict_with_its_metadata(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2))
    torch.save(model.state_dict(), tmp_path / "model.pth")
    chosen, walked = summaries(tmp_path / "model.pth", columns=True)
    assert chosen == walked
    assert "buffers" in chosen[0]


def _tied() -> dict[str, Any]:
    weight = torch.randn(4, 3)
    return {"embed.weight": weight, "head.weight": weight}


def _view() -> dict[str, Any]:
    base = torch.randn(6, 4)
    return {"a": base[:3], "b": base[3:]}


def _odd_metadata() -> Any:
    state = nn.Linear(3, 2).state_dict()
    state._metadata[""]["note"] = 1.5  # type: ignore[attr-defined]
    return state


WALKED = {
    "tied weights": _tied,
    "views of one storage": _view,
    "an offset into a larger storage": lambda: {"a": torch.randn(10)[2:5].clone()[1:]},
    "a transposed tensor": lambda: {"a": torch.randn(3, 4).t()},
    "a Parameter": lambda: {"a": nn.Parameter(torch.randn(2))},
    "a tensor that requires grad": lambda: {"a": torch.randn(2, requires_grad=True)},
    "a value that is not a tensor": lambda: {"a": torch.randn(2), "epoch": 3},
    "an int key": lambda: {1: torch.randn(2), "b": torch.randn(2)},
    "an odd _metadata": _odd_metadata,
    "a sparse tensor": lambda: {"a": torch.randn(3, 3).to_sparse()},
    "a quantized tensor": lambda: {"a": torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8)},
}


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
@pytest.mark.parametrize("make", WALKED.values(), ids=WALKED.keys())
def test_what_the_columns_cannot_promise_is_walked(tmp_path: Path, make: Any) -> None:
    path = tmp_path / "model.pth"
    torch.save(make(), path)
    chosen, walked = summaries(path, columns=False)
    assert chosen == walked


def test_a_gpu_tag_is_walked_and_named(tmp_path: Path) -> None:
    path = save_cuda_tagged({"a": torch.randn(2), "b": torch.randn(3)}, tmp_path / "gpu.pth")
    chosen, walked = summaries(path, columns=False)
    assert chosen == walked
    assert "cuda" in chosen[0]


def test_a_missing_record_is_walked_and_named(tmp_path: Path) -> None:
    torch.save({"a": torch.randn(2), "b": torch.randn(3)}, tmp_path / "whole.pth")
    path = rewrite_zip(tmp_path / "whole.pth", tmp_path / "holed.pth", drop="data/1")
    chosen, walked = summaries(path, columns=False)
    assert chosen == walked
    assert "missing" in chosen[0]


BAD_SIZES = {
    "past int64": (b"\x8a\x09" + (1 << 64).to_bytes(9, "little") + b"\x85", "tensor size is out of range"),
    "negative": (b"J\xff\xff\xff\xff\x85", "tensor size is out of range"),
    "a bool": (b"\x88\x85", "tensor size is not a tuple of ints"),
    "a float": (b"G" + struct.pack(">d", 3.0) + b"\x85", "tensor size is not a tuple of ints"),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint16], ids=["v2", "v3"])
@pytest.mark.parametrize(("size", "message"), BAD_SIZES.values(), ids=BAD_SIZES.keys())
def test_a_bad_size_is_still_refused(tmp_path: Path, dtype: torch.dtype, size: bytes, message: str) -> None:
    """The unpickler checks sizes in bulk after the load: a bad one is refused in the same words."""
    torch.save({"a": torch.zeros(2, dtype=dtype), "b": torch.zeros(3, dtype=dtype)}, tmp_path / "ok.pth")
    data = zipfile.ZipFile(tmp_path / "ok.pth").read("ok/data.pkl")
    bad = data.replace(b"K\x03\x85", size, 1)  # b's size (3,)
    assert bad != data
    path = rewrite_zip(tmp_path / "ok.pth", tmp_path / "bad.pth", data_pkl=bad)
    with pytest.raises(ReadError, match=f"corrupt pickle \\(ValueError: {message}\\)"):
        open_checkpoint(path)


def test_check_reads_a_flat_file_as_it_reads_a_walked_one(tmp_path: Path) -> None:
    state = {f"module.l{i}.weight": torch.randn(3, 4) for i in range(70)}
    state["module.l5.weight"][1, 2] = float("nan")
    state["module.bn.running_var"] = torch.full((3,), float("inf"))
    state["module.bn.num_batches_tracked"] = torch.tensor(7)
    torch.save(state, tmp_path / "m.pth")
    checkpoint = open_checkpoint(tmp_path / "m.pth")
    assert checkpoint.flat_columns() is not None
    flat = check_checkpoint(checkpoint).to_json()
    walked = check_checkpoint(dataclasses.replace(checkpoint, columns=None)).to_json()
    assert flat == walked
    assert [p["kind"] for p in flat["problems"]].count("nan") == 1


def mixed_state() -> dict[str, torch.Tensor]:
    """Every kind of dtype the batched scan reads or leaves to the exact pass, and an empty tensor."""
    state = {"f32": torch.randn(3, 4), "empty": torch.zeros(0, 3), "c64": torch.randn(5).to(torch.complex64)}
    state |= {"i64": torch.arange(4), "scalar": torch.tensor(3.0), "bf16": torch.randn(2, 2).to(torch.bfloat16)}
    return state | {"bool": torch.ones(3, dtype=torch.bool), "u16": torch.ones(3, dtype=torch.uint16)}


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_the_batched_plan_of_a_state_dict_is_the_loops(
    tmp_path: Path, suffix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from builders import save_by_suffix

    from ckpt_tui.core.values import view_spans

    checkpoint = open_checkpoint(save_by_suffix(mixed_state(), tmp_path / f"m{suffix}"))
    tensors = list(checkpoint.root.values())
    bulk = view_spans.plan_views(tensors)
    assert view_spans._plan_in_bulk(tensors) is not None
    monkeypatch.setattr(view_spans, "_plan_in_bulk", lambda tensors: None)
    assert bulk == view_spans.plan_views(tensors)
    assert len(bulk.index) == 6  # all but the empty and the complex tensor


def test_a_bad_size_before_a_later_failure_is_the_error(tmp_path: Path) -> None:
    """torch meets the first bad tensor first: its error is reported, not one found further on."""
    torch.save({"a": torch.zeros(2), "b": torch.zeros(3)}, tmp_path / "ok.pth")
    data = zipfile.ZipFile(tmp_path / "ok.pth").read("ok/data.pkl")
    bad = data.replace(b"K\x02\x85", b"J\xff\xff\xff\xff\x85", 1)  # a's size (2,) made (-1,)
    assert bad != data
    path = rewrite_zip(tmp_path / "ok.pth", tmp_path / "cut.pth", data_pkl=bad[:-6])  # and cut short
    with pytest.raises(ReadError, match=r"corrupt pickle \(ValueError: tensor size is out of range\)"):
        open_checkpoint(path)


def test_tensors_sharing_a_long_size_tuple_are_refused_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A memo-shared size tuple of 8,000 huge sizes: refused as before, and its whole product (a
    quarter-second each) computed at most once, for the one exact refusal, not once per tensor."""
    import math
    import types

    from ckpt_tui.core.model.tree import Storage, Tensor
    from ckpt_tui.core.pickles import unpickle

    long_products: list[int] = []

    def prod(values: tuple[int, ...]) -> int:
        if len(values) > unpickle.SHORT_SHAPE:
            long_products.append(len(values))
        return math.prod(values)

    monkeypatch.setattr(unpickle, "math", types.SimpleNamespace(prod=prod))
    shape, stride = (2**62,) * 8000, (1,) * 8000
    storage = Storage("0", "float32", "cpu", 3)
    tensors = [Tensor(storage, 0, shape, stride, "float32") for _ in range(200)]
    with pytest.raises(ValueError, match="more elements than int64 can count"):
        unpickle.check_unchecked(tensors)
    assert long_products == [8000]


def test_records_of_the_wrong_size_are_named_in_the_pickles_order(tmp_path: Path) -> None:
    """Records are looked up in one pass once the pickle is read: the first short one (in the pickle's
    order) is named, the others counted, and torch.load refuses the file as said."""
    torch.save({f"w{i}": torch.zeros(4) for i in range(5)}, tmp_path / "ok.pth")
    with zipfile.ZipFile(tmp_path / "ok.pth") as src, zipfile.ZipFile(tmp_path / "short.pth", "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info.filename, data[:8] if info.filename.endswith(("data/3", "data/1")) else data)
    checkpoint = open_checkpoint(tmp_path / "short.pth")
    assert checkpoint.loader_problems == [
        "record ok/data/1 holds 8 bytes where its storage needs 16 (and 1 more): "
        "torch.load refuses records of the wrong size"
    ]
    with pytest.raises(RuntimeError):
        torch.load(tmp_path / "short.pth", weights_only=True)


@pytest.mark.parametrize("slot", [b"]", b"}", None])
def test_a_memo_slot_of_the_storage_word_rewritten_to_an_unhashable_value_is_one_line_exit_2(tmp_path, capsys, slot):
    """A state_dict whose memo slot 4 (the word "storage" every persistent id reads back) is put again with a list,
    a dict or the OrderedDict() of a tensor's hooks: torch refuses it; every command says so in one line, exit 2,
    check --json keeps its document (the column path's sets of values took unhashables: a traceback, exit 1)."""
    import pickletools

    from builders_weights_only import checked_answer, torch_answer

    from ckpt_tui.cli import main

    path = tmp_path / "sd.pth"
    torch.save(collections.OrderedDict([("a", torch.ones(2)), ("b", torch.zeros(3))]), path)
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith("data.pkl"))
        data = archive.read(name)
    ops = list(pickletools.genops(data))
    # right after the first tensor's hooks OrderedDict() is built (the second REDUCE)
    at = [pos for op, _, pos in ops if op.name == "REDUCE"][1] + 1
    patched = data[:at] + (b"q\x04" if slot is None else slot + b"q\x040") + data[at:]
    path = rewrite_zip(path, tmp_path / "hostile.pth", data_pkl=patched)
    assert torch_answer(path) == "refuses" and checked_answer(path, capsys) == "refuses"
    for command in ("check", "info", "stats"):
        assert main([command, str(path)]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "Traceback" not in err and "Loaded" not in err
