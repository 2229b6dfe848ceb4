"""The ``.pth`` output: torch's zip layout, with a new data.pkl and the records copied byte for byte."""

from __future__ import annotations

import secrets
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from ckpt_tui.core.model.dtypes import DTYPES
from ckpt_tui.core.model.made_bytes import made_records
from ckpt_tui.core.model.tree import Storage, Tensor
from ckpt_tui.core.writers.output import Output, WriteLog
from ckpt_tui.core.writers.pickle_emitter import PickleWriter
from ckpt_tui.core.writers.source_bytes import SMALL, SourceReader, SourceSpan, bad_crc, compressed
from ckpt_tui.core.writers.tensor_data import tensor_bytes
from ckpt_tui.core.writers.zip_writer import WrittenEntry, ZipWriter

BATCH = 512
"""Small records read, checked and written together (about half a megabyte of 16x16 fp32 tensors)."""
Progress = Callable[[int, int], None]
CancelCheck = Callable[[], bool]


@dataclass
class PthWrite:
    """What went into a ``.pth``: the pickle, the storages it names, the members, and the write log."""

    archive: str
    data_pkl: bytes
    storages: list[Storage]
    tensors: int
    entries: list[WrittenEntry] = field(default_factory=list)
    log: WriteLog = field(default_factory=WriteLog)
    nbytes: int = 0


def archive_name(stem: str) -> str:
    """The top folder inside the zip: the file's stem, as torch names it (safe characters only)."""
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in stem) or "archive"


@dataclass
class Emitted:
    """data.pkl for a tree, the storages it names (in first-use order) and how many tensors it holds."""

    data_pkl: bytes
    storages: list[Storage]
    tensors: int


def emit(root: Any, cancelled: Callable[[], bool] | None = None) -> Emitted:
    """data.pkl for ``root``; a :class:`WriteError` naming the place of anything that cannot be written
    (:class:`~ckpt_tui.core.errors.Cancelled` once ``cancelled`` says so, asked every batch of entries)."""
    writer = PickleWriter(cancelled=cancelled)
    data = writer.dump(root)
    return Emitted(data, writer.storages, writer.tensors)


def write_pth(
    emitted: Emitted,
    file: BinaryIO,
    stem: str,
    byteorder: str,
    progress: Progress | None = None,
    cancelled: CancelCheck | None = None,
) -> PthWrite:
    """The torch zip layout: data.pkl, small records, then storages, as ``torch.save`` writes them."""
    archive = archive_name(stem)
    result = PthWrite(archive, emitted.data_pkl, emitted.storages, emitted.tensors)
    total = sum(s.nbytes for s in emitted.storages) if progress is not None else 0
    # (the record bytes, summed only once a large record is streamed: 50,000 small ones never need it)
    with Output(file, total, progress, cancelled, lambda: sum(s.nbytes for s in emitted.storages)) as out:
        _write_members(ZipWriter(out), emitted, archive, byteorder, result)
    result.log = out.log
    result.nbytes = out.position
    return result


def _write_members(zip_file: ZipWriter, emitted: Emitted, archive: str, byteorder: str, result: PthWrite) -> None:
    """data.pkl and the small members, every record, then the end members and the directory."""
    advance = zip_file.out.advance
    zip_file.add_bytes(f"{archive}/data.pkl", emitted.data_pkl)
    zip_file.add_bytes(f"{archive}/.format_version", b"1")
    zip_file.add_bytes(f"{archive}/.storage_alignment", b"64")
    zip_file.add_bytes(f"{archive}/byteorder", byteorder.encode())
    records, storages = f"{archive}/data/", emitted.storages
    with SourceReader() as reader:
        index = 0
        while index < len(storages):
            storage = storages[index]
            source = storage.source
            members = source.batched_members() if source is not None else None
            # a run of small records from a zip: read, checked and written together
            if members is not None:
                run = reader.small_zip_records(members, storages, index, BATCH)
                if run:
                    zip_file.add_numbered(records, index, run)
                    advance(sum(len(data) for data, _ in run))
                    index += len(run)
                    continue
            _write_record(zip_file, reader, records + str(index), storage, byteorder)
            index += 1
    zip_file.add_bytes(f"{archive}/version", b"3\n")
    zip_file.add_bytes(f"{archive}/.data/serialization_id", str(secrets.randbits(128)).zfill(40).encode())
    zip_file.close()
    result.entries = zip_file.entries


def _write_record(zip_file: ZipWriter, reader: SourceReader, name: str, storage: Storage, byteorder: str) -> None:
    """One storage as one record: converted, copied through memory (small) or by the kernel (large)."""
    size = storage.numel * DTYPES[storage.dtype][0]
    # made while written: a cast, bytes in memory, pieces of files; a deflated record, inflated
    if made_records(storage.source) is not None or compressed(storage):
        whole = Tensor(storage, 0, (storage.numel,), (1,), storage.dtype)
        zip_file.add_stream(name, size, tensor_bytes(whole, byteorder))
        return
    span = reader.span(storage)
    if size < SMALL:
        _add_small(zip_file, name, storage, reader.read(span.path, span.offset, size), span.crc)
    elif span.crc:
        zip_file.add_copy(name, reader.source(span.path), span.path, span.offset, size, span.crc)
    else:
        zip_file.add_stream(name, size, _chunks(reader, span, size))


def _add_small(zip_file: ZipWriter, name: str, storage: Storage, data: memoryview, source_crc: int | None) -> None:
    """A small record through memory; its CRC is recomputed and must match the source's, where it has one."""
    crc = zlib.crc32(data)
    if source_crc and source_crc != crc:
        raise bad_crc(storage)
    zip_file.add_bytes(name, data, crc)
    zip_file.out.advance(len(data))


def _chunks(reader: SourceReader, span: SourceSpan, size: int) -> Iterator[bytes]:
    """A large record's bytes through a bounded buffer (when its CRC must be computed)."""
    source = reader.source(span.path)
    done = 0
    while done < size:
        data = source.read_at(span.offset + done, min(size - done, 16 << 20))
        if not data:
            raise OSError(f"{span.path} ended early")
        done += len(data)
        yield data
