"""``stats``, ``diff`` and ``diff --stats`` on many small tensors: batched reading against the per-tensor path.

python benchmarks/bench_many_small.py [--keys 50000] [--dir DIR] [--repeat 3]

Two files hold the same ``keys`` fp32 16x16 tensors (a .pth written by torch, a .safetensors written
here). Each command runs in a fresh process, as ckpt-tui runs it and with batching switched off (every
tensor read on its own, as before issue 14), interleaved, from a warm page cache. Targets (issue 14):
each command under ~1.5 s on 50,000 tensors.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import tempfile
from pathlib import Path

from measure import ckpt_tui, measure, python_command, write_many

RUN = """
import sys
from ckpt_tui.core.values import batched_values
from ckpt_tui.cli import main
if sys.argv[1] == "per-tensor":
    batched_values.MIN_BATCHED = 1 << 62  # no batch is ever formed: every tensor is read on its own
code = main(sys.argv[2:])
sys.exit(0 if code == 1 else code)  # diff: 1 when the files differ
"""


def write_nudged(source: Path, path: Path) -> None:
    """The same state_dict with every value moved a little (diff then compares every pair's values)."""
    if path.exists():
        return
    import torch

    state = torch.load(source, weights_only=True)
    torch.save({key: tensor * 1.0001 for key, tensor in state.items()}, path)


def write_safetensors_copy(source: Path, path: Path) -> None:
    """The tensors of a .pth state_dict in a .safetensors file (header, then the raw bytes in order)."""
    if path.exists():
        return
    import torch

    state = torch.load(source, weights_only=True)
    header: dict[str, object] = {}
    offset = 0
    for key, tensor in state.items():
        size = tensor.numel() * tensor.element_size()
        header[key] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(text)) + text)
        for tensor in state.values():
            file.write(tensor.contiguous().numpy().tobytes())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=50_000, help="tensors in each file (default 50000)")
    parser.add_argument("--dir", type=Path, help="keep the files here (default: a temporary folder)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.dir or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        pth, safetensors = folder / f"many_{args.keys}.pth", folder / f"many_{args.keys}.safetensors"
        write_many(pth, args.keys)
        write_safetensors_copy(pth, safetensors)
        nudged = folder / f"many_{args.keys}_nudged.pth"
        write_nudged(pth, nudged)
        commands = {
            "stats F.safetensors": ["stats", str(safetensors)],
            "stats F.pth": ["stats", str(pth)],
            "diff F.safetensors F.pth": ["diff", str(safetensors), str(pth)],
            "diff --stats F.safetensors F.pth": ["diff", "--stats", str(safetensors), str(pth)],
            "diff F.safetensors G.pth (all differ)": ["diff", str(safetensors), str(nudged)],
        }
        print(f"\n{args.keys} fp32 16x16 tensors per file, warm page cache, median of {args.repeat} interleaved runs")
        print(f"{'command':38} {'batched s':>10} {'per-tensor s':>13} {'speed-up':>9}")
        for name, argv in commands.items():
            batched_cmd = [*python_command(RUN), "batched", *argv]
            per_tensor_cmd = [*python_command(RUN), "per-tensor", *argv]
            measure(batched_cmd, 1)  # warm the page cache
            batched, per_tensor = [], []
            for _ in range(args.repeat):  # interleaved, so both see the same machine
                batched.append(measure(batched_cmd, 1)[0])
                per_tensor.append(measure(per_tensor_cmd, 1)[0])
            fast, slow = statistics.median(batched), statistics.median(per_tensor)
            print(f"{name:38} {fast:10.2f} {slow:13.2f} {slow / fast:8.1f}x")
        print(f"(the same commands as `{' '.join(ckpt_tui('...'))}` runs them)")


if __name__ == "__main__":
    main()
