"""Tensors torch.load builds outside the key tree (a tensor's attributes, a Parameter's state, a dict's ``_metadata``,
a tensor used as a dict key) are read by ``check`` and ``stats`` and compared by ``diff`` (adv7 R7-7)."""

from __future__ import annotations

from collections import Counter, OrderedDict
from pathlib import Path

import pytest
import torch

from ckpt_tui.cli import main


def with_nan() -> torch.Tensor:
    return torch.tensor([1.0, float("nan")])


def attribute(value: torch.Tensor) -> dict[str, torch.Tensor]:
    t = torch.zeros(2)
    t.extra = value  # type: ignore[attr-defined]
    return {"t": t}


def parameter_attribute(value: torch.Tensor) -> dict[str, torch.Tensor]:
    p = torch.nn.Parameter(torch.zeros(2))
    p.extra = value  # type: ignore[attr-defined]
    return {"p": p}


def metadata(value: torch.Tensor) -> OrderedDict[str, torch.Tensor]:
    state = OrderedDict(w=torch.zeros(2))
    state._metadata = {"": {"version": value}}  # type: ignore[attr-defined]
    return state


def dict_key(value: torch.Tensor) -> dict[object, object]:
    return {value: 1}


def counter_key(value: torch.Tensor) -> dict[str, object]:
    found: Counter[object] = Counter()
    found[value] = 1
    return {"cnt": found}


BUILDERS = [attribute, parameter_attribute, metadata, dict_key, counter_key]


@pytest.mark.parametrize("build", BUILDERS)
def test_check_reads_a_nan_that_torch_loads_outside_the_key_tree(tmp_path: Path, capsys, build) -> None:
    path = tmp_path / "f.pth"
    torch.save(build(with_nan()), path)
    torch.load(path, weights_only=True)  # (torch loads it, NaN and all)
    assert main(["check", str(path)]) == 1
    assert "1 NaN of 2 values" in capsys.readouterr().out
    assert main(["stats", str(path)]) == 1  # (a row of its own, marked)
    assert "!! NaN" in capsys.readouterr().out
    torch.save(build(torch.tensor([1.0, 2.0])), path)
    assert main(["check", str(path)]) == 0
    assert main(["stats", str(path)]) == 0


@pytest.mark.parametrize("build", [attribute, parameter_attribute])
def test_diff_compares_the_tensors_a_tensor_carries(tmp_path: Path, capsys, build) -> None:
    torch.save(build(torch.tensor([1.0, 2.0])), tmp_path / "a.pth")
    torch.save(build(torch.tensor([1.0, 3.0])), tmp_path / "b.pth")
    assert main(["diff", str(tmp_path / "a.pth"), str(tmp_path / "b.pth")]) == 1
    assert "extra" in capsys.readouterr().out
    assert main(["diff", str(tmp_path / "a.pth"), str(tmp_path / "a.pth")]) == 0
