"""A cast writes the bits torch's ``.to(dtype)`` writes, NaNs included (sign, payload, quiet bit), rounding to
nearest even: a differential test against the real torch on generated bit patterns (NaNs of both signs and
many payloads, infinities, subnormals, ties), and ``convert --dtype`` end to end.

torch's CPU cast of a NaN depends on the path an element takes: the vectorised body (compared here, with the
special values away from the tensor's tail) or the scalar loop its last elements and one-element tensors take
(float64 -> bfloat16 gives 0x7FC0 there, float16 -> float32 0x7FFFFFFF): ckpt-tui writes the vectorised bits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ckpt_tui.cli import main
from ckpt_tui.core.values.casting import converted
from ckpt_tui.core.values.tensor_values import numpy_dtype

TORCH = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
BITS = {8: (np.uint64, torch.int64), 4: (np.uint32, torch.int32), 2: (np.uint16, torch.int16)}
SPECIAL = {
    8: [0x7FF0000000000001, 0xFFF0000000000001, 0x7FF8000000000000, 0xFFF8000000000000, 0x7FF4000000000000,
        0x7FF0000000000000, 0xFFF0000000000000, 0x0000000000000001, 0x3FF0000010000000, 0x3FF0001000000000],
    4: [0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7FFFFFFF, 0x7FC00000, 0xFFC00000, 0xFF89EF5C, 0x7F800000,
        0xFF800000, 0x00000001, 0x807FFFFF, 0x3F808000, 0x3F818000, 0x3F80FFFF, 0x477FF000, 0x477FE000],
    2: [0x7C01, 0xFC01, 0x7E00, 0xFE00, 0x7FFF, 0xFFFF, 0x7F81, 0xFF81, 0x7FC0, 0xFC78, 0x7C00, 0x0001, 0x8001],
}  # fmt: skip


def patterns(dtype: str, count: int = 1 << 14) -> np.ndarray:
    """Raw bit patterns of ``dtype``: the special values first (in the vectorised body), then random bits."""
    size = torch.empty(0, dtype=TORCH[dtype]).element_size()
    unsigned = BITS[size][0]
    rng = np.random.default_rng(size * 7 + len(dtype))
    random = rng.integers(0, np.iinfo(unsigned).max, count, dtype=unsigned, endpoint=True)
    return np.concatenate([np.array(SPECIAL[size], unsigned), random, np.zeros(64, unsigned)])  # (the tail: zeros)


@pytest.mark.parametrize("source", list(TORCH))
@pytest.mark.parametrize("target", ["float32", "float16", "bfloat16"])
def test_cast_bits_equal_torch(source: str, target: str) -> None:
    if source == target:
        pytest.skip("not a cast")
    raw = patterns(source)
    tensor = torch.from_numpy(raw.view(raw.dtype.str.replace("u", "i")))
    want = tensor.view(TORCH[source]).to(TORCH[target])
    out_bits = BITS[want.element_size()]
    expected = want.view(out_bits[1]).numpy().view(out_bits[0])
    got = converted(raw.view(numpy_dtype(source)), source, target, numpy_dtype(target)).view(out_bits[0])
    wrong = np.flatnonzero(got != expected)
    assert not wrong.size, [(hex(int(raw[i])), hex(int(expected[i])), hex(int(got[i]))) for i in wrong[:5]]


@pytest.mark.parametrize(("flag", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_convert_dtype_writes_the_nans_torch_writes(tmp_path: Path, flag: str, dtype: torch.dtype) -> None:
    source = torch.from_numpy(patterns("float32").view(np.int32)).view(torch.float32)
    torch.save({"w": source}, tmp_path / "in.pth")
    assert main(["convert", str(tmp_path / "in.pth"), "--dtype", flag, "-o", str(tmp_path / "out.pth")]) == 0
    written = torch.load(tmp_path / "out.pth", weights_only=True)["w"]
    assert torch.equal(written.view(torch.int16), source.to(dtype).view(torch.int16))
