"""Container swaps and zip tricks (issue 21, item 8): what ``torch.load`` really does with each file,
checked in a child process with a canary, and ckpt-tui never saying "clean" or "loads" where torch
would run code or refuse.

Each case is a file as an attacker would send it: a pickle before a zip, a payload with garbage after
it, a tar, npy, joblib or 7z container, a pickle named ``*.safetensors``, a zip whose ``data.pkl`` is
marked encrypted, has a bad CRC or a data-descriptor flag.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import subprocess
import sys
import tarfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from builders import Payload, touch_command

from ckpt_tui.cli import main


def torch_zip() -> bytes:
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buffer)
    return buffer.getvalue()


def payload(canary: Path) -> bytes:
    return pickle.dumps(Payload(os.system, touch_command(canary)), protocol=2)


def tar_container(canary: Path) -> bytes:
    """torch's pre-0.4 tar format, its ``storages`` pickle a payload."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [("storages", payload(canary)), ("tensors", pickle.dumps(0, 2)), ("pickle", b"N.")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def npy_objects(canary: Path) -> bytes:
    out = io.BytesIO()
    np.save(out, np.array([Payload(os.system, touch_command(canary))], dtype=object), allow_pickle=True)
    return out.getvalue()


def with_flag(data: bytes, member: bytes, flag: int = 0, crc: int | None = None) -> bytes:
    """The zip with ``member``'s general-purpose flags or-ed with ``flag`` (central and local), or its CRC replaced."""
    raw = bytearray(data)
    at = raw.find(b"PK\x01\x02")
    while at >= 0:
        name_len = struct.unpack_from("<H", raw, at + 28)[0]
        if bytes(raw[at + 46 : at + 46 + name_len]).endswith(member):
            flags = struct.unpack_from("<H", raw, at + 8)[0] | flag
            local = struct.unpack_from("<I", raw, at + 42)[0]
            struct.pack_into("<H", raw, at + 8, flags)
            struct.pack_into("<H", raw, local + 6, flags)
            if crc is not None:
                struct.pack_into("<I", raw, at + 16, crc)
        at = raw.find(b"PK\x01\x02", at + 4)
    return bytes(raw)


def local_name_differs(data: bytes) -> bytes:
    """The zip with data.pkl's local header naming another file (zip readers that check it refuse; miniz
    reads the central directory's name and the local header's lengths only)."""
    raw = bytearray(data)
    at = raw.find(b"archive/data.pkl")  # the first: the local header's copy
    raw[at : at + 16] = b"archive/evil.pkl"
    return bytes(raw)


CASES: dict[str, tuple[str, Callable[[Path], bytes]]] = {
    "pickle before a zip": ("a.pth", lambda c: payload(c) + torch_zip()),
    "payload, then garbage": ("b.pth", lambda c: payload(c) + b"\xff\xfe garbage" * 10),
    "zip, then a payload": ("c.pth", lambda c: torch_zip() + payload(c)),
    "joblib (plain pickle)": ("d.joblib", payload),
    "joblib (zlib)": ("e.joblib", lambda c: b"ZF0x" + zlib.compress(payload(c))),
    "npy of objects": ("f.npy", npy_objects),
    "7z": ("g.7z", lambda c: b"7z\xbc\xaf\x27\x1c" + b"\0" * 64),
    "tar": ("h.tar", tar_container),
    "pickle named .safetensors": ("i.safetensors", payload),
    "torch zip named .safetensors": ("j.safetensors", lambda c: torch_zip()),
    "encrypted data.pkl": ("k.pth", lambda c: with_flag(torch_zip(), b"data.pkl", flag=0x1)),
    "bad CRC on data.pkl": ("l.pth", lambda c: with_flag(torch_zip(), b"data.pkl", crc=0xDEADBEEF)),
    "data descriptor flag": ("m.pth", lambda c: with_flag(torch_zip(), b"data.pkl", flag=0x8)),
    "local header names another file": ("n.pth", lambda c: local_name_differs(torch_zip())),
    "zip, then a short end signature": ("o.pth", lambda c: torch_zip() + b"PK\x05\x06" + b"12345"),
    "zip, then 70 kB of garbage": ("p.pth", lambda c: torch_zip() + b"x" * 70_000),
}

ORACLE = """
import json, os, sys, torch
out = {}
for path, canary in json.loads(sys.argv[1]):
    result = {}
    for weights_only in (True, False):
        try:
            torch.load(path, weights_only=weights_only)
            result[str(weights_only)] = "loads"
        except BaseException as exc:
            result[str(weights_only)] = "fails: " + type(exc).__name__
    result["ran"] = os.path.exists(canary)
    out[path] = result
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, object]]]:
    """Each case's file and what the real torch.load does with it (both modes), in one child process."""
    folder = tmp_path_factory.mktemp("swaps")
    files = {}
    for name, (file_name, build) in CASES.items():
        canary = folder / f"{file_name}.canary"
        path = folder / file_name
        path.write_bytes(build(canary))
        files[name] = (path, canary)
    jobs = json.dumps([[str(p), str(c)] for p, c in files.values()])
    done = subprocess.run([sys.executable, "-c", ORACLE, jobs], capture_output=True, text=True, timeout=300)
    results = json.loads(done.stdout.strip().splitlines()[-1])
    return {name: (path, results[str(path)]) for name, (path, _) in files.items()}


def test_the_oracle_sees_code_run(judged: dict[str, tuple[Path, dict[str, object]]]) -> None:
    """The payload cases are armed: torch.load(weights_only=False) runs them where it unpickles them."""
    ran = {name for name, (_, result) in judged.items() if result["ran"]}
    assert {"pickle before a zip", "payload, then garbage", "joblib (plain pickle)", "tar"} <= ran


@pytest.mark.parametrize("name", list(CASES))
def test_never_clean_where_torch_runs_code_or_refuses(
    judged: dict[str, tuple[Path, dict[str, object]]], name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path, torch_result = judged[name]
    code = main(["check", "--json", str(path)])
    captured = capsys.readouterr()
    report = json.loads(captured.out) if captured.out.strip() else {}
    answer = report.get("weights_only", {}).get("answer")
    if torch_result["True"] != "loads":
        assert code in (1, 2) and answer != "loads", (torch_result, report, captured.err)
    else:
        assert code == 0 and answer == "loads", (torch_result, report, captured.err)
    if torch_result["ran"]:  # code would run under weights_only=False: ckpt-tui says so
        kinds = {problem["kind"] for problem in report.get("problems", [])}
        assert "unsafe-global" in kinds or "UNSAFE" in captured.err, (report, captured.err)
