"""Diff two large checkpoints: ``ckpt-tui diff`` wall time and peak RSS, against loading both with torch.

python benchmarks/bench_diff.py [--dir bench-data] [--size-gb 2] [--repeat 2]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from measure import ckpt_tui, measure, python_command, table, write_large

TORCH_DIFF = (
    "import torch, sys; a = torch.load(sys.argv[1], weights_only=True)['model']; "
    "b = torch.load(sys.argv[2], weights_only=True)['model']; "
    "print(max(float((a[k] - b[k]).abs().max()) for k in a))"
)


def write_changed(source: Path, target: Path) -> None:
    """The same checkpoint with one tensor nudged (written with convert --dtype round trip avoided: torch)."""
    import torch

    if target.exists():
        return
    checkpoint = torch.load(source, weights_only=True, mmap=True)
    first = next(iter(checkpoint["model"]))
    checkpoint["model"][first] = checkpoint["model"][first] + 1e-3
    torch.save(checkpoint, target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, default=Path("bench-data"))
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    a = args.dir / f"large_{args.size_gb:g}gb.pth"
    b = args.dir / f"large_{args.size_gb:g}gb_changed.pth"
    write_large(a, args.size_gb)
    write_changed(a, b)
    print(f"\n{a.name} vs {b.name}: {a.stat().st_size / 1e9:.2f} GB each")
    # diff exits 1 when the files differ (they do); exit 2 or a crash fails the benchmark
    diff_command = " ".join(ckpt_tui("diff", str(a), str(b))) + " > /dev/null; [ $? -le 1 ]"
    rows = [
        ("ckpt-tui diff", *measure(["sh", "-c", diff_command], args.repeat)),
        ("torch.load both + compare", *measure([*python_command(TORCH_DIFF), str(a), str(b)], args.repeat)),
    ]
    print(table(rows, "torch.load both + compare"))


if __name__ == "__main__":
    main()
