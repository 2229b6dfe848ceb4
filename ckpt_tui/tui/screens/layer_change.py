"""The per-layer change (``s`` on a diff report): how far each layer of the staged tree moved to the other
file (relative change, cosine, norms; the model's weights first), as ``diff --stats`` reports it."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ckpt_tui.tui.screens.diff import PairReportScreen, taken_sides
from ckpt_tui.tui.screens.report import Job, row_width

if TYPE_CHECKING:
    from ckpt_tui.core.operations.reports import Report as Described


class LayerChangeScreen(PairReportScreen):
    """Measure every layer from the staged tree to ``other``; dismissed with a jump or None."""

    TASK = "layer-change"

    def heading(self) -> str:
        a, b = self.names()
        return f"Per-layer change from {a} to {b}"

    def doing(self) -> str:
        return f"measuring each layer against {os.path.basename(self.other)}"

    def job(self) -> Job:
        mine, other, alignment, swapped = self.mine, self.other, self.alignment, self.swapped

        def run(progress: Any, cancelled: Any) -> Any:
            from ckpt_tui.core.operations.layer_change import layer_change

            a, b = taken_sides(mine, other, alignment, swapped)
            return layer_change(a, b, progress=progress, cancelled=cancelled)

        return run

    def described(self, report: Any) -> Described:
        from ckpt_tui.core.operations.reports import describe_layer_change

        # the title names how each side's keys are taken; the counts name the files alone
        a, b = self.files()
        return describe_layer_change(report, a, b, row_width(self.app.size.width))

    def action_layer_change(self) -> None:
        self.notify("this is the per-layer change", markup=False)
