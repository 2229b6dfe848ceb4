"""A legacy file's storage bytes are little-endian whatever its ``sys_info`` says: torch writes and reads them so
(it swaps only on a big-endian host) and ``_legacy_load`` never reads ``little_endian`` or ``type_sizes``.
A file saved on s390x says ``little_endian: False``; ckpt-tui shows, checks and converts the values torch loads.
Generated files, judged against the real ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import io
import pickle
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_readers import LEGACY_MAGIC
from value_oracle import disagreements, seen

from ckpt_tui.cli import main

SYS_INFOS: list[Any] = [
    {"protocol_version": 1001, "little_endian": False, "type_sizes": {"short": 2, "int": 4, "long": 4}},
    {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 8}},
    {"protocol_version": 1001, "little_endian": 0, "type_sizes": {}},
    {"little_endian": "big"},
    {},
    None,
    [1, 2],
]
DTYPES = [torch.float32, torch.float64, torch.int16, torch.int32, torch.int64, torch.float16, torch.uint8]


def saved_with(sys_info: Any, tensors: dict[str, torch.Tensor]) -> bytes:
    """What ``torch.save(..., _use_new_zipfile_serialization=False)`` writes, with ``sys_info`` in its place."""
    buffer = io.BytesIO()
    torch.save(tensors, buffer, _use_new_zipfile_serialization=False)
    raw = buffer.getvalue()
    heads = [pickle.dumps(LEGACY_MAGIC, 2), pickle.dumps(1001, 2)]
    unpickler = io.BytesIO(raw)
    for _ in range(3):
        pickle.load(unpickler)
    rest = raw[unpickler.tell() :]
    return b"".join(heads) + pickle.dumps(sys_info, 2) + rest


def test_generated_sys_infos_never_change_the_values(tmp_path: Path) -> None:
    rng = random.Random(6)
    failures = []
    for index in range(60):
        tensors = {
            f"t{n}": (torch.randn(rng.randint(1, 6), generator=torch.Generator().manual_seed(index * 7 + n)) * 100).to(
                rng.choice(DTYPES)
            )
            for n in range(rng.randint(1, 3))
        }
        path = tmp_path / f"lg{index}.pth"
        path.write_bytes(saved_with(SYS_INFOS[index % len(SYS_INFOS)], tensors))
        found = disagreements(path)
        if found:
            failures.append(f"{path.name} ({SYS_INFOS[index % len(SYS_INFOS)]}): {found}")
    assert not failures, "\n".join(failures[:5])


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_convert_of_a_big_endian_host_file_writes_torchs_values(
    tmp_path: Path, suffix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "s390x.pth"
    source.write_bytes(saved_with(SYS_INFOS[0], {"w": torch.tensor([1.0, 2.0, 3.0]), "n": torch.arange(4)}))
    assert main(["stats", str(source)]) == 0
    assert "4.6006e-41" not in capsys.readouterr().out
    output = tmp_path / f"out{suffix}"
    assert main(["convert", str(source), "-o", str(output)]) == 0
    expected = torch.load(source, weights_only=True)
    if suffix == ".pth":
        written = torch.load(output, weights_only=True)
    else:
        from safetensors.torch import load_file

        written = load_file(str(output))
    assert {k: seen(v) for k, v in written.items()} == {k: seen(v) for k, v in expected.items()}
