"""N-way diff of rank files (DDP: every rank saves a copy): which ranks agree bit for bit, and where not.

Each tensor is hashed per rank in bounded chunks; ranks with equal hashes agree bit for bit. For a
tensor where they do not, the largest absolute difference from the first rank is measured.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ckpt_tui.core.errors import CkptError, ReadStopped
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.tree import Checkpoint, Tensor
from ckpt_tui.core.operations.diff import key_text, leaves
from ckpt_tui.core.runtime.safe_text import printable
from ckpt_tui.core.values.fingerprint import Fingerprints
from ckpt_tui.core.values.tensor_values import (
    CHUNK_ELEMENTS,
    COMPLEX_DTYPES,
    TensorReader,
    decode,
    decode_complex,
    paired_chunks,
    repeated_view_error,
    repeats_far_more,
    same_layout,
)


@dataclass
class RankDifference:
    """One key whose value is not the same on every rank."""

    key: str
    groups: list[list[int]]
    """Ranks that agree bit for bit, each group in rank order, the first rank's group first."""
    max_abs: list[float | None]
    """Per rank: the largest |value - value on the first rank| (None where not measurable)."""
    what: str = "values"


@dataclass
class RankDiffReport:
    """What an N-way comparison of rank files found."""

    names: list[str]
    tensors: int = 0
    differences: list[RankDifference] = field(default_factory=list)
    missing: dict[str, list[int]] = field(default_factory=dict)
    unreadable: list[tuple[str, str]] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        """Every rank holds exactly the same keys and bytes."""
        return not (self.differences or self.missing or self.unreadable)

    def agreeing_ranks(self) -> list[list[int]]:
        """Ranks that agree bit for bit on every key (groups in rank order)."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for rank in range(len(self.names)):
            signature = tuple(_group_of(d.groups, rank) for d in self.differences)
            signature += tuple(int(rank in ranks) for ranks in self.missing.values())
            groups.setdefault(signature, []).append(rank)
        return list(groups.values())

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "identical": self.identical,
            "ranks": self.names,
            "tensors_compared": self.tensors,
            "agreeing_ranks": self.agreeing_ranks(),
            "differences": [
                {"key": d.key, "what": d.what, "agreeing_ranks": d.groups, "max_abs_diff_from_first": d.max_abs}
                for d in self.differences
            ],
            "missing": [{"key": k, "missing_in_ranks": v} for k, v in self.missing.items()],
            "unreadable": [{"key": k, "error": e} for k, e in self.unreadable],
        }


def _group_of(groups: list[list[int]], rank: int) -> int:
    return next(index for index, ranks in enumerate(groups) if rank in ranks)


def _digest(tensor: Tensor, byteorder: str, first: Tensor) -> str:
    """A digest of the values; of each stored element and its count for a view that repeats them (stride 0).

    Such a view is compared only with views laid out as the first rank's (the same digest means the same values).
    """
    digest = hashlib.blake2b(digest_size=16)
    # a neg or conj view bit makes the same bytes load as other values: ranks differing in it do not agree
    digest.update(repr(sorted(tensor.metadata.items(), key=str)).encode() if tensor.metadata else b"")
    reader = TensorReader(tensor, byteorder)
    if repeats_far_more(tensor) or repeats_far_more(first):
        if not same_layout(tensor, first):
            raise repeated_view_error(tensor if repeats_far_more(tensor) else first)
        for raw, repeats in reader.distinct_chunks():
            digest.update(raw.tobytes())
            digest.update(np.asarray(repeats, dtype=np.int64).tobytes())
        return digest.hexdigest()
    for raw in reader.chunks(CHUNK_ELEMENTS):
        digest.update(raw.tobytes())
    return digest.hexdigest()


def _max_abs(a: Tensor, b: Tensor, order_a: str, order_b: str) -> float:
    largest = 0.0
    chunks = ((raw_a, raw_b) for raw_a, raw_b, _ in paired_chunks(a, b, order_a, order_b))
    # complex: both parts, so the modulus of the difference (decode's magnitudes hide a sign or phase change)
    decoding = decode_complex if a.dtype in COMPLEX_DTYPES else decode
    with np.errstate(all="ignore"):
        for raw_a, raw_b in chunks:
            delta = np.abs(decoding(raw_a, a.dtype, a.metadata) - decoding(raw_b, b.dtype, b.metadata))
            finite = delta[np.isfinite(delta)]
            if finite.size:
                largest = max(largest, float(finite.max()))
            if np.isnan(delta).any() and not finite.size:
                return float("nan")
    return largest


def rank_diff(checkpoints: list[Checkpoint], progress: Callable[[int, int], None] | None = None) -> RankDiffReport:
    """Compare N checkpoints key by key: equal bytes, equal plain values, keys present everywhere."""
    names = [c.path for c in checkpoints]
    trees = [leaves(c.root) for c in checkpoints]
    report = RankDiffReport(names)
    prints = [Fingerprints() for _ in trees]
    paths = list(dict.fromkeys(k for tree in trees for k in tree))
    for index, path in enumerate(paths):
        if progress is not None:
            progress(index, len(paths))
        key = key_text(path)
        missing = [rank for rank, tree in enumerate(trees) if path not in tree]
        if missing:
            report.missing[key] = missing
            continue
        values = [tree[path] for tree in trees]
        if all(isinstance(v, Tensor) for v in values):
            _compare_tensors(key, values, checkpoints, report)
        else:
            texts = [b"tensor" if isinstance(v, Tensor) else p.of(v) for v, p in zip(values, prints, strict=True)]
            groups = _groups(texts)
            if len(groups) > 1:
                report.differences.append(RankDifference(key, groups, [None] * len(values), "value"))
    return report


def _groups(signatures: list[Any]) -> list[list[int]]:
    groups: dict[Any, list[int]] = {}
    for rank, signature in enumerate(signatures):
        groups.setdefault(signature, []).append(rank)
    return list(groups.values())


def _compare_tensors(key: str, tensors: list[Tensor], checkpoints: list[Checkpoint], report: RankDiffReport) -> None:
    report.tensors += 1
    layouts = [(t.shape, t.dtype) for t in tensors]
    if len(set(layouts)) > 1:
        groups = _groups(layouts)
        report.differences.append(RankDifference(key, groups, [None] * len(tensors), "shape/dtype"))
        return
    try:
        digests = [_digest(t, c.byteorder, tensors[0]) for t, c in zip(tensors, checkpoints, strict=True)]
        groups = _groups(digests)
        if len(groups) == 1:
            return
        first = tensors[0]
        max_abs: list[float | None] = [
            0.0 if digests[rank] == digests[0] else _max_abs(first, t, checkpoints[0].byteorder, c.byteorder)
            for rank, (t, c) in enumerate(zip(tensors, checkpoints, strict=True))
        ]
    except ReadStopped:
        raise
    except CkptError as exc:
        report.unreadable.append((key, str(exc)))
        return
    report.differences.append(RankDifference(key, groups, max_abs))


def render_rank_diff(report: RankDiffReport) -> str:
    """The text ``ckpt-tui diff r0 r1 r2 ...`` prints."""
    lines = [f"{counted(len(report.names), 'rank')}, {counted(report.tensors, 'tensor')} compared"]
    for rank, name in enumerate(report.names):
        lines.append(f"  rank {rank}: {printable(name)}")
    if report.identical:
        lines.append("all ranks agree bit for bit on every key")
        return "\n".join(lines)
    agreeing = report.agreeing_ranks()
    if len(agreeing) == 1:
        lines.append("all ranks agree with each other")
    else:
        lines.append("ranks that agree bit for bit on everything: " + "; ".join(_ranks(g) for g in agreeing))
    if report.differences:
        differ = "differs" if len(report.differences) == 1 else "differ"
        lines.append(f"{counted(len(report.differences), 'key')} {differ} across ranks:")
        for difference in report.differences:
            where = " | ".join(_ranks(g) for g in difference.groups)
            lines.append(f"  {printable(difference.key)}  ({difference.what}; agreeing: {where})")
            measured = [(r, v) for r, v in enumerate(difference.max_abs) if v]
            if measured:
                worst = max(measured, key=lambda item: item[1] or 0.0)
                lines.append(f"      max |rank - rank 0| = {worst[1]:.6g} (rank {worst[0]})")
    for key, ranks in report.missing.items():
        lines.append(f"  {printable(key)}: missing in {_ranks(ranks)}")
    for key, error in report.unreadable:
        lines.append(f"  {printable(key)}: unreadable ({printable(error)})")
    return "\n".join(lines)


def _ranks(ranks: list[int]) -> str:
    return "rank " + ",".join(str(r) for r in ranks) if len(ranks) == 1 else "ranks " + ",".join(str(r) for r in ranks)
