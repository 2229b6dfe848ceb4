"""Malformed zip structures get one line and exit 2: zip64 extra fields that are short or empty,
compressed members that inflate past what the file can justify, central directories that lie."""

from __future__ import annotations

import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch
from builders import tiny_state_dict
from builders_readers import StorageRef, View, pickle_with_pids, torch_zip_members, write_zip

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.readers.open import open_checkpoint

MEMORY_LIMIT = 1 << 30


def one_line_error(path: Path, *words: str) -> None:
    import resource

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    for command in ("info", "check"):
        result = subprocess.run(
            [sys.executable, "-m", "ckpt_tui", command, str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=limited,
        )
        assert result.returncode == 2, (command, result.stdout[-300:], result.stderr[-300:])
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
        for word in words:
            assert word in result.stderr, result.stderr


def zip64_entry_file(tmp_path: Path, extra: bytes) -> Path:
    """A torch zip whose first central entry claims zip64 sizes (0xFFFFFFFF) with ``extra`` as its extra field."""
    torch.save(tiny_state_dict(), tmp_path / "good.pth")
    raw = bytearray((tmp_path / "good.pth").read_bytes())
    at = raw.find(b"PK\x01\x02")
    name_len, extra_len, _ = struct.unpack_from("<3H", raw, at + 28)
    raw[at + 24 : at + 28] = b"\xff\xff\xff\xff"  # uncompressed size: "see the zip64 extra field"
    start = at + 46 + name_len
    new = bytes(raw[: at + 30]) + struct.pack("<H", len(extra)) + bytes(raw[at + 32 : start]) + extra
    rest = bytes(raw[start + extra_len :])
    data = bytearray(new + rest)
    eocd = data.rfind(b"PK\x05\x06")
    cd_size = struct.unpack_from("<I", data, eocd + 12)[0] + len(extra) - extra_len
    data[eocd + 12 : eocd + 16] = struct.pack("<I", cd_size)
    zip64 = data.rfind(b"PK\x06\x06")
    if zip64 >= 0:
        data[zip64 + 40 : zip64 + 48] = struct.pack("<Q", cd_size)
        locator = data.rfind(b"PK\x06\x07")
        data[locator + 8 : locator + 16] = struct.pack("<Q", zip64)
    path = tmp_path / "zip64.pth"
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize(
    "extra",
    [b"", b"\x01\x00\x00\x00", b"\x01\x00\x04\x00\x00\x00\x00\x00", b"\x01\x00\x10\x00\x00\x00", b"\x01\x00"],
    ids=["empty", "zip64-field-of-length-0", "zip64-field-too-short", "zip64-field-past-the-extra", "cut-header"],
)
def test_short_or_empty_zip64_extra_fields(tmp_path: Path, extra: bytes) -> None:
    path = zip64_entry_file(tmp_path, extra)
    with pytest.raises(ReadError, match="zip64"):
        open_checkpoint(path)
    one_line_error(path, "zip64")


def handmade_zip(path: Path, members: dict[str, tuple[bytes, int, int]]) -> Path:
    """A zip written by hand: each member is (stored or deflated bytes, method, the size its entries declare)."""
    with open(path, "wb") as file:
        entries = []
        for name, (payload, method, declared) in members.items():
            raw_name = name.encode()
            crc = zlib.crc32(payload) if method == 0 else 0
            entries.append((raw_name, payload, method, declared, crc, file.tell()))
            header = struct.pack(
                "<4s5H3L2H", b"PK\x03\x04", 20, 0, method, 0, 0, crc, len(payload), declared, len(raw_name), 0
            )
            file.write(header + raw_name + payload)
        start = file.tell()
        for raw_name, payload, method, declared, crc, offset in entries:
            fields = (b"PK\x01\x02", 20, 20, 0, method, 0, 0, crc, len(payload), declared, len(raw_name), 0, 0, 0, 0, 0)
            file.write(struct.pack("<4s6H3L5H2L", *fields, offset) + raw_name)
        size = file.tell() - start
        file.write(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(entries), len(entries), size, start, 0))
    return path


def deflated_zip(tmp_path: Path, member: str, inflated: int, declared: int | None = None) -> Path:
    """A torch zip whose ``member`` is ``inflated`` zero bytes, deflated (a zip bomb), declared as ``declared``."""
    members = torch_zip_members(pickle_with_pids({"w": View(StorageRef(), 0, (4,), (1,))}), {"0": b"\0" * 16})
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk = b"\0" * (1 << 20)
    body = b"".join(compressor.compress(chunk) for _ in range(inflated >> 20)) + compressor.flush()
    built = {name: (data, 0, len(data)) for name, data in members.items()}
    built[f"archive/{member}"] = (body, 8, inflated if declared is None else declared)
    return handmade_zip(tmp_path / "bomb.pth", built)


def test_deflated_data_pkl_past_the_cap_is_refused(tmp_path: Path) -> None:
    path = deflated_zip(tmp_path, "data.pkl", 256 << 20)
    assert path.stat().st_size < 1 << 20
    one_line_error(path, "inflate")


def test_deflated_member_inflating_past_its_declared_size_is_refused(tmp_path: Path) -> None:
    path = deflated_zip(tmp_path, "data.pkl", 256 << 20, declared=100)
    one_line_error(path, "data.pkl")


def test_deflated_record_inflating_past_its_declared_size_is_refused(tmp_path: Path) -> None:
    path = deflated_zip(tmp_path, "data/0", 64 << 20, declared=16)
    checkpoint = open_checkpoint(path)
    from ckpt_tui.core.values.tensor_values import TensorReader

    with pytest.raises(ReadError):
        list(TensorReader(checkpoint.root["w"]).chunks())


@pytest.mark.parametrize("lie", ["local-signature", "compressed-past-end", "offset-inside-directory"])
def test_central_directory_lies(tmp_path: Path, lie: str) -> None:
    members = torch_zip_members(pickle_with_pids({"w": View(StorageRef(), 0, (4,), (1,))}), {"0": b"\0" * 16})
    raw = bytearray(write_zip(tmp_path / "good.pth", members).read_bytes())
    entry = raw.find(b"PK\x01\x02")  # archive/data.pkl
    if lie == "local-signature":
        local = struct.unpack_from("<L", raw, entry + 42)[0]
        raw[local + 2] = 0x09
    elif lie == "compressed-past-end":
        raw[entry + 20 : entry + 24] = struct.pack("<L", len(raw) * 2)
    else:
        raw[entry + 42 : entry + 46] = struct.pack("<L", raw.rfind(b"PK\x01\x02"))
    path = tmp_path / f"{lie}.pth"
    path.write_bytes(bytes(raw))
    one_line_error(path)


def test_empty_zip_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "empty.pth"
    path.write_bytes(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0, 0, 0, 0, 0))
    one_line_error(path, "zip")


def test_duplicate_member_names_are_a_loader_problem(tmp_path: Path) -> None:
    import warnings
    import zipfile

    members = torch_zip_members(pickle_with_pids({"w": View(StorageRef(), 0, (4,), (1,))}), {"0": b"\0" * 16})
    path = write_zip(tmp_path / "dup.pth", members)
    with warnings.catch_warnings(), zipfile.ZipFile(path, "a") as archive:
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name: that is the point
        archive.writestr(zipfile.ZipInfo("archive/data/0"), b"\1" * 16)
    checkpoint = open_checkpoint(path)
    assert any("twice" in p for p in checkpoint.loader_problems)
