"""Sparse tensors whose indices point outside the tensor: what ``check`` reads them for.

torch.load (``weights_only=True`` too) rebuilds a sparse tensor without checking its indices unless
``torch.sparse.check_sparse_tensor_invariants`` is on (``torch._utils._validate_loaded_sparse_tensors``);
the tensor loads, and ``to_dense()`` or any kernel on it then reads or writes outside its memory. Here
the index parts are read in bounded chunks and checked as ``torch._validate_sparse_coo_tensor_args``
and ``torch._validate_sparse_compressed_tensor_args`` check them: COO indices within the size in each
sparse dimension; compressed indices starting at 0, never decreasing, ending at the number of stored
elements, and plain indices within the size. Parts whose shapes torch's constructor itself refuses, and
batched compressed tensors, are left to the loader's verdict; so is whether plain indices are sorted
and distinct within a row (torch's invariant check refuses that too, but no kernel reads outside the
tensor for it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ckpt_tui.core.errors import Cancelled
from ckpt_tui.core.model.tree import Tensor
from ckpt_tui.core.values.tensor_values import TensorReader, decode

COMPRESSED = {"sparse_csr": (0, 1), "sparse_bsr": (0, 1), "sparse_csc": (1, 0), "sparse_bsc": (1, 0)}
"""Per compressed layout: which dimension of the size its compressed indices run over, which the plain ones."""

TORCH_ACCEPTS = (
    "torch.load accepts it (sparse indices are checked only under torch.sparse.check_sparse_tensor_invariants) "
    "and using it reads or writes outside the tensor"
)


def sparse_problem(
    tensor: Tensor, byteorder: str = "little", cancelled: Callable[[], bool] | None = None
) -> str | None:
    """Why a sparse tensor's indices point outside it, in words; None when they do not (or it is not sparse).

    Raises :class:`ReadError` when an index part cannot be read (the caller reports it: its values part
    is what the NaN/Inf scan reads), :class:`Cancelled` when ``cancelled()`` turns true between chunks."""

    def chunks(part: Tensor) -> Iterator[np.ndarray]:
        for chunk in TensorReader(part, byteorder).chunks():
            if cancelled is not None and cancelled():
                raise Cancelled("check cancelled")
            yield chunk

    try:
        if tensor.kind == "sparse_coo" and tensor.sparse is not None:
            found = _coo_problem(tensor.sparse, chunks)
        elif tensor.kind in COMPRESSED and tensor.sparse is not None:
            found = _compressed_problem(tensor.kind, tensor.sparse, chunks)
        else:
            return None
    except IndexDtypeError as exc:
        # torch converts them to int64 as it loads; what they become is not modelled: never taken as in bounds
        found = f"{exc}: torch converts them to int64, and their bounds are not checked here"
    return f"{found}: {TORCH_ACCEPTS}" if found else None


Chunks = Callable[[Tensor], Iterator[np.ndarray]]


def _coo_problem(parts: tuple[Any, ...], chunks: Chunks) -> str | None:
    indices, values, size = (*parts, None, None, None)[:3]
    if not (isinstance(indices, Tensor) and isinstance(values, Tensor) and _is_size(size)):
        return None
    if len(indices.shape) != 2 or not values.shape:
        return None
    sparse_dim, nnz = indices.shape
    if values.shape[0] != nnz or sparse_dim + len(values.shape) - 1 != len(size) or nnz == 0:
        return None
    lows, highs = _row_bounds(indices, sparse_dim, nnz, chunks)
    for dim in range(sparse_dim):
        if lows[dim] < 0:
            return f"sparse index {lows[dim]} in dimension {dim}, below 0"
        if highs[dim] >= size[dim]:
            return f"sparse index {highs[dim]} in dimension {dim}, past its size {size[dim]}"
    return None


def _compressed_problem(kind: str, parts: tuple[Any, ...], chunks: Chunks) -> str | None:
    compressed, plain, values, size = (*parts, None, None, None, None)[:4]
    # the geometry: only what torch's constructor accepts is checked further (it says why for the rest)
    geometry = _compressed_geometry(kind, compressed, plain, values, size)
    if geometry is None:
        return None
    runs, width, nnz = geometry
    if compressed.shape[0] != runs + 1 or not values.shape or values.shape[0] != nnz:
        return None
    # the compressed indices: from 0 to the stored count, never decreasing
    first, last, falls = _monotone(compressed, chunks)
    if first != 0:
        return f"compressed indices start at {first}, not 0"
    if falls:
        return "compressed indices decrease"
    if last != nnz:
        return f"compressed indices end at {last}, not at the {nnz} stored elements"
    # the plain indices: within the width
    if nnz:
        lows, highs = _row_bounds(plain, 1, nnz, chunks)
        if lows[0] < 0 or highs[0] >= width:
            bad = lows[0] if lows[0] < 0 else highs[0]
            return f"plain index {bad} outside 0..{width - 1}"
    return None


def _compressed_geometry(kind: str, compressed: Any, plain: Any, values: Any, size: Any) -> tuple[int, int, int] | None:
    """The runs (rows of CSR, columns of CSC, in blocks), the width across them and the stored count of an
    unbatched compressed tensor with integer indices; None for any other."""
    if not (isinstance(compressed, Tensor) and isinstance(plain, Tensor) and isinstance(values, Tensor)):
        return None
    if not _is_size(size) or len(size) != 2 or len(compressed.shape) != 1 or len(plain.shape) != 1:
        return None  # batched (or malformed: torch's constructor says why)
    if compressed.dtype.startswith("complex") or plain.dtype.startswith("complex"):
        return None
    along, across = COMPRESSED[kind]
    blocked = kind in ("sparse_bsr", "sparse_bsc")
    block = values.shape[1:3] if blocked and len(values.shape) >= 3 else (1, 1)
    if 0 in block:
        return None
    return size[along] // block[along], size[across] // block[across], plain.shape[0]


class IndexDtypeError(ValueError):
    """Index values whose conversion to int64 is not modelled here (not finite, fractional, out of range)."""


_INT64_BOUND = float(2**63)


def as_indices(chunk: np.ndarray, dtype: str = "int64") -> np.ndarray:
    """Index values as torch's sparse constructors take them: converted to int64 whatever their dtype
    (``indices.to(torch.long)``; ``chunk`` holds raw elements of ``dtype``: bfloat16 and float8 are decoded,
    complex gives its real part). Integers and bools convert exactly; floats only when every value is a
    finite whole number in int64's range, else :class:`IndexDtypeError` (truncation of the rest is not
    modelled, so their bounds are never taken as checked)."""
    if dtype == "complex32":
        half = np.dtype(">f2") if chunk.dtype.byteorder == ">" else np.dtype("<f2")
        chunk = np.ascontiguousarray(chunk).view(half).reshape(-1, 2)[:, 0]
    elif dtype == "bfloat16" or dtype.startswith("float8"):
        # their raw elements are unsigned bit patterns, not the numbers
        chunk = decode(chunk, dtype)
    if chunk.dtype.kind == "c":
        chunk = chunk.real
    if chunk.dtype.kind in "iub":
        return chunk.astype(np.int64, copy=False)
    wide = chunk.astype(np.float64, copy=False)
    if wide.size and not (
        bool(np.isfinite(wide).all())
        and bool((np.trunc(wide) == wide).all())
        and float(wide.min()) >= -_INT64_BOUND
        and float(wide.max()) < _INT64_BOUND
    ):
        raise IndexDtypeError(f"{dtype} indices that are not whole numbers within int64")
    return wide.astype(np.int64)


def _is_size(size: Any) -> bool:
    return isinstance(size, tuple) and all(type(n) is int for n in size)


def _row_bounds(indices: Tensor, rows: int, width: int, chunks: Chunks) -> tuple[list[int], list[int]]:
    """The lowest and highest value in each of ``rows`` rows of ``width`` values of an integer tensor
    (its elements in row-major order), read in bounded chunks."""
    lows, highs = [0] * rows, [0] * rows
    seen = [False] * rows
    position = 0
    for chunk in chunks(indices):
        values = as_indices(chunk.reshape(-1), indices.dtype)
        while values.size:
            row = position // width
            take = min(values.size, (row + 1) * width - position)
            part = values[:take]
            low, high = int(part.min()), int(part.max())
            lows[row] = low if not seen[row] else min(lows[row], low)
            highs[row] = high if not seen[row] else max(highs[row], high)
            seen[row] = True
            position += take
            values = values[take:]
    return lows, highs


def _monotone(indices: Tensor, chunks: Chunks) -> tuple[int, int, bool]:
    """The first and last value of a 1-D integer tensor, and whether any value is below the one before it."""
    first: int | None = None
    previous: int | None = None
    for chunk in chunks(indices):
        values = as_indices(chunk.reshape(-1), indices.dtype)
        if not values.size:
            continue
        if first is None:
            first = int(values[0])
        if (previous is not None and int(values[0]) < previous) or bool((np.diff(values) < 0).any()):
            return first, int(values[-1]), True
        previous = int(values[-1])
    return first or 0, previous if previous is not None else 0, False


def sparse_firsts(
    tensor: Tensor, byteorder: str = "little"
) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None] | None:
    """The first NaN's and first Inf's positions in a sparse COO, CSR or CSC tensor as torch gives them
    (``t.to_dense().isnan().nonzero()[0]``: the lowest position in row-major order, whatever order its
    stored values are in); None when they cannot be told (another layout, parts that do not fit).

    Raises :class:`ReadError` when a part cannot be read."""
    parts = tensor.sparse or ()
    if tensor.kind not in ("sparse_coo", "sparse_csr", "sparse_csc"):
        return None
    values = tensor.sparse_values
    if not isinstance(values, Tensor) or not values.shape:
        return None
    with np.errstate(all="ignore"):
        chunks = [decode(c, values.dtype, values.metadata) for c in TensorReader(values, byteorder).chunks()]
    found = np.concatenate(chunks) if chunks else np.zeros(0)
    per_entry = int(np.prod(values.shape[1:], dtype=np.int64))
    entry_at = _entry_positions(tensor.kind, parts, values.shape[0], byteorder)
    if entry_at is None:
        return None
    return _lowest(np.isnan(found), entry_at, values.shape[1:], per_entry), _lowest(
        np.isinf(found), entry_at, values.shape[1:], per_entry
    )


def _entry_positions(kind: str, parts: tuple[Any, ...], nnz: int, byteorder: str) -> np.ndarray | None:
    """Each stored entry's position in the sparse dimensions: an (nnz, sparse_dim) int64 array."""

    def whole(part: Any) -> np.ndarray | None:
        if not isinstance(part, Tensor):
            return None
        chunks = [as_indices(c, part.dtype) for c in TensorReader(part, byteorder).chunks()]
        return np.concatenate(chunks) if chunks else np.zeros(0, np.int64)

    if kind == "sparse_coo":
        indices = whole(parts[0])
        if indices is None or len(parts[0].shape) != 2 or parts[0].shape[1] != nnz:
            return None
        return indices.reshape(parts[0].shape).T
    compressed, plain = whole(parts[0]), whole(parts[1])
    if compressed is None or plain is None or plain.shape[0] != nnz or compressed.ndim != 1:
        return None
    # entry i lies in the row (CSR; column for CSC) whose compressed span holds i
    along = np.searchsorted(compressed, np.arange(nnz), side="right") - 1
    pairs = (along, plain) if kind == "sparse_csr" else (plain, along)
    return np.stack(pairs, axis=1)


def _lowest(
    mask: np.ndarray, entry_at: np.ndarray, dense_shape: tuple[int, ...], per_entry: int
) -> tuple[int, ...] | None:
    """The row-major lowest position (sparse indices, then the dense part's) of the values ``mask`` marks."""
    flat = np.flatnonzero(mask)
    if not flat.size:
        return None
    entries, within = np.divmod(flat, max(per_entry, 1))
    columns = [entry_at[entries, d] for d in range(entry_at.shape[1])]
    columns += list(np.unravel_index(within, dense_shape)) if dense_shape else []
    # lexsort sorts by its last key first: the position's first dimension leads
    best = int(np.lexsort(columns[::-1])[0])
    return tuple(int(column[best]) for column in columns)
