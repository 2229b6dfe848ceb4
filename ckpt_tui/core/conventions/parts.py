"""What takes the bytes: a checkpoint's tensor bytes split into model, optimizer, EMA and everything else.

Each top-level entry of a training checkpoint is one part, classified with the detection the rest of
ckpt-tui uses (:mod:`ckpt_tui.core.conventions.state_dicts`): the detected model state_dict, optimizer state
(``optimizer.state_dict()`` values, or entries named ``optim…``: Lightning's ``optimizer_states``,
DeepSpeed's), EMA copies (``ema``, ``model_ema``, ``state_dict_ema``…), and the rest (schedulers,
configs, buffers). A checkpoint that is itself a state_dict is all model. Bytes are those of distinct
storages, each counted once, in the part listed first (model, optimizer, EMA, other).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ckpt_tui.core.conventions.state_dicts import inner_state_dict, is_optimizer, tensor_items
from ckpt_tui.core.model.keypath import KeyPath, key_text
from ckpt_tui.core.model.tree import Opaque, Tensor, children, walk

PART_NAMES = ("model", "optimizer", "EMA", "other")


@dataclass
class Part:
    """One part of the checkpoint: its top-level paths and the bytes of the storages below them."""

    name: str
    paths: list[KeyPath] = field(default_factory=list)
    nbytes: int = 0
    tensors: int = 0


@dataclass
class Parts:
    """The parts in :data:`PART_NAMES` order (empty ones included) and their total."""

    parts: list[Part]

    @property
    def total(self) -> int:
        """Bytes of every distinct storage."""
        return sum(part.nbytes for part in self.parts)

    def get(self, name: str) -> Part:
        """The part named ``name``."""
        return next(part for part in self.parts if part.name == name)

    def without(self, name: str) -> int:
        """Tensor bytes left once the part ``name`` is dropped."""
        return self.total - self.get(name).nbytes


def classify(key: Any, value: Any, model: KeyPath | None) -> str:
    """The part a top-level entry belongs to."""
    name = key_text(key).lower()
    if model is not None and model[:1] == (key,):
        return "model"
    if is_optimizer(value) or "optim" in name or _holds_optimizers(value):
        return "optimizer"
    if "ema" in name.replace("-", "_").split("_") or name.startswith("ema") or name.endswith("ema"):
        return "EMA"
    return "other"


def _holds_optimizers(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(is_optimizer(item) for item in value)


def _first_state_dict(root: Any) -> KeyPath | None:
    """The first top-level state_dict that is not an EMA copy (the model, when detection found none)."""
    for key, value in children(root):
        if tensor_items(value) is not None and classify(key, value, None) == "other":
            return (key,)
    return None


def split_parts(root: Any) -> Parts:
    """The checkpoint's tensor bytes by part."""
    parts = {name: Part(name) for name in PART_NAMES}
    model = inner_state_dict(root)
    is_container = isinstance(root, dict) or (isinstance(root, Opaque) and not root.is_module)
    if model == () or tensor_items(root) is not None or not is_container:
        entries: list[tuple[KeyPath, str]] = [((), "model")]
    else:
        model = model or _first_state_dict(root)
        entries = [((key,), classify(key, value, model)) for key, value in children(root)]
    entries.sort(key=lambda entry: PART_NAMES.index(entry[1]))
    seen: set[int] = set()
    for path, name in entries:
        part = parts[name]
        part.paths.append(path)
        start = _value_at(root, path)
        for _, value, shown, first in walk(start, path):
            if not (shown and first and isinstance(value, Tensor)):
                continue
            part.tensors += 1
            storage = value.storage
            if storage is not None and id(storage) not in seen:
                seen.add(id(storage))
                part.nbytes += storage.nbytes
    for part in parts.values():
        part.paths.sort(key=lambda path: [key_text(k) for k in path])
    return Parts(list(parts.values()))


def _value_at(root: Any, path: KeyPath) -> Any:
    for key, value in children(root) if path else []:
        if key == path[0]:
            return value
    return root
