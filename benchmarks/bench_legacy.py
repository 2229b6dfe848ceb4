"""The legacy reader against the zip reader on the same content: ``info --json`` and ``check``, whole processes.

python benchmarks/bench_legacy.py [--dir bench-data] [--storages 40000] [--repeat 3]

The same state_dict (one small tensor per storage) is saved twice, as torch's zip format and as the
legacy format (``_use_new_zipfile_serialization=False``); the ratio is legacy time over zip time
(1.0: as fast; the target is at most 1.5).
"""

from __future__ import annotations

import argparse
from collections import OrderedDict
from pathlib import Path

from measure import ckpt_tui, measure


def write_pair(folder: Path, storages: int) -> tuple[Path, Path]:
    """The same content as a zip checkpoint and as a legacy one, built once."""
    zipped, legacy = folder / f"same_{storages}.zip.pth", folder / f"same_{storages}.legacy.pth"
    if not (zipped.exists() and legacy.exists()):
        import torch

        state = OrderedDict((f"layers.{i // 4}.p{i % 4}", torch.randn(8)) for i in range(storages))
        torch.save(state, zipped)
        torch.save(state, legacy, _use_new_zipfile_serialization=False)
    return zipped, legacy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, default=Path("bench-data"))
    parser.add_argument("--storages", type=int, default=40_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    zipped, legacy = write_pair(args.dir, args.storages)
    sizes = f"zip {zipped.stat().st_size / 1e6:.1f} MB, legacy {legacy.stat().st_size / 1e6:.1f} MB"
    print(f"{args.storages} storages: {sizes}")
    print(f"{'':16} {'zip s':>8} {'legacy s':>9} {'legacy/zip':>11} {'zip MB':>7} {'legacy MB':>10}")
    for command in ("info --json", "check"):
        zip_wall, zip_rss = measure(ckpt_tui(*command.split(), str(zipped)), args.repeat)
        legacy_wall, legacy_rss = measure(ckpt_tui(*command.split(), str(legacy)), args.repeat)
        ratio = legacy_wall / zip_wall
        print(f"{command:16} {zip_wall:8.2f} {legacy_wall:9.2f} {ratio:11.2f} {zip_rss:7.0f} {legacy_rss:10.0f}")


if __name__ == "__main__":
    main()
