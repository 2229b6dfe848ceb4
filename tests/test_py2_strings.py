"""Byte strings pickled with the py2-str opcodes (``U`` SHORT_BINSTRING, ``T`` BINSTRING, ``S`` STRING) are
decoded as torch.load decodes them: ``encoding="utf-8"``, errors strict (torch/serialization.py ``_load``). A dict
key or a storage key ``b"\\xc3\\xa9"`` is ``"é"``, never the latin-1 ``"Ã©"``; bytes that are not UTF-8 make the
file one that torch refuses, and ckpt-tui says so. Hand-built pickles, each judged against the real torch.load.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from ckpt_tui.cli import main

NAN = float("nan")


def _u(text: str) -> bytes:
    """BINUNICODE."""
    raw = text.encode("utf-8")
    return b"X" + struct.pack("<I", len(raw)) + raw


def _py2(raw: bytes, opcode: str) -> bytes:
    """A py2 str: SHORT_BINSTRING, BINSTRING or STRING."""
    if opcode == "U":
        return b"U" + bytes([len(raw)]) + raw
    if opcode == "T":
        return b"T" + struct.pack("<i", len(raw)) + raw
    return b"S" + repr(raw)[1:].encode("ascii") + b"\n"


def _tensor(key: bytes, numel: int) -> bytes:
    """``_rebuild_tensor_v2`` of a whole float32 storage whose persistent-id key is the pickled ``key``."""
    pid = b"(" + _u("storage") + b"ctorch\nFloatStorage\n" + key + _u("cpu") + b"K" + bytes([numel]) + b"tQ"
    args = pid + b"K\x00K" + bytes([numel]) + b"\x85K\x01\x85\x89ccollections\nOrderedDict\n)R"
    return b"ctorch._utils\n_rebuild_tensor_v2\n(" + args + b"tR"


def _write(path: Path, items: list[tuple[bytes, bytes]], records: dict[str, bytes], plain: bool = True) -> Path:
    body = b"".join(key + value for key, value in items)
    if not plain:  # an int beside the tensors: not a plain state_dict, so the full reader reads it
        body += _u("step") + b"K\x07"
    pkl = b"\x80\x02ccollections\nOrderedDict\n)R(" + body + b"u."
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", pkl)
        archive.writestr("archive/byteorder", "little")
        for name, data in records.items():
            archive.writestr(f"archive/data/{name}", data)
        archive.writestr("archive/version", "3\n")
    return path


def _f32(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def _paths(capsys: pytest.CaptureFixture[str], path: Path) -> list[list[str]]:
    assert main(["info", "--json", str(path)]) == 0
    rows = json.loads(capsys.readouterr().out)["tensors"]
    return [row["path"] for row in rows]


@pytest.mark.parametrize("plain", [True, False], ids=["fast-path", "full-reader"])
def test_utf8_key_beside_its_latin1_twin_is_its_own_tensor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], plain: bool
) -> None:
    items = [(_py2("é".encode(), "U"), _tensor(_u("0"), 3)), (_u("Ã©"), _tensor(_u("1"), 3))]
    path = _write(tmp_path / "hide.pth", items, {"0": _f32(1, NAN, 3), "1": _f32(7, 8, 9)}, plain)
    loaded = torch.load(path, weights_only=True)
    assert list(loaded) == ["é", "Ã©"] + ([] if plain else ["step"])
    assert main(["check", str(path)]) == 1
    assert 'ckpt["é"]: 1 NaN' in capsys.readouterr().out
    out = tmp_path / "out.pth"
    assert main(["convert", str(path), "-o", str(out)]) == 0
    again = torch.load(out, weights_only=True)
    assert list(again) == list(loaded)
    torch.testing.assert_close(again["é"], loaded["é"], equal_nan=True)
    torch.testing.assert_close(again["Ã©"], loaded["Ã©"])


@pytest.mark.parametrize("opcode", ["U", "T", "S"])
def test_each_py2_opcode_decodes_as_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str], opcode: str) -> None:
    path = _write(tmp_path / "k.pth", [(_py2("módulo.w".encode(), opcode), _tensor(_u("0"), 2))], {"0": _f32(1, 2)})
    # weights_only takes only SHORT_BINSTRING; the full unpickler (also encoding="utf-8") takes all three
    assert list(torch.load(path, weights_only=False)) == ["módulo.w"]
    assert _paths(capsys, path) == [["módulo.w"]]


def test_storage_key_reads_the_record_torch_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    items = [(_u("w"), _tensor(_py2("é".encode(), "U"), 3))]
    path = _write(tmp_path / "rec.pth", items, {"é": _f32(1, NAN, 3), "Ã©": _f32(1, 2, 3)})
    assert torch.load(path, weights_only=True)["w"].isnan().any()
    assert main(["check", str(path)]) == 1
    assert 'ckpt["w"]: 1 NaN' in capsys.readouterr().out


def test_legacy_file_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    buffer = io.BytesIO()
    torch.save({"é": torch.tensor([1.0, NAN]), "Ã©": torch.ones(2)}, buffer, _use_new_zipfile_serialization=False)
    raw = buffer.getvalue()
    utf8 = _u("é")
    assert raw.count(utf8) == 1
    path = tmp_path / "legacy.pth"
    path.write_bytes(raw.replace(utf8, _py2("é".encode(), "U")))
    assert list(torch.load(path, weights_only=True)) == ["é", "Ã©"]
    assert main(["check", str(path)]) == 1
    assert 'ckpt["é"]: 1 NaN' in capsys.readouterr().out


@pytest.mark.parametrize("plain", [True, False], ids=["fast-path", "full-reader"])
def test_bytes_that_are_not_utf8_are_refused_as_torch_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], plain: bool
) -> None:
    path = _write(tmp_path / "bad.pth", [(_py2(b"\xe9", "U"), _tensor(_u("0"), 1))], {"0": _f32(1)}, plain)
    with pytest.raises(UnicodeDecodeError):
        torch.load(path, weights_only=False)
    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert "not UTF-8, so torch.load refuses the file" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("plain", [True, False], ids=["fast-path", "full-reader"])
def test_keys_equal_after_decoding_collide_as_in_torch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], plain: bool
) -> None:
    items = [(_py2("é".encode(), "U"), _tensor(_u("0"), 2)), (_u("é"), _tensor(_u("1"), 3))]
    path = _write(tmp_path / "twice.pth", items, {"0": _f32(NAN, 1), "1": _f32(7, 8, 9)}, plain)
    loaded = torch.load(path, weights_only=True)
    assert loaded["é"].tolist() == [7, 8, 9]  # the later one wins, as in any dict
    assert _paths(capsys, path) == [["é"]]
    assert main(["check", str(path)]) == 0
    out = tmp_path / "out.pth"
    assert main(["convert", str(path), "-o", str(out)]) == 0
    assert torch.load(out, weights_only=True)["é"].tolist() == [7, 8, 9]


def test_unsafe_global_named_by_py2_strs_is_named_as_torch_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "g.pkl"
    # STACK_GLOBAL of py2 strs, then a corrupt opcode: the read fails, and the note names the global once, in UTF-8
    path.write_bytes(b"\x80\x04" + _py2("méd".encode(), "U") + _py2(b"func", "U") + b"\x93)R0\xff")
    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert "unsafe global méd.func (NOT executed" in err
    assert "Ã" not in err


@pytest.mark.parametrize("escaped", [rb"\xc3\x15", rb"caf\xe9"])
def test_a_protocol_0_pickle_of_code_is_unsafe_never_a_text_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], escaped: bytes
) -> None:
    # all printable ASCII, as Python 2 wrote byte strings in protocol 0: torch.load(weights_only=False) runs the
    # REDUCE before the string fails to decode (the canary shows it), so the file is never "a text file"
    canary = tmp_path / "ran"
    path = tmp_path / "py2.pth"
    path.write_bytes(b"(lp0\ncos\nsystem\n(S'touch " + str(canary).encode() + b"'\ntRp1\naS'" + escaped + b"'\np2\na.")
    with pytest.raises(UnicodeDecodeError):
        torch.load(path, weights_only=False)
    assert canary.exists()
    assert main(["info", str(path)]) == 2
    error = capsys.readouterr().err
    assert "UNSAFE: it names the unsafe global os.system" in error
    assert "a text file" not in error
