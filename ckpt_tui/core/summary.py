"""Counts and totals of a checkpoint: what ``info`` prints and the TUI's header shows.

The tree is walked once (:func:`~ckpt_tui.core.tree.walk`): each object is expanded at its first
reference only, so the time is linear in the file however much it shares. Every shown reference to a
tensor is listed (the same object under two keys is two rows; ``aliases`` counts the other references
of a listed object); elements, devices and dtypes count each tensor object once.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ckpt_tui.core.describe import Totals, count
from ckpt_tui.core.dtypes import DTYPES
from ckpt_tui.core.findings import Finding, compute_findings, where
from ckpt_tui.core.keypath import KeyPath, to_json
from ckpt_tui.core.safe_text import printable
from ckpt_tui.core.state_dicts import inner_state_dict, is_optimizer, is_scheduler, module_groups, tensor_items
from ckpt_tui.core.training_state import training_findings
from ckpt_tui.core.tree import Checkpoint, Opaque, Storage, Tensor, get, iter_tensors, walk

BUFFER_NAMES = frozenset({"running_mean", "running_var", "num_batches_tracked"})
PARAMETER_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16", "complex128", "complex64", "complex32"})


@dataclass
class ModelCounts:
    """Elements in the model's state_dict, split into parameters and buffers, and in optimizer state."""

    path: KeyPath | None = None
    parameters: int = 0
    buffers: int = 0
    optimizer_state: int = 0


@dataclass
class Summary:
    """Totals over every tensor in a checkpoint, and its findings."""

    checkpoint: Checkpoint
    tensors: list[tuple[KeyPath, Tensor]] = field(repr=False)
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

    def storage_id(self, storage: Storage | None) -> str | None:
        """A stable name for a storage: its record key (with the shard file when sharded)."""
        if storage is None:
            return None
        prefix = self._shard_prefixes.get(id(storage.source))
        if prefix is None:
            source = str(getattr(storage.source, "path", "") or "")
            own = not source or os.path.abspath(source) == os.path.abspath(self.checkpoint.path)
            prefix = self._shard_prefixes[id(storage.source)] = "" if own else os.path.basename(source) + ":"
        return prefix + storage.key

    def totals(self) -> Totals:
        """Distinct tensors, their elements and bytes: what :func:`~ckpt_tui.core.describe.totals` finds
        below the root (the tensors reached through shown children, each object once), without a walk."""
        distinct = len(self.tensors) - sum(self.aliases.values())
        return Totals(distinct, self.parameter_count, sum(self.bytes_by_dtype.values()))

    def counts_text(self) -> str:
        """The element counts in words: ``276 params (model) + 17 in buffers + 552 optimizer state``.

        Without a model state_dict in the file, the sum over every tensor: ``851 params``.
        """
        model = self.model
        if model.path is None:
            return f"{count(self.parameter_count)} params"
        parts = [f"{count(model.parameters)} params (model)"]
        if model.buffers:
            parts.append(f"{count(model.buffers)} in buffers")
        if model.optimizer_state:
            parts.append(f"{count(model.optimizer_state)} optimizer state")
        rest = self.parameter_count - model.parameters - model.buffers - model.optimizer_state
        if rest > 0:
            parts.append(f"{count(rest)} other")
        return " + ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """The ``info --json`` object (a documented contract: extend, never break)."""
        ckpt = self.checkpoint
        model = self.model
        return {
            "path": ckpt.path,
            "format": ckpt.format,
            "file_bytes": ckpt.file_bytes,
            "tensor_count": len(self.tensors),
            "parameter_count": self.parameter_count,
            "model_path": to_json(model.path) if model.path is not None else None,
            "model_parameter_count": model.parameters,
            "model_buffer_count": model.buffers,
            "optimizer_state_count": model.optimizer_state,
            "tensor_bytes": self.tensor_bytes,
            "devices": dict(self.devices),
            "dtypes": dict(self.dtypes),
            "bytes_by_dtype": dict(self.bytes_by_dtype),
            "metadata": {str(k): str(v) for k, v in ckpt.metadata.items()},
            "index_metadata": {str(k): str(v) for k, v in ckpt.index_metadata.items()},
            "notes": ckpt.notes,
            "findings": [f.to_json() for f in self.findings],
            "tensors": [
                {
                    "path": to_json(path),
                    "shape": list(t.shape),
                    "dtype": t.dtype,
                    "device": t.device,
                    "nbytes": t.nbytes,
                    "stride": list(t.stride),
                    "storage_offset": t.offset,
                    "storage": self.storage_id(t.storage),
                    "parameter": t.parameter,
                    "aliases": self.aliases.get(id(t), 0),
                }
                for path, t in self.tensors
            ],
        }


def summarize(checkpoint: Checkpoint) -> Summary:
    """Walk the tree once and total it up."""
    root = checkpoint.root
    references = list(walk(root))
    tensors: list[tuple[KeyPath, Tensor]] = []
    listed: set[int] = set()
    aliases: dict[int, int] = {}
    for path, value, shown, _ in references:
        if shown and isinstance(value, Tensor):
            tensors.append((path, value))
            if id(value) in listed:
                aliases[id(value)] = aliases.get(id(value), 0) + 1
            listed.add(id(value))
    storages: dict[int, tuple[Storage, KeyPath]] = {}
    parameters = 0
    counted: dict[int, Tensor] = {}  # another key for the same tensor object: its elements count once
    for path, tensor in tensors:
        if id(tensor) not in counted:
            counted[id(tensor)] = tensor
            if tensor.storage is not None and id(tensor.storage) not in storages:
                storages[id(tensor.storage)] = (tensor.storage, path)
    unique = counted.values()
    devices: Counter[str] = Counter(tensor.device for tensor in unique)
    dtypes: Counter[str] = Counter(tensor.dtype for tensor in unique)
    by_dtype: Counter[str] = Counter({dtype: 0 for dtype in dtypes})
    numels: dict[tuple[int, ...], int] = {}  # the element count of each shape, computed once
    for tensor in unique:
        numel = numels.get(tensor.shape)
        if numel is None:
            numel = numels[tensor.shape] = tensor.numel
        parameters += numel
        by_dtype[tensor.dtype] += (
            tensor.nbytes
            if tensor.sparse is not None or tensor.dtype not in DTYPES
            else (numel * DTYPES[tensor.dtype][0])
        )
    tensor_bytes = sum(s.nbytes for s, _ in storages.values()) or sum(by_dtype.values())
    summary = Summary(checkpoint, tensors, parameters, tensor_bytes, devices, dtypes, by_dtype, aliases=aliases)
    summary.model = model_counts(root, references)
    summary.findings = compute_findings(root, references) + _missing_records(list(storages.values()))
    summary.findings += _training_findings(root, references, summary.model, checkpoint.byteorder)
    reported = {f.global_name for f in summary.findings if f.kind == "unsafe-global"}
    for name in sorted(checkpoint.unsafe_globals - reported):
        message = (
            f"unsafe global {printable(name)} in the pickle, outside the tree: NOT executed here; "
            "torch.load would run it"
        )
        summary.findings.append(Finding("unsafe-global", message, "warning", global_name=name))
    for problem in checkpoint.loader_problems:
        summary.findings.append(Finding("loader-refuses", problem, "warning"))
    summary.findings.sort(key=lambda f: f.severity != "warning")
    return summary


def model_counts(root: Any, references: list[Any]) -> ModelCounts:
    """Elements of the model state_dict's parameters and buffers, and of every optimizer's state."""
    counts = ModelCounts()
    path: KeyPath | None = () if isinstance(root, Opaque) and root.is_module else None
    if path is None:
        path = () if tensor_items(root) is not None else inner_state_dict(root)
    if path is not None:
        counts.path = path
        counts.parameters, counts.buffers = _parameters_and_buffers(get(root, path))
    seen: set[int] = set()
    for _, value, shown, first in references:
        if shown and first and isinstance(value, dict) and is_optimizer(value) and isinstance(value.get("state"), dict):
            for _, tensor in iter_tensors(value["state"]):
                if id(tensor) not in seen:
                    seen.add(id(tensor))
                    counts.optimizer_state += tensor.numel
    return counts


def _training_findings(root: Any, references: list[Any], model: ModelCounts, byteorder: str) -> list[Finding]:
    """Optimizer and scheduler state, audited against the counters and the model (core/training_state.py)."""
    dicts = [(p, v) for p, v, shown, first in references if shown and first and isinstance(v, dict)]
    optimizers = [(p, v) for p, v in dicts if is_optimizer(v)]
    schedulers = [(p, v) for p, v in dicts if is_scheduler(v)]
    if not optimizers and not schedulers:
        return []
    shapes = parameter_shapes(get(root, model.path)) if model.path is not None else None
    return training_findings(root, optimizers, schedulers, shapes, byteorder)


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


def _parameters_and_buffers(model: Any) -> tuple[int, int]:
    """Elements in parameters and in buffers: exact for a pickled module, by name and dtype for a state_dict."""
    parameters = buffers = 0
    seen: set[int] = set()
    if isinstance(model, Opaque) and model.is_module:
        for group, tensor in module_groups(model):
            if id(tensor) not in seen:
                seen.add(id(tensor))
                if group == "_parameters":
                    parameters += tensor.numel
                else:
                    buffers += tensor.numel
        return parameters, buffers
    for name, tensor in tensor_items(model) or []:
        if isinstance(tensor, Tensor) and id(tensor) not in seen:
            seen.add(id(tensor))
            if is_buffer(name, tensor):
                buffers += tensor.numel
            else:
                parameters += tensor.numel
    return parameters, buffers


def is_buffer(name: str, tensor: Tensor) -> bool:
    """A state_dict entry that is a buffer, not a parameter: BatchNorm's statistics, or any integer tensor."""
    return name.rsplit(".", 1)[-1] in BUFFER_NAMES or tensor.dtype not in PARAMETER_DTYPES


def _missing_records(storages: list[tuple[Storage, KeyPath]]) -> list[Finding]:
    missing: list[tuple[Storage, KeyPath]] = []
    checks: dict[int, Any] = {}  # each source's ``has`` (None when it has none), looked up once per source
    for s, path in storages:
        source = s.source
        if source is None:
            continue
        if id(source) not in checks:
            checks[id(source)] = getattr(source, "has", None)
        has = checks[id(source)]
        if has is not None and not has(s):
            missing.append((s, path))
    if not missing:
        return []
    missing.sort(key=lambda item: item[0].key)
    names = ", ".join(f"{where(path)} (record {printable(s.key)})" for s, path in missing[:5])
    more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    message = f"{len(missing)} storage records are missing from the file: {names}{more}: it cannot be loaded"
    return [Finding("missing-record", message, "warning", path=missing[0][1])]
