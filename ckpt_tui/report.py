"""Plain-text reports for the CLI (``info`` and ``check``)."""

from __future__ import annotations

import os
import shlex
from typing import TYPE_CHECKING, Any

from ckpt_tui.core.compare import fold_keys
from ckpt_tui.core.describe import FORMAT_NAMES, count, size, value_text
from ckpt_tui.core.findings import Fix
from ckpt_tui.core.keypath import key_text
from ckpt_tui.core.summary import Summary
from ckpt_tui.core.tree import children, has_children

if TYPE_CHECKING:  # numpy-backed modules: imported by the commands that need them
    from ckpt_tui.core.check import CheckReport
    from ckpt_tui.core.compare import CompareReport
    from ckpt_tui.core.diff import DiffReport

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
        for finding in summary.findings:
            lines.append(f"  {'!' if finding.severity == 'warning' else '·'} {finding.message}")
            if finding.fix is not None:
                lines.append(f"      fix: ckpt-tui convert {_fix_command(ckpt.path, finding.fix)}")
    lines.append("tree")
    lines += _tree_lines(ckpt.root, depth)
    return "\n".join(lines)


def _fix_command(path: str, fix: Fix) -> str:
    """The convert arguments that apply a finding's fix, each quoted for the shell."""
    stem = os.path.basename(path.rstrip("/")).split(".")[0] or "checkpoint"
    output = os.path.join(os.path.dirname(path.rstrip("/")), f"{stem}.fixed.pth")
    return " ".join(shlex.quote(part) for part in (path, "-o", output, fix.option, fix.argument))


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
        return "\n".join([head + ": OK, no NaN/Inf, no unsafe globals", *weights_only_lines(report, ckpt.path)])
    lines = [head + f": {len(report.problems)} problems"]
    lines += [f"  ! [{p.kind}] {p.message}" for p in report.problems]
    lines += weights_only_lines(report, ckpt.path)
    return "\n".join(lines)


def weights_only_lines(report: CheckReport, path: str) -> list[str]:
    """The verdict on ``torch.load(FILE)`` with weights_only=True: blockers, where, and the two ways out."""
    from ckpt_tui.core.safe_text import printable

    judged = report.weights_only
    if judged is None:
        return []
    lines = [printable(judged.headline())]
    for blocker in judged.blockers:
        times = f" ({blocker.count}×)" if blocker.count > 1 else ""
        lines.append(f"  {blocker.kind:<4}  {printable(blocker.name)}{times} at {printable(blocker.where())}")
        if blocker.note:
            lines.append(f"        {printable(blocker.note)}")
    if judged.blockers and judged.reason:
        lines.append(f"  and, whatever is allowlisted: {printable(judged.reason)}")
    lines += [f"  note: {printable(note)}" for note in judged.notes]
    if judged.safe_globals:
        lines.append("  to load it as it is (only if you trust the file), before torch.load:")
        lines.append(f"    import {', '.join(judged.imports)}")
        lines.append(f"    {printable(judged.safe_globals)}")
    if judged.loads is False and judged.blockers:
        stem = os.path.join(os.path.dirname(path.rstrip("/")), os.path.basename(path.rstrip("/")).split(".")[0])
        command = " ".join(shlex.quote(p) for p in (path, "-o", f"{stem}.sanitized.pth", "--sanitize"))
        lines.append(f"  or rewrite it as plain data that loads:  ckpt-tui convert {command}")
    return lines


LIST_LIMIT = 12


def _listing(title: str, items: list[str]) -> list[str]:
    if not items:
        return []
    lines = [f"{title} ({len(items)}):"]
    lines += [f"  {item}" for item in items[:LIST_LIMIT]]
    if len(items) > LIST_LIMIT:
        lines.append(f"  … and {len(items) - LIST_LIMIT} more (--json lists all)")
    return lines


def render_compare(report: CompareReport, path: str) -> str:
    """The fit report: counts first, then folded lists, then the suggested fix and its command."""
    head = (
        f"{report.matched}/{report.total} reference keys found, {len(report.missing)} missing, "
        f"{len(report.unexpected)} unexpected, {len(report.shape_mismatches)} shape mismatches, "
        f"{len(report.dtype_mismatches)} dtype mismatches"
    )
    lines = [("OK: " if report.ok else "DOES NOT FIT: ") + head]
    lines += _listing("missing (in the reference, not in the checkpoint)", fold_keys(report.missing))
    lines += _listing("unexpected (in the checkpoint, not in the reference)", fold_keys(report.unexpected))
    lines += _listing(
        "shape mismatches (checkpoint vs reference)",
        [f"{k}: {list(a)} vs {list(b)}" for k, a, b in report.shape_mismatches],
    )
    lines += _listing("dtype mismatches (cast on load)", [f"{k}: {a} vs {b}" for k, a, b in report.dtype_mismatches])
    if report.suggestion is not None:
        lines.append(f"suggested fix: {report.suggestion.describe()}")
        lines.append(f"  {report.suggestion.command(path)}")
    elif report.shape_mismatches and not report.missing and not report.unexpected:
        drops = " ".join(f"--drop {k}" for k, _, _ in report.shape_mismatches[:LIST_LIMIT])
        lines.append("these layers differ in size (e.g. a new classifier head): drop them and load the rest with")
        lines.append(
            f"strict=False, keeping the model's fresh init for them:  ckpt-tui convert {path} -o fixed.pth {drops}"
        )
    return "\n".join(lines)


def render_diff(report: DiffReport, a: str, b: str) -> str:
    """The diff report: verdict, then each kind of difference."""
    if report.identical:
        return f"identical: {report.identical_tensors} tensors bit-for-bit equal, same keys and values"
    lines = [f"DIFFERENT ({a} vs {b}); {report.identical_tensors} tensors identical"]
    lines += _listing("only in A", fold_keys(report.only_a))
    lines += _listing("only in B", fold_keys(report.only_b))
    lines += _listing("shape changes", [f"{k}: {list(x)} → {list(y)}" for k, x, y in report.shape_changes])
    lines += _listing("dtype changes", [f"{k}: {x} → {y}" for k, x, y in report.dtype_changes])
    lines += _listing(
        "value changes",
        [
            f"{d.key}: max |a-b| {d.max_abs:.6g}, {'allclose' if d.close else 'NOT close'}"
            + (", NaN positions differ" if d.nan_mismatch else "")
            for d in report.value_changes
        ],
    )
    lines += _listing("other values", [f"{k}: {x} → {y}" for k, x, y in report.other_changes])
    lines += _listing("unreadable", [f"{k}: {e}" for k, e in report.unreadable])
    return "\n".join(lines)
