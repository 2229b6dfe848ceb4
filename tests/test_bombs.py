"""Resource bombs and lying files: a one-line error (exit 2) within seconds, under a memory limit."""

from __future__ import annotations

import json
import resource
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from builders import rewrite_zip, tiny_state_dict, torch_bytes

MEMORY_LIMIT = 1 << 30  # 1 GiB of address space: far below what any of these files claims
TIME_LIMIT = 20


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_limited(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tui", *args],
        capture_output=True,
        text=True,
        timeout=TIME_LIMIT,
        preexec_fn=limited,
    )


def assert_one_line_error(path: Path, *words: str) -> None:
    for command in ("info", "check"):
        result = run_limited(command, str(path))
        assert result.returncode == 2, (command, result.stdout[-500:], result.stderr[-500:])
        err = result.stderr
        assert err.startswith("ckpt-tui: ") and err.count("\n") == 1 and "Traceback" not in err, err
        for word in words:
            assert word in err, err


def pickle_zip(tmp_path: Path, data_pkl: bytes, name: str = "bomb.pth") -> Path:
    torch.save(tiny_state_dict(), tmp_path / "good.pth")
    return rewrite_zip(tmp_path / "good.pth", tmp_path / name, data_pkl=data_pkl)


def test_deeply_nested_lists(tmp_path: Path) -> None:
    depth = 200_000
    data = b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."
    assert_one_line_error(pickle_zip(tmp_path, data), "nested")


def test_billion_laughs_by_memo(tmp_path: Path) -> None:
    # each level is a list holding the previous level ten times (by memo reference): 10**40 leaves
    parts = [b"\x80\x02X\x04\x00\x00\x00lolzq\x00"]
    for level in range(1, 41):
        parts.append(b"(" + (b"h" + bytes([level - 1])) * 10 + b"lq" + bytes([level]))
    data = b"".join(parts) + b"."
    path = pickle_zip(tmp_path, data)
    result = run_limited("info", "--json", str(path))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["tensor_count"] == 0


def test_storage_larger_than_file(tmp_path: Path) -> None:
    good = torch_bytes(tiny_state_dict())
    with zipfile.ZipFile(__import__("io").BytesIO(good)) as archive:
        name = next(n for n in archive.namelist() if n.endswith("data.pkl"))
        data = archive.read(name)
    huge = data.replace(b"K\xd8t", b"\x8a\x07\x00\x00\x00\x00\x00\x00\x10t", 1)  # numel 216 -> 2**52
    assert huge != data
    assert_one_line_error(pickle_zip(tmp_path, huge), "declares")


def test_legacy_storage_larger_than_file(tmp_path: Path) -> None:
    path = tmp_path / "legacy.pth"
    torch.save({"w": torch.zeros(4)}, path, _use_new_zipfile_serialization=False)
    raw = path.read_bytes().replace(b"K\x04Nt", b"\x8a\x07\x00\x00\x00\x00\x00\x00\x10Nt", 1)
    assert raw != path.read_bytes()
    path.write_bytes(raw)
    assert_one_line_error(path, "declares")


def safetensors_file(path: Path, header: dict, data: bytes, length: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", length if length is not None else len(raw)) + raw + data)
    return path


@pytest.mark.parametrize(
    ("name", "header", "length", "word"),
    [
        ("out_of_range", {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 10**12]}}, None, "out of range"),
        ("overlap_shape", {"w": {"dtype": "F32", "shape": [10**9, 10**9], "data_offsets": [0, 16]}}, None, "wrong"),
        ("negative", {"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}, None, "shape"),
        ("header_too_long", {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, 10**15, "header length"),
    ],
)
def test_lying_safetensors(tmp_path: Path, name: str, header: dict, length: int | None, word: str) -> None:
    path = safetensors_file(tmp_path / f"{name}.safetensors", header, b"\x00" * 16, length)
    if name == "header_too_long":
        path.write_bytes(struct.pack("<Q", length) + b"{" + b" " * 30)
    assert_one_line_error(path, word)


def central_directory_at(raw: bytes) -> int:
    return raw.rfind(b"PK\x05\x06")


def test_zip_central_directory_lies(tmp_path: Path) -> None:
    raw = bytearray(torch_bytes(tiny_state_dict()))
    eocd = central_directory_at(bytes(raw))
    lies = {
        "entries": (eocd + 10, struct.pack("<H", 60000)),
        "offset": (eocd + 16, struct.pack("<I", len(raw) * 4)),
    }
    for name, (at, value) in lies.items():
        broken = bytearray(raw)
        broken[at : at + len(value)] = value
        zip64 = broken.rfind(b"PK\x06\x06")  # torch always writes a zip64 end record: lie there too
        if zip64 >= 0 and name == "entries":
            broken[zip64 + 32 : zip64 + 40] = struct.pack("<Q", 60000)
        elif zip64 >= 0:
            broken[zip64 + 48 : zip64 + 56] = struct.pack("<Q", len(raw) * 4)
        path = tmp_path / f"{name}.pth"
        path.write_bytes(bytes(broken))
        assert_one_line_error(path)
    member = bytearray(raw)
    first = member.find(b"PK\x01\x02")
    member[first + 42 : first + 46] = struct.pack("<I", len(raw) + 1000)  # data.pkl's local header offset
    (tmp_path / "member.pth").write_bytes(bytes(member))
    assert_one_line_error(tmp_path / "member.pth")


def test_zip_with_thousands_of_entries(tmp_path: Path) -> None:
    path = tmp_path / "many_entries.pth"
    with zipfile.ZipFile(path, "w") as archive:
        for index in range(20_000):
            archive.writestr(f"junk/{index}", b"")
    assert_one_line_error(path, "no data.pkl")


def test_persistent_id_that_is_not_a_storage(tmp_path: Path) -> None:
    data = b"\x80\x02(X\x07\x00\x00\x00storagecos\nsystem\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x01tQ."
    assert_one_line_error(pickle_zip(tmp_path, data), "storage")
    assert_one_line_error(pickle_zip(tmp_path, b"\x80\x02X\x03\x00\x00\x00abcQ.", "pid.pth"), "storage")


def test_memo_index_bomb_fails_fast_without_an_external_limit(tmp_path: Path) -> None:
    """LONG_BINPUT with a huge index makes CPython's unpickler allocate its memo up to that index."""
    import time

    path = tmp_path / "memo.pkl"
    path.write_bytes(b"\x80\x02]r\xff\xff\xff\x3f.")
    code = (  # VmHWM: this process's own peak (ru_maxrss would include the parent's, kept across exec)
        "import sys; from ckpt_tui.cli import main; rc = main(['info', sys.argv[1]]); "
        "peak = next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]; "
        "print(peak, file=sys.stderr); sys.exit(rc)"
    )
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60)
    assert time.perf_counter() - start < 10
    message, peak_kb = result.stderr.strip().splitlines()
    assert result.returncode == 2 and "memo bomb" in message
    assert int(peak_kb) < 300_000
