"""Format detection agrees with the real loaders: safetensors by a validated header first, then what
torch.load picks (zip, tar, pickle); first bytes that two formats share never send a file to the wrong
reader; polyglots are read as one format with the other reading reported."""

from __future__ import annotations

import io
import json
import pickle
import struct
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch
from builders import tiny_state_dict, write_safetensors, write_sharded_safetensors
from builders_readers import StorageRef, View, pickle_with_pids, safetensors_bytes, torch_zip_members

from ckpt_tui.cli import main
from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.readers.open import open_checkpoint

TENSOR = {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}


def header_of_length(length: int) -> str:
    """A valid header of exactly ``length`` bytes: a tensor and a padding key when there is room."""
    base = json.dumps({"w": TENSOR, "__metadata__": {"pad": ""}}, separators=(",", ":"))
    if length >= len(base):
        return json.dumps({"w": TENSOR, "__metadata__": {"pad": "x" * (length - len(base))}}, separators=(",", ":"))
    return "{}" + " " * (length - 2)


def test_safetensors_of_every_header_length_open(tmp_path: Path) -> None:
    from safetensors import safe_open

    path = tmp_path / "h.safetensors"
    for length in range(2, 2049):
        text = header_of_length(length)
        data = b"\x01\x02\x03\x04" if text.startswith('{"w"') else b""
        path.write_bytes(safetensors_bytes(text, data))
        checkpoint = open_checkpoint(path)
        assert checkpoint.format == "safetensors", length
        assert checkpoint.loader_problems == [], length
        assert ("w" in checkpoint.root) == bool(data), length
        with safe_open(str(path), "np") as file:
            assert list(file.keys()) == list(checkpoint.root)


@pytest.mark.parametrize("length", [384, 640, 896, 1152, 1408])
def test_headers_whose_length_starts_like_a_pickle_open_under_any_name(tmp_path: Path, length: int) -> None:
    raw = safetensors_bytes(header_of_length(length), b"\x01\x02\x03\x04")
    assert raw[0] == 0x80 and 1 <= raw[1] <= 5  # PROTO 1-5: what a pickle starts with
    for name in ("w.safetensors", "w.bin", "w"):
        (tmp_path / name).write_bytes(raw)
        checkpoint = open_checkpoint(tmp_path / name)
        assert checkpoint.format == "safetensors"
        assert checkpoint.loader_problems == []


def test_library_written_files_at_pickle_like_lengths_open(tmp_path: Path) -> None:
    for pad in range(0, 1500, 7):
        path = write_safetensors({"w": torch.ones(2)}, tmp_path / "lib.safetensors", metadata={"p": "x" * pad})
        assert open_checkpoint(path).format == "safetensors"


@pytest.mark.parametrize("target", [384, 640, 1152])
def test_convert_reads_back_its_own_safetensors_at_pickle_like_lengths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: int
) -> None:
    name_length = target // 2
    for _ in range(8):  # the written header grows with the key's length: steer it onto the target
        torch.save({"k" * name_length: torch.ones(3)}, tmp_path / "src.pth")
        out = tmp_path / "out.safetensors"
        assert main(["convert", str(tmp_path / "src.pth"), "-o", str(out), "--force"]) == 0, capsys.readouterr().err
        written = struct.unpack("<Q", out.read_bytes()[:8])[0]
        if written == target:
            break
        name_length += target - written
    assert written == target
    assert open_checkpoint(out).format == "safetensors"
    assert main(["check", str(out)]) == 0


@pytest.mark.parametrize("protocol", [0, 1])
@pytest.mark.parametrize(
    "value",
    [("a", 1), {"epoch": 3}, ["x", "y"], "text", 12, 1.5, None, {"nested": [(1, 2)]}],
    ids=["tuple", "dict", "list", "str", "int", "float", "none", "nested"],
)
def test_protocol_0_and_1_pickles_are_pickles(tmp_path: Path, protocol: int, value: object) -> None:
    path = tmp_path / "p.pkl"
    path.write_bytes(pickle.dumps(value, protocol=protocol))
    checkpoint = open_checkpoint(path)
    assert checkpoint.format == "pickle"
    assert checkpoint.root == value or isinstance(value, tuple)


def test_pickle_followed_by_data_is_a_pickle(tmp_path: Path) -> None:
    path = tmp_path / "p.pkl"
    path.write_bytes(pickle.dumps({"a": 1}, protocol=0) + b"\x00\xff trailing data")
    assert open_checkpoint(path).root == {"a": 1}


@pytest.mark.parametrize("lead", ["", "        ", "\n", "\t\r\n  "])
def test_index_json_with_leading_whitespace_is_an_index(tmp_path: Path, lead: str) -> None:
    index = write_sharded_safetensors(dict(tiny_state_dict()), tmp_path)
    index.write_text(lead + index.read_text())
    assert open_checkpoint(index).format == "sharded"


def test_text_files_are_named_as_text(tmp_path: Path) -> None:
    for text in ("hello world\n", "class Net:\n    pass\n", "(1, 2)\n", "Name,Value\n"):
        (tmp_path / "t.txt").write_text(text)
        with pytest.raises(ReadError, match="text file"):
            open_checkpoint(tmp_path / "t.txt")


def tar_with(members: dict[str, bytes], first_name: str | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(first_name if first_name and name == next(iter(members)) else name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_tar_archive_is_named_not_read_as_a_pickle(tmp_path: Path) -> None:
    path = tmp_path / "old.tar"
    path.write_bytes(tar_with({"pickle": pickle.dumps({"w": 1}, 2), "storages": b"", "tensors": b""}))
    with pytest.raises(ReadError, match="tar archive"):
        open_checkpoint(path)


def test_tar_that_is_also_a_pickle_is_read_as_torch_reads_it(tmp_path: Path) -> None:
    # the tar header's name field holds a whole pickle: pickle.load reads {"a": 1}, torch.load reads a tar
    hidden = pickle.dumps({"a": 1}, 0)  # no NUL byte: it must survive as a tar member name
    raw = tar_with({"x": b"payload"}, first_name=hidden.decode("latin-1"))
    path = tmp_path / "polyglot.pth"
    path.write_bytes(raw)
    assert pickle.loads(raw) == {"a": 1}
    assert tarfile.is_tarfile(path)
    with pytest.raises(ReadError, match="tar archive"):
        open_checkpoint(path)


def test_zip_named_safetensors_says_torch_load_refuses_it(tmp_path: Path) -> None:
    path = tmp_path / "actually_torch.safetensors"
    torch.save(tiny_state_dict(), path)
    checkpoint = open_checkpoint(path)
    assert checkpoint.format == "zip"
    assert any(".safetensors" in p and "refuses" in p for p in checkpoint.loader_problems)


def test_safetensors_that_is_also_a_pickle(tmp_path: Path) -> None:
    # a 4-byte BINUNICODE at byte 2 swallows bytes 7-9 (the header's '{"' included); the key then
    # starts with POP, NONE, STOP: pickle.load reads None, the safetensors library reads the tensor
    key = "0N." + "k" * 5
    body = json.dumps({key: TENSOR}, separators=(",", ":"))
    length = struct.unpack("<Q", b"\x80\x02X\x03\x00\x00\x00\x00")[0]
    raw = safetensors_bytes(body + " " * (length - len(body)), b"\x01\x02\x03\x04")
    assert raw[:8] == b"\x80\x02X\x03\x00\x00\x00\x00"
    assert pickle.loads(raw) is None
    path = tmp_path / "polyglot.bin"
    path.write_bytes(raw)
    checkpoint = open_checkpoint(path)
    assert checkpoint.format == "safetensors" and list(checkpoint.root) == [key]
    assert any("polyglot" in p and "pickle" in p for p in checkpoint.loader_problems)


def test_index_naming_itself_or_another_index_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.index.json").write_text(json.dumps({"weight_map": {"w": "a.index.json"}}))
    with pytest.raises(ReadError, match="index"):
        open_checkpoint(tmp_path / "a.index.json")
    (tmp_path / "b.index.json").write_text(json.dumps({"weight_map": {"w": "c.bin"}}))
    (tmp_path / "c.bin").write_text(json.dumps({"weight_map": {"w": "b.index.json"}}))
    with pytest.raises(ReadError, match="index"):
        open_checkpoint(tmp_path / "b.index.json")


@pytest.mark.parametrize("where", ["index", "safetensors"])
def test_deeply_nested_json_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    if where == "index":
        path = tmp_path / "m.index.json"
        path.write_text('{"weight_map": {}, "x": ' + deep + "}")
    else:
        path = tmp_path / "m.safetensors"
        path.write_bytes(safetensors_bytes('{"__metadata__":' + deep + "}"))
    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_safetensors_that_is_also_a_torch_zip(tmp_path: Path) -> None:
    # "PK\x03\x04" then four zero bytes is a header length of 67,324,752: the safetensors header is
    # padded to it, and a whole torch zip (its central directory at the end) is the one tensor's data
    from safetensors import safe_open

    length = struct.unpack("<Q", b"PK\x03\x04\x00\x00\x00\x00")[0]
    hidden = torch_zip_members(pickle_with_pids({"hidden": View(StorageRef(), 0, (4,), (1,))}), {"0": b"\0" * 16})
    buffer = io.BytesIO()
    buffer.write(b"\0" * (8 + length))  # the zip's offsets count from the start of the file
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in hidden.items():
            archive.writestr(zipfile.ZipInfo(name), data)
    tail = buffer.getvalue()[8 + length :]
    body = json.dumps({"x": {"dtype": "U8", "shape": [len(tail)], "data_offsets": [0, len(tail)]}})
    path = tmp_path / "polyglot.pth"
    path.write_bytes(safetensors_bytes(body + " " * (length - len(body)), tail))
    assert list(torch.load(path, weights_only=True)) == ["hidden"]
    with safe_open(str(path), "np") as file:
        assert list(file.keys()) == ["x"]
    checkpoint = open_checkpoint(path)
    assert checkpoint.format == "safetensors" and list(checkpoint.root) == ["x"]
    assert any("polyglot" in p and "zip" in p for p in checkpoint.loader_problems)
