"""Small tensors whose source order differs from the output order are written right, from few reads."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch
from safetensors.torch import load_file

from ckpt_tui.cli import main


def write_unsorted(tensors: dict[str, torch.Tensor], path: Path) -> Path:
    """A valid .safetensors whose data lies in the dict's order, not the library's name order."""
    header, offset = {}, 0
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(t.numpy().tobytes() for t in tensors.values()))
    return path


def test_a_source_laid_out_in_another_order_converts_to_the_same_values(tmp_path: Path, monkeypatch) -> None:
    torch.manual_seed(0)
    state = {f"module.b.{i}": torch.randn(i % 5 + 1, 3) for i in reversed(range(300))}
    source = write_unsorted(state, tmp_path / "in.safetensors")
    reads: list[int] = []
    real_pread = os.pread

    def pread(fd: int, count: int, at: int) -> bytes:
        if os.readlink(f"/proc/self/fd/{fd}") == str(source):
            reads.append(count)
        return real_pread(fd, count, at)

    monkeypatch.setattr(os, "pread", pread)
    assert main(["convert", str(source), "--strip-prefix", "module.", "-o", str(tmp_path / "out.safetensors")]) == 0
    written = load_file(tmp_path / "out.safetensors")
    assert list(written) == sorted(k.removeprefix("module.") for k in state)
    for name, tensor in state.items():
        assert torch.equal(written[name.removeprefix("module.")], tensor)
    assert 0 < sum(reads) < 2 * sum(t.numel() * 4 for t in state.values())  # each wanted byte read about once
