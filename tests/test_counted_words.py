"""A count a reader or an operation says is singular for one: "DCP, 1 rank", "1 shard", "1 param (model)", never
"1 ranks". Every such count goes through ``counted`` (or ``plural``), and a scan of the source holds it to that."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from test_distributed import run

from ckpt_tui.core.model.describe import counted, plural

CORE = Path(__file__).parent.parent / "ckpt_tui" / "core"
NOUNS = (
    "ranks|files|shards|tensors|keys|elements|layers|dimensions|members|offsets|checkpoints|bytes|entries|prefixes"
    "|values|records|rules|groups|pieces|chunks|params|parameters"
)
COUNT = re.compile(r"(?<![/{])\{([^{}]+)\} (" + NOUNS + r")\b")
"""A number put in a text before a plural noun (``{len(names)} files``); a ratio (``{a}/{b} keys``) is left alone."""
CONSTANT = re.compile(r"[A-Z][A-Z0-9_]*( >> \d+)?(:,)?")
"""A module constant, never one (``{MAX_DEPTH} levels``); a joined text (``{'/'.join(kinds)} values``) is no count."""


def test_plural_spells_the_nouns_said() -> None:
    assert [counted(1, "rank"), counted(2, "rank"), counted(0, "key")] == ["1 rank", "2 ranks", "0 keys"]
    assert [plural(2, "entry"), plural(3, "prefix"), plural(1, "entry"), plural(2, "array")] == [
        "entries",
        "prefixes",
        "entry",
        "arrays",
    ]


def test_no_reader_or_operation_writes_a_count_before_a_plural_noun_by_hand() -> None:
    found = []
    for folder in ("readers", "operations"):
        for path in sorted((CORE / folder).glob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                found += [
                    f"{path.name}:{number}: {line.strip()}"
                    for match in COUNT.finditer(line)
                    if not CONSTANT.fullmatch(match.group(1)) and ".join(" not in match.group(1)
                ]
    assert found == [], "\n".join(found)


def test_a_dcp_save_of_one_process_is_one_rank(tmp_path: Path, capsys: Any) -> None:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (saved in one process, without a process group)
        dcp.save({"w": torch.ones(2, 3)}, checkpoint_id=str(tmp_path / "dcp"))
    code, out, _ = run(capsys, "info", str(tmp_path / "dcp"), "--depth", "0")
    assert code == 0 and "  layout      DCP, 1 rank\n" in out, out


def test_one_shard_and_one_parameter_are_said_singular(tmp_path: Path, capsys: Any) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    save_file({"w": torch.ones(1)}, str(folder / "model-00001-of-00001.safetensors"))
    index = '{"metadata": {}, "weight_map": {"w": "model-00001-of-00001.safetensors"}}'
    (folder / "model.safetensors.index.json").write_text(index)
    code, out, _ = run(capsys, "info", str(folder))
    assert code == 0, out
    assert "note        1 shard: model-00001-of-00001.safetensors" in out
    assert "  elements    1 param (model)\n" in out


def test_save_pretrained_shard_names_fold_into_their_brace_expansion_only_when_they_run_in_order() -> None:
    from ckpt_tui.core.model.describe import folded_names

    nine = [f"model-{i:05d}-of-00009.safetensors" for i in range(1, 10)]
    assert folded_names(nine) == "model-{00001..00009}-of-00009.safetensors"
    # what the fold says, bash expands back to the very names
    import subprocess

    said = subprocess.run(["bash", "-c", "echo " + folded_names(nine)], capture_output=True, text=True).stdout
    assert said.split() == nine
    assert folded_names(nine[:2]) == ", ".join(nine[:2])  # (two read as well whole)
    assert folded_names([nine[0], nine[2], nine[1]]) == ", ".join([nine[0], nine[2], nine[1]])
    assert folded_names(nine[1:]) == ", ".join(nine[1:])  # (one missing: each named)
    mixed = [*nine[:8], "pytorch_model-00009-of-00009.bin"]
    assert folded_names(mixed) == ", ".join(mixed)
