"""How far each layer moved between checkpoints (``diff --stats``), and each layer's norm across a series.

For two files, every tensor the two hold under the same key with the same shape is read a chunk at
a time, both sides together, into float64 sums of a², b², (a−b)² and a·b, giving per layer:

- ``relative_change`` ‖a−b‖/‖a‖ (0 for a frozen layer; None when ‖a‖ is 0 and ‖b‖ is not);
- ``cosine`` a·b/(‖a‖‖b‖) (None when either side is all zero);
- ``norm_a`` ‖a‖ and ``norm_b`` ‖b‖.

NaN and Inf: the sums run over the positions where both a and b are finite; ``nonfinite`` counts
the positions left out, and ``sides`` how many NaN and Inf each side holds (a layer with no position finite
on both sides has no numbers at all: it is not compared, and no change of 0). Values are
decoded as :func:`~ckpt_tui.core.values.tensor_values.decode` reads them, so two files of different float
dtypes compare by value; complex tensors keep both parts (:func:`~ckpt_tui.core.values.tensor_values.decode_complex`)
and are summed as pairs of reals, so the cosine is Re⟨a,b⟩/(‖a‖‖b‖) and a sign or phase change shows.
Keys on one side only, shape changes and unreadable tensors are rows with no numbers and a ``note`` saying why.

For a series (three or more files in order), each layer's L2 norm in each file is
:func:`~ckpt_tui.core.values.stats.tensor_stats`' norm (over finite values); a file without the layer has
None there.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ckpt_tui.core.conventions.state_dicts import inner_state_dict
from ckpt_tui.core.conventions.training_state import tensor_role as role
from ckpt_tui.core.errors import Cancelled, CkptError, ReadStopped
from ckpt_tui.core.model.keypath import KeyPath, file_path_json, to_json
from ckpt_tui.core.model.tree import Checkpoint, Tensor
from ckpt_tui.core.operations.diff import (
    Alignment,
    alignment,
    compared_leaves,
    key_text,
    nonfinite_positions_differ,
    normalized,
)
from ckpt_tui.core.values.batched_values import Gathered, PairBatches, view_rows
from ckpt_tui.core.values.nonfinite import SideCounts, side_counts
from ckpt_tui.core.values.pair_sums import NO_SUMS, PairSums, pair_sums, wide_sums
from ckpt_tui.core.values.stats import (
    DOT_SEGMENT,
    STATS_THREADS,
    in_chunk_order,
    segmented_dot,
    tensor_stats,
    worker_pool,
)
from ckpt_tui.core.values.tensor_values import (
    CHUNK_ELEMENTS,
    COMPLEX_DTYPES,
    SharedRead,
    TensorReader,
    decode,
    decode_compact,
    decode_complex,
    paired_chunks,
    same_layout,
    thread_buffer,
)

Progress = Callable[[int, int], None]
CancelCheck = Callable[[], bool]


@dataclass
class LayerChange:
    """One layer (tensor) of A against the same key of B."""

    path: KeyPath
    relative_change: float | None = None
    cosine: float | None = None
    norm_a: float | None = None
    norm_b: float | None = None
    nonfinite: int = 0
    note: str | None = None
    """Why there are no numbers (only in A, shape change, unreadable), or None."""
    role: str = "parameter"
    """What the tensor is: ``parameter``, ``buffer`` (BatchNorm statistics), ``counter`` (an integer
    tensor such as ``num_batches_tracked``) or ``optimizer state``; see :func:`role`."""
    sides: SideCounts | None = None
    """The NaN and Inf on each side, for a layer holding some (``nonfinite``): what its row says."""
    nonfinite_differ: bool = False
    """Its NaN or Inf are not the same on both sides (a value became NaN or Inf): a change no sum measures, so
    never counted unchanged nor listed as moved least."""

    @property
    def not_compared(self) -> bool:
        """Whether no position is finite on both sides (one side all NaN or Inf): a row with no numbers,
        which is no change of 0."""
        return self.note is None and self.nonfinite > 0 and self.norm_a is None

    @property
    def key(self) -> str:
        """The key as text (``a/b`` or ``ckpt["a/b"]``)."""
        return key_text(self.path)

    def to_json(self) -> dict[str, Any]:
        """The ``diff --stats --json`` row."""
        return {
            "path": to_json(self.path),
            "relative_change": self.relative_change,
            "cosine": self.cosine,
            "norm_a": self.norm_a,
            "norm_b": self.norm_b,
            "nonfinite": self.nonfinite,
            "note": self.note,
            "role": self.role,
            "nonfinite_sides": self.sides.to_json() if self.sides is not None else None,
        }


@dataclass
class LayerChangeReport:
    """Every layer of A in module order (then B's own keys), with how it changed."""

    layers: list[LayerChange] = field(default_factory=list)
    alignment: Alignment | None = None
    """Where the keys of A and B would match, when as they are they mostly do not (see :func:`alignment`)."""

    @property
    def measured(self) -> list[LayerChange]:
        """The rows of layers both sides hold alike (with numbers, or NaN/Inf where they would be)."""
        return [layer for layer in self.layers if layer.note is None]

    @property
    def compared(self) -> list[LayerChange]:
        """The rows that have numbers: measured, not all NaN/Inf on a side."""
        return [layer for layer in self.layers if layer.note is None and not layer.not_compared]

    @property
    def unchanged(self) -> bool:
        """Every layer of either side measured, none moved (``diff``'s exit 0): no key on one side only, no
        shape or dtype change, no unreadable layer, every ``‖a−b‖`` zero; a layer with NaN or Inf left out of
        its sums is not shown equal, so it counts as changed."""
        return all(layer.note is None and layer.relative_change == 0 and not layer.nonfinite for layer in self.layers)

    def to_json(self) -> dict[str, Any]:
        """``{"layers": [{"path", "relative_change", "cosine", "norm_a", "norm_b", ...}]}``."""
        return {"layers": [layer.to_json() for layer in self.layers]}


def layer_change(
    a: Checkpoint,
    b: Checkpoint,
    strip_prefix: str | None = None,
    progress: Progress | None = None,
    cancelled: CancelCheck | None = None,
) -> LayerChangeReport:
    """Per-layer change from A to B, streamed (the trees as ``diff`` takes them)."""
    root_a = normalized(a, strip_prefix)
    left, right = compared_leaves(root_a), compared_leaves(normalized(b, strip_prefix))
    # a training checkpoint's model weights under a key: tensors beside them (a callback's best score) are
    # listed apart from the model's layers
    model_at = inner_state_dict(root_a)
    report = LayerChangeReport()
    tensors_a = [(p, v) for p, v in left.items() if isinstance(v, Tensor)]
    paired = [(x, y) for p, x in tensors_a if isinstance(y := right.get(p), Tensor)]
    batches: PairBatches[LayerChange] = PairBatches(paired, (a.byteorder, b.byteorder))
    answered: dict[int, LayerChange] = {}
    streamed: dict[int, LayerChange] = {}
    streamed_to = position = 0
    for index, (path, x) in enumerate(tensors_a):
        if progress is not None:
            progress(index, len(tensors_a))
        y = right.get(path)
        if not isinstance(y, Tensor):
            report.layers.append(_compare(path, x, y, a.byteorder, b.byteorder, cancelled))
            continue
        if position >= batches.upcoming:
            answered.update(batches.read_until(position, _measure_batch, cancelled))
        if index >= streamed_to and _streams(x, y):
            # this large pair and the large pairs right after it: their chunks in one stream on the workers
            run = _large_run(tensors_a, right, index)
            streamed.update(_measure_run(run, a.byteorder, b.byteorder, cancelled))
            streamed_to = index + len(run)
        found = answered.pop(position, None) or streamed.pop(index, None)
        position += 1
        if found is None:
            found = _compare(path, x, y, a.byteorder, b.byteorder, cancelled)
        else:
            found.path = path
        found.role = role(path, x, model_at)
        if found.nonfinite:
            # (a second read of the pair, for the few holding NaN/Inf: which side holds them, how many, and
            # whether they are the same on both sides)
            found.sides = side_counts(x, y, a.byteorder, b.byteorder, cancelled)
            found.nonfinite_differ = nonfinite_positions_differ(x, y, a.byteorder, b.byteorder)
        report.layers.append(found)
    report.layers += [
        LayerChange(p, note="only in B", role=role(p, v, model_at))
        for p, v in right.items()
        if isinstance(v, Tensor) and p not in left
    ]
    if any(layer.note == "only in A" for layer in report.layers) and any(
        layer.note == "only in B" for layer in report.layers
    ):
        report.alignment = alignment(normalized(a, strip_prefix), normalized(b, strip_prefix))
    return report


def _compare(
    path: KeyPath, x: Tensor, y: Any, order_a: str, order_b: str, cancelled: CancelCheck | None
) -> LayerChange:
    if not isinstance(y, Tensor):
        return LayerChange(path, note="only in A" if y is None else "not a tensor in B")
    if x.shape != y.shape:
        return LayerChange(path, note=f"shape {list(x.shape)} in A, {list(y.shape)} in B")
    try:
        with np.errstate(all="ignore"):
            return _measure(path, x, y, order_a, order_b, cancelled)
    except (Cancelled, ReadStopped):
        raise
    except CkptError as exc:
        return LayerChange(path, note=f"unreadable: {exc}")


def _measure(
    path: KeyPath, x: Tensor, y: Tensor, order_a: str, order_b: str, cancelled: CancelCheck | None
) -> LayerChange:
    """The sums of one pair, chunk by chunk: a big tensor's chunks are summed on the statistics threads while
    the next ones are read, and their sums added here in chunk order (the same figures, bit for bit)."""
    pool = worker_pool() if x.numel > CHUNK_ELEMENTS and same_layout(x, y) else None
    totals = NO_SUMS
    nonfinite = 0

    def settle(found: tuple[PairSums, int]) -> None:
        nonlocal totals, nonfinite
        sums, skipped = found
        totals = totals.plus(sums)
        nonfinite += skipped

    reuse = STATS_THREADS + 1 if pool is not None else 0
    # reading chunk k reuses the buffers of chunk k - STATS_THREADS - 1, settled by then; stride 0 costs its storage
    chunks = ((raw_a, raw_b, repeats, x, y) for raw_a, raw_b, repeats in paired_chunks(x, y, order_a, order_b, reuse))
    in_chunk_order(chunks, _chunk_sums, settle, pool, cancelled, "cancelled")
    return _finished(path, x, y, order_a, order_b, totals, nonfinite)


def _finished(
    path: KeyPath, x: Tensor, y: Tensor, order_a: str, order_b: str, totals: PairSums, nonfinite: int
) -> LayerChange:
    """The row of a pair from the sums of all its chunks."""
    if nonfinite >= x.numel > 0:
        # no position finite on both sides: nothing was compared, which is no change of 0 (a frozen layer)
        return LayerChange(path, nonfinite=nonfinite)
    if _extreme(x, y, totals):
        return _rescaled_change(path, x, y, order_a, order_b)
    return _change(path, totals, nonfinite)


def _large_run(
    tensors_a: list[tuple[KeyPath, Tensor]], right: dict[KeyPath, Any], start: int
) -> list[tuple[int, KeyPath, Tensor, Tensor]]:
    """The large pairs from A's tensor ``start`` on, up to the first tensor that is not one (:func:`_streams`)."""
    run = []
    for index in range(start, len(tensors_a)):
        path, x = tensors_a[index]
        y = right.get(path)
        if not isinstance(y, Tensor) or not _streams(x, y):
            break
        run.append((index, path, x, y))
    return run


def _streams(x: Tensor, y: Any) -> bool:
    """Whether a pair is large enough to be read and summed on the statistics threads a chunk at a time, each
    chunk read by the thread that sums it (:func:`_measure_run`)."""
    return isinstance(y, Tensor) and x.numel > CHUNK_ELEMENTS and same_layout(x, y)


_ChunkWork = Callable[[int, int], tuple[PairSums, int]]
"""The sums of ``(begin, count)`` elements of a pair, and how many positions were not finite on both sides."""


@dataclass
class _Streamed:
    """A pair of a run being measured: its readers' contexts, sums so far, and chunks still to settle."""

    index: int
    path: KeyPath
    x: Tensor
    y: Tensor
    reads: contextlib.ExitStack
    left: int
    totals: PairSums = NO_SUMS
    nonfinite: int = 0
    failed: CkptError | None = None


def _measure_run(
    run: list[tuple[int, KeyPath, Tensor, Tensor]], order_a: str, order_b: str, cancelled: CancelCheck | None
) -> dict[int, LayerChange]:
    """The rows of consecutive large pairs, by index: every chunk of every pair read and summed on a statistics
    thread (reads any thread may make: :meth:`TensorReader.shared_reads`), one pair's chunks following the last
    one's without the threads waiting for each other between layers; the sums added here in chunk order (the
    figures of :func:`_measure`, bit for bit). A pair whose values cannot be read so is left out (measured alone)."""
    rows: dict[int, LayerChange] = {}

    def chunks(
        every: contextlib.ExitStack,
    ) -> Iterator[tuple[_ChunkWork, _Streamed, int, int]]:
        for index, path, x, y in run:
            pair = _opened(index, path, x, y, order_a, order_b, every)
            if pair is None:
                continue
            work, streamed = pair
            for begin in range(0, x.numel, CHUNK_ELEMENTS):
                yield work, streamed, begin, min(CHUNK_ELEMENTS, x.numel - begin)

    def settle(found: tuple[_Streamed, tuple[PairSums, int] | CkptError]) -> None:
        streamed, result = found
        if isinstance(result, CkptError):
            streamed.failed = streamed.failed or result
        elif streamed.failed is None:
            streamed.totals, streamed.nonfinite = streamed.totals.plus(result[0]), streamed.nonfinite + result[1]
        streamed.left -= 1
        if streamed.left == 0:
            # every chunk summed: its reads end here (a writer waiting for a lease goes on)
            streamed.reads.close()
            rows[streamed.index] = _streamed_row(streamed, order_a, order_b)

    with contextlib.ExitStack() as every, np.errstate(all="ignore"):
        # each chunk's work reads its own values: a thread done before the oldest chunk takes another
        in_chunk_order(chunks(every), _run_chunk, settle, worker_pool(), cancelled, "cancelled", 4 * STATS_THREADS)
    return rows


def _opened(
    index: int, path: KeyPath, x: Tensor, y: Tensor, order_a: str, order_b: str, every: contextlib.ExitStack
) -> tuple[_ChunkWork, _Streamed] | None:
    """A pair of a run with its reads open (closed when its last chunk is summed, or with ``every``), or None
    when it cannot be read so."""
    reads = every.enter_context(contextlib.ExitStack())
    try:
        reader_x, reader_y = TensorReader(x, order_a), TensorReader(y, order_b, ring="ring_b")
        read_x = reads.enter_context(reader_x.shared_reads(mapped=True))
        read_y = reads.enter_context(reader_y.shared_reads(mapped=True))
    except ReadStopped:
        raise
    except CkptError:
        reads.close()
        return None
    if read_x is None or read_y is None:
        reads.close()
        return None
    chunk_count = -(-x.numel // CHUNK_ELEMENTS)
    return _shared_chunk(read_x, read_y, reader_x, reader_y), _Streamed(index, path, x, y, reads, chunk_count)


def _run_chunk(
    work: _ChunkWork, streamed: _Streamed, begin: int, count: int
) -> tuple[_Streamed, tuple[PairSums, int] | CkptError]:
    """One chunk of a run's pair, on a statistics thread: its sums, or why it could not be read (that pair's row
    says so; a changed file or a cancel ends the run)."""
    try:
        return streamed, work(begin, count)
    except (Cancelled, ReadStopped):
        raise
    except CkptError as exc:
        return streamed, exc


def _streamed_row(streamed: _Streamed, order_a: str, order_b: str) -> LayerChange:
    """The row of a run's pair once every chunk is summed."""
    if streamed.failed is not None:
        return LayerChange(streamed.path, note=f"unreadable: {streamed.failed}")
    try:
        return _finished(streamed.path, streamed.x, streamed.y, order_a, order_b, streamed.totals, streamed.nonfinite)
    except (Cancelled, ReadStopped):
        raise
    except CkptError as exc:
        return LayerChange(streamed.path, note=f"unreadable: {exc}")


WIDE_FLOATS = frozenset({"float64", "complex128"})
"""Dtypes whose squares can overflow or underflow the float64 sums (float32's cannot)."""
TINY_SQUARES = 2.0**-900


def _extreme(x: Tensor, y: Tensor, sums: PairSums) -> bool:
    """Whether a float64 pair's sums of squares overflowed, or may have underflowed (values near 1e-154)."""
    if x.dtype not in WIDE_FLOATS and y.dtype not in WIDE_FLOATS:
        return False
    squares = (sums.aa, sums.bb, sums.dd, sums.ab)
    return not all(map(math.isfinite, squares)) or sums.aa < TINY_SQUARES or sums.bb < TINY_SQUARES


def _rescaled_change(path: KeyPath, x: Tensor, y: Tensor, order_a: str, order_b: str) -> LayerChange:
    """The row of a pair whose squares leave float64's range, from its values divided by a power of two
    near their largest |x| (exact), as torch.linalg.vector_norm scales: two reads, both sides finite only."""

    def finite_pairs() -> Iterator[tuple[np.ndarray, np.ndarray, int | np.ndarray, int]]:
        for raw_a, raw_b, repeats in paired_chunks(x, y, order_a, order_b, 0):
            va, vb = decode_complex(raw_a, x.dtype, x.metadata), decode_complex(raw_b, y.dtype, y.metadata)
            finite = np.isfinite(va) & np.isfinite(vb)
            counts = repeats if isinstance(repeats, int) else repeats[finite]
            skipped = (
                int(finite.size - np.count_nonzero(finite)) * repeats
                if isinstance(repeats, int)
                else int(repeats[~finite].sum())
            )
            yield va[finite], vb[finite], counts, skipped

    with np.errstate(all="ignore"):
        top = max(
            (
                max(float(np.abs(va).max(initial=0)), float(np.abs(vb).max(initial=0)))
                for va, vb, _, _ in finite_pairs()
            ),
            default=0.0,
        )
        if top == 0:
            return _change(path, NO_SUMS, sum(skipped for *_, skipped in finite_pairs()))
        scale = math.ldexp(1.0, math.frexp(top)[1] - 1)  # |x| / scale < 2; 2**1024 is past float64
        totals, nonfinite = NO_SUMS, 0
        for va, vb, counts, skipped in finite_pairs():
            reals_a, reals_b = (va / scale).view(np.float64), (vb / scale).view(np.float64)
            weights = counts if isinstance(counts, int) else np.repeat(counts, 2)
            totals, nonfinite = totals.plus(_sums(reals_a, reals_b, weights, wide=True)), nonfinite + skipped
    row = _change(path, totals, nonfinite)
    # relative change and cosine do not depend on the scale; the norms do
    row.norm_a = None if row.norm_a is None else row.norm_a * scale
    row.norm_b = None if row.norm_b is None else row.norm_b * scale
    return row


def _shared_chunk(read_x: SharedRead, read_y: SharedRead, reader_x: TensorReader, reader_y: TensorReader) -> _ChunkWork:
    """The work of one chunk of a pair read on the worker that sums it: ``(begin, count)`` to its sums."""
    x, y = reader_x.tensor, reader_y.tensor
    first_x, first_y = x.offset, y.offset

    def work(begin: int, count: int) -> tuple[PairSums, int]:
        buffer_x, buffer_y = (
            thread_buffer(CHUNK_ELEMENTS * reader_x.size, "pair_x"),
            thread_buffer(CHUNK_ELEMENTS * reader_y.size, "pair_y"),
        )
        raw_a = np.frombuffer(read_x(first_x + begin, count, buffer_x), reader_x.raw_type)
        raw_b = np.frombuffer(read_y(first_y + begin, count, buffer_y), reader_y.raw_type)
        return _chunk_sums(raw_a, raw_b, 1, x, y)

    return work


def _chunk_sums(
    raw_a: np.ndarray, raw_b: np.ndarray, repeats: int | np.ndarray, x: Tensor, y: Tensor
) -> tuple[PairSums, int]:
    """The sums of one chunk over the positions finite on both sides, and how many were not."""
    if x.dtype in COMPLEX_DTYPES or y.dtype in COMPLEX_DTYPES:
        return _complex_chunk_sums(raw_a, raw_b, repeats, x, y)
    with np.errstate(all="ignore"):  # (numpy's error state is per thread)
        va, vb = decode_compact(raw_a, x.dtype, x.metadata), decode_compact(raw_b, y.dtype, y.metadata)
        sums = _sums(va, vb, repeats)
        if all(math.isfinite(v) for v in sums[:6]):
            return sums, 0
        # a NaN or Inf somewhere: only positions finite on both sides, summed wide (as the chunk always was)
        finite = np.isfinite(va) & np.isfinite(vb)
        if isinstance(repeats, int):
            skipped = int(finite.size - np.count_nonzero(finite)) * repeats
            return _sums(va[finite], vb[finite], repeats, wide=True), skipped
        # each stored element with its own count
        return _sums(va[finite], vb[finite], repeats[finite]), int(repeats[~finite].sum())


def _complex_chunk_sums(
    raw_a: np.ndarray, raw_b: np.ndarray, repeats: int | np.ndarray, x: Tensor, y: Tensor
) -> tuple[PairSums, int]:
    """:func:`_chunk_sums` of complex elements seen as pairs of reals (the R^2n view): Σ|a|², Σ|b|², Σ|a−b|² and
    Re⟨a,b⟩ = Σ(re_a·re_b + im_a·im_b), over the elements finite in both parts on both sides."""
    with np.errstate(all="ignore"):
        va, vb = decode_complex(raw_a, x.dtype, x.metadata), decode_complex(raw_b, y.dtype, y.metadata)
        finite = np.isfinite(va) & np.isfinite(vb)
        skipped = finite.size - int(np.count_nonzero(finite))
        if skipped:
            va, vb = va[finite], vb[finite]
        # each element's real and imaginary part side by side, each counted as often as the element
        reals_a, reals_b = va.view(np.float64), vb.view(np.float64)
        if isinstance(repeats, int):
            return _sums(reals_a, reals_b, repeats), skipped * repeats
        counts = np.repeat(repeats[finite] if skipped else repeats, 2)
        return _sums(reals_a, reals_b, counts), int(repeats[~finite].sum())


def _change(path: KeyPath, sums: PairSums, nonfinite: int) -> LayerChange:
    """The row of a layer from its sums."""
    norm_a, norm_b = math.sqrt(sums.aa), math.sqrt(sums.bb)
    if norm_a > 0:
        relative: float | None = math.sqrt(sums.dd) / norm_a
    else:
        relative = 0.0 if sums.dd == 0 else None
    cosine = None
    if norm_a > 0 and norm_b > 0 and sums.dd == 0:
        # equal values (a − b is exactly 0 everywhere): Σab/(√Σa²·√Σb²) can still round to 1 − 1.1e-16, and the
        # table counting this layer unchanged must not show it as moved
        cosine = 1.0
    elif norm_a > 0 and norm_b > 0:
        cosine = _narrow_cosine(sums, norm_a, norm_b) if sums.narrow else sums.ab / (norm_a * norm_b)
        cosine = max(-1.0, min(1.0, cosine))
    return LayerChange(path, relative, cosine, norm_a, norm_b, nonfinite)


def _narrow_cosine(sums: PairSums, norm_a: float, norm_b: float) -> float:
    """The cosine from sums with float32 blocks among them (relative error up to NARROW_BOUND each).

    Near 1, 1 − cos = (Σ(a−b)² − (‖a‖−‖b‖)²) / (2‖a‖‖b‖), with ‖a‖−‖b‖ = Σ(a−b)(a+b) / (‖a‖+‖b‖): every term is
    known to a few bounds of itself, so 1 − cos keeps its digits where Σab/(‖a‖‖b‖) would lose them to the
    bound (a fine-tune's cosine is 1 − 1e-7); near −1 the same with a+b. Elsewhere Σab/(‖a‖‖b‖), within a few
    bounds, absolute.
    """
    product = norm_a * norm_b
    gap = sums.ds / (norm_a + norm_b)
    if sums.dd <= product:
        return 1.0 - (sums.dd - gap * gap) / (2.0 * product)
    if sums.ss <= product:
        return (sums.ss - gap * gap) / (2.0 * product) - 1.0
    return sums.ab / product


def _measure_batch(dtype_a: str, dtype_b: str, a: Gathered, b: Gathered) -> dict[int, LayerChange]:
    """:func:`_measure` over a batch of pairs (each the same element count on both sides): the rows of
    the pairs whose values are all finite, by pair (their ``path`` set by the caller). Views of one length
    are summed together with stacked dot products, bit for bit as ``np.dot`` sums each pair."""
    found: dict[int, LayerChange] = {}
    if dtype_a in COMPLEX_DTYPES or dtype_b in COMPLEX_DTYPES:
        # left to the pair-by-pair path, which keeps both parts of a complex element
        return found
    wide = dtype_a in WIDE_FLOATS or dtype_b in WIDE_FLOATS
    with np.errstate(all="ignore"):
        va, vb = decode(a.values, dtype_a), decode(b.values, dtype_b)
        lengths = np.diff(a.bounds)
        for length in np.unique(lengths[lengths < DOT_SEGMENT]).tolist():
            views = np.flatnonzero(lengths == length)
            rows_a, rows_b = view_rows(va, a.bounds, views, length), view_rows(vb, a.bounds, views, length)
            delta = rows_a - rows_b
            sums = [_row_dots(u, v) for u, v in ((rows_a, rows_a), (rows_b, rows_b), (delta, delta), (rows_a, rows_b))]
            finite = np.isfinite(sums[0]) & np.isfinite(sums[1]) & np.isfinite(sums[2]) & np.isfinite(sums[3])
            for view, ok, aa, bb, dd, ab in zip(
                views.tolist(), finite.tolist(), *(s.tolist() for s in sums), strict=True
            ):
                # a float64 pair whose squares may have underflowed is left to the pair path, which rescales it
                if ok and not (wide and (aa < TINY_SQUARES or bb < TINY_SQUARES)):
                    found[int(a.answered[view])] = _change((), wide_sums(0.0 + aa, 0.0 + bb, 0.0 + dd, 0.0 + ab), 0)
    return found


def _row_dots(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The dot product of each row of ``u`` with the same row of ``v`` (one BLAS dot per row)."""
    return np.matmul(u[:, None, :], v[:, :, None]).ravel()


def _sums(va: np.ndarray, vb: np.ndarray, repeats: int | np.ndarray = 1, wide: bool = False) -> PairSums:
    """The sums of a pair, each element counted ``repeats`` times (not finite with a NaN or Inf); ``wide``:
    in float64 whatever the dtypes."""
    if isinstance(repeats, int):
        return pair_sums(va, vb, wide).scaled(repeats)
    va, vb = va.astype(np.float64, copy=False), vb.astype(np.float64, copy=False)
    delta = va - vb
    wa, wd = va * repeats, delta * repeats
    # (in segments, as everywhere: one np.dot over a whole chunk runs on OpenBLAS's own threads)
    aa, bb = segmented_dot(wa, va), segmented_dot(vb * repeats, vb)
    return wide_sums(aa, bb, segmented_dot(wd, delta), segmented_dot(wa, vb))


# ---- a series of files -----------------------------------------------------------------------


@dataclass
class NormSeries:
    """Each layer's norm in each file of a series, layers in the first file's order (then new ones)."""

    layers: list[tuple[KeyPath, list[float | None]]] = field(default_factory=list)
    """Each layer's norm of its finite values per file (None: absent, unreadable, or no finite value)."""
    nonfinite: list[list[int]] = field(default_factory=list)
    """Per layer (as ``layers``), how many NaN/Inf it holds in each file."""
    roles: list[str] = field(default_factory=list)
    """Per layer (as ``layers``), what it is (:func:`~ckpt_tui.core.conventions.training_state.tensor_role`)."""

    @property
    def unchanged(self) -> bool:
        """Every layer in every file, of one norm in all of them, and no NaN/Inf (equal norms do not make equal
        values: ``diff`` of the files says that)."""
        return all(None not in norms and len(set(norms)) == 1 for _, norms in self.layers) and not any(
            map(any, self.nonfinite)
        )

    def to_json(self, files: Sequence[str]) -> dict[str, Any]:
        """``{"series": [{"path", "norms": [...], "nonfinite": [...]}], "files": [...]}``."""
        return {
            "series": [
                {"path": to_json(path), "norms": norms, "nonfinite": counts}
                for (path, norms), counts in zip(self.layers, self.nonfinite, strict=True)
            ],
            **file_path_json(list(files), "files"),
        }


def norm_series(
    checkpoints: Sequence[Checkpoint],
    strip_prefix: str | None = None,
    progress: Progress | None = None,
    cancelled: CancelCheck | None = None,
) -> NormSeries:
    """The L2 norm of every layer in every file (None where a file lacks it or it cannot be read)."""
    roots = [normalized(c, strip_prefix) for c in checkpoints]
    trees = [compared_leaves(root) for root in roots]
    model_at = inner_state_dict(roots[0])
    order: dict[KeyPath, None] = {}
    for tree in trees:
        order.update((p, None) for p, v in tree.items() if isinstance(v, Tensor))
    series = NormSeries()
    for index, path in enumerate(order):
        if progress is not None:
            progress(index, len(order))
        norms: list[float | None] = []
        counts: list[int] = []
        for tree, checkpoint in zip(trees, checkpoints, strict=True):
            tensor = tree.get(path)
            norm, nonfinite = (
                _norm(tensor, checkpoint.byteorder, cancelled) if isinstance(tensor, Tensor) else (None, 0)
            )
            norms.append(norm)
            counts.append(nonfinite)
        series.layers.append((path, norms))
        series.nonfinite.append(counts)
        first = next(tensor for tree in trees if isinstance(tensor := tree.get(path), Tensor))
        series.roles.append(role(path, first, model_at))
    return series


def _norm(tensor: Tensor, byteorder: str, cancelled: CancelCheck | None) -> tuple[float | None, int]:
    """The norm of a tensor's finite values, and how many NaN/Inf it holds."""
    try:
        stats = tensor_stats(tensor, byteorder, cancelled)
    except (Cancelled, ReadStopped):
        raise
    except CkptError:
        return None, 0
    return stats.norm, stats.nan + stats.inf
