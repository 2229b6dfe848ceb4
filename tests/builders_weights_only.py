"""Files for the weights_only verdict and sanitize tests: refused and accepted content, built by torch.

Every builder takes a folder and returns the path it wrote. ``REFUSED`` holds content
``torch.load(weights_only=True)`` refuses, ``ACCEPTED`` content it loads, ``OTHER`` the files the rest
of the test suite builds (hostile, broken, other formats), whatever torch says about them.
"""

from __future__ import annotations

import collections
import datetime
import enum
import functools
import importlib.util
import pathlib
import pickle
import struct
import types
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from builders import (
    ghost_module,
    lightning_checkpoint,
    many_keys,
    raw_pickles,
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
from torch import nn

Builder = Callable[[Path], Path]


def saved(obj: Any, name: str = "ckpt.pth", **kwargs: Any) -> Builder:
    """A builder that ``torch.save``s ``obj`` (built lazily if it is a function)."""

    def build(folder: Path) -> Path:
        path = folder / name
        torch.save(obj() if callable(obj) else obj, path, **kwargs)
        return path

    return build


class Color(enum.Enum):
    """An enum saved by value."""

    RED = 1
    GREEN = 2


class Mode(str, enum.Enum):
    """A string enum, as configs use."""

    TRAIN = "train"


def _ghost_object(folder: Path) -> Path:
    """An instance of a class that cannot be imported when reading (plain attributes only)."""
    with ghost_module("ghost_config") as module:

        class Config:
            def __init__(self) -> None:
                self.lr = 0.1
                self.layers = [64, 32]
                self.name = "run-7"

        Config.__module__ = module.__name__
        Config.__qualname__ = "Config"
        module.Config = Config  # type: ignore[attr-defined]
        path = folder / "custom.pth"
        torch.save({"model": tiny_state_dict(), "config": Config()}, path)
    return path


def _ghost_enum(folder: Path) -> Path:
    """An enum member of a class that cannot be imported when reading."""
    with ghost_module("ghost_enums") as module:
        Phase = enum.Enum("Phase", {"WARMUP": 1, "MAIN": 2})
        Phase.__module__ = module.__name__
        module.Phase = Phase  # type: ignore[attr-defined]
        path = folder / "enum.pth"
        torch.save({"model": tiny_state_dict(), "phase": Phase.MAIN, "history": [Phase.WARMUP, Phase.MAIN]}, path)
    return path


class Scaled(torch.Tensor):
    """A tensor subclass (refused: its class is not allowlisted)."""


def _omegaconf(kind: str) -> Builder:
    def build(folder: Path) -> Path:
        import omegaconf

        if kind == "dict":
            config: Any = omegaconf.OmegaConf.create(
                {"lr": 0.001, "epochs": 3, "name": "x", "layers": [1, 2], "sub": {"on": True, "none": None}}
            )
        else:
            config = omegaconf.OmegaConf.create([1, "two", {"three": 3.0}])
        path = folder / f"omegaconf_{kind}.pth"
        torch.save({"state_dict": tiny_state_dict(), "hyper_parameters": config}, path)
        return path

    return build


def _numpy_arrays() -> dict[str, Any]:
    return {
        "f32": np.arange(6, dtype=np.float32).reshape(2, 3),
        "f64": np.linspace(0, 1, 5),
        "i64": np.array([1, -2, 3], dtype=np.int64),
        "u8": np.array([0, 255], dtype=np.uint8),
        "bool": np.array([True, False]),
        "f16": np.array([1.5, -2.0], dtype=np.float16),
        "c64": np.array([1 + 2j], dtype=np.complex64),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "scalar0d": np.array(3.5),
    }


def _legacy_with_numpy(folder: Path) -> Path:
    path = folder / "legacy_numpy.pth"
    torch.save({"w": torch.ones(3), "mean": np.ones(2)}, path, _use_new_zipfile_serialization=False)
    return path


def _plain_pickle(folder: Path) -> Path:
    path = folder / "plain.pkl"
    path.write_bytes(pickle.dumps({"epoch": 3, "names": ["a", "b"]}, protocol=2))
    return path


def _zip_safetensors_name(folder: Path) -> Path:
    path = folder / "model.safetensors"
    torch.save(tiny_state_dict(), path)
    return path


def _raw(name: str, container: str) -> Builder:
    def build(folder: Path) -> Path:
        data = raw_pickles(folder / "CANARY")[name]
        if container == "plain":
            path = folder / "evil.pkl"
            path.write_bytes(data)
            return path
        torch.save(tiny_state_dict(), folder / "good.pth")
        return rewrite_zip(folder / "good.pth", folder / "evil.pth", data_pkl=data)

    return build


def _zip_with(data_pkl: bytes, name: str = "crafted.pth") -> Builder:
    def build(folder: Path) -> Path:
        torch.save({"w": torch.ones(2)}, folder / "base.pth")
        return rewrite_zip(folder / "base.pth", folder / name, data_pkl=data_pkl)

    return build


def _dropped_record(folder: Path) -> Path:
    torch.save({"w": torch.ones(2), "b": torch.zeros(3)}, folder / "full.pth")
    return rewrite_zip(folder / "full.pth", folder / "missing.pth", drop="data/1")


def _record_compressed(method: int) -> Builder:
    """A record compressed with a method torch's zip reader (miniz: stored and deflate only) cannot read."""

    def build(folder: Path) -> Path:
        torch.save({"w": torch.ones(2), "b": torch.zeros(3)}, folder / "plain.pth")
        path = folder / f"method{method}.pth"
        with zipfile.ZipFile(folder / "plain.pth") as src, zipfile.ZipFile(path, "w") as dst:
            for info in src.infolist():
                dst.writestr(info.filename, src.read(info), method if info.filename.endswith("data/1") else 0)
        return path

    return build


def _bad_local_header(folder: Path) -> Path:
    """A record whose local header signature is broken (the central directory still lists it)."""
    torch.save({"w": torch.ones(2), "b": torch.zeros(3)}, folder / "plain.pth")
    with zipfile.ZipFile(folder / "plain.pth") as archive:
        at = next(info.header_offset for info in archive.infolist() if info.filename.endswith("data/1"))
    data = bytearray((folder / "plain.pth").read_bytes())
    data[at : at + 4] = b"PK\x00\x00"
    path = folder / "bad_header.pth"
    path.write_bytes(bytes(data))
    return path


def _float_stride(folder: Path) -> Path:
    """A second tensor whose stride is the float 1.0 (equal to the first one's 1): torch's set_() refuses it."""
    torch.save({"w": torch.ones(2), "b": torch.zeros(3)}, folder / "plain.pth")
    data = zipfile.ZipFile(folder / "plain.pth").read("plain/data.pkl")
    strides = data.count(b"K\x01\x85")
    changed = data[::-1].replace(b"K\x01\x85"[::-1], (b"G" + struct.pack(">d", 1.0) + b"\x85")[::-1], 1)[::-1]
    assert strides == 2 and changed != data
    return rewrite_zip(folder / "plain.pth", folder / "float_stride.pth", data_pkl=changed)


def _all_dtypes() -> dict[str, torch.Tensor]:
    values: dict[str, torch.Tensor] = {}
    for dtype in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.complex128,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
        torch.float8_e4m3fnuz,
        torch.float8_e5m2fnuz,
        torch.uint16,
        torch.uint32,
        torch.uint64,
    ):
        values[str(dtype)] = torch.ones(3).to(dtype)
    values["float8_e8m0fnu"] = torch.ones(2).to(torch.float8_e8m0fnu)
    return values


def _parameters_and_metadata() -> Any:
    state = tiny_state_dict()
    param = nn.Parameter(torch.randn(3))
    param.note = "tagged"  # a Parameter with Python state: _rebuild_parameter_with_state
    return {
        "state_dict": state,
        "param": nn.Parameter(torch.ones(2)),
        "frozen": nn.Parameter(torch.ones(2), False),
        "with_state": param,
    }


def _views() -> dict[str, Any]:
    base = torch.arange(12.0).reshape(3, 4)
    conj = torch.tensor([1 + 1j, 2 - 1j]).conj()
    return {
        "a": base,
        "t": base.t(),
        "row": base[1],
        "cols": base[:, ::2],
        "empty": torch.zeros(0, 4),
        "scalar": torch.tensor(2.5),
        "conj": conj,
        "neg": torch.tensor([1.0, 2.0])._neg_view(),
    }


def _quantized() -> dict[str, Any]:
    x = torch.randn(4, 3)
    return {
        "per_tensor": torch.quantize_per_tensor(x, 0.1, 3, torch.qint8),
        "per_tensor_u8": torch.quantize_per_tensor(x, 0.05, 10, torch.quint8),
        "per_channel": torch.quantize_per_channel(
            x, torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0, 1, 2]), 1, torch.qint8
        ),
    }


def _sparse() -> dict[str, Any]:
    dense = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    return {"coo": dense.to_sparse(), "csr": dense.to_sparse_csr(), "csc": dense.to_sparse_csc()}


def _containers() -> dict[str, Any]:
    return {
        "nested": {"a": [1, 2.5, "x", None, True], "b": (torch.ones(1), {"c": OrderedDict(d=torch.zeros(1))})},
        "size": torch.Size([2, 3]),
        "device": torch.device("cpu"),
        "cuda_device": torch.device("cuda", 1),
        "layout": torch.strided,
        "sparse_layout": torch.sparse_coo,
        "dtype": torch.float16,
        "set": {1, 2, 3},
        "complex": 1 + 2j,
        "bytes": b"\x00\xffraw",
        "bytearray": bytearray(b"abc"),
        "counter": collections.Counter("hello"),
        "big_int": 2**70,
        "neg": -5,
        "float": 1e-300,
        "unicode": "żółw \u202e",
    }


def save_whole_module_builder(data_parallel: bool) -> Builder:
    """``torch.save(model)`` of a class that cannot be imported, plain or DataParallel."""
    return lambda folder: save_whole_module(folder / f"module_{data_parallel}.pth", data_parallel)


REFUSED: dict[str, Builder] = {
    "numpy array": saved(lambda: {"model": tiny_state_dict(), "mean": np.arange(3, dtype=np.float32)}),
    "numpy arrays of many dtypes": saved(_numpy_arrays),
    "numpy scalar": saved(lambda: {"best_acc": np.float64(0.93), "step": np.int64(7), "flag": np.bool_(True)}),
    "numpy dtype": saved(lambda: {"dtype": np.dtype("float32")}),
    "numpy object array": saved(lambda: {"ragged": np.array([[1], [2, 3]], dtype=object)}),
    "argparse.Namespace": saved(training_checkpoint),
    "SimpleNamespace": saved(lambda: {"cfg": types.SimpleNamespace(lr=0.1, tags=["a"], nested={"k": 1})}),
    "pathlib": saved(lambda: {"out": pathlib.PosixPath("/runs/7"), "files": [pathlib.Path("a.txt")]}),
    "datetime": saved(
        lambda: {
            "saved": datetime.datetime(2024, 5, 1, 12, 30),
            "took": datetime.timedelta(hours=2),
            "day": datetime.date(2024, 5, 1),
        }
    ),
    "enum": _ghost_enum,
    "int enum and str enum": saved(lambda: {"color": Color.GREEN, "mode": Mode.TRAIN}),
    "custom class": _ghost_object,
    "functools.partial": saved(lambda: {"fn": functools.partial(max, 1), "w": torch.ones(1)}),
    "protocol 4": saved(tiny_state_dict, pickle_protocol=4),
    "protocol 5": saved(tiny_state_dict, pickle_protocol=5),
    "protocol 3": saved(lambda: {"w": torch.ones(2), "b": b"bytes"}, pickle_protocol=3),
    "legacy format with numpy": _legacy_with_numpy,
    "frozenset": saved(lambda: {"keys": frozenset({"a", "b"})}),
    "defaultdict": saved(lambda: {"counts": collections.defaultdict(int, {"a": 1})}),
    "deque": saved(lambda: {"recent": collections.deque([1, 2])}),
    "tensor subclass": saved(lambda: {"s": torch.ones(2).as_subclass(Scaled)}),
    "torch.save of a set with a numpy value": saved(lambda: {np.int64(3)}),
    "plain pickle": _plain_pickle,
    "TorchScript archive": lambda folder: write_torchscript(folder / "script.pt"),
    "torch file named .safetensors": _zip_safetensors_name,
    "missing storage record": _dropped_record,
    "record compressed with bzip2": _record_compressed(zipfile.ZIP_BZIP2),
    "record compressed with lzma": _record_compressed(zipfile.ZIP_LZMA),
    "record with a bad local header": _bad_local_header,
    "a float stride equal to an int one": _float_stride,
}

if importlib.util.find_spec("omegaconf") is not None:  # a small pure-Python test dependency
    REFUSED["OmegaConf DictConfig"] = _omegaconf("dict")
    REFUSED["OmegaConf ListConfig"] = _omegaconf("list")
REFUSED["pickled nn.Module"] = save_whole_module_builder(False)
REFUSED["pickled DataParallel"] = save_whole_module_builder(True)

ACCEPTED: dict[str, Builder] = {
    "plain state_dict with _metadata": saved(tiny_state_dict),
    "every dtype": saved(_all_dtypes),
    "parameters and parameter state": saved(_parameters_and_metadata),
    "views, conj and neg bits, shared storage": saved(_views),
    "nested containers, Size, devices, layouts": saved(_containers),
    "quantized tensors": saved(_quantized),
    "sparse tensors": saved(_sparse),
    "lightning layout": saved(lightning_checkpoint),
    "legacy format": saved(tiny_state_dict, "old.pth", _use_new_zipfile_serialization=False),
    "legacy format with views": saved(_views, "old_views.pth", _use_new_zipfile_serialization=False),
    "cuda-tagged": lambda folder: save_cuda_tagged(tiny_state_dict(), folder / "cuda.pth"),
    "many keys": saved(lambda: many_keys(3000)),
    "meta tensor": saved(lambda: {"m": torch.empty(2, 3, device="meta")}),
    "int keys and tuple values": saved(lambda: {0: (1, 2), 1: [torch.ones(1)], (2, 3): "tuple key"}),
    "empty dict": saved(dict),
    "a bare tensor": saved(lambda: torch.arange(5)),
    "optimizer state": saved(lambda: training_checkpoint()["optimizer"]),
    "sharded .bin": lambda folder: write_sharded_bin(tiny_state_dict(), folder),
}

OTHER: dict[str, Builder] = {
    "safetensors": lambda folder: write_safetensors(dict(tiny_state_dict()), folder / "m.safetensors"),
    "sharded safetensors": lambda folder: write_sharded_safetensors(dict(tiny_state_dict()), folder),
    "dcp": lambda folder: write_dcp({"w": torch.ones(2)}, folder / "dcp"),
    **{
        f"raw {name} ({container})": _raw(name, container)
        for name in raw_pickles(Path("/x"))
        for container in ("zip", "plain")
    },
    "persistent id not a storage": _zip_with(b"\x80\x02X\x03\x00\x00\x00abcQ."),
    "persistent id with os.system type": _zip_with(
        b"\x80\x02(X\x07\x00\x00\x00storagecos\nsystem\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x01tQ."
    ),
    "BUILD on a dict": _zip_with(b"\x80\x02}}b."),
    "BUILD None on a dict": _zip_with(b"\x80\x02}Nb."),
    "BUILD on a set": _zip_with(b"\x80\x02\x8fNb."),
    "SETITEM into a list": _zip_with(b"\x80\x02]K\x00K\x01s."),
    "APPEND to a dict": _zip_with(b"\x80\x02}K\x01a."),
    "REDUCE with a list of arguments": _zip_with(b"\x80\x02ccollections\nOrderedDict\n]R."),
    "NEWOBJ of OrderedDict": _zip_with(b"\x80\x02ccollections\nOrderedDict\n)\x81."),
    "protocol 6 header": _zip_with(b"\x80\x06}."),
    "memo index beyond 2**20": _zip_with(b"\x80\x02}r\x00\x00\x00\x01j\x00\x00\x00\x01."),
    "Python 2 names": _zip_with(b"\x80\x02c__builtin__\nset\n]\x85R."),
    "blocked module": _zip_with(b"\x80\x02cos\ngetcwd\n)R."),
    "nested tensor import needed": _zip_with(b"\x80\x02ctorch.nested._internal.nested_tensor\nNestedTensor\n."),
    "torch.strided as a global": _zip_with(b"\x80\x02ctorch\nstrided\n."),
    "odd SETITEMS": _zip_with(b"\x80\x02}(K\x01u."),
    "requires_grad on an int tensor": _zip_with(
        b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nIntStorage\nX\x01\x00\x00\x00"
        b"0X\x03\x00\x00\x00cpuK\x02tQK\x00K\x02\x85K\x01\x85\x88ccollections\nOrderedDict\n)RtR."
    ),
    "tensor beyond its storage": _zip_with(
        b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00"
        b"0X\x03\x00\x00\x00cpuK\x02tQK\x00K\x05\x85K\x01\x85\x89ccollections\nOrderedDict\n)RtR."
    ),
    "unknown location tag": _zip_with(
        b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00"
        b"0X\x03\x00\x00\x00tpuK\x02tQK\x00K\x02\x85K\x01\x85\x89ccollections\nOrderedDict\n)RtR."
    ),
}


def write_zip_members(path: Path, members: dict[str, bytes]) -> Path:
    """A zip with exactly these members, stored, in this order."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def every_fixture() -> dict[str, Builder]:
    """All builders by name."""
    return {**REFUSED, **ACCEPTED, **OTHER}


class Rebuilt:
    """Pickles as ``func(*args)``: a tensor's own reduction (``tensor.__reduce_ex__(2)``) with arguments edited."""

    def __init__(self, func: Any, args: tuple[Any, ...]) -> None:
        self.func, self.args = func, args

    def __reduce_ex__(self, protocol: object) -> tuple[Any, tuple[Any, ...]]:
        return self.func, self.args


def torch_answer(path: Path) -> str:
    """What the real ``torch.load(path, weights_only=True)`` does: ``loads`` or ``refuses`` (warnings hushed)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.load(path, weights_only=True)
        except Exception:
            return "refuses"
    return "loads"


def checked_answer(path: Path, capsys: Any) -> str:
    """ckpt-tui's verdict on ``path`` as ``check --json`` gives it: ``loads``, ``refuses`` or ``cannot_tell``."""
    import json

    from ckpt_tui.cli import main

    main(["check", "--json", str(path)])
    return str(json.loads(capsys.readouterr().out)["weights_only"]["answer"])
