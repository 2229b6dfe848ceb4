"""Fitting a line into the columns it has: what goes first, and a key shortened in the middle.

A line is a list of ``Part``s. When it is too wide, parts are dropped by level (the highest first:
bytes, then the device, ...), then long forms give way to short ones (``float32`` → ``fp32``), then a
check's marker gives up its words (``!! NaN`` → ``!!``), then the key is shortened (its start from the
left, the middle of its longest names; its numbers and last component kept), and only then is the line
cut at its end; the parts marked ``end`` (the marker) are never cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from rich.text import Span, Text

from ckpt_tui.core.values.text_plots import shorten

SHORTEN = 2
"""The level at which parts with a short form take it (after the levels above it are dropped)."""
MIN_KEY = 8
"""A key is never shortened below this many columns (unless the line has no more room at all)."""
ELLIPSIS = "…"
SHORT_DTYPES = {
    "float32": "fp32",
    "float16": "fp16",
    "bfloat16": "bf16",
    "float64": "fp64",
    "int64": "i64",
    "int32": "i32",
    "int16": "i16",
    "int8": "i8",
    "uint8": "u8",
    "complex64": "c64",
    "complex128": "c128",
}
"""The dtype as a narrow line shows it (the detail panel has the full name)."""


class Part(NamedTuple):
    """A piece of a line: its text and style, and how it gives way when the line is too wide."""

    text: str
    style: str = ""
    drop: int = 0
    """Dropped when the line is too wide, the highest level first; 0: never dropped."""
    short: str | None = None
    """A shorter form taken at level ``SHORTEN`` (``fp32`` for ``float32``)."""
    key: bool = False
    """The key: shortened in the middle once nothing else can go."""
    end: bool = False
    """Kept at the end of the line (a marker in words), never cut: its ``short`` form is taken just before the
    key would be shortened."""
    compact: bool = False
    """Gives way (dropped, or its short form) on every line of a narrow view alike, so a column reads the same
    down the screen."""


def styled(parts: list[Part] | list[tuple[str, str]]) -> Text:
    """One Text from parts, built in one step (cheap enough for 50,000 lines)."""
    plain: list[str] = []
    spans: list[Span] = []
    position = 0
    for part in parts:
        text, style = part[0], part[1]
        if style and text:
            spans.append(Span(position, position + len(text), style))
        plain.append(text)
        position += len(text)
    return Text("".join(plain), spans=spans)


def width_of(parts: list[Part]) -> int:
    """The columns the parts take (the texts are escaped, one column a character)."""
    return sum(len(part.text) for part in parts)


def short_key(text: str, width: int) -> str:
    """``text`` in ``width`` columns, by core's one rule (:func:`shorten`: whole when it fits, else its start
    given up from the left and the middle of its longest names, never a name to its initial)."""
    return shorten(text, width)


def compacted(parts: list[Part]) -> list[Part]:
    """The line as a narrow view shows every line: ``compact`` parts dropped or in their short form."""
    return [
        part._replace(text=part.short, compact=False) if part.compact and part.short is not None else part
        for part in parts
        if not part.compact or part.short is not None
    ]


def _given_way(parts: list[Part], width: int, compact: bool) -> tuple[list[Part], bool]:
    """The line with its parts dropped or in their short forms, level by level, until it fits ``width`` (then
    True), or none is left to give way (then False: the key is what gives way next)."""
    shown = compacted(parts) if compact else list(parts)
    if width_of(shown) <= width:
        return shown, True
    for level in sorted({part.drop for part in parts} | {SHORTEN}, reverse=True):
        if level <= 0:
            break
        shown = [
            part._replace(text=part.short, short=None)
            if level == SHORTEN and part.short is not None and not part.end
            else part
            for part in shown
            if part.drop != level
        ]
        if width_of(shown) <= width:
            return shown, True
    # a marker's words go before the key is cut: the key says where, the mark alone says that something is
    # there (the header and the detail panel say what)
    if any(part.end and part.short is not None for part in shown):
        shown = [part._replace(text=part.short, short=None) if part.end and part.short else part for part in shown]
        if width_of(shown) <= width:
            return shown, True
    return shown, False


def key_room(parts: list[Part], width: int, compact: bool = False) -> int | None:
    """The columns the line's key gets once everything else has given way (as :func:`fitted` gives it), or
    None when the line fits with its key whole."""
    shown, fits = _given_way(parts, width, compact)
    key = next((part for part in shown if part.key), None)
    if fits or key is None:
        return None
    others = sum(len(part.text) for part in shown if not part.key)
    return max(width - others, min(len(key.text), MIN_KEY))


def fitted(parts: list[Part], width: int, compact: bool = False) -> Text:
    """The line in at most ``width`` columns (in a narrow view when ``compact``), giving way as the module says."""
    shown, fits = _given_way(parts, width, compact)
    if fits:
        return styled(shown)
    others = sum(len(part.text) for part in shown if not part.key)
    shown = [
        part._replace(text=short_key(part.text, max(width - others, min(len(part.text), MIN_KEY))))
        if part.key
        else part
        for part in shown
    ]
    if width_of(shown) <= width:
        return styled(shown)
    return _cut(shown, width)


def _cut(parts: list[Part], width: int) -> Text:
    """The line cut at its end with ``…``, keeping the ``end`` parts whole when they fit."""
    ends = [part for part in parts if part.end]
    room = width - width_of(ends)
    if room < 2:
        ends, room = [], width
    head = styled([part for part in parts if not part.end])
    head.truncate(max(room, 0), overflow="ellipsis")
    return head + styled(ends) if ends else head


class Column(NamedTuple):
    """A table column as fitting sees it: its name and the widths its cells need, whole and compact."""

    name: str
    width: int
    compact: int
    """The width in a narrow view (numbers with fewer digits, short dtype names)."""


def fit_columns(
    columns: Sequence[Column], priority: Sequence[str], key: str, room: int, key_min: int, padding: int = 2
) -> tuple[list[str], int, bool]:
    """The columns shown in ``room`` cells, the ``key`` column's width, and whether the compact forms are used.

    The whole forms first; then the compact forms; then the columns last in ``priority`` go one by one
    while the key would get less than ``key_min``; the key takes the room left (up to what it needs).
    Columns not in ``priority`` are always kept. ``padding``: the cells a column takes beside its text.
    """
    shown = [column.name for column in columns]
    whole = {column.name: column.width for column in columns}
    compact = {column.name: column.compact for column in columns}

    def key_room(widths: dict[str, int]) -> int:
        return room - sum(widths[name] + padding for name in shown if name != key) - padding

    if key_room(whole) >= min(whole[key], key_min):
        return shown, min(whole[key], key_room(whole)), False
    for name in [name for name in reversed(priority) if name in shown and name != key]:
        if key_room(compact) >= min(compact[key], key_min):
            break
        shown.remove(name)
    return shown, max(1, min(compact[key], key_room(compact))), True
