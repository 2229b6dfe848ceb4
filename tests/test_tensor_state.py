"""A tensor's pickled state is applied as torch's ``_set_obj_state`` applies it: ``setattr`` per item. ``data``
makes the loaded tensor the given one's data (another storage, dtype, shape), so the tree, ``stats``,
``check``, ``diff`` and ``convert`` hold that tensor; ``real``/``imag`` write values not reproduced here, so
the tensor is unread (``check`` reports it, ``convert`` refuses in one line). Through
``_rebuild_from_type_v2`` (a tensor with Python attributes), ``_rebuild_parameter_with_state`` (dict or slot
state) and a DCP folder's chunk. Generated files, each judged against the real ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import random
import struct
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_readers import StorageRef, torch_zip_members, write_zip
from value_oracle import disagreements, ours, seen

from ckpt_tui.cli import main

TYPES = [torch.FloatStorage, torch.IntStorage, torch.DoubleStorage, torch.LongStorage]
ITEMSIZE = {torch.FloatStorage: 4, torch.IntStorage: 4, torch.DoubleStorage: 8, torch.LongStorage: 8}


class Plain:
    """``_rebuild_tensor_v2`` of a whole storage."""

    def __init__(self, key: str, storage_type: Any, numel: int) -> None:
        storage = StorageRef(key=key, numel=numel, storage_type=storage_type)
        self.args = (storage, 0, (numel,), (1,), False, OrderedDict())

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return torch._utils._rebuild_tensor_v2, self.args


class WithAttributes:
    """What torch.save writes for a tensor with Python attributes: ``_rebuild_from_type_v2``."""

    def __init__(self, inner: Plain, state: Any) -> None:
        self.inner, self.state = inner, state

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        rebuild = torch._utils._rebuild_tensor_v2
        return torch._tensor._rebuild_from_type_v2, (rebuild, torch.Tensor, self.inner.args, self.state)


class ParameterWithState:
    """What torch.save writes for a Parameter with Python attributes."""

    def __init__(self, inner: Plain, state: Any) -> None:
        self.inner, self.state = inner, state

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return torch._utils._rebuild_parameter_with_state, (self.inner, False, OrderedDict(), self.state)


class Records:
    """Storages of a generated file, each its own record of random bytes."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.data: dict[str, bytes] = {}

    def tensor(self) -> Plain:
        key = str(len(self.data))
        storage_type, numel = self.rng.choice(TYPES), self.rng.randint(1, 4)
        self.data[key] = self.rng.randbytes(numel * ITEMSIZE[storage_type])
        return Plain(key, storage_type, numel)


def _item(rng: random.Random, records: Records) -> tuple[str, Any]:
    roll = rng.random()
    if roll < 0.45:
        return "data", records.tensor()
    if roll < 0.55:
        return "real", rng.choice([5.0, 2])
    if roll < 0.7:
        return "note", rng.choice(["x", 3, None])
    if roll < 0.8:
        return "requires_grad", False
    if roll < 0.9:
        return "grad", None
    return "__dict__", {"a": 1}


def _state(rng: random.Random, records: Records) -> Any:
    items = dict(_item(rng, records) for _ in range(rng.randint(1, 3)))
    form = rng.random()
    if form < 0.6:
        return items
    if form < 0.8:
        return (None, items)
    return (dict([_item(rng, records)]), items)


def generated(rng: random.Random, path: Path) -> Path:
    records = Records(rng)
    root: dict[str, Any] = {}
    for index in range(rng.randint(1, 3)):
        maker = rng.choice([WithAttributes, ParameterWithState])
        root[f"w{index}"] = maker(records.tensor(), _state(rng, records))
    from builders_readers import pickle_with_pids

    return write_zip(path, torch_zip_members(pickle_with_pids(root), records.data))


def test_generated_tensor_states_read_as_torch_loads_them(tmp_path: Path) -> None:
    rng = random.Random(22)
    failures = []
    swapped = 0
    for index in range(120):
        path = generated(rng, tmp_path / f"s{index}.pth")
        found = disagreements(path)
        if found:
            failures.append(f"{path.name}: {found}")
        swapped += b"data" in path.read_bytes()
    assert not failures, "\n".join(failures[:5])
    assert swapped >= 40


def data_swap(path: Path, maker: Any = WithAttributes, slots: bool = False, bare: bool = False) -> Path:
    """The adversarial F2 file: ``w`` holds [1, 2, 3]; its state sets ``data`` to [nan, 1e30, -7]
    (``bare``: the tensor is the root, as in a DCP chunk)."""
    outer, inner = Plain("0", torch.FloatStorage, 3), Plain("1", torch.FloatStorage, 3)
    state = (None, {"data": inner}) if slots else {"data": inner}
    records = {"0": struct.pack("<3f", 1, 2, 3), "1": struct.pack("<3f", float("nan"), 1e30, -7)}
    from builders_readers import pickle_with_pids

    tensor = maker(outer, state)
    return write_zip(path, torch_zip_members(pickle_with_pids(tensor if bare else {"w": tensor}), records))


@pytest.mark.parametrize(
    ("maker", "slots"),
    [(WithAttributes, False), (ParameterWithState, False), (ParameterWithState, True)],
    ids=["from_type", "parameter state", "parameter slots"],
)
def test_state_setting_data_is_checked_as_the_loaded_tensor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], maker: Any, slots: bool
) -> None:
    path = data_swap(tmp_path / "swap.pth", maker, slots)
    assert torch.isnan(torch.load(path, weights_only=True)["w"]).any()
    assert main(["check", str(path)]) == 1
    assert "1 NaN" in capsys.readouterr().out


@pytest.mark.parametrize("options", [[], ["--dtype", "fp16"]], ids=["as is", "cast"])
@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_convert_writes_the_loaded_tensor(tmp_path: Path, options: list[str], suffix: str) -> None:
    path = data_swap(tmp_path / "swap.pth")
    output = tmp_path / f"out{suffix}"
    assert main(["convert", str(path), "-o", str(output), *options]) == 0
    expected = torch.load(path, weights_only=True)["w"]
    if options:
        expected = expected.half()
    if suffix == ".pth":
        written = torch.load(output, weights_only=True)["w"]
    else:
        from safetensors.torch import load_file

        written = load_file(str(output))["w"]
    assert seen(written) == seen(expected)
    assert main(["diff", str(path), str(output)]) == (0 if not options else 1)


def test_state_setting_real_is_unread_and_never_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outer = Plain("0", torch.FloatStorage, 3)
    pickled = __import__("builders_readers").pickle_with_pids({"w": WithAttributes(outer, {"real": 5.0})})
    path = write_zip(tmp_path / "real.pth", torch_zip_members(pickled, {"0": struct.pack("<3f", 1, 2, 3)}))
    assert torch.load(path, weights_only=True)["w"].tolist() == [5.0, 5.0, 5.0]
    assert ours(path).tensors == {"w": None}
    assert main(["check", str(path)]) == 1
    assert main(["convert", str(path), "-o", str(tmp_path / "out.pth")]) == 2
    err = capsys.readouterr().err
    assert "sets real" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out.pth").exists()


def test_dcp_chunk_whose_state_sets_data_is_checked_as_dcp_loads_it(tmp_path: Path) -> None:
    """A DCP folder (saved by dcp.save) whose chunk for ``w`` is the F2 tensor: ``dcp.load`` reads the chunk
    with torch.load and fills ``w`` with the loaded data, which check reads."""
    import dataclasses
    import pickle

    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "dcp"
    dcp.save({"w": torch.ones(3)}, checkpoint_id=str(folder), no_dist=True)
    chunk = data_swap(tmp_path / "chunk.pth", bare=True).read_bytes()
    metadata = pickle.loads((folder / ".metadata").read_bytes())
    for index, info in list(metadata.storage_data.items()):
        (folder / info.relative_path).write_bytes(chunk)
        metadata.storage_data[index] = dataclasses.replace(info, offset=0, length=len(chunk))
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    state = {"w": torch.zeros(3)}
    dcp.load(state, checkpoint_id=str(folder), no_dist=True)
    assert torch.isnan(state["w"]).any()
    assert main(["check", str(folder)]) == 1


@pytest.mark.parametrize("storage_type", [torch.ComplexFloatStorage, torch.FloatStorage], ids=["complex", "real"])
def test_state_setting_imag_is_judged_by_the_tensors_dtype(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], storage_type: Any
) -> None:
    # torch's imag setter writes a complex tensor's imaginary parts and raises on any other
    outer = Plain("0", storage_type, 2)
    pickled = __import__("builders_readers").pickle_with_pids({"w": WithAttributes(outer, {"imag": 5.0})})
    path = write_zip(tmp_path / "imag.pth", torch_zip_members(pickled, {"0": struct.pack("<4f", 1, 2, 3, 4)}))
    try:
        loaded = torch.load(path, weights_only=True)["w"]
    except RuntimeError:
        loaded = None
    assert (loaded is not None) == (storage_type is torch.ComplexFloatStorage)
    assert main(["check", "--json", str(path)]) == 1
    said = __import__("json").loads(capsys.readouterr().out)["weights_only"]["answer"]
    assert said == ("cannot_tell" if loaded is not None else "refuses")
    assert ours(path).tensors == {"w": None}  # its values are never the record's
