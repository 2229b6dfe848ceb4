"""``ckpt-tui stats``: every statistic against torch's own (float64), on every format, and the CLI contract."""

from __future__ import annotations

import csv
import io
import json
import math
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from builders import (
    rewrite_zip,
    tiny_state_dict,
    training_checkpoint,
    write_dcp,
    write_safetensors,
    write_sharded_bin,
    write_sharded_safetensors,
    write_torchscript,
)

from ckpt_tui.cli import main
from ckpt_tui.core.conventions.layer_marks import family, marks
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.values import tensor_table
from ckpt_tui.core.values.tensor_table import COLUMNS, sort_rows, tensor_paths, tensor_rows

DEEPSPEED = Path(__file__).parent / "fixtures" / "deepspeed" / "zero2_fp32"


def reference(tensor: torch.Tensor) -> dict[str, Any]:
    """What torch computes for each column, in float64, over the finite values (NaN/Inf counted apart)."""
    x = tensor.detach().to(torch.float64).reshape(-1)
    finite = x[torch.isfinite(x)]
    some = finite.numel() > 0
    return {
        "numel": tensor.numel(),
        "min": finite.min().item() if some else None,
        "max": finite.max().item() if some else None,
        "mean": finite.mean().item() if some else None,
        "std": finite.std().item() if finite.numel() > 1 else (0.0 if some else None),
        "norm": torch.linalg.vector_norm(finite).item() if some else None,
        "absmax": finite.abs().max().item() if some else None,
        "zeros": (x == 0).sum().item() / x.numel() if x.numel() else 0.0,
        "nan": int(torch.isnan(x).sum()),
        "inf": int(torch.isinf(x).sum()),
    }


def assert_matches_torch(row: dict[str, Any], tensor: torch.Tensor) -> None:
    want = reference(tensor)
    for column, expected in want.items():
        got = row[column]
        if expected is None or isinstance(expected, int):
            assert got == expected, (row["path"], column, got, expected)
        else:
            assert math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-300), (row["path"], column, got, expected)
            assert f"{got:.6g}" == f"{expected:.6g}", (row["path"], column)  # the printed digits agree


def kinds() -> OrderedDict[str, torch.Tensor]:
    """Tensors of every kind the table must get right."""
    torch.manual_seed(0)
    special = torch.randn(7, 5)
    special[0, 0] = float("nan")
    special[1, 1] = float("inf")
    special[2, 2] = float("-inf")
    special[3, 3] = 0.0
    base = torch.randn(6, 8)
    return OrderedDict(
        {
            "f32": torch.randn(33, 17),
            "f64": torch.randn(100, dtype=torch.float64) * 1e6,
            "bf16": torch.randn(40, 3).to(torch.bfloat16),
            "fp16": (torch.randn(50) * 100).to(torch.float16),
            "special": special,
            "all_nan": torch.full((4,), float("nan")),
            "int64": torch.arange(-20, 30, dtype=torch.int64),
            "int8": torch.tensor([-128, 0, 0, 127], dtype=torch.int8),
            "uint8": torch.tensor([0, 255, 3], dtype=torch.uint8),
            "bool": torch.tensor([True, False, False, True, True]),
            "empty": torch.empty(0, 5),
            "scalar": torch.tensor(2.5),
            "one": torch.tensor([-3.0]),
            "zeros": torch.zeros(3, 3),
            "expand": torch.arange(3.0).reshape(3, 1).expand(3, 1000),
            "slice": base[1:, ::3],
            "transpose": base.t(),
            "base": base,
        }
    )


def rows_by_key(path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, dict[str, Any]]:
    code = main(["stats", str(path), "--json", *args])
    data = json.loads(capsys.readouterr().out)
    # NaN or Inf in any tensor, or a tensor torch refuses (a missing record), is a problem found: exit 1, as check
    refused = any(row["reason"] and row["reason"].startswith(("unreadable:", "record ")) for row in data["tensors"])
    assert code == (1 if data["problems"] or refused or any(row["nan"] or row["inf"] for row in data["tensors"]) else 0)
    return {"/".join(str(k) for k in row["path"]): row for row in data["tensors"]}


def test_every_statistic_matches_torch_in_float64_for_every_dtype_and_view(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tensors = kinds()
    torch.save(tensors, tmp_path / "kinds.pth")
    rows = rows_by_key(tmp_path / "kinds.pth", capsys)
    assert list(rows) == list(tensors)
    for key, tensor in tensors.items():
        assert_matches_torch(rows[key], tensor)
        assert rows[key]["shape"] == list(tensor.shape) and rows[key]["dtype"] == str(tensor.dtype).removeprefix(
            "torch."
        )
    assert rows["special"]["nan"] == 1 and rows["special"]["inf"] == 2
    assert rows["all_nan"]["min"] is None and rows["all_nan"]["nan"] == 4
    assert rows["empty"]["numel"] == 0 and rows["empty"]["norm"] is None and rows["empty"]["zeros"] == 0.0


def test_json_contract_has_every_field_and_info_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(training_checkpoint(), tmp_path / "train.pth")
    assert main(["info", "--json", str(tmp_path / "train.pth")]) == 0
    info = json.loads(capsys.readouterr().out)
    assert main(["stats", "--json", str(tmp_path / "train.pth")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == ["tensors", "problems"]
    assert [row["path"] for row in data["tensors"]] == [t["path"] for t in info["tensors"]]
    for row in data["tensors"]:
        assert list(row) == [*COLUMNS, "reason", "posinf", "neginf"]
        assert isinstance(row["zeros"], float) and 0.0 <= row["zeros"] <= 1.0


def test_at_takes_a_subtree_and_a_bad_at_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(training_checkpoint(), tmp_path / "train.pth")
    rows = rows_by_key(tmp_path / "train.pth", capsys, "--at", "model")
    assert rows and all(key.startswith("model/") for key in rows)
    assert main(["stats", str(tmp_path / "train.pth"), "--at", "no/such/key"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ckpt-tui: --at") and err.count("\n") == 1


def test_unreadable_file_and_bad_sort_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    assert main(["stats", str(tmp_path / "junk.pth")]) == 2
    assert capsys.readouterr().err.startswith("ckpt-tui: ")
    torch.save(tiny_state_dict(), tmp_path / "ok.pth")
    with pytest.raises(SystemExit) as exit_info:
        main(["stats", str(tmp_path / "ok.pth"), "--sort", "bogus"])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit):
        main(["stats", str(tmp_path / "ok.pth"), "--json", "--csv"])


def test_interrupt_prints_one_line_and_exits_130(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.save(tiny_state_dict(), tmp_path / "ok.pth")

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(tensor_table, "tensor_stats", interrupted)
    assert main(["stats", str(tmp_path / "ok.pth")]) == 130
    assert capsys.readouterr().err == "ckpt-tui: interrupted\n"


def test_each_view_of_the_same_bytes_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    weight = torch.randn(4, 4)
    torch.save({"embed.weight": weight, "lm_head.weight": weight, "other": weight[1:]}, tmp_path / "tied.pth")
    reads: list[tuple[int, ...]] = []
    real = tensor_table.tensor_stats

    def counting(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        reads.append(tensor.shape)
        return real(tensor, *args, **kwargs)

    monkeypatch.setattr(tensor_table, "tensor_stats", counting)
    checkpoint = open_checkpoint(str(tmp_path / "tied.pth"))
    rows = list(tensor_rows(tensor_paths(checkpoint.root)))
    assert len(rows) == 3 and sorted(reads) == [(3, 4), (4, 4)]
    assert rows[0].stats is rows[1].stats


def test_missing_record_and_meta_tensor_get_a_row_with_a_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.save(tiny_state_dict(), tmp_path / "full.pth")
    broken = rewrite_zip(tmp_path / "full.pth", tmp_path / "broken.pth", drop="data/2")
    rows = rows_by_key(broken, capsys)
    missing = [row for row in rows.values() if row["reason"]]
    assert len(missing) == 1 and "missing" in missing[0]["reason"] and missing[0]["norm"] is None
    torch.save({"meta": torch.empty(3, device="meta"), "real": torch.ones(2)}, tmp_path / "meta.pth")
    rows = rows_by_key(tmp_path / "meta.pth", capsys)
    assert rows["meta"]["reason"] and rows["meta"]["min"] is None and rows["real"]["norm"] == math.sqrt(2)
    assert main(["stats", str(tmp_path / "meta.pth")]) == 0
    assert "(" in capsys.readouterr().out  # the reason is shown in the text table


def state() -> OrderedDict[str, torch.Tensor]:
    torch.manual_seed(1)
    return OrderedDict({"a.weight": torch.randn(5, 4), "a.bias": torch.randn(5), "b.weight": torch.randn(3, 5) * 7})


@pytest.mark.parametrize("fmt", ["legacy", "safetensors", "sharded-safetensors", "sharded-bin", "dcp", "torchscript"])
def test_every_format_matches_torch(fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tensors = state()
    if fmt == "legacy":
        path = tmp_path / "legacy.pth"
        torch.save(tensors, path, _use_new_zipfile_serialization=False)
    elif fmt == "safetensors":
        path = write_safetensors(dict(tensors), tmp_path / "m.safetensors")
    elif fmt == "sharded-safetensors":
        path = write_sharded_safetensors(dict(tensors), tmp_path)
    elif fmt == "sharded-bin":
        path = write_sharded_bin(dict(tensors), tmp_path)
    elif fmt == "dcp":
        path = write_dcp({"model": dict(tensors)}, tmp_path / "dcp")
        tensors = OrderedDict((f"model/{k}", v) for k, v in tensors.items())
    else:
        path = write_torchscript(tmp_path / "script.pt")
        module = torch.jit.load(str(path))
        tensors = OrderedDict((k.replace(".", "/", 0), v) for k, v in module.state_dict().items())
    rows = rows_by_key(path, capsys)
    for key, tensor in tensors.items():
        match = [row for name, row in rows.items() if name.replace("/", ".").endswith(key.replace("/", "."))]
        assert match, (key, list(rows))
        assert_matches_torch(match[0], tensor)


def test_deepspeed_folder_fp32_weights_match_zero_to_fp32(capsys: pytest.CaptureFixture[str]) -> None:
    want = torch.load(DEEPSPEED / "expected_fp32.pt", weights_only=False)
    rows = rows_by_key(DEEPSPEED, capsys, "--at", "fp32_weights")
    assert len(rows) == len(want)
    for key, tensor in want.items():
        assert_matches_torch(rows[f"fp32_weights/{key}"], tensor)


def test_sort_numbers_largest_first_names_a_to_z_and_none_last(tmp_path: Path) -> None:
    tensors = {"c": torch.ones(4) * 3, "a": torch.ones(2), "b": torch.empty(0), "d": torch.ones(9)}
    torch.save(tensors, tmp_path / "s.pth")
    rows = list(tensor_rows(tensor_paths(open_checkpoint(str(tmp_path / "s.pth")).root)))
    assert [r.path[0] for r in sort_rows(rows, "norm")] == ["c", "d", "a", "b"]
    assert [r.path[0] for r in sort_rows(rows, "path")] == ["a", "b", "c", "d"]
    assert [r.path[0] for r in sort_rows(rows, "numel")] == ["d", "c", "a", "b"]


def test_csv_has_the_json_columns_and_a_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(kinds(), tmp_path / "k.pth")
    assert main(["stats", str(tmp_path / "k.pth"), "--csv", "--sort", "norm"]) == 1  # "special" holds NaN
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert list(table[0]) == [*COLUMNS, "reason", "posinf", "neginf"]
    assert table[0]["path"] == "f64"  # the largest norm first
    special = next(row for row in table if row["path"] == "special")
    assert special["nan"] == "1" and special["inf"] == "2" and special["shape"] == "7x5"


def test_text_table_fits_80_columns_and_marks_nan_norm_and_dead(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    layers = OrderedDict()
    for index in range(5):
        layers[f"layers.{index}.weight"] = torch.full((4, 4), 0.5)
    layers["layers.2.weight"] = torch.full((4, 4), 50.0)
    layers["layers.3.weight"] = torch.zeros(4, 4)
    layers["layers.4.weight"][0, 0] = float("nan")
    torch.save(layers, tmp_path / "l.pth")
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["stats", str(tmp_path / "l.pth")]) == 1  # a NaN: a problem found
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["path", "shape", "dtype"]
    assert any("layers.2.weight" in line and "!! norm" in line for line in lines)
    assert any("layers.3.weight" in line and "dead" in line for line in lines)
    assert any("layers.4.weight" in line and "!! NaN" in line for line in lines)
    assert not any("layers.0.weight" in line and ("!!" in line or "dead" in line) for line in lines)
    # a NaN: the nan and inf columns stay; a legend says what each mark shown means
    assert "nan" in out.split("layers.0.weight")[0] and "no NaN/Inf" not in out
    legend = lines[lines.index("mark:") :]
    assert [line.split()[:2] for line in legend[1:4]] == [["!!", "NaN"], ["!!", "norm"], ["dead", "all"]]


def test_a_training_checkpoints_stats_fit_80_columns_with_fewer_digits_and_no_empty_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Flatten())
    model(torch.randn(4, 3, 6, 6))  # running statistics and a counter
    state = model.state_dict()
    state["1.bias"].uniform_()  # no tensor marked
    state["2.scale"] = torch.tensor([-8.19842e-05, -1.23456e-05])  # numbers whose 6 digits take 11-12 columns
    torch.save({"model_state_dict": state}, tmp_path / "run.pth")
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["stats", str(tmp_path / "run.pth")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 80
    # a tensor's names, then its numbers: two lines each, none wrapped, then one line for NaN/Inf
    assert len(lines) == 2 + 2 * len(state) + 1 and lines[-1] == f"no NaN/Inf in the {len(state)} tensors read"
    assert lines[0] == "path  shape  dtype" and lines[1].split() == [
        "min",
        "max",
        "mean",
        "std",
        "norm",
        "absmax",
        "zeros",
    ]
    assert "-8.198e-05" in lines[lines.index("model_state_dict/2.scale  [2]  float32") + 1]
    # a wide terminal keeps every digit on one line a tensor
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["stats", str(tmp_path / "run.pth")]) == 0
    wide = capsys.readouterr().out.splitlines()
    assert len(wide) == 1 + len(state) + 1 and "-8.19842e-05" in wide[-2]


def test_wide_terminal_shows_one_line_per_tensor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.save(tiny_state_dict(), tmp_path / "t.pth")
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["stats", str(tmp_path / "t.pth")]) == 0
    lines = capsys.readouterr().out.splitlines()
    # the table, then one line for the NaN/Inf columns left out (no tensor has any); no empty mark column
    assert len(lines) == 1 + len(tiny_state_dict()) + 1
    assert "norm" in lines[0] and "conv.weight" in lines[1]
    assert lines[-1] == f"no NaN/Inf in the {len(tiny_state_dict())} tensors read"
    assert lines[0].split()[-1] == "zeros" and "nan" not in lines[0] and "mark" not in lines[0]


def test_families_replace_numbers_and_join_nested_keys() -> None:
    assert family(("model", "encoder.layers.3.attn.q.weight")) == "model.encoder.layers.*.attn.q.weight"
    assert family(("optimizer", "state", 7, "exp_avg")) == "optimizer.state.*.exp_avg"


def test_marks_leave_zero_biases_alone_when_all_siblings_are_zero(tmp_path: Path) -> None:
    tensors = {f"l.{i}.bias": torch.zeros(4) for i in range(4)}
    torch.save(tensors, tmp_path / "b.pth")
    rows = list(tensor_rows(tensor_paths(open_checkpoint(str(tmp_path / "b.pth")).root)))
    assert marks(rows) == {}


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_one_updating_line_on_a_terminal_stderr_and_is_cleared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckpt_tui.cli import render

    torch.save(tiny_state_dict(), tmp_path / "t.pth")
    monkeypatch.setattr(render.ProgressLine, "DELAY", 0.0)
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main(["stats", str(tmp_path / "t.pth"), "--json"]) == 0
    err = terminal.getvalue()
    assert "\rreading tensors: " in err and "\n" not in err and err.endswith("\r\x1b[K")
    json.loads(capsys.readouterr().out)  # stdout stays pure JSON


def test_no_progress_when_stderr_is_not_a_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(tiny_state_dict(), tmp_path / "t.pth")
    assert main(["stats", str(tmp_path / "t.pth")]) == 0
    assert capsys.readouterr().err == ""


def test_long_keys_two_line_rows_fit_80_columns_keeping_layer_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first line of a two-line row (path, shape, dtype) is shortened too: no line wraps at 80 columns."""
    name = "encoder.layer.{}.attention.self.query_projection_long_name.weight"
    state = {name.format(0): torch.ones(64, 64, 3, 3), name.format(1): torch.ones(4)}
    torch.save({"model_state_dict": state}, tmp_path / "long.pth")
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["stats", str(tmp_path / "long.pth")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 80
    rows = [line for line in lines if line.endswith("float32")]
    assert len(rows) == 2 and rows[0] != rows[1]
    assert "0.attention" in rows[0] and "1.attention" in rows[1] and all("[" in row for row in rows)
