"""Per-rank files opened together: FSDP1 ShardedTensors, FSDP2/DTensor state_dicts, DDP copies.

Each rank's file is read on its own (safe unpickler, torch's class names known as inert data). A
``ShardedTensor`` carries the boxes of every shard; a ``DTensor`` carries its mesh coordinate and
placements (``Shard(dim)`` splits like ``torch.chunk``, ``Replicate`` copies). With every rank's file,
each becomes one logical tensor assembled from the local shards; alone, a file shows its own shards.
Files without sharded values (DDP: each rank saves a copy) are shown side by side, one per rank.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.assembled import AssembledRecords, Piece, box_text
from ckpt_tui.core.model.contained import inside, named_entry
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.tree import Checkpoint, Opaque, Storage, Symbol, Tensor

DTENSOR = "torch.distributed.tensor.DTensor"
SHARDED_TENSOR = "torch.distributed._shard.sharded_tensor.api.ShardedTensor"
WRAPPER = "torch._utils._rebuild_wrapper_subclass"
MAX_DEPTH = 100


@dataclass
class LocalShard:
    """One box of a logical tensor held by one rank's file."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    tensor: Tensor
    where: str


@dataclass
class Sharded:
    """A ShardedTensor or DTensor as one rank saved it."""

    kind: str
    shape: tuple[int, ...]
    dtype: str
    requires_grad: bool
    shards: list[LocalShard]
    world: int
    saved: Any = field(default=None, repr=False)
    """The value as the file holds it (an opaque ShardedTensor or DTensor)."""


def _fields(value: Any) -> dict[str, Any]:
    """An object's saved fields, whether pickled as a dict or as (dict, slots) state."""
    state = value.state if isinstance(value, Opaque) else None
    if isinstance(state, dict):
        return state
    if isinstance(state, tuple) and len(state) == 2:
        merged: dict[str, Any] = {}
        for part in state:
            if isinstance(part, dict):
                merged.update(part)
        return merged
    return {}


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not all(type(n) is int and n >= 0 for n in value):
        raise ReadError(f"{what}: malformed sizes or offsets")
    return tuple(value)


def _class_name(value: Any) -> str | None:
    if isinstance(value, Opaque) and value.global_name == WRAPPER and value.args:
        cls = value.args[0]
        name = getattr(cls, "global_name", None)
        if name in (DTENSOR, "torch.distributed.tensor._api.DTensor"):
            return DTENSOR
        if name == SHARDED_TENSOR:
            return SHARDED_TENSOR
    return None


def parse_sharded(value: Any, where: str) -> Sharded | None:
    """The sharded tensor a value stands for, or None when it is not one."""
    kind = _class_name(value)
    if kind is None:
        return None
    assert isinstance(value, Opaque)
    args = value.args
    if len(args) < 8 or not isinstance(args[1], Symbol):
        raise ReadError(f"{where}: malformed {kind.rsplit('.', 1)[-1]}")
    shape, dtype, requires_grad = _ints(args[2], where), args[1].name, args[7] is True
    if kind == SHARDED_TENSOR:
        return _sharded_tensor(value, shape, dtype, requires_grad, where)
    return _dtensor(value, shape, dtype, requires_grad, where)


def _sharded_tensor(value: Opaque, shape: tuple[int, ...], dtype: str, grad: bool, where: str) -> Sharded:
    state = value.state
    if not isinstance(state, tuple) or len(state) < 2 or not isinstance(state[0], list):
        raise ReadError(f"{where}: ShardedTensor without its local shards")
    total = _fields(state[1]).get("shards_metadata")
    world = len(total) if isinstance(total, list) else 1
    shards = []
    for shard in state[0]:
        fields = _fields(shard)
        tensor, meta = fields.get("tensor"), _fields(fields.get("metadata"))
        if not isinstance(tensor, Tensor):
            raise ReadError(f"{where}: a ShardedTensor shard without its tensor")
        offsets = _ints(meta.get("shard_offsets"), where)
        sizes = _ints(meta.get("shard_sizes"), where)
        shards.append(LocalShard(offsets, sizes, tensor, where))
    return Sharded("ShardedTensor", shape, dtype, grad, shards, world)


def _mesh_sizes(mesh: Any, placements: int) -> tuple[int, ...] | None:
    layout = _fields(mesh).get("_layout")
    axes = _fields(layout).get("axes")
    if isinstance(axes, (tuple, list)) and len(axes) == placements:
        sizes = [math.prod(_fields(axis).get("shape") or (0,)) for axis in axes]
        if all(type(n) is int and n > 0 for n in sizes):
            return tuple(sizes)
    return None


def _dtensor(value: Opaque, shape: tuple[int, ...], dtype: str, grad: bool, where: str) -> Sharded:
    fields = _fields(value)
    local, spec = fields.get("_local_tensor"), _fields(fields.get("_spec"))
    if not isinstance(local, Tensor):
        raise ReadError(f"{where}: DTensor without its local tensor")
    placements = spec.get("placements")
    mesh = _fields(spec.get("mesh"))
    coordinate = mesh.get("_coordinate_on_dim")
    if not isinstance(placements, tuple) or not isinstance(coordinate, tuple) or len(coordinate) != len(placements):
        raise ReadError(f"{where}: DTensor without placements or mesh coordinate")
    sizes = _mesh_sizes(spec.get("mesh"), len(placements))
    if sizes is None:
        raise ReadError(f"{where}: DTensor mesh shape is not readable")
    low, high = [0] * len(shape), list(shape)
    for placement, index, count in zip(placements, coordinate, sizes, strict=True):
        name = getattr(placement, "global_name", "")
        if name.endswith("placement_types.Replicate"):
            continue
        if not name.endswith("placement_types.Shard"):
            raise ReadError(f"{where}: DTensor placement {name.rsplit('.', 1)[-1]} cannot be assembled here")
        dim = _fields(placement).get("dim")
        if type(dim) is not int or not 0 <= dim < len(shape) or type(index) is not int:
            raise ReadError(f"{where}: malformed DTensor Shard placement")
        extent = high[dim] - low[dim]
        step = math.ceil(extent / count) if count else 0
        start = min(low[dim] + index * step, high[dim])
        low[dim], high[dim] = start, min(start + step, high[dim])
    box = tuple(h - lo for lo, h in zip(low, high, strict=True))
    if box != local.shape:
        raise ReadError(
            f"{where}: DTensor local shape {list(local.shape)} is not its chunk {list(box)} (uneven sharding)"
        )
    world = math.prod(sizes)
    return Sharded("DTensor", shape, dtype, grad, [LocalShard(tuple(low), box, local, where)], world)


Path = tuple[Any, ...]


def _map(value: Any, replace: Callable[[Any, Path], Any], path: Path = (), memo: dict[int, Any] | None = None) -> Any:
    """A copy of the dict and list containers of ``value`` with ``replace`` applied to every other value.

    Each container is visited once (a container reached by several paths is copied once, at its first
    path), so shared containers cost their size, not their number of paths.
    """
    memo = {} if memo is None else memo
    if len(path) > MAX_DEPTH:
        raise ReadError("a rank file nested too deeply")
    if not isinstance(value, (dict, list)):
        return replace(value, path)
    done = memo.get(id(value))
    if done is not None:
        return done
    if isinstance(value, dict):
        out: Any = type(value)()
        memo[id(value)] = out
        for key, item in value.items():
            out[key] = _map(item, replace, (*path, key), memo)
        return out
    copied: list[Any] = []
    memo[id(value)] = copied
    copied.extend(_map(item, replace, (*path, i), memo) for i, item in enumerate(value))
    return copied


def _text(path: Path) -> str:
    return "/".join(str(key) for key in path) or "(root)"


def sharded_values(root: Any, file: str) -> dict[Path, Sharded]:
    """Every sharded tensor in a state_dict, by its path."""
    found: dict[Path, Sharded] = {}
    for path, value in _sharded_leaves(root):
        sharded = parse_sharded(value, f"{file}: {_text(path)}")
        if sharded is not None:
            for shard in sharded.shards:
                shard.where = os.path.basename(file)
            sharded.saved = value
            found[path] = sharded
    return found


def _only_tensors(value: dict[Any, Any]) -> bool:
    """Whether every value of a dict is a tensor (checked in one pass at C speed)."""
    return set(map(type, value.values())) <= {Tensor}


def _sharded_leaves(root: Any) -> Iterator[tuple[Path, Any]]:
    """Each ShardedTensor/DTensor among the values that are not a dict or list, with its path, in the
    order (and with the depth limit) of :func:`_map`, copying nothing: each container entered once,
    each other value met at each of its paths (50,000 plain tensors cost one type check each)."""
    if not isinstance(root, (dict, list)):
        if _class_name(root) is not None:
            yield (), root
        return
    if isinstance(root, dict) and _only_tensors(root):
        return
    entered = {id(root)}
    stack: list[tuple[Path, Iterator[tuple[Any, Any]]]] = [((), _entries(root))]
    while stack:
        path, entries = stack[-1]
        deep = len(path) >= MAX_DEPTH
        for key, item in entries:
            if deep:
                raise ReadError("a rank file nested too deeply")
            if isinstance(item, (dict, list)):
                if id(item) not in entered:
                    entered.add(id(item))
                    if isinstance(item, dict) and _only_tensors(item):
                        continue  # a plain state_dict: nothing sharded in it
                    stack.append(((*path, key), _entries(item)))
                    break  # its entries first, then the rest of this container's
            elif isinstance(item, Opaque) and _class_name(item) is not None:
                yield (*path, key), item
        else:
            stack.pop()


def _entries(container: dict[Any, Any] | list[Any]) -> Iterator[tuple[Any, Any]]:
    return iter(container.items()) if isinstance(container, dict) else enumerate(container)


def localize(checkpoint: Checkpoint) -> Checkpoint:
    """One rank's file alone: each sharded value becomes its local shard, with a note saying so."""
    found = sharded_values(checkpoint.root, checkpoint.path)
    if not found:
        return checkpoint

    def local(value: Any, path: Path) -> Any:
        sharded = found.get(path)
        if sharded is None or len(sharded.shards) != 1:
            return value
        return sharded.shards[0].tensor

    checkpoint.root = _map(checkpoint.root, local)
    checkpoint.replaced = {path: sharded.saved for path, sharded in found.items()}
    kinds = sorted({s.kind for s in found.values()})
    world = max(s.world for s in found.values())
    checkpoint.notes.append(
        f"one rank of {world}: its {counted(len(found), '/'.join(kinds) + ' value')} show this rank's shard only; "
        f"open every rank's file together to see (and convert) whole tensors"
    )
    checkpoint.partial = (
        f"{os.path.basename(checkpoint.path)} is one rank of {world}: its {'/'.join(kinds)} values are this rank's "
        f"shards, not whole tensors; name every rank's file together to write them whole"
    )
    return checkpoint


def sibling_ranks(path: str, world: int) -> list[str] | None:
    """The other ranks' files beside ``path``: its last number replaced by 0..world-1, when all exist (each
    checked by :func:`~ckpt_tui.core.model.contained.inside`: a FIFO or a link out is refused)."""
    folder, name = os.path.split(places.absolute(path))
    numbers = list(re.finditer(r"\d+", name))
    if not numbers or world < 2:
        return None
    last = numbers[-1]
    names = [name[: last.start()] + str(rank) + name[last.end() :] for rank in range(world)]
    if name not in names or not all(named_entry(places.join(folder, n)) for n in names):
        return None
    return [inside(folder, n, f"{path}: the rank file") for n in names]


def merge_ranks(paths: list[str], checkpoints: list[Checkpoint]) -> Checkpoint:
    """Several rank files as one checkpoint: sharded values assembled, or (DDP copies) side by side."""
    found = [sharded_values(c.root, p) for p, c in zip(paths, checkpoints, strict=True)]
    total = sum(c.file_bytes for c in checkpoints)
    unsafe = set().union(*(c.unsafe_globals for c in checkpoints))
    if not any(found):
        names = [os.path.basename(p) for p in paths]
        labels = names if len(set(names)) == len(names) else paths
        root = {label: c.root for label, c in zip(labels, checkpoints, strict=True)}
        note = (
            f"{counted(len(paths), 'rank file')} side by side (no sharded tensors: each rank saved a copy); "
            "diff them to compare"
        )
        layout = f"copies per rank (DDP-style), {counted(len(paths), 'rank')}"
        return Checkpoint(
            paths[0], "ranks", root, total, notes=[note], unsafe_globals=unsafe, layout=layout, files=list(paths)
        )
    keys = set(found[0])
    for file, each in zip(paths, found, strict=True):
        if set(each) != keys:
            raise ReadError(f"{file}: holds other sharded keys than {paths[0]} (not ranks of one checkpoint)")
    source = AssembledRecords(paths[0])
    merged: dict[Path, Tensor] = {}
    for where in found[0]:
        merged[where] = _assemble(_text(where), [each[where] for each in found], source)
    fragments = _rank_fragments(paths, checkpoints, merged, source)
    root = _map(checkpoints[0].root, lambda value, path: merged.get(path, fragments.get(path, value)))
    kinds = sorted({s.kind for s in found[0].values()})
    notes = [
        f"{counted(len(paths), 'rank file')}: {counted(len(merged), '/'.join(kinds) + ' value')} assembled from "
        f"their shards; other values from {os.path.basename(paths[0])}"
    ]
    if fragments:
        notes.append(
            f"{counted(len(fragments), 'tensor')} saved as each rank's flat piece (FSDP LOCAL_STATE_DICT with "
            "use_orig_params): joined in rank order into a flat vector of the parameter's elements; its shape is "
            "not saved in these files"
        )
    flat = any(str(path[-1]).endswith("_flat_param") for path in merged if path)
    if flat and fragments:
        notes.append("FSDP LOCAL_STATE_DICT: _flat_param is FSDP's flattened (padded) parameter, the others joined")
    elif flat:
        notes.append(
            "FSDP LOCAL_STATE_DICT: _flat_param is FSDP's flattened (padded) parameter; the original parameters' "
            "names and shapes are not saved in these files, so they cannot be rebuilt from them"
        )
    layout = (
        f"{_framework(kinds, flat)}, {counted(len(paths), 'rank')}, {'/'.join(kinds)}; weights: {_weights_at(merged)}"
    )
    merged_checkpoint = Checkpoint(
        paths[0], "ranks", root, total, notes=notes, unsafe_globals=unsafe, layout=layout, files=list(paths)
    )
    merged_checkpoint.replaced = {path: sharded.saved for path, sharded in found[0].items()}
    return merged_checkpoint


def _leaf_tensors(root: Any) -> dict[Path, Tensor]:
    """Every tensor among a rank file's values, by its path (as :func:`_map` walks it)."""
    found: dict[Path, Tensor] = {}

    def keep(value: Any, path: Path) -> Any:
        if isinstance(value, Tensor):
            found[path] = value
        return value

    _map(root, keep)
    return found


def _rank_fragments(
    paths: list[str], checkpoints: list[Checkpoint], merged: dict[Path, Tensor], source: AssembledRecords
) -> dict[Path, Tensor]:
    """The plain tensors that are not one copy per rank, joined: where ranks hold one key in other shapes, each
    1-D (FSDP1's LOCAL_STATE_DICT with use_orig_params saves each parameter as every rank's flat piece of it), the
    pieces in rank order; a key whose ranks disagree otherwise is refused, never shown as rank 0's."""
    leaves = [_leaf_tensors(c.root) for c in checkpoints]
    joined: dict[Path, Tensor] = {}
    for path, first in leaves[0].items():
        if path in merged:
            continue
        every = [each.get(path) for each in leaves]
        if all(isinstance(t, Tensor) and t.shape == first.shape for t in every):
            continue
        tensors = [t for t in every if isinstance(t, Tensor) and len(t.shape) == 1 and t.dtype == first.dtype]
        if len(tensors) != len(every):
            raise ReadError(
                f"{_text(path)}: the rank files hold it in other shapes or types (not ranks of one checkpoint)"
            )
        ranks, start = [], 0
        for tensor, file in zip(tensors, paths, strict=True):
            shard = LocalShard((start,), tensor.shape, tensor, os.path.basename(file))
            ranks.append(Sharded("flat pieces", (0,), first.dtype, first.requires_grad, [shard], len(paths)))
            start += tensor.shape[0]
        for sharded in ranks:
            sharded.shape = (start,)
        joined[path] = _assemble(_text(path), ranks, source)
    return joined


def _weights_at(merged: dict[Path, Tensor]) -> str:
    """The dict that holds the most assembled tensors directly (the model's; optimizer states hold a few
    per parameter), as a Python path."""
    counts = Counter(path[:-1] for path in merged)
    best = max(counts, key=lambda parent: (counts[parent], -len(parent)))
    return "ckpt" + "".join(f"[{key!r}]" for key in best) if best else "the root"


def _framework(kinds: list[str], flat: bool) -> str:
    """Who writes such values: FSDP1 is the one writer of ShardedTensor state_dicts today."""
    if flat:
        return "FSDP1 local (flat parameters)"
    if kinds == ["ShardedTensor"]:
        return "FSDP1 sharded"
    return "sharded state_dict (FSDP2, or FSDP1 with a device mesh)"


def rank_folder(folder: str, names: list[str]) -> list[str] | None:
    """The paths of a folder's files when they are one set of rank files (``rank0.pt``, ``rank1.pt``...)."""
    if len(names) < 2:
        return None
    paths = [places.join(folder, name) for name in names]
    for path in paths:
        siblings = sibling_ranks(path, len(paths))
        if siblings is not None and set(siblings) == {places.absolute(p) for p in paths}:
            return siblings
    return None


def holds_sharded(checkpoint: Checkpoint) -> bool:
    """Whether a file holds ShardedTensor or DTensor values."""
    return bool(sharded_values(checkpoint.root, checkpoint.path))


def _stored(tensor: Tensor) -> Callable[[], Tensor]:
    return lambda: tensor


def _assemble(where: str, ranks: list[Sharded], source: AssembledRecords) -> Tensor:
    first = ranks[0]
    if any(r.shape != first.shape or r.dtype != first.dtype or r.kind != first.kind for r in ranks):
        raise ReadError(f"{where}: ranks disagree on its shape or dtype")
    if len(ranks) != first.world:
        raise ReadError(f"{where}: sharded over {counted(first.world, 'rank')}, {counted(len(ranks), 'file')} given")
    pieces: dict[tuple[tuple[int, ...], tuple[int, ...]], Piece] = {}
    for sharded in ranks:
        for shard in sharded.shards:
            box = (shard.offsets, shard.sizes)
            if box not in pieces and 0 not in shard.sizes:  # replicated copies: the first one
                label = f"{os.path.basename(shard.where)} {box_text(*box)}"
                pieces[box] = Piece(shard.offsets, shard.sizes, label, _stored(shard.tensor))
    name = where
    storage = Storage(name, first.dtype, "cpu", math.prod(first.shape), source)
    source.add(name, first.shape, list(pieces.values()))
    stride = tuple(math.prod(first.shape[i + 1 :]) for i in range(len(first.shape)))
    return Tensor(storage, 0, first.shape, stride, first.dtype, first.requires_grad)


def with_ranks(path: str, checkpoint: Checkpoint, open_file: Callable[[str], Checkpoint]) -> Checkpoint:
    """A file holding sharded values opens with its sibling rank files when they are all there."""
    found = sharded_values(checkpoint.key_root(), path)  # (a root still held as columns: its keys)
    if not found:
        return checkpoint
    siblings = sibling_ranks(path, max(s.world for s in found.values()))
    if siblings is None:
        return localize(checkpoint)
    mine = places.absolute(path)
    merged = merge_ranks(siblings, [checkpoint if p == mine else open_file(p) for p in siblings])
    # titled as the file the user named (rank1.pt opens the set as rank0.pt does, but is not called rank0.pt)
    merged.path = path
    return merged
