"""Pure edits: each takes a tree and returns a new tree plus a record of what changed.

The input tree is never modified; unchanged subtrees are shared between old and new, so
keeping every version for undo costs little.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ckpt_tui.core.dtypes import DTYPES
from ckpt_tui.core.errors import EditError
from ckpt_tui.core.keypath import Attr, Key, KeyPath, key_text, to_python
from ckpt_tui.core.state_dicts import common_prefix, flat_module_items, inner_state_dict, tensor_items
from ckpt_tui.core.tree import Opaque, Storage, Tensor, TorchSize, get, iter_tensors

CASTABLE = frozenset({"float64", "float32", "float16", "bfloat16"})
EXAMPLES = 5


@dataclass
class Change:
    """What an edit did: a title, how many things changed, and a few ``old → new`` examples."""

    title: str
    count: int
    examples: list[tuple[str, str]] = field(default_factory=list)

    def lines(self) -> list[str]:
        """Human lines: the title with its count, then the examples."""
        out = [f"{self.title}: {self.count} changed"]
        out += [f"  {old} → {new}" for old, new in self.examples]
        if self.examples and self.count > len(self.examples):
            out.append(f"  … and {self.count - len(self.examples)} more")
        return out


Result = tuple[Any, Change]


# ---- rebuilding along a path ------------------------------------------------------------


def copy_dict(source: dict[Any, Any], items: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """A dict of the same type as ``source`` (OrderedDict stays OrderedDict), keeping ``_metadata``."""
    new: dict[Any, Any] = OrderedDict(items) if isinstance(source, OrderedDict) else dict(items)
    metadata = getattr(source, "_metadata", None)
    if metadata is not None:
        new._metadata = metadata  # type: ignore[attr-defined]
    return new


def replace_child(parent: Any, key: Key, value: Any) -> Any:
    """A copy of ``parent`` with the child at ``key`` replaced."""
    if isinstance(parent, dict) and not isinstance(key, Attr):
        return copy_dict(parent, [(k, value if k == key else v) for k, v in parent.items()])
    if isinstance(parent, list) and isinstance(key, int):
        return [value if i == key else v for i, v in enumerate(parent)]
    if isinstance(parent, tuple) and isinstance(key, int):
        return type(parent)(value if i == key else v for i, v in enumerate(parent))
    if isinstance(parent, Opaque) and isinstance(key, Attr):
        return _replace_in_opaque(parent, key.name, value)
    raise EditError(f"cannot edit inside a {type(parent).__name__}")


def _replace_in_opaque(parent: Opaque, name: str, value: Any) -> Opaque:
    new = type(parent).__new__(type(parent), *parent.args)
    new.how, new.items, new.list_items, new.callee = parent.how, parent.items, parent.list_items, parent.callee
    state = dict(parent.state) if isinstance(parent.state, dict) else parent.state
    if parent.is_module:
        for group in ("_parameters", "_buffers", "_modules"):
            entries = state.get(group)
            if isinstance(entries, dict) and name in entries:
                state[group] = replace_child(entries, name, value)
                break
    elif isinstance(state, dict) and name in state:
        state[name] = value
    else:
        raise EditError(f"no attribute {name!r} to edit")
    new.state = state
    return new


def replace_at(root: Any, path: KeyPath, value: Any) -> Any:
    """A new root with the value at ``path`` replaced (ancestors copied, the rest shared)."""
    if not path:
        return value
    parent = get(root, path[:-1])
    return replace_at(root, path[:-1], replace_child(parent, path[-1], value))


def _describe(path: KeyPath) -> str:
    return to_python(path) if path else "the root"


# ---- key renames ------------------------------------------------------------------------


def default_target(root: Any) -> KeyPath:
    """The dict an edit of keys applies to by default: the root state_dict or the detected inner one."""
    if tensor_items(root) is not None and not isinstance(root, Opaque):
        return ()
    inner = inner_state_dict(root)
    if inner:
        return inner
    raise EditError("no state_dict found to edit; choose one (--at PATH)")


def _rename_keys(root: Any, path: KeyPath, rename: Callable[[str], str | None], title: str) -> Result:
    target = get(root, path)
    if not isinstance(target, dict):
        raise EditError(f"{_describe(path)} is not a dict")
    items: list[tuple[Any, Any]] = []
    seen: dict[Any, Any] = {}
    examples: list[tuple[str, str]] = []
    changed = 0
    for key, value in target.items():
        new_key = rename(key) if isinstance(key, str) else None
        if new_key is not None and new_key != key:
            changed += 1
            if len(examples) < EXAMPLES:
                examples.append((key, new_key))
        else:
            new_key = key
        if new_key in seen:
            raise EditError(f"renaming would make {seen[new_key]!r} and {key!r} both {new_key!r}")
        seen[new_key] = key
        items.append((new_key, value))
    if not changed:
        raise EditError(f"{title}: no key of {_describe(path)} changes")
    new = copy_dict(target, items)
    return replace_at(root, path, new), Change(f"{title} in {_describe(path)}", changed, examples)


def strip_prefix(root: Any, prefix: str, path: KeyPath | None = None) -> Result:
    """Remove ``prefix`` from the keys that start with it (and from ``_metadata``, as torch does)."""
    where = default_target(root) if path is None else path
    target = get(root, where)
    if prefix == "auto":
        items = tensor_items(target) or []
        prefix = common_prefix(k for k, _ in items) or ""
        if not prefix:
            raise EditError(f"no common key prefix in {_describe(where)}")
    if not prefix:
        raise EditError("the prefix is empty")
    new_root, change = _rename_keys(
        root, where, lambda k: k[len(prefix) :] if k.startswith(prefix) else None, f"strip {prefix!r}"
    )
    _strip_metadata(get(new_root, where), prefix)
    return new_root, change


def _strip_metadata(state: Any, prefix: str) -> None:
    """``consume_prefix_in_state_dict_if_present``'s rule for ``_metadata``, on a fresh copy."""
    metadata = getattr(state, "_metadata", None)
    if metadata is None:
        return
    new = OrderedDict(metadata)
    for key in list(new):
        if key and (key == prefix.replace(".", "") or key.startswith(prefix)):
            new[key[len(prefix) :]] = new.pop(key)
    state._metadata = new


def add_prefix(root: Any, prefix: str, path: KeyPath | None = None) -> Result:
    """Put ``prefix`` in front of every key (and every ``_metadata`` entry)."""
    if not prefix:
        raise EditError("the prefix is empty")
    where = default_target(root) if path is None else path
    new_root, change = _rename_keys(root, where, lambda k: prefix + k, f"add {prefix!r}")
    state = get(new_root, where)
    metadata = getattr(state, "_metadata", None)
    if metadata is not None:
        bare = prefix.rstrip(".")
        state._metadata = OrderedDict(((prefix + k) if k else bare, v) for k, v in metadata.items())
    return new_root, change


def rename(root: Any, path: KeyPath, new_name: str) -> Result:
    """Rename one key, keeping its place."""
    if not path:
        raise EditError("the root has no name to change")
    old = path[-1]
    if not isinstance(old, str):
        raise EditError(f"{_describe(path)} is not a named key")
    return _rename_keys(root, path[:-1], lambda k: new_name if k == old else None, f"rename {old!r}")


def delete(root: Any, path: KeyPath) -> Result:
    """Remove a key or a whole subtree (e.g. the optimizer)."""
    if not path:
        raise EditError("cannot delete the root")
    parent, key = get(root, path[:-1]), path[-1]
    if isinstance(parent, dict) and key in parent:
        new: Any = copy_dict(parent, [(k, v) for k, v in parent.items() if k != key])
        metadata = getattr(parent, "_metadata", None)
        if metadata is not None:
            new._metadata = metadata
    elif isinstance(parent, list) and isinstance(key, int):
        new = [v for i, v in enumerate(parent) if i != key]
    else:
        raise EditError(f"cannot delete {_describe(path)}")
    return replace_at(root, path[:-1], new), Change(f"delete {_describe(path)}", 1, [(key_text(key), "(deleted)")])


# ---- extraction -------------------------------------------------------------------------


def module_state_dict(module: Opaque) -> OrderedDict[str, Any]:
    """A pickled ``nn.Module``'s ``state_dict()``, built from its pickled state."""
    return OrderedDict(flat_module_items(module))


def extract(root: Any, path: KeyPath | str) -> Result:
    """Make a subtree the new root (``auto``: the detected inner state_dict; modules: their state_dict)."""
    if path == "auto":
        found = inner_state_dict(root)
        if found is None:
            raise EditError("no inner state_dict found to extract")
        path = found
    assert not isinstance(path, str)
    value = get(root, path)
    if isinstance(value, Opaque) and value.is_module:
        value = module_state_dict(value)
        title = f"extract the state_dict of the module at {_describe(path)}"
    elif not path:
        raise EditError("the root is already the root")
    else:
        title = f"extract {_describe(path)}"
    tensors = sum(1 for _ in iter_tensors(value))
    return value, Change(f"{title} ({tensors} tensors)", 1)


# ---- tensors: devices and dtypes ----------------------------------------------------------


def map_tensors(root: Any, convert: Callable[[Tensor], Tensor | None]) -> tuple[Any, int]:
    """A new tree with ``convert`` applied to every tensor (None keeps it); containers copied as needed."""
    memo: dict[int, Any] = {}
    changed = 0

    def visit(value: Any) -> Any:
        nonlocal changed
        if id(value) in memo:
            return memo[id(value)]
        result = value
        if isinstance(value, Tensor):
            new = convert(value)
            if new is not None:
                changed += 1
                result = new
        elif isinstance(value, dict):
            items = [(k, visit(v)) for k, v in value.items()]
            if any(new is not old for (_, new), old in zip(items, value.values(), strict=True)):
                result = copy_dict(value, items)
        elif isinstance(value, (list, tuple)) and not isinstance(value, TorchSize):
            kids = [visit(v) for v in value]
            if any(new is not old for new, old in zip(kids, value, strict=True)):
                result = kids if isinstance(value, list) else type(value)(kids)
        elif isinstance(value, Opaque):
            result = _map_opaque(value, visit)
        memo[id(value)] = result
        return result

    return visit(root), changed


def _map_opaque(value: Opaque, visit: Callable[[Any], Any]) -> Opaque:
    args = tuple(visit(a) for a in value.args)
    state = visit(value.state)
    items = {k: visit(v) for k, v in value.items.items()}
    list_items = [visit(v) for v in value.list_items]
    same = (
        all(a is b for a, b in zip(args, value.args, strict=True))
        and state is value.state
        and all(items[k] is v for k, v in value.items.items())
        and all(a is b for a, b in zip(list_items, value.list_items, strict=True))
    )
    if same:
        return value
    new = type(value).__new__(type(value), *args)
    new.how, new.state, new.items, new.list_items, new.callee = value.how, state, items, list_items, value.callee
    return new


def parse_device_map(spec: str) -> Callable[[str], str]:
    """``cpu``, ``cuda:0``, or ``cuda:1=cuda:0,cuda:2=cpu`` as a function of the saved location."""
    spec = spec.strip()
    if not spec:
        raise EditError("empty device mapping")
    if "=" not in spec:
        _check_device(spec)
        return lambda location: spec
    mapping: dict[str, str] = {}
    for part in spec.split(","):
        source, _, target = part.partition("=")
        source, target = source.strip(), target.strip()
        _check_device(source)
        _check_device(target)
        mapping[source] = target
    return lambda location: mapping.get(location, location)


def _check_device(text: str) -> None:
    kind, _, index = text.partition(":")
    if kind not in {"cpu", "cuda", "mps", "xpu", "meta", "hpu", "npu", "xla"} or (index and not index.isdigit()):
        raise EditError(f"not a device: {text!r} (expected cpu, cuda:N, ...)")


def remap_devices(root: Any, spec: str) -> Result:
    """Rewrite the saved location tags; shared storages stay shared."""
    target = parse_device_map(spec)
    storages: dict[int, Storage] = {}
    examples: dict[tuple[str, str], None] = {}

    def convert(tensor: Tensor) -> Tensor | None:
        if tensor.sparse is not None or tensor.quantizer is not None:
            return _with_parts_moved(tensor, move)
        return move(tensor)

    def move(tensor: Tensor) -> Tensor | None:
        storage = tensor.storage
        if storage is None:
            return None
        new_location = target(storage.location)
        if new_location == storage.location:
            return None
        examples.setdefault((storage.location, new_location))
        new_storage = storages.get(id(storage))
        if new_storage is None:
            new_storage = storages[id(storage)] = dataclasses.replace(storage, location=new_location)
        return dataclasses.replace(tensor, storage=new_storage)

    new_root, changed = map_tensors(root, convert)
    if not changed:
        raise EditError(f"no tensor changes device with {spec!r}")
    moves = ", ".join(f"{a} → {b}" for a, b in examples)
    return new_root, Change(f"map devices ({moves})", changed)


def _with_parts_moved(tensor: Tensor, move: Callable[[Tensor], Tensor | None]) -> Tensor | None:
    """A sparse or quantized tensor with ``move`` applied to its own storage and to its component tensors."""

    def moved(parts: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
        if parts is None:
            return None
        return tuple((move(p) or p) if isinstance(p, Tensor) else p for p in parts)

    sparse, quantizer = moved(tensor.sparse), moved(tensor.quantizer)
    base = move(tensor) or tensor
    if base is tensor and sparse == tensor.sparse and quantizer == tensor.quantizer:
        return None
    return dataclasses.replace(base, sparse=sparse, quantizer=quantizer)


class CastSource:
    """Where a cast storage's bytes come from: another storage, converted when saved."""

    def __init__(self, base: Storage) -> None:
        self.base = base
        self.path = ""

    def locate(self, storage: Storage) -> tuple[int, int]:
        """Cast bytes exist only in the saved file."""
        raise EditError("the values of a cast tensor exist once it is saved")


def cast(root: Any, dtype: str) -> Result:
    """Cast floating-point tensors (fp64/fp32/fp16/bf16) to ``dtype``; the bytes convert when saved."""
    if dtype not in CASTABLE:
        raise EditError(f"cannot cast to {dtype!r} (choose float16, bfloat16 or float32)")
    storages: dict[int, Storage | None] = {}
    examples: dict[tuple[str, str], None] = {}

    def convert(tensor: Tensor) -> Tensor | None:
        storage = tensor.storage
        if storage is None or tensor.dtype not in CASTABLE or tensor.dtype == dtype or storage.dtype != tensor.dtype:
            return None
        if id(storage) not in storages:
            storages[id(storage)] = Storage(
                storage.key, dtype, storage.location, storage.numel, CastSource(storage), DTYPES[dtype][1] or ""
            )
        new_storage = storages[id(storage)]
        assert new_storage is not None
        examples.setdefault((tensor.dtype, dtype))
        return dataclasses.replace(tensor, storage=new_storage, dtype=dtype)

    new_root, changed = map_tensors(root, convert)
    if not changed:
        raise EditError(f"no floating-point tensor to cast to {dtype}")
    casts = ", ".join(f"{a} → {b}" for a, b in examples)
    return new_root, Change(f"cast tensors ({casts})", changed)
