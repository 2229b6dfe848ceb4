"""Distributed checkpoints as one: DCP folders, FSDP/DTensor rank files, DeepSpeed ZeRO, DDP ranks, HF shards.

The committed fixtures under tests/fixtures/ were written by the frameworks themselves (see
scripts/make_torch_distributed_fixtures.py and scripts/make_deepspeed_fixtures.py), with each
framework's own converter output beside them as ground truth.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from deepspeed_expected import expected_fp32_weights

from ckpt_tui.cli import main
from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model.tree import Tensor
from ckpt_tui.core.operations.check import check_checkpoint
from ckpt_tui.core.operations.info import summarize
from ckpt_tui.core.readers.open import open_checkpoint

FIXTURES = Path(__file__).parent / "fixtures"
TORCH = FIXTURES / "torch_distributed"
DEEPSPEED = FIXTURES / "deepspeed"
ZERO_CASES = ["zero1_fp32", "zero2_fp32", "zero2_bf16", "zero3_fp32", "zero3_bf16"]


def assert_same(got: Any, want: Any, where: str = "") -> None:
    """Same keys, and tensors bit-equal with the same dtype, shape and requires_grad."""
    if isinstance(want, dict):
        assert isinstance(got, dict), where
        assert list(got) == list(want), where
        for key in want:
            assert_same(got[key], want[key], f"{where}/{key}")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), where
        for index, (a, b) in enumerate(zip(got, want, strict=True)):
            assert_same(a, b, f"{where}/{index}")
    elif isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), where
        assert (got.dtype, got.shape, got.requires_grad) == (want.dtype, want.shape, want.requires_grad), where
        assert got.reshape(-1).view(torch.uint8).equal(want.reshape(-1).view(torch.uint8)), where
    else:
        assert got == want, where


def tied_pairs(state: dict[str, torch.Tensor]) -> set[tuple[str, str]]:
    """Key pairs that share memory."""
    keys = [k for k, v in state.items() if isinstance(v, torch.Tensor)]
    return {(a, b) for a in keys for b in keys if a < b and state[a].data_ptr() == state[b].data_ptr()}


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


# ---- DCP ------------------------------------------------------------------------------------


def test_dcp_folder_from_fsdp2_converts_bit_equal_to_dcp_to_torch_save(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "out.pt"
    code, _, err = run(capsys, "convert", str(TORCH / "dcp_fsdp2"), "-o", str(out))
    assert code == 0, err
    assert_same(torch.load(out, weights_only=True), torch.load(TORCH / "dcp_fsdp2.expected.pt", weights_only=False))


def test_dcp_tensors_sharded_across_files_show_where_each_chunk_lives() -> None:
    checkpoint = open_checkpoint(TORCH / "dcp_fsdp2")
    weight = checkpoint.root["model"]["fc1.weight"]
    assert isinstance(weight, Tensor) and weight.shape == (12, 8)
    assert weight.storage is not None
    places = weight.storage.source.placement(weight.storage)  # type: ignore[union-attr]
    assert [p.split(" in ")[1].split(" @")[0] for p in places] == ["__0_0.distcp", "__1_0.distcp"]
    assert places[0].startswith("[0:6, 0:8]")


def test_any_file_of_a_dcp_folder_opens_the_whole_folder_and_checks_clean(capsys: Any) -> None:
    code, out, _ = run(capsys, "check", str(TORCH / "dcp_fsdp2" / "__1_0.distcp"))
    assert code == 0
    assert "31 tensors read: OK" in out


def test_dcp_extract_model_only_skips_the_optimizer(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "model.safetensors"
    code, _, err = run(capsys, "convert", str(TORCH / "dcp_fsdp2"), "--extract", "model", "-o", str(out))
    assert code == 0, err
    from safetensors.torch import load_file

    expected = torch.load(TORCH / "dcp_fsdp2.expected.pt", weights_only=False)["model"]
    got = load_file(out)
    assert sorted(got) == sorted(expected)
    assert all(torch.equal(got[k], expected[k]) for k in got)


def _dcp_save(state: dict[str, Any], folder: Path) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save(state, checkpoint_id=str(folder), no_dist=True)


def test_dcp_saved_in_process_keeps_nested_lists_and_plain_values(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    state = {
        "w": torch.arange(12, dtype=torch.bfloat16).reshape(3, 4),
        "groups": [{"lr": 0.5, "params": ["a", "b"]}, {"lr": 0.1, "params": ["c"]}],
        "scalar": torch.tensor(7),
        "meta": {"epoch": 3, "name": "run-1"},
    }
    _dcp_save(state, tmp_path / "ckpt")
    dcp_to_torch_save(tmp_path / "ckpt", tmp_path / "expected.pt")
    assert main(["convert", str(tmp_path / "ckpt"), "-o", str(tmp_path / "ours.pt")]) == 0
    assert_same(torch.load(tmp_path / "ours.pt", weights_only=True), torch.load(tmp_path / "expected.pt"))


def test_huge_dcp_metadata_is_refused_at_once(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    with open(folder / ".metadata", "wb") as file:
        file.truncate(3 << 30)  # sparse: 3 GB that take no disk
    with pytest.raises(ReadError, match="more than any real DCP metadata"):
        open_checkpoint(folder)


def _rewrite_metadata(folder: Path, change: Any) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(folder)).read_metadata()
    change(metadata)
    with open(folder / ".metadata", "wb") as file:
        pickle.dump(metadata, file)


def test_dcp_item_pointing_outside_its_folder_is_refused(tmp_path: Path) -> None:
    _dcp_save({"w": torch.ones(4)}, tmp_path / "ckpt")

    def escape(metadata: Any) -> None:
        for info in metadata.storage_data.values():
            info.relative_path = "../../etc/passwd"

    _rewrite_metadata(tmp_path / "ckpt", escape)
    with pytest.raises(ReadError, match="leads out of"):
        open_checkpoint(tmp_path / "ckpt")


def test_dcp_chunk_range_past_its_file_is_refused(tmp_path: Path) -> None:
    _dcp_save({"w": torch.ones(4)}, tmp_path / "ckpt")

    def stretch(metadata: Any) -> None:
        for info in metadata.storage_data.values():
            info.length += 1 << 20

    _rewrite_metadata(tmp_path / "ckpt", stretch)
    with pytest.raises(ReadError, match="past the end"):
        open_checkpoint(tmp_path / "ckpt")


def test_dcp_chunks_leaving_a_gap_are_reported_not_filled_with_garbage(tmp_path: Path) -> None:
    _dcp_save({"w": torch.ones(4, 2)}, tmp_path / "ckpt")

    def shrink(metadata: Any) -> None:
        chunk = metadata.state_dict_metadata["w"].chunks[0]
        chunk.sizes = torch.Size([3, 2])

    _rewrite_metadata(tmp_path / "ckpt", shrink)
    # dcp.load narrows the [4, 2] item to the chunk's [3, 2] and leaves row 3 as torch.empty made it
    checkpoint = open_checkpoint(tmp_path / "ckpt")
    assert "w: its chunks leave part of it uncovered; torch leaves that as torch.empty made it" in checkpoint.odd_layout
    report = check_checkpoint(checkpoint)
    assert not report.ok
    assert any("its pieces leave a gap" in problem.message for problem in report.problems)


def test_dcp_metadata_with_an_unsafe_global_is_reported_never_run(tmp_path: Path) -> None:
    _dcp_save({"w": torch.ones(4)}, tmp_path / "ckpt")
    canary = tmp_path / "CANARY"

    class Payload:
        def __reduce__(self) -> Any:
            return (os.system, (f"touch {canary}",))

    def inject(metadata: Any) -> None:
        metadata.planner_data = {"w": ("w",), "x": Payload()}

    _rewrite_metadata(tmp_path / "ckpt", inject)
    summary = summarize(open_checkpoint(tmp_path / "ckpt"))
    assert any(f.kind == "unsafe-global" for f in summary.findings)
    assert not canary.exists()


# ---- DeepSpeed --------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ZERO_CASES)
def test_zero_checkpoint_converts_bit_equal_to_deepspeeds_zero_to_fp32(case: str, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "fp32.pt"
    code, _, err = run(capsys, "convert", str(DEEPSPEED / case), "--extract", "fp32_weights", "-o", str(out))
    assert code == 0, err
    got = torch.load(out, weights_only=True)
    want = expected_fp32_weights(case)
    assert_same(got, want)
    assert tied_pairs(got) == tied_pairs(want)


@pytest.mark.parametrize("case", ZERO_CASES)
def test_zero_checkpoint_opens_from_any_of_its_files_and_checks_clean(case: str) -> None:
    tag = DEEPSPEED / case / "global_step2"
    optim = sorted(tag.glob("*_optim_states.pt"))[-1]
    checkpoint = open_checkpoint(optim)
    assert checkpoint.format == "deepspeed"
    assert "module" in next(iter(checkpoint.root["model_states"].values()))
    report = check_checkpoint(checkpoint)
    assert report.ok, [p.message for p in report.problems]


def test_zero1_frozen_parameters_deepspeed_does_not_list_come_from_the_module(tmp_path: Path, capsys: Any) -> None:
    # DeepSpeed's ZeRO-1 saves frozen_param_shapes None and its zero_to_fp32 drops frozen.*: the weights would
    # not load strictly into the model that saved them
    out = tmp_path / "model.pt"
    assert main(["convert", str(DEEPSPEED / "zero1_fp32"), "--extract", "auto", "-o", str(out)]) == 0
    states = torch.load(DEEPSPEED / "zero1_fp32" / "global_step2" / "mp_rank_00_model_states.pt", weights_only=False)
    assert set(torch.load(out, weights_only=True)) == set(states["module"])
    capsys.readouterr()
    assert main(["info", str(DEEPSPEED / "zero1_fp32")]) == 0
    assert "2 frozen parameters (frozen.weight, frozen.bias) taken from the module as saved" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["zero2_bf16", "zero2_fp32", "zero3_fp32"])
def test_zero_float_buffer_the_model_states_name_is_counted_as_a_buffer(case: str, capsys: Any) -> None:
    # the model registers a float buffer "scale": buffer_names says so, its name does not
    expected = torch.load(DEEPSPEED / case / "expected_fp32.pt", weights_only=True)
    tied = {"head.weight"}  # head.weight is embed.weight: one parameter
    parameters = sum(value.numel() for key, value in expected.items() if key not in {"scale", *tied})
    assert main(["info", "--json", str(DEEPSPEED / case)]) == 0
    found = json.loads(capsys.readouterr().out)
    assert (found["model_parameter_count"], found["model_buffer_count"]) == (parameters, expected["scale"].numel())


def test_zero_fp32_weights_read_only_the_fp32_partitions() -> None:
    checkpoint = open_checkpoint(DEEPSPEED / "zero2_fp32")
    weight = checkpoint.root["fp32_weights"]["body.weight"]
    places = weight.storage.source.placement(weight.storage)
    assert all("single_partition_of_fp32_groups" in place for place in places)


@pytest.mark.parametrize("case", ["zero2_fp32", "zero3_fp32"])
def test_zero_findings_every_rank_repeats_are_said_once_with_their_ranks(case: str, capsys: Any) -> None:
    code, out, _ = run(capsys, "info", "--json", str(DEEPSPEED / case))
    assert code == 0
    messages = [f["message"] for f in json.loads(out)["findings"]]
    optimizer = [m for m in messages if m.startswith("optimizer state at ")]
    assert len(optimizer) == 1, messages
    assert '["zero_pp_rank_*_mp_rank_00_optim_states.pt"]' in optimizer[0] and "(ranks 0, 1)" in optimizer[0]
    assert not any("zero_pp_rank_0_" in m or "zero_pp_rank_1_" in m for m in messages), messages
    # ZeRO's flat partitions are said in the optimizer's one line, with no count of the model's parameters
    assert "1 flat vector (DeepSpeed ZeRO's partitions: not compared with the model's shapes)" in optimizer[0]
    assert not any("flat vector for the model" in m for m in messages), messages
    code, out, _ = run(capsys, "info", str(DEEPSPEED / case))
    assert out.count("optimizer state at") == 1


def test_only_per_rank_file_keys_merge_repeated_findings() -> None:
    from ckpt_tui.core.conventions.findings import Finding, merge_rank_repeats, where

    def said(path: tuple[str, ...]) -> Finding:
        return Finding("optimizer", f"optimizer state at {where(path)}: SGD", path=path)

    files = [said(("opt", f"rank{r}.pt", "state")) for r in (0, 1, 2)]
    merged = merge_rank_repeats(files)
    assert [f.message for f in merged] == ['optimizer state at ckpt["opt"]["rank*.pt"]["state"] (ranks 0, 1, 2): SGD']
    keys = [said(("lora", f"rank_{r}")) for r in (8, 16)]  # keys that are not rank files: each said as it is
    assert merge_rank_repeats(keys) == keys


def test_zero_folder_with_a_missing_rank_is_refused(tmp_path: Path) -> None:
    shutil.copytree(DEEPSPEED / "zero2_fp32", tmp_path / "z")
    next((tmp_path / "z" / "global_step2").glob("*rank_1_*optim_states.pt")).unlink()
    with pytest.raises(ReadError, match="expected 2"):
        open_checkpoint(tmp_path / "z")


# ---- FSDP / DTensor rank files --------------------------------------------------------------


@pytest.mark.parametrize("case", ["fsdp1_sharded", "dtensor"])
def test_rank_files_assemble_to_the_frameworks_full_state_dict(case: str, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "full.pt"
    code, _, err = run(capsys, "convert", str(TORCH / case / "model_rank1.pt"), "-o", str(out))
    assert code == 0, err
    got = torch.load(out, weights_only=True)
    want = torch.load(TORCH / case / "expected_full.pt", weights_only=False)
    assert sorted(got) == sorted(want)
    for key in want:
        assert_same(got[key].detach(), want[key].detach(), key)


def test_rank_files_named_together_open_as_one(capsys: Any) -> None:
    paths = [str(TORCH / "fsdp1_sharded" / f"model_rank{r}.pt") for r in (0, 1)]
    code, out, _ = run(capsys, "info", *paths, "--json")
    assert code == 0
    data = json.loads(out)
    shapes = {t["path"][0]: t["shape"] for t in data["tensors"]}
    assert shapes["embed.weight"] == [10, 8]


def test_one_rank_file_alone_shows_its_shard_and_says_so(tmp_path: Path) -> None:
    shutil.copy(TORCH / "dtensor" / "model_rank0.pt", tmp_path / "model_rank0.pt")
    checkpoint = open_checkpoint(tmp_path / "model_rank0.pt")
    assert checkpoint.root["embed.weight"].shape == (5, 8)
    assert any("one rank of 2" in note for note in checkpoint.notes)


@pytest.mark.parametrize("command", ["convert", "average"])
def test_one_rank_file_alone_is_never_written_as_whole_tensors(tmp_path: Path, capsys: Any, command: str) -> None:
    shutil.copy(TORCH / "fsdp1_sharded" / "model_rank0.pt", tmp_path / "model_rank0.pt")  # (no sibling beside)
    rank = str(tmp_path / "model_rank0.pt")
    args = [rank, "-o", str(tmp_path / "out.safetensors")]
    assert main([command, *(args if command == "convert" else [rank, *args])]) == 2
    assert "is one rank of 2" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_rank0.pt"]


def test_fsdp_local_state_dict_joins_each_parameter_s_pieces_in_rank_order(tmp_path: Path) -> None:
    # saved with use_orig_params=True: each rank holds its flat piece of every parameter under its name
    checkpoint = open_checkpoint(TORCH / "fsdp1_local" / "model_rank0.pt")
    assert checkpoint.root["_flat_param"].shape == (278,)
    assert any("joined in rank order" in note for note in checkpoint.notes)
    assert main(["convert", str(TORCH / "fsdp1_local" / "model_rank0.pt"), "-o", str(tmp_path / "out.pth")]) == 0
    written = torch.load(tmp_path / "out.pth", weights_only=True)
    full = torch.load(TORCH / "fsdp1_sharded" / "expected_full.pt", weights_only=True)
    for key, value in full.items():
        # every element, in order (a parameter's shape is not saved; buffers are copies, as they were)
        assert torch.equal(written[key].flatten(), value.flatten()), key


def test_fsdp_local_state_dict_with_orig_params_counts_each_parameter_once(capsys: Any) -> None:
    # the parameters are saved as views of _flat_param's storage: the flat copy is said apart, never added to them
    full = torch.load(TORCH / "fsdp1_sharded" / "expected_full.pt", weights_only=True)
    buffers = ("running_mean", "running_var", "num_batches_tracked")
    parameters = sum(value.numel() for key, value in full.items() if not key.endswith(buffers))
    assert main(["info", "--json", str(TORCH / "fsdp1_local")]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["model_parameter_count"] == parameters
    assert found["model_buffer_count"] == sum(value.numel() for key, value in full.items() if key.endswith(buffers))
    assert found["flat_parameter_copy_count"] == open_checkpoint(TORCH / "fsdp1_local").root["_flat_param"].numel
    assert main(["info", str(TORCH / "fsdp1_local")]) == 0
    assert f"{parameters} params (model) + " in capsys.readouterr().out


def test_rank_files_holding_a_plain_key_in_other_shapes_are_refused(tmp_path: Path) -> None:
    from ckpt_tui.core.model.assembled import AssembledRecords
    from ckpt_tui.core.readers.rank_set import _rank_fragments

    torch.save({"w": torch.ones(6), "b": torch.ones(3)}, tmp_path / "r0.pt")
    torch.save({"w": torch.ones(4), "b": torch.ones(3)}, tmp_path / "r1.pt")  # 1-D pieces of w: joined
    torch.save({"w": torch.ones(2, 2), "b": torch.ones(3)}, tmp_path / "r2.pt")  # a 2-D w: no piece of anything
    paths = [str(tmp_path / name) for name in ("r0.pt", "r1.pt", "r2.pt")]
    files = [open_checkpoint(path) for path in paths]
    joined = _rank_fragments(paths[:2], files[:2], {}, AssembledRecords(paths[0]))
    assert list(joined) == [("w",)] and joined[("w",)].shape == (10,)
    with pytest.raises(ReadError, match="other shapes or types"):
        _rank_fragments([paths[0], paths[2]], [files[0], files[2]], {}, AssembledRecords(paths[0]))


def test_sharded_tensor_classes_are_not_reported_unsafe() -> None:
    summary = summarize(open_checkpoint(TORCH / "fsdp1_sharded" / "model_rank0.pt"))
    assert not [f for f in summary.findings if f.kind == "unsafe-global"]


def test_getattr_on_a_known_class_is_unsafe_unless_it_names_process_group_state() -> None:
    from ckpt_tui.core.pickles.unpickle import load_pickle
    from ckpt_tui.core.readers.distributed_globals import DISTRIBUTED_CLASSES, DISTRIBUTED_GLOBALS

    owner = b"ctorch.distributed._shard.sharded_tensor.api\nShardedTensor\n"
    data = b"\x80\x02c__builtin__\ngetattr\n" + owner + b"X\x06\x00\x00\x00systemq\x00\x86R."
    value = load_pickle(data, None, "test", known_classes=DISTRIBUTED_CLASSES, extra_globals=DISTRIBUTED_GLOBALS)
    assert value.global_name == "builtins.getattr" and not value.safe


# ---- DDP ranks -------------------------------------------------------------------------------


def test_nway_diff_of_ddp_ranks_names_the_batchnorm_stats(capsys: Any) -> None:
    paths = [str(TORCH / "ddp" / f"rank{r}.pt") for r in range(3)]
    code, out, _ = run(capsys, "diff", *paths, "--json")
    assert code == 1
    data = json.loads(out)
    differing = {d["key"] for d in data["differences"]}
    assert differing == {"module.bn.running_mean", "module.bn.running_var"}
    assert data["tensors_compared"] == 10
    assert all(d["max_abs_diff_from_first"][1] > 0 for d in data["differences"])


def test_nway_diff_of_identical_copies_exits_zero(tmp_path: Path, capsys: Any) -> None:
    for r in range(3):
        shutil.copy(TORCH / "ddp" / "rank0.pt", tmp_path / f"r{r}.pt")
    code, out, _ = run(capsys, "diff", *(str(tmp_path / f"r{r}.pt") for r in range(3)))
    assert code == 0
    assert "agree bit for bit" in out


# ---- Hugging Face shards ------------------------------------------------------------------------


def test_max_shard_size_writes_hf_shards_and_index(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "hf"
    args = ["convert", str(DEEPSPEED / "zero3_fp32"), "--extract", "fp32_weights", "--max-shard-size", "300B"]
    code, _, err = run(capsys, *args, "-o", str(out))
    assert code == 0, err
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == [f"model-{i:05d}-of-{len(files):05d}.safetensors" for i in range(1, len(files) + 1)]
    from safetensors.torch import load_file

    loaded: dict[str, torch.Tensor] = {}
    for name in files:
        loaded.update(load_file(out / name))
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in loaded.values())
    want = torch.load(DEEPSPEED / "zero3_fp32" / "expected_fp32.pt", weights_only=False)
    assert all(torch.equal(loaded[k], want[k]) for k in loaded)
    assert sorted(open_checkpoint(out).root) == sorted(loaded)


def test_max_shard_size_refuses_a_folder_that_is_not_empty(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "keep.txt").write_text("mine")
    args = ["convert", str(DEEPSPEED / "zero2_fp32"), "--extract", "fp32_weights", "--max-shard-size", "1KB"]
    code, _, err = run(capsys, *args, "-o", str(tmp_path / "hf"))
    assert code == 2 and "not an empty folder" in err
    assert (tmp_path / "hf" / "keep.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]


def _expanded_dcp(folder: Path, count: int) -> Path:
    """A DCP folder written by ``dcp.save`` whose ``w`` item is then a ``torch.save`` of an expanded view
    (one stored float, ``count`` elements), its metadata saying so: a few KB on disk."""
    import io

    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    _dcp_save({"w": torch.zeros(4), "b": torch.ones(3)}, folder)
    metadata = FileSystemReader(str(folder)).read_metadata()
    buffer = io.BytesIO()
    torch.save(torch.full((1,), 2.0).expand(count), buffer)
    item = buffer.getvalue()
    for index, info in metadata.storage_data.items():
        if index.fqn == "w":
            data = folder / info.relative_path
            info.offset, info.length = data.stat().st_size, len(item)
            with open(data, "ab") as file:
                file.write(item)
    entry = metadata.state_dict_metadata["w"]
    entry.size = torch.Size([count])
    entry.chunks = [ChunkStorageMetadata(offsets=torch.Size([0]), sizes=torch.Size([count]))]
    with open(folder / ".metadata", "wb") as file:
        pickle.dump(metadata, file)
    return folder


def test_an_expanded_dcp_chunk_costs_its_file_not_its_view(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _expanded_dcp(tmp_path / "dcp", 2**32)  # 16 GiB of float32 if it were ever read element by element
    assert sum(p.stat().st_size for p in folder.iterdir()) < 16_000
    assert main(["check", str(folder)]) == 1
    out = capsys.readouterr().out
    assert "view of 4294967296 elements over 1 stored (expand, stride 0)" in out
    assert main(["convert", str(folder), "-o", str(tmp_path / "out.pth")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert not (tmp_path / "out.pth").exists()


def test_a_slightly_expanded_dcp_chunk_is_still_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _expanded_dcp(tmp_path / "dcp", 1000)
    assert main(["convert", str(folder), "-o", str(tmp_path / "out.pth")]) == 0
    assert torch.equal(torch.load(tmp_path / "out.pth", weights_only=True)["w"], torch.full((1000,), 2.0))


def test_writing_over_a_file_of_an_opened_set_is_writing_over_the_input(tmp_path: Path, capsys: Any) -> None:
    folder = tmp_path / "dcp"
    shutil.copytree(TORCH / "dcp_fsdp2", folder)
    for member in (folder / "__0_0.distcp", folder / ".metadata"):
        before = member.read_bytes()
        assert main(["convert", str(folder), "--extract", "auto", "-o", str(member)]) == 2
        assert capsys.readouterr().err.strip() == f"ckpt-tui: {member} is the input file; use --force to replace it"
        assert member.read_bytes() == before
    from ckpt_tui.core.edits.session import Session
    from ckpt_tui.tui.app import CkptApp

    # the browser asks its louder question too (no app run: the files it reads come from the checkpoint)
    app = CkptApp(str(folder))
    app.session = Session(open_checkpoint(folder))
    assert app.replaces_source(str(folder / "__1_0.distcp")) and app.replaces_source(str(folder / ".metadata"))


def test_a_dcp_folder_that_also_holds_a_from_pretrained_save_is_refused_naming_both(
    tmp_path: Path, capsys: Any
) -> None:
    from safetensors.torch import save_file

    folder = tmp_path / "two"
    shutil.copytree(TORCH / "dcp_fsdp2", folder)
    save_file({"other.weight": torch.ones(2, 2)}, folder / "model.safetensors")  # what from_pretrained(folder) takes
    assert main(["info", str(folder)]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"ckpt-tui: {folder} holds two saves")
    assert "model.safetensors (read by from_pretrained)" in line
    # each opens by its own file
    assert main(["info", str(folder / ".metadata")]) == 0
    assert main(["info", str(folder / "model.safetensors")]) == 0


@pytest.mark.parametrize(
    ("save", "module_state"),
    [
        (DEEPSPEED / "zero2_fp32", DEEPSPEED / "zero2_fp32" / "expected_fp32.pt"),
        (FIXTURES / "frameworks" / "zero0_bf16", FIXTURES / "frameworks" / "zero0_bf16.expected.pt"),
    ],
)
def test_a_deepspeed_save_beside_its_save_16bit_model_file_is_refused_naming_both(
    tmp_path: Path, capsys: Any, save: Path, module_state: Path
) -> None:
    folder = tmp_path / "out"
    shutil.copytree(save, folder)
    # DeepSpeed's engine.save_16bit_model(folder) (stages 0-2) is torch.save(engine.module_state_dict(), folder /
    # "pytorch_model.bin"): the module's state_dict in its training dtype, beside save_checkpoint's latest and tag
    state = torch.load(module_state, weights_only=False)
    torch.save(state, folder / "pytorch_model.bin")
    assert main(["info", str(folder)]) == 2
    line = capsys.readouterr().err.strip()
    assert line == (
        f"ckpt-tui: {folder} holds two saves: a DeepSpeed checkpoint (latest naming global_step2/, read by "
        "DeepSpeed's load_checkpoint and zero_to_fp32) and pytorch_model.bin (read by from_pretrained); open one "
        f"by its path: {folder}/global_step2 or {folder}/pytorch_model.bin"
    )
    assert main(["check", str(folder)]) == 2
    # each opens by the path the line names
    capsys.readouterr()
    assert main(["info", str(folder / "global_step2")]) == 0
    assert "DeepSpeed" in capsys.readouterr().out
    out = tmp_path / "module.pth"
    assert main(["convert", str(folder / "pytorch_model.bin"), "-o", str(out)]) == 0
    assert_same(torch.load(out, weights_only=True), state)


def test_a_dcp_folder_compressed_through_torch_s_zstd_extension_reads_as_torch_reads_it(
    tmp_path: Path, capsys: Any
) -> None:
    # written by torch's FileSystemWriter(_extensions=[ZStandard()]) (scripts/make_dcp_zstd_fixture.py): tensors of
    # three dtypes and non-tensor items, each a zstd stream; the truth is torch's own dcp_to_torch_save
    pytest.importorskip("zstandard")
    folder = TORCH / "dcp_zstd"
    assert main(["diff", str(folder), str(TORCH / "dcp_zstd.expected.pt")]) == 0
    assert main(["check", str(folder)]) == 0
    out = tmp_path / "plain.pt"
    assert main(["convert", str(folder), "-o", str(out)]) == 0
    assert_same(torch.load(out, weights_only=True), torch.load(TORCH / "dcp_zstd.expected.pt", weights_only=True))


def test_the_decompressed_items_of_a_zstd_dcp_folder_are_removed_as_the_cli_leaves(tmp_path: Path) -> None:
    # the CLI leaves by os._exit (no atexit): the private folder of decompressed items goes all the same
    pytest.importorskip("zstandard")
    import subprocess
    import sys

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    for command in ("info", "check"):
        done = subprocess.run(
            [sys.executable, "-m", "ckpt_tui", command, str(TORCH / "dcp_zstd")],
            env={**os.environ, "TMPDIR": str(scratch)},
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert list(scratch.iterdir()) == [], command


def test_a_zstd_compressed_dcp_folder_without_a_zstd_library_names_what_to_install(
    capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckpt_tui.core.readers import dcp_extensions

    monkeypatch.setattr(dcp_extensions, "LIBRARIES", ("no_such_zstd_library",))
    for command in ("info", "check"):
        assert main([command, str(TORCH / "dcp_zstd")]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        assert "compressed with zstd" in err and "pip install 'ckpt-tui[zstd]'" in err


def test_a_dcp_item_through_an_extension_torch_does_not_know_is_one_line(tmp_path: Path, capsys: Any) -> None:
    folder = tmp_path / "dcp"
    shutil.copytree(TORCH / "dcp_zstd", folder)
    metadata = (folder / ".metadata").read_bytes()
    (folder / ".metadata").write_bytes(metadata.replace(b"stream.zstd/1", b"stream.lz4z/1"))
    assert main(["info", str(folder)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "'stream.lz4z/1', which torch does not know" in err


def test_a_zstd_item_that_decompresses_past_what_it_can_hold_is_refused(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("zstandard")
    from ckpt_tui.core.readers import dcp

    # (a bound below every item: each would be a bomb)
    monkeypatch.setattr(dcp, "bytes_item_most", lambda length: 16)
    shutil.copytree(TORCH / "dcp_zstd", tmp_path / "dcp")
    assert main(["info", str(tmp_path / "dcp")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "more than the item can hold; refused" in err


def test_a_deepspeed_pipeline_save_split_by_tensor_parallelism_too_names_its_layer_files(
    tmp_path: Path, capsys: Any
) -> None:
    # with tensor parallelism beside the pipeline each layer is saved in slices (layer_NN-model_RR-model_states.pt),
    # which DeepSpeed's loader merges by its own rules: not read as one, said so, and a slice opens (a pipeline
    # alone opens as one model: tests/test_frameworks.py)
    tag = tmp_path / "global_step2"
    shutil.copytree(DEEPSPEED / "zero1_fp32" / "global_step2", tag)
    (tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt").rename(tag / "zero_pp_rank_1_mp_rank_01_optim_states.pt")
    torch.save({"weight": torch.ones(2, 2)}, tag / "layer_00-model_00-model_states.pt")
    torch.save({"weight": torch.ones(2, 2)}, tag / "layer_00-model_01-model_states.pt")
    assert main(["info", str(tag)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "a rank did not save" not in err
    assert "a DeepSpeed pipeline- or model-parallel save (2 model-parallel ranks x 2 data-parallel ranks)" in err
    assert err.strip().endswith(f"open one (ckpt-tui {tag / 'layer_00-model_00-model_states.pt'})")
    assert main(["info", str(tag / "layer_00-model_00-model_states.pt")]) == 0
