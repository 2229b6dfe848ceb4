"""Average two large checkpoints: ``ckpt-tui average`` wall time and peak RSS, against torch.load + arithmetic +
torch.save of the same files (float64 accumulate, cast back, as ``average`` defines it), side by side.

python benchmarks/bench_average.py [--dir bench-data] [--size-gb 1] [--repeat 2]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from measure import ckpt_tui, measure, python_command, table

TORCH_AVERAGE = (
    "import torch, sys, os; a = torch.load(sys.argv[1], weights_only=True); "
    "b = torch.load(sys.argv[2], weights_only=True); "
    "out = {k: ((0.5 * a[k].double() + 0.5 * b[k].double()).to(a[k].dtype) if a[k].is_floating_point() else a[k]) "
    "for k in a}; torch.save(out, sys.argv[3]); f = os.open(sys.argv[3], os.O_RDONLY); os.fsync(f)"
)


def write_state(path: Path, gigabytes: float, seed: int) -> None:
    """A flat fp32 state_dict of about ``gigabytes`` (tensors of 32 MB), built a tensor at a time."""
    if path.exists():
        return
    import torch

    torch.manual_seed(seed)
    count = max(1, round(gigabytes * 1024 / 32))
    state = {f"layers.{i}.weight": torch.randn(2048, 4096) for i in range(count)}
    state["norm.num_batches_tracked"] = torch.tensor(seed)
    torch.save(state, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, default=Path("bench-data"))
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    a = args.dir / f"soup_a_{args.size_gb:g}gb.pth"
    b = args.dir / f"soup_b_{args.size_gb:g}gb.pth"
    write_state(a, args.size_gb, 0)
    write_state(b, args.size_gb, 1)
    out_ckpt, out_torch = args.dir / "soup_ckpt_tui.pth", args.dir / "soup_torch.pth"
    print(f"\naverage of {a.name} and {b.name}: {a.stat().st_size / 1e9:.2f} GB each")
    rows = [
        (
            "ckpt-tui average (verified, fsynced)",
            *measure([*ckpt_tui("average", str(a), str(b), "-o", str(out_ckpt), "--force")], args.repeat),
        ),
        (
            "torch.load both + arithmetic + torch.save",
            *measure([*python_command(TORCH_AVERAGE), str(a), str(b), str(out_torch)], args.repeat),
        ),
    ]
    print(table(rows, "torch.load both + arithmetic + torch.save"))
    import torch

    ours, theirs = (
        torch.load(out_ckpt, weights_only=True, mmap=True),
        torch.load(out_torch, weights_only=True, mmap=True),
    )
    same = all(torch.equal(ours[k], theirs[k]) for k in theirs)
    print(f"outputs bit-equal: {same}")
    out_ckpt.unlink()
    out_torch.unlink()


if __name__ == "__main__":
    main()
