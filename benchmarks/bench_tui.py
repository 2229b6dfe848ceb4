"""Time from start to the tree being shown: ``ckpt-tui FILE`` headless against ``torch.load(mmap=True)``.

    python benchmarks/bench_tui.py [--dir bench-data] [--size-gb 2] [--keys 50000] [--repeat 3]

Each run is a fresh process, timed from its spawn to the moment its tree is on screen (interpreter start,
imports, reading the file, the first paint; not the exit). torch.load is timed to its exit, which is when
its result is usable.
"""

from __future__ import annotations

import statistics
import subprocess
import time

from measure import bench_files, measure, python_command, table

SHOW_TREE = """
import asyncio, sys
from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.widgets.tree_view import CheckpointTree

async def main():
    app = CkptApp(sys.argv[1])
    async with app.run_test(size=(120, 36)) as pilot:
        tree = app.query_one(CheckpointTree)
        while not tree.root.children:
            await pilot.pause(0.01)
        peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM")).split()[1]
        print("shown", peak, flush=True)

asyncio.run(main())
"""


def until_shown(command: list[str], repeat: int) -> tuple[float, float]:
    """Median seconds from spawning the process to its tree being on screen, and peak RSS (MB) by then."""
    walls, peaks = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("shown"):
                walls.append(time.perf_counter() - start)
                peaks.append(int(line.split()[1]) / 1024)
                break
        process.wait()
    return statistics.median(walls), max(peaks)


def main() -> None:
    args, large, many = bench_files(__doc__)
    for path in (large, many):
        print(f"\n{path.name}: {path.stat().st_size / 1e9:.2f} GB")
        rows = [
            ("ckpt-tui FILE: tree shown", *until_shown([*python_command(SHOW_TREE), str(path)], args.repeat)),
            (
                "torch.load(mmap=True, weights_only=True)",
                *measure(
                    python_command(f"import torch; torch.load({str(path)!r}, mmap=True, weights_only=True)"),
                    args.repeat,
                ),
            ),
        ]
        print(table(rows, "torch.load(mmap=True, weights_only=True)"))


if __name__ == "__main__":
    main()
