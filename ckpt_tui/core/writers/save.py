"""Save a tree as ``.pth`` (torch zip) or ``.safetensors``: streamed, atomic and verified.

Every write goes to a temporary file beside the target, is fsynced, opened again and checked
against what was meant, and only then renamed over the target. Nothing is left behind on failure.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import struct
import tempfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ckpt_tui.core.edits import CastSource
from ckpt_tui.core.errors import Cancelled, CkptError, WriteError
from ckpt_tui.core.keypath import KeyPath, to_python
from ckpt_tui.core.readers.assembled import AssembledRecords
from ckpt_tui.core.readers.safetensors_file import TORCH_TO_SAFETENSORS
from ckpt_tui.core.readers.torch_zip import ZipRecords
from ckpt_tui.core.tree import Opaque, Storage, Tensor, is_global_ref, iter_nodes, iter_tensors
from ckpt_tui.core.values import CHUNK_ELEMENTS, TensorReader, decode, numpy_dtype
from ckpt_tui.core.writers.pickle_emitter import PickleWriter
from ckpt_tui.core.writers.zip_writer import ZipWriter

FULL_VERIFY_BYTES = 512 << 20
SAMPLE = 4096

Progress = Callable[[int, int], None]
CancelCheck = Callable[[], bool]


@dataclass
class WriteResult:
    """What was written and how it was checked."""

    path: str
    format: str
    tensors: int
    records: int
    nbytes: int
    aliases: dict[str, str]
    verified: str
    storages: list[Storage] = field(default_factory=list, repr=False)

    def line(self) -> str:
        """One line for the user."""
        return (
            f"wrote {self.path} ({self.format}, {self.tensors} tensors, {self.records} records, "
            f"{self.nbytes} bytes); verified: {self.verified}"
        )


def unsafe_globals(root: Any) -> list[tuple[KeyPath, str]]:
    """Unsafe globals still in a tree, with where they are."""
    found: dict[str, KeyPath] = {}
    for path, value in iter_nodes(root):
        if (isinstance(value, Opaque) or is_global_ref(value)) and not value.safe:
            found.setdefault(value.global_name, path)
    return [(path, name) for name, path in found.items()]


def save(
    root: Any,
    target: str | os.PathLike[str],
    fmt: str | None = None,
    *,
    byteorder: str = "little",
    force: bool = False,
    inputs: tuple[str, ...] = (),
    progress: Progress | None = None,
    cancelled: CancelCheck | None = None,
) -> WriteResult:
    """Write ``root`` to ``target`` atomically and verify it; refuse what cannot be written faithfully."""
    path = Path(target)
    fmt = fmt or ("safetensors" if path.suffix == ".safetensors" else "pth")
    if fmt not in ("pth", "safetensors"):
        raise WriteError(f"unknown output format {fmt!r} (pth or safetensors)")
    _refuse_unsafe(root)
    _check_target(path, force, inputs)
    plan = SafetensorsPlan(root, byteorder) if fmt == "safetensors" else None
    folder = path.parent if str(path.parent) else Path(".")
    try:
        handle, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise WriteError(f"cannot write in {folder}: {exc.strerror or exc}") from None
    temp = Path(temp_name)
    try:
        with os.fdopen(handle, "w+b") as file:
            if plan is not None:
                result = plan.write(file, progress, cancelled)
            else:
                result = write_pth(root, file, path.stem or "archive", byteorder, progress, cancelled)
            file.flush()
            os.fsync(file.fileno())
        result.verified = verify(temp, root, fmt, result)
        os.chmod(temp, 0o644 & ~_umask())
        os.replace(temp, path)
        _fsync_folder(folder)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            temp.unlink()
        if isinstance(exc, CkptError):
            raise
        if isinstance(exc, OSError):
            raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise
    result.path = str(path)
    return result


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_folder(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _refuse_unsafe(root: Any) -> None:
    found = unsafe_globals(root)
    if found:
        names = ", ".join(f"{name} at {to_python(path) if path else 'the root'}" for path, name in found[:5])
        raise WriteError(f"refusing to write unsafe globals ({names}); extract or drop them first")


def _check_target(path: Path, force: bool, inputs: tuple[str, ...]) -> None:
    if path.is_dir():
        raise WriteError(f"{path} is a directory")
    if path.exists() and not path.is_file():
        raise WriteError(f"{path} is not a regular file (a device or pipe?); refusing to replace it")
    if not path.exists():
        if not path.parent.exists() and str(path.parent):
            raise WriteError(f"{path.parent}: no such directory")
        return
    is_input = any(os.path.exists(i) and os.path.samefile(i, path) for i in inputs)
    if not force:
        what = "is the input file" if is_input else "exists"
        raise WriteError(f"{path} {what}; use --force to replace it")


# ---- .pth -------------------------------------------------------------------------------


class RecordPlan:
    """Output storages in first-use order, numbered as torch numbers them."""

    def __init__(self) -> None:
        self.keys: dict[int, str] = {}
        self.storages: list[Storage] = []

    def key(self, storage: Storage) -> str:
        """The output record key of a storage (assigned on first use)."""
        key = self.keys.get(id(storage))
        if key is None:
            key = self.keys[id(storage)] = str(len(self.storages))
            self.storages.append(storage)
        return key


def write_pth(
    root: Any, file: BinaryIO, archive: str, byteorder: str, progress: Progress | None, cancelled: CancelCheck | None
) -> WriteResult:
    """The torch zip layout: data.pkl, small records, then storages, as ``torch.save`` writes them."""
    plan = RecordPlan()
    data_pkl = PickleWriter(plan.key).dump(root)
    archive = "".join(c if c.isalnum() or c in "._-" else "_" for c in archive) or "archive"
    zip_file = ZipWriter(file)
    zip_file.add_bytes(f"{archive}/data.pkl", data_pkl)
    zip_file.add_bytes(f"{archive}/.format_version", b"1")
    zip_file.add_bytes(f"{archive}/.storage_alignment", b"64")
    zip_file.add_bytes(f"{archive}/byteorder", byteorder.encode())
    total = sum(s.nbytes for s in plan.storages)
    done = 0

    def advance(count: int) -> None:
        nonlocal done
        done += count
        if cancelled is not None and cancelled():
            raise Cancelled("save cancelled")
        if progress is not None:
            progress(done, total)

    sources: dict[str, BinaryIO] = {}
    try:
        for index, storage in enumerate(plan.storages):
            _write_storage(zip_file, f"{archive}/data/{index}", storage, byteorder, sources, advance)
    finally:
        for handle in sources.values():
            handle.close()
    zip_file.add_bytes(f"{archive}/version", b"3\n")
    zip_file.add_bytes(f"{archive}/.data/serialization_id", str(secrets.randbits(128)).zfill(40).encode())
    zip_file.close()
    tensors = sum(1 for _ in iter_tensors(root))
    return WriteResult("", "pth", tensors, len(plan.storages), file.tell(), {}, "", plan.storages)


def _write_storage(
    zip_file: ZipWriter,
    name: str,
    storage: Storage,
    byteorder: str,
    sources: dict[str, BinaryIO],
    advance: Callable[[int], None],
) -> None:
    source = storage.source
    if isinstance(source, CastSource):
        zip_file.add_stream(name, storage.nbytes, cast_chunks(source.base, storage.dtype, byteorder), None, advance)
        return
    if source is None:
        raise WriteError(f"storage {storage.key} has no data in this file")
    if isinstance(source, AssembledRecords):  # pieces in several files (distributed checkpoints)
        whole = Tensor(storage, 0, (storage.numel,), (1,), storage.dtype)
        zip_file.add_stream(name, storage.nbytes, tensor_bytes(whole), None, advance)
        return
    offset, available = source.locate(storage)
    handle = sources.get(source.path)
    if handle is None:
        handle = sources[source.path] = open(source.path, "rb")  # noqa: SIM115 - closed by the caller
    crc = None
    if isinstance(source, ZipRecords) and available == storage.nbytes:
        crc = source.entry(storage).crc
    if crc is None:
        zip_file.add_stream(name, storage.nbytes, _file_chunks(handle, offset, storage.nbytes), None, advance)
    else:
        zip_file.add_copy(name, handle, offset, storage.nbytes, crc, advance)


def _file_chunks(handle: BinaryIO, offset: int, size: int) -> Iterator[bytes]:
    handle.seek(offset)
    remaining = size
    while remaining:
        data = handle.read(min(remaining, 16 << 20))
        if not data:
            raise WriteError("source file ended early")
        remaining -= len(data)
        yield data


def cast_chunks(base: Storage, dtype: str, byteorder: str) -> Iterator[bytes]:
    """A storage's elements converted to ``dtype``, a bounded chunk at a time."""
    whole = Tensor(base, 0, (base.numel,), (1,), base.dtype)
    target = numpy_dtype(dtype, byteorder)
    for raw in TensorReader(whole, byteorder).chunks(CHUNK_ELEMENTS):
        values = decode(raw, base.dtype)
        if dtype == "bfloat16":
            yield _to_bfloat16(values).astype(target).tobytes()
        else:
            yield values.astype(target).tobytes()


def _to_bfloat16(values: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 → bfloat16 bits (NaN stays NaN)."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    rounded[np.isnan(values)] = 0x7FC0
    return rounded


# ---- .safetensors -------------------------------------------------------------------------


class SafetensorsPlan:
    """A flat dict of tensors laid out as safetensors; identical tied views written once."""

    def __init__(self, root: Any, byteorder: str) -> None:
        if byteorder != "little":
            raise WriteError("big-endian checkpoints cannot be written as safetensors")
        if not isinstance(root, dict) or not all(isinstance(k, str) for k in root):
            raise WriteError("safetensors holds one flat dict of tensors; this checkpoint is nested: use --extract")
        others = [k for k, v in root.items() if not isinstance(v, Tensor)]
        if others:
            listed = ", ".join(repr(k) for k in others[:5])
            raise WriteError(f"safetensors holds only tensors; {listed} are not (use --extract or --drop)")
        self.tensors: dict[str, Tensor] = {}
        self.aliases: dict[str, str] = {}
        self._plan(root)

    def _plan(self, root: dict[str, Tensor]) -> None:
        views: dict[tuple[Any, ...], str] = {}
        spans: dict[int, list[tuple[int, int, str]]] = {}
        for name, tensor in root.items():
            if tensor.dtype not in TORCH_TO_SAFETENSORS or tensor.kind != "dense" or tensor.storage is None:
                raise WriteError(f"{name!r}: {tensor.dtype} {tensor.kind} tensors cannot be written as safetensors")
            view = (id(tensor.storage), tensor.offset, tensor.shape, tensor.stride, tensor.dtype)
            if view in views:
                self.aliases[name] = views[view]
                continue
            views[view] = name
            extent = tensor.offset + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride, strict=True)) + 1
            span = (tensor.offset, extent if tensor.numel else tensor.offset, name)
            for begin, end, other in spans.get(id(tensor.storage), []):
                if span[0] < end and begin < span[1]:
                    raise WriteError(
                        f"{name!r} and {other!r} share memory but are different views; safetensors cannot tie them"
                    )
            spans.setdefault(id(tensor.storage), []).append(span)
            self.tensors[name] = tensor

    def header(self) -> bytes:
        """The JSON header, padded to 8 bytes as safetensors pads it."""
        entries: dict[str, Any] = {}
        if self.aliases:
            entries["__metadata__"] = dict(self.aliases)
        offset = 0
        for name, tensor in self.tensors.items():
            entries[name] = {
                "dtype": TORCH_TO_SAFETENSORS[tensor.dtype],
                "shape": list(tensor.shape),
                "data_offsets": [offset, offset + tensor.nbytes],
            }
            offset += tensor.nbytes
        raw = json.dumps(entries, separators=(",", ":")).encode()
        return raw + b" " * ((-len(raw)) % 8)

    def write(self, file: BinaryIO, progress: Progress | None, cancelled: CancelCheck | None) -> WriteResult:
        """Header, then each tensor's bytes in order."""
        header = self.header()
        file.write(struct.pack("<Q", len(header)) + header)
        total = sum(t.nbytes for t in self.tensors.values())
        done = 0
        for tensor in self.tensors.values():
            for chunk in tensor_bytes(tensor):
                file.write(chunk)
                done += len(chunk)
                if cancelled is not None and cancelled():
                    raise Cancelled("save cancelled")
                if progress is not None:
                    progress(done, total)
        return WriteResult(
            "",
            "safetensors",
            len(self.tensors) + len(self.aliases),
            len(self.tensors),
            file.tell(),
            dict(self.aliases),
            "",
        )


def tensor_bytes(tensor: Tensor) -> Iterator[bytes]:
    """A tensor's elements as contiguous little-endian bytes (cast storages converted)."""
    storage = tensor.storage
    assert storage is not None
    if isinstance(storage.source, CastSource):
        base = storage.source.base
        whole = Tensor(base, tensor.offset, tensor.shape, tensor.stride, base.dtype)
        target = numpy_dtype(tensor.dtype)
        for raw in TensorReader(whole).chunks():
            values = decode(raw, base.dtype)
            yield (_to_bfloat16(values) if tensor.dtype == "bfloat16" else values.astype(target)).tobytes()
        return
    for raw in TensorReader(tensor).chunks():
        yield raw.tobytes()


# ---- verification --------------------------------------------------------------------------


def _layout(root: Any) -> Iterator[tuple[KeyPath, tuple[int, ...], str, str]]:
    return ((p, t.shape, t.dtype, t.device) for p, t in iter_tensors(root))


def _same(left: Iterator[Any], right: Iterator[Any]) -> bool:
    """Equal sequences, compared item by item without building lists."""
    missing = object()
    return all(a == b for a, b in itertools.zip_longest(left, right, fillvalue=missing))


def verify(path: Path, root: Any, fmt: str, result: WriteResult) -> str:
    """Open the written file again and compare it with what was meant; raise if it differs."""
    from ckpt_tui.core.reading import open_checkpoint

    try:
        written = open_checkpoint(path)
    except CkptError as exc:
        raise WriteError(f"the written file does not read back ({exc}); nothing was replaced") from None
    if fmt == "safetensors":
        meant = {k: v for k, v in root.items() if k not in result.aliases}
        if sorted(_layout(written.root)) != sorted((p, s, d, "cpu") for p, s, d, _ in _layout(meant)):
            raise WriteError("the written safetensors file does not match the tensors meant; nothing was replaced")
        pairs = [(written.root[name], meant[name]) for name in meant]
        full = sum(t.nbytes for t in meant.values()) <= FULL_VERIFY_BYTES
        for got, want in pairs if full else []:
            if _crc(tensor_bytes(got)) != _crc(tensor_bytes(want)):
                raise WriteError(f"tensor {got.storage.key!r} was not written faithfully; nothing was replaced")
        return "keys, shapes, dtypes" + (", tensor bytes" if full else "")
    if not _same(_layout(written.root), _layout(root)) or not _same(_paths(written.root), _paths(root)):
        raise WriteError("the written file does not match the tree meant; nothing was replaced")
    return _verify_records(path, written.root, result.storages)


def _paths(root: Any) -> Iterator[KeyPath]:
    return (p for p, _ in iter_nodes(root))


def _crc(chunks: Iterator[bytes]) -> int:
    value = 0
    for chunk in chunks:
        value = zlib.crc32(chunk, value)
    return value


def _verify_records(path: Path, root: Any, meant: list[Storage]) -> str:
    """Every record's CRC recomputed when the data is small enough, and its edges against the source."""
    written = {id(t.storage): t.storage for _, t in iter_tensors(root) if t.storage is not None}
    full = sum(s.nbytes for s in meant) <= FULL_VERIFY_BYTES
    sources: dict[str, BinaryIO] = {}
    with open(path, "rb") as handle:
        try:
            for storage in written.values():
                source = storage.source
                assert isinstance(source, ZipRecords)
                entry = source.entry(storage)
                offset, size = source.locate(storage)
                if full and _crc(_file_chunks(handle, offset, size)) != entry.crc:
                    raise WriteError(f"record {entry.name} fails its CRC; nothing was replaced")
                _compare_edges(handle, offset, size, meant[int(storage.key)], sources)
        finally:
            for source_file in sources.values():
                source_file.close()
    return "keys, order, shapes, dtypes, devices" + (", record CRCs" if full else "") + ", record bytes at the edges"


def _read_at(handle: BinaryIO, offset: int, size: int) -> bytes:
    handle.seek(offset)
    return handle.read(size)


def _compare_edges(handle: BinaryIO, offset: int, size: int, meant: Storage, sources: dict[str, BinaryIO]) -> None:
    source = meant.source
    if source is None or isinstance(source, CastSource) or size == 0:
        return
    head = min(SAMPLE, size)
    if isinstance(source, AssembledRecords):
        for at in {0, size - head}:
            if _read_at(handle, offset + at, head) != source.read_bytes(meant, at, head):
                raise WriteError(f"record {meant.key} was not assembled faithfully; nothing was replaced")
        return
    source_offset, _ = source.locate(meant)
    src = sources.get(source.path)
    if src is None:
        src = sources[source.path] = open(source.path, "rb")  # noqa: SIM115 - closed by the caller
    for at in {0, size - head}:
        if _read_at(handle, offset + at, head) != _read_at(src, source_offset + at, head):
            raise WriteError(f"record {meant.key} was not copied faithfully; nothing was replaced")
