"""Sharded checkpoints: ``*.index.json`` with a weight map over several shard files."""

from __future__ import annotations

import bisect
import itertools
import json
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.contained import inside
from ckpt_tui.core.model.describe import counted, folded_names
from ckpt_tui.core.model.tree import PENDING_ROOT, Checkpoint, FlatColumns, Tensor
from ckpt_tui.core.readers.safetensors_file import from_wire, to_wire

if TYPE_CHECKING:
    from ckpt_tui.core.model.remote import NoRanges

_DTYPE = operator.attrgetter("dtype")
_NUMEL = operator.attrgetter("storage.numel")


def _read_index(path: str) -> Any:
    """The index file's JSON (a ReadError for text that is not UTF-8 or not JSON)."""
    try:
        with places.open_stream(path) as file:
            return _parsed(file.read())
    except UnicodeDecodeError:
        raise ReadError(f"{path}: index is not UTF-8 text") from None
    except RecursionError:
        raise ReadError(f"{path}: index JSON nests too deeply to be an index") from None
    except ValueError as exc:  # JSONDecodeError, ints past the digit limit
        raise ReadError(f"{path}: index is not valid JSON ({exc})") from None


def _open_shards(path: str, names: list[str], open_shard: Callable[[str], Checkpoint]) -> dict[str, Checkpoint]:
    """Each shard the index names, opened (each inside the index's folder)."""
    folder = places.parent(path)

    def opened(shard: str) -> Checkpoint:
        return open_shard(inside(folder, shard, f"{path}: shard"))

    if places.is_remote(folder):
        from ckpt_tui.core.model.remote import NoRanges  # (remote only)

        try:
            return _opened_together(names, opened)
        except NoRanges as exc:
            raise _download_the_set(path, names, exc) from None
    return _opened_on_two_cores(names, opened)


def _opened_together(names: list[str], opened: Callable[[str], Checkpoint]) -> dict[str, Checkpoint]:
    """Remote shards, read together: each costs round trips, not bytes."""
    if len(names) == 1:
        return {names[0]: opened(names[0])}
    from concurrent.futures import ThreadPoolExecutor  # (its import takes logging along: remote only)

    with ThreadPoolExecutor(min(8, len(names))) as pool:
        return dict(zip(names, pool.map(opened, names), strict=True))


def _download_the_set(path: str, names: list[str], refused: NoRanges) -> ReadError:
    """A shard too large to take whole from a server without ranges: the index and every shard to download."""
    from ckpt_tui.core.model.remote_stores import set_refused

    index = path.rsplit("/", 1)[-1]
    files = f"the index and its {counted(len(names), 'shard')}"
    return set_refused(path, refused, files, places.parent(path), [index, *names], "open the local index")


def _opened_on_two_cores(names: list[str], opened: Callable[[str], Checkpoint]) -> dict[str, Checkpoint]:
    """Each shard opened, the later half read by a forked child (:mod:`~ckpt_tui.core.runtime.forked`) while
    this process reads the first: a ``.safetensors`` shard comes back as its columns (:func:`to_wire`), what
    the child could not read or hand back is read here, so every error is raised here, in shard order, as
    it would be without the child. Where no child can be made, each shard is read here in turn."""
    import orjson

    from ckpt_tui.core.runtime import forked  # (its import takes signal along: a set of local shards only)

    theirs = names[(len(names) + 1) // 2 :]
    # (only .safetensors shards come back as columns: a child reading others would only delay this reader)
    child = None
    if theirs and all(shard.endswith(SAFETENSORS_SUFFIX) for shard in theirs):
        child = forked.fork(lambda: [_wire(opened, shard) for shard in theirs], orjson.dumps, orjson.loads)
    if child is None:
        return {shard: opened(shard) for shard in names}
    try:
        mine = {shard: opened(shard) for shard in names[: len(names) - len(theirs)]}
    finally:
        answer = child.result()  # (the child is waited for even when a shard here fails)
    wires = answer if isinstance(answer, list) and len(answer) == len(theirs) else [None] * len(theirs)
    for shard, wire in zip(theirs, wires, strict=True):
        mine[shard] = from_wire(wire) if wire is not None else opened(shard)
    return mine


SAFETENSORS_SUFFIX = ".safetensors"


def _wire(opened: Callable[[str], Checkpoint], shard: str) -> dict[str, Any] | None:
    """A shard as :func:`to_wire` hands it back from a child; None when it is not one (or not readable:
    then it is read again, and refused, by the parent)."""
    try:
        return to_wire(opened(shard))
    except Exception:  # (said by the parent when it reads the shard itself)
        return None


def read_sharded(path: str, open_shard: Callable[[str], Checkpoint]) -> Checkpoint:
    """Open every shard named in the index and show them as one flat state_dict.

    ``open_shard`` opens one shard file and refuses index files, so an index naming itself or another
    index is refused instead of followed.
    """
    # the index
    index = _read_index(path)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(map(isinstance, weight_map.values(), itertools.repeat(str))):
        raise ReadError(f"{path}: JSON without a weight_map: not a sharded checkpoint index")
    # the shards
    # in file order, as transformers reads them (``sorted(set(weight_map.values()))``)
    shards = _open_shards(path, sorted(set(weight_map.values())), open_shard)
    # one state_dict: each key from the shard the index maps it to
    mapped_to_holder = _keys_mapped_to_their_shard(weight_map, shards)
    columns = _assembled(weight_map, shards, mapped_to_holder)
    root: Any = PENDING_ROOT
    unheld: list[str] = []
    if columns is None:  # (a shard without columns, or a key its shard lacks: the walk says which)
        root, unheld = _assembled_root(weight_map, shards)
        columns = _columns(root, list(shards.values()))
    total = sum(c.file_bytes for c in shards.values())
    index_metadata = index.get("metadata") if isinstance(index.get("metadata"), dict) else {}
    metadata: dict[str, Any] = {}  # the shards' own metadata carries over, as transformers merges them
    for shard_checkpoint in shards.values():
        for name, value in shard_checkpoint.metadata.items():
            metadata.setdefault(name, value)
    note = f"{counted(len(shards), 'shard')}: " + folded_names(list(shards))
    unsafe = set().union(*(c.unsafe_globals for c in shards.values()))
    problems = [f"shard {name}: {problem}" for name, c in shards.items() for problem in c.loader_problems]
    # a key in a shard the index does not name for it: the real loaders take it too, so what is shown is in doubt
    overlaps = ([] if mapped_to_holder else _overlaps(weight_map, shards)) + _unheld_problem(unheld, weight_map)
    notes = [note] + [f"shard {name}: {n}" for name, c in shards.items() for n in c.notes]
    return Checkpoint(
        path,
        "sharded",
        root,
        total,
        metadata=metadata,
        notes=notes,
        unsafe_globals=unsafe,
        loader_problems=problems,
        index_metadata=dict(index_metadata),
        columns=columns,
        hostile=overlaps,
        read_files=[shard.path for shard in shards.values()],
    )


KEYS_SHOWN = 3
LOADERS = "transformers' from_pretrained and accelerate's load_checkpoint_in_model"


def _keys(count: int) -> str:
    return counted(count, "key")


def _shard_keys(shard: Checkpoint) -> list[Any]:
    """The keys a shard holds (what a loader that reads it whole gets; the columns' own list: read only)."""
    columns = shard.flat_columns()
    if columns is not None:
        return columns.names
    return list(shard.root) if isinstance(shard.root, dict) else []


def _overlaps(weight_map: dict[str, str], shards: dict[str, Checkpoint]) -> list[str]:
    """Keys held by a shard the index does not name for them, in words (none for a set ``save_pretrained``
    wrote). transformers and accelerate read every shard the index names, whole, in name order
    (``sorted(set(weight_map.values()))``), each over the last: the last shard holding a key gives its value,
    whatever the weight_map says; ckpt-tui shows the weight_map's copy."""
    if _keys_mapped_to_their_shard(weight_map, shards):
        return []
    holders: dict[Any, list[str]] = {}
    for name in sorted(shards):
        for key in _shard_keys(shards[name]):
            if weight_map.get(key) != name:
                holders.setdefault(key, [])
    if not holders:
        return []
    for name in sorted(shards):
        for key in _shard_keys(shards[name]):
            if key in holders:
                holders[key].append(name)
    twice = [key for key in holders if key in weight_map and weight_map[key] in holders[key]]
    misplaced = [key for key in holders if key in weight_map and weight_map[key] not in holders[key]]
    unlisted = [key for key in holders if key not in weight_map]
    problems = []
    if misplaced:
        one = len(misplaced) == 1
        places = [f"{key!r} mapped to {weight_map[key]}, in {' and '.join(holders[key])}" for key in misplaced]
        fix = ", ".join(f'"{key}": "{holders[key][-1]}"' for key in misplaced[:KEYS_SHOWN])
        problems.append(
            f"{_keys(len(misplaced))} mapped to a shard that does not hold {'it' if one else 'them'}: "
            f"{_first(places)}; shown from {'that shard' if one else 'those shards'}, as {LOADERS} "
            f"load every shard whole (the last holder winning); to fix, set {'its' if one else 'their'} weight_map "
            f"{'entry' if one else 'entries'} in the index to {fix}{' …' if len(misplaced) > KEYS_SHOWN else ''}"
        )
    if twice:
        shown = "; ".join(
            f"{key!r} in {' and '.join(holders[key])}, the weight_map naming {weight_map[key]} (shown here), "
            f"the loaders ending with {holders[key][-1]}'s copy"
            for key in twice[:KEYS_SHOWN]
        )
        more = f" (+{len(twice) - KEYS_SHOWN} more)" if len(twice) > KEYS_SHOWN else ""
        problems.append(
            f"{_keys(len(twice))} held by more than one shard: {shown}{more}. The value loaded depends on shard "
            f"order: {LOADERS} load every shard whole, in name order, the last one winning"
        )
    if unlisted:
        shown = "; ".join(f"{key!r} in {' and '.join(holders[key])}" for key in unlisted[:KEYS_SHOWN])
        more = f" (+{len(unlisted) - KEYS_SHOWN} more)" if len(unlisted) > KEYS_SHOWN else ""
        problems.append(
            f"{_keys(len(unlisted))} in a shard but not in the weight_map (not shown here): {shown}{more}; "
            f"{LOADERS} load them, as they load every shard whole"
        )
    return problems


def _keys_mapped_to_their_shard(weight_map: dict[str, str], shards: dict[str, Checkpoint]) -> bool:
    """Whether every shard's keys are all mapped to it, as in a set ``save_pretrained`` wrote (one C pass per
    shard, no loop per key)."""
    return not any(
        any(map(operator.ne, map(weight_map.get, _shard_keys(c)), itertools.repeat(n))) for n, c in shards.items()
    )


def _assembled_root(weight_map: dict[str, str], shards: dict[str, Checkpoint]) -> tuple[dict[str, Any], list[str]]:
    """The state_dict of the set, key by key, each tensor its shard's own, and the keys no shard holds.

    A key the index maps to a shard that does not hold it is taken from the last shard (in name order) that
    does, as the loaders take it (they load every shard whole; :func:`_overlaps` says so); a key no shard holds
    is left out, as they leave it out.
    """
    root: dict[str, Any] = {}
    unheld: list[str] = []
    for key, shard in weight_map.items():
        value = _tensor_in(shards[shard], key)
        if value is None:
            held = [v for name in sorted(shards) if (v := _tensor_in(shards[name], key)) is not None]
            if not held:
                unheld.append(key)
                continue
            value = held[-1]
        root[key] = value
    return root, unheld


def _tensor_in(shard: Checkpoint, key: str) -> Tensor | None:
    tensors = shard.root
    value = tensors.get(key) if isinstance(tensors, dict) else None
    return value if isinstance(value, Tensor) else None


def _unheld_problem(unheld: list[str], weight_map: dict[str, str]) -> list[str]:
    """Keys the index maps that no shard holds, in words (none for a set ``save_pretrained`` wrote)."""
    if not unheld:
        return []
    shown = [f"{key!r} mapped to {weight_map[key]}" for key in unheld]
    it = "it" if len(unheld) == 1 else "them"
    return [
        f"{_keys(len(unheld))} in the weight_map that no shard holds (not shown here): {_first(shown)}; "
        f"{LOADERS} load the set without {it}, as they load the shards' own keys; to fix, remove {it} from the "
        "index's weight_map"
    ]


def _first(items: list[str]) -> str:
    """The first :data:`KEYS_SHOWN` items joined by ``; ``, and how many more."""
    more = len(items) - KEYS_SHOWN
    return "; ".join(items[:KEYS_SHOWN]) + (f" (+{more} more)" if more > 0 else "")


def _assembled(weight_map: dict[str, str], shards: dict[str, Checkpoint], mapped_to_holder: bool) -> FlatColumns | None:
    """The set's columns, gathered from its shards' columns in the index's order, without a tensor object:
    each key found in the shard the index maps it to (:func:`_positions`; ``mapped_to_holder``: what
    :func:`_keys_mapped_to_their_shard` says). None when a shard has no columns, the map is empty, or a
    key is not in its shard."""
    shard_columns = [shard.flat_columns() for shard in shards.values()]
    if not weight_map or any(columns is None for columns in shard_columns):
        return None
    parts = [columns for columns in shard_columns if columns is not None]
    positions = _positions(weight_map, list(shards), parts, mapped_to_holder)
    if positions is None:
        return None
    starts = list(itertools.accumulate(map(len, parts), initial=0))
    at = positions
    keys = list(weight_map)

    def gathered(column: Callable[[FlatColumns], list[Any]]) -> list[Any]:
        whole = list(itertools.chain.from_iterable(map(column, parts)))
        return list(map(whole.__getitem__, at))

    def make(start: int, stop: int) -> list[Tensor]:
        """Rows ``start`` to ``stop``: each its shard's own tensor object (a few rows made alone)."""
        wanted = at[start:stop]
        if len(wanted) <= SMALL_PICK:
            return [_shard_tensor(parts, starts, row) for row in wanted]
        every = list(itertools.chain.from_iterable(columns.root.values() for columns in parts))
        return list(map(every.__getitem__, wanted))

    # each key's row is one that holds that key: where every shard's record keys are its keys
    # (safetensors), the set's record keys are its keys
    named = all(columns.storage_keys is columns.names for columns in parts)
    return FlatColumns.pending(
        keys,
        gathered(_DTYPES),
        gathered(_NUMELS),
        gathered(_SHAPES),
        gathered(_STRIDES),
        keys if named else gathered(_STORAGE_KEYS),
        gathered(_SOURCES),
        make,
    )


def _positions(
    weight_map: dict[str, str], names: list[str], parts: list[FlatColumns], mapped_to_holder: bool = False
) -> list[int] | None:
    """Each mapped key's row among the shards' rows laid end to end (shard ``names[i]``'s rows are
    ``parts[i]``'s), or None when a key is not in the shard the index maps it to. ``mapped_to_holder``:
    every shard's keys are known to be mapped to it."""
    count = sum(map(len, parts))
    rows = dict(zip(itertools.chain.from_iterable(c.names for c in parts), range(count), strict=True))
    if len(rows) == count:
        # no key in two shards (the usual set): each key's row by the key, then the row's shard compared
        # with the index's claim, a column against a column
        found = list(map(rows.get, weight_map))
        if None in found:
            return None
        positions = cast(list[int], found)
        if mapped_to_holder:  # each key found, in the one shard holding it, which the index names for it
            return positions
        owners = list(itertools.chain.from_iterable(map(itertools.repeat, names, map(len, parts))))
        return positions if list(map(owners.__getitem__, positions)) == list(weight_map.values()) else None
    # a key in two shards: each found by (shard, key)
    pairs: dict[tuple[str, str], int] = {}
    start = 0
    for name, columns in zip(names, parts, strict=True):
        places = range(start, start + len(columns))
        pairs.update(zip(zip(itertools.repeat(name), columns.names), places, strict=True))
        start += len(columns)
    paired = list(map(pairs.get, zip(weight_map.values(), weight_map.keys(), strict=True)))
    return None if None in paired else cast(list[int], paired)


SMALL_PICK = 64
"""Up to this many rows of a set are made from their shards one by one (the top of ``info``'s tree)."""


def _shard_tensor(parts: list[FlatColumns], starts: list[int], row: int) -> Tensor:
    """Row ``row`` of the shards' rows laid end to end: its shard's own tensor."""
    shard = bisect.bisect_right(starts, row) - 1
    return parts[shard].tensor_at(row - starts[shard])


_DTYPES = operator.attrgetter("dtypes")
_NUMELS = operator.attrgetter("numels")
_SHAPES = operator.attrgetter("shapes")
_STRIDES = operator.attrgetter("strides")
_STORAGE_KEYS = operator.attrgetter("storage_keys")
_SOURCES = operator.attrgetter("sources")


def _parsed(raw: bytes) -> Any:
    """The index's JSON: orjson (4x faster on a 90,000-key weight map), json where orjson refuses
    what json reads (ints past 64 bits), so that both give one answer."""
    import orjson

    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw.decode("utf-8"))


def _columns(root: dict[str, Any], shards: list[Checkpoint]) -> FlatColumns | None:
    """Columns of the assembled root when every shard was read as columns: each of its tensors is then a
    shard's plain tensor over its own storage, so what :class:`FlatColumns` promises holds for the set."""
    if not root or any(shard.flat_columns() is None for shard in shards):
        return None
    values = root.values()
    return FlatColumns(root, list(map(_DTYPE, values)), list(map(_NUMEL, values)))
