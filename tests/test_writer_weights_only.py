"""convert's .pth output loads with ``torch.load(weights_only=True)`` whenever its source does, bit for bit.

A matrix of torch-built sources (plain, views, Parameters, hooks, ``_metadata``, unusual dtypes,
sparse, quantized, nested containers, a training checkpoint), each saved as torch saves it (zip
at protocol 2, the legacy format, protocol 4), times every edit ``convert`` makes. The output is
loaded with the real ``torch.load(weights_only=True)`` and compared with the objects the source
was built from: same containers, keys, ``_metadata``, Parameter-ness, requires_grad and bytes.
"""

from __future__ import annotations

import contextlib
import io
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_writer import SOURCES, loads_with_torch, raw_bytes_of, save_source, torch_load
from torch import nn

from ckpt_tui.cli import main

LAYOUTS = ("zip", "legacy", "protocol4")
EDITS = ("none", "drop", "rename", "add-prefix", "extract", "map-location", "dtype")
FLOATS = {torch.float32, torch.float64, torch.bfloat16, torch.float16}


def first_key(obj: dict[str, Any]) -> str:
    return next(iter(obj))


def first_dict_key(obj: dict[str, Any]) -> str | None:
    return next((k for k, v in obj.items() if isinstance(v, dict) and v), None)


def same_kind(source: dict[Any, Any], items: list[tuple[Any, Any]]) -> dict[Any, Any]:
    new: dict[Any, Any] = type(source)(dict(items)) if type(source) is not dict else dict(items)
    if hasattr(source, "_metadata"):
        new._metadata = source._metadata  # type: ignore[attr-defined]
    return new


def cast_tensor(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.layout != torch.strided or tensor.is_quantized or tensor.dtype not in FLOATS:
        return tensor
    if isinstance(tensor, nn.Parameter):
        cast = nn.Parameter(tensor.detach().to(torch.float16), requires_grad=tensor.requires_grad)
        cast.__dict__.update(tensor.__dict__)
        return cast
    return tensor.detach().to(torch.float16).requires_grad_(tensor.requires_grad)


def map_tensors(obj: Any, change: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return change(obj)
    if isinstance(obj, dict):
        return same_kind(obj, [(k, map_tensors(v, change)) for k, v in obj.items()])
    if isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
        return type(obj)(map_tensors(v, change) for v in obj)
    return obj


def edit_case(edit: str, source: dict[str, Any]) -> tuple[list[str], Any] | None:
    """The convert options for ``edit`` and what torch should load from the output (None: not applicable)."""
    key = first_key(source)
    if edit == "none" or edit == "map-location":
        return ([] if edit == "none" else ["--map-location", "cuda:1"]), source
    if edit == "drop":
        return ["--drop", key], same_kind(source, [(k, v) for k, v in source.items() if k != key])
    if edit == "rename":
        return ["--rename", f"{key}=renamed"], same_kind(
            source, [("renamed" if k == key else k, v) for k, v in source.items()]
        )
    if edit == "add-prefix":
        expected = same_kind(source, [("x." + k, v) for k, v in source.items()])
        if hasattr(source, "_metadata"):
            expected._metadata = OrderedDict(("x." + k if k else "x", v) for k, v in source._metadata.items())
        return ["--add-prefix", "x.", "--at", "/"], expected
    if edit == "extract":
        inner = first_dict_key(source)
        return None if inner is None else (["--extract", inner], source[inner])
    assert edit == "dtype"
    if not any(isinstance(t, torch.Tensor) and cast_tensor(t) is not t for t in leaves(source)):
        return None
    return ["--dtype", "float16", "--at", "/"], map_tensors(source, cast_tensor)


def leaves(obj: Any) -> list[Any]:
    if isinstance(obj, dict):
        return [leaf for v in obj.values() for leaf in leaves(v)]
    if isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
        return [leaf for v in obj for leaf in leaves(v)]
    return [obj]


def assert_equivalent(got: Any, want: Any, where: str = "root") -> None:
    """Same structure and values; tensors compared by kind, dtype, shape, flags and raw bytes."""
    assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, torch.Tensor):
        assert_same_tensor(got, want, where)
    elif isinstance(want, dict):
        assert list(got) == list(want), where
        assert getattr(got, "_metadata", None) == getattr(want, "_metadata", None), f"{where}._metadata"
        for key, value in want.items():
            assert_equivalent(got[key], value, f"{where}[{key!r}]")
    elif isinstance(want, (list, tuple)) and not isinstance(want, torch.Size):
        assert len(got) == len(want), where
        for index, (a, b) in enumerate(zip(got, want, strict=True)):
            assert_equivalent(a, b, f"{where}[{index}]")
    else:
        assert got == want, where


def assert_same_tensor(got: torch.Tensor, want: torch.Tensor, where: str) -> None:
    assert (got.dtype, got.shape, got.layout) == (want.dtype, want.shape, want.layout), where
    assert got.requires_grad == want.requires_grad, f"{where}: requires_grad"
    assert got.is_quantized == want.is_quantized, where
    if isinstance(want, nn.Parameter):
        assert got.__dict__.keys() >= {k for k in want.__dict__ if not k.startswith("_")}, f"{where}: state"
        for name, value in want.__dict__.items():
            if not name.startswith("_"):
                assert getattr(got, name) == value, f"{where}.{name}"
    if want.is_quantized:
        assert got.qscheme() == want.qscheme(), where
        if want.qscheme() == torch.per_tensor_affine:
            assert (got.q_scale(), got.q_zero_point()) == (want.q_scale(), want.q_zero_point()), where
        else:
            assert torch.equal(got.q_per_channel_scales(), want.q_per_channel_scales()), where
            assert torch.equal(got.q_per_channel_zero_points(), want.q_per_channel_zero_points()), where
            assert got.q_per_channel_axis() == want.q_per_channel_axis(), where
        assert raw_bytes_of(got.int_repr()) == raw_bytes_of(want.int_repr()), where
    elif want.layout == torch.sparse_coo:
        assert got.is_coalesced() == want.is_coalesced(), where
        assert raw_bytes_of(got._indices()) == raw_bytes_of(want._indices()), where
        assert raw_bytes_of(got._values()) == raw_bytes_of(want._values()), where
    elif want.layout == torch.sparse_csr:
        for part in ("crow_indices", "col_indices", "values"):
            assert raw_bytes_of(getattr(got, part)()) == raw_bytes_of(getattr(want, part)()), f"{where}.{part}"
    else:
        assert got.is_conj() == want.is_conj(), f"{where}: conj bit"
        assert raw_bytes_of(got.detach()) == raw_bytes_of(want.detach()), f"{where}: bytes"


def run_convert(*args: str | Path) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(["convert", *map(str, args)])


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    folder = tmp_path_factory.mktemp("sources")
    return {(name, layout): save_source(name, layout, folder) for name in SOURCES for layout in LAYOUTS}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", list(SOURCES))
def test_output_loads_weights_only_whenever_the_source_does(
    sources: dict[tuple[str, str], Path], tmp_path: Path, name: str, layout: str
) -> None:
    source = sources[(name, layout)]
    source_loads = loads_with_torch(source)
    if layout == "zip":
        assert source_loads, "torch's own zip files at protocol 2 always load weights_only"
    built = SOURCES[name]()
    tried = 0
    for edit in EDITS:
        case = edit_case(edit, built)
        if case is None:
            continue
        options, expected = case
        out = tmp_path / f"{edit}.pth"
        assert run_convert(source, "-o", out, *options) == 0, edit
        tried += 1
        # protocol 4 and legacy fp8/uint16 sources do not load; their output does (it is protocol 2, zip)
        assert loads_with_torch(out), f"{edit}: output refused by torch.load(weights_only=True)"
        assert_equivalent(torch_load(out), expected)
    assert tried >= 4


def test_output_of_a_source_torch_refuses_is_refused_the_same_way(tmp_path: Path) -> None:
    """Safe data outside torch's allowlist (Namespace, numpy, datetime, slice, deque) is kept: output refused too."""
    import argparse
    import collections
    import datetime

    import numpy as np

    values = {
        "args": argparse.Namespace(lr=0.1, arch="tiny"),
        "array": np.arange(6).reshape(2, 3),
        "scalar": np.float32(1.5),
        "when": datetime.datetime(2024, 1, 2, 3, 4),
        "window": slice(1, 5),
        "recent": collections.deque([1, 2]),
        "w": torch.ones(2),
    }
    torch.save(values, tmp_path / "safe.pth")
    assert not loads_with_torch(tmp_path / "safe.pth")
    assert run_convert(tmp_path / "safe.pth", "-o", tmp_path / "out.pth") == 0
    assert not loads_with_torch(tmp_path / "out.pth")
    loaded = torch.load(tmp_path / "out.pth", weights_only=False)
    assert vars(loaded["args"]) == vars(values["args"]) and (loaded["array"] == values["array"]).all()
    assert loaded["scalar"] == values["scalar"] and loaded["when"] == values["when"]
    assert loaded["window"] == values["window"] and loaded["recent"] == values["recent"]
    assert torch.equal(loaded["w"], values["w"])
