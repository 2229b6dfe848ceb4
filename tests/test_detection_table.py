"""Detection is one ordered table (``readers/open.py``'s ``DETECTION``): every kind of checkpoint the
suite has still opens as the format it opened as before the table, and every format has a row and a
display name."""

from __future__ import annotations

import importlib.util
import pickle
import tarfile
from pathlib import Path

import pytest
import torch
from builders import (
    tiny_state_dict,
    write_dcp,
    write_safetensors,
    write_sharded_bin,
    write_sharded_safetensors,
    write_torchscript,
)

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model.formats import FORMAT_IDS, FORMAT_NAMES
from ckpt_tui.core.readers.open import DETECTION, open_checkpoint

FIXTURES = Path(__file__).parent / "fixtures"

ZSTD = any(importlib.util.find_spec(name) is not None for name in ("zstandard", "pyzstd"))
"""Whether a zstd library torch reads compressed DCP items with is installed (the test extras install zstandard)."""
FIXTURE_FORMATS = [
    ("accelerate", "zip"),
    ("accelerate/save_state", "folder"),
    ("accelerate/save_state/model.safetensors", "safetensors"),
    ("accelerate/save_state/optimizer.bin", "zip"),
    ("accelerate/save_state/random_states_0.pkl", "zip"),
    ("accelerate/save_state/scheduler.bin", "zip"),
    ("accelerate/save_state.expected.pt", "zip"),
    ("deepspeed", "! PATH: no checkpoint in this folder: 5 folders (zero1_fp32/, zero2_bf16"),
    ("deepspeed/zero1_fp32", "deepspeed"),
    ("deepspeed/zero1_fp32/expected_fp32.pt", "zip"),
    ("deepspeed/zero1_fp32/global_step2", "deepspeed"),
    ("deepspeed/zero1_fp32/global_step2/mp_rank_00_model_states.pt", "deepspeed"),
    ("deepspeed/zero1_fp32/global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt", "deepspeed"),
    ("deepspeed/zero1_fp32/global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt", "deepspeed"),
    ("deepspeed/zero1_fp32/latest", "! PATH: a text file, not a checkpoint"),
    ("deepspeed/zero2_bf16", "deepspeed"),
    ("deepspeed/zero2_bf16/expected_fp32.pt", "zip"),
    ("deepspeed/zero2_bf16/global_step2", "deepspeed"),
    ("deepspeed/zero2_bf16/global_step2/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "deepspeed"),
    ("deepspeed/zero2_bf16/global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "deepspeed"),
    ("deepspeed/zero2_bf16/global_step2/mp_rank_00_model_states.pt", "deepspeed"),
    ("deepspeed/zero2_bf16/latest", "! PATH: a text file, not a checkpoint"),
    ("deepspeed/zero2_fp32", "deepspeed"),
    ("deepspeed/zero2_fp32/expected_fp32.pt", "zip"),
    ("deepspeed/zero2_fp32/global_step2", "deepspeed"),
    ("deepspeed/zero2_fp32/global_step2/mp_rank_00_model_states.pt", "deepspeed"),
    ("deepspeed/zero2_fp32/global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt", "deepspeed"),
    ("deepspeed/zero2_fp32/global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt", "deepspeed"),
    ("deepspeed/zero2_fp32/latest", "! PATH: a text file, not a checkpoint"),
    ("deepspeed/zero3_bf16", "deepspeed"),
    ("deepspeed/zero3_bf16/expected_fp32.pt", "zip"),
    ("deepspeed/zero3_bf16/global_step2", "deepspeed"),
    ("deepspeed/zero3_bf16/global_step2/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "deepspeed"),
    ("deepspeed/zero3_bf16/global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "deepspeed"),
    ("deepspeed/zero3_bf16/global_step2/zero_pp_rank_0_mp_rank_00_model_states.pt", "deepspeed"),
    ("deepspeed/zero3_bf16/global_step2/zero_pp_rank_1_mp_rank_00_model_states.pt", "deepspeed"),
    ("deepspeed/zero3_bf16/latest", "! PATH: a text file, not a checkpoint"),
    ("deepspeed/zero3_fp32", "deepspeed"),
    ("deepspeed/zero3_fp32/expected_fp32.pt", "zip"),
    ("deepspeed/zero3_fp32/global_step2", "deepspeed"),
    ("deepspeed/zero3_fp32/global_step2/zero_pp_rank_0_mp_rank_00_model_states.pt", "deepspeed"),
    ("deepspeed/zero3_fp32/global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt", "deepspeed"),
    ("deepspeed/zero3_fp32/global_step2/zero_pp_rank_1_mp_rank_00_model_states.pt", "deepspeed"),
    ("deepspeed/zero3_fp32/global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt", "deepspeed"),
    ("deepspeed/zero3_fp32/latest", "! PATH: a text file, not a checkpoint"),
    ("frameworks", "! PATH: a folder of 11 separate checkpoints, not one save: open one (ckp"),
    ("frameworks/accelerate_deepspeed", "deepspeed"),
    ("frameworks/accelerate_deepspeed/latest", "! PATH: a text file, not a checkpoint"),
    ("frameworks/accelerate_deepspeed/pytorch_model", "deepspeed"),
    ("frameworks/accelerate_deepspeed/pytorch_model/mp_rank_00_model_states.pt", "deepspeed"),
    ("frameworks/accelerate_deepspeed/pytorch_model/zero_pp_rank_0_mp_rank_00_optim_states.pt", "deepspeed"),
    ("frameworks/accelerate_deepspeed/pytorch_model/zero_pp_rank_1_mp_rank_00_optim_states.pt", "deepspeed"),
    ("frameworks/accelerate_deepspeed/random_states_0.pkl", "zip"),
    ("frameworks/accelerate_deepspeed.expected.pt", "zip"),
    ("frameworks/fsdp1_mesh", "ranks"),
    ("frameworks/fsdp1_mesh/rank0.pt", "ranks"),
    ("frameworks/fsdp1_mesh/rank1.pt", "ranks"),
    ("frameworks/fsdp1_mesh.expected.pt", "zip"),
    ("frameworks/fsdp1_optim", "ranks"),
    ("frameworks/fsdp1_optim/rank0.pt", "ranks"),
    ("frameworks/fsdp1_optim/rank1.pt", "ranks"),
    ("frameworks/fsdp1_optim.expected.pt", "zip"),
    ("frameworks/hf_dcp", "dcp-hf"),
    ("frameworks/hf_dcp/shard-00001-model-00001-of-00002.safetensors", "dcp-hf"),
    ("frameworks/hf_dcp/shard-00001-model-00002-of-00002.safetensors", "dcp-hf"),
    ("frameworks/hf_dcp/shard-00002-model-00001-of-00002.safetensors", "dcp-hf"),
    ("frameworks/hf_dcp/shard-00002-model-00002-of-00002.safetensors", "dcp-hf"),
    ("frameworks/hf_dcp.expected", "sharded"),
    ("frameworks/hf_dcp.expected/model-00001-of-00001.safetensors", "safetensors"),
    ("frameworks/hf_dcp.expected/model.safetensors.index.json", "sharded"),
    ("frameworks/hf_dcp.expected.pt", "zip"),
    ("frameworks/hf_dcp_consolidated", "sharded"),
    ("frameworks/hf_dcp_consolidated/model-00001-of-00002.safetensors", "safetensors"),
    ("frameworks/hf_dcp_consolidated/model-00002-of-00002.safetensors", "safetensors"),
    ("frameworks/hf_dcp_consolidated/model.safetensors.index.json", "sharded"),
    ("frameworks/hf_dcp_consolidated/sharded", "dcp-hf"),
    ("frameworks/hf_dcp_consolidated/sharded/shard-00001-model-00001-of-00002.safetensors", "dcp-hf"),
    ("frameworks/hf_dcp_consolidated/sharded/shard-00001-model-00002-of-00002.safetensors", "dcp-hf"),
    ("frameworks/hf_dcp_consolidated/sharded/shard-00002-model-00001-of-00002.safetensors", "dcp-hf"),
    ("frameworks/hf_dcp_consolidated/sharded/shard-00002-model-00002-of-00002.safetensors", "dcp-hf"),
    ("frameworks/hf_dcp_ints", "dcp-hf"),
    ("frameworks/hf_dcp_ints/shard-00001-model-00001-of-00001.safetensors", "dcp-hf"),
    ("frameworks/hf_dcp_ints/shard-00002-model-00001-of-00001.safetensors", "dcp-hf"),
    ("frameworks/hf_dcp_ints.expected.pt", "zip"),
    ("frameworks/lightning_deepspeed", "deepspeed"),
    ("frameworks/lightning_deepspeed/checkpoint", "deepspeed"),
    ("frameworks/lightning_deepspeed/checkpoint/mp_rank_00_model_states.pt", "deepspeed"),
    ("frameworks/lightning_deepspeed/checkpoint/zero_pp_rank_0_mp_rank_00_optim_states.pt", "deepspeed"),
    ("frameworks/lightning_deepspeed/checkpoint/zero_pp_rank_1_mp_rank_00_optim_states.pt", "deepspeed"),
    ("frameworks/lightning_deepspeed/latest", "! PATH: a text file, not a checkpoint"),
    ("frameworks/lightning_deepspeed.expected.pt", "zip"),
    ("frameworks/lightning_fsdp", "dcp"),
    ("frameworks/lightning_fsdp/.metadata", "dcp"),
    ("frameworks/lightning_fsdp/__0_0.distcp", "dcp"),
    ("frameworks/lightning_fsdp/__1_0.distcp", "dcp"),
    ("frameworks/lightning_fsdp/meta.pt", "zip"),
    ("frameworks/lightning_fsdp.expected.pt", "zip"),
    ("frameworks/trainer_deepspeed", "! PATH: no checkpoint in this folder: 1 folder (checkpoint-2/); open a s"),
    ("frameworks/trainer_deepspeed/checkpoint-2", "safetensors"),
    (
        "frameworks/trainer_deepspeed/checkpoint-2/config.json",
        "! PATH: JSON without a weight_map: not a sharded checkpoint index",
    ),
    (
        "frameworks/trainer_deepspeed/checkpoint-2/generation_config.json",
        "! PATH: JSON without a weight_map: not a sharded checkpoint index",
    ),
    ("frameworks/trainer_deepspeed/checkpoint-2/global_step2", "deepspeed"),
    ("frameworks/trainer_deepspeed/checkpoint-2/global_step2/mp_rank_00_model_states.pt", "deepspeed"),
    ("frameworks/trainer_deepspeed/checkpoint-2/global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt", "deepspeed"),
    ("frameworks/trainer_deepspeed/checkpoint-2/latest", "! PATH: a text file, not a checkpoint"),
    ("frameworks/trainer_deepspeed/checkpoint-2/model.safetensors", "safetensors"),
    ("frameworks/trainer_deepspeed/checkpoint-2/rng_state.pth", "zip"),
    ("frameworks/trainer_deepspeed/checkpoint-2/scheduler.pt", "zip"),
    (
        "frameworks/trainer_deepspeed/checkpoint-2/trainer_state.json",
        "! PATH: JSON without a weight_map: not a sharded checkpoint index",
    ),
    ("frameworks/trainer_deepspeed/checkpoint-2/training_args.bin", "zip"),
    ("frameworks/zero0_bf16", "deepspeed"),
    ("frameworks/zero0_bf16/global_step2", "deepspeed"),
    ("frameworks/zero0_bf16/global_step2/mp_rank_00_model_states.pt", "deepspeed"),
    ("frameworks/zero0_bf16/latest", "! PATH: a text file, not a checkpoint"),
    ("frameworks/zero0_bf16.expected.pt", "zip"),
    ("frameworks/zero0_bf16_optim", "deepspeed"),
    ("frameworks/zero0_bf16_optim/global_step2", "deepspeed"),
    ("frameworks/zero0_bf16_optim/global_step2/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "deepspeed"),
    ("frameworks/zero0_bf16_optim/global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "deepspeed"),
    ("frameworks/zero0_bf16_optim/global_step2/mp_rank_00_model_states.pt", "deepspeed"),
    ("frameworks/zero0_bf16_optim/latest", "! PATH: a text file, not a checkpoint"),
    ("frameworks/zero0_bf16_optim.expected.pt", "zip"),
    ("frameworks/zero0_fp16", "deepspeed"),
    ("frameworks/zero0_fp16/global_step2", "deepspeed"),
    ("frameworks/zero0_fp16/global_step2/mp_rank_00_model_states.pt", "deepspeed"),
    ("frameworks/zero0_fp16/latest", "! PATH: a text file, not a checkpoint"),
    ("frameworks/zero0_fp16.expected.pt", "zip"),
    ("frameworks/zero1_pipeline", "deepspeed"),
    ("frameworks/zero1_pipeline/global_step2", "deepspeed"),
    ("frameworks/zero1_pipeline/global_step2/layer_00-model_states.pt", "zip"),
    ("frameworks/zero1_pipeline/global_step2/layer_01-model_states.pt", "zip"),
    ("frameworks/zero1_pipeline/global_step2/layer_02-model_states.pt", "zip"),
    ("frameworks/zero1_pipeline/global_step2/layer_03-model_states.pt", "zip"),
    ("frameworks/zero1_pipeline/global_step2/layer_04-model_states.pt", "zip"),
    ("frameworks/zero1_pipeline/global_step2/mp_rank_00_model_states.pt", "deepspeed"),
    ("frameworks/zero1_pipeline/global_step2/mp_rank_01_model_states.pt", "deepspeed"),
    ("frameworks/zero1_pipeline/global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt", "deepspeed"),
    ("frameworks/zero1_pipeline/global_step2/zero_pp_rank_0_mp_rank_01_optim_states.pt", "deepspeed"),
    ("frameworks/zero1_pipeline/latest", "! PATH: a text file, not a checkpoint"),
    ("frameworks/zero1_pipeline.expected.pt", "zip"),
    ("peft", "! PATH: a folder of 3 separate checkpoints, not one save: open one (ckpt"),
    ("peft/lora_run.ckpt", "zip"),
    ("peft/merged.pth", "zip"),
    ("peft/plain.pth", "zip"),
    ("torch_distributed", "! PATH: a folder of 2 separate checkpoints, not one save: open one (ckpt"),
    ("torch_distributed/dcp_fsdp2", "dcp"),
    ("torch_distributed/dcp_fsdp2/.metadata", "dcp"),
    ("torch_distributed/dcp_fsdp2/__0_0.distcp", "dcp"),
    ("torch_distributed/dcp_fsdp2/__1_0.distcp", "dcp"),
    ("torch_distributed/dcp_fsdp2.expected.pt", "zip"),
    # (read with zstandard or pyzstd installed, as torch reads it; without, refused naming what to install)
    (
        "torch_distributed/dcp_zstd",
        "dcp" if ZSTD else "! PATH/.metadata: DCP metadata: 'epoch': compressed with zstd (torch's D",
    ),
    (
        "torch_distributed/dcp_zstd/.metadata",
        "dcp" if ZSTD else "! PATH: DCP metadata: 'epoch': compressed with zstd (torch's DCP extensi",
    ),
    (
        "torch_distributed/dcp_zstd/__0_0.distcp",
        "dcp" if ZSTD else "! FIXTURES/torch_distributed/dcp_zstd/.metadata: DCP metadata: 'epoch': ",
    ),
    ("torch_distributed/dcp_zstd.expected.pt", "zip"),
    ("torch_distributed/ddp", "folder"),
    ("torch_distributed/ddp/rank0.pt", "zip"),
    ("torch_distributed/ddp/rank1.pt", "zip"),
    ("torch_distributed/ddp/rank2.pt", "zip"),
    ("torch_distributed/dtensor", "folder"),
    ("torch_distributed/dtensor/expected_full.pt", "zip"),
    ("torch_distributed/dtensor/model_rank0.pt", "ranks"),
    ("torch_distributed/dtensor/model_rank1.pt", "ranks"),
    ("torch_distributed/fsdp1_local", "ranks"),
    ("torch_distributed/fsdp1_local/model_rank0.pt", "ranks"),
    ("torch_distributed/fsdp1_local/model_rank1.pt", "ranks"),
    ("torch_distributed/fsdp1_sharded", "folder"),
    ("torch_distributed/fsdp1_sharded/expected_full.pt", "zip"),
    ("torch_distributed/fsdp1_sharded/model_rank0.pt", "ranks"),
    ("torch_distributed/fsdp1_sharded/model_rank1.pt", "ranks"),
]
"""Every folder and file under ``tests/fixtures``, as it opened before detection became a table
(``! ...``: the one-line error, its path written PATH)."""


def opened_as(path: Path | list[Path]) -> str:
    """The format a path opens as (with the count of loader problems said), or ``! `` and its error."""
    try:
        checkpoint = open_checkpoint([str(p) for p in path] if isinstance(path, list) else str(path))
    except ReadError as exc:
        # (a file's error may name another of its folder: that path is written from FIXTURES)
        return "! " + str(exc).replace(str(path), "PATH").replace(str(FIXTURES), "FIXTURES")[:70]
    problems = len(checkpoint.loader_problems)
    return checkpoint.format + (f" ({problems} loader problems)" if problems else "")


def test_every_fixture_opens_as_it_did() -> None:
    found = [(str(p.relative_to(FIXTURES)), opened_as(p)) for p in sorted(FIXTURES.rglob("*"))]
    assert found == FIXTURE_FORMATS


def made_files(folder: Path) -> dict[str, Path | list[Path]]:
    """One file (or folder) of each kind torch, safetensors and DCP write, and the kinds that are refused."""
    state = tiny_state_dict()
    torch.save(state, folder / "zip.pth")
    torch.save(state, folder / "legacy.pth", _use_new_zipfile_serialization=False)
    (folder / "plain.pkl").write_bytes(pickle.dumps({"epoch": 3, "lr": [0.1]}, protocol=2))
    write_safetensors(dict(state), folder / "model.safetensors")
    (folder / "hf").mkdir()
    write_sharded_safetensors(dict(state), folder / "hf")
    (folder / "bin").mkdir()
    write_sharded_bin(dict(state), folder / "bin")
    write_dcp({"model": dict(state)}, folder / "dcp")
    write_torchscript(folder / "script.pt")
    # the members torch's pre-0.4 tar form holds (_legacy_load reads storages, tensors, then pickle)
    (folder / "none.pkl").write_bytes(pickle.dumps(0, protocol=2))
    with tarfile.open(folder / "old.tar", "w") as tar:
        tar.add(folder / "none.pkl", arcname="storages")
        tar.add(folder / "none.pkl", arcname="tensors")
        tar.add(folder / "plain.pkl", arcname="pickle")
    (folder / "none.pkl").unlink()
    (folder / "notes.txt").write_text("not a checkpoint\n")
    (folder / "empty.pt").write_bytes(b"")
    (folder / "noise.bin").write_bytes(bytes(range(250, 256)) * 8)
    (folder / "zip.safetensors").write_bytes((folder / "zip.pth").read_bytes())
    return {
        "zip": folder / "zip.pth",
        "legacy": folder / "legacy.pth",
        "pickle": folder / "plain.pkl",
        "safetensors": folder / "model.safetensors",
        "sharded index": folder / "hf" / "model.safetensors.index.json",
        "sharded folder": folder / "hf",
        "sharded bin": folder / "bin",
        "dcp": folder / "dcp",
        "torchscript": folder / "script.pt",
        "tar": folder / "old.tar",
        "text": folder / "notes.txt",
        "empty": folder / "empty.pt",
        "noise": folder / "noise.bin",
        "zip named safetensors": folder / "zip.safetensors",
        "ranks": [FIXTURES / "torch_distributed" / "fsdp1_local" / f"model_rank{r}.pt" for r in (0, 1)],
    }


MADE_FORMATS = {
    "zip": "zip",
    "legacy": "legacy",
    "pickle": "pickle",
    "safetensors": "safetensors",
    "sharded index": "sharded",
    "sharded folder": "sharded",
    "sharded bin": "sharded",
    "dcp": "dcp",
    "torchscript": "torchscript",
    "tar": "! PATH: a tar archive: torch.load reads it in the pre-0.4 torch tar form",
    "text": "! PATH: a text file, not a checkpoint",
    "empty": "! PATH: empty file",
    "noise": "! PATH: not a checkpoint (unrecognised content: fa fb fc fd fe ff fa fb)",
    "zip named safetensors": "zip (1 loader problems)",
    "ranks": "ranks",
}
"""What each kind opened as before detection became a table."""


def test_every_kind_torch_safetensors_and_dcp_write_opens_as_it_did(tmp_path: Path) -> None:
    assert {kind: opened_as(path) for kind, path in made_files(tmp_path).items()} == MADE_FORMATS


def test_every_format_has_a_row_and_a_display_name() -> None:
    detected = {f for row in DETECTION for f in row.formats}
    assert detected == set(FORMAT_IDS)
    for row in DETECTION:
        assert len(row.names) == len(row.formats) and all(row.names)
    assert all(FORMAT_NAMES[f] for f in FORMAT_IDS)


@pytest.mark.parametrize("scope", ["place", "folder", "file"])
def test_rows_of_each_scope_keep_the_loaders_order(scope: str) -> None:
    order = [row.formats for row in DETECTION if row.scope == scope]
    expected = {
        "place": [("dcp",), ("deepspeed",)],
        "folder": [("dcp-hf",), ("sharded",), ("ranks",), ("folder",)],
        "file": [("safetensors",), ("zip", "torchscript"), (), ("sharded",), (), ("legacy", "pickle")],
    }
    assert order == expected[scope]
