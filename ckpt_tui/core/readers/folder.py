"""A folder of separate checkpoint files saved together (Accelerate's ``save_state``): one tree.

``Accelerator.save_state`` writes ``model.safetensors`` (or ``pytorch_model.bin``), ``optimizer.bin``,
``scheduler.bin``, ``random_states_0.pkl``…; ``load_state`` reads each with its own loader. The folder
opens as one dict with a key per file (its name without the extension, unless two files share it).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from ckpt_tui.core.errors import CkptError, ReadError
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.contained import (
    DCP_METADATA,
    HF_WEIGHTS,
    WEIGHTS_LOADERS,
    inside,
    link_out,
    named_entry,
    unfollowed,
)
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.formats import format_name
from ckpt_tui.core.model.tree import Checkpoint, FileBeside, iter_tensors
from ckpt_tui.core.pickles.pickle_globals import fails_before_calling
from ckpt_tui.core.readers.probes import looks_like_safetensors, looks_like_text
from ckpt_tui.core.readers.rank_set import rank_folder
from ckpt_tui.core.readers.tar_archive import torch_tar
from ckpt_tui.core.runtime.shell import join_command, path_arg

CHECKPOINT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MAX_FILES = 1000
DCP_DATA = ".distcp"
"""A DCP folder's data files: items placed by its ``.metadata``, never a checkpoint of their own."""
SNIFFED_BYTES = 512
SAVED_TOGETHER = re.compile(
    r"(model|pytorch_model|adapter_model|optimizer|scheduler|sampler|dl_state_dict|scaler|random_states"
    r"|custom_checkpoint|rng_state|training_args)(_\d+)?\.[a-z]+"
    r"|.*\d+-of-\d+\.[a-z]+"
)
"""The names of the files one save writes side by side, numbered when there are several: Accelerate's
``save_state`` (the model, optimizer, scheduler, sampler, scaler, RNG states, custom objects), a Hugging Face
Trainer's ``checkpoint-N`` folder (``rng_state.pth``, ``training_args.bin`` beside them), shards named
``-00001-of-00003``."""
RANK_WORDS = re.compile(r"rank|shard|part|worker|proc|gpu", re.IGNORECASE)
"""What names a file as one process's part of a save (``rank0.pt``, ``model_rank1.pt``, ``shard_2.pt``)."""
PREFERRED = re.compile(r"best|last|latest|final", re.IGNORECASE)
TEXT_FILE = "a text file, not a checkpoint"


def checkpoint_files(folder: str) -> list[str]:
    """The names of the folder's entries (not folders) saved as checkpoints, in name order: named so, or, in a
    local folder, under any name (``model_best.pth.tar``) by content. One that is not a regular file (a FIFO, a
    broken link, a device) but is named as a checkpoint is left out beside regular ones; alone, it is refused when
    opened, never passed over."""
    names = []
    peeked = 0
    local = not places.is_remote(folder)
    for name in sorted(places.list_dir(folder)):
        if name.startswith("."):
            continue
        path = places.join(folder, name)
        if name.endswith(CHECKPOINT_SUFFIXES):
            if named_entry(path):
                names.append(name)
        elif local and peeked < MAX_FILES and not name.endswith(DCP_DATA) and _regular(path):
            # torch.load reads any name: a file saved as a checkpoint is one, whatever it is called
            peeked += 1
            if _saved_as_checkpoint(path):
                names.append(name)
    if not local or all(_regular(places.join(folder, name)) for name in names):
        return names
    # a broken link, a FIFO or a device is no checkpoint: left out beside regular files, unless a loader of the save
    # reads it by its name (Accelerate's scheduler.bin), or nothing else is one: then opening it refuses it in a line
    kept = [n for n in names if _regular(places.join(folder, n)) or SAVED_TOGETHER.fullmatch(n)]
    return kept or names


def _saved_as_checkpoint(path: str) -> bool:
    """Whether a local file begins as what torch.save or safetensors writes: a zip holding a ``data.pkl``, a
    pickle's PROTO, a safetensors header."""
    sniffed = _sniffed(path)
    if sniffed is None:
        return False
    head, size = sniffed
    if head[:4] in ZIP_MAGIC:
        return not _not_torch_zip(path, size)
    return bool(head) and (head[0] == PICKLE_PROTO or looks_like_safetensors(head, size))


def _no_torch_save(path: str) -> bool:
    """Whether a local file surely is no file torch.save writes: a text file, a zip with no ``data.pkl``, or a
    plain pickle (its first object is no int, so never torch's magic number: ``Invalid magic number``)."""
    sniffed = _sniffed(path)
    if sniffed is None:
        return False
    return _sniffed_kind(path, *sniffed) is not None or _plain_pickle(sniffed[0])


INT_OPCODES = frozenset(b"\x8a\x8bILJKM")
"""The pickle opcodes that begin an int (LONG1, LONG4, INT, LONG, BININT, BININT1, BININT2): how a legacy torch
file's first pickle, its magic number, begins."""


def _plain_pickle(head: bytes) -> bool:
    """Whether bytes begin as a binary pickle whose first object is no int (after PROTO and FRAME)."""
    if head[:1] != bytes([PICKLE_PROTO]):
        return False
    at = 2 + (9 if head[2:3] == b"\x95" else 0)
    return at < len(head) and head[at] not in INT_OPCODES


def _sniffed(path: str) -> tuple[bytes, int] | None:
    """A local file's first bytes and its size; None where it cannot be read."""
    try:
        # (through places: a FIFO or a device among them is refused, never waited on)
        with places.open_stream(path) as stream:
            head = stream.read(SNIFFED_BYTES)
        return head, os.path.getsize(path)
    except (OSError, CkptError):
        return None


def _not_torch_zip(path: str, size: int) -> bool:
    # (the zip reader is imported for a zip found by content only)
    from ckpt_tui.core.readers.zip_checkpoint import not_torch_zip

    return not_torch_zip(path, size)


MAX_PEEKED = 200
"""A folder's files have their first bytes read (to leave text files and other zips out of a count) up to this
many files."""
NOT_TORCH_ZIP = "zip archive"
TEXT = "text file"
EMPTY = "empty file"


def _no_checkpoint_kind(path: str) -> str | None:
    """What a local file named as a checkpoint is when it surely is none: a text file, or a zip archive with no
    ``data.pkl`` (a wheel); None for anything else (a checkpoint, or doubt: it is opened and refused there)."""
    sniffed = _sniffed(path)
    return None if sniffed is None else _sniffed_kind(path, *sniffed)


def _sniffed_kind(path: str, head: bytes, size: int) -> str | None:
    """:func:`_no_checkpoint_kind` of a file whose first bytes and size were read."""
    if not head:
        # an empty file (torch.load: EOFError) is no save; one that could not be read is left to doubt
        return EMPTY if size == 0 else None
    if head[:4] in ZIP_MAGIC:
        return NOT_TORCH_ZIP if _not_torch_zip(path, size) else None
    return TEXT if looks_like_text(head) else None


def saved_together(folder: str, names: list[str]) -> bool:
    """Whether a folder's checkpoint files are one save: one file, the files of one ``save_state``, or rank
    files of one run (beside others, such as a consolidated copy); not ``epoch_1.pth``, ``best.pth``..."""
    if len(names) < 2 or all(SAVED_TOGETHER.fullmatch(name) for name in names):
        return True
    ranked = [name for name in names if RANK_WORDS.search(name)]
    return rank_folder(folder, ranked) is not None


def torch_saves(folder: str, names: list[str]) -> list[str]:
    """A local folder's checkpoint files less those that surely are no torch save: what is no regular file (a
    broken link, a device: ckpt-tui refuses it), a text file, a zip with no ``data.pkl``, a plain pickle (which
    torch.load refuses: no magic number). A remote folder's, or too many to peek at, as they are."""
    if places.is_remote(folder) or len(names) > MAX_PEEKED:
        return names
    paths = [(name, places.join(folder, name)) for name in names]
    saves = [(name, path) for name, path in paths if _regular(path) and not _no_torch_save(path)]
    # a link to another of its files (Lightning's save_last="link" last.ckpt, latest.pth -> model.pth) is that
    # save under a second name: the file itself is kept
    by_file: dict[str, str] = {}
    for name, path in sorted(saves, key=lambda item: os.path.islink(item[1])):
        by_file.setdefault(_real(path), name)
    kept = set(by_file.values())
    return [name for name, _ in saves if name in kept]


def separate_files(folder: str, names: list[str]) -> ReadError:
    """The one-line refusal of a folder of separate checkpoints, naming the one to open; a text file or a zip
    that is no torch checkpoint (named .pth, .bin) is not counted, and never named as the one to open; with none
    left, the refusal says what the folder holds."""
    names = torch_saves(folder, names)
    if not names:
        return no_checkpoint(folder)
    example = join_command(["ckpt-tui", path_arg(places.join(folder, _pick(names)))])
    return ReadError(
        f"{folder}: a folder of {counted(len(names), 'separate checkpoint')}, not one save: open one ({example})"
    )


def no_checkpoint(folder: str, saves_below: Sequence[tuple[str, str]] = ()) -> ReadError:
    """The one-line refusal of a folder holding no checkpoint, saying what it holds instead (hidden entries left
    out, but for a ``.metadata`` that is no regular file) and the way on; ``saves_below``: its subfolders that
    hold a checkpoint, each with what it is."""
    try:
        listed = places.list_dir(folder)
    except (OSError, CkptError):
        listed = []
    names = sorted(name for name in listed if not name.startswith(".") or name == DCP_METADATA)
    # (a save folder by its name, checkpoint-500/, is named by _way_on: the last one)
    unnamed = [save for save in saves_below if not SAVE_FOLDER.fullmatch(save[0])]
    way_on = _way_on(folder, names) + _below(folder, unnamed)
    return ReadError(f"{folder}: no checkpoint in this folder: {_holdings(folder, names)}{way_on}")


def _below(folder: str, saves: Sequence[tuple[str, str]]) -> str:
    """The subfolder to open when the folder itself holds no checkpoint but one below it does, or ""."""
    if not saves:
        return ""
    name, kind = saves[0]
    command = join_command(["ckpt-tui", path_arg(places.join(folder, name))])
    if len(saves) == 1:
        return f"; {name}/ holds a checkpoint, {kind}: open it ({command})"
    shown = ", ".join(f"{n}/" for n, _ in saves[:3]) + (f", … {len(saves) - 3} more" if len(saves) > 3 else "")
    return f"; {len(saves)} folders hold a checkpoint ({shown}): open one ({command})"


SAVE_FOLDER = re.compile(r"(global_step|checkpoint|step|epoch|iter|ckpt)[-_]?\d+", re.IGNORECASE)
"""The names training runs give each save's own folder (DeepSpeed's ``global_step500``, the Hugging Face Trainer's
``checkpoint-500``, Accelerate's ``checkpoint_3``)."""
LATEST = "latest"
"""DeepSpeed's file naming the tag folder of the last save."""


def _way_on(folder: str, names: list[str]) -> str:
    """For a folder holding no checkpoint itself: what DeepSpeed's ``latest`` names that is not there, and the
    save folder to open (the last by number), or ""."""
    said = ""
    if LATEST in names and not places.is_dir(places.join(folder, LATEST)):
        try:
            tag = places.read_small(places.join(folder, LATEST), 256, "latest is too long").decode().strip()
        except (CkptError, UnicodeDecodeError):
            tag = ""
        if tag and tag not in names:
            said = f"; DeepSpeed's latest names {tag!r}, which is not in the folder"
    saves = [name for name in names if SAVE_FOLDER.fullmatch(name) and places.is_dir(places.join(folder, name))]
    if saves:
        last = max(saves, key=lambda name: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)])
        said += f"; open a save's folder ({join_command(['ckpt-tui', path_arg(places.join(folder, last))])})"
    return said


SPECIAL = "special"
OTHER = "other"
FOLDER = "folder"
HOLDINGS = {
    NOT_TORCH_ZIP: ("zip archive that is not a torch checkpoint", "zip archives that are not torch checkpoints"),
    TEXT: ("text file", "text files"),
    EMPTY: ("empty file", "empty files"),
    OTHER: ("other file", "other files"),
    SPECIAL: ("entry that is not a regular file", "entries that are not regular files"),
    FOLDER: ("folder", "folders"),
}
"""What a folder with no checkpoint holds, in the order it is said: each kind's words for one and for several."""


def _holdings(folder: str, names: list[str]) -> str:
    """What a folder with no checkpoint holds: each kind of entry counted, a few named (a zip's suffixes)."""
    if not names:
        return "it is empty"
    kinds: dict[str, list[str]] = {}
    local = not places.is_remote(folder)
    for number, name in enumerate(names):
        path = places.join(folder, name)
        if places.is_dir(path):
            kind, name = FOLDER, name + "/"
        elif local and not _regular(path):
            kind = SPECIAL
        elif local and number < MAX_PEEKED:
            kind = _no_checkpoint_kind(path) or OTHER
        else:
            kind = OTHER
        kinds.setdefault(kind, []).append(name)
    parts = []
    for kind, (one, several) in HOLDINGS.items():
        found = kinds.get(kind, [])
        if found:
            # a zip's suffix says what it is (.whl, .zip); other entries are named
            shown = sorted({os.path.splitext(n)[1] or n for n in found}) if kind == NOT_TORCH_ZIP else found
            more = f", … {len(shown) - 3} more" if len(shown) > 3 else ""
            parts.append(f"{len(found)} {one if len(found) == 1 else several} ({', '.join(shown[:3])}{more})")
    return ", ".join(parts)


def _pick(names: list[str]) -> str:
    """The file a user most likely means: the best (or last) one, else the last in natural order."""
    preferred = [name for name in names if PREFERRED.search(os.path.splitext(name)[0])]
    if preferred:
        return preferred[0]
    return max(names, key=lambda name: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)])


def read_folder(folder: str, names: list[str], open_file: Callable[[str], Checkpoint]) -> Checkpoint:
    """Open each named file of ``folder`` (``open_file`` reads one file) as one checkpoint."""
    if len(names) > MAX_FILES:
        raise ReadError(f"{folder}: {len(names)} checkpoint files in one folder; open one of them")
    stems = [os.path.splitext(name)[0] for name in names]
    labels = stems if len(set(stems)) == len(stems) else names
    members: dict[str, Checkpoint] = {}
    stray: list[str] = []
    for label, name in zip(labels, names, strict=True):
        try:
            members[label] = open_file(member_path(folder, name))
        except ReadError as exc:
            # a text file among the save's files (notes, a README named .pth) is no part of it: left out, said
            if not str(exc).endswith(TEXT_FILE):
                raise
            stray.append(name)
    trainer_record = [
        name
        for label, name in zip(labels, names, strict=True)
        if label in members and len(members) > 1 and trainer_arguments(name, members[label].unsafe_globals)
    ]
    for label, name in zip(labels, names, strict=True):
        if name in trainer_record:
            # no loader reads it: left out of the save's tree, it is read for code with the folder's other files
            del members[label]
    stray += trainer_record
    if stray:
        if not members:
            raise ReadError(f"{folder}: no checkpoint among its files ({', '.join(stray)}: {TEXT_FILE})")
        kept = [(label, name) for label, name in zip(labels, names, strict=True) if name not in stray]
        labels, names = [label for label, _ in kept], [name for _, name in kept]
    root = {label: member.root for label, member in members.items()}
    described = ", ".join(
        f"{name} ({format_name(members[label].format)})" for label, name in zip(labels, names, strict=True)
    )
    notes = [f"{counted(len(names), 'file')} saved together (each read by its own loader): {described}"]
    notes += [f"{name}: {TEXT_FILE}, left out" for name in stray if name not in trainer_record]
    notes += [f"{name}: {TRAINING_ARGS_NOTE}" for name in trainer_record]
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
        layout=accelerate_layout(names, labels),
        notes=notes,
        unsafe_globals=set().union(*(member.unsafe_globals for member in members.values())),
        loader_problems=problems,
        # each file is read by its own loader: the verdict is each file's
        files=[places.join(folder, name) for name in names],
    )


ACCELERATE_ONLY = re.compile(r"random_states_\d+\.pkl|(optimizer|scheduler|sampler|dl_state_dict)(_\d+)?\.bin")
"""The names only Accelerate's ``save_state`` gives its files (its RNG states, its ``.bin`` training state)."""
ACCELERATE_ROLES = (
    (re.compile(r"(model|pytorch_model)(_\d+)?"), "model"),
    (re.compile(r"optimizer(_\d+)?"), "optimizer"),
    (re.compile(r"scheduler(_\d+)?"), "scheduler"),
    (re.compile(r"(sampler|dl_state_dict)(_\d+)?"), "dataloader state"),
    (re.compile(r"scaler"), "grad scaler"),
    (re.compile(r"random_states_\d+"), "RNG state"),
    (re.compile(r"custom_checkpoint_\d+"), "custom object"),
)
"""What each of ``save_state``'s files holds, by its key (the file's name without its extension), in the order
the layout line says them."""


def accelerate_layout(names: list[str], labels: list[str]) -> str | None:
    """The layout line of an Accelerate ``save_state`` folder (``names``: its files, ``labels``: their keys): each
    kind of state counted, with its keys (``2 models (model, model_1)``); None for any other folder."""
    if not any(ACCELERATE_ONLY.fullmatch(name) for name in names):
        return None
    parts = []
    for pattern, role in ACCELERATE_ROLES:
        keys = sorted((key for key in labels if pattern.fullmatch(key)), key=_natural)
        if keys:
            parts.append(f"{counted(len(keys), role)} ({', '.join(keys)})")
    return "Accelerate save_state: " + ", ".join(parts)


def _natural(name: str) -> list[int | str]:
    """A name's sort key with its numbers as numbers (``model_2`` before ``model_10``)."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def member_path(folder: str, name: str) -> str:
    """A save's file, inside the folder (a link out of it to a regular file is followed, as its loader follows
    it; :func:`~ckpt_tui.core.model.contained.inside` refuses the rest in one line)."""
    return inside(folder, name, f"{folder}:")


# ---- every other file of a folder, read for code -------------------------------------------------------

TRAINING_ARGS = "training_args.bin"
TRAINING_ARGS_CLASSES = frozenset(
    {
        "transformers.training_args.TrainingArguments",
        "transformers.training_args.OptimizerNames",
        "transformers.trainer_utils.SchedulerType",
        "transformers.trainer_utils.IntervalStrategy",
        "transformers.trainer_utils.SaveStrategy",
        "transformers.trainer_utils.HubStrategy",
        "transformers.trainer_utils.FSDPOption",
        "transformers.debug_utils.DebugOption",
        "transformers.trainer_pt_utils.AcceleratorConfig",
        "accelerate.state.PartialState",
        "accelerate.utils.dataclasses.DistributedType",
    }
)
"""The classes of the ``training_args.bin`` transformers' Trainer writes beside each checkpoint (``torch.save(args)``):
no loader reads it (resuming reads the model, optimizer.pt, scheduler.pt and rng_state.pth), so these exact names
there are the Trainer's own record of its arguments, not code a load runs; any other global in it is."""
TRAINING_ARGS_HOLDS = (
    "the Trainer's TrainingArguments: transformers' classes, which torch.load(weights_only=True) refuses; "
    "read by no loader, not needed to load the weights"
)
TRAINING_ARGS_NOTE = f"{TRAINING_ARGS_HOLDS}: left out"


def trainer_arguments(name: str, unsafe_globals: set[str] | list[str]) -> bool:
    """Whether a file is the Trainer's ``training_args.bin`` naming no global but its arguments' classes."""
    return name.rsplit("/", 1)[-1] == TRAINING_ARGS and set(unsafe_globals) <= TRAINING_ARGS_CLASSES


ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
PICKLE_PROTO = 0x80
DATA_FORMATS = frozenset({"safetensors", "sharded"})
"""What a file beside a checkpoint may be read as and still be data: torch.load runs nothing from it. A file no
reader reads is data only when torch.load surely fails on it first (see :func:`_loader_fails_at_once`)."""
MAX_BESIDE = 1000
HEAD_BYTES = 4096
SCANNED_BYTES = 1 << 20
"""How much of a file no reader reads is decoded to prove the unpickler fails on it before calling anything."""


INDEX_SUFFIX = ".index.json"
TRAINER_RESUMES = "Trainer(resume_from_checkpoint="
LOADER_TAKES = (*(f"{loader}(" for loader, _ in WEIGHTS_LOADERS), TRAINER_RESUMES)
"""How the notes on what loaders read from a folder start: ``from_pretrained(FOLDER) loads model.safetensors``, and
a Trainer checkpoint's ``Trainer(resume_from_checkpoint=FOLDER) also reads optimizer.pt...``."""
MAX_OTHERS = 8
"""The other files of a folder named in its note, at most."""


@dataclass(frozen=True)
class WeightsChoice:
    """The weights file (or index) a loader takes from a folder by its name, and why."""

    loader: str
    names: tuple[str, ...]
    """The weights names this loader takes from a folder."""
    chosen: str
    passed: tuple[str, ...]
    """The weights files and index files beside it that the loader passes over."""
    why: str

    def holds_only_weights(self, names: list[str]) -> bool:
        """Whether ``names`` (a folder's checkpoint files) are this loader's weights files alone: a folder
        ``save_pretrained`` wrote (``training_args.bin``, the Trainer's record beside ``save_model``'s output, is
        read for code with the other files)."""
        return all(name in self.names or name == TRAINING_ARGS for name in names)

    def note(self, folder: str, others: list[str]) -> str:
        """One line: the file the loader takes and why, what it passes over, and the folder's other files."""
        text = f"{self.loader}({folder}) loads {self.chosen} ({self.why})"
        if self.passed:
            verb = "is" if len(self.passed) == 1 else "are"
            shards = " (nor the shards an index names)" if any(n.endswith(INDEX_SUFFIX) for n in self.passed) else ""
            text += f"; {', '.join(self.passed)} beside it {verb} not what it loads{shards}"
        if others:
            more = len(others) - MAX_OTHERS
            text += f"; other files: {', '.join(others[:MAX_OTHERS])}" + (f" and {more} more" if more > 0 else "")
        return text


def weights_choice(folder: str, names: Collection[str]) -> WeightsChoice | None:
    """The weights file a loader takes from ``folder`` by name (``names``: its listing): the file its config.json
    names, else the first of its names found (a regular file) by the first loader of :data:`WEIGHTS_LOADERS`
    that finds one; None when none does."""
    named = _named_by_config(folder, names)
    if named is not None:
        why = f"{HF_CONFIG} names it in {EXPLICIT_WEIGHTS}"
        return _choice(WEIGHTS_LOADERS[0][0], (named, *HF_WEIGHTS), named, names, why)
    for loader, order in WEIGHTS_LOADERS:
        chosen = next((name for name in order if name in names and _regular(places.join(folder, name))), None)
        if chosen is not None:
            return _choice(loader, order, chosen, names, f"it looks for {', '.join(order)}, in that order")
    return None


def _choice(loader: str, order: tuple[str, ...], chosen: str, names: Collection[str], why: str) -> WeightsChoice:
    """``chosen`` taken, with the loader's other weights files and every other index of the folder passed over."""
    passed = [name for name in order if name in names and name != chosen]
    passed += sorted(name for name in names if name.endswith(INDEX_SUFFIX) and name not in order)
    return WeightsChoice(loader, order, chosen, tuple(passed), why)


HF_CONFIG = "config.json"
EXPLICIT_WEIGHTS = "transformers_weights"
MAX_CONFIG = 1 << 20


def _named_by_config(folder: str, names: Collection[str]) -> str | None:
    """The weights file a model's config.json names in ``transformers_weights``, which ``from_pretrained`` loads
    before any other (a safetensors file or index of the folder, as transformers accepts; None otherwise)."""
    if HF_CONFIG not in names:
        return None
    import json  # (a folder's config only)

    try:
        with places.open_stream(inside(folder, HF_CONFIG, f"{folder}:")) as stream:
            config = json.loads(stream.read(MAX_CONFIG))
    except (OSError, CkptError, ValueError, RecursionError):
        return None
    named = config.get(EXPLICIT_WEIGHTS) if isinstance(config, dict) else None
    if not isinstance(named, str) or not named.endswith((".safetensors", ".safetensors.index.json")):
        return None
    return named if named in names and _regular(places.join(folder, named)) else None


def other_files(
    names: Collection[str], choice: WeightsChoice, checkpoint: Checkpoint, named: Collection[str] = ()
) -> list[str]:
    """A folder's entries (``names``) that are neither what the loader takes or passes over nor read with it (an
    index's shards) nor ``named`` elsewhere (a Trainer checkpoint's training state): its config, tokenizer..."""
    read = {name.rsplit("/", 1)[-1] for name in (*checkpoint.files, *checkpoint.read_files)}
    taken = {choice.chosen, *choice.passed, *read, *named}
    return sorted(name for name in names if not name.startswith(".") and name not in taken)


# ---- a Hugging Face Trainer's checkpoint-N folder -------------------------------------------------------

TRAINER_STATE = "trainer_state.json"
"""What the Trainer writes in each ``checkpoint-N`` folder it saves (``TrainerState.save_to_json``): the mark of one."""
TRAINING_STATE = (
    (re.compile(r"optimizer\.pt"), "optimizer"),
    (re.compile(r"scheduler\.pt"), "LR scheduler"),
    (re.compile(r"scaler\.pt"), "grad scaler"),
    (re.compile(r"rng_state(_\d+)?\.pth"), "RNG states"),
    # a run with deepspeed=: the engine's own save (optimizer partitions, ZeRO state), the folder `latest` names
    (re.compile(r"global_step\d+"), "DeepSpeed engine state"),
)
"""The files ``Trainer(resume_from_checkpoint=...)`` reads beside the weights, and what each holds."""
MAX_TRAINER_STATE = 64 << 20
"""The most of ``trainer_state.json`` read for its step (its log history grows with the run)."""


@dataclass(frozen=True)
class TrainerCheckpoint:
    """A Trainer's ``checkpoint-N`` folder: the weights ``from_pretrained`` takes, the training state beside them."""

    weights: str
    state: tuple[tuple[str, str], ...]
    """Each training-state file and what it holds, in name order."""
    step: int | None
    arguments: bool
    """Whether ``training_args.bin`` lies beside them."""

    @property
    def named(self) -> list[str]:
        """Every file this account names (so no other note lists them again)."""
        return [name for name, _ in self.state] + [TRAINER_STATE] + ([TRAINING_ARGS] if self.arguments else [])

    @property
    def layout(self) -> str:
        """The layout line: what the folder is, its weights and the training state beside them."""
        step = "" if self.step is None else f" at step {self.step}"
        state = ", ".join([*(what for _, what in self.state), "trainer state"])
        return f"Hugging Face Trainer checkpoint{step}: weights {self.weights}; training state beside them ({state})"

    def note(self, folder: str) -> str:
        """One line: what resuming reads beside the weights."""
        step = "" if self.step is None else f" at step {self.step}"
        files = [f"{name} ({what})" for name, what in self.state] + [f"{TRAINER_STATE} (trainer state{step})"]
        # (training_args.bin is said on the line of the files read for code, which check prints too)
        return f"{TRAINER_RESUMES}{folder}) also reads {', '.join(files)}: the training state beside the weights shown"


def holds_trainer_state(folder: str, names: Collection[str]) -> bool:
    """Whether a folder (``names``: its listing) holds the ``trainer_state.json`` of a Trainer's checkpoint."""
    return TRAINER_STATE in names and _regular(places.join(folder, TRAINER_STATE))


def trainer_checkpoint(folder: str, names: Collection[str], weights: str) -> TrainerCheckpoint | None:
    """The Trainer's checkpoint a folder is (``names``: its listing, ``weights``: the file ``from_pretrained``
    takes), or None when it holds no ``trainer_state.json``."""
    if not holds_trainer_state(folder, names):
        return None
    state = tuple((name, what) for name in sorted(names) for pattern, what in TRAINING_STATE if pattern.fullmatch(name))
    return TrainerCheckpoint(weights, state, _trainer_step(folder), TRAINING_ARGS in names)


def _trainer_step(folder: str) -> int | None:
    """The ``global_step`` trainer_state.json records, else the number of a ``checkpoint-N`` folder, else None."""
    import json  # (a Trainer's folder only)

    try:
        step = json.loads(places.read_small(places.join(folder, TRAINER_STATE), MAX_TRAINER_STATE, "too large"))
        step = step.get("global_step") if isinstance(step, dict) else None
    except (CkptError, ValueError, RecursionError):  # (a hostile file: nested past the parser's depth)
        step = None
    if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
        return step
    named = re.fullmatch(r"checkpoint-(\d{1,18})", folder.rstrip("/").rsplit("/", 1)[-1])
    return int(named.group(1)) if named else None


def files_read(checkpoint: Checkpoint) -> set[str]:
    """The files a checkpoint's reader read: its path, its files, what its reader recorded, its records' files."""
    paths = {checkpoint.path, *checkpoint.files, *checkpoint.read_files}
    if not checkpoint.read_files and not checkpoint.files:
        # a reader that records nothing more: its tensors name the files their records lie in
        for _, tensor in iter_tensors(checkpoint.root):
            source = tensor.storage.source if tensor.storage is not None else None
            path = getattr(source, "path", None)
            if isinstance(path, str):
                paths.add(path)
    return {_real(path) for path in paths}


def account_for_folder(
    folder: str,
    checkpoint: Checkpoint,
    open_file: Callable[[str], Checkpoint],
    open_dcp: Callable[[str], Checkpoint],
) -> list[FileBeside]:
    """Every regular file of ``folder`` and of its immediate subfolders that ``checkpoint``'s reader did not read
    and a loader could unpickle (by content: zip, pickle, legacy, tar; a subfolder with ``.metadata`` is DCP),
    read for what it holds of code. Data (safetensors, JSON, text) is left out."""
    read = files_read(checkpoint)
    found: list[FileBeside] = []
    entries = sorted(places.list_dir(folder))
    for name in entries:
        path = places.join(folder, name)
        if _real(path) in read or (name == ".metadata" and checkpoint.format == "dcp"):
            continue
        passed = _passed_over(folder, name, path)
        if passed is not None:
            found.append(passed)
        elif places.is_dir(path):
            # (a link to a folder inside it too: only one level is read, so a loop ends there)
            found += _subfolder(folder, name, read, open_file, open_dcp)
        else:
            found += _file(name, path, open_file)
        if len(found) > MAX_BESIDE:
            return [*found[:MAX_BESIDE], FileBeside("…", "unreadable", unreadable="too many files to read")]
    return found


def _subfolder(
    folder: str,
    name: str,
    read: set[str],
    open_file: Callable[[str], Checkpoint],
    open_dcp: Callable[[str], Checkpoint],
) -> list[FileBeside]:
    """An immediate subfolder: a DCP folder (``.metadata``) as ``dcp.load`` reads it, else each of its files."""
    sub = places.join(folder, name)
    found: list[FileBeside] = []
    inner: set[str] = set()
    if _regular(places.join(sub, ".metadata")):
        try:
            dcp = open_dcp(sub)
        except Exception as exc:  # a hostile folder must give an answer, never a traceback
            found.append(FileBeside(f"{name}/", "unreadable", unreadable=_why(exc)))
        else:
            # dcp.load runs its metadata pickle and its non-tensor items' pickles without weights_only
            found.append(FileBeside(f"{name}/", "DCP folder", sorted(dcp.unsafe_globals), list(dcp.runs_code)))
            inner = files_read(dcp)
        inner.add(_real(places.join(sub, ".metadata")))
    try:
        names = sorted(places.list_dir(sub))
    except (OSError, CkptError) as exc:
        return [*found, FileBeside(f"{name}/", "unreadable", unreadable=_why(exc))]
    for child in names:
        path = places.join(sub, child)
        if _real(path) in read or _real(path) in inner or places.is_dir(path):
            continue
        passed = _passed_over(folder, f"{name}/{child}", path)
        found += [passed] if passed is not None else _file(f"{name}/{child}", path, open_file)
    return found


def _passed_over(folder: str, name: str, path: str) -> FileBeside | None:
    """An entry that is no part of the save, so never read: a broken link (torch.load finds nothing there), a link
    out of ``folder`` into the kernel's file systems (``d -> /dev``, ``p -> /proc/self``) or to a folder holding
    this one (``up -> ..``); None for any other entry. Any other link out is read like the folder's own entries, as
    the loaders follow it (see :func:`~ckpt_tui.core.model.contained.unfollowed`)."""
    if places.is_remote(path) or not os.path.islink(path):
        return None
    if not os.path.exists(path):
        return FileBeside(name, "broken link", passed_over=f"a broken link, to {os.readlink(path)}: nothing to load")
    out = link_out(folder, path)
    folder_link = os.path.isdir(path)
    why = unfollowed(folder, out, "folder" if folder_link else "file") if out is not None else None
    if why is None:
        return None
    shown = f"{name}/" if folder_link else name
    return FileBeside(shown, "link out", passed_over=f"a link out of the folder to {out}: {why}")


def _file(name: str, path: str, open_file: Callable[[str], Checkpoint]) -> list[FileBeside]:
    """One file: nothing if it holds no pickle a loader could run; else what its reader finds of code."""
    try:
        if not _regular(path):
            return [FileBeside(name, "unreadable", unreadable="not a regular file (a FIFO, a device or a broken link)")]
        with places.open_stream(path) as stream:
            head = stream.read(HEAD_BYTES)
        # data: torch.load surely fails on it before running anything (what no reader reads is data only so)
        if not head or _loader_fails_at_once(path, head):
            return []
    except (OSError, CkptError) as exc:
        return [FileBeside(name, "unreadable", unreadable=_why(exc))]
    try:
        opened = open_file(path)
    except Exception as exc:
        return [FileBeside(name, "unreadable", unreadable=_why(exc))]
    if opened.format in DATA_FORMATS:
        return []
    return [FileBeside(name, format_name(opened.format), sorted(opened.unsafe_globals), list(opened.runs_code))]


def _loader_fails_at_once(path: str, head: bytes) -> bool:
    """Whether ``torch.load(weights_only=False)`` surely fails on a file before it imports or calls anything: not a
    zip, a tar with no ``storages`` member (torch's first try: it unpickles that member, then others; a tar
    without it fails there), and a pickle that breaks before any call.
    ``head``: the file's first :data:`HEAD_BYTES` (the rest is read only when they do not tell)."""
    import io
    import tarfile

    # a zip or a PROTO is what torch.save and pickle write: one that cannot be read is doubt, never data; a zip
    # whose listing holds no data.pkl (a wheel) is data: torch.load fails finding its records, pickle.load at
    # its first byte (PERSID with no persistent_load)
    if head[:4] in ZIP_MAGIC:
        return _not_torch_zip(path, places.size_of(path))
    if head[0] == PICKLE_PROTO:
        return False
    try:
        # (tarfile decides from the first header block, as torch's tar reading does)
        with tarfile.open(fileobj=io.BytesIO(head), mode="r:", format=tarfile.PAX_FORMAT):
            pass
    except tarfile.TarError:
        pass
    except Exception:  # (torch fails the same way reading it as tar, and tells nothing more)
        return False
    else:
        # torch unpickles a tar's members only when it has a 'storages' member; any other tar fails first
        return not torch_tar(path)
    if fails_before_calling(head, complete=len(head) < HEAD_BYTES):
        return True  # (most text and data break within their first bytes)
    with places.open_stream(path) as stream:
        data = stream.read(SCANNED_BYTES + 1)
    return fails_before_calling(data[:SCANNED_BYTES], complete=len(data) <= SCANNED_BYTES)


def _regular(path: str) -> bool:
    if places.is_remote(path):
        return places.is_file(path)
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def _real(path: str) -> str:
    return path if places.is_remote(path) else os.path.realpath(path)


def _why(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, ReadError) else f"{type(exc).__name__}: {exc}"
