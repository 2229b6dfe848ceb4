"""Plots drawn with Unicode block characters: readable without colour, any width."""

from __future__ import annotations

import math
from collections.abc import Sequence

EIGHTHS = " ▏▎▍▌▋▊▉█"
LEVELS = "▁▂▃▄▅▆▇█"
MISSING = "·"


def bar(fraction: float, width: int) -> str:
    """A horizontal bar ``fraction`` (0..1) of ``width`` cells long, in eighths of a cell."""
    if not math.isfinite(fraction) or fraction <= 0:
        return ""
    eighths = round(min(fraction, 1.0) * width * 8)
    full, part = divmod(eighths, 8)
    return "█" * full + (EIGHTHS[part] if part else "")


def sparkline(values: Sequence[float | None], width: int) -> str:
    """One block per value (scaled from the smallest to the largest), ``·`` for a missing one.

    More values than ``width`` are averaged in ``width`` consecutive buckets.
    """
    if len(values) > width:
        values = _buckets(values, width)
    known = [v for v in values if v is not None and math.isfinite(v)]
    if not known:
        return MISSING * len(values)
    low, high = min(known), max(known)
    out = []
    for value in values:
        if value is None or not math.isfinite(value):
            out.append(MISSING)
        elif high == low:
            out.append(LEVELS[len(LEVELS) // 2])
        else:
            out.append(LEVELS[min(len(LEVELS) - 1, int((value - low) / (high - low) * len(LEVELS)))])
    return "".join(out)


def _buckets(values: Sequence[float | None], width: int) -> list[float | None]:
    out: list[float | None] = []
    for index in range(width):
        part = values[index * len(values) // width : (index + 1) * len(values) // width]
        known = [v for v in part if v is not None]
        out.append(sum(known) / len(known) if known else None)
    return out


HEAD_KEPT = 4
"""Characters of a shortened key's start kept before the ``…`` when its end leaves room."""
_BOUNDARIES = "./[]\"'"


def shorten(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, shortened in the middle: its start, ``…``, and its last
    components, each whole (``model.enc…layers.3.attn.weight``, ``ckpt["opt…[0]["exp_avg"]``). Where not
    even the last component fits, its end is kept."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    room = width - 1
    # the longest tail of whole components that leaves the start HEAD_KEPT characters, else any that fits:
    # the last components are what tells keys apart, the start says which part of the file
    cuts = [i for i in range(len(text) - room, len(text)) if text[i - 1] in _BOUNDARIES]
    roomy = [i for i in cuts if len(text) - i <= room - HEAD_KEPT]
    cut = roomy[0] if roomy else cuts[0] if cuts else len(text) - room
    head = room - (len(text) - cut)
    return text[:head] + "…" + text[cut:]


def clip_middle(text: str, width: int) -> str:
    """:func:`shorten`, padded to ``width``."""
    return shorten(text, width).ljust(width)


def number(value: float | None, width: int = 9) -> str:
    """A number in ``width`` characters (3 significant digits), ``-`` for none."""
    return ("-" if value is None else f"{value:.3g}").rjust(width)
