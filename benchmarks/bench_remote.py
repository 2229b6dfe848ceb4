"""Remote opening against downloading first: time to the tree, and bytes moved.

A range server on 127.0.0.1 (``tests/range_server.py``) serves a 2 GB ``.pth`` (zip), a 2 GB legacy
``.bin`` and a 2 GB ``.safetensors`` (sparse files: 16 tensors of 128 MB each, few real bytes on disk)
with latency injected per request and a bandwidth cap per connection. For each file, side by side:

- ``ckpt-tui info URL``: whole-process wall time, requests and bytes the server sent;
- ``curl -o /dev/null URL`` (the download a local tool needs first), then ``ckpt-tui info`` of the
  local file: the sum is the time to the tree that way.

Run: ``python benchmarks/bench_remote.py [--latency 0.05] [--bandwidth 100e6] [--size-gb 2]``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import measure  # noqa: F401  (compiles ckpt-tui's bytecode once: runs are timed as installed)
from range_server import RangeServer

TENSORS = 16


def sparse_pth(path: Path, elements: int) -> None:
    """A zip checkpoint whose records' bytes are skipped (torch's skip_data: a sparse file)."""
    import torch

    state = {f"layers.{i}.weight": torch.empty(elements) for i in range(TENSORS)}
    with torch.serialization.skip_data():
        torch.save(state, path)


class _Sparse(io.RawIOBase):
    """A file written through ``write``, where runs of zeros become holes."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "wb")  # noqa: SIM115 - closed in close()
        self.position = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        import numpy as np

        view = memoryview(data).cast("B")
        if len(view) >= 1 << 16 and not np.frombuffer(view, np.uint8).any():
            self.file.seek(len(view), os.SEEK_CUR)
        else:
            self.file.write(view)
        self.position += len(view)
        return len(view)

    def tell(self) -> int:
        return self.position

    def close(self) -> None:
        if not self.closed:
            self.file.truncate(self.position)
            self.file.close()
        super().close()


def sparse_legacy_bin(path: Path, elements: int) -> None:
    """A legacy (pre-1.6) torch file, its storages written as holes."""
    import torch

    state = {f"layers.{i}.weight": torch.empty(elements) for i in range(TENSORS)}
    out = _Sparse(path)
    torch.save(state, out, _use_new_zipfile_serialization=False)
    out.close()


def sparse_safetensors(path: Path, elements: int) -> None:
    """A safetensors header, then its data as one hole."""
    header: dict[str, Any] = {}
    for i in range(TENSORS):
        start = i * elements * 4
        offsets = [start, start + elements * 4]
        header[f"layers.{i}.weight"] = {"dtype": "F32", "shape": [elements], "data_offsets": offsets}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(text)) + text)
        file.truncate(8 + len(text) + TENSORS * elements * 4)


def timed(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.05, help="seconds added to each request")
    parser.add_argument("--bandwidth", type=float, default=100e6, help="bytes per second per connection")
    parser.add_argument("--size-gb", type=float, default=2.0, help="size of each file")
    args = parser.parse_args()
    elements = int(args.size_gb * 1e9 / TENSORS / 4)
    root = Path(tempfile.mkdtemp(prefix="bench_remote_"))
    files = {"model.pth": sparse_pth, "pytorch_model.bin": sparse_legacy_bin, "model.safetensors": sparse_safetensors}
    for name, make in files.items():
        make(root / name, elements)
    env = {**os.environ, "XDG_CACHE_HOME": str(root / "cache")}
    ckpt = [sys.executable, "-m", "ckpt_tui", "info"]
    rows = []
    with RangeServer(str(root), latency=args.latency, bandwidth=args.bandwidth) as server:
        for name in files:
            url = f"{server.url}/{name}"
            size = (root / name).stat().st_size
            server.served.reset()
            remote = timed([*ckpt, url], env)
            requests, fetched = len(server.served.requests), server.served.bytes_sent
            server.served.reset()
            again = timed([*ckpt, url], env)
            cached = len(server.served.requests)
            server.served.reset()
            download = timed(["curl", "-sS", "-o", os.devnull, url], env)
            downloaded = server.served.bytes_sent
            local = timed([*ckpt, str(root / name)], env)
            rows.append((name, size, remote, requests, fetched, again, cached, download, downloaded, local))
    print(f"latency {args.latency * 1000:.0f} ms/request, {args.bandwidth / 1e6:.0f} MB/s per connection")
    print(
        "| file | size | ckpt-tui info URL | requests | bytes fetched | reopen (header cache) "
        "| curl download | + local info | download first, total |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, size, remote, requests, fetched, again, cached, download, downloaded, local in rows:
        print(
            f"| {name} | {size / 1e9:.2f} GB | {remote:.2f} s | {requests} | {fetched / 1e3:.1f} kB "
            f"| {again:.2f} s, {cached} request | {download:.1f} s ({downloaded / 1e9:.2f} GB) "
            f"| {local:.2f} s | {download + local:.1f} s |"
        )


if __name__ == "__main__":
    main()
