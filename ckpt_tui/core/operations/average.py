"""``average``: model soups and SWA-style averages of checkpoints, streamed tensor by tensor.

The output is the first file's tree (or its subtree ``--at PATH``) with every floating-point tensor
(float64/32/16, bfloat16) replaced by the weighted mean of the same tensor in every file:

    out = (w1 * x1 + w2 * x2 + ...) / (w1 + w2 + ...)

computed in float64 a chunk at a time, in file order, and rounded once to the first file's dtype
(bfloat16 through float32, as torch's ``.to(torch.bfloat16)`` of a float64 tensor rounds). Weights
default to 1 each (the plain mean, as model soups use); given weights are divided by their sum, so
``1,1,2`` and ``0.25,0.25,0.5`` are the same average.

Every other tensor (integer buffers such as ``num_batches_tracked``, bool, complex, fp8, quantized,
sparse) and every non-tensor value are taken from the first file, and the outcome lists them.
Files must hold the same tensor keys with the same shapes; the first difference refuses the work.

An averaged tensor is a logical tensor made from pieces in several files, so its storage's source is
an :class:`~ckpt_tui.core.model.assembled.AssembledRecords`: the writers stream such tensors a
bounded chunk at a time, as they stream a distributed checkpoint's (memory: one chunk per input).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt_tui.core.conventions.state_dicts import inner_state_dict
from ckpt_tui.core.conventions.training_state import is_step_counter, tensor_role
from ckpt_tui.core.errors import ReadError, WriteRefused
from ckpt_tui.core.model.assembled import AssembledRecords
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.keypath import KeyPath, to_python
from ckpt_tui.core.model.tree import Checkpoint, Storage, Tensor, view_bits, view_key
from ckpt_tui.core.operations.convert import path_text, select
from ckpt_tui.core.operations.diff import key_text, leaves, one_notation
from ckpt_tui.core.runtime.shell import join_command
from ckpt_tui.core.values.fingerprint import Fingerprints
from ckpt_tui.core.values.stats import BLOCK_ELEMENTS, STATS_THREADS, worker_pool
from ckpt_tui.core.values.tensor_values import (
    SharedRead,
    TensorReader,
    decode,
    element_span,
    repeats_far_more,
    same_layout,
    stored_span,
    thread_buffer,
)

if TYPE_CHECKING:
    from ckpt_tui.core.writers.save import WriteResult

THREADED_INPUTS = 2
"""Up to this many files, chunks read here are averaged on the statistics threads (each holds a chunk of every
file); files the threads read themselves are averaged there whatever their number."""
READ_PIECE = 1 << 17
"""Elements of each file read and averaged at once on a statistics thread (512 kB of float32: two inputs and
the average stay in the core's cache between the read and the sums)."""
AVERAGED_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})
LIST_LIMIT = 8


class AverageRefused(ReadError):
    """The files cannot be averaged (keys, shapes or weights do not fit): exit 2, nothing written."""


@dataclass
class AveragePlan:
    """The output tree and what went into it."""

    root: Any
    weights: list[float]
    averaged: int = 0
    from_first: list[str] = field(default_factory=list)
    """Tensors taken from the first file (not floating point), by key."""
    differing_values: list[str] = field(default_factory=list)
    """Non-tensor values that differ between the files (the first file's is kept), by key."""
    mixed_dtypes: list[str] = field(default_factory=list)
    """Tensors whose dtype differs between files (averaged, written in the first file's dtype)."""
    counters: list[str] = field(default_factory=list)
    """Floating-point tensors that count steps (an optimizer's ``step``), taken from the first file, by key."""
    model_at: KeyPath | None = None
    """Where the model's weights are in a training checkpoint averaged whole (None: the tree is them)."""
    roles: dict[str, int] = field(default_factory=dict)
    """How many averaged tensors are the model's, optimizer state, or other (see :func:`tensor_role`)."""

    def lines(self) -> list[str]:
        """What the output says about the average (keys are escaped by the caller)."""
        shown = ", ".join(f"{w:.6g}" for w in self.weights)
        tensors = counted(self.averaged, "floating-point tensor")
        out = [f"averaged {tensors} of {counted(len(self.weights), 'file')} (weights {shown})"]
        model = self.roles.get("model", 0)
        if model < self.averaged:
            # a soup of Adam's moments or SGD's momentum is no model: what else went in is said, with the way
            # to leave it out
            where = f" ({to_python(self.model_at)})" if self.model_at else ""
            parts = [f"{counted(model, 'model tensor')}{where}"]
            parts += [f"{self.roles[role]} {role}" for role in ("optimizer state", "other") if self.roles.get(role)]
            out[0] += ": " + " + ".join(parts)
            if self.model_at:
                out.append(f"{join_command(['--at', path_text(self.model_at)])} averages the model only")
        if self.from_first:
            out.append(
                f"taken from the first file ({len(self.from_first)} not floating point): " + _listed(self.from_first)
            )
        if self.counters:
            out.append(
                f"taken from the first file ({counted(len(self.counters), 'step counter')}, kept with its other "
                "training state): " + _listed(self.counters)
            )
        if self.differing_values:
            differ = "differs" if len(self.differing_values) == 1 else "differ"
            out.append(
                f"{counted(len(self.differing_values), 'other value')} {differ} between the files; the first file's "
                "kept: " + _listed(self.differing_values)
            )
        if self.mixed_dtypes:
            have = "has" if len(self.mixed_dtypes) == 1 else "have"
            out.append(
                f"{counted(len(self.mixed_dtypes), 'tensor')} {have} other dtypes in later files (written in the "
                "first's): " + _listed(self.mixed_dtypes)
            )
        return out


def _listed(keys: list[str]) -> str:
    """Some keys of one list, in one notation (:func:`~ckpt_tui.core.operations.diff.one_notation`)."""
    more = f" (+{len(keys) - LIST_LIMIT} more)" if len(keys) > LIST_LIMIT else ""
    return ", ".join(list(one_notation(keys))[:LIST_LIMIT]) + more


def parse_weights(text: str | None, files: int) -> list[float]:
    """``--weights 1,1,2`` as numbers, one per file, normalised to sum 1 (default: equal)."""
    if text is None:
        return [1.0 / files] * files
    try:
        weights = [float(part) for part in text.split(",")]
    except ValueError:
        raise AverageRefused(f"--weights takes numbers separated by commas, got {text!r}") from None
    if len(weights) != files:
        raise AverageRefused(f"--weights has {counted(len(weights), 'number')} for {counted(files, 'file')}")
    refused = AverageRefused(f"--weights must be finite numbers with a non-zero sum, got {text!r}")
    if not all(math.isfinite(w) for w in weights):
        raise refused
    # divided by the largest first, so that huge weights (1e308,1e308) sum without overflow
    largest = max(abs(w) for w in weights)
    scaled = [w / largest for w in weights] if largest else weights
    total = math.fsum(scaled)
    if total == 0:
        raise refused
    return [w / total for w in scaled]


class AveragedRecords(AssembledRecords):
    """The record source of averaged tensors: each storage is the weighted mean of one tensor per file."""

    def __init__(self, path: str, weights: list[float], byteorders: list[str], allow_nan: bool = False) -> None:
        super().__init__(path)
        self.weights = weights
        self.byteorders = byteorders
        self.allow_nan = allow_nan
        """Average inputs that hold NaN or Inf (else refused: a soup with one is no model)."""
        self.inputs: dict[str, list[Tensor]] = {}
        self.names: dict[str, str] = {}
        self._spare = threading.local()
        """Each reading thread's output buffers free for its next tensor (a ring per tensor read at once)."""

    def add_average(self, storage_key: str, tensors: list[Tensor], name: str) -> None:
        """Register the tensors (one per file, same shape) whose mean is the storage ``storage_key``, and the
        key they are under (``name``, as messages say it)."""
        self.inputs[storage_key] = tensors
        self.names[storage_key] = name

    def has(self, storage: Storage) -> bool:
        """Whether the storage is one of the averages."""
        return storage.key in self.inputs

    def locate(self, storage: Storage) -> tuple[int, int]:
        """An average has no place in any file until written."""
        raise ReadError(f"{storage.key}: the average of {counted(len(self.weights), 'file')} exists once written")

    def placement(self, storage: Storage) -> list[str]:
        """Where the inputs are."""
        return [f"mean of {counted(len(self.weights), 'file')}"] if storage.key in self.inputs else []

    def elements(self, storage: Storage, begin: int, end: int, chunk: int, raw_type: np.dtype) -> Iterator[np.ndarray]:
        """Raw elements ``begin:end`` of the average (only whole tensors are read: begin 0, end numel).

        A chunk's array is valid until the chunk after the next is asked for (the averages of two files reuse
        a ring of output buffers)."""
        tensors = self.inputs[storage.key]
        if begin != 0 or end != storage.numel:
            raise ReadError(f"{storage.key}: only a whole averaged tensor can be read")
        # read on the statistics threads a piece at a time (a thread holds a piece of every file, whatever their
        # number); where that cannot be, chunks in flight there hold a chunk of every input: for two files (soups
        # of many files are then averaged here, the memory of one chunk per file)
        pool = worker_pool()
        if pool is not None:
            readers = [TensorReader(t, order) for t, order in zip(tensors, self.byteorders, strict=True)]
            with contextlib.ExitStack() as reads:
                shared = [reads.enter_context(reader.shared_reads(mapped=True)) for reader in readers]
                usable = [read for read in shared if read is not None]
                if len(usable) == len(readers):
                    yield from self._read_on_workers(storage, readers, usable, chunk, raw_type, pool)
                    return
        pool = pool if len(tensors) <= THREADED_INPUTS else None
        # each input read into its own ring of reused buffers (no fresh pages for every chunk): a chunk's
        # buffers are read into again once its average is done
        reuse = STATS_THREADS + 1 if pool is not None else 1
        chunks = [
            TensorReader(t, order, ring=f"average-{index}").chunks(chunk, reuse)
            for index, (t, order) in enumerate(zip(tensors, self.byteorders, strict=True))
        ]
        if pool is None:  # (or read on a statistics thread: averaged here)
            for parts in zip(*chunks, strict=True):
                yield self._averaged(parts, storage, tensors, raw_type)
            return
        # each chunk averaged on a statistics thread while the next is read and an earlier one is written:
        # a chunk is handed over before the oldest is written, so both threads average while the writer
        # writes (handed over after it, one thread idled through every write); at most STATS_THREADS chunks
        # are averaged while one is written, so reading chunk k reuses the buffers of chunk k - 3, written
        submit = pool.submit
        yield from _in_order(
            submit(self._averaged, parts, storage, tensors, raw_type) for parts in zip(*chunks, strict=True)
        )

    def _read_on_workers(
        self,
        storage: Storage,
        readers: list[TensorReader],
        shared: list[SharedRead],
        chunk: int,
        raw_type: np.dtype,
        pool: ThreadPoolExecutor,
    ) -> Iterator[np.ndarray]:
        """The chunks of an average of files on this machine, each read by the statistics thread that averages
        it (positioned reads: both threads copy and average, and the writer only writes), in order."""
        tensors = [reader.tensor for reader in readers]
        numel = storage.numel
        ring = self._take_ring(min(chunk, numel) * raw_type.itemsize)

        def work(number: int, start: int) -> np.ndarray:
            count = min(chunk, numel - start)
            out = np.frombuffer(ring[number % len(ring)], raw_type, count)
            # read and averaged a cache-sized piece at a time: the values are averaged while still in the cache
            for begin in range(0, count, READ_PIECE):
                size = min(READ_PIECE, count - begin)
                parts = []
                for index, (reader, read) in enumerate(zip(readers, shared, strict=True)):
                    buffer = thread_buffer(READ_PIECE * reader.size, f"average-in-{index}")
                    at = reader.tensor.offset + start + begin
                    parts.append(np.frombuffer(read(at, size, buffer), reader.raw_type))
                self._averaged(tuple(parts), storage, tensors, raw_type, out[begin : begin + size])
            return out

        spans = enumerate(range(0, numel, chunk))
        try:
            yield from _in_order(pool.submit(work, number, start) for number, start in spans)
        finally:
            self._give_back(ring)

    def _take_ring(self, nbytes: int) -> list[bytearray]:
        """Output buffers of ``nbytes`` for one tensor's chunks, kept from tensor to tensor (no fresh pages for
        every chunk): chunk k's is written by the time chunk k + 4 is handed over (at most STATS_THREADS are
        averaged while one is written, and the one before it may still be held)."""
        spare: list[list[bytearray]] = getattr(self._spare, "rings", [])
        ring = spare.pop() if spare else []
        if not ring or len(ring[0]) < nbytes:
            ring = [bytearray(nbytes) for _ in range(STATS_THREADS + 2)]
        return ring

    def _give_back(self, ring: list[bytearray]) -> None:
        # kept for this thread: the last chunk, still held by its reader once the tensor is read, is never
        # another thread's output meanwhile
        if not hasattr(self._spare, "rings"):
            self._spare.rings = []
        self._spare.rings.append(ring)

    def _averaged(
        self,
        parts: tuple[np.ndarray, ...],
        storage: Storage,
        tensors: list[Tensor],
        raw_type: np.dtype,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """One chunk of the average, as raw elements of ``raw_type`` (into ``out`` if given, else a new array);
        refused where it holds NaN or Inf, unless :attr:`allow_nan`."""
        # a float written as it is rounded (native order): cast straight into the output, no copy between
        cast_in_place = storage.dtype in NATIVE_FLOATS and raw_type.isnative
        if out is None:
            out = np.empty(parts[0].size, dtype=raw_type)
        # an overflow to Inf is a value judged here, never a warning on stderr
        with np.errstate(over="ignore", invalid="ignore"):
            if cast_in_place and all(_widened_by_numpy(t, raw) for t, raw in zip(tensors, parts, strict=True)):
                averaged = self._averaged_natively(parts, out)
                if not self.allow_nan and not _finite(averaged):
                    raise self._nonfinite(storage, all(map(_finite, parts)))
                return averaged
            return self._averaged_decoded(parts, storage, tensors, out, cast_in_place)

    def _averaged_decoded(
        self, parts: tuple[np.ndarray, ...], storage: Storage, tensors: list[Tensor], out: np.ndarray, cast: bool
    ) -> np.ndarray:
        """:meth:`_averaged` of inputs decoded to float64 (``cast``: rounded straight into ``out``)."""
        dtype = storage.dtype
        sums = np.empty(min(out.size, BLOCK_ELEMENTS), dtype=np.float64)
        # block by block, so that the float64 sums stay in the CPU's cache (the same sums, in the same order:
        # 0 + w1·x1 + w2·x2 + ..., each product in float64), with no temporary array per step
        for begin in range(0, out.size, BLOCK_ELEMENTS):
            block = slice(begin, begin + BLOCK_ELEMENTS)
            total = sums[: out[block].size]
            total.fill(0.0)
            for raw, tensor, weight in zip(parts, tensors, self.weights, strict=True):
                values = decode(raw[block], tensor.dtype, tensor.metadata)  # a float64 copy: ours to change
                values *= weight
                total += values
            if cast:
                np.copyto(out[block], total, casting="same_kind")  # rounded as astype rounds
                written = out[block]
            else:
                written = rounded(total, dtype)
                out[block] = written.astype(out.dtype, copy=False)
            # judged as written: a finite float64 sum may round past a narrower float's range (weights 2,-1)
            if not self.allow_nan and dtype in FLOAT_WIDTHS and not _written_finite(written, dtype):
                inputs = (decode(raw[block], t.dtype, t.metadata) for raw, t in zip(parts, tensors, strict=True))
                raise self._nonfinite(storage, all(map(_finite, inputs)))
        return out

    def _nonfinite(self, storage: Storage, inputs_finite: bool) -> AverageRefused:
        """The refusal of an average that holds NaN or Inf, naming the tensor and why (``inputs_finite``: no input
        holds one there, so the weighted sum went past the dtype's range)."""
        where = self.names.get(storage.key, storage.key)
        cause = (
            f"the weighted sum there is past {storage.dtype}'s range (--weights {self._weights_text()})"
            if inputs_finite
            else "as an input does there (ckpt-tui check names it)"
        )
        return AverageRefused(
            f"the average of {where} holds NaN or Inf, {cause}: a soup with them is no model; nothing written "
            "(--allow-nan writes it anyway)"
        )

    def _weights_text(self) -> str:
        """The normalised weights, as --weights would take them."""
        return ",".join(f"{weight:g}" for weight in self.weights)

    def _averaged_natively(self, parts: tuple[np.ndarray, ...], out: np.ndarray) -> np.ndarray:
        """:meth:`_averaged` of float16/32/64 inputs into a float16/32/64 output, widened into two reused
        blocks (no fresh array, no zero fill per block): the same bytes, a sweep and an allocation less a block.

        The sum starts from the first product rather than from 0 + it, and 0 is added at the end: the two
        orders give the same values and NaNs, and the same +0 where every product is a zero (0 + -0 is +0).
        """
        scratch: np.ndarray | None = None  # (made at the first block the float32 sum cannot average)
        halved = self.weights == [0.5, 0.5] and out.dtype == np.float32 and all(p.dtype == np.float32 for p in parts)
        for begin in range(0, out.size, BLOCK_ELEMENTS):
            end = min(begin + BLOCK_ELEMENTS, out.size)
            if halved and _halved_sum(parts[0][begin:end], parts[1][begin:end], out[begin:end]):
                continue
            if scratch is None:
                scratch = np.empty((2, min(out.size, BLOCK_ELEMENTS)), dtype=np.float64)
            total, values = scratch[0, : end - begin], scratch[1, : end - begin]
            np.copyto(total, parts[0][begin:end])
            total *= self.weights[0]
            for raw, weight in zip(parts[1:], self.weights[1:], strict=True):
                np.copyto(values, raw[begin:end])
                values *= weight
                total += values
            total += 0.0
            np.copyto(out[begin:end], total, casting="same_kind")  # rounded as astype rounds
        return out


def _in_order(work: Iterator[Future[np.ndarray]]) -> Iterator[np.ndarray]:
    """The results of chunks handed to the statistics threads, in order; at most :data:`STATS_THREADS` are
    waiting while one is used (a chunk is handed over before the oldest is used, so both threads work
    meanwhile). Stopped early (a failed write), no worker is left running."""
    pending: deque[Future[np.ndarray]] = deque()
    try:
        for future in work:
            pending.append(future)
            while len(pending) > STATS_THREADS:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for waiting in pending:
            waiting.cancel()
        futures_wait(pending)


def _finite(values: np.ndarray) -> bool:
    """Whether every value is finite: their float sum first (one pass in cache), each value only where that sum
    is not finite (a NaN, an Inf, or finite values whose sum is past the float's range)."""
    with np.errstate(all="ignore"):
        return math.isfinite(float(np.add.reduce(values, axis=None))) or bool(np.isfinite(values).all())


FLOAT_WIDTHS = ("float16", "bfloat16", "float32", "float64")
"""The output dtypes whose written values can be NaN or Inf (:func:`rounded` writes each)."""


def _written_finite(written: np.ndarray, dtype: str) -> bool:
    """Whether an output block as written holds no NaN or Inf (bfloat16: its bits, whose exponent is all ones
    there)."""
    if dtype == "bfloat16":
        return not bool(np.any((written.view(np.uint16) & 0x7F80) == 0x7F80))
    return _finite(written)


def _halved_sum(x: np.ndarray, y: np.ndarray, out: np.ndarray) -> bool:
    """The plain mean of two float32 blocks, in float32: (x + y + 0) · 0.5, the bytes the float64 sum rounded
    once gives (x/2 + y/2 + 0 in float64 rounded to float32: double rounding through float64's 53 bits is
    harmless for a sum of float32s, and halving is exact), at half the memory traffic. False, with ``out``
    to be written again, when it is not: x + y overflowed, or a halving was inexact (below float32's normals).
    """
    try:
        with np.errstate(over="raise", under="raise", invalid="ignore"):  # (inf - inf: NaN, as in float64)
            np.add(x, y, out=out)
            out += 0.0  # (-0 + -0 + 0 is +0, as the float64 sum's 0 + ... gives)
            out *= 0.5
    except FloatingPointError:
        return False
    return True


NATIVE_FLOATS = frozenset({"float64", "float32", "float16"})
"""Dtypes numpy holds itself: cast to and from float64 by numpy, exactly as :func:`decode` and astype do."""


def _widened_by_numpy(tensor: Tensor, raw: np.ndarray) -> bool:
    """Whether numpy's float64 cast of these raw elements is :func:`decode`'s value (a float numpy holds, no neg)."""
    neg = view_bits(tensor.metadata)[1]
    return tensor.dtype in NATIVE_FLOATS and raw.dtype.kind == "f" and not neg


def rounded(values: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values rounded to ``dtype``, as raw elements (bfloat16: its bits, through float32 as torch does)."""
    if dtype == "bfloat16":
        from ckpt_tui.core.values.casting import to_bfloat16

        return to_bfloat16(values)
    return values.astype({"float64": np.float64, "float32": np.float32, "float16": np.float16}[dtype])


def plan_average(
    checkpoints: Sequence[Checkpoint], weights: list[float], at: str | None = None, allow_nan: bool = False
) -> AveragePlan:
    """The averaged tree (nothing read yet: values are computed while it is written; ``allow_nan``: an average
    holding NaN or Inf is written, not refused)."""
    selected = [select(c, at, None, "", "--at") for c in checkpoints]
    trees = [leaves(c.root) for c in selected]
    first = trees[0]
    _check_same_tensors(trees, [c.path for c in checkpoints])
    source = AveragedRecords(checkpoints[0].path, weights, [c.byteorder for c in checkpoints], allow_nan)
    # a training checkpoint averaged whole: its model's tensors are told from the optimizer's
    model_at = inner_state_dict(selected[0].root) or None
    plan = AveragePlan(selected[0].root, weights, model_at=model_at)
    path_of: dict[int, KeyPath] = {}
    for path, value in first.items():
        if isinstance(value, Tensor):
            path_of.setdefault(id(value), path)
        elif _differs(path, trees):
            plan.differing_values.append(key_text(path))
    done: dict[tuple[Any, ...], Tensor] = {}

    def average(tensor: Tensor) -> Tensor | None:
        path = path_of.get(id(tensor))
        if path is None:
            return None
        inputs = [tree[path] for tree in trees]
        if not all(_averageable(t) for t in inputs):
            plan.from_first.append(key_text(path))
            return None
        if is_step_counter(path):
            # an optimizer's float step counts steps: averaged it would disagree with the step kept beside it
            plan.counters.append(key_text(path))
            return None
        if any(t.dtype != tensor.dtype for t in inputs):
            plan.mixed_dtypes.append(key_text(path))
        view = view_key(tensor)
        if view not in done:  # tied weights (one view under two keys) stay one tensor
            make = _averaged_view if any(repeats_far_more(t) for t in inputs) else _averaged_tensor
            if make is _averaged_view:
                _check_same_layout(path, inputs, [c.path for c in checkpoints])
            done[view] = make(tensor, inputs, source, f"avg{len(done)}", key_text(path))
            plan.averaged += 1
            role = tensor_role(path, tensor, model_at)
            role = "model" if role in ("parameter", "buffer", "counter") else role
            plan.roles[role] = plan.roles.get(role, 0) + 1
        return done[view]

    from ckpt_tui.core.edits.tree_edits import map_tensors

    plan.root, _ = map_tensors(plan.root, average)
    return plan


def _averageable(tensor: Tensor) -> bool:
    return tensor.kind == "dense" and tensor.dtype in AVERAGED_DTYPES and tensor.storage is not None


def _averaged_tensor(tensor: Tensor, inputs: list[Tensor], source: AveragedRecords, key: str, name: str) -> Tensor:
    storage = tensor.storage
    assert storage is not None
    numel = tensor.numel
    new = Storage(key, tensor.dtype, storage.location, numel, source, storage.type_name)
    source.add_average(key, inputs, name)
    stride = tuple(math.prod(tensor.shape[k + 1 :]) for k in range(len(tensor.shape)))
    return dataclasses.replace(tensor, storage=new, offset=0, stride=stride, metadata=None, view_start=0)


def _averaged_view(tensor: Tensor, inputs: list[Tensor], source: AveragedRecords, key: str, name: str) -> Tensor:
    """A view that repeats its stored elements (expand, stride 0) stays a view: the storage it reaches is averaged.

    Every input has the same layout, so element for element the storages' spans are the views' values.
    """
    storage, span = tensor.storage, stored_span(tensor)
    assert storage is not None
    flats = []
    for each in inputs:
        low, _ = element_span(each.offset, each.shape, each.stride) or (each.offset, 0)
        flats.append(Tensor(each.storage, low, (span,), (1,), each.dtype, metadata=each.metadata))
    low, _ = element_span(tensor.offset, tensor.shape, tensor.stride) or (tensor.offset, 0)
    new = Storage(key, tensor.dtype, storage.location, span, source, storage.type_name)
    source.add_average(key, flats, name)
    return dataclasses.replace(tensor, storage=new, offset=tensor.offset - low, metadata=None, view_start=0)


def _check_same_layout(path: KeyPath, inputs: list[Tensor], names: list[str]) -> None:
    """A repeating view is averaged over its storage only when every file lays it out alike."""
    for tensor, name in zip(inputs[1:], names[1:], strict=True):
        if not same_layout(inputs[0], tensor):
            raise AverageRefused(
                f"{name}: {key_text(path)} is a view of {counted(inputs[0].numel, 'element')} over "
                f"{stored_span(inputs[0])} stored (expand, stride 0) in one file and laid out differently in another: "
                "averaging it would read every element"
            )


def _check_same_tensors(trees: list[dict[KeyPath, Any]], names: list[str]) -> None:
    """Refuse files whose tensor keys or shapes differ from the first's, naming a few of them."""
    first = trees[0]
    tensors = {p for p, v in first.items() if isinstance(v, Tensor)}
    for tree, name in zip(trees[1:], names[1:], strict=False):
        _check_same_keys(tensors, tree, name)
        shapes = [p for p in first if p in tensors and first[p].shape != tree[p].shape]
        if shapes:
            shown = ", ".join(f"{key_text(p)} {list(first[p].shape)} vs {list(tree[p].shape)}" for p in shapes[:4])
            more = f" (+{len(shapes) - 4} more)" if len(shapes) > 4 else ""
            raise AverageRefused(f"{name}: shapes differ from the first file's: {shown}{more}")
        kinds = [p for p in first if p in tensors and _averageable(first[p]) != _averageable(tree[p])]
        if kinds:
            shown = ", ".join(f"{key_text(p)} {first[p].dtype} vs {tree[p].dtype}" for p in kinds[:4])
            raise AverageRefused(f"{name}: floating-point in one file and not in the other: {shown}")
    _check_same_ties(trees, names)


def _check_same_ties(trees: list[dict[KeyPath, Any]], names: list[str]) -> None:
    """Refuse files that tie different keys: tied weights are averaged as one tensor, which is the mean of each
    key only where every file ties them (else the output would depend on the files' order)."""
    order = {p: n for n, (p, v) in enumerate(trees[0].items()) if isinstance(v, Tensor) and _averageable(v)}
    first = _ties(trees[0], order)
    for tree, name in zip(trees[1:], names[1:], strict=True):
        other = _ties(tree, order)
        for path, tied_to in first.items():
            if other[path] != tied_to:
                one, two = (names[0], name) if tied_to != path else (name, names[0])
                group = tied_to if tied_to != path else other[path]
                raise AverageRefused(
                    f"{key_text(path)} and {key_text(group)} are one tensor (tied weights) in {one} but two in {two}:"
                    " their average differs key by key; save the files with the same keys tied"
                )


def _ties(tree: dict[KeyPath, Any], order: dict[KeyPath, int]) -> dict[KeyPath, KeyPath]:
    """Each averaged key's first key (in the first file's order) that is the same view of the same storage."""
    first_of: dict[tuple[Any, ...], KeyPath] = {}
    ties = {}
    for path in sorted(order, key=order.__getitem__):
        tensor = tree[path]
        ties[path] = first_of.setdefault(view_key(tensor), path)
    return ties


def _check_same_keys(tensors: set[KeyPath], tree: dict[KeyPath, Any], name: str) -> None:
    """Refuse a file whose tensor keys are not the first file's ``tensors``."""
    others = {p for p, v in tree.items() if isinstance(v, Tensor)}
    missing, extra = sorted(tensors - others, key=str), sorted(others - tensors, key=str)
    if not missing and not extra:
        return
    parts = []
    if missing:
        parts.append(f"missing {_listed([key_text(p) for p in missing])}")
    if extra:
        parts.append(f"extra {_listed([key_text(p) for p in extra])}")
    raise AverageRefused(f"{name}: tensor keys differ from the first file's: " + "; ".join(parts))


def _differs(path: KeyPath, trees: list[dict[KeyPath, Any]]) -> bool:
    prints = [Fingerprints() for _ in trees]
    value = prints[0].of(trees[0][path])
    return any(path not in tree or p.of(tree[path]) != value for tree, p in zip(trees[1:], prints[1:], strict=True))


def average(
    paths: Sequence[str],
    output: str,
    weights: str | None = None,
    at: str | None = None,
    fmt: str | None = None,
    *,
    force: bool = False,
    allow_nan: bool = False,
) -> tuple[AveragePlan, WriteResult]:
    """Average the files and write the result, atomically and verified (see the module docstring)."""
    from ckpt_tui.core.readers.open import open_checkpoint
    from ckpt_tui.core.writers.save import save

    if len(paths) < 2:
        raise AverageRefused("average needs at least two files")
    parsed = parse_weights(weights, len(paths))
    checkpoints = [open_checkpoint(p) for p in paths]
    refused = next((reason for c in checkpoints if (reason := c.unwritable())), None)
    if refused:
        raise AverageRefused(refused)
    if any(c.byteorder != "little" for c in checkpoints):
        raise AverageRefused("big-endian checkpoints cannot be averaged (convert them first)")
    plan = plan_average(checkpoints, parsed, at, allow_nan)
    _within_budget(checkpoints, at)
    first = checkpoints[0]
    try:
        result = save(
            plan.root,
            output,
            fmt,
            byteorder=first.byteorder,
            force=force,
            inputs=tuple(path for c in checkpoints for path in c.input_files()),
            metadata=first.metadata,
        )
    except WriteRefused as exc:
        # the writer's way out names convert's options (--extract, --sanitize, --drop): average has --at alone
        raise WriteRefused(f"{exc.bare}: {_way_out(plan)}", exc.bare) from None
    return plan, result


def _within_budget(checkpoints: Sequence[Checkpoint], at: str | None) -> None:
    """Refuse up front, in one line, averaging remote files whose values (under ``at``, all files together: the cap
    is the command's) are past ``--max-download``."""
    from ckpt_tui.core.model.byte_source import is_remote
    from ckpt_tui.core.model.remote import ensure_values_budget
    from ckpt_tui.core.model.tree import iter_tensors

    far = [c for c in checkpoints if is_remote(c.path)]
    if not far:
        return
    names = " and ".join(dict.fromkeys(c.path for c in far))
    tensors = [t for c in far for _, t in iter_tensors(select(c, at, None, "", "--at").root)]
    ensure_values_budget(names, tensors, "average (it reads every tensor)")


def _way_out(plan: AveragePlan) -> str:
    """What average can do about a value it cannot write: average a subtree alone (the model's, when known)."""
    if plan.model_at:
        return f"{join_command(['--at', path_text(plan.model_at)])} averages and writes the model alone"
    return "--at PATH averages and writes that subtree alone (convert --sanitize or --drop first to keep the rest)"
