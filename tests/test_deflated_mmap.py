"""A checkpoint whose storage records are stored deflated loads inflated with ``torch.load`` (the values ckpt-tui
shows), but ``torch.load(mmap=True)`` slices the compressed bytes out of the mapped file as the values: the
verdict says so in a note. Judged against the real ``torch.load`` in both modes.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import torch

from ckpt_tui.cli import main


@pytest.mark.parametrize("method", [zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED], ids=["deflated", "stored"])
def test_deflated_records_are_noted_for_mmap(tmp_path: Path, capsys: pytest.CaptureFixture[str], method: int) -> None:
    source = tmp_path / "plain.pth"
    torch.save({"w": torch.arange(64, dtype=torch.float32)}, source)
    path = tmp_path / "rezipped.pth"
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(path, "w", method) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    plain = torch.load(path, weights_only=True)["w"]
    mapped = torch.load(path, weights_only=True, mmap=True)["w"]
    assert torch.equal(plain, torch.arange(64, dtype=torch.float32))
    assert torch.equal(mapped, plain) == (method == zipfile.ZIP_STORED)
    assert main(["check", "--json", str(path)]) == 0
    notes = json.loads(capsys.readouterr().out)["weights_only"]["notes"]
    assert any("mmap=True" in note for note in notes) == (method == zipfile.ZIP_DEFLATED)


def test_a_deflated_shard_or_rank_file_is_noted_for_the_whole_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # one of two .bin shards is re-zipped deflated: the set's verdict, and a check of two rank files, say so
    for index, name in enumerate(["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]):
        torch.save({f"w{index}": torch.arange(64, dtype=torch.float32)}, tmp_path / name)
    shard = tmp_path / "pytorch_model-00002-of-00002.bin"
    stored = shard.read_bytes()
    source = tmp_path / "stored.bin"
    source.write_bytes(stored)
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(shard, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    source.unlink()
    weight_map = {"w0": "pytorch_model-00001-of-00002.bin", "w1": "pytorch_model-00002-of-00002.bin"}
    index_path = tmp_path / "pytorch_model.bin.index.json"
    index_path.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert not torch.equal(torch.load(shard, weights_only=True, mmap=True)["w1"], torch.arange(64.0))
    for target in ([str(index_path)], [str(tmp_path / name) for name in weight_map.values()]):
        main(["check", "--json", *target])
        notes = json.loads(capsys.readouterr().out)["weights_only"]["notes"]
        assert any("mmap=True" in note for note in notes), (target, notes)
