"""``diff`` names what did not move (the answer to "did my freeze work?"), and ``diff --stats`` says a layer
moved from zero, gives cosines with the digits that show a change, and lists each layer once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from ckpt_tui.cli import main
from ckpt_tui.core.operations.reports import cosine_text


def fine_tune(tmp_path: Path) -> tuple[Path, Path]:
    """``base.pth`` and ``ft.pth``: 20 SGD steps with the first Linear frozen; the BatchNorm biases start at 0."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 32), nn.Linear(32, 10))
    torch.save(model.state_dict(), tmp_path / "base.pth")
    for parameter in model[0].parameters():
        parameter.requires_grad_(False)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    generator = torch.Generator().manual_seed(1)
    for _ in range(20):
        loss = model(torch.randn(8, 8, generator=generator)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.save(model.state_dict(), tmp_path / "ft.pth")
    return tmp_path / "base.pth", tmp_path / "ft.pth"


def test_diff_names_the_identical_tensors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, tuned = fine_tune(tmp_path)
    assert main(["diff", str(base), str(tuned)]) == 1
    out = capsys.readouterr().out
    assert "2 tensors identical" in out.splitlines()[0]
    listed = out.split("identical (bit-for-bit) (2):\n", 1)[1].splitlines()
    assert listed[:2] == ["  0.weight", "  0.bias"]
    assert main(["diff", str(base), str(tuned), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["identical_keys"] == ["0.weight", "0.bias"]


def test_many_identical_tensors_are_a_few_and_n_more(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = {f"frozen.{i}.{name}": torch.ones(2) * i for i in range(20) for name in ("weight", "scale")}
    torch.save(state, tmp_path / "a.pth")
    torch.save({**state, "frozen.0.weight": torch.zeros(2) + 5}, tmp_path / "b.pth")
    assert main(["diff", str(tmp_path / "a.pth"), str(tmp_path / "b.pth")]) == 1
    out = capsys.readouterr().out
    # folded by index, then cut: what is identical is named without a screenful of keys
    listed = out.split("identical (bit-for-bit) (39):\n", 1)[1].splitlines()
    assert len(listed) == 2 and listed[1].startswith("  frozen.{1") and listed[1].endswith("19}.weight")


def test_identical_files_list_no_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, _ = fine_tune(tmp_path)
    assert main(["diff", str(base), str(base)]) == 0
    assert "identical (bit-for-bit)" not in capsys.readouterr().out


def test_stats_says_from_0_and_cosines_show_the_change(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, tuned = fine_tune(tmp_path)
    assert main(["diff", str(base), str(tuned), "--stats"]) == 1
    out = capsys.readouterr().out
    table = out.split("per layer (", 1)[1].split("relative change by layer", 1)[0]
    bias = next(line for line in table.splitlines() if line.split()[0] == "1.bias")
    assert bias.split()[1:3] == ["from", "0"]  # BatchNorm's bias starts at 0 and moved
    frozen = next(line for line in table.splitlines() if line.split()[0] == "0.weight")
    assert frozen.split()[1:3] == ["0", "1"]
    moved = next(line for line in table.splitlines() if line.split()[0] == "3.weight")
    assert moved.split()[2] != "1" and float(moved.split()[2]) < 1
    most = out.split("moved most (", 1)[1].split("\n", 1)[1].split("moved least", 1)[0]
    least = out.split("moved least (", 1)[1].split("\n", 1)[1].split("buffers and counters", 1)[0]
    most_keys = {line.split(":")[0].strip() for line in most.splitlines()}
    least_keys = {line.split(":")[0].strip() for line in least.splitlines()}
    assert most_keys and least_keys and not most_keys & least_keys


@pytest.mark.parametrize(
    ("cosine", "shown"),
    [(1.0, "1"), (0.999647, "0.99965"), (0.964498, "0.9645"), (0.5, "0.5000"), (1 - 3.5e-12, "1-3.5e-12"), (None, "-")],
)
def test_a_cosine_has_the_digits_that_show_it_is_not_1(cosine: float | None, shown: str) -> None:
    assert cosine_text(cosine) == shown


def test_a_dtype_change_says_whether_the_cast_kept_the_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """A bf16 checkpoint cast to fp32 keeps every value: the dtype change says so (text and JSON); one value changed
    after the cast is said with its largest difference, as torch sees both sides."""
    torch.manual_seed(0)
    half = {"a": torch.randn(4, 4).bfloat16(), "b": torch.randn(3).bfloat16(), "n": torch.arange(3, dtype=torch.int32)}
    wide = {k: v.float() if v.is_floating_point() else v.long() for k, v in half.items()}
    torch.save(half, tmp_path / "half.pth")
    torch.save(wide, tmp_path / "wide.pth")
    wide["b"][0] += 1
    torch.save(wide, tmp_path / "moved.pth")
    assert main(["diff", str(tmp_path / "half.pth"), str(tmp_path / "wide.pth")]) == 1
    out = capsys.readouterr().out
    assert "a: bfloat16 → float32 (equal as values)" in out and "n: int32 → int64 (equal as values)" in out
    assert main(["diff", str(tmp_path / "half.pth"), str(tmp_path / "moved.pth"), "--json"]) == 1
    changes = {c["key"]: c["values"] for c in json.loads(capsys.readouterr().out)["dtype_changes"]}
    assert changes == {"a": "equal as values", "b": "values differ: max |a-b| 1", "n": "equal as values"}


CAST_PAIRS = [
    (torch.float32, torch.bfloat16),
    (torch.bfloat16, torch.float32),
    (torch.float32, torch.float16),
    (torch.float64, torch.float32),
    (torch.int32, torch.int64),
    (torch.uint8, torch.float32),
    (torch.bool, torch.int8),
    # one width on both sides: a pair can hold equal bits that are other values (an int32 1065353216, a float32 1.0)
    (torch.float32, torch.int32),
    (torch.float16, torch.bfloat16),
    (torch.int16, torch.float16),
    (torch.uint8, torch.int8),
]


def test_many_casts_read_in_batches_say_what_each_pair_read_alone_says_and_what_torch_sees(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    """Hundreds of small cast pairs (a whole checkpoint cast) are compared in batches: each pair's words are those
    of the pair read alone, and agree with torch's comparison of the two tensors as float64 (NaN, ±0, Inf, a value
    the cast rounded or took past the narrower range, a value changed after it, and the same bits read as another
    dtype: ``x.view(int32)``, whose bits are equal and whose values are not)."""
    from ckpt_tui.core.values import batched_values

    generator = torch.Generator().manual_seed(3)
    a, b = {}, {}
    for index in range(210):
        wide, narrow = CAST_PAIRS[index % len(CAST_PAIRS)]
        x = (torch.randn(5, generator=generator) * 3).to(wide)
        if wide.is_floating_point and index % 5 == 1:
            x[0], x[1] = float("nan") if index % 2 else float("inf"), -0.0
        if wide == torch.float32 and index % 6 == 2:
            x[3] = 1e5  # past float16's range: Inf in B
        y = x.to(narrow)
        if index % 7 == 3:
            y[2] += 1
        if wide.itemsize == narrow.itemsize and index % 3 == 0:
            y = x.view(narrow).clone()
        a[f"t{index}"], b[f"t{index}"] = x, y
    torch.save(a, tmp_path / "a.pth")
    torch.save(b, tmp_path / "b.pth")

    def words() -> dict[str, str]:
        main(["diff", str(tmp_path / "a.pth"), str(tmp_path / "b.pth"), "--json"])
        return {c["key"]: c["values"] for c in json.loads(capsys.readouterr().out)["dtype_changes"]}

    batched = words()
    monkeypatch.setattr(batched_values, "MIN_BATCHED", 10**9)  # each pair read alone
    assert words() == batched and len(batched) == 210
    views = 0
    for key, said in batched.items():
        x, y = a[key].double(), b[key].double()
        finite = x.isfinite() & y.isfinite()
        agree = (x == y) | (x.isnan() & y.isnan())
        views += a[key].untyped_storage().tolist() == b[key].untyped_storage().tolist()
        if (~finite & ~agree).any():
            assert said == "NaN/Inf positions differ", (key, said)
        elif torch.equal(x[finite], y[finite]):
            assert said == "equal as values", (key, said)
        else:
            assert said.startswith("values differ: max |a-b| "), (key, said)
    assert views >= 20  # pairs of equal bytes and other values were among them
