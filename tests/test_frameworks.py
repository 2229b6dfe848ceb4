"""The layouts training frameworks write, each opened as one checkpoint and consolidated bit for bit.

Fixtures under tests/fixtures/frameworks/ were written by the frameworks themselves on CPU (see
scripts/make_framework_fixtures.py), each with the framework's own reading or converter output beside
it (``<case>.expected.pt``): torch's HF storage reader and ``consolidate_safetensors_files``, FSDP1's
``FULL_STATE_DICT`` and full ``optim_state_dict``, DeepSpeed's ``engine.module.state_dict()`` and
``zero_to_fp32``. No framework is imported here.
"""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from deepspeed_expected import expected_fp32_weights
from safetensors.torch import load_file

from ckpt_tui.cli import main
from ckpt_tui.core.operations.check import check_checkpoint
from ckpt_tui.core.readers.open import open_checkpoint

FRAMEWORKS = Path(__file__).parent / "fixtures" / "frameworks"
DEEPSPEED = Path(__file__).parent / "fixtures" / "deepspeed"
HF_DCP = FRAMEWORKS / "hf_dcp"


def assert_same(got: Any, want: Any, where: str = "") -> None:
    """Same keys (any order), equal plain values, tensors bit-equal with the same dtype and shape."""
    if isinstance(want, dict):
        assert isinstance(got, dict), where
        assert sorted(map(str, got)) == sorted(map(str, want)), where
        for key in want:
            assert_same(got[key], want[key], f"{where}/{key}")
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), where
        for index, (a, b) in enumerate(zip(got, want, strict=True)):
            assert_same(a, b, f"{where}/{index}")
    elif isinstance(want, torch.Tensor):
        assert type(got) is torch.Tensor, where
        assert (got.dtype, got.shape) == (want.dtype, want.shape), where
        assert got.reshape(-1).view(torch.uint8).equal(want.detach().reshape(-1).view(torch.uint8)), where
    else:
        assert got == want, where


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def copy_case(case: str, tmp_path: Path, name: str = "renamed") -> Path:
    """The fixture folder under another name: opening goes by content, never by the folder's name."""
    target = tmp_path / name
    shutil.copytree(FRAMEWORKS / case, target)
    return target


# ---- DCP through torch's HuggingFaceStorageWriter(save_distributed=True) -----------------------


def test_hf_dcp_folder_converts_equal_to_torchs_own_reading(tmp_path: Path, capsys: Any) -> None:
    folder = copy_case("hf_dcp", tmp_path)
    out = tmp_path / "one.pth"
    code, _, err = run(capsys, "convert", str(folder), "-o", str(out))
    assert code == 0, err
    assert_same(torch.load(out, weights_only=True), torch.load(FRAMEWORKS / "hf_dcp.expected.pt", weights_only=True))


def test_hf_dcp_folder_with_an_int_buffer_equals_torchs_own_reading(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "one.pth"
    code, _, err = run(capsys, "convert", str(FRAMEWORKS / "hf_dcp_ints"), "-o", str(out))
    assert code == 0, err
    want = torch.load(FRAMEWORKS / "hf_dcp_ints.expected.pt", weights_only=True)
    assert want["bn.num_batches_tracked"].dtype == torch.int64
    assert_same(torch.load(out, weights_only=True), want)


def test_hf_dcp_folder_to_safetensors_equals_torchs_consolidation(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "model.safetensors"
    code, _, err = run(capsys, "convert", str(HF_DCP), "--format", "safetensors", "-o", str(out))
    assert code == 0, err
    want = load_file(FRAMEWORKS / "hf_dcp.expected" / "model-00001-of-00001.safetensors")
    assert_same(load_file(out), want)


def test_one_rank_file_of_an_hf_dcp_folder_opens_the_whole_folder() -> None:
    checkpoint = open_checkpoint(HF_DCP / "shard-00002-model-00002-of-00002.safetensors")
    assert checkpoint.format == "dcp-hf"
    assert checkpoint.root["fc2.weight"].shape == (5, 12)
    assert checkpoint.root["bn.weight"].shape == (12,)
    assert check_checkpoint(checkpoint).ok


def test_hf_dcp_info_names_the_layout(capsys: Any) -> None:
    code, out, _ = run(capsys, "info", str(HF_DCP))
    assert code == 0
    assert "layout      DCP (HF safetensors), 2 ranks" in out
    code, out, _ = run(capsys, "info", str(HF_DCP), "--json")
    assert json.loads(out)["layout"] == "DCP (HF safetensors), 2 ranks; weights: the root"


def test_hf_dcp_diff_against_torchs_consolidation_finds_nothing(capsys: Any) -> None:
    code, out, err = run(capsys, "diff", str(HF_DCP), str(FRAMEWORKS / "hf_dcp.expected"))
    assert code == 0, out + err


def test_hf_dcp_with_a_rank_file_cut_short_is_refused_in_one_line(tmp_path: Path, capsys: Any) -> None:
    folder = copy_case("hf_dcp", tmp_path)
    victim = folder / "shard-00002-model-00002-of-00002.safetensors"
    victim.write_bytes(victim.read_bytes()[:-16])
    code, _, err = run(capsys, "convert", str(folder), "-o", str(tmp_path / "x.pth"))
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.pth").exists()


# ---- FSDP1 SHARDED_STATE_DICT saved per rank, with its optimizer ------------------------------


@pytest.mark.parametrize("case", ["fsdp1_optim", "fsdp1_mesh"])
def test_fsdp1_rank_folder_converts_to_the_full_model_and_optimizer_state(
    case: str, tmp_path: Path, capsys: Any
) -> None:
    folder = copy_case(case, tmp_path)
    out = tmp_path / "full.pt"
    code, _, err = run(capsys, "convert", str(folder), "-o", str(out))
    assert code == 0, err
    assert_same(torch.load(out, weights_only=True), torch.load(FRAMEWORKS / f"{case}.expected.pt", weights_only=False))


@pytest.mark.parametrize("case", ["fsdp1_optim", "fsdp1_mesh"])
def test_fsdp1_rank_folder_extract_auto_gives_the_full_model_state(case: str, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "model.pt"
    code, _, err = run(capsys, "convert", str(FRAMEWORKS / case), "--extract", "auto", "-o", str(out))
    assert code == 0, err
    want = torch.load(FRAMEWORKS / f"{case}.expected.pt", weights_only=False)["model"]
    assert_same(torch.load(out, weights_only=True), want)


@pytest.mark.parametrize(
    ("case", "layout"),
    [
        ("fsdp1_optim", "FSDP1 sharded, 2 ranks, ShardedTensor; weights: ckpt['model']"),
        ("fsdp1_mesh", "sharded state_dict (FSDP2, or FSDP1 with a device mesh), 2 ranks, DTensor"),
    ],
)
def test_fsdp1_rank_folder_info_names_the_layout(case: str, layout: str, capsys: Any) -> None:
    code, out, _ = run(capsys, "info", str(FRAMEWORKS / case))
    assert code == 0
    assert f"layout      {layout}" in out
    assert str(FRAMEWORKS / case) in out.splitlines()[0]


def test_fsdp1_rank_folder_checks_clean_but_for_each_files_verdict() -> None:
    # torch.load(weights_only=True) refuses each FSDP1 rank file (ShardedTensor metadata classes are not
    # allowlisted): the set's verdict is its files', so that is the one problem
    report = check_checkpoint(open_checkpoint(FRAMEWORKS / "fsdp1_optim"))
    assert [p.kind for p in report.problems] == ["weights-only"], [p.message for p in report.problems]
    assert report.weights_only is not None and report.weights_only.answer == "refuses"
    assert "ShardedTensorMetadata" in report.problems[0].message


def test_a_folder_whose_one_subfolder_is_a_checkpoint_names_it_in_its_refusal(tmp_path: Path, capsys: Any) -> None:
    # torchtitan keeps the rank files under sharded/ (its consolidation may fail and leave only them)
    shutil.copytree(HF_DCP, tmp_path / "step" / "sharded")
    code, _, err = run(capsys, "info", str(tmp_path / "step"))
    assert code == 2
    assert err.strip().splitlines() == [
        f"ckpt-tui: {tmp_path / 'step'}: no checkpoint in this folder: 1 folder (sharded/); sharded/ holds a "
        f"checkpoint, torch.distributed.checkpoint directory (HF safetensors): open it (ckpt-tui "
        f"{tmp_path / 'step' / 'sharded'})"
    ]
    assert run(capsys, "info", str(tmp_path / "step" / "sharded"))[0] == 0


def test_fsdp1_diff_of_two_rank_files_compares_each_rank_files_own_shards(capsys: Any) -> None:
    # each file alone would open the whole rank set: the set compared with itself said "identical"
    rank0, rank1 = (str(FRAMEWORKS / "fsdp1_optim" / f"rank{r}.pt") for r in (0, 1))
    code, out, err = run(capsys, "diff", rank0, rank1)
    assert code == 1, err
    assert out.startswith(f"DIFFERENT ({rank0} vs {rank1})")
    # ShardedTensor shards like torch.chunk along dim 0
    whole = torch.load(FRAMEWORKS / "fsdp1_optim.expected.pt", weights_only=False)["model"]["fc2.weight"]
    shards = torch.chunk(whole, 2)
    assert f"model/fc2.weight: {list(shards[0].shape)} → {list(shards[1].shape)}" in out
    assert "model/fc1.weight: max |a-b|" in out


def test_fsdp1_info_of_a_rank_file_is_titled_with_that_file(capsys: Any) -> None:
    rank1 = str(FRAMEWORKS / "fsdp1_optim" / "rank1.pt")
    code, out, _ = run(capsys, "info", rank1)
    assert code == 0
    assert out.splitlines()[0] == rank1
    assert "layout      FSDP1 sharded, 2 ranks" in out


def test_fsdp1_rank_file_check_names_every_global_add_safe_globals_needs() -> None:
    # the pickle NEWOBJs ChunkShardingSpec and getattr(ShardedTensor, "ProcessGroupState"): allowlisting what
    # check names must leave torch.load refusing nothing (it then needs a process group, not a global)
    report = check_checkpoint(open_checkpoint(FRAMEWORKS / "fsdp1_optim" / "rank0.pt"))
    assert report.weights_only is not None and report.weights_only.reason is None
    names = [blocker.name for blocker in report.weights_only.blockers]
    assert "torch.distributed._shard.sharded_tensor.api.ShardedTensor.ProcessGroupState" in names
    assert "torch.distributed._shard.sharding_spec.chunk_sharding_spec.ChunkShardingSpec" in names
    objects = [_resolve(name) for name in names]
    with torch.serialization.safe_globals(objects), pytest.raises(Exception) as raised:
        torch.load(FRAMEWORKS / "fsdp1_optim" / "rank0.pt", weights_only=True)
    assert "init_process_group" in str(raised.value), str(raised.value)


def _resolve(name: str) -> Any:
    """The object a dotted global name walks to, as pickle resolves it."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            value = getattr(value, part)
        return value
    raise AssertionError(name)


# ---- whole DeepSpeed folders converted without --extract ---------------------------------------


def test_whole_zero_folder_convert_refuses_before_writing_and_names_the_ways_out(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "all.pth"
    code, _, err = run(capsys, "convert", str(DEEPSPEED / "zero2_bf16"), "-o", str(out))
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "DeepSpeed's own object" in err and '["optimizer_states"]' in err
    assert "--extract auto" in err and "--sanitize" in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("case", ["zero1_fp32", "zero2_bf16", "zero3_bf16"])
def test_whole_zero_folder_sanitized_loads_with_weights_only(case: str, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "all.pth"
    code, _, err = run(capsys, "convert", str(DEEPSPEED / case), "--sanitize", "-o", str(out))
    assert code == 0, err
    loaded = torch.load(out, weights_only=True)
    assert_same(loaded["fp32_weights"], expected_fp32_weights(case))


def test_zero_folder_info_names_stage_ranks_and_dtype(capsys: Any) -> None:
    code, out, _ = run(capsys, "info", str(DEEPSPEED / "zero2_bf16"))
    assert code == 0
    assert "layout      DeepSpeed ZeRO-2, 2 ranks, bf16" in out


# ---- DeepSpeed with ZeRO disabled --------------------------------------------------------------


@pytest.mark.parametrize("case", ["zero0_bf16", "zero0_fp16"])
def test_zero0_folder_extract_auto_equals_the_engines_module_state(case: str, tmp_path: Path, capsys: Any) -> None:
    folder = copy_case(case, tmp_path)
    out = tmp_path / "module.pt"
    code, _, err = run(capsys, "convert", str(folder), "--extract", "auto", "-o", str(out))
    assert code == 0, err
    got = torch.load(out, weights_only=True)
    want = torch.load(FRAMEWORKS / f"{case}.expected.pt", weights_only=True)
    assert list(got) == list(want)
    assert_same(got, want)


@pytest.mark.parametrize(("case", "dtype"), [("zero0_bf16", "bf16"), ("zero0_fp16", "fp16")])
def test_zero0_folder_opens_and_info_names_the_layout(case: str, dtype: str, capsys: Any) -> None:
    code, out, _ = run(capsys, "info", str(FRAMEWORKS / case))
    assert code == 0
    assert f"layout      DeepSpeed ZeRO disabled (stage 0), 2 ranks, {dtype}, unfused optimizer" in out
    checkpoint = open_checkpoint(FRAMEWORKS / case / "global_step2" / "mp_rank_00_model_states.pt")
    assert checkpoint.format == "deepspeed"
    assert check_checkpoint(checkpoint).ok


@pytest.mark.parametrize("named", ["", "global_step2", "global_step2/mp_rank_01_model_states.pt"])
def test_a_pipeline_parallel_save_opens_as_one_model_its_layer_files_the_weights(
    named: str, tmp_path: Path, capsys: Any
) -> None:
    # PipelineModule in 2 stages: each stage's model states hold module None; layer_NN-model_states.pt hold the
    # weights, which load_state_dir reads into layer NN (the module's own names: 2.weight)
    folder = copy_case("zero1_pipeline", tmp_path)
    code, info, err = run(capsys, "info", str(folder / named))
    assert code == 0, err
    assert (
        "layout      DeepSpeed pipeline-parallel (2 stages, 5 layer files), ZeRO-1, 1 data-parallel rank, fp32; "
        "weights: ckpt['module']" in info
    )
    out = tmp_path / "module.pt"
    code, _, err = run(capsys, "convert", str(folder / named), "--extract", "auto", "-o", str(out))
    assert code == 0, err
    want = torch.load(FRAMEWORKS / "zero1_pipeline.expected.pt", weights_only=True)
    got = torch.load(out, weights_only=True)
    assert list(got) == list(want)
    assert_same(got, want)
    assert check_checkpoint(open_checkpoint(folder / named)).ok


@pytest.mark.parametrize("named", ["", "global_step2", "global_step2/mp_rank_00_model_states.pt"])
def test_zero0_bf16_optimizer_folder_gives_the_fp32_master_weights(named: str, tmp_path: Path, capsys: Any) -> None:
    # DeepSpeed 0.16 at stage 0 in bf16 with the optimizer named in its config: the BF16_Optimizer's fp32 master
    # copies partitioned over the ranks in bf16_zero_pp_rank_N_*_optim_states.pt (zero_to_fp32 refuses them)
    folder = copy_case("zero0_bf16_optim", tmp_path)
    code, info, err = run(capsys, "info", str(folder / named))
    assert code == 0, err
    assert (
        "layout      DeepSpeed ZeRO disabled (stage 0), bf16 optimizer, 2 ranks, bf16; weights: ckpt['fp32_weights']"
        in info
    )
    out = tmp_path / "model.safetensors"
    code, _, err = run(capsys, "convert", str(folder / named), "--extract", "auto", "-o", str(out))
    assert code == 0, err
    want = torch.load(FRAMEWORKS / "zero0_bf16_optim.expected.pt", weights_only=True)
    assert_same(load_file(out), {**want["fp32"], **want["buffers"]})
    assert check_checkpoint(open_checkpoint(folder)).ok


# ---- Lightning's FSDP strategy, state_dict_type="sharded" --------------------------------------


def test_lightning_sharded_fsdp_folder_converts_equal_to_lightnings_consolidation(tmp_path: Path, capsys: Any) -> None:
    folder = copy_case("lightning_fsdp", tmp_path, "epoch=0-step=2.ckpt")
    out = tmp_path / "one.ckpt"
    code, _, err = run(capsys, "convert", str(folder), "-o", str(out))
    assert code == 0, err
    got = torch.load(out, weights_only=True)
    want = torch.load(FRAMEWORKS / "lightning_fsdp.expected.pt", weights_only=False)
    assert list(got) == list(want)
    assert_same(got, want)


def test_lightning_sharded_fsdp_extract_auto_gives_the_state_dict(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "model.pt"
    code, out_text, err = run(capsys, "info", str(FRAMEWORKS / "lightning_fsdp"))
    assert "layout      Lightning FSDP (sharded): DCP + meta.pt, 2 ranks" in out_text
    code, _, err = run(capsys, "convert", str(FRAMEWORKS / "lightning_fsdp"), "--extract", "auto", "-o", str(out))
    assert code == 0, err
    want = torch.load(FRAMEWORKS / "lightning_fsdp.expected.pt", weights_only=False)["state_dict"]
    assert_same(torch.load(out, weights_only=True), want)


# ---- torchtitan's HF save: the per-rank files under sharded/, torch's consolidation beside them ---


def test_torchtitan_style_sharded_folder_equals_torchs_consolidated_files(capsys: Any) -> None:
    folder = FRAMEWORKS / "hf_dcp_consolidated"
    assert open_checkpoint(folder / "sharded").format == "dcp-hf"
    code, out, err = run(capsys, "diff", str(folder / "sharded"), str(folder))
    assert code == 0, out + err


# ---- every verb, and the browser header ---------------------------------------------------------


def test_framework_folders_check_against_the_frameworks_truth(capsys: Any) -> None:
    code, out, err = run(capsys, "check", str(HF_DCP), "--against", str(FRAMEWORKS / "hf_dcp.expected.pt"))
    assert code == 0, out + err
    code, out, err = run(capsys, "stats", str(FRAMEWORKS / "fsdp1_optim"), "--at", "model", "--json")
    assert code == 0, err
    rows = {tuple(row["path"]): row for row in json.loads(out)["tensors"]}
    want = torch.load(FRAMEWORKS / "fsdp1_optim.expected.pt", weights_only=False)["model"]["fc1.weight"]
    assert rows[("model", "fc1.weight")]["max"] == pytest.approx(want.max().item())


async def test_browser_opens_an_hf_dcp_folder_and_its_header_names_the_layout() -> None:
    from builders_tui import header, loaded

    from ckpt_tui.tui.app import CkptApp

    app = CkptApp(str(HF_DCP))
    async with app.run_test(size=(120, 36), notifications=True) as pilot:
        tree = await loaded(pilot)
        assert "DCP (HF safetensors), 2 ranks" in header(app)
        assert "fc2.weight" in [str(n.label).split()[0] for n in tree.root.children]


@pytest.mark.parametrize(
    ("folder", "layout"),
    [
        (HF_DCP, "DCP (HF safetensors), 2 ranks"),
        (DEEPSPEED / "zero2_bf16", "DeepSpeed ZeRO-2, 2 ranks, bf16"),
        (FRAMEWORKS / "fsdp1_optim", "FSDP1 sharded, 2 ranks, ShardedTensor"),
    ],
)
def test_browser_header_names_the_layout(folder: Path, layout: str) -> None:
    from ckpt_tui.core.operations.info import summarize
    from ckpt_tui.tui.widgets.summary import summary_text

    assert layout in summary_text(summarize(open_checkpoint(folder))).plain.splitlines()[1]


def _rewrite_sharding(path: Path, change: Any) -> None:
    """Re-save one rank's safetensors file of a real HF-DCP folder with its sharding metadata changed."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), "pt") as file:
        tensors = {key: file.get_tensor(key) for key in file.keys()}  # noqa: SIM118 (safe_open has no __iter__)
        metadata = dict(file.metadata())
    metadata["DCP_SHARDING_INFO"] = change(json.loads(metadata["DCP_SHARDING_INFO"]))
    save_file(tensors, str(path), metadata=metadata)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda info: "{not json", "is not JSON"),
        (
            lambda info: json.dumps({k: {"saved_offsets": [-1] * len(v["saved_offsets"])} for k, v in info.items()}),
            "no valid saved_offsets",
        ),
        (
            lambda info: json.dumps({k: {"saved_offsets": [0] * len(v["saved_offsets"])} for k, v in info.items()}),
            "its pieces overlap (DCP_SHARDING_INFO saved_offsets [0] and [0])",
        ),
    ],
)
def test_hf_dcp_with_bad_sharding_info_is_one_line_never_a_traceback(
    change: Any, message: str, tmp_path: Path, capsys: Any
) -> None:
    folder = copy_case("hf_dcp", tmp_path)
    _rewrite_sharding(folder / "shard-00002-model-00002-of-00002.safetensors", change)
    code, _, err = run(capsys, "convert", str(folder), "-o", str(tmp_path / "x.pth"))
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and message in err
    assert not (tmp_path / "x.pth").exists()


def _consolidated(folder: Path, out: Path) -> dict[str, torch.Tensor]:
    """What torch's own ``consolidate_safetensors_files`` makes of an HF-DCP folder."""
    from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files

    names = sorted({key for file in folder.glob("*.safetensors") for key in load_file(file)})
    out.mkdir()
    consolidate_safetensors_files(str(folder), str(out), fqn_to_index_mapping=dict.fromkeys(names, 1))
    return load_file(out / "model-00001-of-00001.safetensors")


@pytest.mark.parametrize(
    ("offsets", "cause"),
    [
        ([0, 0], "its pieces shard-00001-model-00001-of-00002.safetensors [0:5, 0:8] and"),  # over rank 1's piece
        ([3, 0], "overlap (DCP_SHARDING_INFO saved_offsets [0, 0] and [3, 0])"),
        ([6, 0], "leave a gap: 8 of its 88 elements are in no file"),  # rows 5:6 in no file
    ],
)
def test_hf_dcp_pieces_that_overlap_or_leave_a_gap_are_named_and_the_rest_is_read(
    offsets: list[int], cause: str, tmp_path: Path, capsys: Any
) -> None:
    folder = copy_case("hf_dcp", tmp_path)

    def move(info: dict[str, Any]) -> str:
        info["embed.weight"]["saved_offsets"] = offsets
        return json.dumps(info)

    _rewrite_sharding(folder / "shard-00002-model-00001-of-00002.safetensors", move)
    torch_made = _consolidated(folder, tmp_path / "consolidated")
    code, out, err = run(capsys, "check", str(folder))
    assert code == 1, err
    finding = next(line for line in out.splitlines() if "[odd-layout]" in line)
    assert "embed.weight" in finding and cause in finding and "shard-00002-model-00001-of-00002.safetensors" in finding
    assert "--drop embed.weight" in finding
    shapes = {
        row["path"][0]: row["shape"] for row in json.loads(run(capsys, "info", "--json", str(folder))[1])["tensors"]
    }
    assert shapes["embed.weight"] == list(torch_made["embed.weight"].shape)  # the farthest corner, as torch takes it
    # its values: one line saying why, never a guess; the other tensors convert equal to torch's
    code, _, err = run(capsys, "convert", str(folder), "-o", str(tmp_path / "all.pth"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "embed.weight: its pieces" in err, err
    out_file = tmp_path / "rest.pth"
    code, _, err = run(capsys, "convert", str(folder), "-o", str(out_file), "--drop", "embed.weight")
    assert code == 0, err
    rest = {key: value for key, value in torch_made.items() if key != "embed.weight"}
    assert_same(torch.load(out_file, weights_only=True), rest)


# ---- Lightning's DeepSpeed strategy (ZeRO-2) ----------------------------------------------------


def test_lightning_deepspeed_folder_extract_auto_equals_zero_to_fp32(tmp_path: Path, capsys: Any) -> None:
    folder = copy_case("lightning_deepspeed", tmp_path, "epoch=0-step=2.ckpt")
    code, out, _ = run(capsys, "info", str(folder))
    assert "layout      Lightning (DeepSpeed strategy): DeepSpeed ZeRO-2, 2 ranks, fp32" in out
    target = tmp_path / "model.pt"
    code, _, err = run(capsys, "convert", str(folder), "--extract", "auto", "-o", str(target))
    assert code == 0, err
    want = torch.load(FRAMEWORKS / "lightning_deepspeed.expected.pt", weights_only=False)
    got = torch.load(target, weights_only=True)
    assert list(got) == list(want)
    assert_same(got, want)


# ---- Accelerate's save_state with its DeepSpeed plugin ------------------------------------------


def test_accelerate_deepspeed_folder_extract_auto_equals_zero_to_fp32(tmp_path: Path, capsys: Any) -> None:
    folder = copy_case("accelerate_deepspeed", tmp_path, "checkpoint_1")
    code, out, _ = run(capsys, "info", str(folder))
    assert "layout      Accelerate (DeepSpeed plugin): DeepSpeed ZeRO-2, 2 ranks, fp32" in out
    target = tmp_path / "model.pt"
    code, _, err = run(capsys, "convert", str(folder), "--extract", "auto", "-o", str(target))
    assert code == 0, err
    want = torch.load(FRAMEWORKS / "accelerate_deepspeed.expected.pt", weights_only=False)
    assert_same(torch.load(target, weights_only=True), want)


def test_accelerate_deepspeed_folder_whole_convert_refuses_then_sanitizes(tmp_path: Path, capsys: Any) -> None:
    folder = FRAMEWORKS / "accelerate_deepspeed"
    code, _, err = run(capsys, "convert", str(folder), "-o", str(tmp_path / "all.pth"))
    assert code == 2 and "--extract auto" in err and "--sanitize" in err
    assert list(tmp_path.iterdir()) == []
    code, _, err = run(capsys, "convert", str(folder), "--sanitize", "-o", str(tmp_path / "all.pth"))
    assert code == 0, err
    loaded = torch.load(tmp_path / "all.pth", weights_only=True)
    want = torch.load(FRAMEWORKS / "accelerate_deepspeed.expected.pt", weights_only=False)
    assert_same(loaded["fp32_weights"], want)


def test_zero2_folder_without_its_optimizer_files_is_not_taken_for_stage0(tmp_path: Path) -> None:
    from ckpt_tui.core.errors import ReadError

    shutil.copytree(DEEPSPEED / "zero2_fp32", tmp_path / "z")
    for optim in (tmp_path / "z" / "global_step2").glob("*optim_states.pt"):
        optim.unlink()
    with pytest.raises(ReadError, match="ZeRO stage 2 checkpoint without its"):
        open_checkpoint(tmp_path / "z")


@pytest.mark.parametrize("case", ["fsdp1_optim", "fsdp1_mesh", "lightning_fsdp"])
def test_framework_folder_diffs_identical_to_the_frameworks_own_consolidation(case: str, capsys: Any) -> None:
    code, out, err = run(capsys, "diff", str(FRAMEWORKS / case), str(FRAMEWORKS / f"{case}.expected.pt"))
    assert code == 0, out + err
    assert out.startswith("identical")
