"""``ckpt-tui stats`` on a large file against numpy summing the same bytes, both from a warm page cache.

python benchmarks/bench_stats.py [--size-gb 2] [--dir DIR] [--repeat 3]

The file (big fp32 tensors, written with torch) goes to a temporary folder unless --dir is given.
Each run is a fresh process; the two commands are interleaved, after one warm-up read of the file.
numpy's side reads the file in 64 MB blocks into one buffer and sums each as float32: the floor for
any tool that looks at every byte. Targets (issue 13): at most 1.5x numpy's time, peak RSS < 200 MB.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from measure import ckpt_tui, measure, python_command, write_large

NUMPY_SUM = """
import sys
import numpy as np
block = bytearray(64 << 20)
view = memoryview(block)
total = 0.0
with open(sys.argv[1], "rb", buffering=0) as f:
    while True:
        got = f.readinto(view)
        if not got:
            break
        total += float(np.frombuffer(block, np.float32, got // 4).sum(dtype=np.float64))
print(total)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-gb", type=float, default=2.0, help="size of the file to build (default 2)")
    parser.add_argument("--dir", type=Path, help="keep the file here (default: a temporary folder)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.dir or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"large_{args.size_gb:g}gb.pth"
        write_large(path, args.size_gb)
        numpy_cmd = [*python_command(NUMPY_SUM), str(path)]
        stats_cmd = ckpt_tui("stats", "--json", str(path))
        measure(numpy_cmd, 1)  # warm the page cache
        numpy_runs, stats_runs, peaks = [], [], []
        for _ in range(args.repeat):  # interleaved, so both see the same machine
            numpy_runs.append(measure(numpy_cmd, 1))
            wall, rss = measure(stats_cmd, 1)
            stats_runs.append(wall)
            peaks.append(rss)
        numpy_wall = statistics.median(w for w, _ in numpy_runs)
        numpy_rss = max(r for _, r in numpy_runs)
        stats_wall = statistics.median(stats_runs)
        gb = path.stat().st_size / 1e9
        print(f"\n{path.name}: {gb:.2f} GB, warm page cache, median of {args.repeat} interleaved runs")
        print(f"{'':40} {'wall s':>8} {'peak RSS MB':>12}")
        print(f"{'numpy: read + sum every byte':40} {numpy_wall:8.2f} {numpy_rss:12.0f}")
        print(f"{'ckpt-tui stats --json':40} {stats_wall:8.2f} {max(peaks):12.0f}")
        ratio = stats_wall / numpy_wall
        print(f"stats / numpy sum: {ratio:.2f}x (target <= 1.5x); stats peak RSS {max(peaks):.0f} MB (target < 200)")


if __name__ == "__main__":
    main()
