"""Time from start to the tree being shown: ``ckpt-tui FILE`` headless against ``torch.load(mmap=True)``.

    python benchmarks/bench_tui.py [--dir bench-data] [--size-gb 2] [--keys 50000] [--repeat 3]

Each run is a whole process: interpreter start, imports, reading the file, the first paint.
"""

from __future__ import annotations

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

asyncio.run(main())
"""


def main() -> None:
    args, large, many = bench_files(__doc__)
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
