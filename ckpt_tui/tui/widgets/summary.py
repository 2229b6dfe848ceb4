"""The summary header: what the file is, at a glance, warnings first."""

from __future__ import annotations

import os

from rich.text import Text
from textual.widgets import Static

from ckpt_tui.core.describe import FORMAT_NAMES, count, size
from ckpt_tui.core.safe_text import printable
from ckpt_tui.core.summary import Summary
from ckpt_tui.core.weights_only import Verdict

MAX_FINDINGS = 3
FIX_KEYS = {"--strip-prefix": "p strips it", "--extract": "x extracts it", "--map-location": "m maps the devices"}


def summary_text(summary: Summary, nan_tensors: int = 0, weights_only: Verdict | None = None) -> Text:
    """Two lines of totals, the weights_only verdict when known, then the findings in plain words."""
    ckpt = summary.checkpoint
    text = Text()
    text.append(os.path.basename(ckpt.path.rstrip("/")) or ckpt.path, style="bold")
    text.append(f"  {FORMAT_NAMES.get(ckpt.format, ckpt.format)} · {size(ckpt.file_bytes)}")
    text.append(f" · {len(summary.tensors)} tensors · {count(summary.parameter_count)} params")
    text.append(f" · {size(summary.tensor_bytes)}\n")
    dtypes = ", ".join(f"{d} {n}" for d, n in summary.dtypes.most_common(4))
    devices = ", ".join(f"{d} {n}" for d, n in summary.devices.most_common(4))
    text.append(f"dtypes {dtypes or '-'} · saved on ", style="dim")
    text.append(devices or "-", style="bold yellow" if any("cuda" in d for d in summary.devices) else "dim")
    if nan_tensors:
        text.append(f"\n! {nan_tensors} tensors hold NaN/Inf", style="bold red")
    if weights_only is not None and weights_only.loads is not None:
        refused = weights_only.loads is False
        text.append("\n! " if refused else "\n· ", style="bold red" if refused else "dim")
        text.append(printable(weights_only.headline()), style="" if refused else "dim")
    shown = summary.findings[:MAX_FINDINGS]
    for finding in shown:
        warning = finding.severity == "warning"
        text.append("\n")
        text.append("! " if warning else "· ", style="bold red" if warning else "dim")
        text.append(finding.message, style="" if warning else "dim")
        if finding.fix is not None and finding.fix.option in FIX_KEYS:
            text.append(f" ({FIX_KEYS[finding.fix.option]})", style="dim")
    hidden = len(summary.findings) - len(shown)
    if hidden > 0:
        text.append(f"\n  … {hidden} more findings (ckpt-tui info)", style="dim")
    return text


class SummaryHeader(Static):
    """Shows a Summary."""

    def show(self, summary: Summary) -> None:
        """Render a summary."""
        self.update(summary_text(summary))
