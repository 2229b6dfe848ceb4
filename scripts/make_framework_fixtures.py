"""Write small checkpoints in the layouts training frameworks write, with the framework itself, on CPU.

Run from the repository root (2 gloo processes on 127.0.0.1 per case):

    python scripts/make_framework_fixtures.py tests/fixtures/frameworks               # torch only
    DS_ACCELERATOR=cpu .venv-fw/bin/python scripts/make_framework_fixtures.py \\
        tests/fixtures/frameworks deepspeed lightning accelerate_deepspeed   # DeepSpeed, Lightning, Accelerate

``.venv-fw`` is a venv that sees the shared one (a ``.pth`` file naming its site-packages) plus
``DS_BUILD_OPS=0 pip install deepspeed==0.19.8 lightning==2.6.6 accelerate==1.15.0 transformers==4.57.1
torch==2.13.0`` (Accelerate's DeepSpeed plugin reads transformers' version). The group ``deepspeed016``
(``zero0_bf16_optim``) needs ``deepspeed==0.16.9`` in such a venv instead.

Each case folder holds only what the framework wrote; its ground truth sits beside it as
``<case>.expected.pt`` (or ``<case>.expected/``):

- ``hf_dcp``: ``dcp.save`` through ``HuggingFaceStorageWriter(save_distributed=True)`` from FSDP2 (two
  output files, so each rank writes ``shard-0000R-model-0000K-of-00002.safetensors``). Truth: torch's own
  reading (``_load_state_dict`` + ``HuggingFaceStorageReader`` + ``_EmptyStateDictLoadPlanner``,
  ``no_dist=True``) and ``consolidate_safetensors_files``'s output folder.
- ``hf_dcp_ints``: the whole state (an int64 buffer too), one file per rank. Truth: torch's reading
  (``consolidate_safetensors_files`` refuses int tensors: it sizes every dtype with ``torch.finfo``).
- ``hf_dcp_consolidated``: the same writer with ``enable_consolidation=True`` (torchtitan's HF save):
  ``sharded/`` holds the per-rank files, and torch's consolidated files and index sit beside it (the truth).
- ``fsdp1_optim`` / ``fsdp1_mesh``: FSDP1 ``SHARDED_STATE_DICT`` model and ``FSDP.optim_state_dict``
  saved per rank with ``torch.save`` (ShardedTensor values; with a device mesh, DTensor values). Truth:
  ``FULL_STATE_DICT`` model state and full ``FSDP.optim_state_dict`` of the same run.
- ``zero0_bf16`` / ``zero0_fp16``: DeepSpeed with ZeRO disabled. Truth: ``engine.module.state_dict()``.
- ``zero0_bf16_optim``: the same in bf16 with the optimizer named in the config, by DeepSpeed 0.16.9
  (DeepSpeed's BF16_Optimizer: fp32 master copies partitioned over the ranks). Truth:
  ``safe_get_full_fp32_param`` of each parameter.
- ``lightning_fsdp``: Lightning's ``save_checkpoint`` with the FSDP strategy (``state_dict_type="sharded"``:
  a DCP folder plus ``meta.pt``). Truth: Lightning's own ``consolidate_checkpoint``.
- ``zero1_pipeline``: DeepSpeed's ``PipelineModule`` in 2 stages, ZeRO-1 (``layer_NN-model_states.pt`` per layer).
  Truth: each stage's ``engine.module.state_dict()``, joined.
- ``lightning_deepspeed``: Lightning's DeepSpeed strategy (ZeRO-2), a DeepSpeed folder with Lightning's
  client state in the model states. Truth: DeepSpeed's own ``zero_to_fp32``.

Lightning refuses both strategies on CPU; each case says which one check it steps around (the training
and the saving are Lightning's own code).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 2


class Net(nn.Module):
    """Small: an embedding, two linears (one with odd sizes, so shards are uneven), a BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.fc1 = nn.Linear(8, 12)
        self.bn = nn.BatchNorm1d(12)
        self.fc2 = nn.Linear(12, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.bn(self.fc1(self.embed(x).mean(1)))))


class NormNet(Net):
    """``Net`` with a LayerNorm: DeepSpeed casts buffers to bf16 too, and bf16 batch_norm fails on CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.LayerNorm(12)  # type: ignore[assignment]


def _batches(rank: int, steps: int = 2) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + rank)
    return [torch.randint(0, 10, (6, 3), generator=generator) for _ in range(steps)]


def _train(model: nn.Module, rank: int) -> torch.optim.Optimizer:
    optim = torch.optim.AdamW(model.parameters(), lr=0.01)
    for batch in _batches(rank):
        model(batch).pow(2).mean().backward()
        optim.step()
        optim.zero_grad()
    return optim


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker(rank: int, world: int, port: int, case: str, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
    )
    if case not in SELF_INIT:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    try:
        CASES[case](rank, Path(out))
    finally:
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


def case_hf_dcp(rank: int, out: Path) -> None:
    """FSDP2 model state through the HF storage writer, every rank writing its own safetensors."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.fsdp import fully_shard

    model = Net()
    fully_shard(model.fc1)
    fully_shard(model)
    _train(model, rank)
    # torch's consolidate_safetensors_files sizes every dtype with torch.finfo, which refuses ints
    # (bn.num_batches_tracked): float tensors only, so both of torch's readings can be the truth
    state = {key: value for key, value in model.state_dict().items() if value.is_floating_point()}
    mapping = {key: 1 if key.startswith(("embed", "fc1")) else 2 for key in state}
    writer = HuggingFaceStorageWriter(str(out / "hf_dcp"), fqn_to_index_mapping=mapping, save_distributed=True)
    dcp.save(state, storage_writer=writer)


def case_hf_dcp_ints(rank: int, out: Path) -> None:
    """The whole state (``bn.num_batches_tracked`` an int64) through the HF writer: torch's reader is the truth."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.fsdp import fully_shard

    model = Net()
    fully_shard(model)
    _train(model, rank)
    writer = HuggingFaceStorageWriter(str(out / "hf_dcp_ints"), save_distributed=True)
    dcp.save(model.state_dict(), storage_writer=writer)


def case_hf_dcp_consolidated(rank: int, out: Path) -> None:
    """torchtitan's HF save (``last_save_in_hf``): the HF writer with ``enable_consolidation=True``, which
    leaves the per-rank files under ``sharded/`` and torch's consolidated HF files beside them."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.fsdp import fully_shard

    model = Net()
    fully_shard(model)
    _train(model, rank)
    state = {key: value for key, value in model.state_dict().items() if value.is_floating_point()}
    mapping = {key: 1 if key.startswith(("embed", "fc1")) else 2 for key in state}
    writer = HuggingFaceStorageWriter(
        str(out / "hf_dcp_consolidated"), fqn_to_index_mapping=mapping, save_distributed=True, enable_consolidation=True
    )
    dcp.save(state, storage_writer=writer)


def _fsdp1(rank: int, out: Path, name: str, mesh: bool) -> None:
    from torch.distributed.fsdp import FullOptimStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    kwargs: dict[str, object] = {"device_id": torch.device("cpu"), "use_orig_params": True}
    if mesh:
        from torch.distributed.device_mesh import init_device_mesh

        kwargs["device_mesh"] = init_device_mesh("cpu", (WORLD,))
    model = FSDP(Net(), **kwargs)  # type: ignore[arg-type]
    optim = _train(model, rank)
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        sharded = {"model": model.state_dict(), "optim": FSDP.optim_state_dict(model, optim)}
    (out / name).mkdir(exist_ok=True)
    torch.save(sharded, out / name / f"rank{rank}.pt")
    # offload_to_cpu=False: on CPU, torch's offload (value.cpu()) keeps every state a view of one gather
    # buffer that the next state name overwrites (exp_avg would read as exp_avg_sq); without it, a clone
    config = FullOptimStateDictConfig(offload_to_cpu=False)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, optim_state_dict_config=config):
        full = {"model": model.state_dict(), "optim": FSDP.optim_state_dict(model, optim)}
    if rank == 0:
        torch.save(full, out / f"{name}.expected.pt")


def case_fsdp1_optim(rank: int, out: Path) -> None:
    """FSDP1 SHARDED_STATE_DICT (ShardedTensor) model and optimizer, torch.save per rank."""
    _fsdp1(rank, out, "fsdp1_optim", mesh=False)


def case_fsdp1_mesh(rank: int, out: Path) -> None:
    """FSDP1 with a device mesh: the same, with DTensor values."""
    _fsdp1(rank, out, "fsdp1_mesh", mesh=True)


def _zero0(rank: int, out: Path, name: str, dtype: str) -> None:
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = NormNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    config = {
        "train_micro_batch_size_per_gpu": 6,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 0},
        "zero_allow_untested_optimizer": True,
        dtype: {"enabled": True},
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    for batch in _batches(rank):
        loss = engine(batch).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(str(out / name))
    if rank == 0:
        torch.save(engine.module.state_dict(), out / f"{name}.expected.pt")


def case_zero0_bf16_optim(rank: int, out: Path) -> None:
    """DeepSpeed 0.16, ZeRO disabled, bf16, the optimizer named in the config: DeepSpeed's BF16_Optimizer, whose
    fp32 master copies are partitioned over the ranks in ``bf16_zero_pp_rank_N_mp_rank_00_optim_states.pt``.
    Truth: each parameter's fp32 master copy (``safe_get_full_fp32_param``) and the buffers as saved."""
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = NormNet()
    config = {
        "train_micro_batch_size_per_gpu": 6,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
        "bf16": {"enabled": True},
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    for batch in _batches(rank):
        loss = engine(batch).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(str(out / "zero0_bf16_optim"))
    # every rank takes part in gathering each master copy
    truth = {name: safe_get_full_fp32_param(p).clone() for name, p in engine.module.named_parameters()}
    buffers = {name: b.detach().clone() for name, b in engine.module.named_buffers()}
    if rank == 0:
        torch.save({"fp32": truth, "buffers": buffers}, out / "zero0_bf16_optim.expected.pt")


def case_zero0_bf16(rank: int, out: Path) -> None:
    """DeepSpeed, ZeRO disabled, bf16."""
    _zero0(rank, out, "zero0_bf16", "bf16")


def case_zero0_fp16(rank: int, out: Path) -> None:
    """DeepSpeed, ZeRO disabled, fp16 (the unfused fp16 optimizer: a torch optimizer, not FusedAdam)."""
    _zero0(rank, out, "zero0_fp16", "fp16")


def _lightning_module() -> object:
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = NormNet()

        def training_step(self, batch: torch.Tensor, index: int) -> torch.Tensor:
            return self.net(batch).float().pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=0.01)

    return Module()


def _lightning(rank: int, out: Path, name: str, strategy: object) -> None:
    import lightning as L

    torch.manual_seed(0)
    module = _lightning_module()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=WORLD,
        strategy=strategy,  # type: ignore[arg-type]
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = torch.utils.data.DataLoader(torch.cat(_batches(rank) * 2), batch_size=6)
    trainer.fit(module, data)  # type: ignore[arg-type]
    trainer.save_checkpoint(str(out / name))
    EXPECTED[name](trainer, module, out / f"{name}.expected.pt")


def _lightning_consolidated(trainer: object, module: object, target: Path) -> None:
    """Lightning's own consolidation (``python -m lightning.pytorch.utilities.consolidate_checkpoint``)."""
    dist.barrier()
    if dist.get_rank() == 0:
        consolidate_lightning(Path(str(target).removesuffix(".expected.pt")), target)


def consolidate_lightning(folder: Path, target: Path) -> None:
    """What ``lightning.pytorch.utilities.consolidate_checkpoint`` writes for a sharded FSDP folder."""
    from lightning.fabric.utilities.load import _load_distributed_checkpoint
    from lightning.pytorch.utilities.consolidate_checkpoint import _format_checkpoint

    torch.save(_format_checkpoint(_load_distributed_checkpoint(folder)), target)


def _zero_to_fp32(trainer: object, module: object, target: Path) -> None:
    dist.barrier()
    if dist.get_rank() == 0:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        torch.save(get_fp32_state_dict_from_zero_checkpoint(str(target).removesuffix(".expected.pt")), target)


EXPECTED: dict[str, Callable[[object, object, Path], None]] = {
    "lightning_fsdp": _lightning_consolidated,
    "lightning_deepspeed": _zero_to_fp32,
}


def case_lightning_fsdp(rank: int, out: Path) -> None:
    """Lightning's FSDP strategy, ``state_dict_type="sharded"``: a DCP folder plus ``meta.pt``.

    Lightning refuses FSDP with ``accelerator="cpu"`` only when the strategy's type is exactly
    ``FSDPStrategy`` (``_check_strategy_and_fallback``), and hands FSDP1 the CUDA device index; FSDP1
    itself runs on CPU with gloo given ``device_id=cpu``. So a subclass that changes nothing, and FSDP1
    told its device, let Lightning's own code train and write the checkpoint.
    """
    import torch.distributed.fsdp as fsdp
    from lightning.pytorch.strategies import FSDPStrategy

    class CpuFSDPStrategy(FSDPStrategy):
        pass

    class CpuFSDP(fsdp.FullyShardedDataParallel):
        """FSDP1 as Lightning builds it, placed on the CPU (Lightning passes the CUDA index, None here)."""

        def __init__(self, *args: object, device_id: object = None, **kwargs: object) -> None:
            super().__init__(*args, device_id=torch.device("cpu"), **kwargs)  # type: ignore[arg-type]

    fsdp.FullyShardedDataParallel = CpuFSDP  # type: ignore[misc]

    strategy = CpuFSDPStrategy(state_dict_type="sharded", process_group_backend="gloo")
    _lightning(rank, out, "lightning_fsdp", strategy)


def case_lightning_deepspeed(rank: int, out: Path) -> None:
    """Lightning's DeepSpeed strategy (ZeRO-2): a DeepSpeed folder named like a .ckpt file.

    ``DeepSpeedStrategy.setup_environment`` refuses any accelerator but CUDA and ``setup_distributed`` wants
    CUDA device indices; DeepSpeed itself runs on CPU (``DS_ACCELERATOR=cpu``), so those two checks are
    skipped and the device carries the local rank; the rest is Lightning's own code.
    """
    from lightning.fabric.utilities.seed import reset_seed
    from lightning.pytorch.strategies import DeepSpeedStrategy
    from lightning.pytorch.strategies.ddp import DDPStrategy

    class CpuDeepSpeedStrategy(DeepSpeedStrategy):
        def setup_environment(self) -> None:
            DDPStrategy.setup_environment(self)

        def setup_distributed(self) -> None:
            # Lightning checks that CUDA device indices equal the local ranks; CPU devices have no index
            reset_seed()
            self.set_world_ranks()
            self._init_deepspeed_distributed()

        @property
        def root_device(self) -> torch.device:
            return torch.device("cpu", self.local_rank)  # DeepSpeed reads the rank from the device index

    strategy = CpuDeepSpeedStrategy(stage=2, process_group_backend="gloo")
    _lightning(rank, out, "lightning_deepspeed", strategy)


def case_accelerate_deepspeed(rank: int, out: Path) -> None:
    """Accelerate's ``save_state`` with its DeepSpeed plugin (ZeRO-2): a DeepSpeed folder (``latest``,
    ``pytorch_model/``) beside Accelerate's own files. Truth: DeepSpeed's own ``zero_to_fp32``."""
    from accelerate import Accelerator, DeepSpeedPlugin

    torch.manual_seed(0)
    plugin = DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=1)
    plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 6
    plugin.deepspeed_config["train_batch_size"] = 6 * WORLD
    plugin.deepspeed_config["zero_allow_untested_optimizer"] = True
    accelerator = Accelerator(deepspeed_plugin=plugin)
    model = NormNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    for batch in _batches(rank):
        accelerator.backward(model(batch).float().pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    accelerator.save_state(str(out / "accelerate_deepspeed"))
    accelerator.wait_for_everyone()
    if rank == 0:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state = get_fp32_state_dict_from_zero_checkpoint(str(out / "accelerate_deepspeed"))
        torch.save(state, out / "accelerate_deepspeed.expected.pt")


def case_zero1_pipeline(rank: int, out: Path) -> None:
    """DeepSpeed's ``PipelineModule`` over 2 stages (one per rank), ZeRO-1: ``global_stepN/`` holds each layer's
    state_dict as ``layer_NN-model_states.pt``, beside the stages' model states (module None) and optimizer
    states. Truth: the module's own ``state_dict()`` on each stage, joined (each stage holds its layers)."""
    import deepspeed
    from deepspeed.pipe import PipelineModule

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    layers = [nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 7), nn.LayerNorm(7), nn.Linear(7, 3)]
    module = PipelineModule(layers=layers, num_stages=WORLD, loss_fn=lambda out, y: (out - y).pow(2).mean())
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 1}}
    optimizer = torch.optim.Adam(module.parameters(), lr=0.01)
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)
    generator = torch.Generator().manual_seed(7)
    data = iter([(torch.randn(2, 5, generator=generator), torch.randn(2, 3, generator=generator)) for _ in range(4)])
    for _ in range(2):
        engine.train_batch(data_iter=data)
    engine.save_checkpoint(str(out / "zero1_pipeline"))
    stages: list[dict[str, torch.Tensor] | None] = [None] * WORLD
    dist.all_gather_object(stages, {key: value.clone() for key, value in engine.module.state_dict().items()})
    if rank == 0:
        torch.save(
            {key: value for stage in stages if stage for key, value in stage.items()},
            out / "zero1_pipeline.expected.pt",
        )


CASES: dict[str, Callable[[int, Path], None]] = {
    "hf_dcp": case_hf_dcp,
    "hf_dcp_consolidated": case_hf_dcp_consolidated,
    "hf_dcp_ints": case_hf_dcp_ints,
    "fsdp1_optim": case_fsdp1_optim,
    "fsdp1_mesh": case_fsdp1_mesh,
    "zero0_bf16": case_zero0_bf16,
    "zero0_fp16": case_zero0_fp16,
    "zero0_bf16_optim": case_zero0_bf16_optim,
    "lightning_fsdp": case_lightning_fsdp,
    "lightning_deepspeed": case_lightning_deepspeed,
    "accelerate_deepspeed": case_accelerate_deepspeed,
    "zero1_pipeline": case_zero1_pipeline,
}
GROUPS = {
    "torch": ["hf_dcp", "hf_dcp_consolidated", "hf_dcp_ints", "fsdp1_optim", "fsdp1_mesh"],
    "deepspeed": ["zero0_bf16", "zero0_fp16", "zero1_pipeline"],
    # (DeepSpeed 0.19.8 keeps stage 0's bf16 optimizer state in the model states: this one was written with 0.16.9)
    "deepspeed016": ["zero0_bf16_optim"],
    "lightning": ["lightning_fsdp", "lightning_deepspeed"],
}
SELF_INIT = {
    "zero0_bf16",
    "zero0_fp16",
    "zero0_bf16_optim",
    "lightning_fsdp",
    "lightning_deepspeed",
    "accelerate_deepspeed",
    "zero1_pipeline",
}


def _hf_read(folder: Path) -> dict[str, torch.Tensor]:
    """torch's own reading of an HF-DCP folder."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, torch.Tensor] = {}
    reader = HuggingFaceStorageReader(str(folder))
    _load_state_dict(state, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    return state


def _hf_truth(out: Path) -> None:
    """torch's own reading of the HF DCP folder, and its consolidation to plain HF safetensors."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, torch.Tensor] = {}
    reader = HuggingFaceStorageReader(str(out / "hf_dcp"))
    _load_state_dict(state, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    torch.save(state, out / "hf_dcp.expected.pt")
    target = out / "hf_dcp.expected"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir()
    consolidate_safetensors_files(str(out / "hf_dcp"), str(target), dict.fromkeys(state, 1))


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/frameworks")
    groups = sys.argv[2:] or ["torch"]
    cases = [case for group in groups for case in GROUPS.get(group, [group])]
    out.mkdir(parents=True, exist_ok=True)
    for case in cases:
        shutil.rmtree(out / case, ignore_errors=True)
        mp.spawn(_worker, args=(WORLD, _free_port(), case, str(out)), nprocs=WORLD, join=True)
        for script in [*(out / case).glob("zero_to_fp32.py"), *(out / case).glob("zero_to_torch.py")]:
            script.unlink()  # DeepSpeed copies its converter beside the checkpoint; not ours to commit
        if case == "hf_dcp":
            _hf_truth(out)
        if case == "hf_dcp_ints":
            torch.save(_hf_read(out / case), out / f"{case}.expected.pt")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
