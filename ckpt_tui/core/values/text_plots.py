"""Plots drawn with Unicode block characters: readable without colour, any width."""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Callable, Sequence

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


COMFORT = 12
"""A component is cut in its middle first only when it is longer than this, to no fewer characters and no
less than three quarters of it (``post_attention_layernorm`` → ``post_attention…norm``)."""
FLOOR = 7
"""No component is cut in its middle to fewer characters than this (``post…rm``), ``…`` included."""
HEAD_KEPT = 4
"""Characters of other text's start kept before its ``…`` when its end leaves room."""
_BOUNDARIES = "./[]\"'"
_NAMED = re.compile(r"(?:[\w-]|\{[^{}]*\})+")
"""A component of a key path (``layer1``, ``0``, ``exp_avg``, a folded row's ``{0..3}``); other text (a repr,
spaces) is no key path, and is cut in its middle."""
_KEY_PATH = re.compile(r"[./\[\]\"']*(?:[\w-]|\{[^{}]*\})+(?:[./\[\]\"']+(?:[\w-]|\{[^{}]*\})+)*[./\[\]\"']*")
"""A key path: components between the characters that part them, nothing else."""
_DIGIT = re.compile(r"\d")
_NUMBERED = re.compile(r"\{[^{}]*\}|\d+")
"""A number, or the numbers a folded row stands for (``{0..3}``, ``{0,1,3}``)."""


def shorten(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, by the one rule of :func:`shorten_all`."""
    return shorten_all([text], width)[0]


def shorten_all(texts: Sequence[str], width: int | Sequence[int]) -> list[str]:
    """Each of ``texts`` (one listing's keys) in at most ``width`` characters (one for all, or each its own).

    A key that fits is shown whole; only one that does not is cut, and never a component to its initial. It
    gives up, as far as it must: its start from the left, up to the layer's index (``…0.post_attention_
    layernorm.weight``: what its siblings share, the least telling part); then the middle of its longest names,
    to no less than three quarters of each (``post_attention…norm``), then down to :data:`FLOOR`; and only then
    its end, every number kept where it can be (``…yer1.0.conv1.weight``), else its numbers and as many of its
    names as fit (``…layer3.0.…0.weight``). The leaf (the parameter) and the numbers stay. One name is cut to
    one length in every key of the listing that is cut, so the rows read alike. Other text (a key holding a
    repr) keeps its start, ``…``, and its last components."""
    widths = [width] * len(texts) if isinstance(width, int) else list(width)
    shown = list(texts)
    paths: list[tuple[int, _Path]] = []
    for at, (text, room) in enumerate(zip(texts, widths, strict=True)):
        if len(text) <= room:
            continue
        if room <= 1:
            shown[at] = "…"[:room]
            continue
        path = _Path.of(text)
        if path is None:
            shown[at] = _middle(text, room)
        else:
            paths.append((at, path))
    if not paths:
        return shown
    caps: dict[str, int] = {}
    starts = {at: path.fitting(caps, widths[at], 0, path.first) for at, path in paths}
    # keys under one path give up as much of it alike (``…0.`` in every layer's key that is cut, not ``…layer.0.``
    # in some), as the one that gives up most
    alike: dict[tuple[str, ...], int] = {}
    for at, path in paths:
        start = starts[at]
        if start is not None:
            group = tuple(path.names[: path.first + 1])
            alike[group] = max(alike.get(group, 0), start)
    starts = {at: None if starts[at] is None else alike[tuple(path.names[: path.first + 1])] for at, path in paths}
    mild = [(path, path.first, widths[at]) for at, path in paths if starts[at] is None]
    _level(mild, caps, lambda length: max(COMFORT, -(-3 * length // 4)))
    deep = [(path, first, room) for path, first, room in mild if path.fitting(caps, room, first, first) is None]
    # a name of a few letters more than FLOOR is not cut at all: two letters saved are not worth a riddle
    _level(deep, caps, lambda length: FLOOR if length > FLOOR + 2 else length)
    for at, path in paths:
        start = starts[at]
        if start is not None:
            # a key that fits by its start alone keeps every name whole
            shown[at] = path.render({}, start)
            continue
        text = path.render(caps, path.first)
        shown[at] = text if len(text) <= widths[at] else path.end(caps, widths[at])
    return shown


class _Path:
    """A key path's components, as :func:`shorten_all` cuts them: the components before the layer's index,
    from the left, or the middle of a name (not the leaf, not one ending in a number)."""

    __slots__ = ("cuttable", "first", "last", "names", "spans", "starts", "text")

    def __init__(self, text: str, spans: list[tuple[int, int]]) -> None:
        self.text = text
        self.spans = spans
        # one name for every layer's copy of a component (``mp_rank_00_…``, ``mp_rank_01_…``): cut alike
        words = [text[start:end] for start, end in spans]
        self.names = [_NUMBERED.sub("#", word) if _DIGIT.search(word) else word for word in words]
        leaf = len(spans) - 1
        indexed = [at for at, (_, end) in enumerate(spans[:leaf]) if text[end - 1].isdigit() or text[end - 1] == "}"]
        self.cuttable = [at < leaf and at not in indexed for at in range(len(spans))]
        # the start goes first as far as the first index (every number kept), else the leaf's parent; at the
        # last as far as the last index, else the leaf
        self.first = indexed[0] if indexed else max(leaf - 1, 0)
        self.last = indexed[-1] if indexed else leaf
        self.starts = [_component_start(text, start) for start, _ in spans]

    @classmethod
    def of(cls, text: str) -> _Path | None:
        """The key path ``text`` is, or None for other text."""
        if not _KEY_PATH.fullmatch(text):
            return None
        spans = [match.span() for match in _NAMED.finditer(text)]
        return cls(text, spans) if len(spans) > 1 else None

    def sizes(self, caps: dict[str, int], start: int) -> list[tuple[int, int, str]]:
        """The cuttable names from component ``start`` on: as long as ``caps`` lets them be, whole, and named."""
        return [
            (min(end - begin, caps.get(self.names[at], end - begin)), end - begin, self.names[at])
            for at, (begin, end) in enumerate(self.spans)
            if at >= start and self.cuttable[at]
        ]

    def length(self, caps: dict[str, int], start: int) -> int:
        """The length of :meth:`render`, without building it."""
        length = len(self.text) - self.starts[start] + (1 if start else 0)
        if not caps:
            return length
        return length - sum(whole - size for size, whole, _ in self.sizes(caps, start))

    def render(self, caps: dict[str, int], start: int) -> str:
        """The key with its names cut to ``caps``, from component ``start`` on (``…`` before it when not 0)."""
        pieces = ["…"] if start else []
        position = self.starts[start]
        for at, (begin, end) in enumerate(self.spans):
            cap = caps.get(self.names[at], end - begin)
            if at >= start and self.cuttable[at] and cap < end - begin:
                pieces += [self.text[position:begin], _cut_middle(self.text[begin:end], cap)]
                position = end
        return "".join(pieces) + self.text[position:]

    def end(self, caps: dict[str, int], width: int) -> str:
        """The key from its first index on, in ``width``, where its names cut to ``caps`` are still too long: its
        end, where that keeps every number (``…yer1.0.conv1.weight``); else its numbers and its leaf, with as many
        of its names as fit, nearest the leaf first, each run left out said ``…`` (``…layer3.0.…0.weight``)."""
        text = self.render(caps, self.first)
        end = _end(text, width)
        if _NUMBERED.findall(end) == _NUMBERED.findall(self.text[self.starts[self.first] :]):
            return end
        names = [at for at in range(self.first, len(self.spans)) if self.cuttable[at]]
        kept: set[int] = set()
        for at in reversed(names):
            if len(self._skeleton(caps, kept | {at})) <= width:
                kept.add(at)
        shown = self._skeleton(caps, kept)
        if len(shown) > width:
            # the leaf gives way last, in its middle (num_b…cked), before the end alone
            leaf = self.spans[-1][1] - self.spans[-1][0]
            shown = self._skeleton(caps, kept, max(FLOOR, leaf - (len(shown) - width)))
        return shown if len(shown) <= width else _end(shown, width).replace("……", "…")

    def _skeleton(self, caps: dict[str, int], kept: set[int], leaf: int | None = None) -> str:
        """The key from its first index on: its numbers, its leaf (cut to ``leaf``), and the names in ``kept``;
        each run of names left out said ``…``."""
        pieces = ["…"] if self.first else []
        left_out = False
        previous = self.starts[self.first]
        for at in range(self.first, len(self.spans)):
            begin, end = self.spans[at]
            before = self.text[previous:begin]
            previous = end
            if self.cuttable[at] and at not in kept:
                if not left_out:
                    pieces += [before, "…"]
                left_out = True
                continue
            name = self.text[begin:end]
            if self.cuttable[at] and caps.get(self.names[at], len(name)) < len(name):
                name = _cut_middle(name, caps[self.names[at]])
            elif at == len(self.spans) - 1 and leaf is not None and leaf < len(name):
                name = _cut_middle(name, leaf)
            pieces += [name] if left_out and before in "./" else [before, name]
            left_out = False
        return "".join(pieces) + self.text[previous:]

    def fitting(self, caps: dict[str, int], width: int, low: int, high: int) -> int | None:
        """The first component from ``low`` to ``high`` the key can start at and fit ``width`` with ``caps``, or
        None."""
        return next((start for start in range(low, high + 1) if self.length(caps, start) <= width), None)


def _component_start(text: str, begin: int) -> int:
    """Where the key is cut from the left to start at the component at ``begin``: at its ``[`` where it has one
    (``…["state"][0]``, not ``…state"][0]``)."""
    at = begin
    while at > 0 and text[at - 1] in "\"'":
        at -= 1
    return at - 1 if at > 0 and text[at - 1] == "[" else begin


def _cut_middle(name: str, width: int) -> str:
    """``name`` in ``width`` characters: its start, ``…``, and its last few letters (``post_attention…norm``)."""
    kept = width - 1
    tail = max(2, min(4, kept // 3))
    return name[: kept - tail] + "…" + name[len(name) - tail :]


def _level(keys: list[tuple[_Path, int, int]], caps: dict[str, int], floor: Callable[[int], int]) -> None:
    """Lower ``caps`` until every key (a path, the component it starts at, its width) fits, or has no name left
    longer than its ``floor`` (of its whole length): the key furthest over first, its longest name down to the
    next longest (the names levelled, not one cut to nothing). Keys alike but for their numbers are weighed
    once, by the one furthest over."""
    patterns: dict[tuple[str, int], tuple[_Path, int, int]] = {}
    for path, start, room in keys:
        slack = len(path.text) - room
        pattern = (_NUMBERED.sub("#", path.text), start)
        known = patterns.get(pattern)
        if known is None or slack > len(known[0].text) - known[2]:
            patterns[pattern] = (path, start, room)
    weighed = list(patterns.values())
    under: dict[str, list[int]] = {}
    for at, (path, start, _) in enumerate(weighed):
        for _, _, name in path.sizes({}, start):
            under.setdefault(name, []).append(at)

    def excess(at: int) -> int:
        path, start, room = weighed[at]
        return path.length(caps, start) - room

    heap = [(-excess(at), at) for at in range(len(weighed)) if excess(at) > 0]
    heapq.heapify(heap)
    while heap:
        negative, at = heapq.heappop(heap)
        over = excess(at)
        if over <= 0 or over != -negative:
            if over > 0:
                heapq.heappush(heap, (-over, at))
            continue
        path, start, _ = weighed[at]
        sizes = sorted(
            ((size, floor(whole), name) for size, whole, name in path.sizes(caps, start) if size > floor(whole)),
            reverse=True,
        )
        if not sizes:
            continue
        longest, lowest, name = sizes[0]
        following = sizes[1][0] if len(sizes) > 1 else 0
        caps[name] = max(lowest, longest - over, following if following < longest else longest - 1)
        for other in set(under.get(name, ())):
            if excess(other) > 0:
                heapq.heappush(heap, (-excess(other), other))


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
