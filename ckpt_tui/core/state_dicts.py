"""Where the weights are: state_dict-like values, their common key prefix, the inner state_dict of a
training checkpoint, optimizers and schedulers. Findings, compare and edits all use this detection."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ckpt_tui.core.keypath import KeyPath
from ckpt_tui.core.tree import Opaque, Tensor, module_children

PREFIX_ORIGINS = {
    "module.": "saved from DataParallel/DDP",
    "_orig_mod.": "saved from a torch.compile'd model",
    "model.": "saved from a Lightning module or a wrapper holding the model as .model",
}
INNER_NAMES = (
    "state_dict",
    "model_state_dict",
    "model",
    "net",
    "network",
    "module",
    "model_state",
    "weights",
    "params",
    "generator",
    "ema",
    "model_ema",
    "ema_state_dict",
    "state_dict_ema",
)
SEARCH_DEPTH = 3


def tensor_items(value: Any) -> list[tuple[str, Any]] | None:
    """The (key, value) pairs of a state_dict-like value, or None if it is not one."""
    if isinstance(value, Opaque) and value.is_module:
        return [(k, v) for k, v in flat_module_items(value)]
    if not isinstance(value, dict) or not value:
        return None
    items = list(value.items())
    tensors = sum(1 for _, v in items if isinstance(v, Tensor))
    if tensors == 0 or tensors < 0.9 * len(items) or not all(isinstance(k, str) for k, _ in items):
        return None
    return items


def flat_module_items(node: Opaque, prefix: str = "") -> Iterable[tuple[str, Any]]:
    """A pickled module's ``state_dict()`` entries: dotted names to tensors."""
    for key, value in module_children(node):
        name = prefix + str(getattr(key, "name", key))
        if isinstance(value, Opaque) and value.is_module:
            yield from flat_module_items(value, name + ".")
        else:
            yield name, value


def common_prefix(keys: Iterable[str]) -> str | None:
    """The leading dotted components shared by every key (``module.``), if any."""
    key_list = [k for k in keys if k != "_metadata"]
    if len(key_list) < 2:
        return None
    prefix = ""
    while True:
        heads = {k[len(prefix) :].split(".", 1)[0] for k in key_list}
        if len(heads) != 1:
            break
        head = heads.pop() + "."
        if not all(k.startswith(prefix + head) and len(k) > len(prefix + head) for k in key_list):
            break
        if prefix and head not in PREFIX_ORIGINS:
            break
        prefix += head
        if head not in PREFIX_ORIGINS:
            break
    return prefix or None


def prefix_origin(prefix: str) -> str:
    """What usually produces a prefix, in words."""
    origins = [PREFIX_ORIGINS[p + "."] for p in prefix.rstrip(".").split(".") if p + "." in PREFIX_ORIGINS]
    return "; ".join(origins) if origins else f"every key sits under a wrapper named {prefix.rstrip('.')!r}"


def is_optimizer(value: Any) -> bool:
    """An ``optimizer.state_dict()``: ``state`` and ``param_groups``."""
    return isinstance(value, dict) and "state" in value and isinstance(value.get("param_groups"), list)


def is_scheduler(value: Any) -> bool:
    """An LR scheduler's ``state_dict()``."""
    return isinstance(value, dict) and "last_epoch" in value and ("base_lrs" in value or "_step_count" in value)


def state_dicts(root: Any) -> list[tuple[KeyPath, Any]]:
    """State_dict-like values near the root (not inside optimizers), shallowest first."""
    found: list[tuple[KeyPath, Any]] = []
    queue: list[tuple[KeyPath, Any]] = [((), root)]
    while queue:
        path, value = queue.pop(0)
        if tensor_items(value) is not None:
            found.append((path, value))
            continue
        if len(path) >= SEARCH_DEPTH or is_optimizer(value) or not isinstance(value, (dict, Opaque)):
            continue
        entries = value.items() if isinstance(value, dict) else [] if not value.is_module else module_children(value)
        queue.extend(((*path, k), v) for k, v in entries)
    return found


def inner_state_dict(root: Any) -> KeyPath | None:
    """The path of the model weights inside a training checkpoint (None if the root is them)."""
    if tensor_items(root) is not None and not (isinstance(root, Opaque) and root.is_module):
        return None
    if isinstance(root, Opaque) and root.is_module:
        return ()
    if isinstance(root, dict) and any(isinstance(v, Tensor) for v in root.values()):
        return None
    candidates = [(path, value) for path, value in state_dicts(root) if path]
    if not candidates:
        return None

    def rank(item: tuple[KeyPath, Any]) -> tuple[int, int, int]:
        path, value = item
        name = str(getattr(path[-1], "name", path[-1])).lower()
        preferred = INNER_NAMES.index(name) if name in INNER_NAMES else len(INNER_NAMES)
        ema = 1 if "ema" in name else 0
        return (ema, preferred, -len(tensor_items(value) or []))

    return min(candidates, key=rank)[0]
