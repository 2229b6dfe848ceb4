"""Short human text for values and sizes, shared by the CLI and the TUI."""

from __future__ import annotations

import reprlib
from dataclasses import dataclass
from typing import Any

import humanize

from ckpt_tui.core.tree import (
    Device,
    Opaque,
    Symbol,
    Tensor,
    TorchSize,
    children,
    has_children,
    is_global_ref,
    iter_tensors,
    type_label,
)

FORMAT_NAMES = {
    "zip": "torch zip checkpoint",
    "legacy": "legacy torch checkpoint (pre-1.6)",
    "pickle": "plain pickle",
    "safetensors": "safetensors",
    "sharded": "sharded checkpoint",
    "dcp": "torch.distributed.checkpoint directory",
    "torchscript": "TorchScript archive",
}


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 3, 8, 8, 6
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 80, 80, 40


def short_repr(value: Any) -> str:
    """``repr`` bounded in depth and length, whatever a hostile file nests."""
    return _REPR.repr(value)


def size(nbytes: int) -> str:
    """Bytes as ``97.5 MB`` (decimal units, as file managers show)."""
    return humanize.naturalsize(nbytes, format="%.1f")


def count(number: int) -> str:
    """A count as ``25.6M``."""
    if number < 10_000:
        return str(number)
    return humanize.metric(number, precision=3).replace(" ", "")


def shape(dims: tuple[int, ...]) -> str:
    """A shape as ``[64, 3, 7, 7]``."""
    return "[" + ", ".join(str(d) for d in dims) + "]"


@dataclass
class Totals:
    """What a container holds: tensors, parameters and bytes below it."""

    tensors: int = 0
    parameters: int = 0
    nbytes: int = 0


def totals(value: Any) -> Totals:
    """Tensors, parameters and bytes below a value."""
    result = Totals()
    for _, tensor in iter_tensors(value):
        result.tensors += 1
        result.parameters += tensor.numel
        result.nbytes += tensor.nbytes
    return result


def tensor_text(tensor: Tensor) -> str:
    """``[64, 3, 7, 7] float32 cuda:0 36.9 kB``."""
    return f"{shape(tensor.shape)} {tensor.dtype} {tensor.device} {size(tensor.nbytes)}"


def scalar_text(value: Any, limit: int = 60) -> str:
    """A leaf value in one line, cut to ``limit`` characters."""
    if isinstance(value, Symbol):
        text = value.qualname
    elif isinstance(value, Device):
        text = f"torch.device({str(value)!r})"
    elif isinstance(value, TorchSize):
        text = f"torch.Size({list(value)})"
    elif isinstance(value, Opaque):
        args = ", ".join(scalar_text(a, 40) for a in value.args)
        text = f"{value.global_name}({args})" + ("" if value.safe else "  [not executed]")
    elif is_global_ref(value):
        text = type_label(value) + ("" if value.safe else "  [not executed]")
    elif isinstance(value, bytes):
        text = f"{len(value)} bytes"
    else:
        text = short_repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def value_text(value: Any) -> str:
    """The text after a key in the tree: type and, for tensors, shape/dtype/device/size."""
    if isinstance(value, Tensor):
        return f"{type_label(value)} {tensor_text(value)}"
    if has_children(value):
        kids = sum(1 for _ in children(value))
        found = totals(value)
        extra = (
            f" · {found.tensors} tensors · {count(found.parameters)} params · {size(found.nbytes)}"
            if found.tensors
            else ""
        )
        return f"{type_label(value)} ({kids}){extra}"
    if isinstance(value, (dict, list, tuple, set, frozenset)) and not isinstance(value, TorchSize):
        return f"{type(value).__name__} (empty)"
    if isinstance(value, Opaque) or is_global_ref(value):
        return scalar_text(value, 100)
    return f"{type_label(value)} = {scalar_text(value)}"
