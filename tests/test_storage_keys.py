"""Storage keys are told apart by the key object, as torch's caches tell them apart: ``0`` (int) and ``"0"``
(str) are two storages. In a zip both read the record ``data/0``, each as its own type (``loaded_storages``
is keyed by the object, the record named ``data/{key}``); in a legacy file each is filled from its own
place in the key list (``deserialized_objects``). Generated files, each judged against the real
``torch.load(weights_only=True)``: the tree, ``stats`` and what ``convert`` writes hold torch's tensors.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_readers import StorageRef, View, legacy_bytes, pickle_with_pids, torch_zip_members, write_zip
from value_oracle import disagreements, seen

from ckpt_tui.cli import main

TYPES = [torch.FloatStorage, torch.IntStorage, torch.LongStorage, torch.DoubleStorage, torch.ShortStorage]
ITEMSIZE = {torch.FloatStorage: 4, torch.IntStorage: 4, torch.LongStorage: 8, torch.DoubleStorage: 8}
ITEMSIZE[torch.ShortStorage] = 2
KEYS: list[Any] = [0, "0", 1, "1", 2, "2"]


def _tensors(rng: random.Random, nbytes: dict[str, int], legacy: bool) -> dict[str, View]:
    """A dict of 1-4 tensors, each a whole storage under a key drawn from ints and strs of one name."""
    chosen: dict[Any, Any] = {}
    tensors = {}
    for index in range(rng.randint(1, 4)):
        key = rng.choice(KEYS)
        storage_type = chosen.setdefault(key, rng.choice(TYPES))
        if rng.random() < 0.2:  # a second mention of the key with another type: torch keeps the first
            storage_type = rng.choice(TYPES)
        size = nbytes[str(key)] // ITEMSIZE[chosen[key]]
        numel = nbytes[str(key)] // ITEMSIZE[storage_type]
        ref = StorageRef(key=key, numel=numel, storage_type=storage_type, extra=(None,) if legacy else ())
        tensors[f"t{index}"] = View(ref, 0, (min(size, numel),), (1,))
    return tensors


def zip_file(rng: random.Random, path: Path) -> Path:
    nbytes = {str(k): 8 * rng.randint(1, 3) for k in KEYS}
    tensors = _tensors(rng, nbytes, legacy=False)
    records = {name: rng.randbytes(size) for name, size in nbytes.items()}
    return write_zip(path, torch_zip_members(pickle_with_pids(tensors), records))


def legacy_file(rng: random.Random, path: Path) -> Path:
    nbytes = {str(k): 8 * rng.randint(1, 3) for k in KEYS}
    tensors = _tensors(rng, nbytes, legacy=True)
    first_type: dict[Any, Any] = {}
    for view in tensors.values():
        ref = view.args[0]
        first_type.setdefault(ref.pid[2], ref.pid[1])
    keys = list(first_type)
    rng.shuffle(keys)
    chunks = []
    for key in keys:
        count = nbytes[str(key)] // ITEMSIZE[first_type[key]]
        chunks.append((count, rng.randbytes(nbytes[str(key)])))
    return path.write_bytes(legacy_bytes(pickle_with_pids(tensors), keys, chunks)) and path


MAKERS = {"zip": zip_file, "legacy": legacy_file}


@pytest.mark.parametrize("kind", list(MAKERS))
def test_generated_int_and_str_keys_read_as_torch_reads_them(tmp_path: Path, kind: str) -> None:
    rng = random.Random(2113)
    failures = []
    mixed = 0
    for index in range(80):
        path = MAKERS[kind](rng, tmp_path / f"{kind}{index}.pth")
        raw = path.read_bytes()
        mixed += b"X\x01\x00\x00\x000" in raw and b"K\x00" in raw
        found = disagreements(path)
        if found:
            failures.append(f"{path.name}: {found}")
    assert not failures, "\n".join(failures[:5])
    assert mixed >= 10  # the slice holds files with both 0 and "0"


def two_keys_zip(path: Path) -> Path:
    tensors = {
        "a": View(StorageRef(key=0, numel=3, storage_type=torch.FloatStorage), 0, (3,), (1,)),
        "b": View(StorageRef(key="0", numel=3, storage_type=torch.IntStorage), 0, (3,), (1,)),
    }
    return write_zip(path, torch_zip_members(pickle_with_pids(tensors), {"0": struct.pack("<3f", 1, 2, 3)}))


def two_keys_legacy(path: Path) -> Path:
    tensors = {
        "a": View(StorageRef(key=0, numel=3, storage_type=torch.FloatStorage, extra=(None,)), 0, (3,), (1,)),
        "b": View(StorageRef(key="0", numel=3, storage_type=torch.IntStorage, extra=(None,)), 0, (3,), (1,)),
    }
    chunks = [(3, struct.pack("<3f", 1, 2, 3)), (3, struct.pack("<3i", 7, 8, 9))]
    return path.write_bytes(legacy_bytes(pickle_with_pids(tensors), [0, "0"], chunks)) and path  # type: ignore[list-item]


@pytest.mark.parametrize("make", [two_keys_zip, two_keys_legacy], ids=["zip", "legacy"])
@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_convert_writes_what_torch_loads_for_int_and_str_keys(tmp_path: Path, make: Any, suffix: str) -> None:
    source = make(tmp_path / "two.pth")
    output = tmp_path / f"out{suffix}"
    assert main(["convert", str(source), "-o", str(output)]) == 0
    expected = torch.load(source, weights_only=True)
    assert expected["b"].dtype == torch.int32
    if suffix == ".pth":
        written = torch.load(output, weights_only=True)
    else:
        from safetensors.torch import load_file

        written = load_file(str(output))
    assert {k: seen(v) for k, v in written.items()} == {k: seen(v) for k, v in expected.items()}
