"""``average``: the weighted mean of checkpoints equals torch's float64 arithmetic rounded once to the dtype,
non-float tensors come from the first file, mismatches are refused, and the write is atomic and verified."""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from ckpt_tui.cli import main
from ckpt_tui.core.operations.average import parse_weights


def model_states(count: int, dtype: torch.dtype = torch.float32) -> list[OrderedDict[str, torch.Tensor]]:
    """``count`` state_dicts of one small model with different weights and BatchNorm counters."""
    states = []
    for index in range(count):
        torch.manual_seed(index)
        model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.BatchNorm1d(7), torch.nn.Linear(7, 3)).to(dtype)
        model[1].running_mean.normal_()
        model[1].num_batches_tracked += 10 * (index + 1)
        states.append(model.state_dict())
    return states


def save_all(tmp_path: Path, states: list[Any], stem: str = "s") -> list[str]:
    paths = []
    for index, state in enumerate(states):
        path = tmp_path / f"{stem}{index}.pth"
        torch.save(state, path)
        paths.append(str(path))
    return paths


def expected(states: list[OrderedDict[str, torch.Tensor]], weights: list[float]) -> dict[str, torch.Tensor]:
    """The definition: sum of (w_i / sum w) * x_i in float64, in file order, rounded once to the first's dtype."""
    total = sum(weights)
    out = {}
    for key, first in states[0].items():
        if not first.is_floating_point():
            out[key] = first
            continue
        acc = torch.zeros(first.shape, dtype=torch.float64)
        for weight, state in zip(weights, states, strict=True):
            acc += (weight / total) * state[key].double()
        out[key] = acc.to(first.dtype)
    return out


def assert_bit_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype, key
        assert torch.equal(got[key], value), key


def test_plain_mean_of_three_fp32_files_is_bit_equal_to_torch_float64_rounded_once(tmp_path, capsys):
    states = model_states(3)
    paths = save_all(tmp_path, states)
    out = tmp_path / "soup.pth"
    assert main(["average", *paths, "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "averaged 8 floating-point tensors of 3 files" in printed
    assert "taken from the first file (1 not floating point): 1.num_batches_tracked" in printed
    assert "verified" in printed
    got = torch.load(out, weights_only=True)
    assert_bit_equal(got, expected(states, [1, 1, 1]))
    assert got["1.num_batches_tracked"].item() == 10  # the first file's counter


def test_weights_are_normalised_and_applied_in_file_order(tmp_path, capsys):
    states = model_states(2)
    paths = save_all(tmp_path, states)
    out = tmp_path / "w.pth"
    assert main(["average", *paths, "-o", str(out), "--weights", "1,3"]) == 0
    assert "weights 0.25, 0.75" in capsys.readouterr().out
    assert_bit_equal(torch.load(out, weights_only=True), expected(states, [1, 3]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_average_in_float64_and_round_once_like_torch(tmp_path, dtype):
    states = model_states(3, dtype)
    paths = save_all(tmp_path, states)
    out = tmp_path / "half.safetensors"
    assert main(["average", *paths, "-o", str(out), "--weights", "0.2,0.3,0.5"]) == 0
    got = load_file(out)
    want = expected(states, [0.2, 0.3, 0.5])
    for key, value in want.items():
        assert got[key].dtype == value.dtype
        assert torch.equal(got[key], value), key


def test_training_checkpoint_at_state_dict_writes_only_the_averaged_weights(tmp_path, capsys):
    states = model_states(2)
    ckpts = [
        {"state_dict": s, "epoch": i, "optimizer": {"state": {}, "param_groups": []}} for i, s in enumerate(states)
    ]
    paths = save_all(tmp_path, ckpts, "ck")
    out = tmp_path / "swa.pth"
    assert main(["average", *paths, "-o", str(out), "--at", "state_dict"]) == 0
    got = torch.load(out, weights_only=True)
    assert_bit_equal(got, expected(states, [1, 1]))


def test_whole_training_checkpoint_keeps_the_first_files_other_values_and_says_which_differ(tmp_path, capsys):
    states = model_states(2)
    ckpts = [{"model": s, "epoch": i, "note": "same"} for i, s in enumerate(states)]
    paths = save_all(tmp_path, ckpts, "ck")
    out = tmp_path / "all.pth"
    assert main(["average", *paths, "-o", str(out)]) == 0
    assert "1 other value differs between the files; the first file's kept: epoch" in capsys.readouterr().out
    got = torch.load(out, weights_only=True)
    assert got["epoch"] == 0 and got["note"] == "same"
    assert_bit_equal(got["model"], expected(states, [1, 1]))


def test_tied_weights_stay_one_storage(tmp_path):
    states = []
    for seed in range(2):
        torch.manual_seed(seed)
        emb = torch.randn(6, 4)
        states.append({"embed.weight": emb, "head.weight": emb})
    paths = save_all(tmp_path, states)
    out = tmp_path / "tied.pth"
    assert main(["average", *paths, "-o", str(out)]) == 0
    got = torch.load(out, weights_only=True)
    assert got["embed.weight"].data_ptr() == got["head.weight"].data_ptr()
    assert torch.equal(
        got["head.weight"],
        ((states[0]["embed.weight"].double() * 0.5) + states[1]["embed.weight"].double() * 0.5).float(),
    )


@pytest.mark.parametrize("tied_first", [True, False])
def test_keys_tied_in_one_file_and_not_in_another_are_refused_in_either_order(tmp_path, capsys, tied_first):
    # averaged as one tensor, the tied pair would get the mean of the first file's tie: not each key's mean
    shared = torch.tensor([1.0, 2.0, 3.0, 4.0])
    tied = {"a": shared, "b": shared}
    untied = {"a": torch.tensor([3.0, 4.0, 5.0, 6.0]), "b": torch.tensor([11.0, 12.0, 13.0, 14.0])}
    paths = save_all(tmp_path, [tied, untied] if tied_first else [untied, tied])
    out = tmp_path / "x.pth"
    assert main(["average", *paths, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "b and a are one tensor (tied weights)" in err, err
    assert not out.exists()


def test_mismatched_keys_are_refused_naming_them(tmp_path, capsys):
    states = model_states(2)
    del states[1]["2.bias"]
    states[1]["extra.weight"] = torch.zeros(2)
    paths = save_all(tmp_path, states)
    out = tmp_path / "x.pth"
    assert main(["average", *paths, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith("ckpt-tui: ") and "missing 2.bias" in err and "extra extra.weight" in err
    assert not out.exists()


def test_mismatched_shapes_are_refused_naming_them(tmp_path, capsys):
    states = model_states(2)
    states[1]["2.weight"] = torch.zeros(4, 7)
    paths = save_all(tmp_path, states)
    assert main(["average", *paths, "-o", str(tmp_path / "x.pth")]) == 2
    assert "2.weight [3, 7] vs [4, 7]" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("weights", "words"),
    [
        ("1,2,3", "3 numbers for 2 files"),
        ("1,x", "numbers separated by commas"),
        ("1,-1", "non-zero sum"),
        ("nan,1", "finite"),
        ("1e308,-1e308", "non-zero sum"),
        ("0,0", "non-zero sum"),
    ],
)
def test_bad_weights_are_refused(tmp_path, capsys, weights, words):
    paths = save_all(tmp_path, model_states(2))
    assert main(["average", *paths, "-o", str(tmp_path / "x.pth"), "--weights", weights]) == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize(("text", "expected"), [("1e308,1e308", [0.5, 0.5]), ("1e-320,3e-320", [0.25, 0.75])])
def test_huge_and_tiny_weights_are_normalised_without_overflow(text, expected):
    assert parse_weights(text, 2) == pytest.approx(expected)


def test_existing_output_is_refused_without_force_and_replaced_with_it(tmp_path, capsys):
    states = model_states(2)
    paths = save_all(tmp_path, states)
    out = tmp_path / "soup.pth"
    out.write_bytes(b"keep me")
    assert main(["average", *paths, "-o", str(out)]) == 2
    assert out.read_bytes() == b"keep me"
    assert main(["average", *paths, "-o", str(out), "--force"]) == 0
    assert_bit_equal(torch.load(out, weights_only=True), expected(states, [1, 1]))
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []


def test_one_file_is_refused(tmp_path, capsys):
    paths = save_all(tmp_path, model_states(1))
    assert main(["average", *paths, "-o", str(tmp_path / "x.pth")]) == 2
    assert "at least two files" in capsys.readouterr().err


@pytest.mark.parametrize("files", [2, 3])  # two: on the worker threads; more: in this thread
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tensors_of_many_chunks_averaged_on_worker_threads_are_bit_equal_in_order(tmp_path, capsys, dtype, files):
    from ckpt_tui.core.values.tensor_values import CHUNK_ELEMENTS

    states = []
    for seed in range(files):
        torch.manual_seed(seed)  # several chunks per tensor, each averaged on a worker and written in order
        states.append({"big": torch.randn(5 * CHUNK_ELEMENTS // 2 + 7).to(dtype), "small": torch.randn(3).to(dtype)})
    paths = save_all(tmp_path, states)
    out = tmp_path / "soup.safetensors"
    weights = [1, 2, 4][:files]
    assert main(["average", *paths, "-o", str(out), "--weights", ",".join(map(str, weights))]) == 0
    assert_bit_equal(load_file(out), expected(states, weights))


SPECIALS = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-40, -1e-45, 3.0, -2.5, 6e4, -1e-5]
BITS = {torch.float16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}


@pytest.mark.parametrize("weights", ["1,1", "2,-1", "0.3,0.7"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_signed_zeros_nans_and_infinities_average_to_the_same_bytes_widened_by_numpy_or_decoded(
    tmp_path, monkeypatch, dtype, weights
):
    from ckpt_tui.core.operations import average

    # every pair of special values, and NaNs with payloads of their own
    a = torch.tensor([x for x in SPECIALS for _ in SPECIALS], dtype=dtype)
    b = torch.tensor([y for _ in SPECIALS for y in SPECIALS], dtype=dtype)
    if dtype == torch.float32:
        a.view(torch.int32)[4] = 0x7FC12345
        b.view(torch.int32)[len(SPECIALS) * 4 + 2] = -0x3ED4321  # a negative quiet NaN (0xFC12BCDF)
    elif dtype == torch.float16:
        a.view(torch.int16)[4] = 0x7E01
    paths = save_all(tmp_path, [{"w": a}, {"w": b}])
    widened = tmp_path / "widened.pth"
    assert main(["average", *paths, "-o", str(widened), "--weights", weights, "--allow-nan"]) == 0
    monkeypatch.setattr(average, "_widened_by_numpy", lambda tensor, raw: False)  # every value through decode
    decoded = tmp_path / "decoded.pth"
    assert main(["average", *paths, "-o", str(decoded), "--weights", weights, "--allow-nan"]) == 0
    got = torch.load(widened, weights_only=True)["w"]
    assert torch.equal(got.view(BITS[dtype]), torch.load(decoded, weights_only=True)["w"].view(BITS[dtype]))
    # and torch's float64 arithmetic, value for value (a NaN where torch has one)
    want = expected([{"w": a}, {"w": b}], [float(w) for w in weights.split(",")])["w"]
    assert torch.equal(got.isnan(), want.isnan())
    same = ~want.isnan()
    assert torch.equal(got[same].view(BITS[dtype]), want[same].view(BITS[dtype]))


def test_plain_mean_of_two_fp32_files_at_float32s_limits_is_the_float64_mean_rounded_once(tmp_path, monkeypatch):
    from ckpt_tui.core.operations import average
    from ckpt_tui.core.values.stats import BLOCK_ELEMENTS

    # blocks of ordinary values (averaged in float32), of sums past float32's range, of subnormal halves and of
    # signed zeros: each the bytes of the float64 mean rounded once
    torch.manual_seed(0)
    a, b = torch.randn(5 * BLOCK_ELEMENTS), torch.randn(5 * BLOCK_ELEMENTS)
    a[BLOCK_ELEMENTS : 2 * BLOCK_ELEMENTS] = 3.3e38
    b[BLOCK_ELEMENTS : 2 * BLOCK_ELEMENTS] = 3.2e38
    a[2 * BLOCK_ELEMENTS : 3 * BLOCK_ELEMENTS] *= 1e-38
    b[2 * BLOCK_ELEMENTS : 3 * BLOCK_ELEMENTS] = 1e-45
    a[3 * BLOCK_ELEMENTS : 4 * BLOCK_ELEMENTS], b[3 * BLOCK_ELEMENTS : 4 * BLOCK_ELEMENTS] = -0.0, -0.0
    halved = []
    halved_sum = average._halved_sum
    monkeypatch.setattr(average, "_halved_sum", lambda x, y, out: halved.append(halved_sum(x, y, out)) or halved[-1])
    paths = save_all(tmp_path, [{"w": a}, {"w": b}])
    assert main(["average", *paths, "-o", str(tmp_path / "soup.pth"), "--weights", "3,3"]) == 0
    got = torch.load(tmp_path / "soup.pth", weights_only=True)["w"]
    want = expected([{"w": a}, {"w": b}], [1, 1])["w"]
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert got[BLOCK_ELEMENTS:].isfinite().all() and got[3 * BLOCK_ELEMENTS].item() == 0.0
    assert halved == [True, False, False, True, True]


@pytest.mark.parametrize("weights", ["1,1", "1,3"])
def test_chunks_read_on_the_workers_average_to_the_bytes_of_chunks_read_here(tmp_path, monkeypatch, weights):
    import contextlib

    from ckpt_tui.core.operations import average
    from ckpt_tui.core.values.tensor_values import CHUNK_ELEMENTS, TensorReader

    size = 5 * CHUNK_ELEMENTS // 2 + 7  # several chunks, the last one short, pieces not a whole READ_PIECE
    states = []
    for seed in range(2):
        torch.manual_seed(seed)
        storage = torch.randn(size + 11)
        states.append(
            {
                "offset": storage[11:],  # a view at an offset in its storage
                "bf16": torch.randn(CHUNK_ELEMENTS + 3).bfloat16(),  # decoded, not widened by numpy
                "mixed": torch.randn(average.READ_PIECE + 5).to(torch.float32 if seed == 0 else torch.float16),
                "expanded": torch.randn(1000).expand(17_000, 1000),  # 68 MB as a view of 4 kB: averaged as 4 kB
                "transposed": torch.randn(300, 500).t(),  # not row-major: read here in either case
            }
        )
    paths = save_all(tmp_path, states)
    on_workers = tmp_path / "workers.pth"
    read_there = []
    shared_path = average.AveragedRecords._read_on_workers
    monkeypatch.setattr(
        average.AveragedRecords,
        "_read_on_workers",
        lambda self, storage, *args: read_there.append(storage.numel) or shared_path(self, storage, *args),
    )
    assert main(["average", *paths, "-o", str(on_workers), "--weights", weights]) == 0
    assert sorted(read_there) == sorted([size, CHUNK_ELEMENTS + 3, average.READ_PIECE + 5, 1000])

    @contextlib.contextmanager
    def not_shared(self, mapped=False):
        yield None

    monkeypatch.setattr(TensorReader, "shared_reads", not_shared)  # read here, averaged on the workers
    here = tmp_path / "here.pth"
    assert main(["average", *paths, "-o", str(here), "--weights", weights]) == 0
    got, want = torch.load(on_workers, weights_only=True), torch.load(here, weights_only=True)
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16}
    for key, value in want.items():
        assert torch.equal(got[key].view(bits[value.dtype]), value.view(bits[value.dtype])), key
    assert_bit_equal(got, expected(states, [float(w) for w in weights.split(",")]))


def sgd_runs(tmp_path: Path) -> list[str]:
    """Two training checkpoints of one model after a few SGD+momentum steps on different data, saved the way
    the PyTorch tutorial saves them (model_state_dict, optimizer_state_dict, epoch, loss)."""
    paths = []
    for run in range(2):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.BatchNorm1d(7), torch.nn.Linear(7, 3))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        torch.manual_seed(run + 1)
        for _ in range(2):
            loss = model(torch.randn(8, 5)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        state = {"epoch": 2, "model_state_dict": model.state_dict(), "optimizer_state_dict": optimizer.state_dict()}
        state["loss"] = loss.item()
        torch.save(state, tmp_path / f"run{run}.pth")
        paths.append(str(tmp_path / f"run{run}.pth"))
    return paths


def test_a_whole_training_checkpoint_says_how_many_tensors_are_the_model_and_how_to_average_it_alone(tmp_path, capsys):
    paths = sgd_runs(tmp_path)
    assert main(["average", *paths, "-o", str(tmp_path / "soup.pth")]) == 0
    lines = capsys.readouterr().out.splitlines()
    # 6 parameters and 2 BatchNorm statistics of the model; one momentum buffer per parameter
    assert lines[0] == (
        "averaged 14 floating-point tensors of 2 files (weights 0.5, 0.5): "
        '8 model tensors (ckpt["model_state_dict"]) + 6 optimizer state'
    )
    assert lines[1] == "--at model_state_dict averages the model only"
    # what is averaged by default is unchanged: the momentum buffers too
    soup = torch.load(tmp_path / "soup.pth", weights_only=True)
    runs = [torch.load(p, weights_only=True) for p in paths]
    momentum = [r["optimizer_state_dict"]["state"][0]["momentum_buffer"] for r in runs]
    want = ((momentum[0].double() + momentum[1].double()) / 2).float()
    assert torch.equal(soup["optimizer_state_dict"]["state"][0]["momentum_buffer"], want)
    # the hint, followed: the model alone, and the line says no more than the count
    assert main(["average", *paths, "-o", str(tmp_path / "model.pth"), "--at", "model_state_dict"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == "averaged 8 floating-point tensors of 2 files (weights 0.5, 0.5)"


def test_a_deepspeed_folder_average_refused_names_average_s_own_way_out(tmp_path, capsys):
    # DeepSpeed's own objects (ZeroStageEnum, LossScaler) cannot be written: the way out is average's --at, never
    # convert's --extract or --sanitize, which average does not have
    folder = str(Path(__file__).parent / "fixtures" / "deepspeed" / "zero2_fp32")
    out = tmp_path / "avg.pth"
    assert main(["average", folder, folder, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "DeepSpeed's own object" in err
    assert err.strip().endswith("--at fp32_weights averages and writes the model alone")
    assert "--extract" not in err and "--sanitize" not in err and not out.exists()
    assert main(["average", folder, folder, "-o", str(out), *err.split(": ")[-1].split()[:2]]) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_an_input_with_nan_or_inf_is_refused_naming_the_tensor_and_nothing_is_written(tmp_path, capsys, dtype, bad):
    """A soup of a diverged run is no model: refused (exit 2) naming where, no file (nor a temporary) left; with
    --allow-nan it is written, the NaN/Inf where torch's mean has it. Large tensors go through the worker threads."""
    from ckpt_tui.core.values.tensor_values import CHUNK_ELEMENTS

    states = model_states(2, dtype)
    for state in states:
        state["big"] = torch.ones(2 * CHUNK_ELEMENTS + 3, dtype=dtype)
    for key in ("2.weight", "big"):
        poisoned = [dict(s) for s in states]
        poisoned[1][key] = poisoned[1][key].clone()
        poisoned[1][key].view(-1)[-1] = bad
        paths = save_all(tmp_path, poisoned, stem=f"{key}-")
        out = tmp_path / f"{key}.pth"
        assert main(["average", *paths, "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"the average of {key} holds NaN or Inf" in err and "--allow-nan" in err and len(err.splitlines()) == 1
        assert not out.exists() and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(key)) == sorted(
            Path(p).name for p in paths
        )
        assert main(["average", *paths, "-o", str(out), "--allow-nan"]) == 0
        got = torch.load(out, weights_only=True)[key].view(-1)
        assert torch.isfinite(got[:-1]).all() and not torch.isfinite(got[-1])
    capsys.readouterr()


@pytest.mark.parametrize("decoded", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_finite_inputs_whose_weighted_sum_rounds_past_the_dtype_are_refused_saying_so(
    tmp_path, capsys, monkeypatch, dtype, decoded
):
    """Weights 2,-1 (extrapolation) over finite values can round past a 16-bit float's range: the average as
    written holds Inf, torch's mean too. Refused saying the sum overflowed (no input holds NaN/Inf there), on
    both arithmetic paths; nothing written."""
    from ckpt_tui.core.operations import average

    if decoded:
        monkeypatch.setattr(average, "_widened_by_numpy", lambda tensor, raw: False)
    big = torch.finfo(dtype).max
    a = torch.tensor([1.0, big], dtype=dtype)
    b = torch.tensor([1.0, -big], dtype=dtype)
    paths = save_all(tmp_path, [{"w": a}, {"w": b}])
    want = expected([{"w": a}, {"w": b}], [2.0, -1.0])["w"]
    assert not torch.isfinite(want).all()  # torch's own weighted mean overflows there too
    out = tmp_path / "soup.pth"
    assert main(["average", *paths, "-o", str(out), "--weights", "2,-1"]) == 2
    err = capsys.readouterr().err
    assert "the average of w holds NaN or Inf, the weighted sum there is past" in err, err
    assert "--weights 2,-1" in err and "as an input does" not in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_a_mixed_dtype_average_past_the_first_files_range_is_refused(tmp_path, capsys):
    """An fp16 file averaged with an fp32 one holding 1e6: written in the first file's dtype, the mean (500000.5)
    is Inf in fp16, as torch's own weighted mean cast to fp16 is; refused saying the sum is past float16's range."""
    a = {"w": torch.tensor([1.0, 60000.0], dtype=torch.float16)}
    b = {"w": torch.tensor([1.0, 1e6])}
    paths = save_all(tmp_path, [a, b])
    assert not torch.isfinite((0.5 * a["w"].double() + 0.5 * b["w"].double()).to(torch.float16)).all()
    out = tmp_path / "soup.pth"
    assert main(["average", *paths, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "the weighted sum there is past float16's range (--weights 0.5,0.5)" in err and not out.exists(), err


def test_an_optimizers_step_counters_are_taken_from_the_first_file_with_its_step(tmp_path, capsys):
    """Adam keeps each parameter's step as a float tensor: averaged (200, 300 → 250) it would disagree with the
    checkpoint's own step kept from the first file, which info then flags. It is a counter: taken from the first
    file and said, the moments averaged."""
    saved = []
    for steps in (2, 3):
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.Adam(model.parameters())
        for _ in range(steps):
            model(torch.randn(4, 3)).sum().backward()
            optimizer.step()
        saved.append({"step": steps, "model": model.state_dict(), "optimizer": optimizer.state_dict()})
    paths = save_all(tmp_path, saved)
    out = tmp_path / "soup.pth"
    assert main(["average", *paths, "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "taken from the first file (2 step counters" in text
    got = torch.load(out, weights_only=True)
    assert all(state["step"].item() == 2 for state in got["optimizer"]["state"].values())
    first, second = (s["optimizer"]["state"][0]["exp_avg"] for s in saved)
    assert torch.equal(got["optimizer"]["state"][0]["exp_avg"], ((first.double() + second.double()) / 2).float())
    assert main(["info", str(out)]) == 0
    assert "resuming pairs" not in capsys.readouterr().out
