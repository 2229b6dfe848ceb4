"""``check --json`` prints one JSON document for every input its reader refuses (a file, a folder, a path that is
not there), so that a script parsing stdout never gets nothing; the one-line error still goes to stderr, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ckpt_tui.cli import main


def _lying_index(folder: Path) -> Path:
    # the index maps 'b' to a shard file that is not there: the reader refuses the set (as from_pretrained does)
    folder.mkdir()
    save_file({"a": torch.ones(2)}, folder / "model-1.safetensors")
    weight_map = {"a": "model-1.safetensors", "b": "model-2.safetensors"}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


@pytest.mark.parametrize("given", ["folder", "index", "missing", "truncated"])
def test_every_refusal_prints_one_json_document(tmp_path: Path, capsys: pytest.CaptureFixture[str], given: str) -> None:
    if given in ("folder", "index"):
        folder = _lying_index(tmp_path / "set")
        target = folder if given == "folder" else folder / "model.safetensors.index.json"
    elif given == "missing":
        target = tmp_path / "nothing.pth"
    else:
        target = tmp_path / "cut.pth"
        torch.save({"w": torch.ones(64)}, target)
        target.write_bytes(target.read_bytes()[:200])
    assert main(["check", "--json", str(target)]) == 2
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert document["readable"] is False and document["path"] == str(target) and document["error"]
    assert document["weights_only"] is None or document["weights_only"]["answer"] != "loads"
    assert captured.err.strip().count("\n") == 0 and captured.err.startswith("ckpt-tui: ")
