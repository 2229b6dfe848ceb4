"""Safetensors headers up to the library's 100 MB open in bounded memory: under a 1.5 GB address-space cap
a big header opens (never a segfault or a MemoryError traceback), one too dense for the memory left is one
line, and one past the limit is one line."""

from __future__ import annotations

import resource
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_tui.cli import main
from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.readers import safetensors_file
from ckpt_tui.core.readers.open import open_checkpoint

CAP = 3 << 29  # 1.5 GiB of address space


def write_header(path: Path, megabytes: float, dense: bool = False) -> int:
    """A safetensors file whose header is about ``megabytes`` long: one float per tensor under long names,
    or (``dense``) empty tensors under the shortest names, the most entries 100 MB can hold. Its tensors."""
    if dense:
        entry = '"{:x}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}'
        count = int(megabytes * 1e6 / 57)
        parts = [entry.format(i) for i in range(count)]
        data = b""
    else:
        entry = '"model.layers.{0}.weight_with_a_long_name":{{"dtype":"F32","shape":[1],"data_offsets":[{1},{2}]}}'
        count = int(megabytes * 1e6 / 106)
        parts = [entry.format(i, 4 * i, 4 * i + 4) for i in range(count)]
        data = bytes(4 * count)
    header = ("{" + ",".join(parts) + "}").encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return count


def capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


def run_capped(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tui", *args], capture_output=True, text=True, timeout=600, preexec_fn=capped
    )


@pytest.mark.parametrize("megabytes", [40, pytest.param(89, marks=pytest.mark.slow)])
def test_a_big_header_opens_under_a_1_5_gb_cap(tmp_path: Path, megabytes: int) -> None:
    count = write_header(tmp_path / "big.safetensors", megabytes)
    result = run_capped("info", str(tmp_path / "big.safetensors"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"{count - 40} more entries" in result.stdout


def test_the_densest_header_is_read_or_refused_in_one_line_under_the_cap(tmp_path: Path) -> None:
    write_header(tmp_path / "dense.safetensors", 99, dense=True)
    result = run_capped("info", str(tmp_path / "dense.safetensors"))
    assert result.returncode in (0, 2), result.stderr[-2000:]  # never killed by a signal
    if result.returncode == 2:
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
        assert "tensors; reading them needs about" in result.stderr


def test_a_header_too_big_for_the_memory_left_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_header(tmp_path / "dense.safetensors", 2, dense=True)
    monkeypatch.setattr(safetensors_file.process, "memory_room", lambda: 10 << 20)
    with pytest.raises(ReadError, match=r"lists 35,087 tensors; reading them needs about .* more than the 10\.5 MB"):
        open_checkpoint(tmp_path / "dense.safetensors")


def test_with_little_room_json_parses_and_not_orjson(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    count = write_header(tmp_path / "st.safetensors", 1)
    monkeypatch.setattr(safetensors_file.process, "memory_room", lambda: 20 << 20)
    monkeypatch.setattr(safetensors_file, "_fast_header", lambda raw: pytest.fail("orjson with too little room"))
    assert len(open_checkpoint(tmp_path / "st.safetensors").root) == count


def test_a_header_past_the_library_limit_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "long.safetensors"
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", 100_000_001) + b"{")
        file.truncate(100_000_200)  # sparse: nothing is written past the first bytes
    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "over the safetensors library's limit of 100,000,000 bytes" in err, err
