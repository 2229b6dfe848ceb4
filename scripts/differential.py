"""Long differential run: generated files judged by ckpt-tui and by the real torch.load.

    python scripts/differential.py --count 20000 --workers 2 --keep /tmp/differential-bad

Files are made from ``--seed`` alone (``tests/differential/generator.py``), in batches; each batch is
judged by ckpt-tui in a worker process and by torch in that worker's sandboxed children
(``tests/differential/torch_side.py``). Prints the counts (the closing note's numbers), then every bad
outcome (ckpt-tui says loads or clean while torch refuses or runs code) and the reasons ckpt-tui gave
where it refused or could not tell a file torch loads. Exit 1 if any outcome is bad or broken.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]  # this checkout's ckpt_tui, whatever is installed

from differential.run import Outcome, Report, describe, run  # noqa: E402


def _batch(seed: int, start: int, stop: int, keep: str | None) -> list[Outcome]:
    with tempfile.TemporaryDirectory(prefix="ckpt-tui-differential-") as folder:
        return run(seed, range(start, stop), Path(folder), Path(keep) if keep else None).outcomes


def main() -> int:
    """Run, print the counts and the disagreements."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=2113)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=250)
    parser.add_argument("--keep", help="copy the files of bad outcomes here")
    parser.add_argument("--json", help="write every outcome here, one JSON object a line")
    args = parser.parse_args()
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    report = Report()
    stops = range(args.start, args.start + args.count, args.batch)
    out = open(args.json, "w") if args.json else None  # noqa: SIM115 (written batch by batch)
    with ProcessPoolExecutor(args.workers) as pool:
        futures = [
            pool.submit(_batch, args.seed, start, min(start + args.batch, args.start + args.count), args.keep)
            for start in stops
        ]
        for future in as_completed(futures):
            outcomes = future.result()
            report.outcomes += outcomes
            if out is not None:  # as each batch ends: a run stopped early still has its outcomes
                out.writelines(describe(o) + "\n" for o in outcomes)
                out.flush()
            bad = sum(o.bad or o.broken for o in report.outcomes)
            done = len(report.outcomes)
            seconds = time.monotonic() - began
            print(f"{done}/{args.count} files, {bad} bad, {seconds:.0f} s", file=sys.stderr, flush=True)
    if out is not None:
        out.close()
    counts = report.counts()
    counts["seed"], counts["seconds"] = args.seed, round(time.monotonic() - began)
    print(json.dumps(counts, indent=1))
    for outcome in report.outcomes:
        if outcome.bad or outcome.broken:
            print("BAD" if outcome.bad else "BROKEN", describe(outcome))
    strict = Counter(o.reason[:100] for o in report.outcomes if o.strict)
    for reason, count in strict.most_common():
        print(f"strict x{count}: {reason}")
    return 1 if any(o.bad or o.broken for o in report.outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
