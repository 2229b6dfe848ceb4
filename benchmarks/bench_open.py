"""Open time and memory: ``ckpt-tui info --json`` against ``torch.load``, whole processes, same run.

python benchmarks/bench_open.py [--dir bench-data] [--size-gb 2] [--keys 50000] [--repeat 3]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from measure import ckpt_tui, measure, python_command, table, write_large, write_many


def loaders(path: Path) -> dict[str, list[str]]:
    return {
        "ckpt-tui info --json": ckpt_tui("info", "--json", str(path)),
        "torch.load(mmap=True, weights_only=True)": python_command(
            f"import torch; torch.load({str(path)!r}, mmap=True, weights_only=True)"
        ),
        "torch.load(weights_only=True)": python_command(f"import torch; torch.load({str(path)!r}, weights_only=True)"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, default=Path("bench-data"))
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    large, many = args.dir / f"large_{args.size_gb:g}gb.pth", args.dir / f"many_{args.keys}.pth"
    write_large(large, args.size_gb)
    write_many(many, args.keys)
    for path in (large, many):
        print(f"\n{path.name}: {path.stat().st_size / 1e9:.2f} GB")
        rows = [(name, *measure(command, args.repeat)) for name, command in loaders(path).items()]
        print(table(rows, "torch.load(mmap=True, weights_only=True)"))


if __name__ == "__main__":
    main()
