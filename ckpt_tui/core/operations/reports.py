"""One description of a compare or diff report; the CLI renders it as text, the browser as a screen.

A :class:`Report` holds everything either surface shows, already worded, with every string taken
from a file escaped by :func:`~ckpt_tui.core.runtime.safe_text.printable` (so neither a terminal nor Rich
markup sees raw file text):

- ``title``: what was compared with what;
- ``verdict`` (``OK``/``DOES NOT FIT``, ``identical``/``DIFFERENT``), ``ok``, and ``counts``, the
  numbers after the verdict;
- ``notes``: layouts recognised (wrappers, PEFT, EMA, tied heads) and what ``strict=False`` would
  silently skip, in words;
- ``sections``: titled lists of :class:`Row`. A row's ``path`` is the key path it stands for in the
  compared file, where the browser jumps (a folded row, ``layers.{0..31}.q.weight``, jumps to its
  first key); ``None`` for keys that are not in the file. Diff rows carry ``key``, the ``/`` path of
  a leaf of A, to resolve instead;
- ``fixes``: the suggested fix first, then alternatives (EMA weights), each with its summary, detail
  lines, the shell-quoted ``command`` and its ``argv``, and the
  :class:`~ckpt_tui.core.operations.compare.Suggestion` that the browser applies as one undoable edit.

The words name no surface's keys or options: the CLI prints ``command``, the browser offers its own
key to apply ``fixes[0].suggestion``. Nothing here imports a UI.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.keypath import Attr, KeyPath, to_python
from ckpt_tui.core.runtime.safe_text import printable
from ckpt_tui.core.runtime.shell import join_command, path_arg

if TYPE_CHECKING:
    from ckpt_tui.core.operations.compare import CompareReport, Suggestion
    from ckpt_tui.core.operations.diff import Alignment, DiffReport
    from ckpt_tui.core.operations.layer_change import LayerChangeReport, NormSeries

LIST_LIMIT = 12


@dataclass(frozen=True)
class Row:
    """One line of a section: its text, and where it jumps in the compared file."""

    text: str
    path: KeyPath | None = None
    key: str | None = None


@dataclass(frozen=True)
class Section:
    """A titled list of rows; ``count`` is how many keys the rows stand for (folded rows hold several);
    ``columns``: a table's header line, above its rows (the browser keeps it on screen as they scroll)."""

    title: str
    rows: list[Row]
    count: int
    columns: str = ""


@dataclass(frozen=True)
class FixDescription:
    """A suggested fix: what it does and reaches, and the command that applies it."""

    title: str
    summary: str
    details: list[str]
    command: str
    argv: list[str]
    suggestion: Suggestion


@dataclass
class Report:
    """Everything a compare or diff report shows (see the module docstring)."""

    title: str
    verdict: str
    ok: bool
    counts: str
    notes: list[str] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    fixes: list[FixDescription] = field(default_factory=list)
    asides: list[str] = field(default_factory=list)
    """Longer explanations (what ``strict=False`` would skip): the CLI prints them as notes, the browser lists
    them under the summary, which keeps one line per fact."""
    realign: Alignment | None = None
    """A diff whose keys match another way (a subtree, a wrapper prefix stripped): the browser offers it."""


# ---- compare ------------------------------------------------------------------------------


def describe_compare(
    report: CompareReport,
    path: str,
    reference_name: str,
    at: KeyPath = (),
    module: bool = False,
    width: int | None = None,
) -> Report:
    """The report of ``check --against`` / the browser's compare. ``module``: the compared value is a
    pickled module, whose keys are reached through its submodules. With a ``width``, each list's keys are
    fitted to it by one rule (:func:`_listing`), their shapes kept."""
    from ckpt_tui.core.operations.compare import fold_keys_with_first

    def where(key: str) -> KeyPath:
        return (*at, *(Attr(p) for p in key.split("."))) if module else (*at, key)

    counts = _compare_counts(report)
    sections = [
        _listed(
            "missing (in the reference, not in the checkpoint)",
            [(text, "", None) for text, _ in fold_keys_with_first(report.missing)],
            width,
            len(report.missing),
        ),
        _listed(
            "unexpected (in the checkpoint, not in the reference)",
            [(text, "", where(first)) for text, first in fold_keys_with_first(report.unexpected)],
            width,
            len(report.unexpected),
        ),
        _listed(
            "shape mismatches (checkpoint vs reference)",
            [(k, f": {list(a)} vs {list(b)}", where(k)) for k, a, b in report.shape_mismatches],
            width,
            len(report.shape_mismatches),
        ),
        _listed(
            "dtype mismatches (cast on load)",
            [(k, f": {a} vs {b}", where(k)) for k, a, b in report.dtype_mismatches],
            width,
            len(report.dtype_mismatches),
        ),
    ]
    notes = [printable(note) for note in report.notes]
    asides: list[str] = []
    if report.missing or report.unexpected:
        tied = len(set(report.tied) & set(report.missing))
        asides.append(_strict_false(len(report.missing), len(report.unexpected), len(report.shape_mismatches), tied))
    fixes: list[FixDescription] = []
    suggestions = [s for s in [report.suggestion, *report.alternatives] if s is not None]
    for index, suggestion in enumerate(suggestions):
        title = "suggested fix" if index == 0 else "alternative"
        if suggestion.label or len(suggestions) > 1:
            title += f" ({suggestion.label or 'live weights'})"
        fixes.append(_fix(title, suggestion, path, report))
    what = to_python(at) if at else path
    return Report(
        printable(f"Compare {what} with {reference_name}"),
        "OK" if report.ok else "DOES NOT FIT",
        report.ok,
        counts,
        notes,
        sections,
        fixes,
        asides=asides,
    )


def _compare_counts(report: CompareReport) -> str:
    """The numbers after the verdict, only those that say something: ``no reference key matches as it is;
    after the fix 9/11`` when none matched, else ``9/11 reference keys found, 2 missing, …`` without the
    zeros."""
    suggestion = report.suggestion
    if report.total and not report.matched:
        counts = "no key matches as it is"
        if suggestion is not None:
            counts += f"; after the fix {suggestion.matched}/{suggestion.total}"
        return counts
    counts = f"{report.matched}/{report.total} reference keys found"
    for number, what in (
        (len(report.missing), "missing"),
        (len(report.unexpected), "unexpected"),
        (len(report.shape_mismatches), _mismatches(len(report.shape_mismatches), "shape")),
        (len(report.dtype_mismatches), _mismatches(len(report.dtype_mismatches), "dtype")),
        (len(report.filled_on_load), "filled in on load"),
    ):
        if number:
            counts += f", {number} {what}"
    if suggestion is not None and not report.ok:
        counts += f"; after the fix {suggestion.matched}/{suggestion.total}"
    return counts


def _mismatches(number: int, what: str) -> str:
    """``shape mismatch`` for one, ``shape mismatches`` for any other count."""
    return f"{what} mismatch" if number == 1 else f"{what} mismatches"


def _strict_false(missing: int, unexpected: int, shapes: int, tied: int = 0) -> str:
    parts = []
    if missing and tied:
        rest = "the others keep" if tied < missing else "none keeps"
        parts.append(
            f"skip {_keys(missing, 'missing')} ({tied} tied to weights in the file, filled in by tie_weights(); "
            f"{rest} the model's initial values)"
        )
    elif missing:
        parts.append(f"skip {_keys(missing, 'missing')} (they keep the model's initial values)")
    if unexpected:
        parts.append(f"ignore {_keys(unexpected, 'unexpected')}")
    text = "load_state_dict(strict=False) would silently " + " and ".join(parts)
    if shapes:
        text += "; it still raises on shape mismatches"
    return text


def _keys(number: int, what: str = "") -> str:
    return counted(number, f"{what} key" if what else "key")


def _fix(title: str, suggestion: Suggestion, path: str, report: CompareReport) -> FixDescription:
    details = [printable(line) for line in suggestion.rule_lines()]
    resized = {k for k, _, _ in suggestion.resized}
    dropped = [str(s.arg) for s in suggestion.steps if s.kind == "drop" and s.arg not in resized]
    mismatched = {k for k, _, _ in report.shape_mismatches} | {_renamed(suggestion, k) for k in resized}
    if suggestion.resized:
        # the mismatches the report lists already (same names, same shapes) are not listed again
        listed = set(report.shape_mismatches)
        unlisted = [(k, a, b) for k, a, b in suggestion.resized if (_renamed(suggestion, k), a, b) not in listed]
        details += [
            printable(f"{_renamed(suggestion, k)}: {list(a)} vs {list(b)}") for k, a, b in unlisted[:LIST_LIMIT]
        ]
        if len(unlisted) > LIST_LIMIT:
            details.append(f"… {len(unlisted) - LIST_LIMIT} more")
        kept = ", ".join(printable(_renamed(suggestion, k)) for k, _, _ in suggestion.resized[:LIST_LIMIT])
        above = (
            "the shape mismatch above differs" if len(suggestion.resized) == 1 else "the shape mismatches above differ"
        )
        these = "these differ" if unlisted else above
        details.append(
            f"{these} in size (e.g. a new classifier head) and are dropped, since strict=False does not "
            f"skip a size mismatch: load_state_dict(strict=False) then keeps the model's fresh init for {kept}"
        )
    swapped = {k for k, _, _, _ in suggestion.swapped}
    if suggestion.swapped:
        details.append(_swapped_line(suggestion))
        dropped = [k for k in dropped if k not in swapped]
    if dropped:
        names = ", ".join(printable(k) for k in dropped[:LIST_LIMIT])
        details.append(f"drops {_keys(len(dropped))} the model does not have: {names}")
    if suggestion.guessed:
        details.append(_guessed_line(suggestion.guessed))
    named = mismatched | {r for _, _, r, _ in suggestion.swapped}
    if not set(suggestion.missing) | set(suggestion.unexpected) <= named:
        details.append(_left_line(suggestion))
    # every mismatch the fix leaves is said here, listed above or not: strict=False still raises on each (the
    # ones it resizes away are dropped by the fix itself)
    dropped_resized = {_renamed(suggestion, k) for k in resized}
    left = [(k, a, b) for k, a, b in suggestion.mismatched if k not in dropped_resized]
    if left:
        details.append(_mismatched_line(left))
    if suggestion.missing and not set(suggestion.missing) <= mismatched:
        tied = len(set(report.tied) & set(suggestion.missing))
        still = "; it still raises on the shape mismatches left" if left else ""
        details.append(
            _strict_false(len(suggestion.missing), len(suggestion.unexpected), 0, tied) + " after it" + still
        )
    argv = suggestion.argv(path)
    return FixDescription(title, printable(suggestion.describe()), details, report.fix_command(argv), argv, suggestion)


LEFT_LIMIT = 4
"""How many keys left over after a fix are named, each kind (missing, unexpected)."""


def _shaped(keys: list[str], shapes: dict[str, tuple[int, ...]]) -> str:
    """A few keys with their shapes, ``and N more``."""
    named = [f"{k} {list(shapes[k])}" if k in shapes else k for k in keys[:LEFT_LIMIT]]
    more = f" and {len(keys) - LEFT_LIMIT} more" if len(keys) > LEFT_LIMIT else ""
    return printable(", ".join(named) + more)


def _left_line(suggestion: Suggestion) -> str:
    """The keys the fix leaves unplaced, named: what the user still has to decide about."""
    parts = []
    if suggestion.missing:
        parts.append(f"{len(suggestion.missing)} missing: {_shaped(suggestion.missing, suggestion.shapes)}")
    if suggestion.unexpected:
        parts.append(f"{len(suggestion.unexpected)} unexpected: {_shaped(suggestion.unexpected, suggestion.shapes)}")
    return "left after it: " + "; ".join(parts)


def _guessed_line(guessed: list[tuple[str, str]]) -> str:
    """Modules the fix pairs by their order alone: which is which is the user's to check."""
    pairs = ", ".join(f"{old}.* → {new}.*" for old, new in guessed[:LEFT_LIMIT])
    more = f" and {len(guessed) - LEFT_LIMIT} more" if len(guessed) > LEFT_LIMIT else ""
    return printable(
        f"paired by their order only: {pairs}{more} (the same shapes, and names that do not say which is which):"
        " check that each gets its own weights before you trust the fix"
    )


def _mismatched_line(left: list[tuple[str, tuple[int, ...], tuple[int, ...]]]) -> str:
    """The shape mismatches the fix leaves, named: load_state_dict raises on them even with strict=False."""
    named = ", ".join(f"{k}: {list(a)} vs {list(b)}" for k, a, b in left[:LEFT_LIMIT])
    more = f" and {len(left) - LEFT_LIMIT} more" if len(left) > LEFT_LIMIT else ""
    keys = " ".join(f"--drop {k}" for k, _, _ in left[:LEFT_LIMIT])
    return printable(
        f"shape mismatches left after it: {named}{more}; load_state_dict(strict=False) still raises on them:"
        f" to load anyway, drop them too ({keys}) and the model keeps its fresh init there, or copy them in by hand"
    )


def _swapped_line(suggestion: Suggestion) -> str:
    """A renamed and resized head, as one fact: the file's module, the reference's, and what the fix does."""
    olds = [_renamed(suggestion, k) for k, _, _, _ in suggestion.swapped]
    theirs = ", ".join(f"{k} {list(a)}" for k, (_, a, _, _) in zip(olds, suggestion.swapped, strict=True))
    ours = ", ".join(f"{r} {list(b)}" for _, _, r, b in suggestion.swapped)
    old_module = olds[0].rpartition(".")[0] + ".*"
    new_module = suggestion.swapped[0][2].rpartition(".")[0] + ".*"
    return printable(
        f"{theirs} unexpected; {ours} missing: a renamed and resized head? the fix drops {old_module}, and "
        f"load_state_dict(strict=False) keeps the model's initial {new_module}"
    )


def _renamed(suggestion: Suggestion, key: str) -> str:
    """A key of the file as the model names it after the suggestion's strip, renames and add."""
    for step in suggestion.steps:
        if step.kind == "strip" and key.startswith(step.arg) and key != step.arg:
            key = key[len(step.arg) :]
        elif step.kind == "rename":
            key = step.arg.apply(key)
        elif step.kind == "add":
            key = step.arg + key
    return key


# ---- diff ---------------------------------------------------------------------------------


def describe_diff(
    report: DiffReport, a: str, b: str, paths: tuple[str, str] | None = None, width: int | None = None
) -> Report:
    """The report of ``diff A B`` / the browser's diff (rows jump to keys of A). When the keys match only
    under a subtree or without a wrapper prefix, a note says so with the options (the whole command when
    ``paths``, the two files as given, are known), and ``realign`` holds the way to compare. With a
    ``width``, each row fits it: its key shortened in the middle, its last components and numbers kept."""
    from ckpt_tui.core.operations.compare import fold_keys_with_first
    from ckpt_tui.core.operations.diff import one_notation

    if report.identical:
        counts = f"{counted(report.identical_tensors, 'tensor')} bit-for-bit equal, same keys and values"
    else:
        counts = f"({printable(a)} vs {printable(b)}); " + _diff_counts(report)
    only_a, only_b = one_notation(report.only_a), one_notation(report.only_b)
    sections = [
        _listed(
            "only in A",
            [(t, "", only_a[first]) for t, first in fold_keys_with_first(list(only_a))],
            width,
            len(report.only_a),
        ),
        _listed("only in B", [(t, "", None) for t, _ in fold_keys_with_first(list(only_b))], width, len(report.only_b)),
        _listed(
            "shape changes",
            [(k, f": {list(x)} → {list(y)}", k) for k, x, y in report.shape_changes],
            width,
            len(report.shape_changes),
        ),
        _listed(
            "dtype changes",
            [(k, _dtype_change(x, y, report.dtype_values.get(k)), k) for k, x, y in report.dtype_changes],
            width,
            len(report.dtype_changes),
        ),
        *[_listed(title, items, width) for title, items in _value_sections(report)],
        _listed(
            "other values",
            [(k, f": {x} → {y}", k) for k, x, y in report.other_changes],
            width,
            len(report.other_changes),
        ),
        # what did not move, named, when something else did (a frozen layer): a list of every key is no
        # news when nothing differs
        _listed(
            "identical (bit-for-bit)",
            [] if report.identical else [(t, "", first) for t, first in fold_keys_with_first(report.identical_keys)],
            width,
            0 if report.identical else len(report.identical_keys),
        ),
        _listed(
            "unreadable",
            [(k, f": {e}", k) for k, e in report.unreadable],
            width,
            len(report.unreadable),
        ),
        Section(
            "values not compared",
            [Row(printable(report.values_not_compared))] if report.values_not_compared else [],
            1 if report.values_not_compared else 0,
        ),
    ]
    notes: list[str] = []
    if report.alignment is not None:
        how = report.alignment.options()
        command = join_command(["ckpt-tui", "diff", path_arg(paths[0]), path_arg(paths[1]), *how]) if paths else None
        notes.append(
            printable(report.alignment.describe())
            + ": compare that way with "
            + (command if command else join_command(how))
        )
    return Report(
        printable(f"Diff {a} with {b}"),
        "identical" if report.identical else "DIFFERENT",
        report.identical,
        counts,
        notes,
        sections=sections,
        realign=report.alignment,
    )


def _by_role(report: DiffReport) -> dict[str, list[Any]]:
    """The value changes by role, in :data:`ROLE_ORDER` (file order within a role)."""
    grouped: dict[str, list[Any]] = {role: [] for role in ROLE_ORDER}
    for change in report.value_changes:
        grouped.setdefault(change.role, []).append(change)
    return {role: changes for role, changes in grouped.items() if changes}


def _diff_counts(report: DiffReport) -> str:
    """What differs, in words: how many tensors differ in value and what they are, then what is the same.
    Two points of one training run differ everywhere: that is said once, not as a row of 'NOT close'
    per tensor."""
    changed = len(report.value_changes)
    parts = []
    if changed:
        roles = ", ".join(
            f"{len(changes)} {_role_name(role, len(changes))}" for role, changes in _by_role(report).items()
        )
        every = not report.identical_tensors and changed > 1
        verb = "differs" if changed == 1 else "differ"
        parts.append(f"{'all ' if every else ''}{counted(changed, 'tensor')} {verb} in value ({roles})")
    same_layout = not (report.only_a or report.only_b or report.shape_changes or report.dtype_changes)
    if same_layout:
        parts.append("same keys, shapes and dtypes")
    roles_changed = {change.role for change in report.value_changes}
    if same_layout and not report.identical_tensors and {"parameter", "optimizer state"} <= roles_changed:
        parts[0] += ", as between two points of one training run"
    if report.identical_tensors or not changed:
        parts.append(f"{counted(report.identical_tensors, 'tensor')} identical")
    return "; ".join(parts)


def _role_name(role: str, number: int) -> str:
    """``3 parameters``, ``1 buffer``, ``18 optimizer state``, ``2 other tensors``."""
    if role == "other":
        return "other tensor" if number == 1 else "other tensors"
    return role if role == "optimizer state" or number == 1 else role + "s"


VALUE_SECTIONS = {
    "parameter": "value changes: model parameters",
    "buffer": "value changes: buffers",
    "counter": "value changes: counters",
    "optimizer state": "value changes: optimizer state",
    "other": "value changes: other tensors, outside the model's weights",
}


def _dtype_change(a: str, b: str, values: str | None) -> str:
    """``: bfloat16 → float32 (equal as values)``."""
    return f": {a} → {b}" + (f" ({values})" if values else "")


def _value_sections(report: DiffReport) -> list[tuple[str, list[tuple[str, str, Jump]]]]:
    """The value changes, a section per role: the model's parameters first, then buffers, counters and
    optimizer state. A row says how far apart the values are; ``within allclose`` when they are close."""
    sections = []
    for role, changes in _by_role(report).items():
        items: list[tuple[str, str, Jump]] = [(d.key, _value_change(d), d.key) for d in changes]
        sections.append((VALUE_SECTIONS.get(role, f"value changes: {role}"), items))
    return sections


def _value_change(d: Any) -> str:
    """How far apart a pair's values are; one whose NaN or Inf differ says where they are, marked ``!`` (its largest
    difference is over the positions finite on both sides only, and none when one side has none)."""
    if d.sides is not None and d.sides.whole_side:
        return f": ! {d.sides.words()}"
    apart = f"max |a-b| {d.max_abs:.6g}" + (", within allclose" if d.close else "")
    if d.sides is not None:
        return f": ! {d.sides.words()}; {apart} where both are finite"
    return f": {apart}" + (", NaN/Inf positions differ" if d.nan_mismatch else "")


Jump = str | KeyPath | None
"""Where a listed row jumps: a ``/`` key of a diff's A, a key path of the compared tree, or nowhere."""


def _row(text: str, jump: Jump) -> Row:
    return Row(text, path=jump) if isinstance(jump, tuple) else Row(text, key=jump)


def _listing(items: list[tuple[str, str, Jump]], width: int | None) -> tuple[list[Row], str]:
    """One listing's rows, each ``key`` then ``rest`` (both escaped), jumping to its third item; and, with
    a ``width``, the start every key shares (``, under model/module.``) for the title, said once there. With a
    ``width`` the keys are fitted by one rule for the listing (:func:`shorten_all`), in the room the longest
    ``rest`` leaves: they line up and read alike; whole when None (the CLI's text)."""
    from ckpt_tui.core.values.text_plots import shared_start, shorten_all

    if width is None:
        return [_row(printable(key) + printable(rest), jump) for key, rest, jump in items], ""
    keys = [printable(key) for key, _, _ in items]
    rests = [printable(rest) for _, rest, _ in items]
    room = max(KEY_AT_LEAST, width - max(map(len, rests), default=0))
    # the start they share is said once in the title only where the keys need the room
    head = shared_start(keys) if any(len(key) > room for key in keys) else ""
    head = "" if head == "ckpt" else head  # the root alone: no room gained, nothing said
    shown = shorten_all([key[len(head) :] for key in keys], room)
    rows = [_row(key + rest, jump) for key, rest, (_, _, jump) in zip(shown, rests, items, strict=True)]
    return rows, (f", under {head}" if head else "")


def _listed(title: str, items: list[tuple[str, str, Jump]], width: int | None, count: int = -1) -> Section:
    """A section of one listing (:func:`_listing`): ``count`` keys (its rows' when -1)."""
    rows, under = _listing(items, width)
    return Section(title + under, rows, len(items) if count < 0 else count)


def _fitted(key: str, rest: str, width: int | None) -> str:
    """A row: ``key`` then ``rest`` (both escaped), the key shortened in the middle to fit ``width`` (whole
    when None): its start and its last components stay, the numbers after it too."""
    from ckpt_tui.core.values.text_plots import shorten

    shown, after = printable(key), printable(rest)
    if width is None:
        return shown + after
    return shorten(shown, max(KEY_AT_LEAST, width - len(after))) + after


KEY_AT_LEAST = 16
"""A shortened key keeps at least this many characters, however long the text after it."""


# ---- per-layer change ---------------------------------------------------------------------

WIDTH = 78
"""Characters of a row (the text form indents rows by 2: 80 columns in all)."""
EXTREMES = 5
BUFFERS_SHOWN = 3
ROLE_ORDER = ("parameter", "buffer", "counter", "optimizer state", "other")
"""The order of the per-layer rows: the model's weights first, each role in module order."""
MODEL_ROLES = frozenset({"parameter", "buffer", "counter"})
"""The roles of the model's own tensors: the per-layer table and plot; optimizer state and other tensors
(a callback's best score) are listed apart, so that they neither crowd out nor rescale the model's rows."""
APART = "optimizer state and other tensors"
"""The heading of the per-layer rows that are not the model's."""
NONFINITE_NAMED = 3
"""Keys named in the note on NaN/Inf left out of the sums."""
NAMED_WIDTH = 40
"""Characters of a key named in a note (shortened in the middle)."""
COSINE_WIDTH = 9
"""Characters of a cosine in the per-layer table (its column)."""


def describe_layer_change(report: LayerChangeReport, a: str, b: str, width: int = WIDTH) -> Report:
    """The report of ``diff A B --stats`` / the browser's per-layer change (rows jump to keys of A):
    a table, a bar plot of the relative change (parameters first, then buffers, counters and optimizer
    state, each in module order), the layers that moved most and least. Rows are at most ``width``
    characters (at least 60); keys are shortened in the middle."""
    # a training checkpoint may hold its optimizer before its model: the weights come first all the same
    every = sorted(report.measured, key=lambda layer: _role_rank(layer.role))
    changes = [layer.relative_change for layer in every if layer.relative_change is not None]
    width = max(60, width)
    # the model's layers in the table and plot, the rest apart (all of them when none is the model's)
    measured = [layer for layer in every if layer.role in MODEL_ROLES] or every
    apart = [layer for layer in every if not any(layer is m for m in measured)]
    # the full bar is the parameters' largest change: a counter (20 → 30 steps: 0.5) or BatchNorm's statistics
    # would shrink every weight's bar to a sliver; theirs past it end in ▶
    scaled = [layer for layer in measured if layer.role == "parameter"] or measured
    top = max((layer.relative_change for layer in scaled if layer.relative_change is not None), default=0.0)
    past = ", ▶ past it" if any((layer.relative_change or 0.0) > top for layer in measured) else ""
    keys = [layer.key for layer in measured]  # each layer's key as text, made once
    under = _under(keys)
    most, least, others = _extremes(measured)
    sections = [
        Section(f"per layer{under}", _layer_table(measured, keys, width), len(measured), _layer_columns(width)),
        Section(
            f"relative change by layer, parameters first, module order (full bar {top:.3g}{past}){under}",
            _layer_plot(measured, keys, width, top),
            len(measured),
        ),
        _listed("moved most", [_extreme(layer) for layer in most], width),
        _listed("moved least", [_extreme(layer) for layer in least], width),
        _listed("buffers and counters moved most", [_moved_norm(layer) for layer in others], width),
        *([_apart_section(apart, width)] if apart else []),
        _listed(
            "not compared",
            [(layer.key, f": {layer.note}", layer.key) for layer in report.layers if layer.note],
            width,
            len(report.layers) - len(measured),
        ),
    ]
    counts = _layer_counts(report, changes)
    title = printable(f"Per-layer change from {a} to {b}")
    return Report(title, "per-layer change", True, counts, _layer_notes(report), sections, realign=report.alignment)


def _apart_section(apart: list[Any], width: int) -> Section:
    """The table of the layers that are not the model's (optimizer state and the like)."""
    keys = [layer.key for layer in apart]
    return Section(f"{APART}{_under(keys)}", _layer_table(apart, keys, width), len(apart), _layer_columns(width))


def _under(keys: list[str]) -> str:
    """``, under model_state_dict/``: the start every key of a table shares, said once in its title (its rows
    leave it out, so the room goes to what tells them apart)."""
    from ckpt_tui.core.values.text_plots import shared_start

    head = shared_start(keys)
    return printable(f", under {head}") if head else ""


def _role_rank(role: str) -> int:
    return ROLE_ORDER.index(role) if role in ROLE_ORDER else len(ROLE_ORDER)


def _extremes(measured: list[Any]) -> tuple[list[Any], list[Any], list[Any]]:
    """The parameters that moved most and least, and the buffers and counters that moved most."""
    ranked = sorted((layer for layer in measured if layer.relative_change is not None), key=_change)
    # BatchNorm statistics follow the data and counters count steps: ranked with the weights, they crowd
    # out what training moved, so parameters are ranked alone and the rest listed apart
    parameters = [layer for layer in ranked if layer.role == "parameter"] or ranked
    others = sorted(
        (layer for layer in measured if layer.role in ("buffer", "counter") and layer.relative_change != 0),
        key=lambda layer: -math.inf if layer.relative_change is None else -layer.relative_change,
    )[:BUFFERS_SHOWN]
    # a layer that did not move never moved most (a frozen one, when the rest could not be compared)
    most = [layer for layer in parameters[::-1] if layer.relative_change][:EXTREMES]
    # with few layers the least moved would repeat the most moved: each layer is listed once; one whose NaN or
    # Inf differ changed in a way no sum measures, never "least"
    calm = [layer for layer in parameters if not layer.nonfinite_differ]
    least = [layer for layer in calm[:EXTREMES] if not any(layer is m for m in most)]
    return most, least, others


def _layer_notes(report: LayerChangeReport) -> list[str]:
    """How the keys line up when they do only another way, and the NaN/Inf left out of the sums."""
    notes = []
    if report.alignment is not None:
        how = join_command(report.alignment.options())
        notes.append(printable(report.alignment.describe()) + f": compare that way with {how}")
    holding = [layer for layer in report.compared if layer.nonfinite]
    if holding:
        nonfinite = sum(layer.nonfinite for layer in holding)
        named = ", ".join(_fitted(layer.key, "", NAMED_WIDTH) for layer in holding[:NONFINITE_NAMED])
        more = f" and {len(holding) - NONFINITE_NAMED} more" if len(holding) > NONFINITE_NAMED else ""
        holds = "position holds" if nonfinite == 1 else "positions hold"
        notes.append(f"{nonfinite} {holds} NaN or Inf on either side, left out of the sums: in {named}{more}")
    blank = [layer for layer in report.measured if layer.not_compared]
    if blank:
        named = ", ".join(_fitted(layer.key, "", NAMED_WIDTH) for layer in blank[:NONFINITE_NAMED])
        more = f" and {len(blank) - NONFINITE_NAMED} more" if len(blank) > NONFINITE_NAMED else ""
        notes.append(
            f"{counted(len(blank), 'tensor')} not compared, every value NaN or Inf on a side ({named}{more}): "
            "no change to give, and none left in the median or the layers that moved"
        )
    return notes


def _layer_counts(report: LayerChangeReport, changes: list[float]) -> str:
    """``12 layers compared, 3 unchanged, median relative change 0.01`` (``… of the parameters`` when
    buffers, counters or optimizer state were measured too)."""
    measured = report.compared
    # a layer whose NaN or Inf differ moved, though its finite positions did not
    unchanged = sum(1 for layer in report.measured if layer.relative_change == 0 and not layer.nonfinite_differ)
    model = sum(1 for layer in measured if layer.role in MODEL_ROLES)
    if 0 < model < len(measured):
        counts = f"{counted(model, 'layer')} of the model and {counted(len(measured) - model, 'other tensor')} compared"
        counts += f", {unchanged} unchanged"
    else:
        counts = f"{counted(len(measured), 'layer')} compared, {unchanged} unchanged"
    # a step counter moves by whole steps and Adam's moments by far more than the weights: the median
    # that says how far training moved the model is the parameters'
    weights = [x.relative_change for x in measured if x.role == "parameter" and x.relative_change is not None]
    if weights and len(weights) < len(changes):
        counts += f", median relative change of the parameters {_median(weights):.3g}"
    elif changes:
        counts += f", median relative change {_median(changes):.3g}"
    blank = sum(1 for layer in report.layers if layer.not_compared)
    if len(measured) < len(report.layers):
        left = len(report.layers) - len(measured)
        counts += f", {left} not compared"
        if blank:
            counts += ": all NaN/Inf on a side" if blank == left else f" ({blank} all NaN/Inf on a side)"
    return counts


def _median(values: list[float]) -> float:
    """The median of some numbers, as ``statistics.median`` takes it (whose import brings fractions, decimal and
    random into every ``diff --stats``)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _layer_columns(width: int) -> str:
    """The per-layer table's header line (its columns: :func:`_layer_table`)."""
    from ckpt_tui.core.values.text_plots import clip_middle

    return clip_middle("layer", width - 4 * 10) + "".join(h.rjust(10) for h in ("‖a−b‖/‖a‖", "cosine", "‖a‖", "‖b‖"))


def _layer_table(measured: list[Any], keys: list[str], width: int) -> list[Row]:
    """Per layer: relative change, cosine and both norms, a row each (under :func:`_layer_columns`)."""
    from ckpt_tui.core.values.text_plots import shared_start, shorten_all

    name = width - 4 * 10
    cut = len(shared_start(keys))
    # one rule for the whole column: the keys line up and read alike
    names = shorten_all([printable(key[cut:]) for key in keys], name)
    return [
        Row(shown.ljust(name) + _table_numbers(layer), key=key)
        for layer, key, shown in zip(measured, keys, names, strict=True)
    ]


def _table_numbers(layer: Any) -> str:
    """A table row's four columns; a layer holding NaN/Inf says where, marked ``!``, in place of what its
    values cannot give: all four for one with no position finite on both sides, the norms for the rest."""
    from ckpt_tui.core.values.text_plots import number

    said = nonfinite_text(layer)
    if layer.not_compared:
        return " " + f"! {said}".rjust(4 * 10 - 1)
    norms = "".join(" " + number(v) for v in (layer.norm_a, layer.norm_b))
    if said:
        norms = " " + (f"! {said}" if len(said) <= 2 * 10 - 3 else f"! {layer.nonfinite} NaN/Inf").rjust(2 * 10 - 1)
    return " " + change_text(layer).rjust(9) + " " + cosine_text(layer.cosine).rjust(COSINE_WIDTH) + norms


def nonfinite_text(layer: Any) -> str:
    """Where a layer's NaN/Inf are (``all 2048 NaN in B``), ``NaN/Inf on either side`` when the sides could
    not be read apart; ``""`` for a layer holding none."""
    if not layer.nonfinite:
        return ""
    return str(layer.sides.words()) if layer.sides is not None else f"{layer.nonfinite} NaN/Inf on either side"


def _layer_plot(measured: list[Any], keys: list[str], width: int, top: float) -> list[Row]:
    """A bar per layer, in module order, the largest relative change a full bar."""
    from ckpt_tui.core.values.text_plots import shared_start, shorten_all

    cut = len(shared_start(keys))
    whole = [printable(key[cut:]) for key in keys]
    plot_value = 9
    # the names take what the longest needs, leaving the bars PLOT_BARS cells (a third of the width at least)
    plot_name = max(min(30, width // 3), min(max(map(len, whole), default=0), width - plot_value - 2 - PLOT_BARS))
    plot_width = width - plot_name - plot_value - 2
    names = shorten_all(whole, plot_name)
    return [
        Row(shown.ljust(plot_name) + " " + _plotted(layer, plot_width, plot_value, top), key=key)
        for layer, key, shown in zip(measured, keys, names, strict=True)
    ]


PLOT_BARS = 24
"""Cells the bars of the per-layer plot keep at the least, when the names would take them."""


def _plotted(layer: Any, plot_width: int, plot_value: int, top: float) -> str:
    """A plot row's bar and value; a layer with nothing to plot (no position finite on both sides) says why
    where its bar would be, and one holding NaN/Inf has its value marked ``!``."""
    if layer.not_compared:
        return f"! {nonfinite_text(layer)}"[:plot_width].ljust(plot_width) + " " + "-".rjust(plot_value)
    value = change_text(layer)
    value = f"!{value}" if layer.nonfinite and len(value) < plot_value else value
    return (
        _scaled_bar((layer.relative_change or 0.0) / top if top > 0 else 0.0, plot_width)
        + " "
        + value.rjust(plot_value)
    )


def _scaled_bar(fraction: float, width: int) -> str:
    """A bar of ``fraction`` of ``width`` cells, padded to them; one past the full bar ends in ``▶``."""
    from ckpt_tui.core.values.text_plots import bar

    if fraction > 1.0:
        return bar(1.0, width - 1) + "▶"
    return bar(fraction, width).ljust(width)


def _change(layer: Any) -> float:
    return float(layer.relative_change)


def _extreme(layer: Any) -> tuple[str, str, str]:
    """A row of the layers that moved most or least: its key, how far, the key it jumps to (and, marked ``!``,
    the NaN/Inf left out of its sums)."""
    held = f" ! {nonfinite_text(layer)}" if layer.nonfinite else ""
    return (layer.key, f": {layer.relative_change:.3g} (cosine {cosine_text(layer.cosine)}){held}", layer.key)


def change_text(layer: Any) -> str:
    """A layer's relative change: ``from 0`` for one that moved away from all zeros (no ratio to give, but it
    moved), ``-`` only when nothing can be said."""
    if layer.relative_change is not None:
        return f"{layer.relative_change:.3g}"
    if layer.norm_a == 0 and layer.norm_b:
        return "from 0"
    return "-"


def cosine_text(cosine: float | None) -> str:
    """A cosine with the digits that show how far from 1 it is (``0.99965``, not ``1``): one digit past the
    first that differs from 1; ``1-3.5e-8`` when that takes more than :data:`COSINE_WIDTH` characters; ``1``
    only when it is."""
    if cosine is None:
        return "-"
    if cosine == 1.0:
        return "1"
    for places in range(3, 8):
        if abs(float(f"{cosine:.{places}f}")) != 1.0:
            text = f"{cosine:.{places + 1}f}"
            # past the table's column (0.99999990): said as its distance from 1
            if len(text) <= COSINE_WIDTH:
                return text
            break
    return f"1-{1.0 - cosine:.1e}" if cosine > 0 else f"-1+{cosine + 1.0:.0e}"


def _moved_norm(layer: Any) -> tuple[str, str, str]:
    """A buffer or counter's row: its norm before and after (a counter's value; a buffer from 0 has no ratio)."""
    return (layer.key, f": norm {layer.norm_a:.4g} → {layer.norm_b:.4g}", layer.key)


def describe_norm_series(series: NormSeries, files: list[str]) -> Report:
    """The report of ``diff A B C ... --stats``: each layer's norm in the first and the last file, and a
    sparkline of it across the files, in order; the model's layers, then optimizer state and other tensors
    apart (as the per-layer change lists them), each table's shared start said once in its title."""
    held: list[str] = []
    model: list[tuple[str, list[Any], list[Any]]] = []
    apart: list[tuple[str, list[Any], list[Any]]] = []
    roles = series.roles or ["parameter"] * len(series.layers)
    for (path, norms), nonfinite, layer_role in zip(series.layers, series.nonfinite, roles, strict=True):
        # a file where the layer holds NaN/Inf is marked (!), never drawn as absent or as an ordinary norm
        drawn = [math.nan if bad else norm for norm, bad in zip(norms, nonfinite, strict=True)]
        held += [f"{_key(path)} in {i + 1}. ({bad} NaN/Inf)" for i, bad in enumerate(nonfinite) if bad]
        (model if layer_role in MODEL_ROLES else apart).append((_key(path), norms, drawn))
    layers = counted(len(series.layers), "layer")
    counts = f"{layers} across {counted(len(files), 'file')} (L2 norm of each layer in each file)"
    listed = [Row(printable(f"{index + 1}. {path}")) for index, path in enumerate(files)]
    sections = [Section("files, in order", listed, len(files))]
    legend = "(sparkline: ▁ smallest to █ largest, · absent, ! NaN/Inf)"
    for title, rows in ((f"norm by layer {legend}", model or apart), (f"{APART} {legend}", apart if model else [])):
        if rows:
            keys = [key for key, _, _ in rows]
            table, name = _series_rows(rows, len(files))
            sections.append(Section(f"{title}{_under(keys)}", table, len(rows), _series_columns(name)))
    notes = [printable("NaN/Inf (norms are of the finite values): " + ", ".join(held))] if held else []
    return Report(
        printable(f"Norms across {counted(len(files), 'checkpoint')}"), "norm series", True, counts, notes, sections
    )


SERIES_NAME = 29
"""Characters of a layer's name in the norm series' table at the least (more where the names need them)."""
SERIES_NUMBERS = 32
"""Characters of a series row between its name and its sparkline: first, last, and their ratio."""


def _series_columns(name: str | int) -> str:
    """The norm series' header line, its name column ``name`` wide."""
    from ckpt_tui.core.values.text_plots import clip_middle

    # the ratio column is one wider than its 10-character header, so "last/first" never runs into "last"
    columns = (("first", 10), ("last", 10), ("last/first", 11))
    return clip_middle("layer", int(name)) + "".join(h.rjust(w) for h, w in columns) + " across"


def _series_rows(rows: list[tuple[str, list[Any], list[Any]]], files: int) -> tuple[list[Row], int]:
    """A table's rows of the norm series, and its name column's width: name (the shared start left out, one
    shortening rule for all, in the room the sparkline of ``files`` leaves), first and last norm, their
    ratio, and a sparkline across the files."""
    from ckpt_tui.core.values.text_plots import number, shared_start, shorten_all, sparkline

    keys = [key for key, _, _ in rows]
    cut = len(shared_start(keys))
    whole = [printable(key[cut:]) for key in keys]
    # the names take the room the sparkline (a block a file) leaves, so a 3-file table uses the width
    spark = WIDTH - SERIES_NAME - SERIES_NUMBERS
    room = max(SERIES_NAME, WIDTH - SERIES_NUMBERS - min(files, spark))
    name = max(SERIES_NAME, min(max(map(len, whole), default=0), room))
    names = shorten_all(whole, name)
    out = []
    for (key, norms, drawn), shown in zip(rows, names, strict=True):
        first, last = norms[0], norms[-1]
        ratio = last / first if first and last is not None else None
        change = ("-" if ratio is None else f"×{ratio:.3g}").rjust(10)
        text = shown.ljust(name) + " " + number(first) + " " + number(last) + " " + change
        out.append(Row(text + " " + sparkline(drawn, WIDTH - name - SERIES_NUMBERS), key=key))
    return out, name


def _key(path: Any) -> str:
    from ckpt_tui.core.operations.diff import key_text

    return key_text(path)


# ---- text ---------------------------------------------------------------------------------


def headline(report: Report) -> str:
    """The verdict and the counts after it, as both faces show them first."""
    separator = (
        ": " if report.verdict in ("OK", "DOES NOT FIT", "identical", "per-layer change", "norm series") else " "
    )
    return report.verdict + separator + report.counts


def render_text(report: Report, limit: int = LIST_LIMIT, width: int | None = None) -> str:
    """The plain-text form the CLI prints: verdict and counts, notes, sections (``limit`` rows each),
    then each fix with its command. With a ``width`` (a terminal's), sentences are wrapped between words to
    it; rows are fitted to it already, and commands stay whole to be copied."""
    from ckpt_tui.core.values.text_plots import wrapped

    lines = wrapped(headline(report), width, 2)
    for note in [*report.notes, *report.asides]:
        lines += wrapped(f"note: {note}", width, 6)
    for section in report.sections:
        if not section.rows:
            continue
        lines += wrapped(f"{section.title} ({section.count}):", width, 2)
        if section.columns:
            lines.append(f"  {section.columns}")
        lines += [f"  {row.text}" for row in section.rows[:limit]]
        if len(section.rows) > limit:
            lines.append(f"  … and {len(section.rows) - limit} more (--json lists all)")
    for fix in report.fixes:
        lines += wrapped(f"{fix.title}: {fix.summary}", width, 2)
        for detail in fix.details:
            lines += wrapped(f"  {detail}", width, 4)
        lines.append(f"  {fix.command}")
    return "\n".join(lines)
