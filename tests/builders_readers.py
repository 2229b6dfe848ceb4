"""Hand-built checkpoint files for the reader tests: torch zips, legacy files and safetensors whose
every field a test chooses (views, persistent ids, records, members, headers)."""

from __future__ import annotations

import io
import json
import pickle
import struct
import zipfile
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


class StorageRef:
    """A storage as a persistent id: ``('storage', type, key, location, numel, *extra)``."""

    def __init__(
        self,
        key: Any = "0",
        numel: int = 4,
        storage_type: Any = torch.FloatStorage,
        location: Any = "cpu",
        extra: tuple[Any, ...] = (),
        fields: tuple[Any, ...] | None = None,
    ) -> None:
        self.pid = fields if fields is not None else ("storage", storage_type, key, location, numel, *extra)


class View:
    """A tensor as ``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)``."""

    def __init__(self, storage: StorageRef, offset: int, size: tuple[int, ...], stride: tuple[int, ...]) -> None:
        self.args = (storage, offset, size, stride, False, OrderedDict())

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return torch._utils._rebuild_tensor_v2, self.args


class _PidPickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        return obj.pid if isinstance(obj, StorageRef) else None


def pickle_with_pids(obj: Any, protocol: int = 2) -> bytes:
    """Pickle ``obj`` as torch does, with every :class:`StorageRef` as a persistent id."""
    buffer = io.BytesIO()
    _PidPickler(buffer, protocol=protocol).dump(obj)
    return buffer.getvalue()


def torch_zip_members(
    data_pkl: bytes,
    records: dict[str, bytes],
    archive: str = "archive",
    version: bytes | None = b"3\n",
    byteorder: bytes | None = b"little",
) -> dict[str, bytes]:
    """The members of a torch zip checkpoint, in torch's order (data.pkl first)."""
    members = {f"{archive}/data.pkl": data_pkl}
    if byteorder is not None:
        members[f"{archive}/byteorder"] = byteorder
    members.update({f"{archive}/data/{key}": data for key, data in records.items()})
    if version is not None:
        members[f"{archive}/version"] = version
    return members


def write_zip(path: Path, members: dict[str, bytes], deflate: tuple[str, ...] = ()) -> Path:
    """A zip with the members in order; names ending in one of ``deflate`` are DEFLATE-compressed."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            method = zipfile.ZIP_DEFLATED if name.endswith(deflate) and deflate else zipfile.ZIP_STORED
            archive.writestr(zipfile.ZipInfo(name), data, compress_type=method)
    return path


def write_view_file(
    path: Path,
    offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    numel: int = 4,
    values: list[float] | None = None,
) -> Path:
    """A torch zip whose one tensor ``w`` is the given view of a float32 storage of ``numel`` elements."""
    data = struct.pack(f"<{numel}f", *(values if values is not None else [float(i) for i in range(numel)]))
    view = View(StorageRef(numel=numel), offset, size, stride)
    return write_zip(path, torch_zip_members(pickle_with_pids({"w": view}), {"0": data}))


def safetensors_bytes(header: str | dict[str, Any], data: bytes = b"", length: int | None = None) -> bytes:
    """A safetensors file: 8-byte length, the header text as given (no padding added), the data."""
    text = header if isinstance(header, str) else json.dumps(header, separators=(",", ":"))
    raw = text.encode("utf-8", "surrogatepass")
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def f32_entry(begin: int, count: int) -> dict[str, Any]:
    """A header entry for ``count`` float32 values at ``begin``."""
    return {"dtype": "F32", "shape": [count], "data_offsets": [begin, begin + 4 * count]}


def legacy_bytes(obj_pickle: bytes, keys: list[str], storages: list[tuple[int, bytes]], head: bytes = b"") -> bytes:
    """A legacy file: magic, protocol and sys_info pickles (or ``head`` in their place), the object
    pickle, the key list, then each storage's element count and bytes."""
    if not head:
        sys_info = {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}}
        head = pickle.dumps(LEGACY_MAGIC, 2) + pickle.dumps(1001, 2) + pickle.dumps(sys_info, 2)
    tail = b"".join(struct.pack("<q", count) + data for count, data in storages)
    return head + obj_pickle + pickle.dumps(keys, 2) + tail


def legacy_view(key: str, numel: int, offset: int, size: tuple[int, ...], stride: tuple[int, ...]) -> View:
    """A legacy-format tensor: its persistent id carries the sixth field (the view) as None."""
    return View(StorageRef(key=key, numel=numel, extra=(None,)), offset, size, stride)


def summaries(path: Path, columns: bool) -> tuple[Any, Any]:
    """``info``'s text and JSON as the reader's choice gives them (with its columns or not, as asserted),
    and from a walk of the same tree."""
    from ckpt_tui.cli.render import render_info
    from ckpt_tui.core.model.tree import walk
    from ckpt_tui.core.operations.info import summarize
    from ckpt_tui.core.readers.open import open_checkpoint

    checkpoint = open_checkpoint(path)
    assert (checkpoint.flat_columns() is not None) == columns
    pending = checkpoint.root_pending()
    if columns and checkpoint.format in ("safetensors", "sharded"):
        assert pending  # a safetensors file's or set's root stays columns until asked for
    chosen = summarize(checkpoint)
    text, data, rows = render_info(chosen, 3), chosen.to_json(), chosen.rows_json()
    if chosen.from_columns:  # info (text, JSON, the rendered rows) made no tensor object
        assert checkpoint.root_pending() == pending
    walked = summarize(checkpoint, list(walk(checkpoint.root)))
    walked_data = walked.to_json()
    if rows is not None:
        assert json.loads(rows) == walked_data["tensors"]
    return (text, data), (render_info(walked, 3), walked_data)


def raw_zip_bytes(members: list[tuple[bytes, bytes]]) -> bytes:
    """A stored zip whose members carry exactly these name bytes, in this order (twins, case twins, NULs
    and non-UTF-8 bytes included: what ``zipfile`` would normalise or refuse)."""
    out, central = bytearray(), bytearray()
    for name, data in members:
        crc, offset = zlib.crc32(data), len(out)
        out += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, crc, len(data), len(data), len(name), 0)
        out += name + data
        sizes = (crc, len(data), len(data), len(name))
        central += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, *sizes, 0, 0, 0, 0, 0, offset)
        central += name
    start = len(out)
    out += central
    out += struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(members), len(members), len(central), start, 0)
    return bytes(out)


def write_raw_zip(path: Path, members: list[tuple[bytes, bytes]]) -> Path:
    """:func:`raw_zip_bytes` written to ``path``."""
    path.write_bytes(raw_zip_bytes(members))
    return path
