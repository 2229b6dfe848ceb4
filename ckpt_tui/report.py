"""Plain-text reports for the CLI (``info`` and ``check``)."""

from __future__ import annotations

from typing import Any

from ckpt_tui.core.check import CheckReport
from ckpt_tui.core.describe import count, size, value_text
from ckpt_tui.core.keypath import key_text
from ckpt_tui.core.model import children, has_children
from ckpt_tui.core.summary import Summary

FORMAT_NAMES = {
    "zip": "torch zip checkpoint",
    "legacy": "legacy torch checkpoint (pre-1.6)",
    "pickle": "plain pickle",
    "safetensors": "safetensors",
    "sharded": "sharded checkpoint",
    "dcp": "torch.distributed.checkpoint directory",
    "torchscript": "TorchScript archive",
}
TREE_LINES = 40


def render_info(summary: Summary, depth: int = 2) -> str:
    """The ``info`` text: header, totals, findings, top of the tree."""
    ckpt = summary.checkpoint
    lines = [
        f"{ckpt.path}",
        f"  format      {FORMAT_NAMES.get(ckpt.format, ckpt.format)}, {size(ckpt.file_bytes)} on disk",
        f"  tensors     {len(summary.tensors)}   parameters {count(summary.parameter_count)}   "
        f"tensor data {size(summary.tensor_bytes)}",
        "  dtypes      " + _counted(summary.dtypes, summary.bytes_by_dtype),
        "  devices     " + (", ".join(f"{d} {n}" for d, n in summary.devices.most_common()) or "-"),
    ]
    lines += [f"  note        {note}" for note in ckpt.notes]
    if ckpt.metadata:
        lines.append("  metadata    " + ", ".join(f"{k}={v}" for k, v in list(ckpt.metadata.items())[:6]))
    if summary.findings:
        lines.append("findings")
        lines += [f"  {'!' if f.severity == 'warning' else '·'} {f.message}" for f in summary.findings]
    lines.append("tree")
    lines += _tree_lines(ckpt.root, depth)
    return "\n".join(lines)


def _counted(counts: Any, nbytes: Any) -> str:
    return ", ".join(f"{name} {n} ({size(nbytes[name])})" for name, n in counts.most_common()) or "-"


def _tree_lines(root: Any, depth: int) -> list[str]:
    lines: list[str] = [f"  (root) {value_text(root)}"]
    stack: list[tuple[int, Any, Any]] = [(1, key, value) for key, value in reversed(list(children(root)))]
    hidden = 0
    while stack:
        level, key, value = stack.pop()
        if len(lines) > TREE_LINES:
            hidden += 1
            continue
        lines.append(f"{'  ' * (level + 1)}{key_text(key)}  {value_text(value)}")
        if level < depth and has_children(value):
            stack.extend((level + 1, k, v) for k, v in reversed(list(children(value))))
    if hidden:
        lines.append(f"  … {hidden} more entries (ckpt-tui FILE to browse, --depth, or --json)")
    return lines


def render_check(report: CheckReport) -> str:
    """The ``check`` text: verdict first, then each problem."""
    ckpt = report.summary.checkpoint
    head = f"{ckpt.path}: {report.checked} tensors read"
    if report.skipped:
        head += f", {report.skipped} without readable values skipped"
    if report.ok:
        return head + ": OK, no NaN/Inf, no unsafe globals"
    lines = [head + f": {len(report.problems)} problems"]
    lines += [f"  ! [{p.kind}] {p.message}" for p in report.problems]
    return "\n".join(lines)
