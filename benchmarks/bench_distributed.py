"""Consolidating distributed checkpoints: ckpt-tui against cp and the framework's own converter.

Builds (once, under --dir) a model of --size-mb saved on 2 gloo ranks as: DCP by FSDP2; DCP through
torch's ``HuggingFaceStorageWriter(save_distributed=True)``; FSDP1 ``SHARDED_STATE_DICT`` saved with
``torch.save`` per rank; and, with DeepSpeed (from .venv-ds or .venv-fw, see
scripts/make_framework_fixtures.py), ZeRO-2 and ZeRO disabled (stage 0). Then measures, each in a fresh
process: opening the folder (tree ready), ``ckpt-tui convert`` to one ``.safetensors`` (wall time and
peak RSS), ``cp`` of the same bytes, and the framework's own way to one file on the same folder:
``dcp_to_torch_save``, ``consolidate_safetensors_files``, FSDP1's ``ShardedTensor.gather`` on 2 gloo
ranks, DeepSpeed's ``zero_to_fp32``, and for stage 0 ``torch.load`` + ``torch.save`` of the module.
Run from the repository root (``--only NAME`` for some layouts):

    python benchmarks/bench_distributed.py --size-mb 2000 --dir /tmp/bench-distributed
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DS_PYTHON = next(
    (p for p in (ROOT / ".venv-ds" / "bin" / "python", ROOT / ".venv-fw" / "bin" / "python") if p.exists()),
    ROOT / ".venv-ds" / "bin" / "python",
)

BUILD_DCP = """
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
from torch import nn
def work(rank, out, width, layers, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    for layer in model: fully_shard(layer)
    fully_shard(model)
    dcp.save({"model": model.state_dict()}, checkpoint_id=out)
    dist.destroy_process_group()
if __name__ == "__main__":
    out, width, layers, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    mp.spawn(work, args=(out, width, layers, port), nprocs=2, join=True)
"""

BUILD_ZERO = """
import os, sys, torch, torch.multiprocessing as mp
from torch import nn
def work(rank, out, width, layers, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2},
              "zero_allow_untested_optimizer": True}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optim, config=config)
    loss = engine(torch.randn(1, width)).sum()
    engine.backward(loss)
    engine.step()
    engine.save_checkpoint(out)
if __name__ == "__main__":
    out, width, layers, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    mp.spawn(work, args=(out, width, layers, port), nprocs=2, join=True)
"""

BUILD_HF = """
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
from torch import nn
def work(rank, out, width, layers, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    for layer in model: fully_shard(layer)
    fully_shard(model)
    dcp.save(model.state_dict(), storage_writer=HuggingFaceStorageWriter(out, save_distributed=True))
    dist.destroy_process_group()
if __name__ == "__main__":
    out, width, layers, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    mp.spawn(work, args=(out, width, layers, port), nprocs=2, join=True)
"""

BUILD_FSDP1 = """
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
from torch import nn
def work(rank, out, width, layers, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType
    torch.manual_seed(0)
    model = FSDP(nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)]), device_id=torch.device("cpu"))
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        state = model.state_dict()
    os.makedirs(out, exist_ok=True)
    torch.save(state, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()
if __name__ == "__main__":
    out, width, layers, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    mp.spawn(work, args=(out, width, layers, port), nprocs=2, join=True)
"""

GATHER_FSDP1 = """
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp

import measure  # noqa: F401  (compiles ckpt-tui's bytecode once: runs are timed as installed)
def work(rank, folder, target, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    state = torch.load(os.path.join(folder, f"rank{rank}.pt"), weights_only=False)
    full = {}
    for key, value in state.items():
        whole = torch.empty(value.size(), dtype=value.dtype) if rank == 0 else None
        value.gather(0, whole)
        full[key] = whole
    if rank == 0:
        torch.save(full, target)
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(work, args=(sys.argv[1], sys.argv[2], sys.argv[3]), nprocs=2, join=True)
"""

BUILD_ZERO0 = (
    BUILD_ZERO.replace('"stage": 2', '"stage": 0')
    .replace('"untested_optimizer": True}', '"untested_optimizer": True, "bf16": {"enabled": True}}')
    .replace("torch.randn(1, width)", "torch.randn(1, width, dtype=torch.bfloat16)")
)

OPEN = "import time,sys; t=time.perf_counter(); from ckpt_tui.core.readers.open import open_checkpoint; "
OPEN += "open_checkpoint(sys.argv[1]); print(time.perf_counter()-t)"


def measure(command: list[str], env: dict[str, str] | None = None) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one child process."""
    start = time.perf_counter()
    pid = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL).pid
    _, status, usage = os.wait4(pid, 0)
    if status != 0:
        raise SystemExit(f"failed ({status}): {' '.join(command)}")
    return time.perf_counter() - start, usage.ru_maxrss * 1024


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


BUILDS = {  # folder: (build script, python, port)
    "dcp_fsdp2": (BUILD_DCP, Path(sys.executable), "29611"),
    "zero2": (BUILD_ZERO, DS_PYTHON, "29612"),
    "hf_dcp": (BUILD_HF, Path(sys.executable), "29613"),
    "fsdp1_sharded": (BUILD_FSDP1, Path(sys.executable), "29614"),
    "zero0_bf16": (BUILD_ZERO0, DS_PYTHON, "29615"),
}


def build(folder: Path, size_mb: int, only: list[str]) -> None:
    width = 2048
    layers = max(1, size_mb * 1_000_000 // (4 * width * (width + 1)))
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    for name, (code, python, port) in BUILDS.items():
        target = folder / name
        if target.exists() or not Path(python).exists() or (only and name not in only):
            continue
        script = folder / f"build_{target.name}.py"  # spawned ranks import their function from a file
        script.write_text(code)
        subprocess.run([str(python), str(script), str(target), str(width), str(layers), port], env=env, check=True)


def row(name: str, seconds: float, rss: int, base: float) -> str:
    return f"  {name:<34} {seconds:7.2f} s  {seconds / base:5.2f}x cp  peak RSS {rss / 2**20:7.0f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=2000)
    parser.add_argument("--dir", default="/tmp/bench-distributed")
    parser.add_argument("--only", nargs="*", default=[], help="layouts to build and measure (folder names)")
    args = parser.parse_args()
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    build(folder, args.size_mb, args.only)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name, (edits, framework) in CASES.items():
        source = folder / name
        if not source.exists() or (args.only and name not in args.only):
            continue
        out = folder / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        size = folder_bytes(source)
        print(f"{source.name}: {size / 1e9:.2f} GB in {len(list(source.rglob('*')))} files")
        opened, _ = measure([sys.executable, "-c", OPEN, str(source)], env)
        copy, copy_rss = measure(["cp", "-r", str(source), str(out / "copy")])
        ours = [sys.executable, "-m", "ckpt_tui", "convert", str(source), *edits, "-o", str(out / "m.safetensors")]
        mine, mine_rss = measure(ours, env)
        shutil.rmtree(out / "copy", ignore_errors=True)  # the disk holds one copy at a time
        reference, reference_rss = measure(
            reference_command(name, source, out, folder), {**env, "DS_ACCELERATOR": "cpu"}
        )
        print(f"  open (tree ready, whole process)   {opened:7.2f} s")
        print(row("cp -r", copy, copy_rss, copy))
        print(row("ckpt-tui convert -> .safetensors", mine, mine_rss, copy))
        print(row(framework, reference, reference_rss, copy))
        print(f"  ckpt-tui / {framework}: {mine / reference:.2f}x time, {mine_rss / reference_rss:.2f}x memory")
        shutil.rmtree(out, ignore_errors=True)


CASES = {  # folder: (convert options, the framework's own converter)
    "dcp_fsdp2": (["--extract", "model"], "dcp_to_torch_save"),
    "zero2": (["--extract", "auto"], "DeepSpeed zero_to_fp32"),
    "hf_dcp": ([], "consolidate_safetensors_files"),
    "fsdp1_sharded": ([], "ShardedTensor.gather (2 gloo ranks)"),
    "zero0_bf16": (["--extract", "auto"], "torch.load + save of the module"),
}


def reference_command(name: str, source: Path, out: Path, folder: Path) -> list[str]:
    """The framework's own way from the folder to one file."""
    if name == "dcp_fsdp2":
        code = (
            "import sys; from torch.distributed.checkpoint.format_utils import dcp_to_torch_save as f; f(*sys.argv[1:])"
        )
        return [sys.executable, "-c", code, str(source), str(out / "theirs.pt")]
    if name == "hf_dcp":
        code = "import sys, json; from torch.distributed.checkpoint._consolidate_hf_safetensors import "
        code += "consolidate_safetensors_files as f; from safetensors import safe_open; import glob; "
        code += "keys = {k for p in glob.glob(sys.argv[1] + '/*.safetensors') for k in safe_open(p, 'pt').keys()}; "
        code += "f(sys.argv[1], sys.argv[2], dict.fromkeys(keys, 1))"
        return [sys.executable, "-c", code, str(source), str(out)]
    if name == "fsdp1_sharded":
        script = folder / "gather_fsdp1.py"
        script.write_text(GATHER_FSDP1)
        return [sys.executable, str(script), str(source), str(out / "theirs.pt"), "29616"]
    if name == "zero0_bf16":
        code = "import sys, glob, torch; path = glob.glob(sys.argv[1] + '/*/mp_rank_00_model_states.pt')[0]; "
        code += "torch.save(torch.load(path, weights_only=False)['module'], sys.argv[2])"
        return [str(DS_PYTHON), "-c", code, str(source), str(out / "theirs.pt")]
    code = "import sys; from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict as f; "
    code += "f(sys.argv[1], sys.argv[2], max_shard_size=None)"
    return [str(DS_PYTHON), "-c", code, str(source), str(out / "theirs")]


if __name__ == "__main__":
    main()
