"""BUILD on a ``Parameter``: torch's weights_only loader runs ``Tensor.__setstate__`` with the state, a 3-tuple
``(requires_grad, _, hooks)`` or a 5-tuple ``(data, _, hooks, requires_grad, _)`` whose ``data`` replaces the
parameter's values. Generated states are judged against the real ``torch.load(weights_only=True)`` in a
subprocess: ``check --json`` reads the values torch loads (the NaN's place names the record), or refuses.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import struct
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from builders_readers import StorageRef, View, pickle_with_pids, torch_zip_members, write_zip

from ckpt_tui.cli import main

LOADER = r"""
import json, math, sys, torch
out = []
for path in sys.argv[1:]:
    try:
        p = torch.load(path, weights_only=True)["p"]
        assert type(p) is torch.nn.Parameter
        nan = [i for i, v in enumerate(p.tolist()) if isinstance(v, float) and math.isnan(v)]
        out.append(nan[:1] or None)
    except Exception:
        out.append("refuses")
print(json.dumps(out))
"""


class BuiltParameter:
    """``_rebuild_parameter(view, False, OrderedDict())`` followed by BUILD with ``state``."""

    def __init__(self, view: View, state: Any) -> None:
        self.view, self.state = view, state

    def __reduce__(self) -> tuple[Any, ...]:
        return torch._utils._rebuild_parameter, (self.view, False, OrderedDict()), self.state


def _view(key: str, dtype: Any = torch.FloatStorage) -> View:
    return View(StorageRef(key=key, numel=3, storage_type=dtype), 0, (3,), (1,))


STATES: list[Any] = [
    (True, None, OrderedDict()),
    (False, None, None),
    (1, None, OrderedDict()),
    (_view("1"), None, OrderedDict(), False, None),
    (_view("1"), None, OrderedDict(), True, None),
    (_view("2", torch.DoubleStorage), None, None, True, None),
    (_view("3", torch.IntStorage), None, None, False, None),
    (_view("3", torch.IntStorage), None, None, True, None),
    (_view("1"), None, OrderedDict()),
    (True, None, OrderedDict(), False),
    (None, None, OrderedDict(), None, None),
    [True, None, OrderedDict()],
]


def _file(path: Path, state: Any) -> Path:
    records = {}
    for place, (key, fmt) in enumerate([("0", "f"), ("1", "f"), ("2", "d"), ("3", "i")]):
        values = [1, 1, 1]
        values[place % 3] = math.nan if fmt != "i" else 0
        records[key] = struct.pack(f"<3{fmt}", *values)
    data = pickle_with_pids({"p": BuiltParameter(_view("0"), state)})
    return write_zip(path, torch_zip_members(data, records))


def _ours(path: Path) -> Any:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["check", "--json", str(path)])
    report = json.loads(out.getvalue()) if code != 2 else None
    if report is None or not report["weights_only"]["loads"]:
        return "refuses"
    return report


def test_build_on_parameter_as_torch(tmp_path: Path) -> None:
    paths = [_file(tmp_path / f"b{i}.pth", state) for i, state in enumerate(STATES)]
    done = subprocess.run([sys.executable, "-c", LOADER, *map(str, paths)], capture_output=True, text=True, check=True)
    loaded = 0
    for path, theirs in zip(paths, json.loads(done.stdout), strict=True):
        ours = _ours(path)
        if theirs == "refuses":
            assert ours == "refuses", path
            continue
        assert ours != "refuses", (path, theirs)
        nan = [p["first_nan"] for p in ours["problems"] if p["kind"] == "nan"]
        assert (nan[0] if nan else None) == theirs, path
        loaded += 1
    assert loaded == 7
