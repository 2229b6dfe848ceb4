"""Sparse tensors whose indices break torch's invariants: what ``check`` reads them for.

torch.load (``weights_only=True`` too) rebuilds a sparse tensor without checking its indices unless
``torch.sparse.check_sparse_tensor_invariants`` is on (``torch._utils._validate_loaded_sparse_tensors``);
the tensor loads, and ``to_dense()`` or any kernel on it then reads or writes outside its memory. Here
the index parts are read in bounded chunks and checked as ``torch._validate_sparse_coo_tensor_args``
and ``torch._validate_sparse_compressed_tensor_args`` check them: COO indices within the size in each
sparse dimension; for CSR/CSC/BSR/BSC (batched too) every check of the latter, in its order: the parts'
dimensions, batch sizes and blocks, as many compressed indices as runs + 1 and plain indices as stored
elements, both int32 or both int64, compressed indices starting at 0, stepping by 0 to the width across,
ending at the number of stored elements, and plain indices within the width, sorted and distinct within
each run.
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
    "torch.load accepts it (sparse indices are checked only under torch.sparse.check_sparse_tensor_invariants, "
    "which refuses it) and using it may read or write outside the tensor"
)


def sparse_problem(
    tensor: Tensor, byteorder: str = "little", cancelled: Callable[[], bool] | None = None
) -> str | None:
    """Why a sparse tensor's indices break torch's invariants, in words; None when they do not (or it is not
    sparse).

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
    marked = len(parts) > 3 and parts[3] is True
    if marked and nnz > 1 and not _coalesced(indices, sparse_dim, nnz, chunks):
        # torch: "cannot set is_coalesced to true if indices correspond to uncoalesced COO tensor"
        return "indices saved as coalesced are not (each coordinate after the one before it, none twice)"
    return None


def _coalesced(indices: Tensor, rows: int, width: int, chunks: Chunks) -> bool:
    """Whether the ``width`` coordinates (columns of ``rows`` dimensions) rise strictly in row-major order, as a
    coalesced COO tensor's do: dimension by dimension, each pair of neighbours not yet told apart is told by the
    first dimension where they differ (one row and a flag per pair held at a time)."""
    undecided = np.ones(width - 1, np.bool_)
    row = np.empty(width, np.int64)
    filled = 0
    for chunk in chunks(indices):
        values = as_indices(chunk.reshape(-1), indices.dtype)
        while values.size:
            take = min(values.size, width - filled)
            row[filled : filled + take] = values[:take]
            filled, values = filled + take, values[take:]
            if filled < width:
                continue
            step = np.diff(row)
            if bool((undecided & (step < 0)).any()):
                return False
            undecided &= step == 0
            filled = 0
    # (rows are read in order: a neighbour pair equal in every dimension is a coordinate given twice)
    return not bool(undecided.any())


def _compressed_problem(kind: str, parts: tuple[Any, ...], chunks: Chunks) -> str | None:
    """torch's ``_validate_sparse_compressed_tensor_args`` of a CSR/CSC/BSR/BSC tensor (batched too), in its order:
    the parts' shapes, the index dtypes, then the indices (:func:`_compressed_index_problem`)."""
    compressed, plain, values, size = (*parts, None, None, None, None)[:4]
    if not (isinstance(compressed, Tensor) and isinstance(plain, Tensor) and isinstance(values, Tensor)):
        return None
    if not _is_size(size):
        return None
    geometry = _compressed_geometry(kind, compressed, plain, values, size)
    if isinstance(geometry, str):
        return geometry
    if compressed.storage is not None and compressed.storage.location == "meta":
        return None  # (torch checks only that a meta tensor stores nothing; its indices have no values)
    runs, width, nnz = geometry
    return _compressed_index_problem(compressed, plain, runs, width, nnz, chunks)


def _compressed_geometry(
    kind: str, compressed: Tensor, plain: Tensor, values: Tensor, size: tuple[int, ...]
) -> tuple[int, int, int] | str:
    """The runs (rows of CSR and BSR blocks, columns of CSC and BSC ones), the width across them and the stored
    count per batch, as torch's invariant check works them out; or why its shape and dtype checks refuse the parts
    (a string)."""
    names = "compressed indices", "plain indices"
    batch = len(compressed.shape) - 1
    block = 2 if kind in ("sparse_bsr", "sparse_bsc") else 0
    dense = len(values.shape) - batch - block - 1
    if batch < 0:
        return "compressed indices of 0 dimensions"
    if len(plain.shape) != len(compressed.shape):
        return f"compressed indices of {len(compressed.shape)} dimensions, plain indices of {len(plain.shape)}"
    if dense < 0:
        return f"values of {len(values.shape)} dimensions, fewer than batch and block dimensions + 1"
    for name, part in zip(names, (plain, compressed), strict=True):
        if part.stride[-1:] != (1,):
            return f"{name} not contiguous along their last dimension"
    if len(size) != batch + 2 + dense:
        return f"a size of {len(size)} dimensions for {batch} batch, 2 sparse and {dense} dense ones"
    blocks = (max(1, values.shape[batch + 1]), max(1, values.shape[batch + 2])) if block else (1, 1)
    batches = {tuple(size[:batch]), compressed.shape[:batch], plain.shape[:batch], values.shape[:batch]}
    if len(batches) > 1:
        return "batch dimensions that differ between the size and the parts"
    if size[batch] % blocks[0] or size[batch + 1] % blocks[1]:
        return f"a size {list(size[batch : batch + 2])} not divisible by its blocks {list(blocks)}"
    along, across = COMPRESSED[kind]
    runs, width = size[batch + along] // blocks[along], size[batch + across] // blocks[across]
    nnz = values.shape[batch]
    if compressed.shape[-1] != runs + 1:
        return f"{compressed.shape[-1]} compressed indices for {runs} {_RUNS[kind]} (torch wants {runs + 1})"
    if plain.shape[-1] != nnz:
        return f"{plain.shape[-1]} plain indices for {nnz} stored elements"
    if compressed.dtype != plain.dtype or compressed.dtype not in ("int32", "int64"):
        dtypes = compressed.dtype if compressed.dtype == plain.dtype else f"{compressed.dtype} and {plain.dtype}"
        return f"{dtypes} indices (torch wants both int32 or both int64)"
    return runs, width, nnz


_RUNS = {"sparse_csr": "rows", "sparse_csc": "columns", "sparse_bsr": "row blocks", "sparse_bsc": "column blocks"}


def _compressed_index_problem(
    compressed: Tensor, plain: Tensor, runs: int, width: int, nnz: int, chunks: Chunks
) -> str | None:
    """``_validate_compressed_sparse_indices``, batch by batch: compressed indices start at 0, end at the stored
    count and step by 0 to the width; plain indices lie within the width, sorted and distinct within each run.
    The compressed indices are read whole (one per run), the plain ones in chunks."""
    read = [as_indices(c.reshape(-1), compressed.dtype) for c in chunks(compressed)]
    starts = np.concatenate(read) if read else np.zeros(0, np.int64)
    starts = starts.reshape(-1, runs + 1)
    steps = np.diff(starts, axis=1)
    if (starts[:, 0] != 0).any():
        return f"compressed indices start at {int(starts[:, 0][starts[:, 0] != 0][0])}, not 0"
    if (steps < 0).any():
        return "compressed indices decrease"
    if (starts[:, -1] != nnz).any():
        return (
            f"compressed indices end at {int(starts[:, -1][starts[:, -1] != nnz][0])}, not at the {nnz} stored elements"
        )
    if (steps > width).any():
        return f"compressed indices step by {int(steps.max())}, more than the {width} places across"
    if nnz:
        return _plain_index_problem(plain, starts, width, nnz, chunks)
    return None


def _plain_index_problem(plain: Tensor, starts: np.ndarray, width: int, nnz: int, chunks: Chunks) -> str | None:
    """Plain indices outside 0..width-1, or not increasing within a run (``starts``: each batch's compressed
    indices, checked already)."""
    position, previous = 0, 0
    for chunk in chunks(plain):
        values = as_indices(chunk.reshape(-1), plain.dtype)
        low, high = (int(values.min()), int(values.max())) if values.size else (0, 0)
        if low < 0 or high >= width:
            return f"plain index {low if low < 0 else high} outside 0..{width - 1}"
        while values.size:
            batch, at = divmod(position, nnz)
            part = values[: nnz - at]
            places = np.arange(at, at + part.size)
            run = np.searchsorted(starts[batch], places, side="right")
            # each value against the one before it (the chunk's first against the last of the chunk before)
            before = np.concatenate([[previous], part[:-1]])
            same_run = np.concatenate([[at > 0 and run[0] == _run_of(starts[batch], at - 1)], run[1:] == run[:-1]])
            if (same_run & (part <= before)).any():
                return "plain indices not sorted and distinct within a run"
            previous, position, values = int(part[-1]), position + part.size, values[part.size :]
    return None


def _run_of(starts: np.ndarray, place: int) -> int:
    """The run (as :func:`numpy.searchsorted` numbers it) that stored element ``place`` lies in."""
    return int(np.searchsorted(starts, place, side="right"))


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
