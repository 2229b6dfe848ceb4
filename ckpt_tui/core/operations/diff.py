"""Diff two checkpoints: keys on one side only, shape/dtype changes, and value differences, streamed."""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ckpt_tui.core.conventions.state_dicts import inner_state_dict
from ckpt_tui.core.conventions.training_state import tensor_role
from ckpt_tui.core.edits import tree_edits as edits
from ckpt_tui.core.errors import CkptError, EditError, ReadStopped
from ckpt_tui.core.model.describe import counted, short_repr
from ckpt_tui.core.model.keypath import Attr, Key, KeyPath, to_python, to_slash
from ckpt_tui.core.model.tree import Checkpoint, Opaque, Tensor, children, get, has_children, hidden_parts, walk
from ckpt_tui.core.values.batched_values import Gathered, PairBatches
from ckpt_tui.core.values.fingerprint import Fingerprints
from ckpt_tui.core.values.nonfinite import SideCounts, side_counts
from ckpt_tui.core.values.stats import BLOCK_ELEMENTS, STATS_THREADS, in_chunk_order, worker_pool
from ckpt_tui.core.values.tensor_values import (
    CHUNK_ELEMENTS,
    COMPLEX_DTYPES,
    as_loaded,
    decode,
    decode_complex,
    paired_chunks,
)

RTOL, ATOL = 1e-5, 1e-8


@dataclass
class TensorDiff:
    """How one common tensor differs."""

    key: str
    max_abs: float
    close: bool
    nan_mismatch: bool = False
    role: str = "parameter"
    """A model ``parameter``, a ``buffer``, a ``counter`` or ``optimizer state`` (reports list them in that order)."""
    sides: SideCounts | None = None
    """The NaN and Inf on each side, for a pair whose NaN or Inf positions differ: what its row says."""


@dataclass
class DiffReport:
    """Everything that differs between A and B."""

    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    shape_changes: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    dtype_changes: list[tuple[str, str, str]] = field(default_factory=list)
    dtype_values: dict[str, str] = field(default_factory=dict)
    """For a dtype change, how the values compare, each side as it loads (``equal as values``, ``max |a-b| 1``):
    a cast that kept every value is told from one that lost some."""
    value_changes: list[TensorDiff] = field(default_factory=list)
    other_changes: list[tuple[str, str, str]] = field(default_factory=list)
    identical_tensors: int = 0
    identical_keys: list[str] = field(default_factory=list)
    """The keys of the tensors bit-for-bit equal (a frozen layer is the answer to "did my freeze work?")."""
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    values_not_compared: str | None = None
    """Why the values of tensors alike in key, shape and dtype were not read (past the download budget)."""
    alignment: Alignment | None = None
    """Where the keys of A and B would match (a subtree, a wrapper prefix stripped), when they mostly do not."""

    @property
    def identical(self) -> bool:
        """Nothing at all differs."""
        return not (
            self.only_a
            or self.only_b
            or self.shape_changes
            or self.dtype_changes
            or self.value_changes
            or self.other_changes
            or self.unreadable
            or self.values_not_compared
        )

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "identical": self.identical,
            "identical_tensors": self.identical_tensors,
            "identical_keys": self.identical_keys,
            "only_in_a": self.only_a,
            "only_in_b": self.only_b,
            "shape_changes": [{"key": k, "a": list(a), "b": list(b)} for k, a, b in self.shape_changes],
            "dtype_changes": [
                {"key": k, "a": a, "b": b, "values": self.dtype_values.get(k)} for k, a, b in self.dtype_changes
            ],
            "value_changes": [
                {
                    "key": d.key,
                    "max_abs_diff": d.max_abs,
                    "allclose": d.close,
                    "nan_mismatch": d.nan_mismatch,
                    "nonfinite_sides": d.sides.to_json() if d.sides is not None else None,
                    "role": d.role,
                }
                for d in self.value_changes
            ],
            "other_changes": [{"key": k, "a": a, "b": b} for k, a, b in self.other_changes],
            "unreadable": [{"key": k, "error": e} for k, e in self.unreadable],
            "values_not_compared": self.values_not_compared,
            "alignment": None if self.alignment is None else self.alignment.to_json(),
        }


@dataclass(frozen=True)
class Side:
    """How to take one side of a diff: the subtree at ``at`` (``--at-a``), ``strip`` removed (``--strip-prefix-a``)."""

    at: KeyPath = ()
    strip: str = ""

    def options(self, side: str) -> list[str]:
        """``--at-a model_state_dict --strip-prefix-a module.`` (unquoted)."""
        from ckpt_tui.core.operations.convert import path_text

        out = [f"--at-{side}", path_text(self.at)] if self.at else []
        return out + ([f"--strip-prefix-{side}", self.strip] if self.strip else [])

    def words(self) -> str:
        """``under ckpt["model_state_dict"] with 'module.' stripped``."""
        parts = [f"under {to_python(self.at)}"] if self.at else []
        return " ".join(parts + ([f"with {self.strip!r} stripped"] if self.strip else []))

    def take(self, root: Any) -> Any:
        """The tree taken this way (what ``--at-a`` and ``--strip-prefix-a`` make of it)."""
        return _taken(root, self)

    def source_path(self, root: Any, path: KeyPath) -> KeyPath:
        """Where ``path``, a path of the tree taken this way from ``root``, lies in ``root``: under ``at``,
        its first key with the stripped prefix put back (a pickled module's dotted keys through its submodules)."""
        if not path:
            return self.at
        first, rest = path[0], path[1:]
        if self.strip and isinstance(first, str):
            first = self.strip + first
        value = get(root, self.at)
        if isinstance(value, Opaque) and value.is_module and isinstance(first, str):
            return (*self.at, *(Attr(part) for part in first.split(".")), *rest)
        return (*self.at, first, *rest)


@dataclass(frozen=True)
class Alignment:
    """The sides that make A's and B's keys match: ``matched`` tensor keys in common, of ``total`` (the
    smaller side's), against ``before`` as they are."""

    a: Side
    b: Side
    matched: int
    total: int
    before: int

    def options(self) -> list[str]:
        """The ``diff`` options that compare this way."""
        return self.a.options("a") + self.b.options("b")

    def describe(self) -> str:
        """``keys match under ckpt["model_state_dict"] of B with 'module.' stripped (92 of 92; 0 as they are)``."""
        sides = [f"{side.words()} in {name}" for side, name in ((self.a, "A"), (self.b, "B")) if side.words()]
        return (
            f"the keys match {' and '.join(sides)}: {self.matched} of {counted(self.total, 'tensor')} "
            f"that way, {self.before} as they are"
        )

    def apply(self, a: Any, b: Any) -> tuple[Any, Any]:
        """Both trees taken this way (what ``--at-a/-b`` and ``--strip-prefix-a/-b`` do)."""
        return _taken(a, self.a), _taken(b, self.b)

    def to_json(self) -> dict[str, Any]:
        """``{"options": [...], "matched", "total", "before", "message"}``."""
        return {
            "options": self.options(),
            "matched": self.matched,
            "total": self.total,
            "before": self.before,
            "message": self.describe(),
        }


ALIGN_AT_LEAST = 0.5
"""An alignment is offered when it matches at least this share of the smaller side's tensors, and more than now."""


def alignment(a: Any, b: Any) -> Alignment | None:
    """Where A's and B's tensor keys match best, trying each side's state_dicts (the root, an inner
    ``model_state_dict``, a pickled module) with and without its wrapper prefix; None when that does no
    better than the trees as they are, or matches less than :data:`ALIGN_AT_LEAST` of the smaller side."""
    sides_a, sides_b = _sides(a), _sides(b)
    if not sides_a or not sides_b:
        return None
    now = len(_tensor_keys(a) & _tensor_keys(b))
    best: tuple[int, int, Side, Side] | None = None
    for side_a, keys_a in sides_a:
        for side_b, keys_b in sides_b:
            common = len(keys_a & keys_b)
            # ties go to the fewest options: the first candidates are the roots as they are
            if best is None or common > best[0]:
                best = (common, min(len(keys_a), len(keys_b)), side_a, side_b)
    assert best is not None
    common, total, side_a, side_b = best
    if common <= now or common < ALIGN_AT_LEAST * total or (side_a == Side() and side_b == Side()):
        return None
    return Alignment(side_a, side_b, common, total, now)


def _sides(root: Any) -> list[tuple[Side, set[str]]]:
    """Each state_dict of a tree, as it is and with its wrapper prefix stripped, with its tensor keys."""
    from ckpt_tui.core.conventions.layouts import wrapper_prefix
    from ckpt_tui.core.conventions.state_dicts import state_dicts, tensor_items

    out: list[tuple[Side, set[str]]] = []
    for path, value in state_dicts(root):
        keys = {k for k, v in tensor_items(value) or [] if isinstance(v, Tensor)}
        if not keys:
            continue
        out.append((Side(path), keys))
        prefix = wrapper_prefix(keys)
        if prefix:
            out.append((Side(path, prefix), {k[len(prefix) :] for k in keys}))
    return out


def _tensor_keys(root: Any) -> set[str]:
    return {key_text(path) for path, value in compared_leaves(root).items() if isinstance(value, Tensor)}


def _taken(root: Any, side: Side) -> Any:
    if side.at or (isinstance(root, Opaque) and root.is_module):
        root = edits.extract(root, side.at)[0]
    return edits.strip_prefix(root, side.strip)[0] if side.strip else root


def leaves(root: Any) -> dict[KeyPath, Any]:
    """Every leaf (tensor or plain value) by its structured path (``{"a/b": x}`` is not ``{"a": {"b": x}}``).

    Objects are leaves compared whole, by content (:mod:`~ckpt_tui.core.values.fingerprint`): sets (their
    order is not data), numpy arrays and scalars, and every other opaque object but a module (whose
    tensors are compared one by one). A container reached again (a shared list) is a leaf there, so
    the walk stays linear in the file however much it shares.
    """
    if _is_leaf(root):  # a file holding one tensor or one value
        return {(): root}
    out: dict[KeyPath, Any] = {}
    expanded: set[int] = {id(root)}
    stack: list[tuple[KeyPath, Iterator[tuple[Key, Any]]]] = [((), children(root))]
    while stack:  # depth first, each container's children in order
        path, kids = stack[-1]
        for key, kid in kids:
            where = (*path, key)
            if type(kid) is Tensor or _is_leaf(kid) or id(kid) in expanded:
                out[where] = kid
                if type(kid) is Tensor and id(kid) not in expanded:
                    expanded.add(id(kid))
                    out.update(_attached_tensors(kid, where))
                continue
            expanded.add(id(kid))
            stack.append((where, children(kid)))
            break
        else:
            stack.pop()
    return out


def _attached_tensors(tensor: Tensor, path: KeyPath) -> Iterator[tuple[KeyPath, Tensor]]:
    """The tensors a tensor carries (its attributes, a Parameter's state, hooks), which torch.load builds with
    it: compared as leaves of their own, so two files whose tensors differ only there are not identical."""
    if next(hidden_parts(tensor), None) is None:
        return
    for where, value, shown, first in walk(tensor, path):
        if first and not shown and type(value) is Tensor:
            yield where, value


def key_paths(root: Any) -> dict[str, KeyPath]:
    """The path of each key a diff of ``root`` names (:func:`key_text` of its compared leaves), to find it."""
    return {key_text(path): path for path in compared_leaves(root)}


def compared_leaves(root: Any) -> dict[KeyPath, Any]:
    """:func:`leaves`, with each sparse or quantized tensor split into its parts (indices, values,
    size; integer values and quantizer), which are compared as ordinary values; a NaN key as a
    :class:`NanKey`, so that it matches the same key of the other side."""
    out: dict[KeyPath, Any] = {}
    nan_keys = _NanKeys()
    for path, value in leaves(root).items():
        path = nan_keys.matchable(path)
        parts = value.parts() if isinstance(value, Tensor) else None
        if parts is None:
            out[path] = value
        else:
            out.update(((*path, Attr(name)), part) for name, part in parts)
    return out


class NanKey(float):
    """A float NaN dict key as diff matches it: NaN equals nothing, not even itself (torch's dict keeps two NaN
    keys apart by identity), so two keys are the same key when they have the same bits and the same place
    among the NaN keys of those bits in their dict's order. Shown as the float it is."""

    bits: bytes
    ordinal: int

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NanKey) and (self.bits, self.ordinal) == (other.bits, other.ordinal)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash((NanKey, self.bits, self.ordinal))


class _NanKeys:
    """Paths with their NaN keys made :class:`NanKey` (each key object one ordinal, counted per dict and bits)."""

    def __init__(self) -> None:
        self.ordinals: dict[tuple[KeyPath, bytes], dict[int, int]] = {}

    def matchable(self, path: KeyPath) -> KeyPath:
        if all(type(key) is not float or key == key for key in path):
            return path
        out: list[Any] = []
        for key in path:
            if type(key) is float and key != key:
                bits = struct.pack("<d", key)
                seen = self.ordinals.setdefault((tuple(out), bits), {})
                made = NanKey(key)
                made.bits, made.ordinal = bits, seen.setdefault(id(key), len(seen))
                key = made
            out.append(key)
        return tuple(out)


def _is_leaf(value: Any) -> bool:
    if isinstance(value, (Tensor, set, frozenset)) or not has_children(value):
        return True
    return isinstance(value, Opaque) and not value.is_module


def key_text(path: KeyPath) -> str:
    """``a/b/c`` when that names one path unambiguously (str keys without ``/``); else ``ckpt["a/b"][1]``."""
    if not path:
        return "(root)"
    if all(type(key) is str and key and "/" not in key for key in path):
        return to_slash(path)
    return to_python(path)


def one_notation(keys: list[str]) -> dict[str, str]:
    """The keys of one list as shown (each mapped to the key it stands for), in one notation: the ``/`` form
    (``model/fc.weight``) when every key has one, else each as Python (``ckpt["model"]["fc.weight"]``)."""
    # a key is given as Python only where the / form cannot name it (an int key, a / inside a key); a plain
    # key that itself starts with ckpt[ is taken for one such, and shown as it is
    if not any(key.startswith("ckpt[") for key in keys):
        return {key: key for key in keys}
    return {(key if key.startswith("ckpt[") else to_python(tuple(key.split("/")))): key for key in keys}


def normalized(checkpoint: Checkpoint, strip_prefix: str | None) -> Any:
    """The tree with ``strip_prefix`` removed from its state_dict's keys, when present."""
    if not strip_prefix:
        return checkpoint.root
    try:
        return edits.strip_prefix(checkpoint.root, strip_prefix)[0]
    except EditError:
        return checkpoint.root


def diff(
    a: Checkpoint,
    b: Checkpoint,
    strip_prefix: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    values_refused: str | None = None,
) -> DiffReport:
    """Compare two checkpoints key by key, then common tensors value by value, a chunk at a time.

    ``values_refused``: why values may not be read (a remote file past the download budget); keys,
    shapes and dtypes are still compared, and the report says why values were not."""
    root_a = normalized(a, strip_prefix)
    left, right = compared_leaves(root_a), compared_leaves(normalized(b, strip_prefix))
    report = DiffReport(
        only_a=[key_text(k) for k in left if k not in right],
        only_b=[key_text(k) for k in right if k not in left],
    )
    common_pairs = [(path, left[path], right[path]) for path in left if path in right]
    pairs = [(x, y) for _, x, y in common_pairs]
    compared = _alike_pairs(pairs)
    if values_refused is not None and compared:
        report.values_not_compared = f"{counted(len(compared), 'tensor')} alike in shape and dtype: {values_refused}"
        compared = []
    # key by key; the values of the pairs alike in shape and dtype read in batches, and those of the pairs
    # that differ only in dtype (a cast: were the values kept?) in batches of their own
    casts = [(x, y) for x, y in pairs if isinstance(x, Tensor) and isinstance(y, Tensor) and _cast(x, y)]
    values = _Values(a.byteorder, b.byteorder, compared)
    cast_values = _Values(a.byteorder, b.byteorder, casts if values_refused is None else [])
    kinds = records_parameters(a) and records_parameters(b)
    _diff_common(common_pairs, (values, cast_values), report, progress, inner_state_dict(root_a), kinds)
    if report.only_a and report.only_b:
        report.alignment = alignment(a.root, b.root)
    return report


def _diff_common(
    common: list[tuple[KeyPath, Any, Any]],
    compared: tuple[_Values, _Values],
    report: DiffReport,
    progress: Callable[[int, int], None] | None,
    model_at: KeyPath | None = None,
    kinds: bool = True,
) -> None:
    """Record how each key both sides hold differs: tensors by metadata then values, anything else by its
    fingerprint (``compared``: the values of the pairs alike in shape and dtype, then of the casts; ``model_at``:
    where the model's weights are, for each tensor's role; ``kinds``: whether Parameter and requires_grad are
    compared, False when one side's files cannot record them)."""
    values, cast_values = compared
    prints_a, prints_b = Fingerprints(), Fingerprints()
    for index, (path, x, y) in enumerate(common):
        if progress is not None:
            progress(index, len(common))
        if isinstance(x, Tensor) and isinstance(y, Tensor):
            if _diff_tensors(path, x, y, report, kinds) and report.values_not_compared is None:
                before = len(report.value_changes)
                _record(path, values.next(x, y), report, tensor_role(path, x, model_at))
                if len(report.value_changes) > before and report.value_changes[-1].nan_mismatch:
                    # (a second read, for the few pairs whose NaN differ: which side holds them, how many)
                    report.value_changes[-1].sides = side_counts(x, y, *values.orders)
            elif _cast(x, y) and report.values_not_compared is None:
                report.dtype_values[key_text(path)] = _cast_values(cast_values.next(x, y))
        elif isinstance(x, Tensor) or isinstance(y, Tensor) or prints_a.of(x) != prints_b.of(y):
            report.other_changes.append((key_text(path), _short(x), _short(y)))


def _alike_pairs(pairs: list[tuple[Any, Any]]) -> list[tuple[Tensor, Tensor]]:
    """The pairs of tensors alike in shape and dtype, whose values are compared, in order."""
    return [
        (x, y)
        for x, y in pairs
        if isinstance(x, Tensor) and isinstance(y, Tensor) and x.shape == y.shape and x.dtype == y.dtype
    ]


class _Values:
    """The value comparisons of the tensor pairs alike in shape and dtype, read in batches ahead of their
    turn; :meth:`next` answers them in order."""

    def __init__(self, order_a: str, order_b: str, compared: list[tuple[Tensor, Tensor]]) -> None:
        self.orders = (order_a, order_b)
        self.batches: PairBatches[_Compared] = PairBatches(compared, self.orders)
        self.measure = functools.partial(_compare_batch, order_a == order_b)
        self.answered: dict[int, _Compared] = {}
        self.position = 0

    def next(self, x: Tensor, y: Tensor) -> _Compared:
        """How the next compared pair's values compare (a batch is read when its turn comes)."""
        position = self.position
        self.position += 1
        if position >= self.batches.upcoming:
            self.answered.update(self.batches.read_until(position, self.measure))
        if position in self.answered:
            return self.answered.pop(position)
        return _compared(x, y, *self.orders)


CAST_DTYPES = frozenset(
    {"float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"}
)
"""Dtypes whose values compare across a cast (decoded to float64 exactly but for int64 past 2**53)."""


def _cast(x: Tensor, y: Tensor) -> bool:
    """Whether a pair differs only in dtype (both dense, one shape, dtypes that decode to comparable values)."""
    return (
        x.shape == y.shape
        and x.dtype != y.dtype
        and x.kind == y.kind == "dense"
        and x.dtype in CAST_DTYPES
        and y.dtype in CAST_DTYPES
    )


def _cast_values(result: _Compared) -> str:
    """How a cast pair's values compare, in words."""
    if isinstance(result, str):
        return f"values not read: {result}"
    if result is None:
        return "equal as values"
    max_abs, _, nan_mismatch = result
    if nan_mismatch:
        return "NaN/Inf positions differ"
    return "equal as values" if max_abs == 0 else f"values differ: max |a-b| {max_abs:.6g}"


def _short(value: Any) -> str:
    return short_repr(value)


def _kind(tensor: Tensor) -> str:
    name = "Parameter" if tensor.parameter else "Tensor"
    return f"{name}(requires_grad={tensor.requires_grad})"


BARE_TENSOR_FORMATS = frozenset({"safetensors", "dcp-hf"})
"""Formats whose files hold bare tensors: no Parameter, no requires_grad (every tensor reads back as a plain one)."""


def records_parameters(checkpoint: Checkpoint) -> bool:
    """Whether a checkpoint's files can record Parameter and requires_grad (a pickle can; a safetensors file, or
    a shard set of them, cannot)."""
    if checkpoint.format in BARE_TENSOR_FORMATS:
        return False
    shards = checkpoint.read_files
    return not (checkpoint.format == "sharded" and shards and all(f.endswith(".safetensors") for f in shards))


def _diff_tensors(path: KeyPath, x: Tensor, y: Tensor, report: DiffReport, kinds: bool = True) -> bool:
    """Record how two tensors differ but for their values; whether their values are to be compared (``kinds``:
    whether Parameter and requires_grad count)."""
    # a side that cannot record them reads every tensor back as a plain one: that is no difference
    same_kind = not kinds or (x.parameter, x.requires_grad) == (y.parameter, y.requires_grad)
    same_meta = x.device == y.device and same_kind
    if same_meta and x.kind == y.kind and x.shape == y.shape and x.dtype == y.dtype:
        return True  # the usual case, with nothing to record
    key = key_text(path)
    if x.device != y.device:
        report.other_changes.append((key, f"saved on {x.device}", f"saved on {y.device}"))
    if not same_kind:
        report.other_changes.append((key, _kind(x), _kind(y)))
    if x.kind != y.kind:
        report.other_changes.append((key, x.kind, y.kind))
    if x.shape != y.shape:
        report.shape_changes.append((key, x.shape, y.shape))
        return False
    if x.dtype != y.dtype:
        report.dtype_changes.append((key, x.dtype, y.dtype))
        return False
    return True


_Compared = tuple[float, bool, bool] | str | None
"""How two tensors' values compare: None (bit-identical), (max |a-b|, allclose, NaN/Inf positions differ), or
why they could not be read."""


def _compared(x: Tensor, y: Tensor, order_a: str, order_b: str) -> _Compared:
    try:
        with np.errstate(all="ignore"):
            return _compare_values(x, y, order_a, order_b)
    except ReadStopped:
        raise  # (the whole diff: its values would come from another file than its tree)
    except CkptError as exc:
        return str(exc)


def nonfinite_positions_differ(x: Tensor, y: Tensor, order_a: str, order_b: str) -> bool:
    """Whether a pair's NaN or Inf are not the same on both sides (a value became NaN or Inf, +Inf against -Inf),
    as ``diff`` tells it; True where a side cannot be read (never taken for "unchanged")."""
    result = _compared(x, y, order_a, order_b)
    return isinstance(result, str) or (result is not None and result[2])


def _record(path: KeyPath, result: _Compared, report: DiffReport, role: str) -> None:
    if result is None:
        report.identical_tensors += 1
        report.identical_keys.append(key_text(path))
    elif isinstance(result, str):
        report.unreadable.append((key_text(path), result))
    else:
        max_abs, close, nan_mismatch = result
        report.value_changes.append(TensorDiff(key_text(path), max_abs, close, nan_mismatch, role))


def _compare_batch(same_order: bool, dtype: str, dtype_b: str, a: Gathered, b: Gathered) -> dict[int, _Compared]:
    """:func:`_compare_values` over a batch of pairs (same dtype, same element counts): the pairs it answers.

    Pairs whose bits differ and that hold a NaN or an Inf (or whose difference overflows) are left out.
    """
    if dtype != dtype_b:
        return _differences(dtype, a, b, dtype_b) if {dtype, dtype_b} <= CAST_DTYPES else {}
    starts = a.bounds[:-1]
    if same_order:
        bits = np.dtype(f"u{a.values.dtype.itemsize}")
        same = np.add.reduceat(a.values.view(bits) != b.values.view(bits), starts) == 0
    else:  # read in different byte orders, values are compared even when equal (as the per-pair path does)
        same = np.zeros(starts.size, np.bool_)
    found: dict[int, _Compared] = dict.fromkeys(a.answered[same].tolist())
    differ = a.answered[~same]
    if differ.size:
        found.update(_differences(dtype, a.select(differ), b.select(differ)))
    return found


def _differences(dtype: str, a: Gathered, b: Gathered, dtype_b: str | None = None) -> dict[int, _Compared]:
    """(max |a-b|, allclose, False) of each pair whose values are all finite (and differences too); ``dtype_b``:
    B's dtype where it differs (a cast, both decoded to float64)."""
    starts = a.bounds[:-1]
    with np.errstate(all="ignore"):
        # (complex: both parts, so |a-b| is the modulus of the difference, not of the magnitudes)
        decoding = decode_complex if dtype in COMPLEX_DTYPES else decode
        va, vb = decoding(a.values, dtype), decoding(b.values, dtype_b or dtype)
        delta = np.abs(va - vb)
        wide = np.abs(vb)
        usable = np.isfinite(np.add.reduceat(delta, starts)) & np.isfinite(np.add.reduceat(wide, starts))
        max_abs = np.maximum.reduceat(delta, starts)
        close = np.add.reduceat(~(delta <= ATOL + RTOL * wide), starts) == 0
    rows = zip(a.answered.tolist(), usable.tolist(), max_abs.tolist(), close.tolist(), strict=True)
    return {index: (largest, near, False) for index, ok, largest, near in rows if ok}


def _compare_values(x: Tensor, y: Tensor, order_a: str, order_b: str) -> tuple[float, bool, bool] | None:
    """None when the values are bit-identical; else (max |a-b|, allclose, NaN/Inf positions differ). A big pair's
    chunks are compared on the statistics threads while the next are read, and the answers joined in order."""
    # a neg or conj view bit: the values torch loads are compared (the same bytes may load as other values)
    views = bool(x.metadata or y.metadata)
    # (bits compare only in one byte order and one dtype: a cast pair's equal bits are other values, an int32
    # 1065353216 and a float32 1.0; else values are compared even when equal, and nothing is "same")
    bitwise = (order_a == order_b or views) and x.dtype == y.dtype
    found = _ChunkComparison()
    pool = worker_pool() if x.numel > CHUNK_ELEMENTS else None
    # reading chunk k reuses the buffers of chunk k - STATS_THREADS - 1, settled by then
    reuse = STATS_THREADS + 1 if pool is not None else 0
    pairs = ((a, b, x, y, views, bitwise) for a, b, _ in paired_chunks(x, y, order_a, order_b, reuse))
    in_chunk_order(pairs, _chunk_compared, found.add, pool, None, "cancelled")  # a repeated element counts once
    if found.same:
        return None
    return found.max_abs, found.close, found.nan_mismatch


@dataclass
class _ChunkComparison:
    """What the chunks of a pair compared so far say."""

    max_abs: float = 0.0
    close: bool = True
    nan_mismatch: bool = False
    same: bool = True

    def add(self, chunk: tuple[float, bool, bool, bool]) -> None:
        """Join one chunk's answer (in chunk order)."""
        max_abs, close, nan_mismatch, same = chunk
        self.max_abs, self.close = max(self.max_abs, max_abs), self.close and close
        self.nan_mismatch, self.same = self.nan_mismatch or nan_mismatch, self.same and same


def _chunk_compared(
    stored_a: np.ndarray, stored_b: np.ndarray, x: Tensor, y: Tensor, views: bool, bitwise: bool
) -> tuple[float, bool, bool, bool]:
    """One chunk of a pair: (max |a-b| over positions finite in both and in their difference, allclose, NaN
    positions differ, bit-identical), compared block by block while the values are in the cache."""
    raw_a, raw_b = stored_a, stored_b
    if views:
        raw_a, raw_b = as_loaded(raw_a, x.dtype, x.metadata), as_loaded(raw_b, y.dtype, y.metadata)
    if bitwise and _bits_equal(raw_a, raw_b):
        return 0.0, True, False, True
    max_abs, close, nan_mismatch = 0.0, True, False
    with np.errstate(all="ignore"):  # (numpy's error state is per thread)
        for begin in range(0, raw_a.size, BLOCK_ELEMENTS):
            block = slice(begin, begin + BLOCK_ELEMENTS)
            if x.dtype in COMPLEX_DTYPES:
                # both parts: |a-b| and |b| are complex moduli, as torch.allclose takes them
                va = decode_complex(stored_a[block], x.dtype, x.metadata)
                vb = decode_complex(stored_b[block], y.dtype, y.metadata)
            elif views:
                va, vb = decode(raw_a[block], x.dtype), decode(raw_b[block], y.dtype)
            else:
                va, vb = decode(raw_a[block], x.dtype, x.metadata), decode(raw_b[block], y.dtype, y.metadata)
            largest, near, nan_differ = _block_compared(va, vb, close)
            max_abs, close, nan_mismatch = max(max_abs, largest), close and near, nan_mismatch or nan_differ
    return max_abs, close, nan_mismatch, False


def _bits_equal(raw_a: np.ndarray, raw_b: np.ndarray) -> bool:
    """Whether two chunks hold the same bytes (no copy of either)."""
    if raw_a.nbytes != raw_b.nbytes:
        return False
    return bool(np.array_equal(np.ascontiguousarray(raw_a).view(np.uint8), np.ascontiguousarray(raw_b).view(np.uint8)))


def _block_compared(va: np.ndarray, vb: np.ndarray, still_close: bool) -> tuple[float, bool, bool]:
    """(max |a-b| over positions finite in both, allclose, NaN/Inf positions differ) of one block of values;
    ``still_close``: whether allclose is still to be decided (else it is not taken again).

    A NaN or an Inf agrees only with itself at the same position (a NaN with a NaN, +Inf with +Inf): anywhere
    else it is a difference no |a-b| measures (a value that became Inf, +Inf against -Inf), and the pair is not
    close, as torch.isclose has it (an error that is not finite is never within the tolerance)."""
    delta = np.abs(va - vb)
    top = float(delta.max()) if delta.size else 0.0
    if math.isfinite(top):
        # no NaN and no Inf on either side, nor in a difference: every position counts
        return top, not still_close or bool(np.all(delta <= ATOL + RTOL * np.abs(vb))), False
    finite = np.isfinite(va) & np.isfinite(vb)
    agree = (va == vb) | (np.isnan(va) & np.isnan(vb))
    mismatch = bool((~finite & ~agree).any())
    delta = np.abs(va[finite] - vb[finite])
    counted_delta = delta[np.isfinite(delta)]
    largest = float(counted_delta.max()) if counted_delta.size else 0.0
    close = not mismatch and bool(np.all(delta <= ATOL + RTOL * np.abs(vb[finite])))
    return largest, close, mismatch
