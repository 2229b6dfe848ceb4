"""``check --against`` and ``diff`` with a reference of many keys: wall time and peak RSS by key count,
to show the cost grows with the keys (not with their square; 120,000 keys once took minutes).

python benchmarks/bench_against.py [--dir bench-data] [--keys 10000,100000,1000000]

Files are safetensors written header-first (one float per tensor), so a million keys take seconds to
make: the reference holds ``layers.N.w``, the candidate ``module.layers.N.w`` with every seventh missing.
"""

from __future__ import annotations

import argparse
import json
import resource
import struct
import subprocess
import sys
import time
from pathlib import Path

import measure  # noqa: F401  (compiles ckpt-tui's bytecode once: runs are timed as installed)


def write_tensors(path: Path, names: list[str]) -> None:
    """A safetensors file of one float32 per name, written without torch."""
    if path.exists():
        return
    header = {name: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i, name in enumerate(names)}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(raw)) + raw + bytes(4 * len(names)))


def run(command: list[str]) -> tuple[float, float, int]:
    """Wall seconds, peak RSS (MB) of the children so far, and the exit code."""
    start = time.perf_counter()
    code = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    wall = time.perf_counter() - start
    return wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, default=Path("bench-data"))
    parser.add_argument("--keys", default="10000,100000,1000000")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    print(f"{'keys':>9}  {'command':<22} {'wall s':>8} {'peak MB':>8}  exit")
    for keys in map(int, args.keys.split(",")):
        reference, candidate = (
            args.dir / f"against_ref_{keys}.safetensors",
            args.dir / f"against_cand_{keys}.safetensors",
        )
        write_tensors(reference, [f"layers.{i}.w" for i in range(keys)])
        write_tensors(candidate, [f"module.layers.{i}.w" for i in range(keys) if i % 7])
        for verb in ("check", "diff"):
            option = ["--against"] if verb == "check" else []
            command = [sys.executable, "-m", "ckpt_tui", verb, str(candidate), *option, str(reference)]
            wall, peak, code = run(command)
            print(f"{keys:>9}  {verb + ' ' + ' '.join(option):<22} {wall:>8.1f} {peak:>8.0f}  {code}")


if __name__ == "__main__":
    main()
