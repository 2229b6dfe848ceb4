"""A ``.safetensors`` file whose header is no JSON object gets the reason in its one-line error (was "header length
58 does not fit a 82-byte file" for a header that fits, opening with a byte-order mark or a list)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from ckpt_tui.cli import main

ENTRY = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'


@pytest.mark.parametrize(
    ("header", "said"),
    [
        (b"\xef\xbb\xbf" + ENTRY, "byte-order mark"),
        (b"[]", "not a JSON object (it starts with b'[]')"),
        (b"", "header length 0 is too short"),
        (b'"x"', "not a JSON object"),
    ],
)
def test_a_header_that_is_no_object_is_said_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], header: bytes, said: str
) -> None:
    path = tmp_path / "m.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    assert main(["info", str(path)]) == 2
    error = capsys.readouterr().err
    assert said in error and "does not fit" not in error, error


def test_a_length_past_the_file_is_still_said_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.safetensors"
    path.write_bytes(struct.pack("<Q", 1000) + b"{}")
    assert main(["info", str(path)]) == 2
    assert "header length 1000 does not fit a 10-byte file" in capsys.readouterr().err
