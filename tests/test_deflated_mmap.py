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
