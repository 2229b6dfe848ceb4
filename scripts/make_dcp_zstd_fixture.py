"""Write a small DCP folder compressed with torch's own zstd extension
(``FileSystemWriter(_extensions=[ZStandard()])``).

torch's writer needs the ``zstandard`` package, which the test extras leave out, so the folder is committed. From
the repository root, in a venv with torch 2.13.0 and zstandard:

    python scripts/make_dcp_zstd_fixture.py tests/fixtures/torch_distributed/dcp_zstd
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint._extension import ZStandard


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/torch_distributed/dcp_zstd")
    state = {"weight": torch.arange(12, dtype=torch.float32).reshape(3, 4), "bias": torch.ones(3)}
    # one process, no process group: dcp.save writes as rank 0 alone
    dcp.save(state, storage_writer=FileSystemWriter(str(out), _extensions=[ZStandard()]), no_dist=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
