"""Write a small DCP folder compressed with torch's own zstd extension
(``FileSystemWriter(_extensions=[ZStandard()])``).

The state holds float32, bfloat16 and int64 tensors and non-tensor items (each a compressed BYTE_IO item); its
truth is torch's own reading, ``dcp_to_torch_save``, beside it as ``dcp_zstd.expected.pt``. torch's writer needs the
``zstandard`` package, so the folder is committed. From the repository root, in a venv with torch 2.13.0 and
zstandard (``pip install 'ckpt-tui[zstd]'``):

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
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    state = {
        "weight": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "bias": torch.ones(3),
        "half": torch.linspace(-2, 2, 6).to(torch.bfloat16),
        "steps": torch.tensor([3, 4]),
        "epoch": 2,
        "cfg": {"lr": 0.01, "tags": ["a", "b"]},
    }
    # one process, no process group: dcp.save writes as rank 0 alone
    dcp.save(state, storage_writer=FileSystemWriter(str(out), _extensions=[ZStandard()]), no_dist=True)
    dcp_to_torch_save(str(out), str(out.parent / f"{out.name}.expected.pt"))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
