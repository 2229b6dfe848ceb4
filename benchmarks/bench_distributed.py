"""Consolidating distributed checkpoints: ckpt-tui against cp and the framework's own converter.

Builds (once, under --dir) a model of --size-mb saved as DCP by FSDP2 on 2 gloo ranks and as
DeepSpeed ZeRO-2 on 2 ranks (DeepSpeed from .venv-ds, see scripts/make_deepspeed_fixtures.py), then
measures, each in a fresh process: opening the folder (tree ready), ``ckpt-tui convert`` to one
``.safetensors`` (wall time and peak RSS), ``cp`` of the same bytes, and ``dcp_to_torch_save`` /
DeepSpeed's ``zero_to_fp32`` on the same folder. Run from the repository root:

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
DS_PYTHON = ROOT / ".venv-ds" / "bin" / "python"

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


def build(folder: Path, size_mb: int) -> tuple[Path, Path]:
    width = 2048
    layers = max(1, size_mb * 1_000_000 // (4 * width * (width + 1)))
    dcp, zero = folder / "dcp_fsdp2", folder / "zero2"
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    for target, code, python, port in (
        (dcp, BUILD_DCP, sys.executable, "29611"),
        (zero, BUILD_ZERO, DS_PYTHON, "29612"),
    ):
        if target.exists() or not Path(python).exists():
            continue
        script = folder / f"build_{target.name}.py"  # spawned ranks import their function from a file
        script.write_text(code)
        subprocess.run([str(python), str(script), str(target), str(width), str(layers), port], env=env, check=True)
    return dcp, zero


def row(name: str, seconds: float, rss: int, base: float) -> str:
    return f"  {name:<34} {seconds:7.2f} s  {seconds / base:5.2f}x cp  peak RSS {rss / 2**20:7.0f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=2000)
    parser.add_argument("--dir", default="/tmp/bench-distributed")
    args = parser.parse_args()
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    dcp, zero = build(folder, args.size_mb)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cases = [(dcp, ["--extract", "model"], "dcp_to_torch_save")]
    if zero.exists():
        cases.append((zero, ["--extract", "fp32_weights"], "DeepSpeed zero_to_fp32"))
    for source, edits, framework in cases:
        out = folder / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        size = folder_bytes(source)
        print(f"{source.name}: {size / 1e9:.2f} GB in {len(list(source.rglob('*')))} files")
        opened, _ = measure([sys.executable, "-c", OPEN, str(source)], env)
        copy, copy_rss = measure(["cp", "-r", str(source), str(out / "copy")])
        ours = [sys.executable, "-m", "ckpt_tui", "convert", str(source), *edits, "-o", str(out / "m.safetensors")]
        mine, mine_rss = measure(ours, env)
        if framework.startswith("dcp"):
            code = "import sys; from torch.distributed.checkpoint.format_utils import dcp_to_torch_save as f; "
            code += "f(*sys.argv[1:])"
            theirs = [sys.executable, "-c", code, str(source), str(out / "theirs.pt")]
            reference, reference_rss = measure(theirs, env)
        else:
            code = (
                "import sys; from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict as f; "
            )
            code += "f(sys.argv[1], sys.argv[2], max_shard_size=None)"
            theirs = [str(DS_PYTHON), "-c", code, str(source), str(out / "theirs")]
            reference, reference_rss = measure(theirs, {**env, "DS_ACCELERATOR": "cpu"})
        print(f"  open (tree ready, whole process)   {opened:7.2f} s")
        print(row("cp -r", copy, copy_rss, copy))
        print(row("ckpt-tui convert -> .safetensors", mine, mine_rss, copy))
        print(row(framework, reference, reference_rss, copy))
        print(f"  ckpt-tui / {framework}: {mine / reference:.2f}x time, {mine_rss / reference_rss:.2f}x memory")
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
