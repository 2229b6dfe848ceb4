"""Globals are known as data by exact name only, resolved as pickle resolves them (issue 9 §1).

A protocol-4 ``STACK_GLOBAL`` whose name is dotted walks attributes from its module: module
``torch.distributed.checkpoint.filesystem`` with name ``os.system`` is ``os.system``. No module
prefix, however torch-like, makes a name known; every such file is reported by ``check`` (exit 1)
and refused by ``convert`` (exit 2, nothing written).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch
from builders_readers import StorageRef, View, pickle_with_pids, torch_zip_members, write_zip

from ckpt_tui.cli import main
from ckpt_tui.core.operations.info import summarize
from ckpt_tui.core.readers.open import open_checkpoint


def stack_global(module: str, name: str) -> bytes:
    """Protocol 4's STACK_GLOBAL of ``module`` and ``name`` (two SHORT_BINUNICODE, then 0x93)."""
    out = b""
    for part in (module, name):
        raw = part.encode()
        out += b"\x8c" + bytes([len(raw)]) + raw
    return out + b"\x93"


def called(module: str, name: str) -> bytes:
    """The global called with one string argument (REDUCE), as a payload would be."""
    return stack_global(module, name) + b"\x8c\x02id\x85R"


def unsafe(path: Path) -> set[str]:
    findings = summarize(open_checkpoint(path)).findings
    return {f.global_name or "" for f in findings if f.kind == "unsafe-global"}


# Names under every module prefix that was once trusted, and torch functions that touch files.
HOSTILE = [
    ("torch.distributed.checkpoint.filesystem", "os.system"),
    ("torch.distributed.checkpoint.metadata", "os.system"),
    ("torch.distributed.checkpoint", "format_utils.dcp_to_torch_save"),
    ("torch.distributed.checkpoint.format_utils", "dcp_to_torch_save"),
    ("torch.distributed.checkpoint.format_utils", "torch_save_to_dcp"),
    ("torch.distributed._shard.sharded_tensor", "os.system"),
    ("torch.distributed._shard.sharded_tensor.api", "ShardedTensor.__init__"),
    ("__torch__", "os.system"),
    ("__torch__.torch.classes", "builtins.eval"),
    ("torch._utils", "os.system"),
    ("torch._utils", "_rebuild_tensor_v2.__globals__"),
    ("torch", "load"),
    ("torch", "save"),
    ("torch.serialization", "load"),
    ("torch.hub", "load"),
    ("torch.jit", "load"),
    ("numpy", "load"),
    ("numpy.lib.npyio", "load"),
    ("collections", "OrderedDict.fromkeys"),
    ("builtins", "getattr"),
    ("builtins", "eval"),
    ("functools", "partial"),
    ("posix", "system"),
    ("subprocess", "Popen"),
]


@pytest.mark.parametrize(("module", "name"), HOSTILE, ids=[f"{m}:{n}" for m, n in HOSTILE])
def test_plain_pickle_with_the_global_is_unsafe(tmp_path: Path, module: str, name: str, capsys) -> None:
    path = tmp_path / "hostile.pkl"
    path.write_bytes(b"\x80\x04}\x8c\x01x" + called(module, name) + b"s.")
    assert any(found.startswith(module) for found in unsafe(path))
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "unsafe-global" in out and "OK" not in out.split("\n")[0]
    assert main(["convert", str(path), "-o", str(tmp_path / "out.pth")]) == 2
    assert not (tmp_path / "out.pth").exists()
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(("module", "name"), HOSTILE[:10], ids=[f"{m}:{n}" for m, n in HOSTILE[:10]])
def test_torch_zip_with_the_global_beside_a_tensor_is_unsafe(tmp_path: Path, module: str, name: str, capsys) -> None:
    marker = "@@payload@@"
    data_pkl = pickle_with_pids({"w": View(StorageRef(numel=4), 0, (4,), (1,)), "x": marker})
    data_pkl = data_pkl.replace(b"X\x0b\x00\x00\x00" + marker.encode(), called(module, name))  # no frames
    path = write_zip(tmp_path / "hostile.pth", torch_zip_members(data_pkl, {"0": struct.pack("<4f", 1, 2, 3, 4)}))
    checkpoint = open_checkpoint(path)
    assert checkpoint.root["w"].shape == (4,)
    assert unsafe(path)
    assert main(["check", str(path)]) == 1
    assert main(["convert", str(path), "-o", str(tmp_path / "out.pth")]) == 2
    assert not (tmp_path / "out.pth").exists()
    assert main(["convert", str(path), "-o", str(tmp_path / "out.safetensors"), "--drop", "x"]) == 0  # edited out
    assert "Traceback" not in capsys.readouterr().err


KNOWN = [
    ("collections", "OrderedDict"),
    ("torch", "float32"),
    ("torch", "Size"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("argparse", "Namespace"),
    ("datetime", "datetime"),
]


@pytest.mark.parametrize(("module", "name"), KNOWN, ids=[f"{m}:{n}" for m, n in KNOWN])
def test_exact_known_names_are_data(tmp_path: Path, module: str, name: str) -> None:
    path = tmp_path / "known.pkl"
    path.write_bytes(b"\x80\x04}\x8c\x01x" + stack_global(module, name) + b"s.")
    assert unsafe(path) == set()


def test_a_known_name_reached_through_a_dotted_chain_is_not_known(tmp_path: Path) -> None:
    """``torch`` + ``_utils._rebuild_tensor_v2`` is the same function, but only exact names are trusted."""
    path = tmp_path / "dotted.pkl"
    path.write_bytes(b"\x80\x04}\x8c\x01x" + stack_global("torch", "_utils._rebuild_tensor_v2") + b"s.")
    assert unsafe(path)


def test_torch_saved_training_checkpoint_is_clean(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "ok.pth"
    torch.save({"model": model.state_dict(), "opt": optimizer.state_dict()}, path)
    assert unsafe(path) == set()
    assert main(["check", str(path)]) == 0
