"""Write small distributed checkpoints with torch's own code: 2 (or 3) gloo processes on CPU.

Run from the repository root with the shared venv (torch 2.13.0 CPU):

    python scripts/make_torch_distributed_fixtures.py tests/fixtures/torch_distributed

Each case is written by the real framework (``dcp.save``, FSDP1, FSDP2/DTensor, DDP) and comes with its
ground truth: ``dcp_to_torch_save`` on the DCP folders, and the full state_dict gathered by the framework
itself (``FULL_STATE_DICT``, ``DTensor.full_tensor()``) for the per-rank files. Tensors are seeded and
tiny, so the folder weighs a few hundred kB.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 2


class Net(nn.Module):
    """Small, with a BatchNorm (per-rank running stats under DDP) and a tied pair of weights."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.fc1 = nn.Linear(8, 12)
        self.bn = nn.BatchNorm1d(12)
        self.fc2 = nn.Linear(12, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.bn(self.fc1(self.embed(x).mean(1)))))


def _train(model: nn.Module, rank: int, steps: int = 2) -> torch.optim.Optimizer:
    optim = torch.optim.AdamW(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        batch = torch.randint(0, 10, (6, 3), generator=generator)
        model(batch).pow(2).mean().backward()
        optim.step()
        optim.zero_grad()
    return optim


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker(rank: int, world: int, port: int, case: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    try:
        CASES[case](rank, Path(out))
    finally:
        dist.barrier()
        dist.destroy_process_group()


def case_dcp_fsdp2(rank: int, out: Path) -> None:
    """FSDP2 (fully_shard) model and optimizer through ``get_state_dict`` and ``dcp.save``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    model = Net()
    fully_shard(model.fc1)
    fully_shard(model)
    optim = _train(model, rank)
    model_sd, optim_sd = get_state_dict(model, optim)
    dcp.save({"model": model_sd, "optim": optim_sd, "step": 2, "note": "fsdp2"}, checkpoint_id=str(out / "dcp_fsdp2"))


def case_dtensor(rank: int, out: Path) -> None:
    """DTensors saved with ``torch.save`` per rank: FSDP2 parameters (Shard(0)) plus a Shard(1) tensor."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (WORLD,))
    model = Net()
    fully_shard(model, mesh=mesh)
    _train(model, rank)
    state = model.state_dict()
    extra = distribute_tensor(torch.arange(30, dtype=torch.float32).reshape(3, 10), mesh, [Shard(1)])
    state["extra.column_sharded"] = extra
    (out / "dtensor").mkdir(exist_ok=True)
    torch.save(state, out / "dtensor" / f"model_rank{rank}.pt")
    full = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in state.items()}
    if rank == 0:
        torch.save(full, out / "dtensor" / "expected_full.pt")


def case_fsdp1(rank: int, out: Path) -> None:
    """FSDP1 SHARDED_STATE_DICT and LOCAL_STATE_DICT saved per rank; FULL_STATE_DICT as ground truth."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType

    model = FSDP(Net(), device_id=torch.device("cpu"), use_orig_params=True)
    _train(model, rank)
    for kind, name in ((StateDictType.SHARDED_STATE_DICT, "sharded"), (StateDictType.LOCAL_STATE_DICT, "local")):
        with FSDP.state_dict_type(model, kind):
            state = model.state_dict()
        (out / f"fsdp1_{name}").mkdir(exist_ok=True)
        torch.save(state, out / f"fsdp1_{name}" / f"model_rank{rank}.pt")
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):
        full = model.state_dict()
    if rank == 0:
        torch.save(full, out / "fsdp1_sharded" / "expected_full.pt")


def case_ddp(rank: int, out: Path) -> None:
    """DDP: every rank saves its own copy; BatchNorm running stats differ per rank (no SyncBatchNorm)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(Net())
    _train(model, rank)
    (out / "ddp").mkdir(exist_ok=True)
    torch.save(model.state_dict(), out / "ddp" / f"rank{rank}.pt")


CASES = {"dcp_fsdp2": case_dcp_fsdp2, "dtensor": case_dtensor, "fsdp1": case_fsdp1, "ddp": case_ddp}


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/torch_distributed")
    out.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        world = 3 if case == "ddp" else WORLD
        mp.spawn(_worker, args=(world, _free_port(), case, str(out)), nprocs=world, join=True)
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(out / "dcp_fsdp2", out / "dcp_fsdp2.expected.pt")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
