"""A folder of separate checkpoint files saved together (Accelerate's ``save_state``): one tree.

``Accelerator.save_state`` writes ``model.safetensors`` (or ``pytorch_model.bin``), ``optimizer.bin``,
``scheduler.bin``, ``random_states_0.pkl``…; ``load_state`` reads each with its own loader. The folder
opens as one dict with a key per file (its name without the extension, unless two files share it).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.contained import inside, named_entry
from ckpt_tui.core.model.formats import format_name
from ckpt_tui.core.model.tree import Checkpoint

CHECKPOINT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MAX_FILES = 1000


def checkpoint_files(folder: str) -> list[str]:
    """The names of the folder's entries (not folders) saved as checkpoints, in name order: one that is
    not a regular file of the folder (a FIFO, a link out) is refused when opened, never passed over."""
    names = []
    for name in sorted(places.list_dir(folder)):
        if name.startswith(".") or not name.endswith(CHECKPOINT_SUFFIXES):
            continue
        if named_entry(places.join(folder, name)):
            names.append(name)
    return names


def read_folder(folder: str, names: list[str], open_file: Callable[[str], Checkpoint]) -> Checkpoint:
    """Open each named file of ``folder`` (``open_file`` reads one file) as one checkpoint."""
    if len(names) > MAX_FILES:
        raise ReadError(f"{folder}: {len(names)} checkpoint files in one folder; open one of them")
    stems = [os.path.splitext(name)[0] for name in names]
    labels = stems if len(set(stems)) == len(stems) else names
    members: dict[str, Checkpoint] = {}
    for label, name in zip(labels, names, strict=True):
        members[label] = open_file(inside(folder, name, f"{folder}:"))
    root = {label: member.root for label, member in members.items()}
    described = ", ".join(
        f"{name} ({format_name(members[label].format)})" for label, name in zip(labels, names, strict=True)
    )
    notes = [f"{len(names)} files saved together (each read by its own loader): {described}"]
    notes += [f"{name}: {note}" for label, name in zip(labels, names, strict=True) for note in members[label].notes]
    problems = [
        f"{name}: {problem}"
        for label, name in zip(labels, names, strict=True)
        for problem in members[label].loader_problems
    ]
    return Checkpoint(
        folder,
        "folder",
        root,
        sum(member.file_bytes for member in members.values()),
        notes=notes,
        unsafe_globals=set().union(*(member.unsafe_globals for member in members.values())),
        loader_problems=problems,
        # each file is read by its own loader: the verdict is each file's
        files=[places.join(folder, name) for name in names],
    )
