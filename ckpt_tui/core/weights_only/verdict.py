"""Will ``torch.load(FILE)`` load this file with ``weights_only=True``, the default since torch 2.6?

:func:`scan_file` follows the route ``torch.load`` takes through a file (``.safetensors`` names,
zip or TorchScript archive, legacy tar, the legacy format's five pickles) and runs every pickle it
would unpickle through the emulation in :mod:`ckpt_tui.core.weights_only.scan`. :func:`verdict`
adds where each refused global sits in the checkpoint's tree, whether it is plain data or code,
and the ``torch.serialization.add_safe_globals([...])`` line that makes the file load when every
blocker is data. Nothing here imports torch, numpy or anything the file names.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import itertools
import json
import re
import struct
import sys
import tarfile
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, BinaryIO

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.contained import inside
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.dtypes import DTYPES
from ckpt_tui.core.model.keypath import Attr, KeyPath, file_path_json, to_json, to_python
from ckpt_tui.core.model.tree import Checkpoint, FileBeside, Opaque, Symbol, is_global_ref, iter_nodes, iter_tensors
from ckpt_tui.core.pickles.persistent_ids import formatted_key
from ckpt_tui.core.readers.dcp import tensor_items
from ckpt_tui.core.readers.distributed_globals import PROCESS_GROUP_STATE
from ckpt_tui.core.readers.embedded_zip import FileRange
from ckpt_tui.core.readers.folder import TRAINING_ARGS_HOLDS, trainer_arguments
from ckpt_tui.core.readers.legacy import NOT_ITERABLE, iterated_keys
from ckpt_tui.core.readers.probes import looks_like_safetensors
from ckpt_tui.core.readers.read_once import PickleBytes
from ckpt_tui.core.readers.safetensors_file import library_refusals
from ckpt_tui.core.readers.tar_archive import has_torch_members
from ckpt_tui.core.readers.torch_zip import (
    SMALL_RECORD_HELD,
    ZipRecords,
    listed_name,
    read_small_record,
    record_version,
    unwritten_small_records,
)
from ckpt_tui.core.readers.zip_archive import (
    DEFLATED,
    LOCAL,
    STORED,
    UNSUPPORTED_FLAGS,
    ZipDirectory,
    ZipEntry,
    inflated_size,
    inflates_whole,
    multidisk_member,
    open_refusal,
    read_central_directory,
    unwritten,
    unwritten_text,
)
from ckpt_tui.core.runtime import forked
from ckpt_tui.core.weights_only import tables
from ckpt_tui.core.weights_only.scan import (
    CannotTell,
    Findings,
    GlobalRef,
    PickleScan,
    Refusal,
    WStorage,
    WTensor,
    numpy_dtype_class,
    scan_pickle,
    type_name,
)

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001
MAX_PICKLE = 1 << 32
PATHS_SHOWN = 100
ZIP_VERSIONS = range(1, 11)
"""``version`` records torch's zip reader accepts (kMinSupportedFileFormatVersion..kMax)."""

REMOTE_PREFIX = 1 << 20
"""The first bytes of a remote legacy file scanned for its pickles (more when they run past them)."""


# ---- following torch.load through a file ----------------------------------------------------------


@dataclass
class FileScan(Findings):
    """Everything ``torch.load(path, weights_only=True)`` would unpickle, emulated: the findings of its
    pickles, and how the file itself is read."""

    route: str
    """zip, legacy, pickle, torchscript, tar, safetensors, sharded, dcp, not-a-file"""
    applies: bool = True
    """False where torch.load's weights-only unpickler has nothing to say (safetensors, folders)."""
    reason: str | None = None
    """The first thing that makes torch.load fail whatever is allowlisted; None if nothing does."""
    name_route: bool = False
    """The path ends in ``.safetensors``: torch 2.13+ routes it by name."""
    devices: set[str] = field(default_factory=set)
    deflated: bool = False
    """Some storage record is stored deflated: ``torch.load(mmap=True)`` takes its compressed bytes as values."""
    sized_apart: str | None = None
    """A storage record whose size is not its storage's (which refuses the file): the record and how it differs,
    which ``torch.load(mmap=True)`` never compares."""
    retyped_empty: str | None = None
    """An empty storage record named with two dtypes: torch.load gives each use its own, mmap=True the first's."""
    files: dict[str, str] = field(default_factory=dict)
    """Files loaded one by one (rank files, a folder's files): each one's own answer (loads, refuses,
    cannot_tell, n/a)."""

    def absorb(self, scan: PickleScan, what: str) -> None:
        """Add one pickle's findings."""
        self.add_globals(scan)
        if scan.fatal and self.reason is None:
            self.reason = f"{what}: {scan.fatal}"
        if scan.unknown:
            self.doubt(f"{what}: {scan.unknown}")

    def merge(self, part: FileScan, label: str) -> None:
        """Add one file of a set (a shard, a rank file): its globals, devices and how it is read; its refusal or
        doubt is said with ``label``."""
        self.add_globals(part)
        self.devices |= part.devices
        self.name_route |= part.name_route
        self.deflated |= part.deflated
        self.sized_apart = self.sized_apart or part.sized_apart
        self.retyped_empty = self.retyped_empty or part.retyped_empty
        if part.applies and part.reason:
            self.fail(f"{label}: {part.reason}")
        if part.applies and part.unknown:
            self.doubt(f"{label}: {part.unknown}")

    def fail(self, reason: str) -> None:
        """Record a refusal (the first one wins)."""
        if self.reason is None:
            self.reason = reason

    def doubt(self, what: str) -> None:
        """Record something the emulation does not model (the first one wins): the answer cannot be "loads"."""
        if self.unknown is None:
            self.unknown = what

    def to_wire(self) -> dict[str, Any]:
        """As JSON values (sets as sorted lists, counters and usage as dicts), for :func:`scan_beside`'s child."""
        wire: dict[str, Any] = {}
        for item in fields(self):
            name, value = item.name, getattr(self, item.name)
            if isinstance(value, set):
                value = sorted(value)
            elif isinstance(value, dict):
                value = {key: sorted(item) if isinstance(item, set) else item for key, item in value.items()}
            wire[name] = value
        return wire

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> FileScan:
        """The scan :meth:`to_wire` gave (each field made again as its default is: a set, a Counter, a dict)."""
        scan = cls(wire["route"])
        for item in fields(cls):
            value = wire[item.name]
            if item.name == "usage":
                value = {name: set(hows) for name, hows in value.items()}
            elif item.default_factory is not MISSING:
                value = item.default_factory(value)  # type: ignore[call-arg]
            setattr(scan, item.name, value)
        return scan


class ScanBeside:
    """:func:`scan_file` of a file, in a forked child (:mod:`.forked`) while the caller goes on.

    Started with what its reader read (:meth:`start` as the reader's pickle-read callback, or :meth:`of` an
    opened checkpoint): a zip's entries, which keep its pickle, or a legacy file's :class:`PickleBytes`, the
    child judges the very bytes the tree is built from.
    """

    def __init__(self) -> None:
        self.path: str | None = None
        self.child: forked.Forked | None = None
        self.read: ZipDirectory | PickleBytes | None = None
        """What the reader read, kept where no child could be started: :meth:`result` scans it here."""

    def start(self, path: str, read: ZipDirectory | PickleBytes | None = None) -> None:
        """Scan ``path`` in a child (``read``: what its reader read of it, see :func:`scan_file`); only the
        first call starts one."""
        if self.path is None:
            self.path = path
            self.child = forked.fork(lambda: _scan_read(path, read).to_wire())
            if self.child is None:
                self.read = read

    @classmethod
    def of(cls, checkpoint: Checkpoint) -> ScanBeside:
        """The scan of an opened checkpoint's file, over the bytes its reader read."""
        beside = cls()
        beside.start(checkpoint.path, _central_directory(checkpoint) or _pickles_read(checkpoint))
        return beside

    def result(self, path: str | None = None) -> FileScan | None:
        """The child's scan (where no child could be started: the scan of what the reader read, made here);
        None when nothing was read and no child ran, or it failed, or it scanned another path than ``path`` (a
        file opened as its whole folder): the caller then scans, raising what it raised."""
        wire = self.child.result() if self.child is not None else None
        read, self.child, self.read = self.read, None, None
        if self.path is None or (path is not None and places.absolute(path) != places.absolute(self.path)):
            return None
        if read is not None:
            # no child could be started: the bytes read are scanned here (any failure: the caller scans)
            try:
                return _scan_read(self.path, read)
            except Exception:
                return None
        if wire is None:
            return None
        try:
            return FileScan.from_wire(wire)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


def _scan_read(path: str, read: ZipDirectory | PickleBytes | None) -> FileScan:
    if isinstance(read, PickleBytes):
        return scan_file(path, pickles=read)
    return scan_file(path, read)


def scan_file(path: str, zip_entries: ZipDirectory | None = None, pickles: PickleBytes | None = None) -> FileScan:
    """Follow ``torch.load(path)`` (weights_only=True, no map_location) without running anything.

    ``zip_entries``: the file's central directory when the caller has already read it. ``pickles``: the
    start of a legacy file or plain pickle as its reader read it (scanned as it is; the file is read only
    past it, where the reader stopped before torch.load would).
    """
    if places.is_dir(path):
        return _scan_directory(path)
    if path.endswith(".index.json"):
        return _scan_sharded(path)
    if pickles is not None and places.absolute(pickles.path) == places.absolute(path):
        return _scan_read_pickles(path, pickles)
    size = places.size_of(path)
    with places.open_stream(path) as file:
        head = file.read(512)
        if path.endswith(".safetensors"):
            return _scan_safetensors_name(head, size)
        if head[:4] == b"PK\x03\x04":
            return _scan_zip(path, file, zip_entries, size)
        return _scan_legacy(path, file, head, size)


DCP_READS = "a torch.distributed.checkpoint folder: dcp.load reads it, without weights_only"
DCP_NOTE = (
    "dcp.load reads .metadata with pickle.load and each non-tensor item with torch.load(weights_only=False) "
    "(their unsafe globals are code it runs: see the problems), each tensor item with "
    "torch.load(weights_only=True), failing on one it refuses"
)


def _scan_directory(path: str) -> FileScan:
    if places.is_file(places.join(path, ".metadata")):
        return _scan_dcp(path)
    indexes = sorted(n for n in places.list_dir(path) if n.endswith(".index.json"))
    if len(indexes) == 1:
        return _scan_sharded(places.join(path, indexes[0]))
    return FileScan(
        "not-a-file",
        applies=False,
        reason="a folder: torch.load reads one file (check each file for its verdict; Accelerate's load_state "
        "allowlists numpy arrays itself)",
    )


def _scan_dcp(folder: str) -> FileScan:
    """``dcp.load`` of a DCP folder: weights_only has no say over its metadata and non-tensor items (the
    reader names their unsafe globals), but each tensor item is a ``torch.load(weights_only=True)``: one it
    refuses, or cannot tell, makes the answer "refuses" or "cannot tell" (``dcp.load`` fails on it)."""
    quiet = FileScan("dcp", applies=False, reason=DCP_READS)
    try:
        items = tensor_items(folder)
    except (ReadError, OSError):
        return quiet  # the reader says why (its one-line error)
    chunks = FileScan("dcp")
    # items that differ in their records' bytes alone get one answer (most chunks of a model share a shape)
    judged: dict[bytes, FileScan] = {}
    for label, path, start, length in items:
        try:
            signature = _item_signature(path, start, length)
            part = judged.get(signature) if signature is not None else None
            if part is None:
                part = scan_item(path, start, length)
            if signature is not None:
                judged[signature] = part
        except (ReadError, OSError) as exc:
            part = FileScan("dcp")
            part.fail(f"cannot be read ({exc})")
        chunks.merge(part, f"dcp.load reads tensor item {label} with torch.load(weights_only=True)")
    if chunks.reason is None and chunks.unknown is None and not chunks.refused and not chunks.hidden:
        return quiet
    return chunks


MAX_SIGNED_MEMBER = 1 << 20
"""A zip item member (not a record) longer than this is not signed: the item is scanned on its own."""
LOCAL_CRC = slice(14, 18)
UNSIGNED_CONTENT = "/data/"
"""Members whose bytes no verdict reads: storage records (their fields and local headers are signed)."""
SERIALIZATION_ID = "/.data/serialization_id"
"""The id every torch.save writes anew: the verdict reads only whether torch can decode it."""


def _item_signature(path: str, start: int, length: int) -> bytes | None:
    """What :func:`scan_item` reads of a zip item, hashed: every member's central-directory fields and
    local header but the CRC (torch does not check CRCs), and every member's bytes but the records' and
    the serialization id's. Two items with one signature get one verdict. None for an item that is not a
    plain zip (legacy, colliding names, several disks): it is scanned on its own."""
    with places.open_stream(path) as file:
        view = FileRange(file, start, length)
        if view.read(4) != b"PK\x03\x04":
            return None
        try:
            entries = read_central_directory(view, length)  # type: ignore[arg-type]
        except ReadError:
            return None
        if entries.collisions or entries.disagreement:
            return None
        digest = hashlib.sha256(repr((length, entries.this_disk)).encode())
        for entry in entries.members:
            fields_but_crc = dataclasses.replace(entry, crc=0)
            digest.update(repr(fields_but_crc).encode())
            view.seek(entry.header_offset)
            header = bytearray(view.read(LOCAL.size))
            if len(header) < LOCAL.size:
                return None
            header[LOCAL_CRC] = b"\0\0\0\0"
            name_length, extra_length = LOCAL.unpack(header)[-2:]
            digest.update(bytes(header) + view.read(name_length + extra_length))
            if entry.name.endswith(SERIALIZATION_ID):
                # what _check_small_records reads of it, not its bytes (they differ in every item)
                try:
                    record = _small_record(view, entries, entry.name, length)  # type: ignore[arg-type]
                except _Unheld:
                    return None
                digest.update(b"\0id" + repr((record is None, record == b"?", _is_utf8(record))).encode())
                continue
            if UNSIGNED_CONTENT in entry.name and not entry.name.endswith("/data.pkl"):
                continue
            if entry.compressed_size > MAX_SIGNED_MEMBER:
                return None
            digest.update(b"\0content" + view.read(entry.compressed_size))
        return digest.digest()


MAX_ITEM_PICKLES = 256 << 20
"""The first bytes of a legacy-format DCP item scanned for its pickles."""


def scan_item(path: str, start: int, length: int) -> FileScan:
    """``torch.load(BytesIO(item), weights_only=True)`` of ``path[start:start+length]``, emulated: a zip
    archive (found by its magic, as torch does), else the legacy pickles (torch never tries a BytesIO as tar)."""
    end = start + length
    with places.open_stream(path) as file:
        if end > places.size_of(path):
            raise ReadError(f"byte range {start}+{length} is outside {path}")
        view = FileRange(file, start, length)
        if view.read(4) == b"PK\x03\x04":
            scan = FileScan("zip")
            try:
                entries = read_central_directory(view, length).shifted(start)  # type: ignore[arg-type]
            except ReadError as exc:
                scan.fail(f"torch's zip reader fails: {exc}")
                return scan
            return _scan_zip(path, file, entries, end)
        scan = FileScan("legacy")
        if length == 0:
            scan.fail("an empty item")
            return scan
        view.seek(0)
        data = view.read(min(length, MAX_ITEM_PICKLES))

        def count_at(position: int) -> int:
            view.seek(position)
            return int(struct.unpack("<q", view.read(8).ljust(8, b"\0"))[0])

        _scan_legacy_pickles(data, scan, count_at, length)
        return scan


def _scan_sharded(index_path: str) -> FileScan:
    """A sharded checkpoint loads when every shard does (each is its own torch.load); each shard is found
    as the reader finds it (:func:`~ckpt_tui.core.model.contained.inside`), never opened as named."""
    with places.open_stream(index_path) as file:
        index = json.loads(file.read().decode("utf-8"))
    shards = dict.fromkeys(index.get("weight_map", {}).values()) if isinstance(index, dict) else {}
    combined = FileScan("sharded")
    folder = places.parent(index_path)
    applies = False
    unread: list[str] = []
    for shard in shards:
        if str(shard).endswith(".json"):
            combined.fail(f"shard {shard!r} is another index, not a checkpoint")
            continue
        try:
            part = scan_file(inside(folder, shard, f"{index_path}: shard"))
        except ReadError as exc:
            unread.append(str(exc))
            continue
        applies |= part.applies
        combined.merge(part, f"shard {shard}")
    if unread and shards and all(str(shard).endswith(SAFETENSORS_NAME) for shard in shards):
        # a set of safetensors shards has no pickle to judge, whole or not: its loader fails on the shard itself
        combined.applies = False
        combined.reason = f"safetensors shards hold no pickle; the set cannot be loaded: {unread[0]}"
        return combined
    for reason in unread:
        combined.fail(reason)
    combined.applies = applies
    return combined


SAFETENSORS_NAME = ".safetensors"


def _scan_files(paths: list[str], first: FileScan | None) -> FileScan:
    """Files loaded one by one (rank files): "loads" only when every one does; the first refusal or doubt
    is said with its file (``first``: the first file's scan, already made)."""
    combined = FileScan("files")
    applies = False
    for index, path in enumerate(paths):
        try:
            part = first if index == 0 and first is not None else scan_file(path)
        except Exception as exc:  # a hostile file must give a verdict, never a traceback
            combined.fail(f"{path}: cannot be read as torch.load reads it ({type(exc).__name__}: {exc})")
            combined.files[path] = REFUSES
            continue
        if _accelerate_loads(path, part):
            combined.files[path] = "n/a"
            continue
        applies |= part.applies
        combined.files[path] = verdict_from_scan(part, None).answer or "n/a"
        combined.merge(part, path)
    combined.applies = applies
    return combined


ACCELERATE_RNG_STATES = re.compile(r"random_states_\d+\.pkl\Z|rng_state(_\d+)?\.pth\Z")
"""Accelerate's ``random_states_N.pkl`` and transformers' Trainer's ``rng_state.pth`` (``rng_state_N.pth`` per process):
their loaders (Accelerate's ``load_state``, the Trainer's ``_load_rng_state``) load them with numpy allowlisted."""
ACCELERATE_SAFE_GLOBALS = frozenset(
    {"numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct", "numpy.ndarray"}
    | {"_codecs.encode", "numpy.dtype", "numpy.dtypes.UInt32DType"}
)
"""``accelerate.utils.other.TORCH_SAFE_GLOBALS``: what Accelerate's ``load`` allowlists for its RNG states
(transformers' ``trainer_pt_utils.safe_globals`` allowlists the same numpy names; torch allows ``_codecs.encode``)."""


def _accelerate_loads(path: str, part: FileScan) -> bool:
    """Accelerate's ``random_states_N.pkl`` or the Trainer's ``rng_state.pth``, which their loaders read with numpy
    allowlisted, needing nothing more (not torch.load's own verdict: the folder's loader is theirs)."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    needed = set(part.refused) | set(part.hidden)
    return (
        bool(ACCELERATE_RNG_STATES.match(name))
        and needed <= ACCELERATE_SAFE_GLOBALS
        and not (part.reason or part.unknown)
    )


def beside_code(file: FileBeside) -> list[str]:
    """The code a loader would run from a file beside a checkpoint: its unsafe globals that are not plain data
    (numpy arrays, which Accelerate and transformers allowlist for RNG states, are data) and code its loader runs."""
    data = ACCELERATE_SAFE_GLOBALS
    names = [name for name in file.unsafe_globals if name not in data and classify(name, set())[0] == "code"]
    if trainer_arguments(file.name, names):
        names = []
    return names + file.runs_code


def beside_line(files: list[FileBeside]) -> str | None:
    """One line on a folder's other files read for code: ``also in the folder: optimizer.pt, rng_state.pth: read for
    code: none``, or what each holds; None when there were none."""
    if not files:
        return None
    found = []
    for file in files:
        code = beside_code(file)
        if file.passed_over is not None:
            found.append(f"{file.name} not read ({file.passed_over})")
        elif file.unreadable is not None:
            found.append(f"{file.name} cannot tell ({file.unreadable})")
        elif code:
            shown = ", ".join(code[:3]) + (f" (+{len(code) - 3} more)" if len(code) > 3 else "")
            found.append(f"{file.name} holds code ({shown})")
    names = ", ".join(file.name for file in files[:8]) + (f" (+{len(files) - 8} more)" if len(files) > 8 else "")
    told = [
        f" ({file.name} holds {TRAINING_ARGS_HOLDS})"
        for file in files
        if trainer_arguments(file.name, file.unsafe_globals) and file.unsafe_globals
    ]
    return f"also in the folder: {names}: read for code: {'; '.join(found) if found else 'none'}" + "".join(told)


BESIDE_LINE, BESIDE_CODE, BESIDE_UNREADABLE = "also-in-folder", "code-beside", "cannot-tell-beside"
"""The kinds of what a folder's other files give: the line naming them, one holding code a load runs, one that
cannot be read (so whether a load runs its code cannot be told)."""


def beside_findings(files: list[FileBeside]) -> list[tuple[str, str]]:
    """``(kind, message)`` for each of a folder's other files that holds code or cannot be read, then the line
    naming every file read for code (none when there were none)."""
    found = []
    for file in files:
        code = beside_code(file)
        if file.passed_over is not None:
            # (no part of the save: named in the line, never a problem)
            continue
        if file.unreadable is not None:
            message = f"{file.name} (also in the folder): cannot tell whether a load runs its code: {file.unreadable}"
            found.append((BESIDE_UNREADABLE, message))
        elif code:
            names = ", ".join(code[:5]) + (" …" if len(code) > 5 else "")
            found.append(
                (
                    BESIDE_CODE,
                    f"{file.name} (also in the folder, {file.what}): a load of it runs code: {names} "
                    "(torch.load(weights_only=False), pickle.load or dcp.load would import and run it)",
                )
            )
    line = beside_line(files)
    return found + ([(BESIDE_LINE, line)] if line else [])


def _scan_safetensors_name(head: bytes, size: int) -> FileScan:
    """torch.load (2.13+) hands a ``*.safetensors`` path to ``safetensors.torch.load_file``."""
    scan = FileScan("safetensors", name_route=True)
    if not looks_like_safetensors(head, size):
        scan.reason = (
            "named *.safetensors but not a safetensors file: torch.load (2.13+) hands it to safetensors, which fails; "
            "rename it"
        )
    return scan


# ---- zip archives (torch >= 1.6 and TorchScript) ----------------------------------------------------


def _scan_zip(path: str, file: BinaryIO, entries: ZipDirectory | None, size: int) -> FileScan:
    """torch.load's steps through a zip: PyTorchStreamReader's init (archive folder from the first
    member, version record), ``_is_torchscript_zip`` (every record listed), then ``_load``'s records and
    data.pkl; every record found as torch's reader finds it (:meth:`ZipDirectory.locate`)."""
    scan = FileScan("zip")
    try:
        entries = entries if entries is not None else read_central_directory(file, size)
    except ReadError as exc:
        scan.fail(f"torch's zip reader fails: {exc}")
        return scan
    archive = _archive_folder(entries, size, scan)
    try:
        if archive is None or not _loads_as_checkpoint(file, entries, archive, size, scan):
            return scan
        _check_small_records(file, entries, archive, size, scan)
    except _Unheld as exc:
        scan.doubt(str(exc))
        return scan
    # torch reads uninitialised memory for such a record: what it makes of it cannot be told
    for doubt in unwritten_small_records(entries, archive):
        scan.doubt(doubt)
    records = archive + "data/"
    deflated = [m for m in entries.members if m.compress == DEFLATED and m.name.startswith(records)]
    # miniz's inflate fails on such a record, and torch goes on with the buffer it allocated for it
    bad = next((m for m in deflated if m.size and not unwritten(m) and not inflates_whole(file, m, size)), None)
    if bad is not None:
        scan.doubt(
            f"zip member {bad.name!r} is stored deflated but does not inflate to its {counted(bad.size, 'byte')}: "
            "torch.load gives its tensor uninitialised memory"
        )
    scan.deflated = bool(deflated) and bad is None
    candidates = entries.candidates(archive + "data.pkl")
    if not candidates:
        scan.fail(f"no {archive}data.pkl: torch.load finds no object to load")
        return scan
    picked = entries[archive + "data.pkl"]
    # torch's pick first (its refusal is the one said); then every other candidate, whose globals count too
    for entry in [picked, *(c for c in candidates if c is not picked)]:
        _scan_data_pkl(path, file, entries, archive, entry, scan, size)
    return scan


def _archive_folder(entries: ZipDirectory, size: int, scan: FileScan) -> str | None:
    """The archive folder torch's reader opens (``name/``), or None when opening the zip fails (said in
    ``scan``); names that collide or directories that disagree are doubts."""
    multidisk = multidisk_member(entries)
    if multidisk is not None:
        scan.fail(f"the zip's member {multidisk} lies on another disk (torch's zip reader: unsupported multidisk)")
        return None
    refusal = open_refusal(entries, size)
    if refusal is not None:
        scan.fail(refusal)
        return None
    first = entries.members[0].name if entries.members else ""
    if "/" not in first:
        scan.fail("the zip's first member is not in a folder: torch's zip reader refuses it")
        return None
    if entries.disagreement is not None:
        scan.doubt(entries.disagreement)
    if entries.collisions:
        # torch reads one of each colliding group, another zip reader another: never "loads"
        scan.doubt(f"zip member names collide under torch's comparison: {entries.collision_text()}")
    return first.split("/", 1)[0] + "/"


def _loads_as_checkpoint(file: BinaryIO, entries: ZipDirectory, archive: str, size: int, scan: FileScan) -> bool:
    """Whether torch.load goes on to the archive's records: a supported version record, every record
    listed, and no TorchScript constants (else why not, in ``scan``)."""
    version = _small_record(file, entries, archive + ".data/version", size)
    if version is None:
        version = _small_record(file, entries, archive + "version", size)
    if version is None or record_version(version) not in ZIP_VERSIONS:
        shown = version if version is None else version[:32]
        scan.fail(f"the archive's version record is missing or unsupported ({shown!r})")
        return False
    listed = _record_list(entries, archive)
    if isinstance(listed, str):
        scan.fail(listed)
        return False
    if "constants.pkl" in listed:
        scan.route = "torchscript"
        scan.fail("a TorchScript archive: torch.load(weights_only=True) refuses these (torch.jit.load reads them)")
        return False
    return True


def _check_small_records(file: BinaryIO, entries: ZipDirectory, archive: str, size: int, scan: FileScan) -> None:
    """The small records torch reads before data.pkl: byteorder, serialization id, format version, alignment."""
    order = entries.get(archive + "byteorder")
    # torch compares the whole record with b"little" and b"big": a longer one is refused, whatever it holds
    byteorder = _small_record(file, entries, archive + "byteorder", size) if order and order.size <= 6 else None
    if byteorder == UNINITIALISED:
        scan.doubt(_uninitialised("byteorder"))
    elif order is not None and byteorder not in (b"little", b"big"):
        shown = repr(byteorder) if byteorder not in (None, b"?") else f"of {order.size} bytes"
        scan.fail(f"unknown byteorder record {shown}")
    # torch's reader reads .data/serialization_id when it opens the archive; torch.load reads .format_version
    # (only to compare it with b"1": whatever bytes it gets, it goes on)
    for name in (".data/serialization_id", ".format_version"):
        if _small_record(file, entries, archive + name, size) == b"?":
            scan.fail(f"the {name} record cannot be read by torch's zip reader")
    serialization_id = _small_record(file, entries, archive + ".data/serialization_id", size)
    if serialization_id == UNINITIALISED:
        scan.doubt(_uninitialised(".data/serialization_id"))
    elif serialization_id not in (None, b"?") and not _is_utf8(serialization_id):
        # torch.load's last step logs zip_file.serialization_id(): pybind decodes it as UTF-8, strictly
        scan.fail("the .data/serialization_id record is not UTF-8: torch.load fails after unpickling (both modes)")
    alignment = _small_record(file, entries, archive + ".storage_alignment", size)
    if alignment == UNINITIALISED:
        scan.doubt(_uninitialised(".storage_alignment"))
    elif alignment is not None and not _parses_as_int(alignment):
        scan.fail(f"the .storage_alignment record is not a number ({alignment[:32]!r})")


def _uninitialised(name: str) -> str:
    """Why the verdict cannot tell: torch reads a record as the memory it allocated for it."""
    return f"the {name} record is stored deflated but inflates to nothing whole: torch.load reads uninitialised memory"


def _is_utf8(data: bytes | None) -> bool:
    try:
        (data or b"").decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _record_list(entries: ZipDirectory, archive: str) -> list[str] | str:
    """``get_all_records()`` as torch 2.13 lists them (each name past the archive folder, up to a NUL and
    to 511 bytes, as miniz copies it), or why it fails: a member outside the folder, or a name that is
    not UTF-8 (a longer name cut inside a character is not)."""
    prefix = archive.encode("utf-8", "surrogateescape")
    names = []
    for entry in entries.members:
        raw = listed_name(entry.raw)
        if not raw.startswith(prefix):
            return (
                f"the member {entry.name!r} lies outside the archive folder {archive!r}: "
                "torch's reader refuses to list the archive"
            )
        try:
            names.append(raw[len(prefix) :].decode("utf-8"))
        except UnicodeDecodeError:
            return f"the member name {entry.name!r} is not UTF-8: torch fails listing the archive's records"
    return names


def _scan_data_pkl(
    path: str, file: BinaryIO, entries: ZipDirectory, archive: str, entry: ZipEntry, scan: FileScan, size: int
) -> None:
    """One data.pkl candidate's pickle, its storages' records found as torch finds them."""
    if entry.flags & UNSUPPORTED_FLAGS or entry.compress not in (STORED, DEFLATED):
        how = "marked encrypted or patch data" if entry.flags & UNSUPPORTED_FLAGS else f"compressed ({entry.compress})"
        scan.fail(f"{entry.name} is {how}: torch's zip reader cannot read it")
        return
    if unwritten(entry):
        # torch unpickles whatever the buffer held (it fails, mostly): the file's pickle is never read
        scan.doubt(f"torch.load unpickles uninitialised memory: {unwritten_text(entry)}")
        return
    try:
        # the bytes the tree reader read, when it read this member (never a second read of the file)
        data = entries.read_kept(file, entry, size, limit=MAX_PICKLE)
    except ReadError as exc:
        scan.fail(f"data.pkl cannot be read: {exc}")
        return
    loaded: dict[Any, WStorage] = {}
    # the keys of empty storages (not kept in loaded), whose records torch looks up too, with their first dtype
    empty: dict[Any, str] = {}
    folder = archive + "data/"

    def record_size(key: str) -> int | None:
        found = entries.record(folder, key)
        return None if found is None else found.size

    def storage(pid: tuple[Any, ...]) -> WStorage:
        if len(pid) == 5:  # the usual case, inline: this runs once per storage
            storage_type, key, location, numel = pid[1], pid[2], pid[3], pid[4]
            dtype = getattr(storage_type, "storage_dtype", None)
            if type(key) is str and type(numel) is int and location == "cpu" and dtype and numel >= 0:
                cached = loaded.get(key)
                if cached is not None:
                    return cached
                nbytes = numel * DTYPES[dtype][0]
                if nbytes and record_size(key) == nbytes:
                    found = loaded[key] = WStorage(dtype, nbytes, key, location)
                    return found
        return _zip_storage(pid, record_size, loaded, scan, empty)

    what = "data.pkl" if entry is entries.get(archive + "data.pkl") else f"{entry.name} (a colliding data.pkl)"
    scan.absorb(scan_pickle(data, storage), what)
    keys = [key if type(key) is str else f"{key}" for key in [*loaded, *empty]]
    records = ZipRecords(path, entries, folder, size)
    unreadable = records.unreadable(keys)
    if unreadable is not None:
        scan.fail(unreadable)  # torch reads each record as its storage is loaded
    unwritten_records = records.unwritten(keys)
    if unwritten_records:
        # torch.load "loads" it, but with values of uninitialised memory: never a clean "loads"
        scan.doubt(f"torch.load gives tensors uninitialised memory: {unwritten_text(entries[unwritten_records[0]])}")


def scan_written(data_pkl: bytes, record_sizes: Mapping[str, int]) -> FileScan:
    """``torch.load``'s zip route over a data.pkl a writer is about to write, whose records (``data/<key>``) will
    hold ``record_sizes`` bytes: the same persistent_load and unpickling as a file's data.pkl gets. The zip
    around it (version, record list, alignment) is the writer's own, and checked by it."""
    scan = FileScan("zip")
    loaded: dict[Any, WStorage] = {}
    empty: dict[Any, str] = {}

    def storage(pid: tuple[Any, ...]) -> WStorage:
        return _zip_storage(pid, record_sizes.get, loaded, scan, empty)

    scan.absorb(scan_pickle(data_pkl, storage), "data.pkl")
    return scan


def _parses_as_int(raw: bytes) -> bool:
    """Whether ``int(raw)`` succeeds, as torch.load parses ``.storage_alignment`` (signs, spaces, ``_``)."""
    try:
        int(raw)
    except ValueError:
        return False
    return True


class _Unheld(Exception):
    """A small record too large to read here: the verdict cannot tell what torch makes of it."""


UNINITIALISED = b"?uninitialised"
"""What :func:`_small_record` gives for a record torch reads as uninitialised memory (its data no deflate stream)."""


def _small_record(file: BinaryIO, entries: ZipDirectory, name: str, size: int) -> bytes | None:
    """A record torch reads whole (``getRecord``), whatever its size; b"?" where its zip reader cannot read it,
    :data:`UNINITIALISED` where it reads uninitialised memory."""
    entry = entries.get(name)
    if entry is None:
        return None
    if entry.flags & UNSUPPORTED_FLAGS or entry.compress not in (STORED, DEFLATED):
        return b"?"
    if entry.size > SMALL_RECORD_HELD:
        raise _Unheld(
            f"the {name} record holds {entry.size} bytes, more than ckpt-tui reads to tell what torch makes of it"
        )
    if entry.compress == DEFLATED:
        inflated = inflated_size(file, entry, size)
        # miniz's inflate fails (no deflate stream, or one that does not end), and torch reads the buffer it
        # allocated for the record as it is; a stream that ends at another size is refused ("unexpected size")
        if inflated is None or not inflated[1]:
            return UNINITIALISED
    try:
        return read_small_record(file, entries, entry, size)
    except ReadError:
        return b"?"


def _storage_dtype(storage_type: Any) -> str:
    if type(storage_type) is GlobalRef and storage_type.storage_dtype is not None:
        return storage_type.storage_dtype
    if isinstance(storage_type, WTensor):
        return storage_type.dtype
    if type(storage_type) is GlobalRef and storage_type.entry.role == "tensor_class":
        # torch asks the type for its dtype, and the legacy tensor classes have one: not emulated here
        raise CannotTell(f"a storage persistent id names {storage_type.entry.name}, a tensor class, as its type")
    raise Refusal("a storage persistent id names no storage type")


def _location(value: Any, scan: FileScan) -> str:
    """A storage's location tag; device tags are noted (they need the device, or map_location)."""
    try:
        text = value.decode("ascii") if isinstance(value, bytes) else value
    except UnicodeDecodeError:
        raise Refusal("a storage's location tag is not ASCII") from None
    if text not in ("cpu", "meta"):
        scan.devices.add(text if isinstance(text, str) else repr(text))
    return text if isinstance(text, str) else repr(text)


def _nbytes(numel: Any, dtype: str) -> int:
    # torch multiplies it by the element size: a bool is the int it stands for
    if type(numel) not in (int, bool) or numel < 0:
        raise Refusal("a storage's size is not a non-negative int")
    return int(numel) * DTYPES[dtype][0]


def _zip_storage(
    pid: tuple[Any, ...],
    record_size: Callable[[str], int | None],
    loaded: dict[Any, WStorage],
    scan: FileScan,
    empty: dict[Any, str],
) -> WStorage:
    """``_load``'s persistent_load: the record ``data/<key>`` must exist and hold exactly the storage."""
    if len(pid) != 5:
        raise Refusal(f"a storage persistent id has {len(pid)} fields (torch's zip loader takes 5)")
    _, storage_type, key, location, numel = pid
    dtype = _storage_dtype(storage_type)
    try:
        cached = loaded.get(key)
    except TypeError:
        raise Refusal("a storage key is unhashable") from None
    if cached is not None:
        return cached
    if type(key) is not str and not formatted_key(key):
        # torch reads the record data/{key}: the text of its own object (torch.Size([2, 3]), torch.float32), which a
        # stand-in here does not have
        raise CannotTell(f"a storage key is a {type_name(key)}: torch names its record by that object's text")
    nbytes = _nbytes(numel, dtype)
    size = record_size(key if type(key) is str else f"{key}")
    if size is None:
        raise Refusal(f"storage record data/{key} is missing from the archive")
    if size != nbytes:
        scan.sized_apart = f"data/{key} holds {size} bytes, its storage {nbytes}"
        raise Refusal(f"storage record data/{key} holds {size} bytes, its storage {nbytes}: torch wants equal")
    if location == "meta":
        # torch makes it a meta storage: no data, resizable by set_, and never kept for the key's later uses
        return WStorage(dtype, nbytes, key, "meta", resizable=True)
    storage = WStorage(dtype, nbytes, key, location if location == "cpu" else _location(location, scan))
    if nbytes:
        loaded[key] = storage
    elif empty.setdefault(key, dtype) != dtype and scan.retyped_empty is None:
        # torch keeps no empty storage for the key's later uses, each gets its own dtype; mmap=True keeps the
        # first (its 0-byte slice of the mapped file has a data pointer), so the two modes load other dtypes
        scan.retyped_empty = f"data/{key} is empty and named as {empty[key]} and as {dtype}"
    return storage


# ---- the legacy format and plain pickles --------------------------------------------------------------


def _is_tar(file: BinaryIO) -> bool:
    """Whether torch.load's first try, ``tarfile.open(mode="r:")`` of a real file, ends the load: it opens
    (the legacy tar format), or raises anything but ``TarError``, which torch lets through."""
    file.seek(0)
    try:
        with tarfile.open(fileobj=file, mode="r:", format=tarfile.PAX_FORMAT):
            return True
    except tarfile.TarError:
        return False
    except Exception:
        return True
    finally:
        file.seek(0)


def _scan_legacy(path: str, file: BinaryIO, head: bytes, size: int) -> FileScan:
    early = _scan_legacy_head(file, head, size)
    if early is not None:
        return early
    source = places.source_of(path)
    length = REMOTE_PREFIX
    while True:
        with places.prefix(path, length) as data:
            scan = FileScan("legacy")
            _scan_legacy_pickles(data, scan, _counts(data, source), size)
            read = len(data)
        # a remote file is scanned from its first bytes: a pickle cut by their end is read again, longer
        if read >= size or "(truncated?)" not in (scan.reason or ""):
            source.close()
            return scan
        length *= 4


def _scan_legacy_head(file: BinaryIO, head: bytes, size: int) -> FileScan | None:
    """What torch.load makes of a file that is not a zip before it unpickles it: a safetensors file under
    another name, the legacy tar format, an empty file; None when it goes on to unpickle it."""
    scan = FileScan("legacy")
    if looks_like_safetensors(head, size):
        scan.route = "safetensors"
        scan.fail(
            "a safetensors file under a name that does not end in .safetensors: torch.load unpickles it and fails; "
            "name it *.safetensors (torch 2.13+ then hands it to safetensors) or use safetensors.torch.load_file"
        )
        return scan
    if _is_tar(file):
        scan.route = "tar"
        if has_torch_members(file):
            scan.fail(
                "the legacy .tar format (torch's first try, as tar, opens it or fails on it): torch.load refuses it"
            )
        else:
            scan.fail(
                "a tar archive (torch's first try, as tar, opens it): torch.load refuses any tar, and without "
                "weights_only fails on it before unpickling anything (no 'storages' member: not torch's tar format)"
            )
        file.seek(0)
        return scan
    if size == 0 and not head:
        scan.fail("an empty file")
        return scan
    return None


def _counts(data: Any, source: places.ByteSource) -> Callable[[int], int]:
    """The int64 element count at a position (past ``data``, read from ``source``)."""

    def count_at(position: int) -> int:
        if position + 8 <= len(data):
            return int(struct.unpack_from("<q", data, position)[0])
        return int(struct.unpack("<q", source.read_at(position, 8))[0])

    return count_at


def _scan_read_pickles(path: str, pickles: PickleBytes) -> FileScan:
    """:func:`_scan_legacy` of the bytes a legacy reader read (its file's size as it read them): the element
    counts it read are judged as read too; the file is read again only past what it read, should torch.load
    read further than the reader did (a reader that stopped at a bad pickle)."""
    size, data = pickles.file_bytes, pickles.data
    head = bytes(data[:512])
    if path.endswith(".safetensors"):
        return _scan_safetensors_name(head, size)
    with io.BytesIO(data) as file:
        early = _scan_legacy_head(file, head, size)
    if early is not None:
        return early
    source = places.source_of(path)
    try:
        while True:
            scan = FileScan("legacy")
            _scan_legacy_pickles(data, scan, lambda at: _count_read(pickles, source, at), size)
            if len(data) >= size or "(truncated?)" not in (scan.reason or ""):
                return scan
            # the pickles run past what the reader read: read on (never again what it read)
            more = source.read_at(len(data), max(len(data), REMOTE_PREFIX))
            if not more:
                return scan
            data = bytes(data) + more
    finally:
        source.close()


def _count_read(pickles: PickleBytes, source: places.ByteSource, position: int) -> int:
    """An element count as the reader read it (else read now)."""
    return int(struct.unpack("<q", pickles.read_at(source, position, 8))[0])


def _scan_legacy_pickles(data: Any, scan: FileScan, count_at: Callable[[int], int], size: int) -> None:
    """The five pickles of the legacy format, then the storages' element counts (the data is never read)."""
    position = 0
    values: list[Any] = []
    for what in ("magic number", "protocol version", "sys_info"):
        part = scan_pickle(data, _no_storage, position)
        scan.absorb(part, f"the {what} pickle")
        if scan.reason is not None:
            if what == "magic number":
                scan.route = "pickle"
            return
        values.append(part.result)
        position = part.end
        if what == "magic number" and not (type(part.result) is int and part.result == MAGIC_NUMBER):
            scan.route = "pickle"
            scan.fail("a plain pickle, not a torch checkpoint: torch.load stops at 'Invalid magic number'")
            return
        if what == "protocol version" and not _protocol_matches(part.result, scan):
            return
    storages: dict[Any, WStorage] = {}

    def storage(pid: tuple[Any, ...]) -> WStorage:
        return _legacy_storage(pid, storages, scan)

    main = scan_pickle(data, storage, position)
    scan.absorb(main, "the object pickle")
    # where the emulation could not follow the object pickle, the storages it loads are not all known:
    # the storage list is not checked against them (the answer is "cannot tell" already)
    if scan.reason is not None or main.unknown is not None:
        return
    keys = scan_pickle(data, _no_storage, main.end)
    scan.absorb(keys, "the storage key pickle")
    if scan.reason is None:
        _check_legacy_data(count_at, size, keys.end, keys.result, storages, scan)


def _protocol_matches(value: Any, scan: FileScan) -> bool:
    """``legacy_load``'s ``protocol_version != PROTOCOL_VERSION``: a number equal to 1001 passes (1001.0 too);
    plain data of another kind fails; anything else (a tensor compares element-wise) cannot be told here."""
    if type(value) in (int, float, bool, complex) and value == PROTOCOL_VERSION:
        return True
    if type(value) in (int, float, bool, complex, str, bytes, list, tuple, dict, type(None)):
        scan.fail(f"legacy protocol version {value!r} (torch.load wants {PROTOCOL_VERSION})")
    else:
        scan.doubt(f"the legacy protocol version is a {type_name(value)}: whether torch takes it is not known here")
    return False


def _no_storage(pid: tuple[Any, ...]) -> WStorage:
    raise Refusal("a persistent id where torch.load has no persistent_load")


def _legacy_storage(pid: tuple[Any, ...], storages: dict[Any, WStorage], scan: FileScan) -> WStorage:
    if len(pid) != 6:
        raise Refusal(f"a storage persistent id has {len(pid)} fields (the legacy loader takes 6)")
    _, storage_type, root_key, location, numel, view = pid
    if type(storage_type) is GlobalRef and storage_type.entry.name == "torch.storage.UntypedStorage":
        # uint16/32/64 and fp8 tensors: torch's legacy loader asks the class for a dtype it does not have
        raise Refusal(
            "a storage saved as UntypedStorage (uint16/32/64 or fp8) in the legacy format: torch.load fails on it "
            "with weights_only=True and False alike; ckpt-tui convert rewrites it as a zip checkpoint that loads"
        )
    dtype = _storage_dtype(storage_type)
    place = _location(location, scan)
    nbytes = _nbytes(numel, dtype)
    try:
        root = storages.get(root_key)
    except TypeError:
        raise Refusal("a storage key is unhashable") from None
    if root is None:
        # legacy_load makes UntypedStorage(nbytes): resizable, so a tensor's set_ grows it, and the blob's count
        # must then equal the grown size
        root = storages[root_key] = WStorage(dtype, nbytes, root_key, place, resizable=True)
    if view is None:
        return root
    if not isinstance(view, (tuple, list)) or len(view) != 3:
        raise Refusal("a legacy storage view is not (key, offset, size)")
    view_key, offset, view_size = view
    if type(offset) is not int or type(view_size) is not int:
        raise Refusal("a legacy storage view's offset or size is not an int")
    if offset < 0 or view_size < 0:
        raise CannotTell("a legacy storage view with a negative offset or size (a slice from the end)")
    # legacy_load types the view by its own storage type: offset and size count its elements, not the root's
    size = DTYPES[dtype][0]
    nbytes = max(0, min(view_size * size, root.nbytes - offset * size))
    try:
        return storages.setdefault(view_key, WStorage(dtype, nbytes, view_key, place))
    except TypeError:
        raise Refusal("a legacy storage view key is unhashable") from None


def _check_legacy_data(
    count_at: Callable[[int], int], size: int, start: int, keys: Any, storages: dict[Any, WStorage], scan: FileScan
) -> None:
    listed = iterated_keys(keys)
    if listed is None:
        if type(keys) in NOT_ITERABLE:
            scan.fail(f"the legacy storage key list is a {type_name(keys)}: torch.load fails to iterate it")
        else:
            scan.doubt(f"the legacy storage key list is a {type_name(keys)}: the order torch reads it in is not known")
        return
    position = start
    for key in listed:
        try:
            storage = storages.get(key)
        except TypeError:
            storage = None
        if storage is None:
            scan.fail(f"legacy storage key {key!r} is listed but no tensor uses it")
            return
        if position + 8 > size:
            scan.fail(f"legacy storage {key!r} is missing (file truncated)")
            return
        count = count_at(position)
        itemsize = DTYPES[storage.dtype][0]
        if count * itemsize != storage.nbytes:
            scan.fail(
                f"legacy storage {key!r} holds {count} elements, its persistent id says {storage.nbytes // itemsize}"
            )
            return
        position += 8 + count * itemsize
        if position > size:
            scan.fail(f"legacy storage {key!r} runs past the end of the file (truncated)")
            return


# ---- the verdict ----------------------------------------------------------------------------------------


@dataclass
class Blocker:
    """One global torch refuses: what it is and where it sits in the checkpoint."""

    name: str
    kind: str
    """data (plain data: allowlisting it is safe; sanitize rewrites it) or code"""
    count: int
    paths: list[KeyPath]
    note: str = ""
    assembled: bool = False
    """It sits only inside values the tree shows assembled (a rank's ShardedTensor): what a save writes, the
    plain tensors shown, holds none of it, so deleting those keys is no way out."""

    def to_json(self) -> dict[str, Any]:
        """``{"global", "kind", "paths", "count"}``."""
        out: dict[str, Any] = {
            "global": self.name,
            "kind": self.kind,
            "paths": [to_json(p) for p in self.paths[:PATHS_SHOWN]],
            "count": self.count,
        }
        if self.note:
            out["note"] = self.note
        return out

    def where(self) -> str:
        """``ckpt["args"], ckpt["stats"] (+3 more)``."""
        if not self.paths:
            return "outside the tree"
        shown = ", ".join(to_python(p) if p else "the root" for p in self.paths[:3])
        more = len(self.paths) - 3
        return shown + (f" (+{more} more)" if more > 0 else "")


LOADS, REFUSES, CANNOT_TELL = "loads", "refuses", "cannot_tell"
"""The three answers of a verdict (``Verdict.answer``; None where weights_only does not apply)."""


@dataclass
class Verdict:
    """Whether ``torch.load(FILE)`` (weights_only=True) loads the file, refuses it, or the emulation cannot tell.

    ``loads`` is True only for the answer "loads": "refuses" and "cannot tell" are both False, so code
    that asks ``loads`` never takes doubt for a yes.
    """

    loads: bool | None
    """None where torch.load's weights-only unpickler does not apply (safetensors, DCP folders)."""
    route: str
    torch: str
    """The torch versions this verdict holds for (``2.6–2.14``)."""
    blockers: list[Blocker] = field(default_factory=list)
    reason: str | None = None
    safe_globals: str | None = None
    """``torch.serialization.add_safe_globals([...])``, when every blocker is data and nothing else fails."""
    imports: list[str] = field(default_factory=list)
    """The modules to import before ``torch.load``: for the ``add_safe_globals`` line, and :attr:`needs_import`."""
    needs_import: list[str] = field(default_factory=list)
    """torch's own modules whose import allowlists names the file uses (``torch.distributed.tensor`` for DTensors):
    a fresh process refuses the file; after the import, the other fields' answer holds."""
    notes: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    """Device tags other than ``cpu`` on its storages: torch.load puts them there, so needs those devices."""
    unknown: str | None = None
    """What the emulation does not model, or what ckpt-tui's reader flags, where nothing refuses for sure."""
    files: dict[str, str] = field(default_factory=dict)
    """Files given together: each one's own answer (the verdict loads only when every one does)."""

    @property
    def answer(self) -> str | None:
        """``loads``, ``refuses`` or ``cannot_tell``; None where weights_only does not apply."""
        if self.loads is None:
            return None
        if self.loads:
            return LOADS
        return REFUSES if self.blockers or self.reason is not None or self.needs_import else CANNOT_TELL

    def doubt(self, what: str) -> None:
        """Turn "loads" into "cannot tell: WHAT" (a refusal stays a refusal: torch stops there either way)."""
        if self.loads is None:
            return
        if self.unknown is None:
            self.unknown = what
        self.loads = False

    def to_json(self) -> dict[str, Any]:
        """The ``check --json`` ``weights_only`` object."""
        return {
            "answer": self.answer,
            "loads": self.loads,
            "cannot_tell": self.unknown if self.answer == CANNOT_TELL else None,
            "torch": self.torch,
            "blockers": [b.to_json() for b in self.blockers],
            "route": self.route,
            "reason": self.reason,
            "add_safe_globals": self.safe_globals,
            "imports": self.imports,
            "needs_import": self.needs_import,
            "notes": self.notes,
            "files": [{**file_path_json(path), "answer": answer} for path, answer in self.files.items()],
        }

    def headline(self) -> str:
        """One line: ``weights_only: loads (torch 2.6–2.14)`` or why not; files given together: which
        of them does not load."""
        line = self._headline()
        others = {path: answer for path, answer in self.files.items() if answer not in (LOADS, "n/a")}
        if others and self.loads is not None:
            words = {REFUSES: "refused", CANNOT_TELL: "cannot tell"}
            shown = [f"{path.rstrip('/').rsplit('/', 1)[-1]} {words.get(a, a)}" for path, a in others.items()]
            more = f" (+{len(shown) - 4} more)" if len(shown) > 4 else ""
            line += f" [{len(others)} of {counted(len(self.files), 'file')}: {', '.join(shown[:4])}{more}]"
        return line

    def import_words(self) -> str:
        """``import torch.distributed.tensor`` first (that import allowlists its DTensor classes)``; "" if none."""
        if not self.needs_import:
            return ""
        what = ", ".join(tables.IMPORT_WHAT.get(m, "its classes") for m in self.needs_import)
        statement = "; ".join(f"import {m}" for m in self.needs_import)
        return f"`{statement}` first ({'they allowlist' if len(self.needs_import) > 1 else 'it allowlists'} {what})"

    @property
    def judged_by(self) -> str:
        """``as torch 2.6-2.14 judge it``: the torch versions whose rules give this answer."""
        return f"as torch {self.torch} {'judge' if '-' in self.torch else 'judges'} it"

    def _headline(self) -> str:
        if self.loads is None:
            return f"weights_only: not applicable ({self.reason or self.route})"
        if self.answer == CANNOT_TELL:
            return f"weights_only: CANNOT TELL whether torch.load loads it ({self.judged_by}): {self.unknown}"
        if self.loads and self.route in NO_PICKLE:
            return f"weights_only: n/a: {NO_PICKLE[self.route]}"
        if self.loads and self.devices:
            where = ", ".join(self.devices[:3]) + (" …" if len(self.devices) > 3 else "")
            return f"weights_only: torch.load loads it on a machine with {where} ({self.judged_by})"
        if self.loads:
            return f"weights_only: torch.load loads it ({self.judged_by})"
        if self.route == "torchscript" and not self.blockers and self.unknown is not None:
            # torch.jit.load fails on it or runs its code: never advised
            return (
                f"weights_only: TorchScript: torch.load refuses it ({self.judged_by}); "
                "torch.jit.load is not advised (see the problems)"
            )
        if self.route == "torchscript" and not self.blockers:
            return f"weights_only: TorchScript: load it with torch.jit.load (torch.load refuses it, {self.judged_by})"
        if self.blockers:
            names = ", ".join(b.name for b in self.blockers[:4]) + (" …" if len(self.blockers) > 4 else "")
            return f"weights_only: torch.load REFUSES it ({self.judged_by}): {names}"
        if self.reason is None and self.needs_import:
            # torch's own classes, allowlisted by torch's own import: the one way forward is that import
            # (what the import allowlists was read from torch 2.13: older releases lack some of the classes)
            after = (
                f"CANNOT TELL whether it loads: {self.unknown}"
                if self.unknown
                else f"torch {tables.IMPORTS_READ} loads it"
            )
            return (
                f"weights_only: torch.load REFUSES it in a fresh process ({self.judged_by}); "
                f"with {self.import_words()}, {after}"
            )
        return f"weights_only: torch.load REFUSES it ({self.judged_by}): {self.reason}"


NO_PICKLE = {
    "safetensors": (
        "safetensors has no pickle (torch.load 2.13+ hands a *.safetensors path to safetensors' load_file,"
        " which needs the safetensors package)"
    ),
    "sharded": "safetensors shards hold no pickle, and torch.load reads one file (from_pretrained reads the set)",
}
"""Routes where a "loads" answer is not weights_only's to give: said as not applicable, and why."""


def verdict(checkpoint: Checkpoint, beside: ScanBeside | None = None) -> Verdict:
    """The weights-only verdict for an opened checkpoint (its tree gives the blockers' paths); ``beside``:
    the file's scan already under way in a child process."""
    scan = beside.result(checkpoint.path) if beside is not None else None
    if checkpoint.files:
        # files given together (ranks): torch.load reads each on its own, so each has its say
        scan = _scan_files(checkpoint.files, scan)
    if scan is None:
        try:
            if checkpoint.format == "dcp":
                # its path is the folder, which a web server cannot answer for (only for the files in it)
                scan = _scan_dcp(checkpoint.path)
            else:
                scan = scan_file(checkpoint.path, _central_directory(checkpoint), _pickles_read(checkpoint))
        except Exception as exc:  # a hostile file must give a verdict, never a traceback
            scan = FileScan(checkpoint.format)
            scan.doubt(f"it cannot be read as torch.load reads it ({type(exc).__name__}: {exc})")
    return verdict_from_scan(scan, checkpoint)


def _central_directory(checkpoint: Checkpoint) -> ZipDirectory | None:
    """The zip entries the reader read, with the members it read kept (its pickle's bytes), if any."""
    if checkpoint.format not in ("zip", "torchscript"):
        return None
    archive = checkpoint.archive
    members = archive.zip_members() if archive is not None else None
    if members is not None and places.absolute(members.path) == places.absolute(checkpoint.path):
        return members.entries
    for _, tensor in iter_tensors(checkpoint.root):
        source = tensor.storage.source if tensor.storage is not None else None
        members = source.zip_members() if source is not None else None
        if members is not None and places.absolute(members.path) == places.absolute(checkpoint.path):
            return members.entries
        break
    return None


def _pickles_read(checkpoint: Checkpoint) -> PickleBytes | None:
    """The start of a legacy file or plain pickle as its reader read it, if any."""
    read = checkpoint.archive
    if checkpoint.format in ("legacy", "pickle") and isinstance(read, PickleBytes):
        return read
    return None


HELPER_MODULES = ("builtins.", "collections.", "_codecs.", "copyreg.")
"""Globals a class's pickled state needs besides the class itself: named after the classes torch refuses first."""


def verdict_from_scan(scan: FileScan, checkpoint: Checkpoint | None) -> Verdict:
    """Combine a file scan with the tree: kinds, paths, the allowlisting line, the version range."""
    if not scan.applies:
        reason = scan.reason or _NOT_APPLICABLE.get(scan.route)
        if scan.route == "dcp" and checkpoint is not None and checkpoint.unsafe_globals:
            # its loader has no weights_only: every unsafe global the reader met is code dcp.load runs
            names = sorted(checkpoint.unsafe_globals)
            shown = ", ".join(names[:4]) + (f" (+{len(names) - 4} more)" if len(names) > 4 else "")
            reason = f"{reason}; dcp.load RUNS code from it: {shown}"
        return Verdict(None, scan.route, _versions(scan), reason=reason)
    blockers = _blockers(scan, checkpoint)
    reason = _refusal(scan, checkpoint)
    needs_import = scan.import_modules()
    loads = not blockers and reason is None and not needs_import
    result = Verdict(loads, scan.route, _versions(scan), blockers, reason, files=dict(scan.files))
    result.needs_import = result.imports = needs_import
    if blockers and scan.reason is None and all(b.kind == "data" for b in blockers):
        result.safe_globals, imports = safe_globals_line([b.name for b in blockers], scan)
        result.imports = sorted({*imports, *needs_import})
    _add_doubts_and_notes(result, scan, checkpoint, loads)
    return result


def _blockers(scan: FileScan, checkpoint: Checkpoint | None) -> list[Blocker]:
    """Each refused or hidden global, with where the tree holds it (found ones first), its kind and note."""
    names = dict(scan.refused)
    for name, count in scan.hidden.items():
        names[name] = names.get(name, 0) + count
    where = _locate(checkpoint.root, set(names), checkpoint.replaced) if names and checkpoint is not None else {}
    in_tree = where
    if where and checkpoint is not None and checkpoint.replaced:
        # found only inside values the tree shows assembled: what a save writes (plain tensors) holds none of it
        in_tree = _locate(checkpoint.root, set(where))
    blockers = []
    for name in sorted(names, key=lambda n: (not where.get(n), n.startswith(HELPER_MODULES), n)):
        paths, nodes = where.get(name, ([], 0))
        kind, note = classify(name, scan.usage.get(name, set()))
        if name in scan.hidden:
            note = "not named in the file: numpy builds it, and torch's BUILD checks its type"
        blocker = Blocker(name, kind, max(nodes, names[name], 1), paths, note)
        blocker.assembled = bool(paths) and name not in in_tree
        blockers.append(blocker)
    return blockers


def _refusal(scan: FileScan, checkpoint: Checkpoint | None) -> str | None:
    """Why torch.load fails whatever is allowlisted: the scan's reason, or the safetensors library's."""
    if scan.reason is not None or scan.route != "safetensors" or checkpoint is None:
        return scan.reason
    # torch.load hands the file to the library
    if checkpoint.format == "safetensors" and library_refusals(checkpoint.loader_problems):
        return "safetensors.torch.load_file refuses it, as the safetensors library does"
    return None


def _add_doubts_and_notes(result: Verdict, scan: FileScan, checkpoint: Checkpoint | None, loads: bool) -> None:
    """What the emulation cannot tell, what the reader flags, and notes on routes, devices and versions
    (``loads``: what the scan alone answered, before any doubt)."""
    if scan.unknown is not None:
        result.doubt(scan.unknown)
    flagged = [*checkpoint.runs_code, *checkpoint.loader_problems] if checkpoint is not None else []
    if flagged:
        # torch.save never writes what the reader flags: doubt, never "loads"
        result.doubt(f"ckpt-tui's reader flags it: {flagged[0]}")
    if scan.devices:
        result.devices = sorted(scan.devices)
        tags = ", ".join(result.devices[:5])
        result.notes.append(f"storages tagged {tags}: without that device torch.load needs map_location='cpu'")
    if scan.route == "dcp":
        result.notes.append(DCP_NOTE)
    if scan.setitem_on_other:
        result.notes.append("torch 2.6–2.9 write SETITEM into any object; from 2.10 only into dicts")
    if scan.sized_apart is not None:
        # torch.load(mmap=True) slices each storage out of the mapped file at its record's offset, never sized
        result.notes.append(
            f"storage record {scan.sized_apart}: torch.load(mmap=True), as transformers loads .bin files, does not "
            "compare sizes and loads the storage from the record's start, past its end into the bytes after it "
            "where the record is short; rewrite the file from a trusted copy"
        )
    if scan.retyped_empty is not None:
        result.notes.append(
            f"storage record {scan.retyped_empty}: torch.load gives each of its empty tensors its own dtype (shown), "
            "torch.load(mmap=True) gives them all the first's"
        )
    if scan.deflated:
        # torch.load(mmap=True) slices each storage out of the mapped file at its record's offset, unread
        result.notes.append(
            "storage records are stored deflated: torch.load inflates them (the values shown), but "
            "torch.load(mmap=True) takes their compressed bytes as the values; rewrite with ckpt-tui convert"
        )


_NOT_APPLICABLE = {
    "safetensors": "not a pickle: torch.load (2.13+) hands *.safetensors paths to safetensors.torch.load_file",
    "sharded": "safetensors shards: nothing for weights_only to refuse",
}


def classify(name: str, usage: set[str]) -> tuple[str, str]:
    """``data`` (on the list of classes known to build plain data) or ``code``, with a note when it may be an enum.

    Only the explicit list makes a global data: a class called with one plain value is how an enum
    member pickles, but also how any class runs code on a string (``sympy.Poly("...")``).
    """
    if tables.data_global(name) is not None:
        return "data", ""
    module, _, short = name.rpartition(".")
    top = module.split(".")[0]
    if usage == {"reduce1"} and short[:1].isupper() and top not in sys.stdlib_module_names and top != "torch":
        return "code", "may be an enum member: allowlist it only if you know the class is an Enum"
    return "code", ""


def safe_globals_line(names: list[str], scan: FileScan) -> tuple[str, list[str]]:
    """``torch.serialization.add_safe_globals([...])`` for data-only blockers, and the modules it needs."""
    items: list[str] = []
    modules: set[str] = {"torch"}
    for name in names:
        entry = tables.data_global(name)
        if entry is None:
            raise ValueError(f"{name} is not known as plain data")
        modules.add(entry.module)
        items.append(f'({entry.expression}, "{name}")' if entry.by_name else entry.expression)
    modules.discard("builtins")
    line = "torch.serialization.add_safe_globals([" + ", ".join(items) + "])"
    return line, sorted(modules)


def _versions(scan: FileScan) -> str:
    """The contiguous run of torch versions around 2.13 whose rules give the same verdict."""
    current = (2, 13)

    def same(version: tuple[int, int]) -> bool:
        if scan.setitem_on_other and version < tables.SETITEM_CHECK_SINCE:
            return False
        if scan.name_route and version < tables.SAFETENSORS_ROUTE_SINCE:
            return False
        return all(tables.allowed_in(n, version) == tables.allowed_in(n, current) for n in scan.version_names)

    index = tables.VERSIONS.index(current)
    low = high = index
    while low > 0 and same(tables.VERSIONS[low - 1]):
        low -= 1
    while high + 1 < len(tables.VERSIONS) and same(tables.VERSIONS[high + 1]):
        high += 1
    first, last = tables.VERSIONS[low], tables.VERSIONS[high]
    return tables.version_text(first) + ("" if first == last else "-" + tables.version_text(last))


# ---- where the blockers are ---------------------------------------------------------------------------------


_INTERNAL = ("args[", "state", "callee")


def _locate(
    root: Any, names: set[str], replaced: Mapping[KeyPath, Any] | None = None
) -> dict[str, tuple[list[KeyPath], int]]:
    """For each name: the paths of the values built from it (one walk), and how many values; ``replaced``: values
    the tree shows as something else (sharded tensors assembled), walked as saved at their paths."""
    found: dict[str, tuple[list[KeyPath], set[int]]] = {}

    def note(name: str, path: KeyPath, value: Any) -> None:
        if name not in names:
            return
        paths, seen = found.setdefault(name, ([], set()))
        shown = outer_path(path)
        if shown not in paths:
            paths.append(shown)
        seen.add(id(value))

    walks = [iter_nodes(root), *(iter_nodes(value, path) for path, value in (replaced or {}).items())]
    for path, value in itertools.chain.from_iterable(walks):
        if isinstance(value, Opaque):
            note(value.global_name, path, value)
            if value.how == "reconstructor":
                note("copyreg._reconstructor", path, value)
            if value.global_name == PROCESS_GROUP_STATE:
                # the reader resolves getattr(ShardedTensor, "ProcessGroupState") to the class it names
                note("builtins.getattr", path, value)
            if value.global_name == "numpy.dtype" and value.args:
                note(numpy_dtype_class(value.args[0]), path, value)
        elif is_global_ref(value):
            note(value.global_name, path, value)
        elif isinstance(value, frozenset):
            note("builtins.frozenset", path, value)
        elif isinstance(value, Symbol):
            note(value.qualname, path, value)
    return {name: (paths, len(seen)) for name, (paths, seen) in found.items()}


def outer_path(path: KeyPath) -> KeyPath:
    """The path up to the object whose internals (arguments, pickled state) hold the value."""
    for index, key in enumerate(path):
        if isinstance(key, Attr) and key.name.startswith(_INTERNAL):
            return path[:index]
    return path
