"""The verdict never says "loads" where torch refuses, for the arguments and records found unchecked by an
adversarial pass: ``_rebuild_device_tensor_from_cpu_tensor``'s data, dtype, device and requires_grad; a
quantized tensor that requires grad; nested tensors (checked against their buffer by values not read here:
"cannot tell"); BUILD slot state setting special attributes on a ``Counter``; a ``.data/serialization_id``
record that is not UTF-8. Each case is judged against the real ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import collections
import io
import json
import struct
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from builders import torch_loads
from builders_readers import StorageRef, View, pickle_with_pids, torch_zip_members, write_zip

from ckpt_tui.cli import main


class Call:
    """``function(*args)`` through REDUCE."""

    def __init__(self, function: Any, *args: Any) -> None:
        self.function, self.args = function, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.function, self.args


class Built:
    """``cls()`` then BUILD ``state``."""

    def __init__(self, cls: Any, state: Any) -> None:
        self.cls, self.state = cls, state

    def __reduce__(self) -> tuple[Any, ...]:
        return self.cls, (), self.state


DATA = View(StorageRef(key="0", numel=3), 0, (3,), (1,))
FROM_CPU = torch._utils._rebuild_device_tensor_from_cpu_tensor
CASES: dict[str, Any] = {
    "cpu cast": Call(FROM_CPU, DATA, torch.int64, "cpu", False),
    "dtype None": Call(FROM_CPU, DATA, None, "cpu", False),
    "requires grad": Call(FROM_CPU, DATA, torch.float32, "cpu", True),
    "data a list": Call(FROM_CPU, [1.0], torch.float32, "cpu", False),
    "dtype a str": Call(FROM_CPU, DATA, "float32", "cpu", False),
    "int requires grad": Call(FROM_CPU, DATA, torch.int64, "cpu", True),
    "requires_grad a str": Call(FROM_CPU, DATA, torch.float32, "cpu", "x"),
    "device nonsense": Call(FROM_CPU, DATA, torch.float32, "nonsense", False),
    "three arguments": Call(FROM_CPU, DATA, torch.float32, "cpu"),
    "nested in range": Call(
        torch._utils._rebuild_nested_tensor,
        View(StorageRef(key="0", numel=3), 0, (3,), (1,)),
        View(StorageRef(key="1", numel=2, storage_type=torch.LongStorage), 0, (2, 1), (1, 1)),
        View(StorageRef(key="2", numel=2, storage_type=torch.LongStorage), 0, (2, 1), (1, 1)),
        View(StorageRef(key="3", numel=2, storage_type=torch.LongStorage), 0, (2,), (1,)),
    ),
    "counter slot __class__": Built(collections.Counter, (None, {"__class__": OrderedDict})),
    "counter slot __dict__": Built(collections.Counter, (None, {"__dict__": 5})),
    "counter slot plain": Built(collections.Counter, (None, {"x": 5})),
}
RECORDS = {
    "0": struct.pack("<3f", 1.5, -2, 7),
    "1": struct.pack("<2q", 1, 2),
    "2": struct.pack("<2q", 1, 1),
    "3": struct.pack("<2q", 0, 100000),
}


def answer(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, int]:
    code = main(["check", "--json", str(path)])
    return json.loads(capsys.readouterr().out)["weights_only"]["answer"], code


@pytest.mark.parametrize("name", list(CASES))
def test_verdict_never_loads_where_torch_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    path = write_zip(tmp_path / "case.pth", torch_zip_members(pickle_with_pids({"w": CASES[name]}), RECORDS))
    said, code = answer(path, capsys)
    loads = torch_loads(path)
    if not loads:
        assert said != "loads" and code == 1, (name, said)
    if name in ("dtype None", "counter slot plain"):
        assert loads and said == "loads"  # no needless doubt where the rule is known


def with_serialization_id(tmp_path: Path, serialization_id: bytes) -> Path:
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(3)}, buffer)
    path = tmp_path / "sid.pth"
    with zipfile.ZipFile(buffer) as source, zipfile.ZipFile(path, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            if info.filename.endswith(".data/serialization_id"):
                data = serialization_id
            target.writestr(info, data)
    return path


@pytest.mark.parametrize(
    "serialization_id",
    [b"\xb5" + b"0" * 39, b"0" * 40, "é".encode() * 20, b"\xff\xfe", b"", b"12\xc3"],
    ids=["latin-1 byte", "digits", "utf-8", "bom", "empty", "cut character"],
)
def test_serialization_id_that_is_not_utf8_is_refused_as_torch_refuses_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], serialization_id: bytes
) -> None:
    path = with_serialization_id(tmp_path, serialization_id)
    said, _ = answer(path, capsys)
    assert (said == "loads") == torch_loads(path), said
