"""Plots drawn with Unicode block characters: readable without colour, any width."""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Sequence

EIGHTHS = " ▏▎▍▌▋▊▉█"
LEVELS = "▁▂▃▄▅▆▇█"
MISSING = "·"
NONFINITE = "!"


def bar(fraction: float, width: int) -> str:
    """A horizontal bar ``fraction`` (0..1) of ``width`` cells long, in eighths of a cell."""
    if not math.isfinite(fraction) or fraction <= 0:
        return ""
    eighths = round(min(fraction, 1.0) * width * 8)
    full, part = divmod(eighths, 8)
    return "█" * full + (EIGHTHS[part] if part else "")


def sparkline(values: Sequence[float | None], width: int) -> str:
    """One block per value (scaled from the smallest to the largest), ``·`` for a missing one, ``!`` for a NaN
    or infinite one.

    More values than ``width`` are averaged in ``width`` consecutive buckets.
    """
    if len(values) > width:
        values = _buckets(values, width)
    known = [v for v in values if v is not None and math.isfinite(v)]
    low, high = (min(known), max(known)) if known else (0.0, 0.0)
    out = []
    for value in values:
        if value is None:
            out.append(MISSING)
        elif not math.isfinite(value):
            out.append(NONFINITE)
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


PARTIAL_KEPT = 2
"""A component cut in part keeps at least this many letters before its ``…`` (else just its first letter)."""
_BOUNDARIES = "./[]\"'"
_WORD = re.compile(r"[^./\[\]\"']+")
_NAME = re.compile(r"[A-Za-z_][\w-]*|\d+")
_NUMBER = re.compile(r"\d+")
"""A component of a key path (``layer1``, ``0``, ``exp_avg``): other text is not shortened to initials."""
HEAD_KEPT = 4
"""Characters of other text's start kept before its ``…`` when its end leaves room."""


def shorten(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, keeping what tells keys apart. A key path's components are cut
    to their first letter from the left (``e.l.0.atten….output.LayerNorm.bias``), except those holding digits
    (the layer's index) and the last one (the parameter); where even all of them cut is too long, ``…`` and the
    end of that, from a component's start where one fits (``…0.a.o.L.bias``). Other text (a key holding a
    repr, spaces, braces) keeps its start, ``…``, and its last components, each whole."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    words = [match.span() for match in _WORD.finditer(text)]
    if not all(_NAME.fullmatch(text, start, end) for start, end in words):
        return _middle(text, width)
    # an ellipsis in the middle hides how many components went and which index they held (layer 0 and
    # layer 1 read the same); initials keep every component's place, the numbers and the parameter whole
    fitted = _initials(text, words, width)
    if fitted is not None:
        return fitted
    short = _initials(text, words, 0) or text
    end = _end(short, width)
    start, stop = words[-1]
    if _NUMBER.findall(end) != _NUMBER.findall(text) and stop - start > 1 and _NAME.fullmatch(text, start, stop):
        # the layer's number tells rows apart more than the parameter's whole name: that goes to its initial
        # too (``…0.a.s.q.w``), where it keeps the numbers in
        initial = short[: len(short) - (len(text) - start) + 1] + text[stop:]
        kept = _end(initial, width)
        if _NUMBER.findall(kept) == _NUMBER.findall(text):
            return kept
    return end


def shorten_all(texts: Sequence[str], width: int | Sequence[int]) -> list[str]:
    """Each of ``texts`` (one listing's keys) in at most ``width`` characters (one for all, or each its own), by
    one rule for the whole listing, so that its keys line up and read alike: where a key must be shortened, a
    leading component is cut to its first letter in every key under the same path (``encoder.layers.`` →
    ``e.l.`` in each of them; layers told apart by their numbers count as one path), as few paths as make
    every key fit, the key furthest over first. Keys under other paths stay whole; what is still too long (a
    key holding a repr) is shortened as :func:`shorten` does it."""
    widths = [width] * len(texts) if isinstance(width, int) else list(width)
    if all(len(text) <= room for text, room in zip(texts, widths, strict=True)):
        return list(texts)
    if any(_HOLE in text for text in texts):
        return [shorten(text, room) for text, room in zip(texts, widths, strict=True)]
    # keys alike but for their numbers (every layer's weight, or a folded row's {0..3}) are one pattern:
    # parsed and cut once
    patterns: dict[str, int] = {}
    over: list[int] = []  # per pattern: how far its longest key is over its width
    of_key: list[int] = []
    for text, room in zip(texts, widths, strict=True):
        pattern = _NUMBERED.sub(_HOLE, text)
        at = patterns.setdefault(pattern, len(patterns))
        if at == len(over):
            over.append(len(text) - room)
        else:
            over[at] = max(over[at], len(text) - room)
        of_key.append(at)
    keys = [_Cuttable.of(pattern) for pattern in patterns]
    under: dict[tuple[str, ...], list[int]] = {}
    for at, key in enumerate(keys):
        for path in key.paths:
            under.setdefault(path, []).append(at)
    cut: set[tuple[str, ...]] = set()
    heap = [(-excess, at) for at, excess in enumerate(over) if excess > 0 and keys[at].paths]
    heapq.heapify(heap)
    while heap:
        negative, at = heapq.heappop(heap)
        if -negative != over[at] or over[at] <= 0:
            continue  # a stale entry: the pattern was shortened since
        left = [path for path in keys[at].paths if path not in cut]
        if not left:
            continue  # nothing left to cut to initials: shortened one key at a time below
        cut.add(left[0])
        for other in under[left[0]]:
            over[other] -= keys[other].saved[left[0]]
            if over[other] > 0:
                heapq.heappush(heap, (-over[other], other))
    # each pattern as shown, split where its numbers go back in
    pieces = [key.render(cut).split(_HOLE) for key in keys]
    shown = []
    for text, room, at in zip(texts, widths, of_key, strict=True):
        parts = pieces[at]
        filled = parts[0]
        if len(parts) > 1:
            filled += "".join(n + p for n, p in zip(_NUMBERED.findall(text), parts[1:], strict=True))
        shown.append(filled if len(filled) <= room else shorten(filled, room))
    return shown


_HOLE = "\x00"
"""Where a number stood in a key's pattern (:func:`shorten_all`)."""
_NUMBERED = re.compile(r"\{[^{}]*\}|\d+")
"""A number, or the numbers a folded row stands for (``{0..3}``, ``{0,1,3}``)."""


class _Cuttable:
    """A key pattern's components that may be cut to their first letter, each named by its path (the names
    before it and its own); a component holding a number (``layers.0``, ``layer1``) stays whole."""

    def __init__(self, text: str, spans: list[tuple[int, int]], paths: list[tuple[str, ...]]) -> None:
        self.text = text
        self.spans = spans
        self.paths = paths
        self.saved = {path: end - start - 1 for path, (start, end) in zip(paths, spans, strict=True)}

    @classmethod
    def of(cls, pattern: str) -> _Cuttable:
        plain = pattern.replace(_HOLE, "0")
        words = [match.span() for match in _WORD.finditer(plain)]
        if not all(_NAME.fullmatch(plain, start, end) for start, end in words):
            return cls(pattern, [], [])  # a repr, spaces, braces: not a key path
        names = tuple(pattern[start:end] for start, end in words)
        spans, paths = [], []
        # the last component (the parameter) stays whole, as do the numbers
        for at, (start, end) in enumerate(words[:-1]):
            if end - start > 1 and _HOLE not in names[at]:
                spans.append((start, end))
                paths.append(names[: at + 1])
        return cls(pattern, spans, paths)

    def render(self, cut: set[tuple[str, ...]]) -> str:
        pieces, position = [], 0
        for (start, end), path in zip(self.spans, self.paths, strict=True):
            if path in cut:
                pieces.append(self.text[position : start + 1])
                position = end
        return "".join(pieces) + self.text[position:]


def _end(text: str, width: int) -> str:
    """``…`` and the end of ``text`` in ``width`` characters, from a component's start where one fits and the
    cut leaves no number out (``…yer1.0.conv1.weight``)."""
    if len(text) <= width:
        return text
    room = width - 1
    start = len(text) - room
    cut = next((i for i in range(start, len(text)) if text[i - 1] in _BOUNDARIES), start)
    if any(char.isdigit() for char in text[start:cut]):
        cut = start
    return "…" + text[cut:]


def _middle(text: str, width: int) -> str:
    """``text`` shortened in the middle: its start, ``…``, and its last components, each whole."""
    room = width - 1
    # the longest tail of whole components that leaves the start HEAD_KEPT characters, else any that fits:
    # the last components are what tells keys apart, the start says which part of the file
    cuts = [i for i in range(len(text) - room, len(text)) if text[i - 1] in _BOUNDARIES]
    roomy = [i for i in cuts if len(text) - i <= room - HEAD_KEPT]
    cut = roomy[0] if roomy else cuts[0] if cuts else len(text) - room
    head = room - (len(text) - cut)
    return text[:head] + "…" + text[cut:]


def shared_start(keys: Sequence[str]) -> str:
    """The start every one of ``keys`` shares, up to a component's end (``model_state_dict/``,
    ``ckpt["optimizer"]["state"]``): a table says it once above its rows instead of on each; ``""`` for fewer
    than two keys, or when a key would be left empty."""
    if len(keys) < 2:
        return ""
    first, last = min(keys), max(keys)
    common = 0
    while common < len(first) and first[common] == last[common]:
        common += 1
    shortest = min(map(len, keys))
    # cut after a "." or "/", or before a "[": what is left of every key starts a component
    for cut in range(min(common, shortest - 1), 0, -1):
        if first[cut - 1] in "./" or first[cut] == "[":
            return first[:cut]
    return ""


def _initials(text: str, words: list[tuple[int, int]], width: int) -> str | None:
    """``text`` with its first wordy components cut to their first letter, as few as make it fit ``width``
    (with ``width`` 0: all of them), or None when all of them are not enough. The last one cut keeps what
    fits of its start, marked ``…``, when that is two letters or more (``e.l.0.atten….output.LayerNorm.bias``)."""
    excess = len(text) - width
    cut: list[tuple[int, int, str]] = []
    for start, end in words[:-1]:
        if end - start > 1 and not any(char.isdigit() for char in text[start:end]):
            kept = end - start - 1 - excess  # the letters this one can keep, and the "…", once it is the last
            if width and kept >= PARTIAL_KEPT:
                cut.append((start + kept, end, "…"))
                excess = 0
                break
            cut.append((start + 1, end, ""))
            excess -= end - start - 1
            if width and excess <= 0:
                break
    if width and excess > 0:
        return None
    pieces, position = [], 0
    for start, end, mark in cut:
        pieces.append(text[position:start] + mark)
        position = end
    return "".join(pieces) + text[position:]


def clip_middle(text: str, width: int) -> str:
    """:func:`shorten`, padded to ``width``."""
    return shorten(text, width).ljust(width)


def number(value: float | None, width: int = 9) -> str:
    """A number in ``width`` characters (3 significant digits), ``-`` for none."""
    return ("-" if value is None else f"{value:.3g}").rjust(width)


def wrapped(line: str, width: int | None, indent: int) -> list[str]:
    """A sentence as lines of at most ``width`` (between words; a word longer than a line is left whole), the
    later ones starting at column ``indent``; as it is without a width or when it fits."""
    if width is None or len(line) <= width:
        return [line]
    import textwrap

    return textwrap.wrap(
        line,
        width,
        subsequent_indent=" " * indent,
        break_long_words=False,
        break_on_hyphens=False,
        drop_whitespace=True,
    ) or [line]
