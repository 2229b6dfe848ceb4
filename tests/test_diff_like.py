"""``diff`` compares like with like (issue 9 §6): values by content, keys as structured paths,
and the differences a loader would notice (device tags, Parameter and requires_grad)."""

from __future__ import annotations

import argparse
import datetime
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from builders import save_cuda_tagged

from ckpt_tui.cli import main


def saved(tmp_path: Path, name: str, obj: Any) -> str:
    path = tmp_path / name
    torch.save(obj, path)
    return str(path)


def diff_json(capsys: pytest.CaptureFixture[str], a: str, b: str) -> tuple[int, dict[str, Any]]:
    code = main(["diff", a, b, "--json"])
    return code, json.loads(capsys.readouterr().out)


def every_kind_of_leaf() -> dict[str, Any]:
    shared = [1, 2.5, "x"]
    return {
        "when": datetime.datetime(2024, 5, 1, 12, 30),
        "span": datetime.timedelta(days=2),
        "slice": slice(1, 10, 2),
        "nan": float("nan"),
        "bytes": b"\x00\xff",
        "set": {3, 1, 2},
        "frozen": frozenset({"a"}),
        "tuple": (1, (2, (3,))),
        "array": np.arange(6, dtype=np.float32).reshape(2, 3),
        "scalar": np.float64(0.1),
        "args": argparse.Namespace(lr=0.1, name="run"),
        "shared": [shared, shared],
        "w": torch.arange(4.0),
        "view": torch.arange(8.0)[2:6],
    }


def test_a_file_diffed_with_itself_is_identical_whatever_it_holds(tmp_path: Path, capsys) -> None:
    path = saved(tmp_path, "a.pth", every_kind_of_leaf())
    code, report = diff_json(capsys, path, path)
    assert code == 0 and report["identical"], report


def test_two_saves_of_the_same_values_are_identical(tmp_path: Path, capsys) -> None:
    a = saved(tmp_path, "a.pth", every_kind_of_leaf())
    b = saved(tmp_path, "b.pth", every_kind_of_leaf())
    code, report = diff_json(capsys, a, b)
    assert code == 0 and report["identical"], report


@pytest.mark.parametrize(
    ("key", "other"),
    [
        ("array", np.arange(6, dtype=np.float32).reshape(3, 2)),
        ("array", np.arange(6, dtype=np.float64).reshape(2, 3)),
        ("array", np.array([0, 1, 2, 3, 4, 9], dtype=np.float32).reshape(2, 3)),
        ("scalar", np.float64(0.2)),
        ("scalar", np.float32(0.1)),
        ("when", datetime.datetime(2024, 5, 1, 12, 31)),
        ("slice", slice(1, 10, 3)),
        ("args", argparse.Namespace(lr=0.2, name="run")),
        ("set", {3, 1, 4}),
    ],
    ids=["array-shape", "array-dtype", "array-value", "np-scalar", "np-scalar-type", "datetime", "slice", "ns", "set"],
)
def test_values_are_compared_by_content(tmp_path: Path, key: str, other: Any, capsys) -> None:
    changed = every_kind_of_leaf()
    changed[key] = other
    a = saved(tmp_path, "a.pth", every_kind_of_leaf())
    b = saved(tmp_path, "b.pth", changed)
    code, report = diff_json(capsys, a, b)
    assert code == 1 and [c["key"] for c in report["other_changes"]] == [key]


def test_a_slash_in_a_key_is_not_a_level(tmp_path: Path, capsys) -> None:
    a = saved(tmp_path, "a.pth", {"a/b": torch.ones(2)})
    b = saved(tmp_path, "b.pth", {"a": {"b": torch.ones(2)}})
    code, report = diff_json(capsys, a, b)
    assert code == 1 and report["only_in_a"] and report["only_in_b"]
    assert report["only_in_a"] != report["only_in_b"]


def test_int_and_str_keys_differ(tmp_path: Path, capsys) -> None:
    a = saved(tmp_path, "a.pth", {"state": {1: torch.ones(2)}})
    b = saved(tmp_path, "b.pth", {"state": {"1": torch.ones(2)}})
    code, report = diff_json(capsys, a, b)
    assert code == 1 and report["only_in_a"] == ['ckpt["state"][1]'] and report["only_in_b"] == ["state/1"]


def test_a_device_tag_difference_is_reported(tmp_path: Path, capsys) -> None:
    state = OrderedDict(w=torch.arange(4.0))
    a = saved(tmp_path, "a.pth", state)
    b = str(save_cuda_tagged(state, tmp_path / "b.pth"))
    code, report = diff_json(capsys, a, b)
    assert code == 1
    assert report["other_changes"] == [{"key": "w", "a": "saved on cpu", "b": "saved on cuda:0"}]


def test_parameter_and_requires_grad_differences_are_reported(tmp_path: Path, capsys) -> None:
    a = saved(tmp_path, "a.pth", {"w": torch.nn.Parameter(torch.ones(2)), "v": torch.ones(2)})
    b = saved(tmp_path, "b.pth", {"w": torch.ones(2), "v": torch.ones(2).requires_grad_()})
    code, report = diff_json(capsys, a, b)
    assert code == 1
    changes = {c["key"]: (c["a"], c["b"]) for c in report["other_changes"]}
    assert changes == {
        "w": ("Parameter(requires_grad=True)", "Tensor(requires_grad=False)"),
        "v": ("Tensor(requires_grad=False)", "Tensor(requires_grad=True)"),
    }


def test_a_parameter_against_a_safetensors_file_which_cannot_record_one_is_no_difference(
    tmp_path: Path, capsys
) -> None:
    # safetensors holds bare tensors: every tensor reads back as a plain one, so Parameter-ness is no difference there
    from safetensors.torch import save_file

    a = saved(tmp_path, "a.pth", {"w": torch.nn.Parameter(torch.ones(2)), "v": torch.ones(2).requires_grad_()})
    save_file({"w": torch.ones(2), "v": torch.ones(2)}, tmp_path / "b.safetensors")
    code, report = diff_json(capsys, a, str(tmp_path / "b.safetensors"))
    assert code == 0 and report["other_changes"] == []


def test_ranks_with_equal_numpy_values_agree(tmp_path: Path, capsys) -> None:
    paths = [saved(tmp_path, f"r{rank}.pth", {"w": torch.ones(2), "rng": np.arange(3)}) for rank in range(3)]
    assert main(["diff", *paths]) == 0


def test_files_holding_one_tensor_are_compared(tmp_path: Path, capsys) -> None:
    a = saved(tmp_path, "a.pth", torch.arange(4.0))
    b = saved(tmp_path, "b.pth", torch.arange(4.0) + 1)
    code, report = diff_json(capsys, a, b)
    assert code == 1 and report["value_changes"][0]["key"] == "(root)"
    assert main(["diff", a, a]) == 0
