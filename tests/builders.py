"""Checkpoint files built with real torch, for the tests (nothing binary is committed)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pickle
import sys
import types
import zipfile
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn


class TinyNet(nn.Module):
    """A small model with conv, batchnorm and a classifier head."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.bn(self.conv(x)).mean((2, 3)))


def torch_loads(path: Path) -> bool:
    """Whether the real ``torch.load(path, weights_only=True)`` loads the file (its refusal is never code run)."""
    try:
        torch.load(path, weights_only=True)
    except Exception:
        return False
    return True


def tiny_state_dict(classes: int = 10) -> OrderedDict[str, torch.Tensor]:
    """A plain state_dict (with ``_metadata``)."""
    torch.manual_seed(0)
    return TinyNet(classes).state_dict()


def ddp_state_dict() -> OrderedDict[str, torch.Tensor]:
    """What DataParallel/DDP's ``state_dict()`` gives: every key under ``module.``."""
    torch.manual_seed(0)
    return nn.DataParallel(TinyNet()).state_dict()


def compiled_state_dict() -> OrderedDict[str, torch.Tensor]:
    """``torch.compile(model).state_dict()``: keys under ``_orig_mod.`` (nothing is compiled)."""
    torch.manual_seed(0)
    return torch.compile(TinyNet()).state_dict()


def training_checkpoint(model_key: str = "model") -> dict[str, Any]:
    """A DDP training checkpoint with Adam state, a scheduler and a Namespace."""
    torch.manual_seed(0)
    wrapped = nn.DataParallel(TinyNet())
    optimizer = torch.optim.Adam(wrapped.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 5)
    wrapped(torch.randn(2, 3, 6, 6)).sum().backward()
    optimizer.step()
    scheduler.step()
    return {
        "epoch": 3,
        model_key: wrapped.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "args": argparse.Namespace(lr=1e-3, arch="tiny"),
    }


def lightning_checkpoint() -> dict[str, Any]:
    """The layout Lightning writes: ``state_dict`` with ``model.`` keys, loops, callbacks."""
    torch.manual_seed(0)
    return {
        "epoch": 1,
        "global_step": 10,
        "pytorch-lightning_version": "2.4.0",
        "state_dict": OrderedDict(("model." + k, v) for k, v in TinyNet().state_dict().items()),
        "loops": {"fit_loop": {}},
        "callbacks": {},
        "optimizer_states": [],
        "lr_schedulers": [],
    }


def many_keys(count: int) -> OrderedDict[str, torch.Tensor]:
    """A flat state_dict with ``count`` small tensors."""
    return OrderedDict((f"layers.{i // 4}.p{i % 4}", torch.full((2,), float(i))) for i in range(count))


def leave_process_group() -> None:
    """End a gloo run's process once its files are written: a last barrier, then exit without interpreter teardown.

    Gloo's worker threads can outlive ``destroy_process_group`` and abort the process ("terminate called without
    an active exception", SIGABRT) while Python tears down; a test that judges the run by its exit code then fails
    on a run whose files are whole (seen once in CI, under load)."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # torch.save has closed every file by now: nothing is lost by skipping the interpreter's teardown
    os._exit(0)


@contextlib.contextmanager
def saved_on(device: str) -> Iterator[None]:
    """Make ``torch.save`` tag CPU storages with ``device`` (a GPU-saved file without a GPU)."""
    registry = torch.serialization._package_registry
    before = list(registry)
    torch.serialization.register_package(
        -100, lambda s: device if s.device.type == "cpu" else None, lambda o, loc: None
    )
    try:
        yield
    finally:
        registry[:] = before


def save_cuda_tagged(obj: Any, path: Path, device: str = "cuda:0", **kwargs: Any) -> Path:
    """``torch.save`` with every storage tagged ``device``."""
    with saved_on(device):
        torch.save(obj, path, **kwargs)
    return path


@contextlib.contextmanager
def ghost_module(name: str = "ghost_models") -> Iterator[types.ModuleType]:
    """A module that exists only while saving: classes in it are not importable afterwards."""
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        yield module
    finally:
        del sys.modules[name]


def save_whole_module(path: Path, data_parallel: bool = False) -> Path:
    """``torch.save(model)`` of a model whose class cannot be imported when reading."""
    with ghost_module() as module:

        class GhostNet(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.encoder = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
                self.head = nn.Linear(4, 2)
                self.register_buffer("scale", torch.ones(2))
                self.register_buffer("scratch", torch.zeros(2), persistent=False)

        GhostNet.__module__ = module.__name__
        GhostNet.__qualname__ = "GhostNet"
        module.GhostNet = GhostNet  # type: ignore[attr-defined]
        torch.manual_seed(0)
        model: nn.Module = GhostNet()
        if data_parallel:
            model = nn.DataParallel(model)
        torch.save(model, path)
        return path


def write_safetensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> Path:
    """Save with safetensors' own writer."""
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata=metadata)
    return path


def save_by_suffix(state: dict[str, torch.Tensor], path: Path) -> Path:
    """``state`` saved as its file name says: torch.save for ``.pth``, a safetensors file otherwise."""
    if path.suffix == ".pth":
        torch.save(state, path)
    else:
        write_safetensors(state, path)
    return path


def write_sharded_safetensors(state: dict[str, torch.Tensor], folder: Path, shards: int = 2) -> Path:
    """A HF-style sharded safetensors checkpoint with ``model.safetensors.index.json``."""
    keys = list(state)
    weight_map: dict[str, str] = {}
    for index in range(shards):
        name = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: state[k].contiguous() for k in keys[index::shards]}
        write_safetensors(part, folder / name)
        weight_map.update(dict.fromkeys(part, name))
    index_path = folder / "model.safetensors.index.json"
    index_path.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return index_path


def write_sharded_bin(state: dict[str, torch.Tensor], folder: Path, shards: int = 2) -> Path:
    """A ``pytorch_model.bin.index.json`` checkpoint of torch zip shards."""
    keys = list(state)
    weight_map: dict[str, str] = {}
    for index in range(shards):
        name = f"pytorch_model-{index + 1:05d}-of-{shards:05d}.bin"
        part = {k: state[k] for k in keys[index::shards]}
        torch.save(part, folder / name)
        weight_map.update(dict.fromkeys(part, name))
    index_path = folder / "pytorch_model.bin.index.json"
    index_path.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index_path


def write_dcp(state: dict[str, Any], folder: Path) -> Path:
    """A ``torch.distributed.checkpoint`` directory written in one process."""
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(folder))
    return folder


def write_torchscript(path: Path) -> Path:
    """``torch.jit.save`` of a scripted module."""
    module = torch.jit.script(nn.Sequential(nn.Linear(3, 2), nn.ReLU()))
    torch.jit.save(module, str(path))
    return path


def rewrite_zip(source: Path, target: Path, drop: str | None = None, data_pkl: bytes | None = None) -> Path:
    """Copy a zip checkpoint, leaving out members ending in ``drop`` or replacing ``data.pkl``."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            if drop and info.filename.endswith(drop):
                continue
            data = data_pkl if data_pkl is not None and info.filename.endswith("/data.pkl") else src.read(info)
            dst.writestr(info.filename, data)
    return target


class Payload:
    """An object whose unpickling calls ``func(*args)``: what a hostile checkpoint carries."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func = func
        self.args = args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.func, self.args


def touch_command(canary: Path) -> str:
    """A shell command that creates the canary file."""
    return f"touch {canary}"


def raw_pickles(canary: Path) -> dict[str, bytes]:
    """Hand-written hostile pickles, one per opcode path, each creating ``canary`` if run."""
    cmd = touch_command(canary).encode()
    code = f"open({str(canary)!r}, 'w').close()".encode()
    return {
        "GLOBAL+REDUCE os.system": b"cos\nsystem\n(S'" + cmd + b"'\ntR.",
        "INST os.system": b"(S'" + cmd + b"'\nios\nsystem\n.",
        "OBJ os.system": b"(cos\nsystem\nS'" + cmd + b"'\no.",
        "NEWOBJ subprocess.Popen": b"\x80\x02csubprocess\nPopen\nX" + _u32(cmd) + b"\x85\x81.",
        "BUILD __setstate__ builtins.exec": b"\x80\x02cbuiltins\nexec\n)\x81X" + _u32(code) + b"b.",
        "REDUCE builtins.eval": b"\x80\x02cbuiltins\neval\nX" + _u32(code) + b"\x85R.",
        "chain builtins.getattr importlib.import_module": (
            b"\x80\x02cbuiltins\ngetattr\ncimportlib\nimport_module\nX\x02\x00\x00\x00os\x85RX\x06\x00\x00\x00system"
            b"\x86RX" + _u32(cmd) + b"\x85R."
        ),
        "STACK_GLOBAL posix.system": pickle.dumps(Payload(os.system, touch_command(canary)), protocol=4),
        "EXT1 extension code": b"\x80\x02\x82\x01.",
    }


def _u32(data: bytes) -> bytes:
    return len(data).to_bytes(4, "little") + data


def torch_bytes(obj: Any, **kwargs: Any) -> bytes:
    """``torch.save`` into memory."""
    buffer = io.BytesIO()
    torch.save(obj, buffer, **kwargs)
    return buffer.getvalue()


BATCHED_DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
]
"""The dtypes the batched readers answer (floats, ints, bool): what their tests mix in one file."""


def version_guard_aside(root: Any) -> None:
    """Let the tensors below ``root`` be read whatever their file became (their sources hold no version):
    for tests of short reads of a file cut after it was opened, which the guard would refuse first
    (tests/test_file_changed.py)."""
    from ckpt_tui.core.model.tree import iter_tensors

    for _, tensor in iter_tensors(root):
        if tensor.storage is not None and tensor.storage.source is not None:
            tensor.storage.source.version = None
