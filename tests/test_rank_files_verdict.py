"""Files checked together (``check rank0.pt rank1.pt``) get every file's verdict, not the first one's:
torch.load reads each on its own, so the set "loads" only when every file does, and ``check`` exits 1 when
torch refuses any of them. Generated rank sets, judged against the real ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import collections
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from builders import torch_loads

from ckpt_tui.cli import main


def test_every_file_given_together_has_its_say(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(15)
    state = {"w": torch.ones(2), "b": torch.zeros(2)}
    refused_sets = 0
    for index in range(12):
        folder = tmp_path / f"set{index}"
        folder.mkdir()
        paths = []
        for rank in range(rng.randint(2, 3)):
            saved: dict[str, object] = {"model": state, "epoch": 1}
            if rng.random() < 0.3:
                saved["rng"] = np.arange(4)  # training code saves RNG state as numpy arrays
            path = folder / f"rank{rank}.pt"
            torch.save(saved, path)
            paths.append(path)
        every = all(torch_loads(p) for p in paths)
        refused_sets += not every
        code = main(["check", "--json", *map(str, paths)])
        report = json.loads(capsys.readouterr().out)
        assert (report["weights_only"]["answer"] == "loads") == every, (index, report["weights_only"])
        assert code == (0 if every else 1), (index, report["problems"])
    assert refused_sets >= 3


# ---- torch's own DTensor classes: refused in a fresh process, loaded after `import torch.distributed.tensor`

FIXTURES = Path(__file__).parent / "fixtures" / "torch_distributed"
LOADS_IN_A_FRESH_PROCESS = """
import sys, torch
if sys.argv[2]:
    __import__(sys.argv[2])
try:
    torch.load(sys.argv[1], weights_only=True)
except Exception as exc:
    print("refused:", exc)
else:
    print("loads")
"""


def _fresh_load(path: Path, module: str = "") -> str:
    """``torch.load(path, weights_only=True)`` in a fresh process (this one may have imported anything), after
    importing ``module`` if given: ``loads`` or ``refused: ...``."""
    done = subprocess.run(
        [sys.executable, "-c", LOADS_IN_A_FRESH_PROCESS, str(path), module],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return done.stdout.strip()


@pytest.mark.parametrize("rank", [0, 1])
def test_fsdp2_rank_files_are_refused_fresh_and_load_after_the_import_torch_names(
    rank: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # written by real FSDP2 (fully_shard on gloo, 2 ranks): scripts/make_torch_distributed_fixtures.py
    path = tmp_path / f"model_rank{rank}.pt"
    shutil.copy(FIXTURES / "dtensor" / path.name, path)  # alone: the verdict is this file's
    assert _fresh_load(path).startswith("refused:")
    assert _fresh_load(path, "torch.distributed.tensor") == "loads"
    assert main(["check", "--json", str(path)]) == 1
    judged = json.loads(capsys.readouterr().out)["weights_only"]
    assert judged["answer"] == "refuses" and judged["blockers"] == [] and judged["reason"] is None
    assert judged["needs_import"] == ["torch.distributed.tensor"] == judged["imports"]
    main(["check", str(path)])
    text = capsys.readouterr().out
    assert (
        "with `import torch.distributed.tensor` first (it allowlists torch's DTensor classes), torch 2.13 loads it"
        in text
    )
    assert "code " not in text and "outside the tree" not in text


def test_dtensor_rank_files_with_code_beside_still_list_the_code_and_the_import(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # torch.load of a DTensor file needs it
    import torch.distributed.tensor

    state = torch.load(FIXTURES / "dtensor" / "model_rank0.pt", weights_only=True)
    state["opt"] = collections.OrderedDict(step=np.int64(3))  # numpy: data torch refuses by default
    path = tmp_path / "rank0.pt"
    torch.save(state, path)
    assert _fresh_load(path, "torch.distributed.tensor").startswith("refused:")
    assert main(["check", str(path)]) == 1
    text = capsys.readouterr().out
    assert 'at ckpt["opt"]["step"]' in text and "and needs `import torch.distributed.tensor` first" in text
    assert "import numpy, torch, torch.distributed.tensor" in text


def test_fsdp1_sharded_tensor_blockers_name_the_keys_that_hold_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "model_rank0.pt"
    shutil.copy(FIXTURES / "fsdp1_sharded" / path.name, path)
    assert _fresh_load(path).startswith("refused:")
    assert main(["check", "--json", str(path)]) == 1
    blockers = json.loads(capsys.readouterr().out)["weights_only"]["blockers"]
    assert blockers and all(b["paths"] for b in blockers), blockers
    sharded = next(b for b in blockers if b["global"].endswith(".ShardedTensor"))
    assert ["embed.weight"] in sharded["paths"]
    # the browser offers no delete as the way out: what it saves (the tensors shown) holds no ShardedTensor
    from ckpt_tui.core.readers.open import open_checkpoint
    from ckpt_tui.core.weights_only.verdict import verdict
    from ckpt_tui.tui.widgets.summary import DELETE_KEY, Judged, verdict_line

    line = verdict_line(Judged(verdict(open_checkpoint(path))), str(path))
    assert line is not None and 'ShardedTensor at ckpt["embed.weight"]' in line[0] and DELETE_KEY not in line[0]


IMPORT_TABLE = """
import importlib, json, sys, torch
from torch._weights_only_unpickler import _get_user_allowed_globals as allowed
before = set(allowed())
importlib.import_module(sys.argv[1])
import torch.distributed.tensor as dt
wrapper = ["__torch_dispatch__" in vars(dt.DTensor), dt.DTensor.__setstate__ is torch.Tensor.__setstate__]
print(json.dumps({"added": sorted(set(allowed()) - before), "wrapper": wrapper}))
"""


@pytest.mark.parametrize("module", ["torch.distributed.tensor", "torch._dynamo"])
def test_the_import_table_is_what_torchs_imports_allowlist(module: str) -> None:
    from ckpt_tui.core.weights_only import tables

    # each in a fresh process: importing torch._dynamo imports torch.distributed.tensor too
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_TABLE, module], capture_output=True, text=True, timeout=300, check=True
    )
    found = json.loads(done.stdout)
    assert found["wrapper"] == [True, True]  # DTensor: a wrapper subclass whose state is set as a Tensor's
    assert set(tables.IMPORT_ALLOWS[module]) <= set(found["added"])
    others = set().union(*(names for m, names in tables.IMPORT_ALLOWS.items() if m != module))
    assert set(found["added"]) <= tables.IMPORT_ALLOWS[module] | others
