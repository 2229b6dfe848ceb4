"""A storage record whose central directory says "deflated" while its data does not inflate to its size: miniz's
extraction fails, and torch.load goes on with the buffer it allocated (uninitialised memory, other values at each
load). The verdict is "cannot tell" (was "loads", with a note on "the values shown"); a record that does inflate
still loads."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import pytest
import torch
from builders_weights_only import checked_answer


def _claim_deflated(path: Path, member: str) -> None:
    """Set the central directory's compression method of ``member`` to 8 (deflate), its data left stored."""
    data = bytearray(path.read_bytes())
    at = data.find(b"PK\x01\x02")
    while at != -1:
        name_length = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46 : at + 46 + name_length].decode() == member:
            struct.pack_into("<H", data, at + 10, 8)
            path.write_bytes(bytes(data))
            return
        at = data.find(b"PK\x01\x02", at + 4)
    raise AssertionError(member)


def test_a_record_that_does_not_inflate_is_cannot_tell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.pth"
    torch.save({"a": torch.arange(6, dtype=torch.float32)}, path)
    member = next(name for name in zipfile.ZipFile(path).namelist() if name.endswith("/data/0"))
    _claim_deflated(path, member)
    assert checked_answer(path, capsys) == "cannot_tell"


def test_a_record_that_inflates_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "m.pth"
    torch.save({"a": torch.arange(6, dtype=torch.float32)}, source)
    path = tmp_path / "deflated.pth"
    with zipfile.ZipFile(source) as read, zipfile.ZipFile(path, "w") as write:
        for info in read.infolist():
            method = zipfile.ZIP_DEFLATED if "/data/" in info.filename else zipfile.ZIP_STORED
            write.writestr(info.filename, read.read(info.filename), compress_type=method)
    assert torch.equal(torch.load(path, weights_only=True)["a"], torch.arange(6, dtype=torch.float32))
    assert checked_answer(path, capsys) == "loads"


def test_a_format_version_that_does_not_inflate_still_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """torch reads .format_version only to compare it with b"1": whatever bytes a failed inflate leaves, it goes on
    (was "refuses"); the same edit on .storage_alignment, which torch parses as a number, is "cannot tell"."""
    for record, expected in ((".format_version", "loads"), (".storage_alignment", "cannot_tell")):
        path = tmp_path / f"m{record}.pth"
        torch.save({"a": torch.arange(6, dtype=torch.float32)}, path)
        member = next(name for name in zipfile.ZipFile(path).namelist() if name.endswith("/" + record))
        _claim_deflated(path, member)
        assert checked_answer(path, capsys) == expected, record
