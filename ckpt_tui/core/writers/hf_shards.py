"""Hugging Face sharded output: ``model-00001-of-00003.safetensors`` files and ``model.safetensors.index.json``.

Tensors are split as ``huggingface_hub.split_torch_state_dict_into_shards`` splits them: in order,
a new shard when the next tensor would pass the limit, a tensor larger than the limit alone in its
own shard, tied tensors with the first of their group. Each shard goes through the verified writer
(:func:`~ckpt_tui.core.writers.save.save`) into a temporary folder beside the target, which is
renamed into place only once every shard and the index are written: the folder appears whole or not
at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt_tui.core.errors import WriteError
from ckpt_tui.core.model.tree import Tensor, view_key
from ckpt_tui.core.runtime.safe_text import printable_path
from ckpt_tui.core.writers import temp_files
from ckpt_tui.core.writers.save import WriteResult, save
from ckpt_tui.core.writers.target import check_folder_target

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})


def parse_size(text: str) -> int:
    """``5GB`` → 5·10⁹, ``500MiB`` → 500·2²⁰, ``1000`` → 1000 bytes (as transformers reads it)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)?\s*", text.upper())
    if match is None:
        raise WriteError(f"--max-shard-size {text!r}: expected a size such as 5GB, 500MB or 2GiB")
    size = int(float(match.group(1)) * _UNITS[match.group(2) or ""])
    if size <= 0:
        raise WriteError(f"--max-shard-size {text!r}: must be more than 0 bytes")
    return size


def plan_shards(root: dict[str, Tensor], max_bytes: int) -> list[list[str]]:
    """Key names per shard, split as huggingface_hub splits a state_dict."""
    shards: list[list[str]] = []
    current: list[str] = []
    current_bytes = 0
    tied: dict[tuple[Any, ...], list[str]] = {}
    for key, tensor in root.items():
        view = view_key(tensor)
        if view in tied:
            tied[view].append(key)
            continue
        tied[view] = [key]
        if tensor.nbytes > max_bytes:
            shards.append([key])
            continue
        if current and current_bytes + tensor.nbytes > max_bytes:
            shards.append(current)
            current, current_bytes = [], 0
        current.append(key)
        current_bytes += tensor.nbytes
    if current:
        shards.append(current)
    for keys in tied.values():
        shard = next(s for s in shards if keys[0] in s)
        shard.extend(keys[1:])
    return shards


@dataclass
class ShardedResult:
    """What a sharded write produced."""

    folder: str
    shards: list[WriteResult]
    total_size: int
    copied: list[str] = field(default_factory=list)
    """The model's config files copied beside the shards (``config.json``, ``generation_config.json``)."""

    def line(self) -> str:
        """One line for the user."""
        index = f" and {INDEX_NAME}" if len(self.shards) > 1 else ""
        copied = f", {', '.join(self.copied)} copied from the source" if self.copied else ""
        folder = printable_path(str(self.folder))
        return (
            f"wrote {folder}: {len(self.shards)} safetensors shards{index}, {self.total_size} bytes of tensors{copied}"
        )


def save_hf_shards(
    root: Any, folder: str | os.PathLike[str], max_bytes: int, configs: Sequence[str] = ()
) -> ShardedResult:
    """Write a flat state_dict as HF safetensors shards plus the index, atomically as a folder, with the
    model's config files (``configs``, paths) copied beside them as ``save_pretrained`` writes them."""
    if not isinstance(root, dict) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in root.items()):
        raise WriteError("sharded safetensors hold one flat dict of tensors; use --extract (or --drop) first")
    target = check_folder_target(folder)
    parent = target.parent if str(target.parent) else Path(".")
    plan = plan_shards(root, max_bytes)
    count = len(plan)
    names = [SINGLE_NAME] if count == 1 else [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]
    try:
        temp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent))
    except OSError as exc:
        raise WriteError(f"cannot write in {parent}: {exc.strerror or exc}") from None
    # (SIGTERM and SIGHUP remove it with its finished shards, as they remove a single file's temporary)
    temp_files.register(str(temp))
    try:
        results = [
            save({k: root[k] for k in keys}, temp / name, "safetensors") for keys, name in zip(plan, names, strict=True)
        ]
        total = sum(_unique_bytes(root, keys) for keys in plan)
        if count > 1:
            weight_map = {  # tied copies are recorded in their shard's __metadata__, not stored twice
                key: name
                for keys, name, result in zip(plan, names, results, strict=True)
                for key in keys
                if key not in result.aliases
            }
            index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
            with open(temp / INDEX_NAME, "w", encoding="utf-8") as file:
                file.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
                file.flush()
                os.fsync(file.fileno())
        for config in configs:
            shutil.copyfile(config, temp / os.path.basename(config))
        os.chmod(temp, 0o755 & ~_umask())
        _rename_into_place(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(temp)
        raise
    finally:
        temp_files.unregister(str(temp))
    for result, name in zip(results, names, strict=True):
        result.path = str(target / name)
    return ShardedResult(str(target), results, total, [os.path.basename(config) for config in configs])


def _rename_into_place(temp: Path, target: Path) -> None:
    """Rename the finished folder over an empty one (or a new name); fails, nothing lost, if the target
    became something else meanwhile (a file, a link, a folder with files)."""
    check_folder_target(target)
    try:
        os.rename(temp, target)
    except OSError as exc:
        raise WriteError(f"cannot write {target}: {exc.strerror or exc}; the shards were not kept") from None


def _unique_bytes(root: dict[str, Tensor], keys: list[str]) -> int:
    views = {view_key(t): t.nbytes for t in (root[k] for k in keys)}
    return sum(views.values())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
