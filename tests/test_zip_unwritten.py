"""Zip records torch's reader "reads" without writing a byte: a member miniz takes for a directory (a name
ending in "/", or the DOS directory attribute 0x10) or whose compressed size is 0. ``torch.load`` then
uses the buffer it allocated as it was: uninitialised memory. ckpt-tui never shows the record's bytes as
the values, never calls the file clean, and never writes those bytes as the loaded values.

Every expectation is checked against the real ``torch.load`` on the same file: its values are compared
with the record's bytes (memory is filled with a pattern first, so a buffer left unwritten is seen).
"""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from ckpt_tui.cli import main
from ckpt_tui.core.errors import UnwrittenRecord
from ckpt_tui.core.model.tree import Tensor, iter_tensors
from ckpt_tui.core.operations.check import check_checkpoint
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.values.tensor_values import TensorReader

VALUES = torch.arange(1.0, 1025.0)
"""4 KiB of values no uninitialised buffer holds by chance."""


@dataclass
class Member:
    """One member as the zip will hold it."""

    name: bytes
    data: bytes
    attribute: int = 0
    deflate: bool = False
    compressed_size: int | None = None
    """The central directory's compressed size, where it lies."""


def saved(obj: object) -> list[Member]:
    """The members torch.save writes for ``obj``, in its order."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as archive:
        return [Member(info.filename.encode(), archive.read(info)) for info in archive.infolist()]


def zip_bytes(members: list[Member]) -> bytes:
    """A zip of exactly these members (names, attributes, methods and sizes as given)."""
    out, central = bytearray(), bytearray()
    for member in members:
        stored = zlib.compress(member.data, 9)[2:-4] if member.deflate else member.data
        method, crc, offset = 8 if member.deflate else 0, zlib.crc32(member.data), len(out)
        csize = len(stored) if member.compressed_size is None else member.compressed_size
        sizes = (crc, csize, len(member.data), len(member.name))
        out += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, method, 0, 0, *sizes, 0) + member.name + stored
        fields = (20, 20, 0, method, 0, 0, *sizes, 0, 0, 0, 0, member.attribute, offset)
        central += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", *fields) + member.name
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(members), len(members), len(central), len(out), 0)
    return bytes(out + central + end)


def build(tmp_path: Path, name: str, obj: object, change: dict[bytes, dict[str, object]]) -> Path:
    """torch.save's members for ``obj``, those named in ``change`` (by name suffix) altered."""
    members = saved(obj)
    for member in members:
        for suffix, fields in change.items():
            if member.name.endswith(suffix):
                for field, value in fields.items():
                    setattr(member, field, value)
    path = tmp_path / name
    path.write_bytes(zip_bytes(members))
    return path


LOAD = """
import json, sys, torch
try:
    loaded = torch.load(sys.argv[1], weights_only=True, mmap=sys.argv[2] == "1")
    print(json.dumps({key: value.tolist() for key, value in loaded.items()}))
except Exception as exc:
    print(json.dumps(f"{type(exc).__name__}: {exc}"))
"""


def torch_load(path: Path, mmap: bool = False) -> dict[str, torch.Tensor] | str:
    """What torch.load(weights_only=True) gives, or its error, in a fresh process: there no buffer can hold
    the record's bytes unless torch wrote them (this one holds them everywhere, and reuses freed memory)."""
    done = subprocess.run(
        [sys.executable, "-c", LOAD, str(path), "1" if mmap else "0"], capture_output=True, text=True, timeout=300
    )
    found = json.loads(done.stdout)
    return found if isinstance(found, str) else {key: torch.tensor(value) for key, value in found.items()}


def key_empty(tmp_path: Path) -> Path:
    """A storage whose key is "": its record ``archive/data/`` is a directory by its trailing "/"."""
    members = saved({"w": VALUES})
    for member in members:
        if member.name.endswith(b"data.pkl"):
            member.data = member.data.replace(b"X\x01\x00\x00\x000", b"X\x00\x00\x00\x00", 1)
        if member.name.endswith(b"data/0"):
            member.name = member.name[:-1]
    path = tmp_path / "key_empty.pth"
    path.write_bytes(zip_bytes(members))
    return path


DIR = {"attribute": 0x10}
CASES = {
    "dir-bit": ({"w": VALUES}, {b"data/0": DIR}),
    "dir-bit-deflated": ({"w": VALUES}, {b"data/0": {"attribute": 0x10, "deflate": True}}),
    "dir-bit-one-of-two": ({"w": VALUES, "v": VALUES + 1}, {b"data/1": DIR}),
    "dir-bit-both": ({"w": VALUES, "v": VALUES + 1}, {b"data/0": DIR, b"data/1": DIR}),
    "dir-bit-unix-high-bits": ({"w": VALUES}, {b"data/0": {"attribute": 0o40755 << 16 | 0x10}}),
    "unix-dir-mode-only": ({"w": VALUES}, {b"data/0": {"attribute": 0o40755 << 16}}),
    "comp-size-0": ({"w": VALUES}, {b"data/0": {"compressed_size": 0}}),
    "comp-size-0-deflated": ({"w": VALUES}, {b"data/0": {"compressed_size": 0, "deflate": True}}),
    "empty-tensor-dir-bit": ({"w": torch.empty(0), "v": VALUES}, {b"data/0": DIR}),
    "plain": ({"w": VALUES}, {}),
}


def ours(path: Path) -> tuple[dict[str, list[float] | str], int, str]:
    """ckpt-tui's values per tensor (an UnwrittenRecord's words where it refuses them), check's exit code and
    the weights_only answer."""
    checkpoint = open_checkpoint(str(path))
    values: dict[str, list[float] | str] = {}
    for key_path, tensor in iter_tensors(checkpoint.root):
        assert isinstance(tensor, Tensor)
        try:
            values[str(key_path[-1])] = TensorReader(tensor, checkpoint.byteorder).first(1 << 20).tolist()
        except UnwrittenRecord as exc:
            values[str(key_path[-1])] = f"unwritten: {exc}"
    report = check_checkpoint(checkpoint)
    answer = report.weights_only.answer if report.weights_only is not None else "n/a"
    return values, (0 if report.ok else 1), str(answer)


@pytest.mark.parametrize("case", list(CASES))
def test_records_torch_leaves_unwritten_are_never_shown_as_values(tmp_path: Path, case: str) -> None:
    """Each tensor torch.load fills from the file is shown with those values; each it leaves as uninitialised
    memory is refused as unwritten (never the record's bytes), and the file is never clean."""
    obj, change = CASES[case]
    path = build(tmp_path, f"{case}.pth", obj, change)
    theirs = torch_load(path)
    values, code, answer = ours(path)
    if isinstance(theirs, str):
        # torch refuses the file: never "loads"
        assert answer != "loads" and code == 1, (theirs, values)
        return
    written = {key: bool(torch.equal(theirs[key], obj[key])) for key in obj}  # type: ignore[index]
    for key, same in written.items():
        if same and obj[key].numel():  # type: ignore[index]
            assert values[key] == obj[key].tolist(), key  # type: ignore[index]
        elif not same:
            assert str(values[key]).startswith("unwritten: "), (key, values[key])
    if all(written.values()):
        assert (code, answer) == (0, "loads"), values
    else:
        assert (code, answer) == (1, "cannot_tell")


def test_the_test_sees_uninitialised_memory(tmp_path: Path) -> None:
    """The differential check tells the classes apart: torch.load really returns other values for the
    directory bit (so the test above fails without the rule), and the record's bytes under mmap=True."""
    path = build(tmp_path, "dir.pth", {"w": VALUES}, {b"data/0": DIR})
    loaded = torch_load(path)
    assert not isinstance(loaded, str) and not torch.equal(loaded["w"], VALUES)
    mapped = torch_load(path, mmap=True)
    assert not isinstance(mapped, str) and torch.equal(mapped["w"], VALUES)


def test_a_trailing_slash_record_is_unwritten(tmp_path: Path) -> None:
    """A storage key "" names the record ``archive/data/``: a directory to miniz by its name."""
    path = key_empty(tmp_path)
    loaded = torch_load(path)
    assert not isinstance(loaded, str) and not torch.equal(loaded["w"], VALUES)
    values, code, answer = ours(path)
    assert str(values["w"]).startswith("unwritten: ") and "trailing '/'" in str(values["w"])
    assert (code, answer) == (1, "cannot_tell")


@pytest.mark.parametrize("record", [b"data.pkl", b"byteorder", b"/version", b".data/serialization_id"])
def test_small_records_and_data_pkl_flagged_as_directories(
    tmp_path: Path, record: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch reads uninitialised memory for data.pkl or a small record: check is never clean (data.pkl: the
    reader refuses the file, exit 2, after the verdict "cannot tell")."""
    path = build(tmp_path, "small.pth", {"w": VALUES}, {record: DIR})
    code = main(["check", str(path)])
    out = capsys.readouterr()
    assert code == (2 if record == b"data.pkl" else 1)
    assert "CANNOT TELL" in out.out and "uninitialised memory" in out.out + out.err
    assert "Traceback" not in out.err


def test_commands_never_present_the_record_bytes_as_loaded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """convert and stats refuse the tensor in one line; nothing is written."""
    path = build(tmp_path, "dir.pth", {"w": VALUES}, {b"data/0": DIR})
    out = tmp_path / "out.safetensors"
    assert main(["convert", str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "uninitialised memory" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    assert main(["convert", str(path), "-o", str(tmp_path / "out.pth")]) == 2
    assert not (tmp_path / "out.pth").exists()
    capsys.readouterr()
    main(["stats", str(path)])
    shown = capsys.readouterr().out
    # the tensor's row says why it has no values; none of the record's are shown
    assert "uninitialised memory" in shown and "512.5" not in shown


def flag_central(path: Path, name: bytes) -> None:
    """Set the DOS directory attribute on every central-directory entry named ``name`` in ``path`` (the
    archives a DCP ``.distcp`` file holds one after another included)."""
    data = bytearray(path.read_bytes())
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        length = struct.unpack_from("<H", data, at + 28)[0]
        if bytes(data[at + 46 : at + 46 + length]) == name:
            struct.pack_into("<I", data, at + 38, struct.unpack_from("<I", data, at + 38)[0] | 0x10)
        at = data.find(b"PK\x01\x02", at + 4)
    path.write_bytes(bytes(data))


DCP_LOAD = """
import sys, warnings, torch
import torch.distributed.checkpoint as dcp
warnings.simplefilter("ignore")
state = {"w": torch.zeros(32, 32)}
dcp.load(state, checkpoint_id=sys.argv[1])
print(bool(torch.equal(state["w"], torch.arange(1.0, 1025.0).reshape(32, 32))))
"""


def test_dcp_items_torch_leaves_unwritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A DCP chunk whose record is flagged a directory loads uninitialised memory in dcp.load: check reports
    the tensor unread (exit 1); a byte item whose data.pkl is flagged (dcp.load unpickles uninitialised
    memory, weights_only=False) is refused in one line (exit 2)."""
    from builders import write_dcp

    chunk = write_dcp({"w": VALUES.reshape(32, 32)}, tmp_path / "chunk")
    flag_central(next(chunk.glob("*.distcp")), b"archive/data/0")
    done = subprocess.run([sys.executable, "-c", DCP_LOAD, str(chunk)], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "False", done.stderr[-500:]  # dcp.load's values are not the file's
    assert main(["check", str(chunk)]) == 1
    assert "[unread-tensor]" in capsys.readouterr().out
    item = write_dcp({"lr": 0.1}, tmp_path / "item")
    flag_central(next(item.glob("*.distcp")), b"archive/data.pkl")
    assert main(["check", str(item)]) == 2
    err = capsys.readouterr().err
    assert "uninitialised memory" in err and len(err.strip().splitlines()) == 1
