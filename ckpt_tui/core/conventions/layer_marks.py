"""Which tensors of a table stand out: NaN/Inf, a norm far from their siblings', a dead (all-zero) layer.

Siblings are the tensors of one *family*: the same key path with every number replaced by ``*`` and
the same last component (``encoder.layers.*.attn.q.weight``; ``optimizer/state/*/exp_avg``). A tensor
whose L2 norm is more than :data:`FAR` times its family's median, or less than 1/:data:`FAR` of it, is
marked ``!! norm``; a floating-point tensor whose norm is exactly 0 while its family's median is not
(or a whole ``weight`` at 0) is ``dead``. Marks are words, so they read the same without colour.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from ckpt_tui.core.model.keypath import KeyPath, key_text
from ckpt_tui.core.values.tensor_table import TensorRow

FAR = 10.0
MIN_FAMILY = 3
"""A family smaller than this has no median worth comparing with."""
FLOAT_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})


def family(path: KeyPath) -> str:
    """The family of a key path: its dotted and nested components, numbers as ``*``."""
    parts: list[str] = []
    for key in path:
        for part in key_text(key).split("."):
            parts.append("*" if part.isdigit() else part)
    return ".".join(parts)


def marks(rows: Iterable[TensorRow]) -> dict[int, str]:
    """The mark of each row that has one, by ``id`` of the row: ``!! NaN``, ``!! Inf``, ``!! norm``, ``dead``."""
    listed = list(rows)
    out: dict[int, str] = {}
    families: dict[str, list[TensorRow]] = {}
    for row in listed:
        if row.stats is None:
            continue
        if row.stats.nan:
            out[id(row)] = "!! NaN"
        elif row.stats.inf:
            out[id(row)] = "!! Inf"
        elif row.dtype in FLOAT_DTYPES and row.stats.norm is not None and row.numel > 1:
            families.setdefault(family(row.path), []).append(row)
    for members in families.values():
        median = statistics.median(row.stats.norm for row in members if row.stats and row.stats.norm is not None)
        for row in members:
            norm = row.stats.norm if row.stats is not None else None
            if norm is None:
                continue
            if norm == 0 and (median > 0 or key_text(row.path[-1]).endswith("weight")):
                out[id(row)] = "dead"
            elif len(members) >= MIN_FAMILY and median > 0 and not 1 / FAR <= norm / median <= FAR:
                out[id(row)] = "!! norm"
    return out
