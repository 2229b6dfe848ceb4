"""Fuzzing: mutated checkpoints either read or raise CkptError; never another exception, never a hang.

The normal run tries a few dozen cases per format; ``pytest --long tests/test_fuzz.py`` runs thousands.
"""

from __future__ import annotations

import os
import struct
from collections import OrderedDict
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from builders import training_checkpoint, write_safetensors
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpt_tui.core.errors import CkptError
from ckpt_tui.core.operations.check import check_checkpoint
from ckpt_tui.core.operations.info import summarize
from ckpt_tui.core.readers.open import open_checkpoint

FORMATS = ("zip", "legacy", "safetensors", "pickle", "torchscript")


def exercise(path: Path) -> None:
    """Everything a user can do to a file without writing: open, summarize, stats on every tensor."""
    try:
        checkpoint = open_checkpoint(path)
        summary = summarize(checkpoint)
        summary.to_json()
        check_checkpoint(checkpoint)
    except CkptError:
        pass


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    folder = tmp_path_factory.mktemp("seeds")
    torch.manual_seed(0)
    small = OrderedDict(("module.a", torch.randn(4, 4)) for _ in range(1))
    small["module.b"] = torch.randn(4, 4)  # same size: record swaps keep the layout
    small["module.c"] = torch.randn(4, 4).to(torch.bfloat16)
    ckpt = training_checkpoint()
    torch.save(ckpt, folder / "zip.pth")
    torch.save(ckpt, folder / "legacy.pth", _use_new_zipfile_serialization=False)
    write_safetensors({k: v.contiguous() for k, v in small.items()}, folder / "st.safetensors")
    (folder / "plain.pkl").write_bytes(__import__("pickle").dumps({"epoch": 1, "names": ["a"] * 3}, protocol=2))
    torch.save(small, folder / "swap.pth")
    script = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)))
    script.save(str(folder / "script.pt"))
    return {
        "torchscript": (folder / "script.pt").read_bytes(),
        "zip": (folder / "zip.pth").read_bytes(),
        "legacy": (folder / "legacy.pth").read_bytes(),
        "safetensors": (folder / "st.safetensors").read_bytes(),
        "pickle": (folder / "plain.pkl").read_bytes(),
        "swap": (folder / "swap.pth").read_bytes(),
    }


def flip(data: bytes, positions: list[int], bits: list[int]) -> bytes:
    out = bytearray(data)
    for position, bit in zip(positions, bits, strict=False):
        out[position % len(out)] ^= 1 << bit
    return bytes(out)


def fuzz_settings(examples: int) -> settings:
    long = os.environ.get("CKPT_TUI_LONG_FUZZ") == "1"
    return settings(
        max_examples=examples * 100 if long else examples,
        deadline=timedelta(seconds=10),
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        derandomize=not long,
    )


@pytest.mark.parametrize("kind", FORMATS)
@fuzz_settings(40)
@given(
    positions=st.lists(st.integers(min_value=0, max_value=2**31), min_size=1, max_size=8),
    bits=st.lists(st.integers(min_value=0, max_value=7), min_size=1, max_size=8),
)
def test_bit_flips(tmp_path: Path, seeds: dict[str, bytes], kind: str, positions: list[int], bits: list[int]) -> None:
    path = tmp_path / f"flip.{kind}"
    path.write_bytes(flip(seeds[kind], positions, bits))
    exercise(path)


@pytest.mark.parametrize("kind", FORMATS)
@fuzz_settings(25)
@given(cut=st.floats(min_value=0.0, max_value=1.0), junk=st.binary(max_size=64))
def test_truncation_and_overwrite(tmp_path: Path, seeds: dict[str, bytes], kind: str, cut: float, junk: bytes) -> None:
    data = seeds[kind]
    at = int(cut * len(data))
    path = tmp_path / f"cut.{kind}"
    path.write_bytes(data[:at])
    exercise(path)
    path.write_bytes(data[:at] + junk + data[at + len(junk) :])
    exercise(path)


@fuzz_settings(20)
@given(first=st.integers(min_value=0, max_value=2), second=st.integers(min_value=0, max_value=2))
def test_record_swaps(tmp_path: Path, seeds: dict[str, bytes], first: int, second: int) -> None:
    data = bytearray(seeds["swap"])
    starts = [data.find(f"swap/data/{i}".encode()) for i in range(3)]
    records = []
    for start in starts:
        header = start - 30
        name_len, extra_len = struct.unpack_from("<2H", data, header + 26)
        begin = header + 30 + name_len + extra_len
        records.append((begin, begin + 64))
    (a0, a1), (b0, b1) = records[first], records[second]
    data[a0:a1], data[b0:b1] = data[b0:b1], data[a0:a1]
    path = tmp_path / "swapped.pth"
    path.write_bytes(bytes(data))
    exercise(path)


def structural_offsets(data: bytes) -> list[int]:
    """Every zip signature position (local headers, central entries, end records) and the bytes around it."""
    offsets: set[int] = set()
    for signature in (b"PK\x03\x04", b"PK\x01\x02", b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07"):
        at = data.find(signature)
        while at >= 0:
            offsets.update({at - 1, at, at + 4, at + 30})
            at = data.find(signature, at + 1)
    return sorted(o for o in offsets if 0 < o < len(data))


@pytest.mark.parametrize("kind", ["zip", "swap"])
def test_truncation_at_every_structural_boundary(tmp_path: Path, seeds: dict[str, bytes], kind: str) -> None:
    data = seeds[kind]
    path = tmp_path / "boundary.pth"
    for offset in structural_offsets(data):
        path.write_bytes(data[:offset])
        exercise(path)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
entry_values = st.fixed_dictionaries(
    {},
    optional={
        "dtype": st.sampled_from(["F32", "U8", "BF16", "F4", "F8_E4M3", "X"]) | json_values,
        "shape": st.lists(st.integers(min_value=-2, max_value=2**65), max_size=3) | json_values,
        "data_offsets": st.lists(st.integers(min_value=-2, max_value=40), max_size=3) | json_values,
    },
)


@fuzz_settings(60)
@given(
    header=st.dictionaries(st.text(max_size=6) | st.just("__metadata__"), entry_values | json_values, max_size=4),
    data=st.binary(max_size=40),
    pad=st.sampled_from(["", " ", "\n", "\x00", "\ufeff"]),
)
def test_safetensors_header_grammar(tmp_path: Path, header: dict, data: bytes, pad: str) -> None:
    """Random JSON in every header field: the reader gives a checkpoint or its own one-line error."""
    import json

    text = (json.dumps(header) + pad).encode("utf-8", "surrogatepass")
    path = tmp_path / "g.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    exercise(path)
