"""The byte-source seam: a local file reads through it as before, and nothing remote is imported for it."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model import byte_source as places


def test_a_local_file_reads_through_the_seam(tmp_path):
    path = tmp_path / "m.bin"
    path.write_bytes(bytes(range(256)) * 4)
    source = places.source_of(str(path))
    with places.open_stream(str(path)) as stream:
        stream.seek(10)
        assert stream.read(3) == bytes([10, 11, 12])
    assert source.size == places.size_of(str(path)) == 1024
    assert source.read_at(1020, 10) == bytes([252, 253, 254, 255])
    buffer = bytearray(4)
    assert source.readinto_at(256, buffer) == 4 and bytes(buffer) == bytes([0, 1, 2, 3])
    assert source.fetched == places.fetched_of(str(path)) == 0
    assert source.identity.startswith("1024-")
    source.close()


def test_local_places_answer_as_os_does(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(b"x")
    folder = str(tmp_path)
    assert places.is_dir(folder) and not places.is_file(folder)
    assert places.is_file(places.join(folder, "a.safetensors"))
    assert places.list_dir(folder) == ["a.safetensors"]
    assert places.parent(places.join(folder, "a.safetensors")) == folder
    assert not places.is_remote(folder) and places.is_remote("hf://org/repo")


def test_a_url_of_an_unknown_scheme_is_one_line():
    with pytest.raises(ReadError, match="no reader for ftp:// URLs"):
        places.source_of("ftp://example.org/x.pth")


def test_info_of_a_local_file_imports_nothing_remote(tmp_path):
    path = tmp_path / "m.pth"
    torch.save({"w": torch.ones(2)}, path)
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ckpt_tui", "info", str(path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")}
    remote = {"fsspec", "huggingface_hub", "requests", "s3fs", "http.client", "ckpt_tui.core.model.remote_stores"}
    assert "ckpt_tui.core.model.byte_source" in imported
    assert not imported & remote
