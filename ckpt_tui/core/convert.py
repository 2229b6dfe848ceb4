"""``convert``: the fixed pipeline of edits (extract, drop, rename, strip, add, remap, cast), then save."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ckpt_tui.core import edits
from ckpt_tui.core.edits import Change
from ckpt_tui.core.errors import EditError
from ckpt_tui.core.keypath import KeyPath
from ckpt_tui.core.reading import open_checkpoint
from ckpt_tui.core.tree import Opaque, child, children
from ckpt_tui.core.writers.save import WriteResult, save


@dataclass
class ConvertOptions:
    """The edits asked for on the command line."""

    extract: str | None = None
    drop: list[str] = field(default_factory=list)
    rename: list[str] = field(default_factory=list)
    strip_prefix: str | None = None
    add_prefix: str | None = None
    at: str | None = None
    map_location: str | None = None
    dtype: str | None = None


@dataclass
class ConvertOutcome:
    """The changes made, and what was written (None for a dry run)."""

    changes: list[Change]
    result: WriteResult | None


def resolve_path(root: Any, text: str) -> KeyPath:
    """A ``/``-separated path resolved against the tree (keys may themselves hold ``/``)."""
    parts = [p for p in text.strip("/").split("/")] if text.strip("/") else []
    path: list[Any] = []
    value = root
    index = 0
    while index < len(parts):
        for end in range(len(parts), index, -1):
            name = "/".join(parts[index:end])
            key = _match_key(value, name)
            if key is not None:
                path.append(key)
                value = child(value, key)
                index = end
                break
        else:
            raise EditError(f"no key {parts[index]!r} at {'/'.join(parts[:index]) or 'the root'}")
    return tuple(path)


def _match_key(value: Any, name: str) -> Any:
    for key, _ in children(value) if isinstance(value, (dict, list, tuple, Opaque)) else []:
        text = getattr(key, "name", key)
        if str(text) == name:
            return key
    return None


def apply_options(root: Any, options: ConvertOptions) -> tuple[Any, list[Change]]:
    """Apply the edits in their documented order."""
    changes: list[Change] = []

    def run(result: tuple[Any, Change]) -> Any:
        changes.append(result[1])
        return result[0]

    if options.extract:
        target = "auto" if options.extract == "auto" else resolve_path(root, options.extract)
        root = run(edits.extract(root, target))
    for path in options.drop:
        root = run(edits.delete(root, resolve_path(root, path)))
    for spec in options.rename:
        old, sep, new = spec.rpartition("=")
        if not sep or not old or not new:
            raise EditError(f"--rename takes OLD=NEW, got {spec!r}")
        root = run(edits.rename(root, resolve_path(root, old), new))
    at = resolve_path(root, options.at) if options.at else None
    if options.strip_prefix:
        root = run(edits.strip_prefix(root, options.strip_prefix, at))
    if options.add_prefix:
        root = run(edits.add_prefix(root, options.add_prefix, at))
    if options.map_location:
        root = run(edits.remap_devices(root, options.map_location))
    if options.dtype:
        root = run(edits.cast(root, options.dtype))
    return root, changes


def convert(
    path: str,
    options: ConvertOptions,
    output: str | None,
    fmt: str | None = None,
    *,
    force: bool = False,
    dry_run: bool = False,
) -> ConvertOutcome:
    """Read, edit, and (unless dry) save with verification."""
    checkpoint = open_checkpoint(path)
    root, changes = apply_options(checkpoint.root, options)
    if dry_run or output is None:
        return ConvertOutcome(changes, None)
    result = save(
        root,
        output,
        fmt,
        byteorder=checkpoint.byteorder,
        force=force,
        inputs=(checkpoint.path,),
        metadata=checkpoint.metadata,
    )
    return ConvertOutcome(changes, result)
