"""Counts and totals of a checkpoint: what ``info`` prints and the TUI's header shows."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ckpt_tui.core.findings import Finding, compute_findings
from ckpt_tui.core.keypath import KeyPath, to_json
from ckpt_tui.core.tree import Checkpoint, Storage, Tensor, iter_nodes


@dataclass
class Summary:
    """Totals over every tensor in a checkpoint, and its findings."""

    checkpoint: Checkpoint
    tensors: list[tuple[KeyPath, Tensor]]
    parameter_count: int
    tensor_bytes: int
    devices: Counter[str]
    dtypes: Counter[str]
    bytes_by_dtype: Counter[str]
    findings: list[Finding] = field(default_factory=list)
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

    def to_json(self) -> dict[str, Any]:
        """The ``info --json`` object (a documented contract: extend, never break)."""
        ckpt = self.checkpoint
        return {
            "path": ckpt.path,
            "format": ckpt.format,
            "file_bytes": ckpt.file_bytes,
            "tensor_count": len(self.tensors),
            "parameter_count": self.parameter_count,
            "tensor_bytes": self.tensor_bytes,
            "devices": dict(self.devices),
            "dtypes": dict(self.dtypes),
            "bytes_by_dtype": dict(self.bytes_by_dtype),
            "metadata": {str(k): str(v) for k, v in ckpt.metadata.items()},
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
                }
                for path, t in self.tensors
            ],
        }


def summarize(checkpoint: Checkpoint) -> Summary:
    """Walk the tree once and total it up."""
    nodes = list(iter_nodes(checkpoint.root))
    tensors = [(path, value) for path, value in nodes if isinstance(value, Tensor)]
    devices: Counter[str] = Counter()
    dtypes: Counter[str] = Counter()
    by_dtype: Counter[str] = Counter()
    storages: dict[int, Storage] = {}
    parameters = 0
    for _, tensor in tensors:
        devices[tensor.device] += 1
        dtypes[tensor.dtype] += 1
        by_dtype[tensor.dtype] += tensor.nbytes
        parameters += tensor.numel
        if tensor.storage is not None:
            storages[id(tensor.storage)] = tensor.storage
    tensor_bytes = sum(s.nbytes for s in storages.values()) or sum(by_dtype.values())
    summary = Summary(checkpoint, tensors, parameters, tensor_bytes, devices, dtypes, by_dtype)
    summary.findings = compute_findings(checkpoint.root, nodes) + _missing_records(storages.values())
    reported = {f.global_name for f in summary.findings if f.kind == "unsafe-global"}
    for name in sorted(checkpoint.unsafe_globals - reported):
        message = f"unsafe global {name} in the pickle, outside the tree: NOT executed here; torch.load would run it"
        summary.findings.append(Finding("unsafe-global", message, "warning", global_name=name))
    for problem in checkpoint.loader_problems:
        summary.findings.append(Finding("loader-refuses", problem, "warning"))
    summary.findings.sort(key=lambda f: f.severity != "warning")
    return summary


def _missing_records(storages: Any) -> list[Finding]:
    missing = [s for s in storages if s.source is not None and hasattr(s.source, "has") and not s.source.has(s)]
    if not missing:
        return []
    names = ", ".join(sorted(s.key for s in missing)[:5])
    more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    message = f"{len(missing)} storage records are missing from the file ({names}{more}): it cannot be loaded"
    return [Finding("missing-record", message, "warning")]
