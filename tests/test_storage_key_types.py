"""A storage key in a zip checkpoint's persistent id that is not a str: ``torch.load`` reads the record
``f"data/{key}"`` (``data/b'0'``, ``data/0.0``, ``data/None``, ``data/True``, ``data/('0',)``, ``data/0j``) and
caches the storage by the key object (``0``, ``0.0`` and ``False`` are one storage). ``check --json`` is judged
against the real ``torch.load(weights_only=True)`` in a subprocess: the same record read for each tensor, or
both refuse.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

from builders_readers import StorageRef, View, pickle_with_pids, torch_zip_members, write_zip

from ckpt_tui.cli import main

KEYS: list[Any] = [b"0", 0.0, -0.0, None, True, False, ("0",), (0, b"1"), 0j, 1.5, (), ("é",), float("inf"), [0]]
"""Storage keys of the pickle: each plain kind a weights_only pickle can hold, and an unhashable list."""
SECONDS: list[Any] = [0, "0", b"0", False, 0.0]
"""The second tensor's key: some equal (as dict keys) to a first key of another type."""
SIZE = 4

LOADER = r"""
import json, math, sys, torch
out = []
for path in sys.argv[1:]:
    try:
        d = torch.load(path, weights_only=True)
        out.append({k: [math.isnan(v) for v in t.tolist()].index(True) for k, t in d.items()})
    except Exception:
        out.append("refuses")
print(json.dumps(out))
"""


def _file(path: Path, keys: list[Any], protocol: int) -> Path:
    """Tensors a, b on storages keyed ``keys``; the record of each key's str (and a decoy ``data/0``) holds
    one NaN, at a place of its own, so the place names the record a tensor was read from."""
    refs = [StorageRef(key=key, numel=SIZE) for key in keys]
    tensors = {name: View(ref, 0, (SIZE,), (1,)) for name, ref in zip("ab", refs, strict=True)}
    names = list(dict.fromkeys(["0", *map(str, keys)]))
    records = {}
    for place, name in enumerate(names):
        values = [1.0] * SIZE
        values[place] = math.nan
        records[name] = struct.pack(f"<{SIZE}f", *values)
    return write_zip(path, torch_zip_members(pickle_with_pids(tensors, protocol), records))


def _ours(path: Path) -> Any:
    """Where check finds each tensor's NaN, or "refuses" (it cannot read the file, exit 2, or says torch
    refuses it: protocol 3 writes bytes with an opcode torch's loader does not read)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["check", "--json", str(path)])
    if code == 2:
        return "refuses"
    report = json.loads(out.getvalue())
    if not report["weights_only"]["loads"]:
        assert report["weights_only"]["cannot_tell"] is None and code == 1, report
        return "refuses"
    return {p["path"][-1]: p["first_nan"][0] for p in report["problems"] if p["kind"] == "nan"}


def test_non_str_keys_read_the_record_torch_reads(tmp_path: Path) -> None:
    cases = []
    for protocol in (2, 3):
        for first in KEYS:
            for second in [first, *SECONDS]:
                cases.append(_file(tmp_path / f"k{len(cases)}.pth", [first, second], protocol))
    done = subprocess.run([sys.executable, "-c", LOADER, *map(str, cases)], capture_output=True, text=True, check=True)
    expected = json.loads(done.stdout)
    for path, theirs in zip(cases, expected, strict=True):
        assert _ours(path) == theirs, path
    # each kind is read (but the list key and protocol 3's bytes), and keys equal as dict keys share a storage
    assert sum(theirs == "refuses" for theirs in expected) < len(expected) // 4
    assert {"a": 1, "b": 1} in expected
