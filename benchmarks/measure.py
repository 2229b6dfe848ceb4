"""Whole-process measurements: wall time and peak RSS of a command, each in a fresh process."""

from __future__ import annotations

import argparse
import compileall
import json
import statistics
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

PROBE = """
import resource, subprocess, sys, time
start = time.perf_counter()
code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode
wall = time.perf_counter() - start
print(wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, code)
"""


def compile_package() -> None:
    """Write ckpt-tui's bytecode once, as pip does when it installs a package, so that every timed run reads it
    (with ``PYTHONDONTWRITEBYTECODE=1`` set, as here, each run would otherwise compile every module it imports:
    tens of milliseconds a run). Run by every benchmark when it imports this module."""
    compileall.compile_dir(str(Path(__file__).resolve().parent.parent / "ckpt_tui"), quiet=1)


compile_package()


def measure(command: list[str], repeat: int = 3) -> tuple[float, float]:
    """Median wall seconds and the largest peak RSS (MB) of ``command`` over ``repeat`` runs."""
    walls, peaks = [], []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", PROBE, *command], capture_output=True, text=True, check=True)
        wall, rss_kb, code = out.stdout.split()
        if code != "0":
            raise SystemExit(f"command failed ({code}): {' '.join(command)}")
        walls.append(float(wall))
        peaks.append(int(rss_kb) / 1024)
    return statistics.median(walls), max(peaks)


def python_command(code: str) -> list[str]:
    """A command that runs ``code`` in a fresh interpreter."""
    return [sys.executable, "-c", code]


def ckpt_tui(*args: str) -> list[str]:
    """A command that runs the CLI in a fresh interpreter."""
    return [sys.executable, "-m", "ckpt_tui", *args]


def write_large(path: Path, gigabytes: float) -> None:
    """A checkpoint of big fp32 tensors (about 128 MB each), built a tensor at a time."""
    if path.exists():
        return
    import torch

    count = max(1, round(gigabytes * 1024 / 128))
    state = OrderedDict((f"module.layers.{i}.weight", torch.empty(8192, 4096).uniform_()) for i in range(count))
    torch.save({"epoch": 1, "model": state}, path)


def write_many(path: Path, keys: int) -> None:
    """A state_dict of ``keys`` small tensors."""
    if path.exists():
        return
    import torch

    state = OrderedDict((f"module.blocks.{i // 8}.p{i % 8}", torch.randn(16, 16)) for i in range(keys))
    torch.save(state, path)


def table(rows: list[tuple[str, float, float]], baseline: str) -> str:
    """A text table with ratios against the row named ``baseline``."""
    base_wall = next(w for name, w, _ in rows if name == baseline)
    lines = [f"{'':44} {'wall s':>8} {'peak RSS MB':>12} {'x faster than ' + baseline:>28}"]
    for name, wall, rss in rows:
        lines.append(f"{name:44} {wall:8.2f} {rss:12.0f} {base_wall / wall:28.1f}")
    return "\n".join(lines)


def dump(results: dict[str, object]) -> str:
    """One JSON line for machines."""
    return json.dumps(results)


def bench_files(description: str | None) -> tuple[argparse.Namespace, Path, Path]:
    """The common options (--dir, --size-gb, --keys, --repeat) and the two benchmark files, built once."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--dir", type=Path, default=Path("bench-data"))
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    large, many = args.dir / f"large_{args.size_gb:g}gb.pth", args.dir / f"many_{args.keys}.pth"
    write_large(large, args.size_gb)
    write_many(many, args.keys)
    return args, large, many
