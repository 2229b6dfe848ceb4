"""Plots drawn with Unicode block characters: no dependency, any terminal, the same under NO_COLOR.

Each function returns a ``rich.text.Text``; the shape of the bars carries the meaning, colour never
does, and every mark under a bar is a character (``x`` dead, ``!`` marked, ``^`` the cursor).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from rich.text import Text

from ckpt_tui.core.values import text_plots

EIGHTHS = " ▁▂▃▄▅▆▇█"
FULL = "█"
PARTIAL = " ▏▎▍▌▋▊▉"
EMPTY = "·"
MAX_COLUMN = 4
"""A chart of few values draws each as a column this wide at most (a bar and a gap)."""


def column_chart(
    values: Sequence[float | None],
    height: int,
    width: int,
    log: bool = False,
    marks: Sequence[str] = (),
) -> list[str]:
    """Vertical bars, one column per value (values beyond ``width`` are bucketed by their largest).

    ``marks`` (one character per value, space for none) are drawn on a line under the bars; a bucket
    shows its first mark. ``None`` values (no statistics) are drawn as an empty column.
    """
    if not values:
        return []
    buckets = _buckets(len(values), width)
    heights: list[float | None] = []
    below: list[str] = []
    for start, stop in buckets:
        chunk = [v for v in values[start:stop] if v is not None]
        heights.append(max(chunk) if chunk else None)
        marked = [m for m in marks[start:stop] if m.strip()] if marks else []
        below.append(marked[0] if marked else " ")
    per = max(1, min(MAX_COLUMN, width // len(buckets)))
    scaled = _scale(heights, height * 8, log)
    rows = []
    for level in range(height, 0, -1):
        floor = (level - 1) * 8
        cells = (EIGHTHS[max(0, min(8, s - floor))] if s is not None else " " for s in scaled)
        rows.append("".join(cell * (per - 1 if per > 1 else 1) + (" " if per > 1 else "") for cell in cells))
    if any(m.strip() for m in below):
        rows.append("".join(m.ljust(per) for m in below).rstrip())
    else:
        rows.append("─" * (per * len(buckets)))
    return rows


def histogram(counts: Sequence[int], height: int, width: int, log: bool = False) -> list[str]:
    """A histogram as vertical bars, each bin ``width // len(counts)`` columns wide (at least 1)."""
    if not counts:
        return []
    per = max(1, width // len(counts))
    scaled = _scale([float(c) for c in counts], height * 8, log)
    rows = []
    for level in range(height, 0, -1):
        floor = (level - 1) * 8
        rows.append("".join(EIGHTHS[max(0, min(8, (s or 0) - floor))] * per for s in scaled))
    rows.append("─" * (per * len(counts)))
    return rows


def bar(value: float, top: float, width: int) -> str:
    """A horizontal bar of ``width`` cells, filled in eighths; the rest dotted (visible without colour)."""
    filled = text_plots.bar(value / top if top > 0 else 0.0, width)
    if value > 0 and not filled:
        filled = PARTIAL[1]  # a value too small for an eighth still shows
    return filled + EMPTY * (width - len(filled))


def _buckets(count: int, width: int) -> list[tuple[int, int]]:
    """``count`` items split into at most ``width`` consecutive buckets."""
    width = max(1, width)
    if count <= width:
        return [(i, i + 1) for i in range(count)]
    edges = [round(i * count / width) for i in range(width + 1)]
    return [(a, b) for a, b in itertools.pairwise(edges) if b > a]


def _scale(values: Sequence[float | None], top_eighths: int, log: bool) -> list[int | None]:
    """Each value as a height in eighths of a cell; a non-zero value is at least one eighth."""
    present = [v for v in values if v is not None and math.isfinite(v)]
    top = max(present, default=0.0)
    out: list[int | None] = []
    for value in values:
        if value is None or not math.isfinite(value):
            out.append(None)
            continue
        if top <= 0 or value <= 0:
            out.append(0)
            continue
        fraction = math.log1p(value) / math.log1p(top) if log else value / top
        out.append(max(1, round(fraction * top_eighths)))
    return out


def lines_text(lines: list[str], style: str = "") -> Text:
    """Plot lines as one Text."""
    return Text("\n".join(lines), style=style, no_wrap=True, overflow="crop")
