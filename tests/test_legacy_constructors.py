"""Tensors torch.load makes from calls the tree keeps as calls are never clean: the legacy constructors
(``torch.FloatTensor([...])``, ``torch.IntTensor(4, 4)`` = uninitialised memory), however called, and
``_rebuild_device_tensor_from_cpu_tensor`` (a cast of its data). ``check`` reports each (``unread-tensor``,
exit 1). Generated files, each judged against the real ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import random
import struct
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_readers import StorageRef, View, pickle_with_pids, torch_zip_members, write_zip
from value_oracle import disagreements

from ckpt_tui.cli import main

CLASSES = ["FloatTensor", "DoubleTensor", "IntTensor", "LongTensor", "ShortTensor", "ByteTensor", "HalfTensor"]


class Call:
    """``function(*args)`` through REDUCE."""

    def __init__(self, function: Any, *args: Any) -> None:
        self.function, self.args = function, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.function, self.args


def _values(rng: random.Random) -> list[Any]:
    pool = [0, 1, -7, 3.5, 1e30, 2.0, float("nan"), float("inf"), 255]
    if rng.random() < 0.2:
        return [[rng.choice(pool) for _ in range(2)] for _ in range(rng.randint(1, 3))]
    return [rng.choice(pool) for _ in range(rng.randint(0, 4))]


def _maker(rng: random.Random) -> Call:
    roll = rng.random()
    if roll < 0.4:
        return Call(getattr(torch, rng.choice(CLASSES)), _values(rng))
    if roll < 0.7:
        return Call(getattr(torch, rng.choice(CLASSES)), *[rng.randint(1, 4) for _ in range(rng.randint(1, 2))])
    data = View(StorageRef(key="0", numel=3), 0, (3,), (1,))
    dtype = rng.choice([torch.float32, torch.int64, torch.float16, torch.int32])
    return Call(torch._utils._rebuild_device_tensor_from_cpu_tensor, data, dtype, "cpu", False)


def test_generated_constructor_tensors_are_never_clean(tmp_path: Path) -> None:
    rng = random.Random(4)
    failures = []
    loaded = 0
    for index in range(80):
        root = {f"t{n}": _maker(rng) for n in range(rng.randint(1, 3))}
        if rng.random() < 0.3:
            root["plain"] = View(StorageRef(key="1", numel=2), 0, (2,), (1,))  # type: ignore[assignment]
        records = {"0": struct.pack("<3f", 1.5, -2, 7), "1": struct.pack("<2f", 4, 5)}
        path = write_zip(tmp_path / f"c{index}.pth", torch_zip_members(pickle_with_pids(root), records))
        with contextlib.suppress(Exception):
            loaded += bool(torch.load(path, weights_only=True))
        found = disagreements(path)
        if found:
            failures.append(f"{path.name}: {found}")
    assert not failures, "\n".join(failures[:5])
    assert loaded >= 30


def test_uninitialised_and_list_made_tensors_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = {"w": Call(torch.FloatTensor, [1e30, -7.0, 3.5]), "u": Call(torch.IntTensor, 4, 4)}
    path = write_zip(tmp_path / "ctor.pth", torch_zip_members(pickle.dumps(root, protocol=2), {}))
    assert set(torch.load(path, weights_only=True)) == {"w", "u"}
    assert main(["check", "--json", str(path)]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert [p["kind"] for p in problems] == ["unread-tensor", "unread-tensor"]
    assert "uninitialised memory" in problems[0]["message"] and "torch.IntTensor(4, 4)" in problems[0]["message"]
    assert "torch.FloatTensor" in problems[1]["message"]


def test_device_cast_is_never_clean(tmp_path: Path) -> None:
    data = View(StorageRef(key="0", numel=3), 0, (3,), (1,))
    root = OrderedDict(w=Call(torch._utils._rebuild_device_tensor_from_cpu_tensor, data, torch.int64, "cpu", False))
    records = {"0": struct.pack("<3f", 1.5, -2, 7)}
    path = write_zip(tmp_path / "cast.pth", torch_zip_members(pickle_with_pids(root), records))
    assert torch.load(path, weights_only=True)["w"].dtype == torch.int64
    assert main(["check", str(path)]) == 1
