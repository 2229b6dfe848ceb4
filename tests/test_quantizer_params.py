"""A quantized tensor's quantizer parameters judged as torch.load judges them (``_rebuild_qtensor``, then
``torch._empty_per_channel_affine_quantized`` / ``_empty_affine_quantized``): scales of two dimensions or of
integers, an axis out of range, as many scales as channels, a zero point of the wrong type. Each file is the real
``torch.save`` of a quantized tensor with one rebuild argument edited; the oracle is the real torch.load (was
"loads", exit 0, for scales torch refuses)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_weights_only import Rebuilt, checked_answer, torch_answer


def _per_channel(**changed: Any) -> Any:
    torch.manual_seed(0)
    scales = torch.tensor([0.1, 0.2, 0.3], dtype=torch.double)
    tensor = torch.quantize_per_channel(torch.randn(3, 4), scales, torch.tensor([0, 1, 2]), 0, torch.qint8)
    func, args = tensor.__reduce_ex__(2)
    params = dict(zip(("scheme", "scales", "zero_points", "axis"), args[4], strict=True)) | changed
    return Rebuilt(func, (*args[:4], tuple(params.values()), *args[5:]))


def _per_tensor(**changed: Any) -> Any:
    torch.manual_seed(0)
    tensor = torch.quantize_per_tensor(torch.randn(3, 4), 0.05, 3, torch.quint8)
    func, args = tensor.__reduce_ex__(2)
    params = dict(zip(("scheme", "scale", "zero_point"), args[4], strict=True)) | changed
    return Rebuilt(func, (*args[:4], tuple(params.values()), *args[5:]))


CASES = {
    "per-channel as saved": _per_channel,
    "scales of two dimensions": lambda: _per_channel(scales=torch.tensor([[0.1, 0.2, 0.3]], dtype=torch.double)),
    "integer scales": lambda: _per_channel(scales=torch.tensor([1, 2, 3])),
    "float32 scales": lambda: _per_channel(scales=torch.tensor([0.1, 0.2, 0.3])),
    "zero points of two dimensions": lambda: _per_channel(zero_points=torch.tensor([[0, 1, 2]])),
    "float zero points": lambda: _per_channel(zero_points=torch.tensor([0.0, 1.0, 2.0])),
    "two scales for three channels": lambda: _per_channel(scales=torch.tensor([0.1, 0.2], dtype=torch.double)),
    "axis past the size": lambda: _per_channel(axis=2),
    "a negative axis": lambda: _per_channel(axis=-1),
    "per-tensor as saved": _per_tensor,
    "a float zero point": lambda: _per_tensor(zero_point=1.5),
    "a str scale": lambda: _per_tensor(scale="x"),
    "a negative scale": lambda: _per_tensor(scale=-1.0),
}

READ_AS_TORCH_READS = {
    "scales and zero points as lists": lambda: _per_channel(scales=[0.1, 0.2, 0.3], zero_points=[0, 1, 2]),
    "float qparams as lists": lambda: _per_channel(
        scheme=torch.per_channel_affine_float_qparams, scales=[0.1, 0.2, 0.3], zero_points=[0.0, 1.0, 2.0]
    ),
    "an int scale": lambda: _per_tensor(scale=2),
    "a bool scale": lambda: _per_tensor(scale=True),
    "a 0-d tensor scale": lambda: _per_tensor(scale=torch.tensor(0.05)),
    "a 0-d float64 scale and int8 zero point": lambda: _per_tensor(
        scale=torch.tensor(0.05, dtype=torch.double), zero_point=torch.tensor(3, dtype=torch.int8)
    ),
    "a 0-d int tensor scale": lambda: _per_tensor(scale=torch.tensor(2)),
}
"""Forms torch's ``_rebuild_qtensor`` takes and converts (ckpt-tui called them a corrupt pickle, exit 2)."""

REFUSED_FORMS = {
    "scales as a list, zero points as a tensor": lambda: _per_channel(scales=[0.1, 0.2, 0.3]),
    "a 1-element scale tensor": lambda: _per_tensor(scale=torch.tensor([0.05])),
    "a 0-d float zero point": lambda: _per_tensor(zero_point=torch.tensor(3.0)),
    "a 0-d bool zero point": lambda: _per_tensor(zero_point=torch.tensor(True)),
    "a 0-d scale that requires grad": lambda: _per_tensor(scale=torch.tensor(0.05, requires_grad=True)),
}
CASES |= READ_AS_TORCH_READS | REFUSED_FORMS


@pytest.mark.parametrize("name", list(CASES))
def test_quantizer_parameters_are_judged_as_torch_judges_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    path = tmp_path / "q.pth"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save({"w": CASES[name]()}, path)
    assert checked_answer(path, capsys) == torch_answer(path), name


@pytest.mark.parametrize("name", list(READ_AS_TORCH_READS))
def test_quantizer_forms_torch_converts_are_read_and_written_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    from ckpt_tui.cli import main

    path, out = tmp_path / "q.pth", tmp_path / "out.pth"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save({"w": READ_AS_TORCH_READS[name]()}, path)
        loaded = torch.load(path, weights_only=True)["w"]
    assert main(["check", str(path)]) == 0, name
    assert main(["convert", str(path), "--output", str(out)]) == 0, name
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        written = torch.load(out, weights_only=True)["w"]
    assert written.qscheme() == loaded.qscheme() and torch.equal(written.dequantize(), loaded.dequantize())
