"""Files checked together (``check rank0.pt rank1.pt``) get every file's verdict, not the first one's:
torch.load reads each on its own, so the set "loads" only when every file does, and ``check`` exits 1 when
torch refuses any of them. Generated rank sets, judged against the real ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import random
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
