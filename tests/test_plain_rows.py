"""A plain state_dict's pickle read as rows (``pickles/plain_rows.py``) gives what the full reader gives.

Every file here is opened twice: as ``open_checkpoint`` opens it (its columns straight from the pickle's rows
when it is a plain state_dict) and with that reading turned off (the full reader, then its columns made from
the tree). Trees, columns, loader problems and errors must be the same, on files torch.save writes and on
generated near-plain pickles (memo reuse, shared storages, views, strides, dtypes, requires_grad, odd keys,
nested dicts, odd hooks, BUILD on a tensor, records missing or of the wrong size).
"""

from __future__ import annotations

import collections
import dataclasses
import io
import random
import struct
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_readers import summaries
from torch import nn

from ckpt_tui.core.errors import CkptError
from ckpt_tui.core.model.tree import Storage, Tensor
from ckpt_tui.core.pickles import plain_rows
from ckpt_tui.core.readers.open import open_checkpoint


def described(path: Path) -> Any:
    """What a reader made of a file: its error, or its tree (every field of every tensor and storage), its
    columns and what it says of the file."""
    try:
        checkpoint = open_checkpoint(path)
    except CkptError as exc:
        return ("refused", str(exc))
    columns = checkpoint.flat_columns()
    root = checkpoint.root
    facts: list[Any] = [type(root).__name__, dict(getattr(root, "__dict__", {}))]
    if isinstance(root, dict):
        facts.append([(key, _value(value)) for key, value in root.items()])
    else:
        facts.append(repr(root))
    facts += [checkpoint.loader_problems, sorted(checkpoint.unsafe_globals), checkpoint.notes, checkpoint.hostile]
    if columns is not None:
        facts += [columns.names, columns.dtypes, columns.numels, columns.shapes, columns.strides]
        facts += [columns.storage_keys, [type(source).__name__ for source in columns.sources]]
    return facts


def _value(value: Any) -> Any:
    if type(value) is Tensor:
        fields = [(field.name, _value(getattr(value, field.name))) for field in dataclasses.fields(value)]
        return ("tensor", fields, id(value))
    if type(value) is Storage:
        return ("storage", _storage(value), id(value))
    if isinstance(value, dict):
        return (type(value).__name__, [(key, _value(item)) for key, item in value.items()])
    return repr(value)


def _storage(storage: Storage) -> Any:
    return (storage.key, storage.dtype, storage.location, storage.numel, storage.type_name, type(storage.source))


def both_ways(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, bool]:
    """The file described as read from rows where it can be, and by the full reader; whether rows were taken."""
    taken: list[bool] = []
    read = plain_rows.read_plain_state_dict

    def watched(data: bytes) -> Any:
        result = read(data)
        taken.append(result is not None)
        return result

    with monkeypatch.context() as patched:
        patched.setattr(plain_rows, "read_plain_state_dict", watched)
        from ckpt_tui.core.readers import pth_columns

        patched.setattr(pth_columns, "read_plain_state_dict", watched)
        fast = described(path)
    with monkeypatch.context() as patched:
        from ckpt_tui.core.readers import pth_columns

        patched.setattr(pth_columns, "read_plain_state_dict", lambda data: None)
        full = described(path)
    # ids differ between two reads: compared as the pattern of which objects are the same
    return _ids_as_order(fast), _ids_as_order(full), any(taken)


def _ids_as_order(facts: Any) -> Any:
    seen: dict[int, int] = {}

    def walk(value: Any) -> Any:
        if isinstance(value, list):
            return [walk(item) for item in value]
        if isinstance(value, tuple):
            if len(value) == 3 and value[0] in ("tensor", "storage") and isinstance(value[2], int):
                return (value[0], walk(value[1]), seen.setdefault(value[2], len(seen)))
            return tuple(walk(item) for item in value)
        return value

    return walk(facts)


# ---- files torch.save writes ----------------------------------------------------------------------


def _tied() -> Any:
    weight = torch.randn(4, 3)
    return {"embed.weight": weight, "head.weight": weight}


SAVED = {
    "a module's state_dict": lambda: nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).state_dict(),
    "a plain dict": lambda: {f"w{i}": torch.randn(i + 1, 2) for i in range(5)},
    "dtypes": lambda: {str(d): torch.zeros(3, dtype=d) for d in (torch.float16, torch.int64, torch.bool)},
    "an empty tensor": lambda: {"a": torch.zeros(0, 3), "b": torch.ones(2)},
    "a scalar": lambda: {"a": torch.tensor(3.0)},
    "v3 dtypes": lambda: {"a": torch.ones(2, dtype=torch.uint16), "b": torch.ones(2)},
    "tied weights": _tied,
    "a view": lambda: {"a": torch.randn(6)[2:]},
    "a transposed tensor": lambda: {"a": torch.randn(3, 4).t()},
    "a Parameter": lambda: {"a": nn.Parameter(torch.randn(2))},
    "requires grad": lambda: {"a": torch.randn(2, requires_grad=True)},
    "a nested state_dict": lambda: {"model": {"a": torch.randn(2)}, "epoch": 3},
    "an int value after a tensor": lambda: {"a": torch.randn(2), "epoch": 3},
    "an int key": lambda: {"a": torch.randn(2), 1: torch.randn(2)},
    "a conj tensor": lambda: {"a": torch.randn(2, dtype=torch.complex64).conj()},
}


PLAIN = {"a module's state_dict", "a plain dict", "dtypes", "an empty tensor", "a scalar"}
"""What torch.save writes of these is a plain state_dict: read from rows (the others the full way)."""


@pytest.mark.parametrize("name", SAVED)
def test_a_saved_file_reads_the_same_from_rows(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.pth"
    torch.save(SAVED[name](), path)
    fast, full, taken = both_ways(path, monkeypatch)
    assert fast == full
    assert taken == (name in PLAIN)


def test_a_plain_state_dict_is_read_from_rows_and_its_root_made_when_asked(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    torch.save(model.state_dict(), tmp_path / "m.pth")
    checkpoint = open_checkpoint(tmp_path / "m.pth")
    assert checkpoint.root_pending()
    keyed = checkpoint.key_root()
    assert type(keyed).__name__ == "LoadedOrderedDict" and "_metadata" in keyed.__dict__
    root = checkpoint.root
    assert type(root) is type(keyed) and root.__dict__ == keyed.__dict__
    assert list(root) == list(model.state_dict())
    loaded = torch.load(tmp_path / "m.pth", weights_only=True)
    assert [list(t.shape) for t in root.values()] == [list(t.shape) for t in loaded.values()]


def test_info_of_a_plain_state_dict_is_the_walks(tmp_path: Path) -> None:
    torch.save(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).state_dict(), tmp_path / "m.pth")
    chosen, walked = summaries(tmp_path / "m.pth", columns=True)
    assert chosen == walked


# ---- generated near-plain pickles -----------------------------------------------------------------

STORAGES = {"FloatStorage": 4, "HalfStorage": 2, "LongStorage": 8}
"""Storage types and their element sizes."""


class Emitter:
    """Protocol-2 opcodes as torch.save writes a state_dict, with what each generated variant changes."""

    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x02")
        self.memo = 0

    def put(self) -> int:
        self.out += b"q" + bytes([self.memo]) if self.memo < 256 else b"r" + struct.pack("<I", self.memo)
        self.memo += 1
        return self.memo - 1

    def get(self, index: int) -> None:
        self.out += b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index)

    def text(self, value: str) -> None:
        raw = value.encode("utf-8")
        self.out += b"X" + struct.pack("<I", len(raw)) + raw

    def int(self, value: Any) -> None:
        if value is True or value is False:
            self.out += b"\x88" if value else b"\x89"
        elif isinstance(value, float):
            self.out += b"G" + struct.pack(">d", value)
        elif 0 <= value < 256:
            self.out += b"K" + bytes([value])
        elif -(1 << 31) <= value < 1 << 31:
            self.out += b"J" + struct.pack("<i", value)
        else:
            raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
            self.out += b"\x8a" + bytes([len(raw)]) + raw

    def tuple(self, values: list[Any]) -> None:
        self.out += b"("
        for value in values:
            self.int(value)
        self.out += b"t"


def generated(rng: random.Random) -> tuple[bytes, dict[str, int]]:
    """A near-plain state_dict pickle and the size of each storage record it names (what the zip holds)."""
    e = Emitter()
    ordered = rng.random() < 0.7
    if ordered:
        e.out += b"ccollections\nOrderedDict\n"
        od = e.put()
        e.out += b")R"
    else:
        e.out += b"}"
    e.put()
    e.out += b"("
    records: dict[str, int] = {}
    made: list[int] = []
    rebuild = -1
    for index in range(rng.randint(1, 5)):
        key = rng.choice([f"k{index}", f"k{index}", f"k{index}", "k0", 7])
        if isinstance(key, str):
            e.text(key)
        else:
            e.int(key)
        e.put()
        if made and rng.random() < 0.08:  # the same tensor again (memo reuse)
            e.get(rng.choice(made))
            continue
        if index and rng.random() < 0.05:  # not a tensor: an int, or a nested dict
            e.int(3) if rng.random() < 0.5 else e.out.extend(b"}")
            continue
        if rebuild < 0 or rng.random() < 0.1:
            e.out += b"ctorch._utils\n_rebuild_tensor_v2\n"
            rebuild = e.put()
        else:
            e.get(rebuild)
        kind = rng.choice(list(STORAGES))
        size = STORAGES[kind]
        shape = rng.choice([(2,), (2, 3), (), (0, 4), (3, 1)])
        numel = 1
        for n in shape:
            numel *= n
        stride: list[Any] = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            stride[i] = stride[i + 1] * max(shape[i + 1], 1)
        offset: Any = 0
        storage_numel: Any = numel
        roll = rng.random()
        if roll < 0.05:
            offset = rng.choice([1, False, -1])
            storage_numel = numel + 1
        elif roll < 0.1 and len(shape) == 2:
            stride = list(reversed(stride))
        elif roll < 0.13 and shape:
            stride[0] = rng.choice([True, float(stride[0])]) if stride[0] == 1 else stride[0]
        elif roll < 0.16:
            storage_numel = rng.choice([numel + 2, True, -1])
        e.out += b"(("  # the rebuild's arguments, the persistent id
        e.text("storage")
        e.out += f"ctorch\n{kind}\n".encode()
        record = rng.choice([f"{index}", f"{index}", f"{index}", "0"])
        e.text(record)
        e.text(rng.choice(["cpu"] * 12 + ["cuda:0", "meta"]))
        e.int(storage_numel)
        e.out += b"t"
        e.put()  # (as torch.save memoizes the id)
        e.out += b"Q"  # BINPERSID
        e.int(offset)
        e.tuple(list(shape))
        e.tuple(stride)
        e.int(rng.random() < 0.05)
        hooks = rng.random()
        if hooks < 0.9:
            e.out += b"ccollections\nOrderedDict\n)R" if not ordered else b"h" + bytes([od]) + b")R"
        elif hooks < 0.95:
            e.out += b"N"
        elif hooks < 0.97:
            e.out += b"ccollections\nOrderedDict\n)R(X\x01\x00\x00\x00xK\x01u"  # hooks: an OD given an item
        else:
            e.out += b"ccollections\nOrderedDict\n)R}X\t\x00\x00\x00_metadata}sb"  # ... or a _metadata
        nargs = rng.random()
        e.out += b"N" if nargs < 0.03 else b""  # (7 arguments: metadata None)
        e.out += b"tR"
        if rng.random() < 0.02:
            e.out += b"Nb"  # BUILD on the tensor
        made.append(e.put())
        if isinstance(storage_numel, int) and not isinstance(storage_numel, bool) and storage_numel >= 0:
            wanted = storage_numel * size
            records.setdefault(record, wanted if rng.random() < 0.95 else wanted + 4)
    e.out += b"u"
    if ordered and rng.random() < 0.3:  # a _metadata as state_dict() writes it, or an odd one
        e.out += b"}(X\x09\x00\x00\x00_metadata"
        e.out += b"ccollections\nOrderedDict\n)R(X\x00\x00\x00\x00}(X\x07\x00\x00\x00versionK\x01uu"
        if rng.random() < 0.3:
            e.out = e.out.replace(b"versionK\x01", b"versionG?\xf8\x00\x00\x00\x00\x00\x00")
        e.out += b"ub"
    e.out += b"."
    return bytes(e.out), records


def zipped(data: bytes, records: dict[str, int], path: Path, rng: random.Random) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", data)
        archive.writestr("archive/byteorder", "little")
        for key, size in records.items():
            if rng.random() < 0.97:
                archive.writestr(f"archive/data/{key}", bytes(size))
        archive.writestr("archive/version", "3\n")
    return path


def test_generated_near_plain_pickles_read_the_same_from_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(25)
    taken = refused = 0
    for number in range(400):
        data, records = generated(rng)
        path = zipped(data, records, tmp_path / f"g{number}.pth", rng)
        fast, full, took = both_ways(path, monkeypatch)
        assert fast == full, (number, data)
        taken += took
        refused += fast[0] == "refused"
        path.unlink()
    assert taken > 40 and refused > 20, (taken, refused)


def test_a_pickle_that_does_not_start_as_a_state_dict_is_not_read_as_rows() -> None:
    buffer = io.BytesIO()
    torch.save({"model": collections.OrderedDict(a=torch.ones(2))}, buffer)
    data = zipfile.ZipFile(buffer).read("archive/data.pkl")
    assert not plain_rows.looks_plain(data)
    buffer = io.BytesIO()
    torch.save(collections.OrderedDict(a=torch.ones(2)), buffer)
    assert plain_rows.looks_plain(zipfile.ZipFile(buffer).read("archive/data.pkl"))


def one_tensor_pickle(shape: tuple[int, ...], stride: tuple[int, ...], storage: bytes = b"") -> bytes:
    """torch.save's pickle of ``{"a": tensor}``, with this size and stride (and the id's tuple used as the
    storage itself when ``storage`` says so: ``raw``)."""
    e = Emitter()
    e.out += b"}"
    e.put()
    e.text("a")
    e.put()
    e.out += b"ctorch._utils\n_rebuild_tensor_v2\n"
    e.put()
    e.out += b"(("
    e.text("storage")
    e.out += b"ctorch\nFloatStorage\n"
    e.text("0")
    e.text("cpu")
    e.int(0)
    e.out += b"t"
    pid = e.put()
    e.out += b"Q" if storage != b"raw" else b"0h" + bytes([pid])  # (POP the storage, GET the id's tuple)
    e.int(0)
    e.tuple(list(shape))
    e.tuple(list(stride))
    e.out += b"\x89ccollections\nOrderedDict\n)RtRs."
    return bytes(e.out)


@pytest.mark.parametrize(
    ("shape", "stride", "storage"),
    [
        ((0, 2**40, 2**40), (2**80, 2**40, 1), b""),  # row-major, but its first stride past int64
        ((0, 2), (2, 1), b""),
        ((0, 2), (2, 1), b"raw"),  # the memoized id tuple, not the storage, as the tensor's storage
    ],
    ids=["strides past int64", "plain", "the id's tuple as storage"],
)
def test_hand_made_pickles_read_the_same_from_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...], stride: tuple[int, ...], storage: bytes
) -> None:
    data = one_tensor_pickle(shape, stride, storage)
    path = zipped(data, {"0": 0}, tmp_path / "m.pth", random.Random(0))
    fast, full, taken = both_ways(path, monkeypatch)
    assert fast == full
    assert taken == (shape == (0, 2) and not storage)
