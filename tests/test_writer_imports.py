"""A .pth write imports no numpy (a plain copy or prefix edit never needs it); a .safetensors write may."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

CONVERT = """
import sys
from ckpt_tui.cli import main
code = main(["convert", sys.argv[1], "--strip-prefix", "module.", "-o", sys.argv[2]])
print(code, "numpy" in sys.modules)
"""


def converted(tmp_path: Path, output: str) -> str:
    torch.save({"module.w": torch.ones(3), "module.b": torch.zeros(2)}, tmp_path / "in.pth")
    command = [sys.executable, "-c", CONVERT, str(tmp_path / "in.pth"), str(tmp_path / output)]
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=120).stdout.split("\n")[-2]


def test_a_pth_convert_does_not_import_numpy(tmp_path: Path) -> None:
    assert converted(tmp_path, "out.pth") == "0 False"
    assert list(torch.load(tmp_path / "out.pth", weights_only=True)) == ["w", "b"]


def test_a_safetensors_convert_loads_its_writer_when_asked(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    assert converted(tmp_path, "out.safetensors").startswith("0 ")
    assert sorted(load_file(tmp_path / "out.safetensors")) == ["b", "w"]
