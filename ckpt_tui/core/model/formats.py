"""The formats a checkpoint opens as: each id typed, each with the name a user reads.

``readers/open.py`` detects which one a path is; every reader's :class:`~ckpt_tui.core.model.tree.Checkpoint`
carries one of these ids, and every face prints :func:`format_name` of it, never the raw id.
"""

from __future__ import annotations

from typing import Literal, get_args

FormatId = Literal[
    "zip", "legacy", "pickle", "safetensors", "sharded", "dcp", "dcp-hf", "torchscript", "deepspeed", "folder", "ranks"
]

FORMAT_NAMES: dict[str, str] = {
    "zip": "torch zip checkpoint",
    "legacy": "legacy torch checkpoint (pre-1.6)",
    "pickle": "plain pickle",
    "safetensors": "safetensors",
    "sharded": "sharded checkpoint",
    "dcp": "torch.distributed.checkpoint directory",
    "dcp-hf": "torch.distributed.checkpoint directory (HF safetensors)",
    "torchscript": "TorchScript archive",
    "deepspeed": "DeepSpeed checkpoint folder",
    "folder": "folder of checkpoint files saved together",
    "ranks": "rank files opened as one checkpoint",
}
"""The display name of each :data:`FormatId`."""

FORMAT_IDS: tuple[str, ...] = get_args(FormatId)


def format_name(format_id: str) -> str:
    """What a user reads for a format id (the id itself only for one no reader makes)."""
    return FORMAT_NAMES.get(format_id, format_id)
