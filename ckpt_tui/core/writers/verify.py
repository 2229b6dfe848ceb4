"""Verification: the written file, read again from disk, is what was meant, and nothing unsafe is in it.

Verify smarter, not less. Rather than parsing the written file into a second tree and walking
both, the checks compare what is on disk with what the writer meant, and scan everything that
could run code:

- every byte written from memory (headers, data.pkl, the zip directory, the safetensors header,
  small records, converted tensors) is read back and has the CRC it had when written; every range
  copied by the kernel has the source's CRC (the source zip's own), or, where the source has none
  (safetensors), equals the source's bytes, compared chunk by chunk;
  together these ranges tile the file;
- ``.pth``: the data.pkl on disk is thereby the one meant, byte for byte (every key, order, shape,
  stride, dtype and device tag); it is unpickled once more by the reader's own ``find_class``
  (nothing is rebuilt), and any global the reader does not know as data refuses the write; its
  storages are named 0, 1, ... in first-use order with the types, devices and sizes meant, and
  every record starts on a 64-byte boundary;
- ``.safetensors``: the header on disk is thereby the one meant.

When more than :data:`FULL_VERIFY_BYTES` were written, ranges are not re-read whole: their first
and last 4 KB are compared with what was written (or with the source, for copies).
"""

from __future__ import annotations

import io
import os
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpt_tui.core.errors import CkptError, WriteError
from ckpt_tui.core.model.byte_source import ByteSource
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.tree import Storage
from ckpt_tui.core.pickles.unpickle import SafeUnpickler
from ckpt_tui.core.runtime.process import gc_paused
from ckpt_tui.core.writers.output import EDGE, WriteLog
from ckpt_tui.core.writers.pickle_emitter import REBUILD_FUNCTIONS, resolved_type, storage_class
from ckpt_tui.core.writers.pth import PthWrite
from ckpt_tui.core.writers.source_bytes import SMALL, SourceReader
from ckpt_tui.core.writers.zip_writer import ALIGNMENT

if TYPE_CHECKING:
    from ckpt_tui.core.writers.safetensors_out import SafetensorsWrite

FULL_VERIFY_BYTES = 512 << 20
CHUNK = 16 << 20
SCAN_BUFFER = 1 << 20
NOTHING_REPLACED = "nothing was replaced"


def _refused(what: str) -> WriteError:
    return WriteError(f"{what}; {NOTHING_REPLACED}")


# ---- scanning a written pickle ------------------------------------------------------------


class _Built:
    """What an opaque global stands for while scanning: accepts any call, state, item or append."""

    qualname = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> _Built:
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        """Accept an APPEND."""

    def extend(self, values: Any) -> None:
        """Accept an APPENDS."""


_ACCEPT_ANY = "".format  # a C function taking any arguments: the cheapest stand-in for rebuild calls


class GlobalScan(SafeUnpickler):
    """Unpickles with the reader's ``find_class`` deciding what each global is, but rebuilds nothing.

    ``unsafe_names`` then holds every global the reader calls unsafe (what opening the file would put
    in ``Checkpoint.unsafe_globals``); ``storages`` the persistent ids, in stream order.
    """

    def __init__(self, data: bytes) -> None:
        self.storages: list[Any] = []
        self.persistent_load = self.storages.append  # type: ignore[method-assign,assignment]  # C speed
        self.stubs: dict[str, Any] = {}
        """The stand-in of each global met, by name."""
        # Buffered: the C unpickler prefetches through ``peek``; on a bare BytesIO it calls ``read`` per opcode.
        super().__init__(io.BufferedReader(io.BytesIO(data), SCAN_BUFFER), None)

    def find_class(self, module: str, name: str) -> Any:
        super().find_class(module, name)  # the reader's decision, recorded in unsafe_names
        qualname = f"{module}.{name}"
        stub = self.stubs.get(qualname)
        if stub is None:
            if qualname in REBUILD_FUNCTIONS:
                stub = _ACCEPT_ANY
            elif qualname == "collections.OrderedDict":
                stub = OrderedDict
            else:
                stub = type("Built", (_Built,), {"qualname": qualname})
            self.stubs[qualname] = stub
        return stub


def scan_pickle(data: bytes) -> GlobalScan:
    """Run the scan over a whole pickle."""
    scan = GlobalScan(data)
    try:
        with gc_paused():
            scan.load()
    except CkptError:
        raise
    except Exception as exc:  # a pickle the writer produced must load; anything else is a failed write
        raise _refused(f"the written data.pkl does not unpickle ({type(exc).__name__})") from None
    return scan


def refuse_unsafe(names: set[str], where: str) -> None:
    """Refuse a written file that holds any global the reader does not know as data."""
    if names:
        raise _refused(f"the written {where} holds unsafe globals ({', '.join(sorted(names)[:5])})")


# ---- .pth ---------------------------------------------------------------------------------


def verify_pth(path: Path, meant: PthWrite) -> str:
    """Check a written ``.pth`` against what was meant; raise :class:`WriteError` if anything differs.

    Returns what was checked, in words (what ``torch.load(weights_only=True)`` makes of it is
    :mod:`.judge`'s to say).
    """
    full = check_log(path, meant.log, meant.nbytes)
    scan = scan_pickle(meant.data_pkl)  # the bytes on disk are these (checked above)
    refuse_unsafe(scan.unsafe_names, "data.pkl")
    _check_storages(scan, meant.storages)
    _check_alignment(meant)
    records = counted(len(meant.storages), "record")
    what = f"data.pkl as meant, no unsafe globals, {records} in first-use order, 64-byte aligned"
    return what + (", every byte's CRC" if full else ", CRCs of the metadata, record bytes at the edges")


def _check_storages(scan: GlobalScan, meant: list[Storage]) -> None:
    """Persistent ids name the records 0, 1, ... in first-use order, with the types, devices and sizes meant.

    The distinct ids in stream order must equal the ids meant, ``('storage', type, '0', location, size)``,
    ``('storage', type, '1', ...)`` ...: one comparison of two lists says it all (with no storage shared,
    the ids found are those); a mismatch is then named.
    """
    expected = _meant_ids(meant, scan.stubs)
    if scan.storages == expected:
        return
    try:
        distinct = list(dict.fromkeys(scan.storages))
    except TypeError:  # an unhashable part: not an id the writer makes
        raise _refused("the written data.pkl holds a persistent id that is not a storage") from None
    if not all(type(pid) is tuple and len(pid) == 5 and pid[0] == "storage" for pid in distinct):
        raise _refused("the written data.pkl holds a persistent id that is not a storage")
    if distinct != expected:
        _name_mismatch(distinct, meant)


def _meant_ids(meant: list[Storage], stubs: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The persistent ids meant, with the scan's stand-in for each storage type (None where it met none)."""
    kinds: dict[tuple[str, str], tuple[Any, bool]] = {}
    for type_name, dtype in {(storage.type_name, storage.dtype) for storage in meant}:
        written = storage_class(type_name, dtype)
        qualname = "torch.storage.UntypedStorage" if written == "UntypedStorage" else f"torch.{written}"
        kinds[type_name, dtype] = (stubs.get(qualname), written == "UntypedStorage")
    if len(kinds) == 1:
        ((stub, untyped),) = kinds.values()
        if not untyped:  # one typed storage class, the usual case: one comprehension
            return [("storage", stub, str(i), storage.location, storage.numel) for i, storage in enumerate(meant)]
    ids = []
    for index, storage in enumerate(meant):
        stub, untyped = kinds[storage.type_name, storage.dtype]
        ids.append(("storage", stub, str(index), storage.location, storage.nbytes if untyped else storage.numel))
    return ids


def _name_mismatch(distinct: list[tuple[Any, ...]], meant: list[Storage]) -> None:
    """Refuse, naming what differs between the distinct persistent ids found and the storages meant."""
    order = [pid[2] for pid in distinct]
    if order != [str(index) for index in range(len(meant))]:
        raise _refused("the written data.pkl does not name its records once each, in first-use order")
    for index, (storage, (_, kind, _, location, count)) in enumerate(zip(meant, distinct, strict=True)):
        type_name = resolved_type(storage)
        qualname = "torch.storage.UntypedStorage" if type_name == "UntypedStorage" else f"torch.{type_name}"
        numel = storage.nbytes if type_name == "UntypedStorage" else storage.numel
        if (getattr(kind, "qualname", "?"), location, count) != (qualname, storage.location, numel):
            raise _refused(f"the written data.pkl names record {index} with another type, device or size")
    raise _refused("the written data.pkl does not name its storages as meant")


def _check_alignment(meant: PthWrite) -> None:
    """Every record's data starts on a 64-byte boundary (the local headers on disk are the ones meant)."""
    records = f"{meant.archive}/data/"
    for entry in meant.entries:
        if entry.data_offset % ALIGNMENT and entry.name.startswith(records):
            raise _refused(f"record {entry.name} is not aligned to {ALIGNMENT} bytes")


# ---- .safetensors -----------------------------------------------------------------------


def verify_safetensors(path: Path, meant: SafetensorsWrite) -> str:
    """Check a written ``.safetensors`` against what was meant; raise :class:`WriteError` if anything differs."""
    full = check_log(path, meant.log, meant.nbytes)
    compared = any(copy.crc is None for copy in meant.log.copies)
    full_words = ", every byte (CRCs; copies compared with the source)" if compared else ", every byte's CRC"
    return "header as meant" + (full_words if full else ", the header's CRC, tensor bytes at the edges")


# ---- the write log against the disk ------------------------------------------------------


def check_log(path: Path, log: WriteLog, size: int) -> bool:
    """Every logged range on disk is what was written (CRCs, or edges above the limit); True if whole."""
    name = str(path)
    ranges = sorted([(s.offset, s.size) for s in log.segments] + [(c.offset, c.size) for c in log.copies])
    at = 0
    for offset, length in ranges:
        if offset != at:
            raise _refused(f"the write log does not cover bytes {at} to {offset}")
        at += length
    if at != size or os.path.getsize(name) != size:
        raise _refused(f"the written file has {os.path.getsize(name)} bytes, {size} were meant")
    full = size <= FULL_VERIFY_BYTES
    small = sum(s.size for s in log.segments) <= FULL_VERIFY_BYTES
    with SourceReader() as disk, SourceReader(log.versions) as sources:
        for segment in log.segments:
            if full or small or segment.size <= 2 * EDGE:
                if crc_at(disk, name, segment.offset, segment.size) != segment.crc:
                    raise _refused(
                        f"bytes {segment.offset} to {segment.offset + segment.size} are not what was written"
                    )
            else:
                written = disk.source(name)
                head = written.read_at(segment.offset, len(segment.head))
                tail = written.read_at(segment.offset + segment.size - len(segment.tail), len(segment.tail))
                if head != segment.head or tail != segment.tail:
                    raise _refused(f"bytes near offset {segment.offset} are not what was written")
        for copy in log.copies:
            if full and copy.crc is not None:
                if crc_at(disk, name, copy.offset, copy.size) != copy.crc:
                    raise _refused(f"bytes {copy.offset} to {copy.offset + copy.size} were not copied faithfully")
            elif full:
                # no CRC known (a safetensors source): the bytes themselves compared, a memcmp per chunk, which
                # costs a fraction of two CRCs over the range (the row that copies 2 GB as cp does)
                if not same_bytes(
                    disk.source(name), copy.offset, sources.source(copy.source_path), copy.source_offset, copy.size
                ):
                    raise _refused(f"bytes {copy.offset} to {copy.offset + copy.size} were not copied faithfully")
            else:
                compare_edges(disk, name, copy.offset, sources, copy.source_path, copy.source_offset, copy.size)
    return full


def crc_at(reader: SourceReader, path: str, offset: int, size: int) -> int:
    """CRC-32 of ``size`` bytes at ``offset``: through the reader's window if small, in bounded chunks if not."""
    if size < SMALL:
        return zlib.crc32(reader.read(path, offset, size))
    source, value, done = reader.source(path), 0, 0
    buffer = memoryview(bytearray(min(CHUNK, size)))  # reused: no fresh pages per chunk
    while done < size:
        got = source.readinto_at(offset + done, buffer[: min(CHUNK, size - done)])
        if not got:
            raise _refused("the written file ended early")
        value = zlib.crc32(buffer[:got], value)
        done += got
    return value


def same_bytes(first: ByteSource, at: int, second: ByteSource, second_at: int, size: int) -> bool:
    """Whether ``size`` bytes at ``at`` of ``first`` equal those at ``second_at`` of ``second``: read in
    chunks into two reused buffers (no fresh pages per chunk) and compared as they are."""
    left, right = bytearray(min(CHUNK, size)), bytearray(min(CHUNK, size))
    done = 0
    while done < size:
        count = min(CHUNK, size - done)
        if count < len(left):  # the last, shorter chunk
            left, right = bytearray(count), bytearray(count)
        if first.readinto_at(at + done, left) != count or second.readinto_at(second_at + done, right) != count:
            return False
        if left != right:
            return False
        done += count
    return True


def compare_edges(
    disk: SourceReader, path: str, at: int, sources: SourceReader, source_path: str, source_at: int, size: int
) -> None:
    """The first and last 4 KB of a copied range equal the source's."""
    head = min(EDGE, size)
    for edge in {0, size - head}:
        written = disk.source(path).read_at(at + edge, head)
        original = sources.source(source_path).read_at(source_at + edge, head)
        if written != original:
            raise _refused(f"bytes at offset {at + edge} were not copied faithfully")
