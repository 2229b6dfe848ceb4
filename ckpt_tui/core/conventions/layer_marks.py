"""Which tensors of a table stand out: NaN/Inf, a norm far from their siblings', a dead (all-zero) layer.

Siblings are tensors of the same *role* and the same shape. A parameter's role is its key path with
every number replaced by ``*`` (``encoder.layers.*.attn.q.weight``): the same parameter across repeated
blocks. An optimizer moment's role is the moment and the parameter it belongs to
(``exp_avg of encoder.layers.*.attn.q.weight``), found by lining the optimizer's state up with the
model's parameters in order by shape; where that fails, the moment alone (``exp_avg``), still split by
shape. Parameters are never siblings of optimizer state, and moments of different shapes never siblings.

A tensor whose L2 norm is more than :data:`FAR` times its family's median, or less than 1/:data:`FAR`
of it, is marked ``!! norm``; a bias or an optimizer moment, which hold the gradient's scale, by
:data:`GRADIENT_FAR` (a second moment, which holds squares, by :data:`GRADIENT_FAR` squared); a
floating-point tensor whose norm is exactly 0 while its family's median is not (or a whole ``weight``
at 0) is ``dead``. Marks are words, so they read the same without colour.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from ckpt_tui.core.conventions.state_dicts import BUFFER_NAMES
from ckpt_tui.core.model.keypath import KeyPath, key_text
from ckpt_tui.core.values.tensor_table import TensorRow

FAR = 10.0
GRADIENT_FAR = 100.0
"""How far a moment or a bias may be from its family's median: gradients differ by depth on a healthy
run. GPT-2 small (pre-LayerNorm, width 768) after 3 AdamW steps: the first block's bias moments are 11
times the median of the 12 blocks' (their squares 116 times), falling smoothly to the last block's;
after 3 SGD steps its zero-initialised c_attn.bias is 9.6 times its family's median."""
MIN_FAMILY = 3
"""A family smaller than this has no median worth comparing with."""
FLOAT_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})
MOMENTS = frozenset({"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "square_avg", "acc_delta", "sum"})
"""Per-parameter optimizer state (Adam/AdamW, SGD momentum, RMSprop, Adadelta, Adagrad)."""
SQUARED = frozenset({"exp_avg_sq", "max_exp_avg_sq", "square_avg", "acc_delta", "sum"})
"""Moments that hold squared gradients: their norms spread as the square of the gradients'."""


def family(path: KeyPath) -> str:
    """The role of a key path: its dotted and nested components, numbers as ``*``."""
    parts: list[str] = []
    for key in path:
        for part in key_text(key).split("."):
            parts.append("*" if part.isdigit() else part)
    return ".".join(parts)


@dataclass(frozen=True)
class _Moment:
    """Where an optimizer moment sits: the optimizer's ``state`` path, the parameter index, the moment."""

    state: KeyPath
    index: int
    name: str


def _moment(path: KeyPath) -> _Moment | None:
    if len(path) >= 3 and path[-1] in MOMENTS and path[-3] == "state" and _index(path[-2]) is not None:
        index = _index(path[-2])
        assert index is not None
        return _Moment(path[:-2], index, str(path[-1]))
    return None


def _index(key: object) -> int | None:
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    if isinstance(key, str) and key.isdigit():
        return int(key)
    return None


def families(rows: Iterable[TensorRow]) -> dict[int, str]:
    """The family of each row, by ``id`` of the row: its role and its shape, in words
    (``model.layers.*.q.weight [64, 64]``, ``optimizer.state: exp_avg of model.layers.*.q.weight [64, 64]``)."""
    listed = list(rows)
    moments = {id(row): found for row in listed if (found := _moment(row.path)) is not None}
    params = [row for row in listed if id(row) not in moments and row.dtype in FLOAT_DTYPES]
    owners = _owners(params, [(row, moments[id(row)]) for row in listed if id(row) in moments])
    out: dict[int, str] = {}
    for row in listed:
        shape = list(row.shape)
        found = moments.get(id(row))
        if found is None:
            out[id(row)] = f"{family(row.path)} {shape}"
            continue
        owner = owners.get((found.state, found.index))
        role = f"{found.name} of {owner}" if owner else found.name
        out[id(row)] = f"{family(found.state)}: {role} {shape}"
    return out


def _owners(params: list[TensorRow], moments: list[tuple[TensorRow, _Moment]]) -> dict[tuple[KeyPath, int], str]:
    """The role of the parameter each optimizer state entry belongs to, where the state lines up with a
    state_dict's parameters in order by shape (``torch.optim`` numbers parameters in the order the
    model gave them, which is a state_dict's order without its buffers)."""
    entries: dict[KeyPath, dict[int, tuple[int, ...]]] = {}
    for row, found in moments:
        entries.setdefault(found.state, {}).setdefault(found.index, row.shape)
    candidates: dict[KeyPath, list[TensorRow]] = {}
    for row in params:
        name = key_text(row.path[-1]).rsplit(".", 1)[-1]
        if name not in BUFFER_NAMES:
            candidates.setdefault(row.path[:-1], []).append(row)
    out: dict[tuple[KeyPath, int], str] = {}
    for state, shapes in entries.items():
        for rows in candidates.values():
            lined = _line_up(rows, [shapes[i] for i in sorted(shapes)])
            if lined is not None:
                out.update({(state, i): family(row.path) for i, row in zip(sorted(shapes), lined, strict=True)})
                break
    return out


def _line_up(rows: list[TensorRow], shapes: list[tuple[int, ...]]) -> list[TensorRow] | None:
    """The rows the shapes take, in order, each the next row of that shape; None if some shape finds none
    or more than a few rows are passed over (then it is not this state_dict's optimizer)."""
    taken: list[TensorRow] = []
    position = 0
    for shape in shapes:
        while position < len(rows) and rows[position].shape != shape:
            position += 1
        if position == len(rows):
            return None
        taken.append(rows[position])
        position += 1
    passed = position - len(taken)
    return taken if passed <= max(2, len(shapes) // 10) and len(rows) - len(taken) <= max(2, len(rows) // 4) else None


def marks(rows: Iterable[TensorRow]) -> dict[int, str]:
    """The mark of each row that has one, by ``id`` of the row: ``!! NaN``, ``!! Inf``, ``!! norm``, ``dead``."""
    listed = list(rows)
    named = families(listed)
    out: dict[int, str] = {}
    grouped: dict[str, list[TensorRow]] = {}
    for row in listed:
        if row.stats is None:
            continue
        if row.stats.nan:
            out[id(row)] = "!! NaN"
        elif row.stats.inf:
            out[id(row)] = "!! Inf"
        elif row.dtype in FLOAT_DTYPES and row.stats.norm is not None and row.numel > 1:
            grouped.setdefault(named[id(row)], []).append(row)
    for members in grouped.values():
        out.update(_family_marks(members))
    return out


def _family_marks(members: list[TensorRow]) -> dict[int, str]:
    """``dead`` (a zero norm where the family's is not, or a zero weight) and ``!! norm`` (far from the
    family's median, in a family large enough to have one; squared moments are allowed the square)."""
    out: dict[int, str] = {}
    norms = [row.stats.norm for row in members if row.stats is not None and row.stats.norm is not None]
    median = statistics.median(norms)
    far = _far(members[0].path)
    for row in members:
        norm = row.stats.norm if row.stats is not None else None
        if norm is None:
            continue
        if norm == 0 and (median > 0 or key_text(row.path[-1]).endswith("weight")):
            out[id(row)] = "dead"
        elif len(members) >= MIN_FAMILY and median > 0 and not 1 / far <= norm / median <= far:
            out[id(row)] = "!! norm"
    return out


def _far(path: KeyPath) -> float:
    """How far from the median a family's norms may be: a weight's by :data:`FAR`, a bias's or a moment's
    by :data:`GRADIENT_FAR`, a moment of squares by its square."""
    moment = _moment(path)
    if moment is not None:
        # a moment's scale is its gradient's, which a healthy run spreads over depth (not an init's)
        return GRADIENT_FAR**2 if moment.name in SQUARED else GRADIENT_FAR
    # biases start at 0 (LayerNorm, Conv1D, BatchNorm) or near it: their norm is the sum of their updates
    return GRADIENT_FAR if key_text(path[-1]).rsplit(".", 1)[-1] == "bias" else FAR
