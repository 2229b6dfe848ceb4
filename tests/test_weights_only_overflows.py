"""Sizes whose products overflow in torch's arithmetic, though the element count is 0, are never "loads".

Found by an adversarial pass: a legacy constructor ``torch.FloatTensor(0, 2**62, 2**62)`` (torch: "Stride
calculation overflowed") and a meta tensor of size ``(2**62, 2**62, 0)`` (torch: "integer multiplication
overflow") were called loadable. Each file here is judged by ckpt-tui and by the real torch.load.
"""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

import pytest
import torch
from builders import torch_loads

from ckpt_tui.cli import main


def _text(s: str) -> bytes:
    data = s.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def _long(n: int) -> bytes:
    return b"\x8a\x09" + n.to_bytes(9, "little", signed=True)


def _zip(path: Path, pickled: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickled)
        archive.writestr("archive/byteorder", b"little")
        archive.writestr("archive/version", b"3\n")
    return path


def _legacy(sizes: list[int]) -> bytes:
    return b"\x80\x02}" + _text("x") + b"ctorch\nFloatTensor\n(" + b"".join(map(_long, sizes)) + b"tRs."


def _meta(sizes: list[int]) -> bytes:
    ones = b"(" + b"K\x01" * len(sizes) + b"t"
    return (
        b"\x80\x02}" + _text("x") + b"ctorch._utils\n_rebuild_meta_tensor_no_storage\n(ctorch\nfloat32\n"
        b"(" + b"".join(map(_long, sizes)) + b"t" + ones + b"\x89tRs."
    )


CASES = [
    ("legacy", [0, 2**62, 2**62]),
    ("legacy", [0, 2**62, 2]),
    ("legacy", [2**62, 2**62, 0]),
    ("legacy", [1, 0, 2**62, 2**62]),
    ("meta", [2**62, 2**62, 0]),
    ("meta", [2**32, 2**32, 0]),
    ("meta", [2**31, 2**31, 2**31, 0]),
    ("meta", [0, 2**62, 2**62]),
]


@pytest.mark.parametrize(("form", "sizes"), CASES)
def test_overflowing_sizes_are_never_called_loadable_where_torch_refuses(
    tmp_path: Path, form: str, sizes: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    path = _zip(tmp_path / "sizes.pth", (_legacy if form == "legacy" else _meta)(sizes))
    code = main(["check", "--json", str(path)])
    answer = json.loads(capsys.readouterr().out)["weights_only"]["answer"]
    assert code == (0 if answer == "loads" else 1)
    if not torch_loads(path):
        assert answer != "loads", (form, sizes)
    else:
        assert answer in ("loads", "cannot_tell"), (form, sizes)


def _legacy_set(tmp_path: Path) -> Path:
    """``torch.FloatTensor([1.0])`` then BUILD with a storage holding NaN and Inf: torch.load gives
    ``tensor([nan, inf, 3., 4.])`` (found by an adversarial pass: check called it clean, 0 tensors)."""
    pid = b"(" + _text("storage") + b"ctorch\nFloatStorage\n" + _text("0") + _text("cpu") + b"K\x04tQ"
    pickled = b"\x80\x02}" + _text("w") + b"ctorch\nFloatTensor\n(]G" + struct.pack(">d", 1.0) + b"atR(" + pid + b"tbs."
    path = tmp_path / "legacy_ctor_set.pth"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickled)
        archive.writestr("archive/byteorder", b"little")
        archive.writestr("archive/data/0", struct.pack("<4f", float("nan"), float("inf"), 3, 4))
        archive.writestr("archive/version", b"3\n")
    return path


def test_a_tensor_made_by_a_legacy_constructor_is_never_checked_clean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _legacy_set(tmp_path)
    loaded = torch.load(path, weights_only=True)["w"]
    assert torch.isnan(loaded).any()  # what the check must not call clean
    assert main(["check", "--json", str(path)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [p["kind"] for p in report["problems"]] == ["unread-tensor"]
    assert "torch.FloatTensor" in report["problems"][0]["message"]
