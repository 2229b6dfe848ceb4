"""Sparse indices of any dtype are checked: torch's sparse constructors convert indices to int64 as they load
(float32 ``[0, 2, 1e6]`` becomes an int64 index 1000000 past a size of 3), so ``check`` converts them the same
way (integers and bools exactly; floats when they are finite whole numbers, else it reports them unchecked).
A compressed tensor's indices keep their dtype, which torch's invariant check wants int32 or int64: a CSR is
judged as that check judges it. Generated COO and CSR tensors, each against the real ``torch.load``.
"""

from __future__ import annotations

import random
import struct
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from builders_readers import StorageRef, View, pickle_with_pids, torch_zip_members, write_zip

from ckpt_tui.core.operations.check import check_checkpoint
from ckpt_tui.core.readers.open import open_checkpoint

INDEX_TYPES = {
    torch.FloatStorage: "f",
    torch.DoubleStorage: "d",
    torch.ShortStorage: "h",
    torch.IntStorage: "i",
    torch.ByteStorage: "B",
    torch.LongStorage: "q",
}


class Call:
    def __init__(self, function: Any, *args: Any) -> None:
        self.function, self.args = function, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.function, self.args


def _layout(name: str) -> Call:
    return Call(torch.serialization._get_layout, name)


def _tensor(key: str, storage_type: Any, shape: tuple[int, ...]) -> View:
    numel = 1
    for n in shape:
        numel *= n
    stride = (shape[1], 1) if len(shape) == 2 else (1,)
    return View(StorageRef(key=key, numel=numel, storage_type=storage_type), 0, shape, stride)


def coo_file(rng: random.Random, path: Path) -> Path:
    storage_type = rng.choice(list(INDEX_TYPES))
    size, nnz = rng.randint(3, 6), 3
    limit = 255 if storage_type is torch.ByteStorage else 2000
    indices = [rng.randrange(size) if rng.random() < 0.7 else rng.randint(-5, limit) for _ in range(nnz)]
    if storage_type is torch.ByteStorage:
        indices = [i % 256 for i in indices]
    records = {
        "0": struct.pack(f"<{nnz}{INDEX_TYPES[storage_type]}", *indices),
        "1": struct.pack(f"<{nnz}f", 1, 2, 3),
    }
    parts = (_tensor("0", storage_type, (1, nnz)), _tensor("1", torch.FloatStorage, (nnz,)), (size,))
    root = OrderedDict(v=Call(torch._utils._rebuild_sparse_tensor, _layout("torch.sparse_coo"), parts))
    return write_zip(path, torch_zip_members(pickle_with_pids(root), records))


def csr_file(rng: random.Random, path: Path) -> Path:
    storage_type = rng.choice([torch.FloatStorage, torch.DoubleStorage, torch.IntStorage, torch.LongStorage])
    code = INDEX_TYPES[storage_type]
    width = rng.randint(2, 5)
    columns = [rng.randrange(width) if rng.random() < 0.7 else rng.randint(0, 5000) for _ in range(3)]
    records = {
        "0": struct.pack(f"<3{code}", 0, 1, 3),
        "1": struct.pack(f"<3{code}", *columns),
        "2": struct.pack("<3f", 1, 2, 3),
    }
    parts = (
        _tensor("0", storage_type, (3,)),
        _tensor("1", storage_type, (3,)),
        _tensor("2", torch.FloatStorage, (3,)),
        (2, width),
    )
    root = OrderedDict(v=Call(torch._utils._rebuild_sparse_tensor, _layout("torch.sparse_csr"), parts))
    return write_zip(path, torch_zip_members(pickle_with_pids(root), records))


def out_of_bounds(loaded: torch.Tensor) -> bool:
    if loaded.layout == torch.sparse_coo:
        indices = loaded._indices()
        return bool((indices < 0).any() or (indices >= torch.tensor(loaded.shape)[: indices.shape[0], None]).any())
    columns = loaded.col_indices()
    return bool((columns < 0).any() or (columns >= loaded.shape[1]).any())


def refused_under_invariants(path: Path) -> bool:
    """What torch says of the file with its sparse invariant checks on."""
    try:
        with torch.sparse.check_sparse_tensor_invariants():
            torch.load(path, weights_only=True)
    except RuntimeError:
        return True
    return False


def test_generated_sparse_indices_of_every_dtype_are_checked(tmp_path: Path) -> None:
    rng = random.Random(11)
    failures = []
    outside = 0
    for index in range(100):
        make = coo_file if index % 2 else csr_file
        path = make(rng, tmp_path / f"sp{index}.pth")
        loaded = torch.load(path, weights_only=True)["v"]
        outside += out_of_bounds(loaded)
        # COO: its indices as torch casts them, within the size; compressed: every invariant torch checks
        bad = out_of_bounds(loaded) if loaded.layout == torch.sparse_coo else refused_under_invariants(path)
        report = check_checkpoint(open_checkpoint(path))
        flagged = [p.message for p in report.problems if p.kind == "sparse-indices"]
        if bad and report.ok:
            failures.append(f"{path.name}: torch loads indices it refuses under its invariant checks, check is clean")
        if not bad and flagged:  # every generated index is a whole number: converted exactly
            failures.append(f"{path.name}: in bounds, but {flagged}")
    assert not failures, "\n".join(failures[:5])
    assert outside >= 20
