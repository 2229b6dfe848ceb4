"""Open any checkpoint: detect its format by content, as the real loaders do, and read its metadata only.

The order follows the loaders. The ``safetensors`` library reads a file whose header validates,
whatever its name; ``torch.load`` hands any path ending in ``.safetensors`` to that library, reads a
file starting with a zip local header as a zip checkpoint, tries every other file as a pre-0.4 tar
archive (Python's ``tarfile``), and unpickles what is left. Here a validated safetensors header wins
first (its length can start with ``\\x80\\x02`` like a pickle); then zip, tar, an index JSON, and a
pickle. A file that two loaders read differently (a polyglot) is shown as one of them, with the other
reading in ``loader_problems``.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, BinaryIO, Literal, NoReturn

from ckpt_tui.core.errors import CkptError, ReadError, UnsafePickle
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.formats import FORMAT_NAMES, FormatId, format_name
from ckpt_tui.core.model.tree import Checkpoint, check_tree
from ckpt_tui.core.readers.probes import (
    LATEST,
    MODEL_STATES,
    OPTIM_STATES,
    PICKLE_OPCODES,
    REMOTE_BESIDE,
    SETS,
    dcp_folder_of,
    deepspeed_files,
    deepspeed_folder,
    lists_its_folder,
    looks_like_safetensors,
    looks_like_text,
)

if TYPE_CHECKING:
    from ckpt_tui.core.readers.folder import WeightsChoice
    from ckpt_tui.core.readers.safetensors_file import NotSafetensors

# Each reader is imported by the row that reads its format (the probes need none): opening one file
# imports its own reader only.

INDEX_SUFFIX = ".index.json"
ZIP_STARTS = (b"PK\x03\x04", b"PK\x05\x06")
TORCH_ZIP_START = b"PK\x03\x04"
TAR_BLOCK = 512

PathArg = str | os.PathLike[str]


def open_checkpoint(path: PathArg | Sequence[PathArg]) -> Checkpoint:
    """Read a checkpoint's tree without running its pickle or reading tensor data.

    Several paths open together as one checkpoint: per-rank files (FSDP/DTensor shards assembled,
    DDP copies side by side).
    """
    _serve_urls([os.fspath(p) for p in path] if isinstance(path, (list, tuple)) else [os.fspath(path)])  # type: ignore[arg-type]
    if isinstance(path, (list, tuple)):
        paths = [os.fspath(p) for p in path]
        if not paths:
            raise ReadError("no checkpoint given")
        if len(paths) > 1:
            from ckpt_tui.core.readers.rank_set import merge_ranks

            return _guarded(" ".join(paths), lambda: merge_ranks(paths, [_open_member(p) for p in paths]))
        path = paths[0]
    text = os.fspath(path)  # type: ignore[arg-type]
    return _guarded(text, lambda: _open(text))


def _serve_urls(paths: list[str]) -> None:
    """Make the remote stores ready when a URL is among ``paths`` (nothing is imported for local paths)."""
    if any(map(places.is_remote, paths)):
        from ckpt_tui.core.model import remote_stores

        remote_stores.register()


_opened = threading.local()
"""``checked``: the root :func:`_open_file` last checked and returned unchanged, in this thread."""


def _guarded(text: str, read: Callable[[], Checkpoint]) -> Checkpoint:
    _opened.checked = None
    # taken before the read: a file replaced while it is read is another version when values are read
    version = places.version_of(text)
    try:
        # every record source made while it opens holds the version its file had as it began (a shard's: as
        # it was first read), which each read of values checks
        with places.opening(text, version):
            checkpoint = read()
    except ReadError:
        raise
    except PermissionError:
        raise ReadError(f"{text}: permission denied") from None
    except IsADirectoryError:
        raise ReadError(f"{text}: is a directory, not a checkpoint") from None
    except OSError as exc:
        raise ReadError(f"{text}: {exc.strerror or exc}") from None
    places.remember_opened()
    if checkpoint.path == text:
        checkpoint.opened_version = version
    checked, _opened.checked = getattr(_opened, "checked", None), None
    # a tree is checked once (each walk of 50,000 tensors costs); columns were checked as they were made
    if checkpoint.flat_columns() is None and checked is not checkpoint.root:
        check_depth(checkpoint.root, text)
    return checkpoint


def check_depth(root: object, path: str) -> None:
    """Refuse trees no real checkpoint has: nested too deep, ints too long to print, tensors past int64."""
    try:
        check_tree(root)
    except ReadError as exc:
        raise ReadError(f"{path}: {exc}") from None


def _open(path: str) -> Checkpoint:
    if places.is_remote(path):
        return _open_remote(path)
    if not places.exists(path):
        raise ReadError(f"{path}: {_missing(path)}")
    if places.is_dir(path):
        return _open_directory(path)
    return _open_file(path)


def _missing(path: str) -> str:
    """Why a local path that does not exist cannot be opened: no such file, or a symlink loop."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink loop (too many levels of symbolic links)"
    return "no such file or directory"


def _open_remote(path: str) -> Checkpoint:
    """A URL: a file, or a store's folder (a listing: asked only when the URL is no file). A folder's other files
    are read for code as a local folder's are (the Hub's and S3's listings); where none were (a file's URL, a store
    that lists nothing), a set's report says so."""
    if places.is_file(path):
        checkpoint = _open_file(path)
    elif not places.exists(path):
        raise ReadError(f"{path}: no such file or directory")
    else:
        checkpoint = _open_directory(path) if places.is_dir(path) else _open_file(path)
    if checkpoint.format in SETS and checkpoint.beside is None and REMOTE_BESIDE not in checkpoint.notes:
        checkpoint.notes.append(REMOTE_BESIDE)
    return checkpoint


# ---- the detection table -------------------------------------------------------------------------

Scope = Literal["place", "folder", "file"]
"""What a row looks at: ``place``, where a path lies (a folder, or a file inside a DCP or DeepSpeed
folder, which opens the whole folder); ``folder``, a folder's files; ``file``, one file's bytes."""


class Target:
    """What the rows' probes ask about one path, each answer worked out once, when first asked."""

    def __init__(self, path: str, folder: bool, allow_index: bool = True) -> None:
        self.path = path
        self.folder = folder
        self.allow_index = allow_index
        self.framing_error: NotSafetensors | None = None
        """Why a file that looked like safetensors is not one (the later rows read it as torch.load would)."""
        self.opened: dict[str, Checkpoint] = {}
        """A folder's files read while probing it (read once)."""

    @cached_property
    def head(self) -> bytes:
        """A file's first 512 bytes (an empty file is refused here)."""
        with places.open_stream(self.path) as file:  # a FIFO, a device or stdin is refused here, never waited on
            head = file.read(TAR_BLOCK)
        # a /proc file says size 0 yet holds text: only a file with no bytes is empty
        if self.size == 0 and not head:
            raise ReadError(f"{self.path}: empty file")
        return head

    @cached_property
    def size(self) -> int:
        """Bytes in the file."""
        return places.size_of(self.path)

    @cached_property
    def dcp_folder(self) -> str | None:
        """The DCP folder this folder is (it holds ``.metadata``), or this file lies in."""
        if self.folder:
            return self.path if places.is_file(places.join(self.path, ".metadata")) else None
        return dcp_folder_of(self.path)

    @cached_property
    def zero_folder(self) -> str | None:
        """The DeepSpeed ZeRO tag folder this path is, holds (``latest``) or lies in."""
        return deepspeed_folder(self.path)

    @cached_property
    def listing(self) -> list[str]:
        """A folder's entries, by name."""
        return sorted(places.list_dir(self.path))

    @cached_property
    def indexes(self) -> list[str]:
        """The index files (``*.index.json``) in a folder."""
        return [n for n in self.listing if n.endswith(INDEX_SUFFIX)]

    @cached_property
    def hf_dcp(self) -> list[str] | None:
        """The per-rank safetensors files of torch's HuggingFaceStorageWriter in a folder without an index."""
        from ckpt_tui.core.readers.hf_dcp import hf_dcp_folder

        return None if self.indexes else hf_dcp_folder(self.path)

    @cached_property
    def files(self) -> list[str]:
        """A folder's checkpoint files."""
        from ckpt_tui.core.readers.folder import checkpoint_files

        return checkpoint_files(self.path)

    @cached_property
    def ranks(self) -> list[str] | None:
        """A folder's files when they are one set of rank files."""
        from ckpt_tui.core.readers.rank_set import rank_folder

        return rank_folder(self.path, self.files)

    def member(self, file: str) -> Checkpoint:
        """One of a folder's files, read once."""
        if file not in self.opened:
            self.opened[file] = open_shard(file)
        return self.opened[file]


@dataclass(frozen=True)
class Detection:
    """One row of the table: the formats its reader gives, what it looks at, a cheap probe, the reader.

    ``read`` may answer None: not this format after all (the rows below it are tried).
    """

    formats: tuple[FormatId, ...]
    scope: Scope
    probe: Callable[[Target], bool]
    read: Callable[[Target], Checkpoint | None]

    @property
    def names(self) -> tuple[str, ...]:
        """The display names of its formats."""
        return tuple(FORMAT_NAMES[f] for f in self.formats)


def _read_dcp(target: Target) -> Checkpoint:
    from ckpt_tui.core.readers.dcp import read_dcp

    assert target.dcp_folder is not None
    return read_dcp(target.dcp_folder, _open_plain_file)


def _read_deepspeed(target: Target) -> Checkpoint:
    from ckpt_tui.core.readers.deepspeed import read_deepspeed

    assert target.zero_folder is not None
    return read_deepspeed(target.zero_folder, _open_plain_file)


def _read_hf_dcp(target: Target) -> Checkpoint:
    from ckpt_tui.core.readers.hf_dcp import read_hf_dcp

    assert target.hf_dcp is not None
    return read_hf_dcp(target.path, target.hf_dcp, open_shard)


def _read_index_folder(target: Target) -> Checkpoint:
    choice = _weights_choice(target)
    if choice is not None and not choice.chosen.endswith(INDEX_SUFFIX):
        return _chosen_file(target, choice)
    if choice is None and len(target.indexes) > 1:
        raise ReadError(f"{target.path}: several index files ({', '.join(target.indexes)}); open one of them")
    from ckpt_tui.core.readers.sharded import read_sharded  # (index files only: not imported to read a file)

    index = target.indexes[0] if choice is None else choice.chosen
    checkpoint = read_sharded(places.join(target.path, index), open_shard)
    return checkpoint if choice is None else _noted(checkpoint, target, choice)


def _holds_rank_files(target: Target) -> bool:
    from ckpt_tui.core.readers.rank_set import holds_sharded

    return target.ranks is not None and holds_sharded(target.member(target.ranks[0]))


def _read_rank_folder(target: Target) -> Checkpoint:
    # the merged tree is checked as a whole when it is returned (as a rank file's siblings are): the
    # ranks' ShardedTensor/DTensor internals are read only through their checked fields
    from ckpt_tui.core.readers.rank_set import merge_ranks

    assert target.ranks is not None
    merged = merge_ranks(target.ranks, [target.member(p) for p in target.ranks])
    merged.path = target.path
    return merged


def _weights_choice(target: Target) -> WeightsChoice | None:
    """The weights file (or index) a loader takes from the folder by name (transformers' ``from_pretrained``:
    model.safetensors, its index, pytorch_model.bin, its index; then diffusers' and PEFT's names)."""
    from ckpt_tui.core.readers.folder import weights_choice

    return weights_choice(target.path, target.listing)


def _chosen_file(target: Target, choice: WeightsChoice) -> Checkpoint:
    """The one weights file a loader takes from the folder, read as that file, with the note saying so."""
    from ckpt_tui.core.model.contained import inside

    path = inside(target.path, choice.chosen, f"{target.path}:")
    return _noted(_open_plain_file(path), target, choice)


def _noted(checkpoint: Checkpoint, target: Target, choice: WeightsChoice) -> Checkpoint:
    """A folder's checkpoint read from the file a loader takes: which file and why, what else the folder holds (a
    Trainer checkpoint's training state on a line and in the layout of its own)."""
    from ckpt_tui.core.readers.folder import other_files, trainer_checkpoint

    trainer = trainer_checkpoint(target.path, target.listing, choice.chosen)
    named = trainer.named if trainer is not None else []
    checkpoint.notes.insert(0, choice.note(target.path, other_files(target.listing, choice, checkpoint, named)))
    if trainer is not None:
        checkpoint.notes.insert(1, trainer.note(target.path))
        checkpoint.layout = trainer.layout
    return checkpoint


def _refuse_partial_zero(target: Target) -> None:
    """A DeepSpeed tag folder of ``*_optim_states.pt`` with no ``*_model_states.pt`` (rank 0 did not save) is one
    save missing its model states, never separate checkpoints: refused as DeepSpeed's loader refuses it."""
    from ckpt_tui.core.readers.probes import MODEL_STATES, OPTIM_STATES

    if any(n.endswith(OPTIM_STATES) for n in target.files) and not any(n.endswith(MODEL_STATES) for n in target.files):
        raise ReadError(
            f"{target.path}: a DeepSpeed ZeRO save without its *{MODEL_STATES} files (rank 0 did not save?): "
            "the optimizer partitions alone hold no parameter names or shapes"
        )


def _one_save(target: Target, name: str) -> Checkpoint:
    """A folder's one torch save, read as that file (its tree and paths as when it is opened by its path)."""
    from ckpt_tui.core.readers.folder import member_path

    path = member_path(target.path, name)
    checkpoint = target.opened.pop(path, None) or _open_plain_file(path)
    checkpoint.notes.insert(0, f"the folder's one checkpoint, {name}, opened as that file")
    return checkpoint


def _read_folder(target: Target) -> Checkpoint:
    from ckpt_tui.core.readers.folder import (
        holds_trainer_state,
        read_folder,
        saved_together,
        separate_files,
        torch_saves,
    )

    choice = _weights_choice(target)
    # a folder save_pretrained wrote (model.safetensors or pytorch_model.bin beside config.json) is that one file,
    # as from_pretrained reads it, never a save of one file nested under its name
    if choice is not None and choice.holds_only_weights(target.files):
        return _chosen_file(target, choice)
    if choice is not None and holds_trainer_state(target.path, target.listing):
        # a Trainer's checkpoint-N is what from_pretrained and resuming read: the weights, the training state
        # beside them (named in the layout, read for code with the folder's other files)
        return _chosen_file(target, choice)
    saves = torch_saves(target.path, target.files)
    if len(saves) == 1 and choice is None:
        # a folder of one torch save (beside text files or plain pickles, which torch.load refuses) is that file,
        # as opened by its path; the others are read for code beside it
        return _one_save(target, saves[0])
    if not saved_together(target.path, target.files):
        # files that are no one save (a .bin beside rust_model.ot, a model file beside stray copies): the model
        # file is what a loader takes; the other files are read for code
        if choice is not None:
            return _chosen_file(target, choice)
        _refuse_partial_zero(target)
        raise separate_files(target.path, target.files)
    return read_folder(target.path, target.files, lambda file: target.opened.pop(file, None) or open_shard(file))


def _read_safetensors(target: Target) -> Checkpoint | None:
    from ckpt_tui.core.readers.safetensors_file import NotSafetensors, read_safetensors

    try:
        return _with_other_readings(read_safetensors(target.path, target.size), target.head, target.size)
    except NotSafetensors as exc:
        # its length started like a safetensors header; torch.load still reads it as zip, tar or pickle
        target.framing_error = exc
        return None


def _read_zip(target: Target) -> Checkpoint:
    return _zip_reading(target.path, target.size)


def _zip_reading(path: str, file_bytes: int) -> Checkpoint:
    """A zip torch wrote (a checkpoint, or a TorchScript archive), with torch.distributed's classes known."""
    from ckpt_tui.core.readers.distributed_globals import DISTRIBUTED_CLASSES, DISTRIBUTED_GLOBALS
    from ckpt_tui.core.readers.zip_checkpoint import read_zip

    return read_zip(path, file_bytes, DISTRIBUTED_CLASSES, DISTRIBUTED_GLOBALS)


def _refuse_tar(target: Target) -> Checkpoint:
    from ckpt_tui.core.readers.tar_archive import refusal

    raise refusal(target.path)


FOREIGN_MAGIC = (
    (b"\x93NUMPY", "a numpy array file (.npy)"),
    (b"GGUF", "a GGUF file (llama.cpp)"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file (Keras, h5py)"),
    (b"BZh", "a bzip2-compressed file (decompress it first)"),
    (b"lCRF", "a CRFsuite model"),
)
"""Files that start like a pickle (``\x93``, ``G``, ``\x89``... are opcodes) but are another program's format."""


def _is_foreign(target: Target) -> bool:
    return any(target.head.startswith(magic) for magic, _ in FOREIGN_MAGIC)


def _refuse_foreign(target: Target) -> Checkpoint:
    name = next(name for magic, name in FOREIGN_MAGIC if target.head.startswith(magic))
    raise ReadError(f"{target.path}: {name}, not a torch checkpoint")


def _is_index(target: Target) -> bool:
    return target.head.lstrip()[:1] == b"{" and target.framing_error is None


def _read_index(target: Target) -> Checkpoint:
    if not target.allow_index:
        raise ReadError(f"{target.path}: an index file where a shard was expected")
    from ckpt_tui.core.readers.sharded import read_sharded

    return read_sharded(target.path, open_shard)


def _read_pickle(target: Target) -> Checkpoint:
    from ckpt_tui.core.readers.legacy import read_pickle_file

    try:
        return read_pickle_file(target.path, target.size, target.head)
    except ReadError as exc:
        _refuse_unread(target, exc)


DETECTION: tuple[Detection, ...] = (
    Detection(("dcp",), "place", lambda t: t.dcp_folder is not None, _read_dcp),
    Detection(("deepspeed",), "place", lambda t: t.zero_folder is not None, _read_deepspeed),
    Detection(("dcp-hf",), "folder", lambda t: t.hf_dcp is not None, _read_hf_dcp),
    Detection(("sharded",), "folder", lambda t: bool(t.indexes), _read_index_folder),
    Detection(("ranks",), "folder", _holds_rank_files, _read_rank_folder),
    Detection(("folder",), "folder", lambda t: bool(t.files), _read_folder),
    Detection(("safetensors",), "file", lambda t: looks_like_safetensors(t.head, t.size), _read_safetensors),
    Detection(("zip", "torchscript"), "file", lambda t: t.head[:4] in ZIP_STARTS, _read_zip),
    Detection((), "file", lambda t: is_tar(t.path, t.head), _refuse_tar),
    Detection(("sharded",), "file", _is_index, _read_index),
    Detection((), "file", _is_foreign, _refuse_foreign),
    Detection(("legacy", "pickle"), "file", lambda t: t.head[0] in PICKLE_OPCODES, _read_pickle),
)
"""How a path is read, first row first: the first whose probe holds and whose reader answers.

The order is the loaders' (see the module's docstring). Several paths named together are rank files
(``ranks``, :func:`merge_ranks`); a pre-0.4 tar archive is named and refused (no format reads it).
"""


def detect(target: Target, scopes: tuple[Scope, ...]) -> Checkpoint | None:
    """The checkpoint the first row of these scopes reads, or None when none applies."""
    for row in DETECTION:
        if row.scope in scopes and row.probe(target):
            checkpoint = row.read(target)
            if checkpoint is not None:
                return checkpoint
    return None


def _refuse_unread(target: Target, otherwise: ReadError) -> NoReturn:
    """A file no row read: the most telling reason (a broken safetensors header, text), else ``otherwise``."""
    path, head = target.path, target.head
    if isinstance(otherwise, UnsafePickle):
        # a pickle naming code to run is said so, whatever else its bytes look like (protocol 0 is all text)
        raise otherwise from None
    if target.framing_error is not None:
        raise target.framing_error from None
    if path.endswith(".safetensors") or head[8:9] == b"{":
        from ckpt_tui.core.readers.safetensors_file import length_problem

        raise ReadError(f"{path}: safetensors {length_problem(head, target.size)}") from None
    if looks_like_text(head):
        raise ReadError(f"{path}: a text file, not a checkpoint") from None
    raise otherwise from None


# ---- folders and files ---------------------------------------------------------------------------


def _trainer_beside_engine(target: Target) -> Checkpoint | None:
    """A Trainer's ``checkpoint-N`` of a run with ``deepspeed=`` (its weights file, and DeepSpeed's own save beside
    them under ``latest``): one save of one tool, opened as the Trainer's checkpoint (the weights
    ``from_pretrained`` takes, the engine state named beside them), never refused as two saves; None otherwise."""
    from ckpt_tui.core.readers.folder import holds_trainer_state

    if not holds_trainer_state(target.path, target.listing) or target.zero_folder is None:
        return None
    choice = _weights_choice(target)
    return None if choice is None else _chosen_file(target, choice)


def _refuse_second_save(folder: str, checkpoint: Checkpoint) -> None:
    """A DCP or DeepSpeed folder that also holds a weights file a ``from_pretrained`` takes holds two saves
    (``dcp.load`` or DeepSpeed's ``load_checkpoint`` reads one, ``from_pretrained`` the other: DeepSpeed's own
    ``save_16bit_model`` writes ``pytorch_model.bin`` beside ``latest``): refused in one line naming both and the
    path that opens each, never opened as one of them silently."""
    from ckpt_tui.core.model.contained import WEIGHTS_LOADERS

    first = _folder_save(folder, checkpoint)
    if first is None:
        return
    for loader, names in WEIGHTS_LOADERS:
        found = next((name for name in names if os.path.isfile(os.path.join(folder, name))), None)
        if found is not None:
            said, opens = first
            raise ReadError(
                f"{folder} holds two saves: {said} and {found} (read by {loader}); open one by its path: "
                f"{opens} or {os.path.join(folder, found)}"
            )


def _folder_save(folder: str, checkpoint: Checkpoint) -> tuple[str, str] | None:
    """A save read from a folder by its framework's loader, in words, and the path that opens it alone; None for
    the other formats (a folder of files saved together, which the weights file would be one of)."""
    from ckpt_tui.core.model.contained import DCP_METADATA

    if checkpoint.format == "dcp":
        return f"a torch.distributed.checkpoint ({DCP_METADATA}, read by dcp.load)", os.path.join(folder, DCP_METADATA)
    if checkpoint.format != "deepspeed":
        return None
    said = "a DeepSpeed checkpoint ({}read by DeepSpeed's load_checkpoint and zero_to_fp32)"
    tag = os.path.relpath(checkpoint.path, folder)
    if tag != os.curdir:
        # (the tag folder opened by its path is the DeepSpeed save alone: what lies beside latest is not looked at)
        return said.format(f"{LATEST} naming {tag}/, "), checkpoint.path
    # the tag folder itself: one of its model-states files opens it
    return said.format(""), os.path.join(folder, deepspeed_files(folder, MODEL_STATES)[0])


MAX_SUBFOLDERS = 20
"""Subfolders of a folder holding no checkpoint that are probed for one (cheaply, by the table's probes)."""


def _saves_below(folder: str) -> list[tuple[str, str]]:
    """The immediate subfolders a row of :data:`DETECTION` would read (torchtitan's ``sharded/``), each with what
    it holds in words: for the refusal of a folder that holds no checkpoint itself (probes only, nothing read)."""
    try:
        names = sorted(name for name in places.list_dir(folder) if not name.startswith("."))
    except (OSError, CkptError):
        return []
    found: list[tuple[str, str]] = []
    for name in names[:MAX_SUBFOLDERS]:
        path = places.join(folder, name)
        if not places.is_dir(path):
            continue
        target = Target(path, folder=True)
        try:
            row = next((row for row in DETECTION if row.scope in ("place", "folder") and row.probe(target)), None)
        except (OSError, CkptError):
            continue
        if row is not None:
            found.append((name, format_name(row.formats[0])))
    return found


def _open_directory(path: str) -> Checkpoint:
    target = Target(path, folder=True)
    checkpoint = _trainer_beside_engine(target) or detect(target, ("place", "folder"))
    if checkpoint is None:
        from ckpt_tui.core.readers.folder import no_checkpoint

        raise no_checkpoint(path, _saves_below(path))
    if not places.is_remote(path):
        _refuse_second_save(path, checkpoint)
    from ckpt_tui.core.model.contained import followed_links

    links = followed_links(path, checkpoint.input_files())
    if links:
        # (loaders follow a link out of the folder, so ckpt-tui does too; where the bytes really lie is said)
        checkpoint.notes.append(f"read through a link out of the folder (as its loader follows it): {', '.join(links)}")
    from ckpt_tui.core.readers.dcp import read_dcp
    from ckpt_tui.core.readers.folder import account_for_folder

    if places.is_remote(path) and not places.store_of(path).lists(path):
        # (a web server that lists nothing: the folder's other files are never known, so the report says so)
        return checkpoint
    try:
        # every other file a loader could unpickle is read for code: a folder is clean only when all of it is
        checkpoint.beside = account_for_folder(
            path, checkpoint, _open_plain_file, lambda folder: read_dcp(folder, _open_plain_file)
        )
    except CkptError:
        if not places.is_remote(path):
            raise
        # (a store that cannot list the folder: the report says its other files were not read)
    return checkpoint


def open_shard(path: str) -> Checkpoint:
    """Open one shard of a sharded checkpoint: any single-file format, never another index."""
    return _open_plain_file(path, allow_index=False)


def _open_file(path: str) -> Checkpoint:
    target = Target(path, folder=False)
    whole = detect(target, ("place",))
    if whole is not None:  # one file of a DCP or DeepSpeed folder opens the whole folder
        return whole
    checkpoint = _read_file(target)
    if path.endswith((MODEL_STATES, OPTIM_STATES)) and not lists_its_folder(path):
        checkpoint.notes.append(
            f"one file of a DeepSpeed folder on a web server that lists no folder: opened alone; download its tag "
            f"folder ({places.parent(path)}, every *{MODEL_STATES} and *{OPTIM_STATES}) and open that to see the "
            "whole save"
        )
    whole_set = _hf_dcp_set(checkpoint, path)
    if whole_set is not None:
        return whole_set
    _check_opened(checkpoint, path)  # before anything else walks it
    if checkpoint.flat_columns() is not None:
        # (columns are plain tensors: no ShardedTensor or DTensor to find rank files for)
        return checkpoint
    from ckpt_tui.core.readers.rank_set import with_ranks

    opened = with_ranks(path, checkpoint, _open_plain_file)
    if opened is checkpoint:
        _opened.checked = checkpoint.root
    return opened


def as_named(paths: Sequence[str], checkpoints: Sequence[Checkpoint]) -> list[Checkpoint]:
    """Checkpoints opened from paths named side by side (diff's), each as the file named: files of one rank set
    open the whole set each, and the set compared with itself says nothing, so each of those opens alone (that
    rank's shards)."""
    sets = Counter(_rank_set(path, checkpoint) for path, checkpoint in zip(paths, checkpoints, strict=True))
    shared = {files for files, count in sets.items() if files and count > 1}
    return [
        _open_rank_alone(path) if _rank_set(path, checkpoint) in shared else checkpoint
        for path, checkpoint in zip(paths, checkpoints, strict=True)
    ]


def _rank_set(path: str, checkpoint: Checkpoint) -> tuple[str, ...]:
    """The rank files ``checkpoint`` was opened as when ``path`` names one of them; empty otherwise."""
    if checkpoint.format != "ranks" or places.absolute(path) not in checkpoint.files:
        return ()
    return tuple(checkpoint.files)


def _open_rank_alone(path: str) -> Checkpoint:
    from ckpt_tui.core.readers.rank_set import localize

    def read() -> Checkpoint:
        checkpoint = _open_plain_file(path)
        _check_opened(checkpoint, path)
        return localize(checkpoint)

    return _guarded(path, read)


def _hf_dcp_set(checkpoint: Checkpoint, path: str) -> Checkpoint | None:
    """The whole HF-DCP folder when ``checkpoint`` is one rank's file of it (a safetensors file that says so)."""
    if checkpoint.format != "safetensors":
        return None
    from ckpt_tui.core.readers.hf_dcp import hf_dcp_folder, read_hf_dcp, sharding_info

    if sharding_info(checkpoint) is None:
        return None
    folder = places.parent(path)
    names = hf_dcp_folder(folder)
    if names is not None and len(names) > 1:
        return read_hf_dcp(folder, names, open_shard)
    return None


def _open_member(path: str) -> Checkpoint:
    """One of several files named together: read as it is (folders as folders)."""
    if places.is_file(path) and dcp_folder_of(path) is None and deepspeed_folder(path) is None:
        checkpoint = _open_plain_file(path)
    else:
        checkpoint = _open(path)
    _check_opened(checkpoint, path)  # each member before the ranks are merged
    return checkpoint


def _check_opened(checkpoint: Checkpoint, path: str) -> None:
    """:func:`check_depth` on a file's tree, unless its reader checked it as it built its columns."""
    if checkpoint.flat_columns() is None:
        check_depth(checkpoint.root, path)


def _open_plain_file(path: str, allow_index: bool = True) -> Checkpoint:
    """One file on its own, by its content."""
    return _read_file(Target(path, folder=False, allow_index=allow_index))


def _read_file(target: Target) -> Checkpoint:
    """A file by its bytes: the ``file`` rows, in order."""
    checkpoint = detect(target, ("file",))
    if checkpoint is None:
        _refuse_unread(
            target, ReadError(f"{target.path}: not a checkpoint (unrecognised content: {target.head[:8].hex(' ')})")
        )
    if target.path.endswith(".safetensors") and checkpoint.format != "safetensors":
        checkpoint.loader_problems.append(
            f"its name ends in .safetensors, so torch.load hands it to the safetensors library, "
            f"which refuses it: it is a {format_name(checkpoint.format)}"
        )
    return checkpoint


def is_tar(path: str, head: bytes) -> bool:
    """Whether ``torch.load`` would read the file as a pre-0.4 tar archive (``tarfile.open(mode="r:")``).

    Only a first block whose checksum holds can start a tar archive; ``tarfile`` itself decides then.
    """
    if not _tar_checksum_holds(head):
        return False
    import tarfile

    try:
        with places.open_stream(path) as file, tarfile.open(fileobj=file, mode="r:", format=tarfile.PAX_FORMAT):
            return True
    except tarfile.TarError:
        return False
    except OSError:
        raise
    except Exception:  # torch.load fails the same way reading it as tar: no other reading applies
        return True


def _tar_checksum_holds(head: bytes) -> bool:
    """The test ``tarfile`` applies to a header block: its checksum field equals the sum of its bytes."""
    if len(head) < TAR_BLOCK or head[:TAR_BLOCK].count(0) == TAR_BLOCK:
        return False
    block = head[:TAR_BLOCK]
    field = block[148:156]
    if field[:1] in (b"\x80", b"\xff"):  # base-256 numbers: rare, let tarfile decide
        return True
    digits = field.split(b"\0", 1)[0].strip()
    if not digits or any(c not in b"01234567" for c in digits):
        return False  # not a number (or 0, which no header block sums to)
    unsigned = sum(block[:148]) + 8 * 0x20 + sum(block[156:])
    signed = sum(b - 256 if b > 127 else b for b in block[:148] + block[156:]) + 8 * 0x20
    return int(digits, 8) in (unsigned, signed)


def _with_other_readings(checkpoint: Checkpoint, head: bytes, file_bytes: int) -> Checkpoint:
    """A valid safetensors file that torch.load would read as something else: say so, scan that reading."""
    path = checkpoint.path
    other: str | None = None
    if head.startswith(TORCH_ZIP_START):
        try:
            zipped = _zip_reading(path, file_bytes)
        except ReadError:
            zipped = None
        if zipped is not None:
            other = "a torch zip checkpoint"
            checkpoint.unsafe_globals |= zipped.unsafe_globals
    elif is_tar(path, head) and torch_tar(path):
        other = "a pre-0.4 tar archive"
    elif head[0] in PICKLE_OPCODES:
        with places.open_stream(path) as file:
            if _first_pickle_loads(file, path, checkpoint.unsafe_globals):
                other = "a pickle"
    if other is not None:
        checkpoint.loader_problems.append(
            f"a polyglot: also {other}; torch.load reads it as {other} unless its name ends in .safetensors, "
            "and the safetensors library reads what is shown"
        )
    return checkpoint


def torch_tar(path: str) -> bool:
    """Whether torch.load unpickles this tar's members (it has a ``storages`` member)."""
    from ckpt_tui.core.readers import tar_archive

    return tar_archive.torch_tar(path)


def _first_pickle_loads(file: BinaryIO, path: str, unsafe: set[str]) -> bool:
    """Whether the file starts with a whole pickle (its unsafe globals are added to ``unsafe``)."""
    from ckpt_tui.core.pickles.unpickle import load_pickle

    try:
        load_pickle(file, lambda pid: pid, f"{path}: pickle", unsafe)
    except ReadError:
        return False
    return True
