"""What torch's ``state_dict()`` adds for quantized modules, built from their pickled state.

A dynamic-quantized ``Linear`` keeps its weights in a ``LinearPackedParams`` submodule whose
``_packed_params`` is a ``torch.ScriptObject``, pickled with the state ``((weight, bias), class name)``;
its ``scale`` and ``zero_point`` are plain numbers. torch's ``_save_to_state_dict`` writes, in order,
after the module's own parameters and buffers and before its children::

    X.scale                          tensor(scale)       (float32, 0-d)
    X.zero_point                     tensor(zero_point)  (int64, 0-d)
    X._packed_params.dtype           torch.qint8
    X._packed_params._packed_params  (weight, bias)

Other packed layouts (quantized convolutions, LSTMs) are not unpacked here: an extract that cannot
reach their tensors is refused (see :func:`ckpt_tui.core.edits.tree_edits.module_state_dict`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from ckpt_tui.core.model.keypath import Attr, Key
from ckpt_tui.core.model.made_bytes import MemorySource
from ckpt_tui.core.model.tree import Opaque, Storage, Symbol, Tensor, module_children

QUANTIZED_PACKAGES = ("torch.ao.nn.quantized.", "torch.nn.quantized.", "torch.ao.nn.intrinsic.quantized.")
PACKED_LINEAR = (
    "torch.ao.nn.quantized.modules.linear.LinearPackedParams",
    "torch.nn.quantized.modules.linear.LinearPackedParams",
)


STATE_DICT_VERSIONS = {
    "torch.ao.nn.quantized.dynamic.modules.linear.Linear": 4,
    "torch.nn.quantized.dynamic.modules.linear.Linear": 4,
    "torch.ao.nn.quantized.modules.linear.Linear": 3,
    "torch.nn.quantized.modules.linear.Linear": 3,
    **dict.fromkeys(PACKED_LINEAR, 3),
}
"""The class ``_version`` torch records in ``state_dict()._metadata``: without it, loading reads the
entries as the first version's layout (``X.weight``) and fails."""


def state_dict_version(node: Opaque) -> int | None:
    """The ``_metadata`` version torch's ``state_dict()`` records for this module, when it matters."""
    return STATE_DICT_VERSIONS.get(node.global_name)


def state_dict_extras(node: Opaque) -> list[tuple[str, Any]]:
    """The entries torch's ``_save_to_state_dict`` writes for this module besides its parameters and buffers."""
    state = node.state
    if not isinstance(state, dict) or not node.global_name.startswith(QUANTIZED_PACKAGES):
        return []
    if node.global_name in PACKED_LINEAR:
        packed = _packed_weight_bias(state.get("_packed_params"))
        dtype = state.get("dtype")
        if packed is None or not isinstance(dtype, Symbol):
            return []
        return [("dtype", dtype), ("_packed_params", packed)]
    scale, zero_point = state.get("scale"), state.get("zero_point")
    if type(scale) is not float or type(zero_point) is not int or not -(2**63) <= zero_point < 2**63:
        return []
    name = node.global_name
    return [
        ("scale", _scalar(f"{name}.scale", "float32", struct.pack("<f", scale))),
        ("zero_point", _scalar(f"{name}.zero_point", "int64", struct.pack("<q", zero_point))),
    ]


def _packed_weight_bias(value: Any) -> tuple[Tensor, Tensor | None] | None:
    """``(weight, bias)`` from a pickled ``LinearPackedParamsBase`` ScriptObject, when it holds them."""
    if not isinstance(value, Opaque) or not isinstance(value.state, tuple) or not value.state:
        return None
    pair = value.state[0]
    if not isinstance(pair, tuple) or len(pair) != 2 or not isinstance(pair[0], Tensor):
        return None
    if not (pair[1] is None or isinstance(pair[1], Tensor)):
        return None
    return pair[0], pair[1]


def _scalar(key: str, dtype: str, data: bytes) -> Tensor:
    """A 0-d tensor whose one value is held in memory, as ``torch.tensor(number)`` makes it."""
    return Tensor(Storage(key, dtype, "cpu", 1, MemorySource(data)), 0, (), (), dtype)


def state_dict_children(node: Opaque) -> Iterator[tuple[Key, Any]]:
    """A module's entries as its ``state_dict()`` lists them: parameters, buffers, the quantized
    extras above, then submodules (:func:`~ckpt_tui.core.model.tree.module_children` plus the extras)."""
    extras = state_dict_extras(node)
    for key, value in module_children(node):
        if extras and isinstance(value, Opaque) and value.is_module:
            yield from ((Attr(name), extra) for name, extra in extras)
            extras = []
        yield key, value
    yield from ((Attr(name), extra) for name, extra in extras)
