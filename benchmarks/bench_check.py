"""What the weights_only verdict adds to ``check``, on the 50,000-key file (same run, same process kind).

python benchmarks/bench_check.py [--dir bench-data] [--keys 50000] [--repeat 3]

Rows: the whole ``ckpt-tui check`` process (wall), then, measured inside one process per repeat,
``check`` (open + read every tensor) without the verdict, the verdict alone, and the share it adds
(CPU time: the machine may be shared, and the ratio is what matters).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from measure import ckpt_tui, measure, write_many

PROBE = """
import json, sys, time
from ckpt_tui.core.operations import check as check_module
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.weights_only.verdict import verdict

start = time.process_time()
checkpoint = open_checkpoint(sys.argv[1])
opened = time.process_time() - start
start = time.process_time()
judged = verdict(checkpoint)
alone = time.process_time() - start
real = check_module.verdict
check_module.verdict = lambda c: judged  # check without the scan: the verdict is already known
start = time.process_time()
check_module.check_checkpoint(checkpoint)
without = opened + time.process_time() - start
check_module.verdict = real
print(json.dumps({"verdict": alone, "check_without": without, "loads": judged.loads}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, default=Path("bench-data"))
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    path = args.dir / f"many_{args.keys}.pth"
    write_many(path, args.keys)
    wall, rss = measure(ckpt_tui("check", str(path)), args.repeat)
    runs = []
    for _ in range(args.repeat):
        done = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout))
    scan = statistics.median(r["verdict"] for r in runs)
    rest = statistics.median(r["check_without"] for r in runs)
    print(f"\n{path.name}: {args.keys} keys, torch.load(weights_only=True) loads it: {runs[0]['loads']}")
    print(f"{'ckpt-tui check (whole process, wall s)':52} {wall:8.2f}   peak RSS {rss:.0f} MB")
    print(f"{'check: open + every tensor, no verdict (CPU s)':52} {rest:8.2f}")
    print(f"{'weights_only verdict alone (CPU s, in process)':52} {scan:8.2f}")
    print(f"{'the verdict adds to check':52} {100 * scan / rest:7.1f}%  (goal: under 10%)")


if __name__ == "__main__":
    main()
