"""Zip members are found as torch's reader finds them: names compared with ASCII letters lowered, a
binary search over miniz's heap-sorted central directory, and so the same twin torch picks.

Every expectation here is the real torch's answer: ``torch._C.PyTorchFileReader`` (the reader
``torch.load`` uses) for single records, ``torch.load(weights_only=True)`` for whole files.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch
from builders import Payload, touch_command
from builders_readers import raw_zip_bytes, write_raw_zip

from ckpt_tui.cli import main
from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model.tree import Tensor, iter_tensors
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.readers.zip_archive import read_central_directory
from ckpt_tui.core.values.tensor_values import TensorReader
from ckpt_tui.core.weights_only.verdict import scan_file, verdict, verdict_from_scan

POOL = [
    b"data.pkl",
    b"DATA.PKL",
    b"Data.Pkl",
    b"data/0",
    b"DATA/0",
    b"data/A",
    b"data/a",
    b"byteorder",
    b"data/1",
    b"data.pkl/",
    b"\xffdata",
    b"data/0\x00z",
    b"data/01",
    b"dat",
]
QUERIES = ["data.pkl", "DATA.PKL", "data/0", "data/A", "data/a", "byteorder", "data/1", "dat", "data/0\x00q", "nope"]


def torch_record(path: Path, name: str) -> bytes | None:
    """The bytes torch's zip reader returns for ``name`` (None: it finds no such record)."""
    reader = torch._C.PyTorchFileReader(str(path))
    if not reader.has_record(name):
        return None
    return bytes(reader.get_record(name))


def our_record(blob: bytes, archive: str, name: str) -> bytes | None:
    """The bytes ckpt-tui's one lookup returns for the same name."""
    entries = read_central_directory(io.BytesIO(blob), len(blob))
    entry = entries.get(archive + name)
    if entry is None:
        return None
    start = entry.header_offset + 30 + len(entry.raw)
    return blob[start : start + entry.size]


def test_every_lookup_finds_the_member_torch_finds(tmp_path: Path) -> None:
    """Generated zips with case twins, exact duplicates in every order, NULs, non-UTF-8 bytes and
    directory records: each record name resolves to the bytes torch's reader returns."""
    rng = random.Random(21)
    path = tmp_path / "lookup.zip"
    asked = differing_picks = 0
    for _ in range(150):
        names = [b"a/version"] + [b"a/" + rng.choice(POOL) for _ in range(rng.randint(1, 40))]
        rng.shuffle(names)
        members = [(name, b"3" if name == b"a/version" else b"%d" % i) for i, name in enumerate(names)]
        blob = raw_zip_bytes(members)
        path.write_bytes(blob)
        for query in QUERIES:
            theirs = torch_record(path, query)
            assert our_record(blob, "a/", query) == theirs, (names, query)
            asked += 1
            first_twin = next((data for name, data in members if name.lower() == b"a/" + query.encode().lower()), None)
            differing_picks += theirs is not None and theirs != first_twin
    assert asked == 1500
    assert differing_picks > 50  # "the first member with the name" would have been wrong this often


# ---- whole files: the tensors and objects torch.load builds ---------------------------------------------


def saved_members(obj: object, tmp_path: Path) -> list[tuple[bytes, bytes]]:
    """The members torch.save writes for ``obj``, in its order."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as archive:
        return [(info.filename.encode(), archive.read(info)) for info in archive.infolist()]


def our_values(path: Path) -> dict[str, list[float]]:
    checkpoint = open_checkpoint(str(path))
    found: dict[str, list[float]] = {}
    for key_path, tensor in iter_tensors(checkpoint.root):
        assert isinstance(tensor, Tensor)
        found[str(key_path[-1])] = TensorReader(tensor, checkpoint.byteorder).first(4).tolist()
    return found


def torch_values(path: Path) -> dict[str, list[float]]:
    loaded = torch.load(path, weights_only=True)
    return {str(key): value.tolist() for key, value in loaded.items()}


FILLERS = [b"archive/.format_version", b"archive/.storage_alignment", b"archive/zz", b"archive/DATA/9"]


@pytest.mark.parametrize("twin", [b"archive/data/0", b"archive/DATA/0", b"archive/Data/0"])
def test_twin_records_read_the_bytes_torch_reads(tmp_path: Path, twin: bytes) -> None:
    """A storage record with a twin (the same name, or the same in another case) placed at every position,
    among fillers that move miniz's heap: ckpt-tui's values are torch.load's, whichever twin that is."""
    members = saved_members({"w": torch.tensor([1.0, 2.0, 3.0, 4.0])}, tmp_path)
    other = torch.tensor([10.0, 20.0, 30.0, 40.0]).numpy().tobytes()
    picks = set()
    for fillers in range(len(FILLERS) + 1):
        extra = [(name, b"1" if "format" in name.decode() else b"64" if "align" in name.decode() else b"x")
                 for name in FILLERS[:fillers]]  # fmt: skip
        for position in range(len(members) + 1):
            layout = [*members[:position], (twin, other), *members[position:], *extra]
            path = write_raw_zip(tmp_path / f"twin{fillers}-{position}.pth", layout)
            theirs = torch_values(path)
            assert our_values(path) == theirs, (fillers, position)
            picks.add(theirs["w"][0])
    assert picks == {1.0, 10.0}  # torch read each twin in some layout: the test tells the two apart


@pytest.mark.parametrize("order", ["lower first", "upper first"])
def test_case_twin_data_pkl_shows_the_object_torch_loads(tmp_path: Path, order: str) -> None:
    members = saved_members({"w": torch.tensor([1.0, 2.0, 3.0, 4.0])}, tmp_path)
    twin_pickle = saved_members({"v": torch.tensor([5.0, 6.0, 7.0, 8.0])}, tmp_path)
    data = next(data for name, data in twin_pickle if name.endswith(b"/data.pkl"))
    record = next(blob for name, blob in twin_pickle if b"/data/" in name)
    # the twin's storage key "0" would name the first file's record: it gets its own key, "1"
    twin = (b"archive/DATA.PKL", data.replace(b"X\x01\x00\x00\x000", b"X\x01\x00\x00\x001"))
    layout = [members[0], twin, *members[1:]] if order == "upper first" else [*members, twin]
    layout.append((b"archive/data/1", record))
    path = write_raw_zip(tmp_path / "twins.pth", layout)
    theirs = torch_values(path)
    assert our_values(path) == theirs


# ---- a collision is hostile: check, info, convert ------------------------------------------------------


def payload_zip(tmp_path: Path, payload_first: bool) -> tuple[Path, Path]:
    """``model/data.pkl`` a harmless state_dict, ``model/DATA.PKL`` a pickle that runs ``touch CANARY``."""
    canary = tmp_path / "canary"
    members = saved_members({"w": torch.tensor([1.0, 2.0])}, tmp_path)
    members = [(name.replace(b"archive/", b"model/"), data) for name, data in members]
    payload = (b"model/DATA.PKL", pickle.dumps(Payload(os.system, touch_command(canary)), protocol=2))
    layout = [payload, *members] if payload_first else [*members, payload]
    # the first member names the archive folder: keep model/ first either way
    if payload_first:
        layout = [members[0], payload, *members[1:]]
    return write_raw_zip(tmp_path / f"model{int(payload_first)}.pth", layout), canary


@pytest.mark.parametrize("payload_first", [False, True])
def test_colliding_data_pkl_is_never_clean(
    tmp_path: Path, payload_first: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """The attack of issue 21: a harmless data.pkl beside a DATA.PKL payload."""
    path, canary = payload_zip(tmp_path, payload_first)
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "collide" in out and "'model/DATA.PKL'" in out
    assert "torch.load loads it" not in out and "OK" not in out.split("\n")[0]
    assert main(["check", "--json", str(path)]) == 1
    verdict = json.loads(capsys.readouterr().out)["weights_only"]
    # the union of both candidates: the payload's global is a blocker whichever one torch picks
    assert verdict["answer"] == "refuses" and verdict["loads"] is False
    assert any(b["global"] in ("os.system", "posix.system") for b in verdict["blockers"]), verdict
    assert main(["info", str(path)]) == 0
    assert "collide" in capsys.readouterr().out
    assert main(["convert", str(path), "-o", str(tmp_path / "out.pth")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "readers disagree" in err and "collide" in err
    assert not (tmp_path / "out.pth").exists() and not canary.exists()


def test_harmless_collision_is_cannot_tell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two harmless twins: torch loads one of them; ckpt-tui says "cannot tell", never "loads"."""
    members = saved_members({"w": torch.tensor([1.0, 2.0])}, tmp_path)
    data = next(blob for name, blob in members if name.endswith(b"/data.pkl"))
    path = write_raw_zip(tmp_path / "twins.pth", [*members, (b"archive/data.pkl", data)])
    assert torch.load(path, weights_only=True)["w"].tolist() == [1.0, 2.0]
    assert main(["check", "--json", str(path)]) == 1
    verdict = json.loads(capsys.readouterr().out)["weights_only"]
    assert verdict["answer"] == "cannot_tell" and "collide" in verdict["cannot_tell"]


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param((b"other/x", b"x"), id="member outside the archive folder"),
        pytest.param((b"archive/\xff", b"x"), id="member name not UTF-8"),
    ],
)
def test_what_torch_fails_to_list_is_refused(
    tmp_path: Path, extra: tuple[bytes, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    members = saved_members({"w": torch.tensor([1.0, 2.0])}, tmp_path)
    path = write_raw_zip(tmp_path / "listed.pth", [*members, extra])
    with pytest.raises((RuntimeError, UnicodeDecodeError)):
        torch.load(path, weights_only=True)
    code = main(["check", "--json", str(path)])
    report = json.loads(capsys.readouterr().out)
    assert code in (1, 2) and report["weights_only"]["answer"] == "refuses", report


@pytest.mark.parametrize("payload_first", [False, True])
def test_the_collision_names_the_twin_torch_reads(tmp_path: Path, payload_first: bool) -> None:
    """The twin the flag names is the one torch.load reads: refused where it is the payload."""
    path, canary = payload_zip(tmp_path, payload_first)
    (flag,) = open_checkpoint(str(path)).hostile
    payload_read = "torch 2.13 reads 'model/DATA.PKL'" in flag
    assert payload_read or "torch 2.13 reads 'model/data.pkl'" in flag
    try:
        torch.load(path, weights_only=True)
        refused = False
    except pickle.UnpicklingError:
        refused = True
    assert refused == payload_read and not canary.exists()


VERSIONS = [
    b"3",
    b"+3",
    b"\t+7\n",
    b"-3",
    b"-0",
    b" 3",
    b"3abc",
    b"0x3",
    b"",
    b"03",
    b"+",
    b"11",
    b"0",
    b"1" + b"0" * 20,
]


def test_version_records_read_as_torch_reads_them(tmp_path: Path) -> None:
    """``std::stoull`` as torch's reader applies it: whitespace, a sign, digits; 1 to 10 accepted."""
    members = saved_members({"w": torch.tensor([1.0, 2.0])}, tmp_path)
    for index, version in enumerate(VERSIONS):
        layout = [(name, version if name == b"archive/version" else data) for name, data in members]
        path = write_raw_zip(tmp_path / f"v{index}.pth", layout)
        try:
            torch.load(path, weights_only=True)
            theirs = "loads"
        except (RuntimeError, IndexError):  # (a number past 64 bits: std::out_of_range)
            theirs = "refuses"
        judged = verdict(open_checkpoint(str(path)))
        assert judged.answer == theirs, (version, judged.to_json())


def test_an_archive_folder_that_is_not_utf8_loads_as_in_torch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch never decodes the archive folder's own bytes: such a file loads, with its tensors read."""
    members = saved_members({"w": torch.tensor([1.0, 2.0, 3.0, 4.0])}, tmp_path)
    path = write_raw_zip(tmp_path / "folder.pth", [(b"\xff\xfe" + name[7:], data) for name, data in members])
    assert our_values(path) == torch_values(path)
    assert main(["check", "--json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["weights_only"]["answer"] == "loads"


@pytest.mark.parametrize("name", [b"archive/CONSTANTS.PKL", b"archive/constants.pkl\x00x"])
def test_torchscript_is_told_by_the_exact_listed_name(tmp_path: Path, name: bytes) -> None:
    """torch.load calls a zip TorchScript when ``constants.pkl`` is in its record list, compared exactly
    (a name cut at a NUL counts): ckpt-tui opens the file as torch.load treats it."""
    members = saved_members({"w": torch.tensor([1.0, 2.0, 3.0, 4.0])}, tmp_path)
    path = write_raw_zip(tmp_path / "script.pth", [*members, (name, b"\x80\x02).")])
    try:
        torch_script = False
        torch.load(path, weights_only=True)
    except RuntimeError as exc:
        torch_script = "TorchScript" in str(exc)
    assert scan_file(str(path)).route == ("torchscript" if torch_script else "zip")
    try:
        opened = open_checkpoint(str(path)).format
    except ReadError:
        opened = "unreadable"  # TorchScript without a readable constants.pkl: torch.jit.load fails as well
    assert opened in (("torchscript", "unreadable") if torch_script else ("zip",))


def central_entry(name: bytes, data: bytes, offset: int, **fields: int) -> bytes:
    """One central-directory entry for a stored member, with any field overridden."""
    values = {"flags": 0, "method": 0, "csize": len(data), "size": len(data), "disk": 0, "offset": offset} | fields
    return struct.pack(
        "<4s6H3L5H2L", b"PK\x01\x02", 20, 20, values["flags"], values["method"], 0, 0, zlib.crc32(data),
        values["csize"], values["size"], len(name), 0, 0, values["disk"], 0, 0, values["offset"],
    ) + name  # fmt: skip


OPEN_CHECKS = {
    "stored, two sizes": {"csize": 6},
    "deflated, no compressed bytes": {"csize": 0, "method": 8},
    "on disk 2": {"disk": 2},
    "on disk 1 (miniz allows it)": {"disk": 1},
    "masked local header": {"flags": 0x2000},
    "encrypted, never read": {"flags": 0x1},
    "unknown method, never read": {"method": 99},
    "running past the end": {"csize": 1 << 20, "size": 1 << 20, "method": 8},
}


@pytest.mark.parametrize("fields", list(OPEN_CHECKS.values()), ids=list(OPEN_CHECKS))
def test_members_never_read_still_count_as_torch_opens_the_zip(tmp_path: Path, fields: dict[str, int]) -> None:
    """miniz checks every member as it opens the archive: one it would never read can fail the load."""
    members = [*saved_members({"w": torch.tensor([1.0, 2.0])}, tmp_path), (b"archive/zz", b"hello")]
    blob = bytearray(raw_zip_bytes(members))
    start = blob.find(b"PK\x01\x02")
    entries = blob[start : blob.find(b"PK\x05\x06")]
    last = entries.rfind(b"PK\x01\x02")
    offset = struct.unpack_from("<I", entries, last + 42)[0]
    patched = bytes(entries[:last]) + central_entry(b"archive/zz", b"hello", offset, **fields)
    path = tmp_path / "opened.pth"
    path.write_bytes(bytes(blob[:start]) + patched + bytes(blob[blob.find(b"PK\x05\x06") :]))
    try:
        torch.load(path, weights_only=True)
        theirs = "loads"
    except RuntimeError:
        theirs = "refuses"
    assert verdict_from_scan(scan_file(str(path)), None).answer == theirs


def two_directories(members: list[tuple[bytes, bytes]], twin: tuple[bytes, bytes], zip64_twin: bool) -> bytes:
    """A zip with two central directories: one lists ``members``, the other the same with ``twin`` in place of
    the member of its name. The zip64 end record names the twin's directory when ``zip64_twin``, the
    32-bit one the other; torch's reader (miniz) follows the zip64 record whenever it is there."""
    out, offsets = bytearray(), {}
    for name, data in [*members, twin]:
        offsets[name, data] = len(out)
        sizes = (zlib.crc32(data), len(data), len(data), len(name), 0)
        out += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, *sizes) + name + data
    plain = b"".join(central_entry(n, d, offsets[n, d]) for n, d in members)
    swapped = b"".join(central_entry(*(twin if n == twin[0] else (n, d)), offsets[twin if n == twin[0] else (n, d)])
                       for n, d in members)  # fmt: skip
    first, second = (swapped, plain) if zip64_twin else (plain, swapped)
    first_at = len(out)
    out += first
    second_at = len(out)
    out += second
    count = len(members)
    record_at = len(out)
    out += struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, len(first), first_at)
    out += struct.pack("<4sLQL", b"PK\x06\x07", 0, record_at, 1)
    out += struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, len(second), second_at, 0)
    return bytes(out)


@pytest.mark.parametrize("zip64_twin", [True, False], ids=["zip64 names the payload", "32-bit names the payload"])
def test_two_end_records_read_as_torch_reads_them(
    tmp_path: Path, zip64_twin: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    canary = tmp_path / "canary"
    members = saved_members({"w": torch.tensor([1.0, 2.0])}, tmp_path)
    evil = (b"archive/data.pkl", pickle.dumps(Payload(os.system, touch_command(canary)), protocol=2))
    path = tmp_path / "two.pth"
    path.write_bytes(two_directories(members, evil, zip64_twin))
    try:
        torch.load(path, weights_only=True)
        theirs = "loads"
    except pickle.UnpicklingError:
        theirs = "refuses"
    assert theirs == ("refuses" if zip64_twin else "loads")  # the zip64 record wins
    assert main(["check", "--json", str(path)]) == 1
    report = json.loads(capsys.readouterr().out)
    verdict_json = report["weights_only"]
    # never "loads": the payload's global where torch reads it, "cannot tell" where another reader would
    assert verdict_json["answer"] == ("refuses" if zip64_twin else "cannot_tell"), verdict_json
    assert any("two end records" in p["message"] for p in report["problems"]), report["problems"]
    assert not canary.exists()


@pytest.mark.parametrize("record", [b"", b"3", b"+2", b"x"])
def test_a_data_version_record_is_read_before_version(tmp_path: Path, record: bytes) -> None:
    """``.data/version``, when there, is the one torch reads (an empty one fails the load)."""
    members = saved_members({"w": torch.tensor([1.0, 2.0])}, tmp_path)
    path = write_raw_zip(tmp_path / "dv.pth", [*members, (b"archive/.data/version", record)])
    try:
        torch.load(path, weights_only=True)
        theirs = "loads"
    except (RuntimeError, IndexError, ValueError):
        theirs = "refuses"
    assert verdict_from_scan(scan_file(str(path)), None).answer == theirs


MUTATIONS: dict[str, dict[str, Any]] = {
    "encrypted": {"flags": 0x1},
    "data descriptor": {"flags": 0x8},
    "masked local header": {"flags": 0x2000},
    "deflated": {"method": 8},
    "unknown method": {"method": 12},
    "zero CRC": {"crc": 0},
    "sizes one too long": {"grow": 1},
    "local header names another file": {"lname": True},
    "local extra field": {"extra": b"\x01\x00\x04\x00abcd"},
    "on disk 1": {"disk": 1},
}
EXTRA_MEMBERS = [b"archive/extra", b"other/x", b"archive/", b"archive/data/", b"archive/data/9\x00", b"ARCHIVE/y"]


def mutated_zip(members: list[tuple[bytes, bytes]], changes: dict[int, dict[str, Any]]) -> bytes:
    """A zip of ``members`` with some members' headers changed (flags, method, CRC, sizes, local name...)."""
    out, central = bytearray(), bytearray()
    for index, (name, data) in enumerate(members):
        change = changes.get(index, {})
        body, method = data, change.get("method", 0)
        if method == 8:
            packer = zlib.compressobj(6, zlib.DEFLATED, -15)
            body = packer.compress(data) + packer.flush()
        size, csize = len(data) + change.get("grow", 0), len(body) + change.get("grow", 0)
        crc, flags = change.get("crc", zlib.crc32(data)), change.get("flags", 0)
        local_name = b"x" * len(name) if change.get("lname") else name
        extra = change.get("extra", b"")
        offset = len(out)
        head = (b"PK\x03\x04", 20, flags, method, 0, 0, crc, csize, size, len(local_name), len(extra))
        out += struct.pack("<4s5H3L2H", *head) + local_name + extra + body
        entry = (b"PK\x01\x02", 20, 20, flags, method, 0, 0, crc, csize, size, len(name), 0, 0, change.get("disk", 0))
        central += struct.pack("<4s6H3L5H2L", *entry, 0, 0, offset) + name
    start = len(out)
    out += central + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(members), len(members), len(central), start, 0)
    return bytes(out)


def test_zip_structure_variants_agree_with_torch(tmp_path: Path) -> None:
    """Generated zips (flags, methods, CRCs, sizes, local headers, disks, members outside the folder, a NUL
    in a name, directory records): "loads" exactly where torch.load(weights_only=True) loads."""
    rng = random.Random(2113)
    base = saved_members({"w": torch.ones(2), "v": torch.zeros(3)}, tmp_path)
    path = tmp_path / "variant.pth"
    outcomes = set()
    for _ in range(120):
        members = list(base)
        if rng.random() < 0.3:
            rng.shuffle(members)
        if rng.random() < 0.25:
            members.append((rng.choice(EXTRA_MEMBERS), b"zz"))
        changes = {rng.randrange(len(members)): rng.choice(list(MUTATIONS.values())) for _ in range(rng.randint(0, 2))}
        path.write_bytes(mutated_zip(members, changes))
        try:
            torch.load(path, weights_only=True)
            theirs = "loads"
        except Exception:  # (every way torch's reader fails)
            theirs = "refuses"
        ours = verdict_from_scan(scan_file(str(path)), None).answer
        assert (ours == "loads") == (theirs == "loads"), ([name for name, _ in members], changes, ours)
        outcomes.add(theirs)
    assert outcomes == {"loads", "refuses"}


def test_the_whole_list_pass_over_members_agrees_with_the_member_by_member_checks() -> None:
    import random

    from ckpt_tui.core.readers import zip_archive
    from ckpt_tui.core.readers.zip_archive import ZipEntry, open_refusal

    rng = random.Random(7)
    for _ in range(2000):
        members = []
        for index in range(rng.randint(1, 4)):
            size = rng.choice([0, 1, 64, 0xFFFFFFFF, 1 << 33])
            csize = size if rng.random() < 0.8 else rng.choice([0, 1, 64, 0xFFFFFFFF])
            offset, compress = rng.choice([0, 100, 1 << 32]), rng.choice([0, 0, 0, 8])
            flags = rng.choice([0, 0x2000, 1])
            members.append(ZipEntry(f"a/{index}", offset, compress, csize, size, 0, flags, index=index))
        entries = zip_archive.ZipDirectory((m.name, m) for m in members)
        entries.members = members
        file_bytes = rng.choice([200, 1 << 34])
        slow = zip_archive._plainly_stored
        try:
            zip_archive._plainly_stored = lambda members, file_bytes: False  # type: ignore[assignment]
            expected = open_refusal(entries, file_bytes)
        finally:
            zip_archive._plainly_stored = slow  # type: ignore[assignment]
        assert open_refusal(entries, file_bytes) == expected
