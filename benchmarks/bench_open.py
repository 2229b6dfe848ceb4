"""Open time and memory: ``ckpt-tui info --json`` against ``torch.load``, whole processes, same run.

python benchmarks/bench_open.py [--dir bench-data] [--size-gb 2] [--keys 50000] [--repeat 3]
"""

from __future__ import annotations

from pathlib import Path

from measure import bench_files, ckpt_tui, measure, python_command, table


def loaders(path: Path) -> dict[str, list[str]]:
    return {
        "ckpt-tui info --json": ckpt_tui("info", "--json", str(path)),
        "torch.load(mmap=True, weights_only=True)": python_command(
            f"import torch; torch.load({str(path)!r}, mmap=True, weights_only=True)"
        ),
        "torch.load(weights_only=True)": python_command(f"import torch; torch.load({str(path)!r}, weights_only=True)"),
    }


def main() -> None:
    args, large, many = bench_files(__doc__)
    for path in (large, many):
        print(f"\n{path.name}: {path.stat().st_size / 1e9:.2f} GB")
        rows = [(name, *measure(command, args.repeat)) for name, command in loaders(path).items()]
        print(table(rows, "torch.load(mmap=True, weights_only=True)"))


if __name__ == "__main__":
    main()
