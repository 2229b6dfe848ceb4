"""Sparse tensors whose indices point outside them: torch.load accepts them unless sparse invariant checks
are on, and ``to_dense()`` then writes outside the tensor. ``check`` says so, and the oracle is torch
itself: loading the same file under ``torch.sparse.check_sparse_tensor_invariants()``."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_weights_only import Rebuilt

from ckpt_tui.cli import main

warnings.filterwarnings("ignore", message="Sparse (CSR|CSC|BSR|BSC) tensor support is in beta")


def coo(indices: list[list[int]], size: tuple[int, ...], dense: int = 0) -> torch.Tensor:
    values = torch.arange(len(indices[0]) * max(dense, 1), dtype=torch.float32)
    values = values.reshape(len(indices[0]), dense) if dense else values
    return torch.sparse_coo_tensor(torch.tensor(indices), values, size, check_invariants=False)


def compressed(layout: torch.layout, first: list[int], second: list[int], size: tuple[int, int], block=None):
    nnz = len(second)
    values = torch.ones((nnz, *block)) if block else torch.ones(nnz)
    return torch.sparse_compressed_tensor(
        torch.tensor(first), torch.tensor(second), values, size, layout=layout, check_invariants=False
    )


CASES: dict[str, Callable[[], Any]] = {
    "coo in range": lambda: coo([[0, 1, 1], [2, 0, 1]], (2, 3)),
    "coo past its size": lambda: coo([[0, 5], [0, 0]], (2, 2)),
    "coo past its second size": lambda: coo([[0, 1], [0, 3]], (2, 3)),
    "coo below zero": lambda: coo([[0, -1], [0, 0]], (2, 2)),
    "coo hybrid in range": lambda: coo([[0, 2]], (3, 4), dense=4),
    "coo hybrid past its size": lambda: coo([[0, 3]], (3, 4), dense=4),
    "coo empty": lambda: coo([[], []], (2, 2)),
    "csr in range": lambda: compressed(torch.sparse_csr, [0, 1, 3], [1, 0, 2], (2, 3)),
    "csr decreasing rows": lambda: compressed(torch.sparse_csr, [0, 2, 1], [0, 1], (2, 2)),
    "csr not starting at 0": lambda: compressed(torch.sparse_csr, [1, 1, 2], [0, 1], (2, 2)),
    "csr ending early": lambda: compressed(torch.sparse_csr, [0, 1, 1], [0, 1], (2, 2)),
    "csr column past the size": lambda: compressed(torch.sparse_csr, [0, 1, 2], [0, 9], (2, 2)),
    "csc in range": lambda: compressed(torch.sparse_csc, [0, 1, 2], [1, 0], (2, 2)),
    "csc row past the size": lambda: compressed(torch.sparse_csc, [0, 1, 2], [1, 7], (2, 2)),
    "bsr in range": lambda: compressed(torch.sparse_bsr, [0, 1, 2], [1, 0], (4, 4), block=(2, 2)),
    "bsr block column past the size": lambda: compressed(torch.sparse_bsr, [0, 1, 2], [1, 2], (4, 4), block=(2, 2)),
    "bsc in range": lambda: compressed(torch.sparse_bsc, [0, 1, 2], [0, 1], (4, 4), block=(2, 2)),
}


def rebuilt(layout: torch.layout, first: Any, second: Any, values: Any, size: tuple[int, ...]) -> Rebuilt:
    """A compressed tensor pickled as torch.save pickles one, its parts as given (torch builds none of them)."""
    first, second = (part if isinstance(part, torch.Tensor) else torch.tensor(part) for part in (first, second))
    values = values if isinstance(values, torch.Tensor) else torch.ones(values)
    return Rebuilt(torch._utils._rebuild_sparse_tensor, (layout, (first, second, values, size)))


def coo_saved(indices: list[list[int]], coalesced: bool) -> Rebuilt:
    """A COO tensor pickled as torch.save pickles one, with its coalesced flag as given."""
    values = torch.ones(len(indices[0]))
    return Rebuilt(
        torch._utils._rebuild_sparse_tensor, (torch.sparse_coo, (torch.tensor(indices), values, (2, 2), coalesced))
    )


# torch's _validate_sparse_coo_tensor_args on a tensor saved as coalesced: its coordinates rise, none twice
CASES |= {
    "coo saved coalesced, in range and sorted": lambda: coo_saved([[0, 1], [0, 0]], True),
    "coo saved coalesced, unsorted": lambda: coo_saved([[1, 0], [0, 0]], True),
    "coo saved coalesced, a coordinate twice": lambda: coo_saved([[0, 0], [1, 1]], True),
    "coo not coalesced, a coordinate twice in range": lambda: coo_saved([[0, 0], [1, 1]], False),
}

CSR = torch.sparse_csr
# every check of torch's _validate_sparse_compressed_tensor_args (R11E-5: a short compressed index was clean)
CASES |= {
    "csr compressed indices one short": lambda: rebuilt(CSR, [0, 1, 3], [2, 0, 1], 3, (3, 3)),
    "csr compressed indices one long": lambda: rebuilt(CSR, [0, 1, 3, 3, 3], [2, 0, 1], 3, (3, 3)),
    "csr more plain indices than values": lambda: rebuilt(CSR, [0, 1, 3, 3], [2, 0, 1], 2, (3, 3)),
    "csr columns unsorted in a row": lambda: rebuilt(CSR, [0, 1, 3, 3], [2, 1, 0], 3, (3, 3)),
    "csr a column twice in a row": lambda: rebuilt(CSR, [0, 1, 3, 3], [2, 1, 1], 3, (3, 3)),
    "csr sorted across rows in range": lambda: rebuilt(CSR, [0, 2, 3, 4], [1, 2, 0, 0], 4, (3, 3)),
    "csr a row of more than its width": lambda: rebuilt(CSR, [0, 0, 4, 4], [0, 1, 2, 0], 4, (3, 3)),
    "csr int16 indices": lambda: rebuilt(
        CSR, torch.tensor([0, 1, 3, 3]).short(), torch.tensor([2, 0, 1]).short(), 3, (3, 3)
    ),
    "csr float indices": lambda: rebuilt(CSR, torch.tensor([0, 1, 3, 3.0]), torch.tensor([2, 0, 1.0]), 3, (3, 3)),
    "csr int32 and int64 indices": lambda: rebuilt(CSR, torch.tensor([0, 1, 3, 3]).int(), [2, 0, 1], 3, (3, 3)),
    "csr int32 indices in range": lambda: rebuilt(
        CSR, torch.tensor([0, 1, 3, 3]).int(), torch.tensor([2, 0, 1]).int(), 3, (3, 3)
    ),
    "csr a size of three dimensions": lambda: rebuilt(CSR, [0, 1, 3, 3], [2, 0, 1], 3, (3, 3, 2)),
    "csr values of no dimension": lambda: rebuilt(CSR, [0, 1, 3, 3], [2, 0, 1], torch.tensor(1.0), (3, 3)),
    "csr compressed indices of no dimension": lambda: rebuilt(CSR, torch.tensor(0), [2, 0, 1], 3, (3, 3)),
    "csr index parts of other dimensions": lambda: rebuilt(CSR, [[0, 1, 3, 3]], [2, 0, 1], 3, (3, 3)),
    "csr strided compressed indices": lambda: rebuilt(
        CSR, torch.tensor([0, 9, 1, 9, 3, 9, 3, 9])[::2], [2, 0, 1], 3, (3, 3)
    ),
    "csr batched in range": lambda: rebuilt(
        CSR, [[0, 1, 3, 3], [0, 0, 0, 3]], [[2, 0, 1], [0, 1, 2]], (2, 3), (2, 3, 3)
    ),
    "csr batched, the second ending early": lambda: rebuilt(
        CSR, [[0, 1, 3, 3], [0, 0, 0, 2]], [[2, 0, 1], [0, 1, 2]], (2, 3), (2, 3, 3)
    ),
    "csr batched, the second unsorted": lambda: rebuilt(
        CSR, [[0, 1, 3, 3], [0, 0, 0, 3]], [[2, 0, 1], [0, 2, 1]], (2, 3), (2, 3, 3)
    ),
    "csr batch sizes that differ": lambda: rebuilt(
        CSR, [[0, 1, 3, 3], [0, 0, 0, 3]], [[2, 0, 1], [0, 1, 2]], (2, 3), (3, 3, 3)
    ),
    "bsr a size its blocks do not divide": lambda: rebuilt(torch.sparse_bsr, [0, 1, 1], [0], (1, 2, 2), (3, 2)),
    "bsr blocks in range": lambda: rebuilt(torch.sparse_bsr, [0, 1, 1], [0], (1, 2, 2), (4, 2)),
    "csc rows unsorted in a column": lambda: rebuilt(torch.sparse_csc, [0, 2, 2], [1, 0], 2, (2, 2)),
}


def torch_refuses_when_asked(path: Path) -> bool:
    """What torch says with its sparse invariant checks on (off by default, so it loads either way)."""
    torch.load(path, weights_only=True)
    try:
        with torch.sparse.check_sparse_tensor_invariants():
            torch.load(path, weights_only=True)
    except RuntimeError:
        return True
    return False


@pytest.mark.parametrize("name", CASES)
def test_check_finds_what_torch_finds_with_its_invariant_checks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    path = tmp_path / "sparse.pth"
    torch.save({"dense": torch.ones(2), "s": CASES[name]()}, path)
    invalid = torch_refuses_when_asked(path)
    assert invalid == ("range" not in name and "empty" not in name)  # the cases say what they are
    code = main(["check", str(path), "--json"])
    problems = [p for p in json.loads(capsys.readouterr().out)["problems"] if p["kind"] == "sparse-indices"]
    assert (code, len(problems)) == ((1, 1) if invalid else (0, 0))
    if invalid:
        assert problems[0]["path"] == ["s"]
        assert "torch.load accepts it" in problems[0]["message"]


@pytest.mark.parametrize("dim", [0, 1])
def test_one_bad_index_among_a_million_is_found_in_its_dimension(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dim: int
) -> None:
    """The indices are read in chunks that cross the rows' boundary: each row keeps its own bounds."""
    nnz = 700_000
    indices = torch.zeros(2, nnz, dtype=torch.int64)
    indices[0] = torch.arange(nnz) % 50
    indices[1] = torch.arange(nnz) % 3
    indices[dim, nnz - 1] = 50 if dim == 0 else 3  # one past the size
    values = torch.ones(nnz)
    path = tmp_path / "big.pth"
    torch.save({"s": torch.sparse_coo_tensor(indices, values, (50, 3), check_invariants=False)}, path)
    assert torch_refuses_when_asked(path)
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"sparse index {50 if dim == 0 else 3} in dimension {dim}, past its size" in out


def test_indices_that_cannot_be_read_are_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The NaN/Inf scan reads a sparse tensor's values; its indices, read only here, are reported here too."""
    import zipfile

    torch.save({"s": coo([[0, 1], [1, 2]], (3, 3))}, tmp_path / "ok.pth")
    with zipfile.ZipFile(tmp_path / "ok.pth") as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    path = tmp_path / "short.pth"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data[:8] if name.endswith("data/0") else data)  # the indices record, cut
    assert main(["check", str(path), "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    unreadable = [p for p in problems if p["kind"] == "unreadable"]
    assert len(unreadable) == 1 and "its indices" in unreadable[0]["message"], problems


def test_reading_indices_stops_when_cancelled(tmp_path: Path) -> None:
    from ckpt_tui.core.errors import Cancelled
    from ckpt_tui.core.readers.open import open_checkpoint
    from ckpt_tui.core.values.sparse_checks import sparse_problem

    indices = torch.zeros(2, 10, dtype=torch.int64)
    torch.save({"s": torch.sparse_coo_tensor(indices, torch.ones(10), (3, 3))}, tmp_path / "s.pth")
    tensor = open_checkpoint(tmp_path / "s.pth").root["s"]
    assert sparse_problem(tensor, "little") is None
    with pytest.raises(Cancelled):
        sparse_problem(tensor, "little", cancelled=lambda: True)


class _CooFrom:
    """Pickles as torch's own ``_rebuild_sparse_tensor(sparse_coo, (indices, values, size))`` call with
    indices of any dtype (``torch.sparse_coo_tensor`` casts them to int64 when it loads; saving a sparse
    tensor always writes int64 ones)."""

    def __init__(self, indices: torch.Tensor, size: tuple[int, ...]) -> None:
        self.indices, self.size = indices, size

    def __reduce__(self) -> tuple[object, ...]:
        values = torch.arange(self.indices.shape[1], dtype=torch.float32)
        return torch._utils._rebuild_sparse_tensor, (torch.sparse_coo, (self.indices, values, self.size))


INDEX_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int16]
INDEX_DTYPES += [torch.int8, torch.uint8, torch.bool, torch.complex64]
INDICES = {"in range": [0, 2, 1], "past the size": [0, 2, 100], "negative": [0, -5, 1], "fractions": [0, 2.9, 1.5]}
INDICES["nan"] = [0, float("nan"), 1]


@pytest.mark.parametrize("dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("values", INDICES)
def test_coo_indices_of_every_dtype_are_checked_as_torch_casts_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dtype: torch.dtype, values: str
) -> None:
    """torch loads COO indices of any dtype, cast to int64: an index out of range passes no check there."""
    if values == "nan" and not dtype.is_floating_point:
        pytest.skip("no NaN in an integer dtype")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # complex to int64 drops the imaginary part, and says so
        indices = torch.tensor([INDICES[values]], dtype=torch.float64).to(dtype)
        path = tmp_path / "coo.pth"
        torch.save({"s": _CooFrom(indices, (3,))}, path)
        invalid = torch_refuses_when_asked(path)
    # a float index that is not a whole number: torch truncates it; check reports it unchecked
    unchecked = values in ("fractions", "nan") and (dtype.is_floating_point or dtype.is_complex)
    code = main(["check", str(path), "--json"])
    problems = [p for p in json.loads(capsys.readouterr().out)["problems"] if p["kind"] == "sparse-indices"]
    assert (code, len(problems)) == ((1, 1) if invalid or unchecked else (0, 0)), (dtype, values, invalid, problems)


def test_bfloat16_indices_are_read_as_numbers_not_bits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """bfloat16 60000 has the bit pattern 18282: below a size of 50000, though torch loads index 59904."""
    path = tmp_path / "coo.pth"
    torch.save({"s": _CooFrom(torch.tensor([[1.0, 60000.0]], dtype=torch.bfloat16), (50000,))}, path)
    assert torch_refuses_when_asked(path)
    assert main(["check", str(path)]) == 1
    assert "sparse index 59904 in dimension 0, past its size 50000" in capsys.readouterr().out
