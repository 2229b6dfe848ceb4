"""The whole-list passes over a zip's members agree with the member-by-member reading, on generated
archives (hostile ones included): the central directory's rows as columns, the layout checks made from
them, the folder and name checks by joined names, and the storages whose records are checked in bulk
when the pickle ends."""

from __future__ import annotations

import io
import random
import struct
import zlib
from pathlib import Path

import pytest
import torch

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.readers import torch_zip
from ckpt_tui.core.readers.torch_zip import ZipLayout, all_start_with
from ckpt_tui.core.readers.zip_archive import MemberColumns, ZipDirectory, read_central_directory

NAMES = [
    b"archive/data.pkl",
    b"archive/version",
    b"archive/byteorder",
    b"archive/data/0",
    b"archive/data/1",
    b"ARCHIVE/DATA/1",
    b"archive/data/0",
    b"archive/",
    b"archive/data/",
    b"archive/data/2\x00x",
    b"archive/\xe2\x82",
    b"archive/\xc3\xa9t\xc3\xa9",
    b"other/x",
    b"archive/" + b"n" * 600,
    b"archive/PK\x01\x02in a name",
    b"\xffarchive/x",
]


def generated_zip(rng: random.Random) -> bytes:
    """A zip of random members: odd names, sizes, methods, flags, disks, DOS directory bits, zip64 fields."""
    out, central, count = bytearray(), bytearray(), rng.randint(1, 8)
    for _ in range(count):
        name = rng.choice(NAMES) if rng.random() < 0.5 else b"archive/data/%d" % rng.randrange(20)
        data = bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 4, 64])))
        method = rng.choice([0, 0, 0, 8, 99])
        size, csize = len(data), len(data) + rng.choice([0, 0, 0, 0, 1, -len(data)])
        flags = rng.choice([0, 0, 0, 1, 0x800, 0x2000])
        disk, external = rng.choice([0, 0, 0, 1, 2]), rng.choice([0, 0, 0, 0x10])
        offset = len(out)
        local = (b"PK\x03\x04", 20, flags, method, 0, 0, zlib.crc32(data), csize, size, len(name), 0)
        out += struct.pack("<4s5H3L2H", *local)
        out += name + data
        extra = b""
        if rng.random() < 0.15:  # zip64 fields for the sizes
            extra = struct.pack("<2H2Q", 1, 16, size, csize)
            size = csize = 0xFFFFFFFF
        fields = (b"PK\x01\x02", 20, 20, flags, method, 0, 0, zlib.crc32(data), csize, size, len(name), len(extra))
        central += struct.pack("<4s6H3L5H2L", *fields, 0, disk, 0, external, offset) + name + extra
    start = len(out)
    out += central + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, len(central), start, 0)
    return bytes(out)


def layout_findings(directory: ZipDirectory, size: int) -> tuple[object, ...]:
    try:
        layout = ZipLayout("x.pth", directory, size)
    except ReadError as exc:
        return ("refused", str(exc))
    return (layout.prefix, layout.problems, layout.hostile, layout.notes)


def test_columns_of_the_rows_and_the_checks_made_from_them_agree_with_the_members(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = random.Random(25)
    seen_columns = seen_zip64 = 0
    for _ in range(600):
        blob = generated_zip(rng)
        try:
            directory = read_central_directory(io.BytesIO(blob), len(blob))
        except ReadError:
            continue
        if directory.columns is not None:
            seen_columns += 1
            assert directory.columns == MemberColumns.of(directory.members)
        else:
            seen_zip64 += 1
        fast = layout_findings(directory, len(blob))
        # the same directory, its checks made member by member from the objects
        slow_directory = read_central_directory(io.BytesIO(blob), len(blob))
        slow_directory.columns = None
        with monkeypatch.context() as patched:
            patched.setattr(torch_zip, "_ascii_names", lambda names, prefix: False)
            patched.setattr(torch_zip, "all_start_with", lambda names, prefix: all(n.startswith(prefix) for n in names))
            patched.setattr(torch_zip, "any_unwritten", lambda entries: any(map(torch_zip.unwritten, entries.members)))
            slow = layout_findings(slow_directory, len(blob))
        assert fast == slow, [entry.raw for entry in directory.members]
    assert seen_columns > 300 and seen_zip64 > 30


@pytest.mark.parametrize(
    "names",
    [[], ["a/x"], ["a/x", "a/y"], ["a/x", "b/y"], ["a/x\0", "a/y"], ["a/x", "\0a/y"], ["a/", "a"], ["a/a/", "a/"]],
)
@pytest.mark.parametrize("prefix", ["a/", "", "\0", "a/a"])
def test_all_start_with_counts_as_the_plain_test(names: list[str], prefix: str) -> None:
    assert all_start_with(names, prefix) == all(name.startswith(prefix) for name in names)


def test_a_saved_state_dict_is_read_from_the_rows(tmp_path: Path) -> None:
    path = tmp_path / "m.pth"
    torch.save({f"w{i}": torch.ones(2) for i in range(30)}, path)
    directory = read_central_directory(io.BytesIO(path.read_bytes()), path.stat().st_size)
    assert directory.columns is not None and directory.columns == MemberColumns.of(directory.members)


def test_the_pickle_opcodes_told_from_the_pickle_module_are_pickletools_opcodes() -> None:
    import pickletools

    from ckpt_tui.core.readers.open import PICKLE_OPCODES

    assert frozenset(op.code.encode("latin-1")[0] for op in pickletools.opcodes) == PICKLE_OPCODES
