"""Time from start to the tree being shown: ``ckpt-tui FILE`` headless against ``torch.load(mmap=True)``.

    python benchmarks/bench_tui.py [--dir bench-data] [--size-gb 2] [--keys 50000] [--repeat 3]

Each run is a whole process: interpreter start, imports, reading the file, the first paint.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from measure import measure, python_command, table, write_large, write_many

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

asyncio.run(main())
"""


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
        rows = [
            ("ckpt-tui FILE: tree shown", *measure([*python_command(SHOW_TREE), str(path)], args.repeat)),
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
