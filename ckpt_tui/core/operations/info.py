"""Counts and totals of a checkpoint: what ``info`` prints and the TUI's header shows.

The tree is walked once (:func:`~ckpt_tui.core.model.tree.walk`): each object is expanded at its first
reference only, so the time is linear in the file however much it shares. Every shown reference to a
tensor is listed (the same object under two keys is two rows; ``aliases`` counts the other references
of a listed object); elements, devices and dtypes count each tensor object once.
"""

from __future__ import annotations

import itertools
import math
import operator
import os
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ckpt_tui.core.conventions.findings import (
    Finding,
    device_counts,
    flat_findings,
    merge_rank_repeats,
    walked_findings,
    where,
)
from ckpt_tui.core.conventions.state_dicts import (
    BUFFER_NAMES,
    PARAMETER_DTYPES,
    flat_optimizer_state,
    inner_state_dict,
    is_flat_optimizer,
    is_optimizer,
    is_scheduler,
    module_groups,
    root_model,
    root_model_keys,
    tensor_items,
    unflattened_optimizer,
)
from ckpt_tui.core.model.describe import Totals, count, counted, plural
from ckpt_tui.core.model.dtypes import DTYPES, itemsize
from ckpt_tui.core.model.keypath import KeyPath, file_path_json, to_json
from ckpt_tui.core.model.tree import (
    Checkpoint,
    FlatColumns,
    Opaque,
    Reference,
    Storage,
    Tensor,
    get,
    iter_tensors,
    view_key,
    walk,
)
from ckpt_tui.core.runtime.safe_text import printable

if TYPE_CHECKING:
    from ckpt_tui.core.operations.hints import ComparedModel

BUFFER_SUFFIXES = tuple("." + name for name in sorted(BUFFER_NAMES))


@dataclass
class ModelCounts:
    """Elements in the model's state_dict, split into parameters and buffers, and in optimizer state."""

    path: KeyPath | None = None
    parameters: int = 0
    buffers: int = 0
    optimizer_state: int = 0
    flat_copies: int = 0
    """Elements of FSDP's flattened parameters saved beside the parameters themselves (the same values)."""
    others: list[tuple[str, int, int]] = field(default_factory=list)
    """The save's other models (Accelerate's ``model_1``...), beside the one at ``path``: root key, parameters,
    buffers."""

    def models(self) -> list[tuple[str | None, int, int]]:
        """Every model counted: its root key (None for a lone model: "the model"), parameters, buffers."""
        if not self.others:
            return [(None, self.parameters, self.buffers)]
        first = str(self.path[0]) if self.path else None
        return [(first, self.parameters, self.buffers), *self.others]


@dataclass
class Summary:
    """Totals over every tensor in a checkpoint, and its findings."""

    checkpoint: Checkpoint
    tensors: Sequence[tuple[KeyPath, Tensor]] = field(repr=False)
    parameter_count: int
    tensor_bytes: int
    devices: Counter[str]
    dtypes: Counter[str]
    bytes_by_dtype: Counter[str]
    findings: list[Finding] = field(default_factory=list)
    aliases: dict[int, int] = field(default_factory=dict)
    """Other references to a listed tensor object, by ``id`` of the tensor (absent: none)."""
    model: ModelCounts = field(default_factory=ModelCounts)
    _shard_prefixes: dict[int, str] = field(default_factory=dict, repr=False)
    from_columns: bool = field(default=False, repr=False)
    """Summed up from the reader's :class:`FlatColumns` (their promises hold for every row)."""
    _distinct_elements: int | None = field(default=None, repr=False)

    @property
    def shown_findings(self) -> list[Finding]:
        """The findings the text faces show: one per fact (a restatement kept for JSON readers left out)."""
        return [finding for finding in self.findings if not finding.restates]

    def storage_id(self, storage: Storage | None) -> str | None:
        """A stable name for a storage: its record key (with the shard file when sharded)."""
        if storage is None:
            return None
        return self._prefix(storage.source) + storage.key

    def _prefix(self, source: Any) -> str:
        """What a storage id starts with: the shard file's name for a source other than the checkpoint's file."""
        prefix = self._shard_prefixes.get(id(source))
        if prefix is None:
            path = str(getattr(source, "path", "") or "")
            own = not path or os.path.abspath(path) == os.path.abspath(self.checkpoint.path)
            prefix = self._shard_prefixes[id(source)] = "" if own else os.path.basename(path) + ":"
        return prefix

    def totals(self) -> Totals:
        """Distinct tensors, their elements and bytes: what :func:`~ckpt_tui.core.model.describe.totals` finds
        below the root (the tensors reached through shown children, each object once), without a walk."""
        distinct = len(self.tensors) - sum(self.aliases.values())
        return Totals(distinct, self.parameter_count, sum(self.bytes_by_dtype.values()))

    def tensors_text(self, noun: bool = True) -> str:
        """``10 tensors`` (``10`` without ``noun``), each counted once; the other names of the same tensors
        said apart (``10 tensors (+8 names for the same tensors)``: an LSTM's ``_flat_weights``, tied weights)."""
        aliases = sum(self.aliases.values())
        distinct = len(self.tensors) - aliases
        text = counted(distinct, "tensor") if noun else str(distinct)
        return text + (f" (+{counted(aliases, 'name')} for the same tensors)" if aliases else "")

    def distinct_elements(self) -> int:
        """Elements of every tensor, each view of a storage once (tied weights count once)."""
        if self.from_columns:  # each tensor over its own storage
            return self.parameter_count
        # kept: the browser's header asks again for each width it tries
        if self._distinct_elements is None:
            self._distinct_elements = sum({view_key(t): t.numel for _, t in self.tensors}.values())
        return self._distinct_elements

    def unread_values(self, reader: str) -> str | None:
        """What a listing leaves unknown: the values (a file full of NaN lists like a clean one), said after the
        word "values" by both faces with ``reader``, the face's way to read them (``ckpt-tui check``, the
        browser's ``C``); None where the tree holds no tensor."""
        if not self.tensors:
            return None
        return f"not read yet: {reader} reads every tensor (NaN/Inf, broken records)"

    def counts_text(self) -> str:
        """The element counts in words: ``276 params (model) + 17 in buffers + 552 optimizer state``.

        Without a model state_dict in the file, the sum over every tensor: ``851 elements (all tensors)``.
        """
        model = self.model
        if model.path is None:
            elements = self.distinct_elements()
            return f"{count(elements)} {plural(elements, 'element')} (all tensors)"
        parts = []
        for key, parameters, buffers in model.models():
            # (several models: each named by its key, ``8 params (model_1) + 4 in buffers (model_1)``)
            parts.append(f"{count(parameters)} {plural(parameters, 'param')} ({key or 'model'})")
            if buffers:
                parts.append(f"{count(buffers)} in buffers" + (f" ({key})" if key else ""))
        if model.flat_copies:
            parts.append(f"{count(model.flat_copies)} in FSDP's flat copies of the params")
        if model.optimizer_state:
            parts.append(f"{count(model.optimizer_state)} optimizer state")
        weights = sum(parameters + buffers for _, parameters, buffers in model.models())
        rest = self.distinct_elements() - weights - model.flat_copies - model.optimizer_state
        if rest > 0:
            parts.append(f"{count(rest)} other")
        return " + ".join(parts)

    def to_json(self, rows: bool = True) -> dict[str, Any]:
        """The ``info --json`` object (a documented contract: extend, never break); ``rows=False``: without
        its last key, ``tensors`` (a caller that renders them with :meth:`rows_json`)."""
        ckpt = self.checkpoint
        model = self.model
        return {
            **file_path_json(ckpt.path),
            "format": ckpt.format,
            "layout": ckpt.layout,
            "file_bytes": ckpt.file_bytes,
            "tensor_count": len(self.tensors),
            "parameter_count": self.parameter_count,
            "model_path": to_json(model.path) if model.path is not None else None,
            "model_parameter_count": model.parameters,
            "model_buffer_count": model.buffers,
            "optimizer_state_count": model.optimizer_state,
            "flat_parameter_copy_count": model.flat_copies,
            "models": [
                {"path": to_json((key,) if key is not None else model.path), "parameter_count": p, "buffer_count": b}
                for key, p, b in model.models()
            ]
            if model.path is not None
            else [],
            "tensor_bytes": self.tensor_bytes,
            "devices": dict(self.devices),
            "dtypes": dict(self.dtypes),
            "bytes_by_dtype": dict(self.bytes_by_dtype),
            "metadata": {str(k): str(v) for k, v in ckpt.metadata.items()},
            "index_metadata": {str(k): str(v) for k, v in ckpt.index_metadata.items()},
            "notes": ckpt.notes,
            "findings": [f.to_json() for f in self.findings],
            **({"tensors": self._flat_rows() if self.from_columns else self._walked_rows()} if rows else {}),
        }

    def rows_json(self) -> bytes | None:
        """``to_json()["tensors"]`` of a root given as columns, rendered as one ASCII JSON array (what
        ``json.dumps`` writes for it), without a dict or a format per row: one text per distinct layout,
        then every row's pieces (name, layout, storage, row end) laid into one list and joined once;
        None for walked rows. A test holds its parse equal to :meth:`_flat_rows`."""
        # A JSON string as ``json.dumps`` writes it (ASCII, escapes as the standard encoder's); the C function
        # itself, mapped over 50,000 names without a Python call each (imported here: text output needs no json)
        from json.encoder import encode_basestring_ascii as _text

        columns = self.checkpoint.flat_columns() if self.from_columns else None
        if columns is None:
            return None
        if not len(columns):
            return b"[]"
        if not _all_unicode(columns.names):
            return None  # (a key with lone surrogates is a {"repr": ...}: the walked way writes it)
        rows = len(columns)
        keys = zip(columns.shapes, columns.strides, columns.dtypes, strict=True)
        layouts: dict[tuple[Any, ...], str] = {}
        for layout in set(keys):
            shape, stride, dtype = layout
            layouts[layout] = (
                f'],"shape":{_ints(shape)},"dtype":{_text(dtype)},"device":"cpu",'
                f'"nbytes":{math.prod(shape) * itemsize(dtype)},"stride":{_ints(stride)},"storage_offset":0,"storage":'
            )
        names = list(map(_text, columns.names))  # (str keys: what the columns promise)
        storages = self._column_storage_ids(columns)
        texts = names if storages == columns.names else list(map(_text, storages))
        pieces = [_ROW_END] * (4 * rows)
        pieces[0::4] = names
        if len(layouts) == 1:  # (one layout: its text in every row)
            pieces[1::4] = [*layouts.values()] * rows
        else:
            pieces[1::4] = map(layouts.__getitem__, zip(columns.shapes, columns.strides, columns.dtypes, strict=True))
        pieces[2::4] = texts
        # the array's opening and end on its first and last piece: one join, one encode (10 MB on 50,000 rows)
        pieces[0] = '[{"path":[' + pieces[0]
        pieces[-1] = _LAST_ROW_END + "]"
        return "".join(pieces).encode("ascii")

    def _walked_rows(self) -> list[dict[str, Any]]:
        return [
            {
                "path": to_json(path),
                "shape": list(t.shape),
                "dtype": t.dtype,
                "device": t.device,
                "nbytes": t.nbytes,
                "stride": list(t.stride),
                "storage_offset": t.storage_offset,
                "storage": self.storage_id(t.storage),
                "parameter": t.parameter,
                "aliases": self.aliases.get(id(t), 0),
            }
            for path, t in self.tensors
        ]

    def _column_storage_ids(self, columns: FlatColumns) -> list[str]:
        """:meth:`storage_id` of each row's storage, from the columns: each distinct source's prefix once."""
        sources = columns.sources
        keys = columns.storage_keys
        if sources and all(map(operator.is_, sources, itertools.repeat(sources[0]))):
            prefix = self._prefix(sources[0])
            return list(map(prefix.__add__, keys)) if prefix else keys
        ids = list(map(id, sources))
        prefixes = {place: self._prefix(source) for place, source in dict(zip(ids, sources, strict=True)).items()}
        return list(map(operator.add, map(prefixes.__getitem__, ids), keys))

    def _flat_rows(self) -> list[dict[str, Any]]:
        """:meth:`_walked_rows` of a root given as columns, each field one pass over a column.

        What :class:`FlatColumns` promises fixes most fields: str keys, each tensor dense over its own storage
        from offset 0 on cpu, no Parameter, no alias; a test holds this equal to the walked rows.
        """
        columns = self.checkpoint.flat_columns()
        assert columns is not None
        sizes = {dtype: itemsize(dtype) for dtype in set(columns.dtypes)}
        nbytes = map(operator.mul, columns.numels, map(sizes.__getitem__, columns.dtypes))
        storages = self._column_storage_ids(columns)
        shapes = map(list, columns.shapes)
        strides = map(list, columns.strides)
        return [
            {
                "path": [key],
                "shape": shape,
                "dtype": dtype,
                "device": "cpu",
                "nbytes": size,
                "stride": stride,
                "storage_offset": 0,
                "storage": storage,
                "parameter": False,
                "aliases": 0,
            }
            for key, shape, dtype, size, stride, storage in zip(
                columns.names if _all_unicode(columns.names) else [to_json((name,))[0] for name in columns.names],
                shapes,
                columns.dtypes,
                nbytes,
                strides,
                storages,
                strict=True,
            )
        ]


def _all_unicode(names: Sequence[str]) -> bool:
    """Whether no name holds a lone surrogate (one encode of them all)."""
    try:
        "".join(names).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def summarize(
    checkpoint: Checkpoint, references: list[Reference] | None = None, compared: ComparedModel | None = None
) -> Summary:
    """Walk the tree once and total it up (``references``: that walk, when the caller made it; ``compared``:
    the model the user last compared with, the evidence for its prefix findings).

    Every pass below is over whole lists at C speed (``map``, ``Counter``, comprehensions), with
    Python per distinct shape or storage source: a state_dict of 50,000 tensors is summed up in a few
    passes, not 50,000 function calls per total.
    """
    columns = checkpoint.flat_columns() if references is None else None
    keyed = columns.key_dict() if columns is not None else None
    if columns is not None and not (is_optimizer(keyed) or is_scheduler(keyed)):
        summary = _flat_summary(checkpoint, columns)  # (tensors named like a scheduler's state: audited as one)
    else:
        summary = _walked_summary(checkpoint, references if references is not None else list(walk(checkpoint.root)))
    reported = {f.global_name for f in summary.findings if f.kind == "unsafe-global"}
    for name in sorted(checkpoint.unsafe_globals - reported):
        message = (
            f"unsafe global {printable(name)} in the pickle, outside the tree: NOT executed here; "
            "torch.load would run it"
        )
        summary.findings.append(Finding("unsafe-global", message, "warning", global_name=name))
    if checkpoint.format not in ("zip", "legacy", "pickle"):
        # torch.load(weights_only=True) judges one pickled file; a folder or a set has its own loader
        summary.findings = [f for f in summary.findings if f.kind != "weights-only-data"]
    for problem in checkpoint.loader_problems:
        summary.findings.append(Finding("loader-refuses", problem, "warning"))
    for problem in checkpoint.hostile:
        # what the loader itself reads, but readers disagree on (a key in two shards): said here once
        if problem not in checkpoint.loader_problems:
            summary.findings.append(Finding("readers-disagree", problem, "warning"))
    for odd in checkpoint.odd_layout:
        # what its loader loads, shown as it loads it; no saver writes it
        summary.findings.append(Finding("odd-layout", odd, "warning"))
    for code in checkpoint.runs_code:
        summary.findings.append(Finding("load-runs-code", code, "warning"))
    # a folder's other files, read for code: code or doubt there is a warning; the line naming them is said once
    if checkpoint.beside:
        from ckpt_tui.core.weights_only.verdict import BESIDE_LINE, beside_findings

        for kind, message in beside_findings(checkpoint.beside):
            summary.findings.append(Finding(kind, printable(message), "info" if kind == BESIDE_LINE else "warning"))
    # every fix checked before it is shown: none may lower a match the keys have
    # (a root still held as columns: its keys, which are all a fix's check reads of a flat state_dict)
    if summary.findings or compared is not None:  # (nothing to check, nothing imported)
        from ckpt_tui.core.operations.hints import vet_findings

        flat_keys = columns.names if columns is not None else None
        summary.findings = vet_findings(checkpoint.key_root(), summary.findings, flat_keys, compared)
    summary.findings = merge_rank_repeats(summary.findings)
    summary.findings = _unfixable_when_records_missing(summary.findings)
    summary.findings.sort(key=lambda f: not f.first_listed)
    return summary


def _unfixable_when_records_missing(findings: list[Finding]) -> list[Finding]:
    """No fix offered for a file whose records are missing: ``convert`` reads every record it writes, so each
    command would fail on them (the missing-record finding says so)."""
    if not any(f.kind == "missing-record" for f in findings):
        return findings
    return [replace(f, fix=None) if f.fix is not None else f for f in findings]


def _walked_summary(checkpoint: Checkpoint, references: list[Reference]) -> Summary:
    """Totals and findings from a walk of the tree."""
    root = checkpoint.root
    tensors = listed_tensors(references)
    unique, aliases = _distinct([t for _, t in tensors])
    storages = _first_storages(tensors, len(unique) != len(tensors))
    parameters, by_dtype = _elements_and_bytes(unique)
    devices = device_counts(unique)
    dtypes: Counter[str] = Counter(map(_DTYPE, unique))
    tensor_bytes = _storage_bytes(storages) or sum(by_dtype.values())
    summary = Summary(checkpoint, tensors, parameters, tensor_bytes, devices, dtypes, by_dtype, aliases=aliases)
    containers = [r for r in references if type(r[1]) is not Tensor]  # what the optimizer and training checks look at
    summary.model = model_counts(root, containers, checkpoint.buffer_names)
    # without aliases, every shown tensor's reference is its first: the findings' tensors are the rows
    firsts = tensors if not aliases else [(r[0], r[1]) for r in references if r[3] and r[2] and type(r[1]) is Tensor]
    summary.findings = walked_findings(root, containers, firsts, devices) + _missing_records(storages)
    summary.findings += _training_findings(root, containers, summary.model, checkpoint.byteorder)
    return summary


def _flat_summary(checkpoint: Checkpoint, columns: FlatColumns) -> Summary:
    """Totals and findings of a root its reader gave as columns (see :class:`FlatColumns`): what
    :func:`_walked_summary` finds for it, each total one pass over a column, each tensor its own storage."""
    tensors = ColumnRows(columns)
    elements = _sums_by(columns.dtypes, columns.numels)
    by_dtype = Counter({dtype: n * itemsize(dtype) for dtype, n in elements.items()})
    devices = Counter({"cpu": len(tensors)}) if tensors else Counter()
    dtypes = _counted_by(columns.dtypes)
    parameters = sum(elements.values())
    summary = Summary(checkpoint, tensors, parameters, sum(by_dtype.values()), devices, dtypes, by_dtype)
    summary.from_columns = True
    summary.model = ModelCounts(path=(), parameters=0, buffers=0) if tensors else ModelCounts()
    if tensors:
        if _any_buffer_name(columns.names):
            marks = _buffer_marks(columns.names, columns.dtypes)
            summary.model.buffers = sum(itertools.compress(columns.numels, marks))
        else:  # (no key named as a buffer: the buffers are the tensors of the dtypes no parameter has)
            summary.model.buffers = sum(n for dtype, n in elements.items() if dtype not in PARAMETER_DTYPES)
        summary.model.parameters = parameters - summary.model.buffers
    summary.findings = flat_findings(columns)
    return summary


class ColumnRows(Sequence[tuple[KeyPath, Tensor]]):
    """``Summary.tensors`` of a root given as columns: counted from the columns; its tensors (the root's
    own objects) made only when a row is asked for (``info`` never asks)."""

    def __init__(self, columns: FlatColumns) -> None:
        self._columns = columns
        self._rows: list[tuple[KeyPath, Tensor]] | None = None

    def _listed(self) -> list[tuple[KeyPath, Tensor]]:
        if self._rows is None:
            self._rows = self._columns.listed()
        return self._rows

    def __len__(self) -> int:
        return len(self._columns)

    def __getitem__(self, index: Any) -> Any:
        return self._listed()[index]

    def __iter__(self) -> Iterator[tuple[KeyPath, Tensor]]:
        return iter(self._listed())


def listed_tensors(references: list[Reference]) -> list[tuple[KeyPath, Tensor]]:
    """Every shown reference to a tensor, in walk order: the rows of ``info`` (``Summary.tensors``)."""
    return [(r[0], r[1]) for r in references if r[2] and type(r[1]) is Tensor]


_DTYPE = operator.attrgetter("dtype")
_STORAGE = operator.attrgetter("storage")
_LAST_ROW_END = ',"parameter":false,"aliases":0}'
_ROW_END = _LAST_ROW_END + ',{"path":['
"""What follows a flat row's storage in ``info --json``, and opens the next row (:meth:`Summary.rows_json`)."""


def _ints(values: tuple[int, ...]) -> str:
    return "[" + ",".join(map(str, values)) + "]"


_SHAPE = operator.attrgetter("shape")
_SHAPE_AND_DTYPE = operator.attrgetter("shape", "dtype")


def _distinct(listed: list[Tensor]) -> tuple[list[Tensor], dict[int, int]]:
    """Each tensor object once (first reference first), and the other references of those listed twice."""
    ids = list(map(id, listed))
    if len(set(ids)) == len(ids):
        return listed, {}
    aliases = {key: n - 1 for key, n in Counter(ids).items() if n > 1}
    return list({id(t): t for t in listed}.values()), aliases


def _first_storages(tensors: list[tuple[KeyPath, Tensor]], shared_tensors: bool) -> list[tuple[Storage, KeyPath]]:
    """Each storage once, with the path of the first tensor over it (in the order met)."""
    storages = list(map(_STORAGE, map(operator.itemgetter(1), tensors)))
    if any(map(operator.is_, storages, itertools.repeat(None))):
        pairs = [(t.storage, path) for path, t in tensors if t.storage is not None]
    else:
        pairs = list(zip(storages, map(operator.itemgetter(0), tensors), strict=True))
    if not shared_tensors and len(set(map(id, map(operator.itemgetter(0), pairs)))) == len(pairs):
        return pairs
    first: dict[int, tuple[Storage, KeyPath]] = {}
    for storage, path in pairs:
        if id(storage) not in first:
            first[id(storage)] = (storage, path)
    return list(first.values())


def _storage_bytes(storages: list[tuple[Storage, KeyPath]]) -> int:
    """Bytes of every storage (elements summed per dtype, then sized once per dtype)."""
    dtypes = list(map(_DTYPE, map(operator.itemgetter(0), storages)))
    numels = list(map(operator.attrgetter("numel"), map(operator.itemgetter(0), storages)))
    return sum(n * itemsize(dtype) for dtype, n in _sums_by(dtypes, numels).items())


def _counted_by(keys: list[str]) -> Counter[str]:
    """``Counter(keys)``, with one look at a column of one value (a file of one dtype)."""
    if keys and len(set(keys)) == 1:
        return Counter({keys[0]: len(keys)})
    return Counter(keys)


def _sums_by(keys: list[str], counts: list[int]) -> dict[str, int]:
    """``counts`` summed per key, the keys in order of first appearance (one pass per distinct key)."""
    if keys and len(set(keys)) == 1:
        return {keys[0]: sum(counts)}
    return {
        key: sum(itertools.compress(counts, map(operator.eq, keys, itertools.repeat(key))))
        for key in dict.fromkeys(keys)
    }


def _elements_and_bytes(unique: list[Tensor]) -> tuple[int, Counter[str]]:
    """Elements of every tensor, and bytes by dtype (each shape's element count computed once)."""
    dense = [t for t in unique if t.sparse is None]
    by_dtype: Counter[str] = Counter({dtype: 0 for dtype in dict.fromkeys(map(_DTYPE, unique))})
    parameters = 0
    for (shape, dtype), n in Counter(map(_SHAPE_AND_DTYPE, dense)).items():
        numel = math.prod(shape)
        parameters += numel * n
        by_dtype[dtype] += numel * DTYPES[dtype][0] * n if dtype in DTYPES else 0
    if len(dense) < len(unique):
        for tensor in (t for t in unique if t.sparse is not None):
            parameters += tensor.numel
            by_dtype[tensor.dtype] += tensor.nbytes
    return parameters, by_dtype


def model_counts(
    root: Any, references: list[Any], buffer_names: Mapping[KeyPath, frozenset[str]] | None = None
) -> ModelCounts:
    """Elements of the model state_dict's parameters and buffers, and of every optimizer's state; ``buffer_names``:
    the buffers the file names, by their state_dict's path (``Checkpoint.buffer_names``)."""
    counts = ModelCounts()
    path: KeyPath | None = () if isinstance(root, Opaque) and root.is_module else None
    if path is None:
        path = () if tensor_items(root) is not None else inner_state_dict(root)
    if path is None and root_model_keys(root) is not None:
        path = ()  # the weights at the root, beside training state (torchtitan's DCP step)
    if path is not None:
        counts.path = path
        named = (buffer_names or {}).get(path, frozenset())
        weights = model_weights(root, path)
        counts.parameters, counts.buffers, counts.flat_copies = _parameters_and_buffers(weights, named)
        # a save of several models (Accelerate's model, model_1...): each counted, the first at ``path``
        for _, key in sorted(numbered_models(root, path).items()):
            if (key,) != path:
                parameters, buffers, flat_copies = _parameters_and_buffers(root[key])
                counts.others.append((key, parameters, buffers))
                counts.flat_copies += flat_copies
    seen: set[int] = set()
    for _, value, shown, first in references:
        if not (shown and first and isinstance(value, dict)):
            continue
        if is_optimizer(value) and isinstance(value.get("state"), dict):
            state = [tensor for _, tensor in iter_tensors(value["state"])]
        elif is_flat_optimizer(value):
            state = flat_optimizer_state(value)
        else:
            continue
        for tensor in state:
            if id(tensor) not in seen:
                seen.add(id(tensor))
                counts.optimizer_state += tensor.numel
    return counts


def model_weights(root: Any, path: KeyPath) -> Any:
    """The model's state_dict at ``path``; at the root beside training state (:func:`root_model_keys`), the root's
    tensors alone."""
    keys = root_model_keys(root) if not path else None
    return get(root, path) if keys is None else root_model(root, keys)


def _training_findings(root: Any, references: list[Any], model: ModelCounts, byteorder: str) -> list[Finding]:
    """Optimizer and scheduler state, audited against the counters and the model (conventions/training_state.py)."""
    dicts = [(p, v) for p, v, shown, first in references if shown and first and isinstance(v, dict)]
    optimizers = [(p, v) for p, v in dicts if is_optimizer(v)]
    # torch's flattened optimizer state_dict (torchtitan's), audited in the nested shape it flattens
    optimizers += [(p, unflattened_optimizer(v)) for p, v in dicts if is_flat_optimizer(v)]
    schedulers = [(p, v) for p, v in dicts if is_scheduler(v)]
    if not optimizers and not schedulers:
        return []
    from ckpt_tui.core.conventions.training_state import training_findings  # (a training checkpoint's own)

    shapes = parameter_shapes(model_weights(root, model.path)) if model.path is not None else None
    numbered = {n: parameter_shapes(root[key]) for n, key in numbered_models(root, model.path).items()}
    return training_findings(root, optimizers, schedulers, shapes, byteorder, numbered or None)


NUMBERED = re.compile(r"(?P<base>model|pytorch_model|optimizer)(?:_(?P<number>[1-9]\d*))?")
"""How Accelerate's ``save_state`` names the files of several models and optimizers: ``model.safetensors``,
``model_1.safetensors``, ``optimizer.bin``, ``optimizer_1.bin`` (opened as keys without their extension)."""


def numbered_models(root: Any, path: KeyPath | None) -> dict[int, str]:
    """The root keys of a save of several models (``model``, ``model_1``...: Accelerate's ``save_state`` after
    ``prepare(m1, m2, ...)``), by their number (0 for the first); empty unless the model is one of two or more."""
    if not isinstance(root, dict) or path is None or len(path) != 1 or not isinstance(path[0], str):
        return {}
    first = NUMBERED.fullmatch(path[0])
    if first is None or first["base"] == "optimizer":
        return {}
    found = {}
    for key in root:
        named = NUMBERED.fullmatch(key) if isinstance(key, str) else None
        if named is not None and named["base"] == first["base"] and tensor_items(root[key]) is not None:
            found[int(named["number"] or 0)] = key
    return found if len(found) > 1 else {}


def parameter_shapes(model: Any) -> list[tuple[int, ...]]:
    """The shape of each parameter of a model state_dict (buffers left out, each tensor object once)."""
    seen: set[int] = set()
    shapes: list[tuple[int, ...]] = []
    if isinstance(model, Opaque) and model.is_module:
        entries: list[tuple[bool, Tensor]] = [(g == "_parameters", t) for g, t in module_groups(model)]
    else:
        entries = [(not is_buffer(n, t), t) for n, t in tensor_items(model) or [] if isinstance(t, Tensor)]
    for is_parameter, tensor in entries:
        if is_parameter and id(tensor) not in seen:
            seen.add(id(tensor))
            shapes.append(tensor.shape)
    return shapes


def _parameters_and_buffers(model: Any, buffer_names: frozenset[str] = frozenset()) -> tuple[int, int, int]:
    """Elements in parameters, in buffers and in FSDP's flat copies of the parameters (:func:`_flat_param_copies`):
    exact for a pickled module, by name and dtype for a state_dict, and by ``buffer_names`` where the file names
    its buffers."""
    parameters = buffers = 0
    seen: set[tuple[Any, ...]] = set()
    if isinstance(model, Opaque) and model.is_module:
        for group, tensor in module_groups(model):
            if view_key(tensor) not in seen:
                seen.add(view_key(tensor))
                if group == "_parameters":
                    parameters += tensor.numel
                else:
                    buffers += tensor.numel
        return parameters, buffers, 0
    named = tensor_items(model) or []
    if set(map(type, map(operator.itemgetter(1), named))) != {Tensor}:
        named = [(name, tensor) for name, tensor in named if type(tensor) is Tensor]
    tensors = list(map(operator.itemgetter(1), named))
    if len(set(map(view_key, tensors))) < len(named):  # each view once (tied weights), at its first name
        named = list({view_key(tensor): (name, tensor) for name, tensor in reversed(named)}.values())
        tensors = list(map(operator.itemgetter(1), named))
    names = list(map(operator.itemgetter(0), named))
    buffer_marks = _buffer_marks(names, list(map(_DTYPE, tensors)))
    if buffer_names:
        buffer_marks = [mark or name in buffer_names for name, mark in zip(names, buffer_marks, strict=True)]
    copies = _flat_param_copies(names, buffer_marks)
    flat_copies = 0
    if copies:
        flat_copies = sum(tensor.numel for name, tensor in named if name in copies)
        kept = [index for index, name in enumerate(names) if name not in copies]
        tensors, buffer_marks = [tensors[i] for i in kept], [buffer_marks[i] for i in kept]
    shapes = map(_SHAPE, tensors)
    for (shape, is_a_buffer), n in Counter(zip(shapes, buffer_marks, strict=True)).items():
        if is_a_buffer:
            buffers += math.prod(shape) * n
        else:
            parameters += math.prod(shape) * n
    return parameters, buffers, flat_copies


FLAT_PARAM = "_flat_param"
"""FSDP1's flattened parameter of a wrapped module, in its LOCAL_STATE_DICT."""


def _flat_param_copies(names: list[str], buffer_marks: list[bool]) -> set[str]:
    """The ``_flat_param`` keys whose elements the state_dict also holds as the parameters themselves (FSDP1's
    LOCAL_STATE_DICT with ``use_orig_params=True`` saves both, the parameters as views of the flat one); empty
    when the flat parameters are all there is of them."""
    flat = {name for name in names if name == FLAT_PARAM or name.endswith("." + FLAT_PARAM)}
    if not flat:
        return set()
    parameters = (name for name, is_a_buffer in zip(names, buffer_marks, strict=True) if not is_a_buffer)
    # counted once, as model.parameters() counts them: the parameters, not FSDP's (padded) flat copy of them
    return flat if any(name not in flat for name in parameters) else set()


def is_buffer(name: str, tensor: Tensor) -> bool:
    """A state_dict entry that is a buffer, not a parameter: BatchNorm's statistics, or any integer tensor."""
    return _is_buffer_name(name) or tensor.dtype not in PARAMETER_DTYPES


def _is_buffer_name(name: str) -> bool:
    return name in BUFFER_NAMES or name.endswith(BUFFER_SUFFIXES)


def _buffer_marks(names: list[str], dtypes: list[str]) -> list[bool]:
    """Which entries of a state_dict are buffers (:func:`is_buffer` of each), in passes over whole columns."""
    by_dtype = map(operator.not_, map(PARAMETER_DTYPES.__contains__, dtypes))
    if not _any_buffer_name(names):
        return list(by_dtype)
    by_suffix = map(operator.methodcaller("endswith", BUFFER_SUFFIXES), names)
    by_name = map(BUFFER_NAMES.__contains__, names)
    return list(map(operator.or_, map(operator.or_, by_suffix, by_name), by_dtype))


def _any_buffer_name(names: list[str]) -> bool:
    """Whether any name may be a buffer's, by one search per buffer name in all the names joined
    (a name ending so is followed by the newline joined after it; a false alarm only costs the exact pass)."""
    joined = "\n" + "\n".join(names) + "\n"
    return any(f"{end}\n" in joined for end in BUFFER_SUFFIXES) or any(f"\n{name}\n" in joined for name in BUFFER_NAMES)


def missing_records(root: Any) -> str | None:
    """Why no file can be written from a checkpoint's tree (``root``) as it is, when storage records are missing
    from it (convert reads every record it writes), or None."""
    tensors = [(path, tensor) for path, tensor in iter_tensors(root) if isinstance(tensor, Tensor)]
    missing = _lacking(_first_storages(tensors, True))
    if not missing:
        return None
    are = "is" if len(missing) == 1 else "are"
    records = counted(len(missing), "storage record")
    return f"{records} {are} missing from the file: convert reads every record it writes"


def _missing_records(storages: list[tuple[Storage, KeyPath]]) -> list[Finding]:
    """The finding of storages whose record their source lacks."""
    missing = _lacking(storages)
    if not missing:
        return []
    names = ", ".join(f"{where(path)} (record {printable(s.key)})" for s, path in missing[:5])
    more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    message = (
        f"{len(missing)} storage records are missing from the file: {names}{more}: it cannot be loaded, nor "
        "converted (no fix is offered: each would need them)"
    )
    return [Finding("missing-record", message, "warning", path=missing[0][1])]


def _lacking(storages: list[tuple[Storage, KeyPath]]) -> list[tuple[Storage, KeyPath]]:
    """Storages whose record their source lacks, by record name (each source asked once for all of its
    storages)."""
    sources = [s.source for s, _ in storages]
    by_source: dict[int, list[tuple[Storage, KeyPath]]] = {}
    if len(set(map(id, sources))) == 1:  # one file's records (the common case): no grouping
        by_source[id(sources[0])] = storages
    else:
        for pair, source in zip(storages, sources, strict=True):
            by_source.setdefault(id(source), []).append(pair)
    missing: list[tuple[Storage, KeyPath]] = []
    for group in by_source.values():
        source = group[0][0].source
        if source is None:
            continue
        if hasattr(source, "missing"):
            lacking = {id(s) for s in source.missing([s for s, _ in group])}
            missing += [pair for pair in group if id(pair[0]) in lacking] if lacking else []
        elif hasattr(source, "has"):
            missing += [pair for pair in group if not source.has(pair[0])]
    missing.sort(key=lambda item: item[0].key)
    return missing
