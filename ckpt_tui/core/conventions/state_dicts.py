"""Where the weights are: state_dict-like values, their common key prefix, the inner state_dict of a
training checkpoint, optimizers and schedulers. Findings, compare and edits all use this detection."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Iterator
from typing import Any

from ckpt_tui.core.conventions.layouts import describe_wrappers, next_wrappers, split_wrappers
from ckpt_tui.core.conventions.quantized_modules import state_dict_children
from ckpt_tui.core.model.keypath import Key, KeyPath, key_text
from ckpt_tui.core.model.tree import (
    MODULE_GROUPS,
    Opaque,
    Symbol,
    Tensor,
    iter_tensors,
    module_children,
    non_persistent_buffers,
)

PREFIX_ORIGINS = {
    "module.": "saved from DataParallel/DDP",
    "_orig_mod.": "saved from a torch.compile'd model",
    "model.": "saved from a Lightning module or a wrapper holding the model as .model",
}
INNER_NAMES = (
    "fp32_weights",  # a DeepSpeed ZeRO folder's consolidated master weights, as zero_to_fp32 gives them
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
BUFFER_NAMES = frozenset({"running_mean", "running_var", "num_batches_tracked"})
"""State_dict entries that are buffers, not parameters (BatchNorm's statistics and step counter)."""
PARAMETER_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16", "complex128", "complex64", "complex32"})
"""Dtypes a parameter can have: any other tensor of a state_dict is a buffer (a counter, a mask, an index)."""


_last_state_dict: tuple[Any, int, list[tuple[str, Any]] | None] = (None, 0, None)
"""The dict :func:`tensor_items` last classified, its length and its answer: trees are never changed in
place (edits rebuild), so the answer holds while that dict is the one asked about; callers get a copy."""


def tensor_items(value: Any) -> list[tuple[str, Any]] | None:
    """The (key, value) pairs of a state_dict-like value, or None if it is not one."""
    global _last_state_dict
    if isinstance(value, Opaque) and value.is_module:
        return flat_module_items(value)
    if not isinstance(value, dict) or not value:
        return None
    last = _last_state_dict
    if last[0] is value and last[1] == len(value):  # the summary asks of one dict several times
        return None if last[2] is None else list(last[2])
    # counted by type (C speed: this runs several times over every state_dict of 50,000 keys)
    tensors = sum(n for kind, n in Counter(map(type, value.values())).items() if issubclass(kind, Tensor))
    items: list[tuple[str, Any]] | None = None
    if tensors and all(issubclass(k, str) for k in set(map(type, value))):
        weights = tensors
        if tensors < 0.9 * len(value):  # a quantized module's state_dict also holds packed (weight, bias) entries
            weights += sum(1 for k, v in value.items() if not isinstance(v, Tensor) and is_packed_entry(k, v))
        if weights >= 0.9 * len(value):
            items = list(value.items())
    _last_state_dict = (value, len(value), items)
    return None if items is None else list(items)


def is_packed_entry(key: Any, value: Any) -> bool:
    """An entry of a quantized module's ``state_dict()`` that is not a tensor: ``X._packed_params._packed_params``
    (a tuple of weight and bias) or ``X._packed_params.dtype``."""
    if not isinstance(key, str) or not key.endswith(("_packed_params._packed_params", "_packed_params.dtype")):
        return False
    if isinstance(value, tuple):
        return any(isinstance(v, Tensor) for v in value) and all(v is None or isinstance(v, Tensor) for v in value)
    return isinstance(value, Symbol)


REPEAT_ALLOWANCE = 4
"""A module tree is listed with its shared submodules repeated (as torch's ``state_dict()`` does) while
the listing takes at most this many steps per distinct entry; past that, each module is listed once."""


def flat_module_items(node: Opaque, prefix: str = "") -> list[tuple[str, Any]]:
    """A pickled module's ``state_dict()`` entries: dotted names to tensors.

    Like torch, a submodule registered under two names is listed under both. Unlike torch, a module
    that contains itself is listed once (torch would recurse forever), and a tree whose sharing would
    multiply its entries (modules sharing children 60 levels deep: 2**60 names) lists each module once,
    under its first name: the work stays linear in the file.
    """
    budget = REPEAT_ALLOWANCE * _distinct_entries(node) + 1000
    listed = _flatten(node, prefix, budget)
    return listed if listed is not None else _flatten(node, prefix, None) or []


def _distinct_entries(node: Opaque) -> int:
    """Entries of every distinct module below ``node``, each module counted once."""
    seen = {id(node)}
    stack = [node]
    total = 0
    while stack:
        for _, value in module_children(stack.pop()):
            total += 1
            if isinstance(value, Opaque) and value.is_module and id(value) not in seen:
                seen.add(id(value))
                stack.append(value)
    return total


def _flatten(node: Opaque, prefix: str, budget: int | None) -> list[tuple[str, Any]] | None:
    """The listing, repeating shared modules within ``budget`` steps (None: over budget); once each without one."""
    out: list[tuple[str, Any]] = []
    on_path = {id(node)}
    listed = {id(node)}
    stack: list[tuple[str, Iterator[tuple[Key, Any]], int]] = [(prefix, state_dict_children(node), id(node))]
    steps = 0
    while stack:
        where, entries, node_id = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            on_path.discard(node_id)
            continue
        steps += 1
        if budget is not None and steps > budget:
            return None
        key, value = entry
        name = where + key_text(key)
        if isinstance(value, Opaque) and value.is_module:
            if id(value) in on_path or (budget is None and id(value) in listed):
                continue
            listed.add(id(value))
            on_path.add(id(value))
            stack.append((name + ".", state_dict_children(value), id(value)))
        else:
            out.append((name, value))
    return out


def module_groups(node: Opaque) -> Iterator[tuple[str, Tensor]]:
    """``(group, tensor)`` for the parameters and persistent buffers of every distinct module below ``node``."""
    seen = {id(node)}
    stack = [node]
    while stack:
        module = stack.pop()
        state = module.state
        assert isinstance(state, dict)
        skip = non_persistent_buffers(state)
        for group in MODULE_GROUPS:
            entries = state.get(group)
            if not isinstance(entries, dict):
                continue
            for name, value in entries.items():
                if isinstance(value, Tensor) and not (group == "_buffers" and name in skip):
                    yield group, value
                elif isinstance(value, Opaque) and value.is_module and id(value) not in seen:
                    seen.add(id(value))
                    stack.append(value)


def common_prefix(keys: Iterable[str], lightning: bool = False) -> str | None:
    """The leading dotted components shared by every key: any first one (``features.``), then wrapper
    prefixes as :func:`ckpt_tui.core.conventions.layouts.next_wrappers` allows them (``module._orig_mod.``, never
    ``module.module.``; in a Lightning ``state_dict``, ``model.`` and no ``module.``)."""
    key_list = list(keys)
    if "_metadata" in key_list:
        key_list = [k for k in key_list if k != "_metadata"]
    if len(key_list) < 2:
        return None
    shared, low = _shared_start(key_list)  # every component below is read from it (one pass over 50,000 keys)
    # every key starts with the shared start; one no longer than a component of it is that very text, which
    # sorts first: the smallest key's length tells where some key ends
    shortest = len(low)
    taken: list[str] = []
    prefix = ""
    while True:
        dot = shared.find(".", len(prefix))
        if dot < 0 or dot + 1 >= shortest:  # not a component every key has, or some key ends with it
            break
        head = shared[len(prefix) : dot + 1]
        wrapper = head in next_wrappers(taken, lightning)
        if prefix and not wrapper:
            break
        prefix += head
        if wrapper:
            taken.append(head)
        elif head not in PREFIX_ORIGINS:
            break  # a first component that may be a real submodule: shown, not gone past
    return prefix or None


def _shared_start(texts: list[str]) -> tuple[str, str]:
    """The longest string every text starts with (that of the smallest and the largest), and the smallest."""
    low, high = min(texts), max(texts)
    end = next((i for i, (a, b) in enumerate(zip(low, high, strict=False)) if a != b), min(len(low), len(high)))
    return low[:end], low


NOT_GPU = frozenset({"cpu", "meta", "dcp"})
"""Device tags that need no GPU to load: every other one (``cuda:0``, ``mps``, ``xpu:1``) does."""


def saved_on_gpu(value: Any) -> bool:
    """Whether a tensor in ``value`` was saved on a GPU (its tag needs that device, or map_location)."""
    return any(tensor.device not in NOT_GPU for _, tensor in iter_tensors(value))


def prefix_origin(prefix: str) -> str:
    """What usually produces a prefix, in words."""
    stack = split_wrappers(prefix, lightning=False)
    if stack is not None and len(stack) > 1:
        # one wrapper inside another ('module._orig_mod.'): in the words the compare report uses
        return describe_wrappers(prefix)
    origins = [PREFIX_ORIGINS[p + "."] for p in prefix.rstrip(".").split(".") if p + "." in PREFIX_ORIGINS]
    return "; ".join(origins) if origins else f"every key sits under a wrapper named {prefix.rstrip('.')!r}"


def is_optimizer(value: Any) -> bool:
    """An ``optimizer.state_dict()``: ``state`` and ``param_groups``."""
    return isinstance(value, dict) and "state" in value and isinstance(value.get("param_groups"), list)


FLAT_OPTIMIZER_PARTS = ("state.", "param_groups.")


def is_flat_optimizer(value: Any) -> bool:
    """An optimizer state_dict as torch flattens it (``get_optimizer_state_dict(..., options=StateDictOptions(
    flatten_optimizer_state_dict=True))``, what torchtitan saves): ``state.FQN.NAME`` and
    ``param_groups.FQN.NAME`` keys (``state.emb.weight.exp_avg``, ``param_groups.emb.weight.lr``)."""
    if not isinstance(value, dict) or not value or not all(isinstance(key, str) for key in value):
        return False
    # every parameter has its groups' entries (its state only once stepped): a dict of them and nothing else
    groups = any(key.startswith(FLAT_OPTIMIZER_PARTS[1]) for key in value)
    return groups and all(key.startswith(FLAT_OPTIMIZER_PARTS) for key in value)


def flat_optimizer_state(value: dict[str, Any]) -> list[Tensor]:
    """The state tensors (moments, steps) of a flattened optimizer state_dict (:func:`is_flat_optimizer`)."""
    return [v for k, v in value.items() if isinstance(v, Tensor) and k.startswith(FLAT_OPTIMIZER_PARTS[0])]


def unflattened_optimizer(value: dict[str, Any]) -> dict[str, Any]:
    """A flattened optimizer state_dict (:func:`is_flat_optimizer`) in the nested shape of ``optimizer.state_dict()``
    (``state`` by parameter name, ``param_groups`` listing their names), for the audits that read that shape. Each
    entry's name is its key's last component (``exp_avg``, ``lr``: never dotted); parameters whose group entries are
    equal make one group, in the order first seen (the flattening keeps no group of its own)."""
    state: dict[str, dict[str, Any]] = {}
    entries: dict[str, dict[str, Any]] = {}
    for key, item in value.items():
        part, _, rest = key.partition(".")
        fqn, _, name = rest.rpartition(".")
        if fqn:
            (state if part == "state" else entries).setdefault(fqn, {})[name] = item
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for fqn, options in entries.items():
        same = tuple((name, _plain_value(item)) for name, item in options.items())
        groups.setdefault(same, {**options, "params": []})["params"].append(fqn)
    return {"state": state, "param_groups": list(groups.values())}


def _plain_value(item: Any) -> Any:
    """A group entry as compared between parameters: plain values and tuples of them by value (``betas``), any
    other object (a tensor lr) by identity."""
    if isinstance(item, (int, float, str, bool, type(None))):
        return item
    if isinstance(item, (list, tuple)) and all(isinstance(v, (int, float, str, bool, type(None))) for v in item):
        return ("seq", *item)
    return ("id", id(item))


def any_optimizer(value: Any) -> bool:
    """An optimizer's state_dict, nested (:func:`is_optimizer`) or flattened (:func:`is_flat_optimizer`)."""
    return is_optimizer(value) or is_flat_optimizer(value)


def root_model_keys(root: Any) -> list[str] | None:
    """The keys of the model weights when they lie at the root beside training state, as torchtitan saves a
    step (``dcp.save({**model_state_dict, "optimizer": ..., "lr_scheduler": ..., "train_state": ...})``): the
    root's tensors, when beside them lies an optimizer (nested or flattened) and no dict under the root holds
    the weights (:func:`inner_state_dict`). None otherwise."""
    if not isinstance(root, dict) or not all(isinstance(key, str) for key in root):
        return None
    tensors = [key for key, value in root.items() if isinstance(value, Tensor)]
    if not tensors or len(tensors) == len(root) or not any(any_optimizer(value) for value in root.values()):
        return None
    # (a root of hundreds of weights and three such keys is a state_dict by count; of a few, a dict under it
    # holding more tensors than the root's own is the model: the root's are the loss, a counter)
    if tensor_items(root) is None and inner_state_dict(root) is not None:
        return None
    return tensors


def root_model(root: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """The model weights at the root (:func:`root_model_keys`) as a state_dict of their own, in the root's order."""
    return {key: root[key] for key in keys}


def is_scheduler(value: Any) -> bool:
    """An LR scheduler's ``state_dict()``."""
    return isinstance(value, dict) and "last_epoch" in value and ("base_lrs" in value or "_step_count" in value)


def state_dicts(root: Any) -> list[tuple[KeyPath, Any]]:
    """State_dict-like values near the root (not inside optimizers), shallowest first; each object once."""
    found: list[tuple[KeyPath, Any]] = []
    seen: set[int] = set()
    queue: deque[tuple[KeyPath, Any]] = deque([((), root)])
    while queue:
        path, value = queue.popleft()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if tensor_items(value) is not None:
            found.append((path, value))
            continue
        if len(path) >= SEARCH_DEPTH or any_optimizer(value) or not isinstance(value, (dict, Opaque)):
            continue
        entries = value.items() if isinstance(value, dict) else module_children(value) if value.is_module else []
        queue.extend(((*path, k), v) for k, v in entries if isinstance(v, (dict, Opaque)))
    return found


def inner_state_dict(root: Any) -> KeyPath | None:
    """The path of the model weights inside a training checkpoint (None if the root is them)."""
    if tensor_items(root) is not None and not (isinstance(root, Opaque) and root.is_module):
        return None
    if isinstance(root, Opaque) and root.is_module:
        return ()
    direct = sum(1 for v in root.values() if isinstance(v, Tensor)) if isinstance(root, dict) else 0
    candidates = [(path, value) for path, value in state_dicts(root) if path]
    if direct:
        # tensors beside the weights ({"model_state_dict": ..., "loss": tensor(0.25)}, a folder's bare RNG state
        # file): the weights are a dict under the root that holds more tensors than the root itself does
        candidates = [(path, value) for path, value in candidates if len(tensor_items(value) or []) > direct]
    if not candidates:
        return None

    def rank(item: tuple[KeyPath, Any]) -> tuple[int, int, int]:
        path, value = item
        name = str(getattr(path[-1], "name", path[-1])).lower()
        preferred = INNER_NAMES.index(name) if name in INNER_NAMES else len(INNER_NAMES)
        ema = 1 if "ema" in name else 0
        return (ema, preferred, -len(tensor_items(value) or []))

    return min(candidates, key=rank)[0]
