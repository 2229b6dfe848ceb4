"""What the CLI prints: ``info``, ``check`` and ``stats`` as text, JSON, CSV and the progress line; compare
and diff are described once in :mod:`ckpt_tui.core.operations.reports` (shared with the browser) and
rendered as text there.

Every string taken from a file (keys, values, global names, location tags, metadata, messages that
quote keys) goes through :func:`~ckpt_tui.core.runtime.safe_text.printable`, so it cannot act on the
terminal; suggested commands are quoted for the shell by :mod:`ckpt_tui.core.runtime.shell`.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ckpt_tui.core.errors import CkptError
from ckpt_tui.core.model.byte_source import is_remote
from ckpt_tui.core.model.describe import container_text, counted, opens, size, value_text
from ckpt_tui.core.model.describe import shape as shape_text
from ckpt_tui.core.model.formats import format_name
from ckpt_tui.core.model.keypath import json_text, key_text, to_slash
from ckpt_tui.core.model.tree import Checkpoint, Opaque, children, get
from ckpt_tui.core.runtime.safe_text import printable, printable_name, printable_path
from ckpt_tui.core.values.text_plots import wrapped

if TYPE_CHECKING:  # numpy-backed modules, and those a command imports when it has something to say
    from ckpt_tui.core.conventions.findings import Finding
    from ckpt_tui.core.operations.check import CheckReport
    from ckpt_tui.core.operations.info import Summary
    from ckpt_tui.core.runtime.progress import ProgressStep
    from ckpt_tui.core.weights_only.verdict import Verdict

TREE_LINES = 40


def render_info(summary: Summary, depth: int = 2, width: int | None = None) -> str:
    """The ``info`` text: header, totals, findings (with the command that fixes each), top of the tree.

    ``width``: the terminal's, when the text goes to one: sentences longer than it are wrapped between words
    under their own start (commands never: a command copied from the screen must stay one line)."""
    ckpt = summary.checkpoint
    lines = [
        printable_path(ckpt.path),
        f"  format      {printable(format_name(ckpt.format))}, {size(ckpt.file_bytes)} {_where(ckpt.path)}",
        *([f"  layout      {printable(ckpt.layout)}"] if ckpt.layout else []),
        f"  tensors     {summary.tensors_text(noun=False)}   tensor data {size(summary.tensor_bytes)}",
        f"  elements    {summary.counts_text()}",
        "  dtypes      " + _counted(summary.dtypes, summary.bytes_by_dtype),
        "  devices     " + (", ".join(f"{printable(str(d))} {n}" for d, n in summary.devices.most_common()) or "-"),
    ]
    unread = summary.unread_values("ckpt-tui check")
    if unread is not None:
        lines += wrapped(f"  values      {unread}", width, 14)
    for note in ckpt.notes:
        lines += wrapped(f"  note        {printable(note)}", width, 14)
    if ckpt.metadata:
        shown = list(ckpt.metadata.items())[:6]
        lines.append("  metadata    " + ", ".join(f"{printable(str(k))}={printable(str(v))}" for k, v in shown))
    if ckpt.index_metadata:
        shown = list(ckpt.index_metadata.items())[:6]
        lines.append("  index       " + ", ".join(f"{printable(str(k))}={printable(str(v))}" for k, v in shown))
    if summary.shown_findings:
        lines.append("findings")
        fixes = []
        for finding in summary.shown_findings:
            mark = "!" if finding.severity == "warning" else "·"
            lines += wrapped(f"  {mark} {printable(finding.message)}", width, 4)
            options = fix_options(ckpt, finding)
            if options is not None:
                from ckpt_tui.core.operations.convert_options import convert_command

                command = convert_command(ckpt.path, options)
                lines.append(f"      {'fix' if finding.severity == 'warning' else 'if needed'}: {command}")
                fixes += [options] if finding.severity == "warning" else []
        # each fix names the same new file: the warnings' fixes are one command too, to run once
        together = _combinable(fixes)
        combined = all_fixes(ckpt, together) if len(together) > 1 else None
        if combined is not None:
            lines.append(f"  {_fixes_in_one(fixes, together)}: {convert_command(ckpt.path, combined)}")
    lines.append("tree")
    lines += _tree_lines(ckpt.key_root(), depth, summary, _pending_head(ckpt))
    return "\n".join(lines)


def _where(path: str) -> str:
    """Where the file's bytes lie: on disk, or on the server for a URL."""
    return "on the server" if is_remote(path) else "on disk"


def fix_command(checkpoint: Checkpoint, finding: Finding) -> str | None:
    """The ``ckpt-tui convert`` command that applies a finding's fix, quoted for the shell, or None
    when the fix is not one convert can apply to this file as it is (checked by a dry run)."""
    from ckpt_tui.core.operations.convert_options import convert_command

    options = fix_options(checkpoint, finding)
    return None if options is None else convert_command(checkpoint.path, options)


def fix_options(checkpoint: Checkpoint, finding: Finding) -> Any:
    """The ``convert`` options (a ``ConvertOptions``) that apply a finding's fix, or None when the fix is not
    one convert can apply to this file as it is (checked by a dry run)."""
    from ckpt_tui.core.operations.convert_options import ConvertOptions

    fix = finding.fix
    if fix is None:
        return None
    if fix.option == "--sanitize":
        return ConvertOptions(sanitize=True)
    try:
        if fix.also:
            options = ConvertOptions.from_pairs(fix.pairs())
            if finding.path and not options.extract:
                _aim_key_edit(checkpoint.key_root(), finding.path, options)
            _dry_run(checkpoint, options)
            return options
        options = ConvertOptions.from_pairs([(fix.option, fix.argument)])
        if fix.option in ("--strip-prefix", "--add-prefix") and finding.path is not None:
            _aim_key_edit(checkpoint.key_root(), finding.path, options)
        # (a root still held as columns: its keys are what a prefix's strip reads)
        certain = fix.option == "--strip-prefix" and finding.path == () and _strips_cleanly(checkpoint, fix.argument)
        if not certain:  # a prefix every key has comes off cleanly: no dry run of 50,000 renames
            _dry_run(checkpoint, options)
    except (CkptError, KeyError, IndexError):
        return None
    return options


def _combinable(each: list[Any]) -> list[Any]:
    """The fixes that go into one command: where one extracts the model weights, not those of another part of
    the tree (``--at ema``: another copy of the weights, which the extract leaves behind)."""
    if not any(options.extract for options in each):
        return each
    return [options for options in each if options.at is None]


def _fixes_in_one(fixes: list[Any], together: list[Any]) -> str:
    """How the combined command is introduced: all the fixes, or which it leaves out."""
    if len(together) == len(fixes):
        return f"all {len(fixes)} fixes in one"
    left = ", ".join(sorted({str(options.at) for options in fixes if options not in together}))
    return f"{len(together)} fixes in one (not the one at {printable(left)}, which the extract leaves out)"


def all_fixes(checkpoint: Checkpoint, each: list[Any]) -> Any:
    """The options of several findings' fixes as one ``convert`` (each option once), or None when two ask for
    different values of one option or they do not apply together (checked by a dry run)."""
    from ckpt_tui.core.operations.convert_options import EDIT_OPTIONS, ConvertOptions

    words = [word for options in each for word in options.argv()]
    # every edit option takes one argument: the argv is its (option, argument) pairs in a row
    pairs = list(dict.fromkeys(zip(words[0::2], words[1::2], strict=True)))
    given = [name for name, _ in pairs]
    # an option of one value (--extract, --map-location...) asked for twice, with two values: no one command
    single = ConvertOptions()
    if any(given.count(name) > 1 and not isinstance(getattr(single, EDIT_OPTIONS[name]), list) for name in given):
        return None
    combined = ConvertOptions.from_pairs(pairs)
    combined.sanitize = any(options.sanitize for options in each)
    try:
        _dry_run(checkpoint, combined)
    except (CkptError, KeyError, IndexError):
        return None
    return combined


def _dry_run(checkpoint: Checkpoint, options: Any) -> None:
    """``convert``'s edits applied to the keys (nothing written): raises where the fix would not apply."""
    from ckpt_tui.core.operations.convert import apply_options

    apply_options(checkpoint.key_root(), options)


def _strips_cleanly(checkpoint: Checkpoint, prefix: str) -> bool:
    """:func:`~ckpt_tui.core.edits.tree_edits.strips_cleanly` of the root; of a root still held as columns,
    told by its names (such a root is a state_dict of plain tensors, str keys: what the strip reads)."""
    from ckpt_tui.core.edits.key_renamer import KeyRenamer, strips_cleanly

    if not checkpoint.root_pending():
        return strips_cleanly(checkpoint.root, prefix)
    assert checkpoint.columns is not None
    return bool(prefix) and prefix != "auto" and KeyRenamer(strip=prefix).renames_every(checkpoint.columns.names)


def _aim_key_edit(root: Any, path: Any, options: Any) -> None:
    """A prefix fix of the state_dict at ``path``: a pickled module is extracted first, another dict
    is named with ``--at``."""
    from ckpt_tui.core.operations.convert_options import path_text

    value = get(root, path)
    if isinstance(value, Opaque) and value.is_module:
        options.extract = path_text(path) if path else "auto"
    elif path:
        options.at = path_text(path)


def _counted(counts: Any, nbytes: Any) -> str:
    return ", ".join(f"{printable(str(name))} {n} ({size(nbytes[name])})" for name, n in counts.most_common()) or "-"


def _pending_head(checkpoint: Checkpoint) -> list[tuple[Any, Any]] | None:
    """The entries the tree shows of a root still held as columns (made for them alone), else None."""
    if not checkpoint.root_pending():
        return None
    assert checkpoint.columns is not None
    return checkpoint.columns.head(TREE_LINES)


def _tree_lines(root: Any, depth: int, summary: Summary, head: list[tuple[Any, Any]] | None = None) -> list[str]:
    """The top of the tree; ``head``: the root's first entries, when ``root`` holds only its keys (a root
    still held as columns: flat, so no entry has children of its own)."""
    label = container_text(root, summary.totals()) if opens(root) else value_text(root)
    lines: list[str] = [f"  (root) {printable(label)}"]
    entries = _child_list(root) if head is None else head
    unlisted = 0 if head is None else len(root) - len(head)
    stack: list[tuple[int, list[tuple[Any, Any]], int]] = [(1, entries, 0)]  # level, entries, next
    while stack and len(lines) <= TREE_LINES:
        level, entries, at = stack.pop()
        if at == len(entries):
            continue
        stack.append((level, entries, at + 1))
        key, value = entries[at]
        lines.append(f"{'  ' * (level + 1)}{printable_name(key_text(key))}  {printable(value_text(value))}")
        if level < depth and opens(value):
            stack.append((level + 1, _child_list(value), 0))
    hidden = sum(len(entries) - at for _, entries, at in stack) + unlisted
    if hidden:
        lines.append(f"  … {hidden} more entries (ckpt-tui FILE to browse, --depth, or --json)")
    return lines


def _child_list(value: Any) -> list[tuple[Any, Any]]:
    return list(value.items()) if isinstance(value, dict) else list(children(value))


def render_check(report: CheckReport) -> str:
    """The ``check`` text: verdict first, then each problem."""
    ckpt = report.summary.checkpoint
    head = f"{printable_path(ckpt.path)}: {counted(report.checked, 'tensor')} read"
    if report.skipped:
        head += f", {report.skipped} without readable values skipped"
    beside = [printable(line) for line in report.folder_lines]
    if report.ok:
        lines = [head + ": OK, no NaN/Inf, no unsafe globals", *beside]
        return "\n".join(lines + weights_only_lines(report, ckpt.path))
    lines = [head + f": {counted(len(report.problems), 'problem')}", *beside]
    lines += [f"  ! [{printable(p.kind)}] {printable(p.message)}" for p in report.problems]
    lines += weights_only_lines(report, ckpt.path)
    return "\n".join(lines)


def weights_only_lines(report: CheckReport, path: str) -> list[str]:
    """The verdict on ``torch.load(FILE)`` with weights_only=True: blockers, where, and the two ways out."""
    judged = report.weights_only
    if judged is None:
        return []
    return verdict_lines(judged, path)


def verdict_lines(judged: Verdict, path: str, readable: bool = True) -> list[str]:
    """A weights_only verdict: headline, blockers with where they are, and the two ways out.

    ``--sanitize`` is offered only where it can work: a file ckpt-tui reads, whose blockers are all data.
    """
    lines = [printable(judged.headline())]
    for blocker in judged.blockers:
        times = f" ({blocker.count}×)" if blocker.count > 1 else ""
        lines.append(f"  {blocker.kind:<4}  {printable(blocker.name)}{times} at {printable(blocker.where())}")
        if blocker.note:
            lines.append(f"        {printable(blocker.note)}")
    if judged.needs_import and (judged.blockers or judged.reason):
        lines.append(f"  and needs {printable(judged.import_words())}")
    if judged.blockers and judged.reason:
        lines.append(f"  and, whatever is allowlisted: {printable(judged.reason)}")
    if judged.blockers and judged.reason is None and judged.unknown:
        lines.append(f"  and, once allowlisted, cannot tell: {printable(judged.unknown)}")
    lines += [f"  note: {printable(note)}" for note in judged.notes]
    if judged.safe_globals:
        lines.append("  to load it as it is (only if you trust the file), before torch.load:")
        lines.append(f"    import {', '.join(judged.imports)}")
        lines.append(f"    {printable(judged.safe_globals)}")
    sanitizable = readable and all(b.kind == "data" for b in judged.blockers)
    if judged.loads is False and judged.blockers and sanitizable:
        from ckpt_tui.core.operations.convert_options import ConvertOptions, convert_command

        command = convert_command(path, ConvertOptions(sanitize=True))
        lines.append(f"  or rewrite it as plain data that loads:  {command}")
    return lines


STATS_NUMBERS = ("min", "max", "mean", "std", "norm", "absmax")
STATS_HEADER = ("path", "shape", "dtype", *STATS_NUMBERS, "zeros", "nan", "inf", "mark")
NAME_COLUMNS = frozenset({"path", "shape", "dtype", "mark"})
"""Left-aligned; on the first line of a tensor when its numbers take a line of their own."""
STATS_DIGITS = (6, 4, 3)
"""Significant digits of the numbers: the most that lets a tensor's numbers fit the terminal's width."""
MARK_LEGEND = {
    "!! NaN": "!! NaN   holds NaN (and maybe Inf)",
    "!! Inf": "!! Inf   holds Inf",
    "!! norm": "!! norm  norm far from the median of the same key in the other layers",
    "dead": "dead     all zero where the same key in the other layers is not",
}
"""What each mark of the ``mark`` column says, a line each under the table for the marks it holds."""


def stats_number(value: float | None, digits: int = 6) -> str:
    """A statistic with ``digits`` significant digits (``-`` for none)."""
    return "-" if value is None else f"{value:.{digits}g}"


def zeros_text(fraction: float | None) -> str:
    """The zero fraction as a percentage (``12.5%``)."""
    return "-" if fraction is None else f"{100 * fraction:.4g}%"


def render_stats(rows: list[Any], marks: dict[int, str], width: int = 80) -> str:
    """The ``stats`` text: one aligned line per tensor when that fits ``width``, else two (names, then numbers,
    with as few digits as make them fit).

    ``rows`` are :class:`~ckpt_tui.core.values.tensor_table.TensorRow`; ``marks`` the words of
    :func:`~ckpt_tui.core.conventions.layer_marks.marks` (``!! NaN``, ``!! norm``, ``dead``), shown in the last
    column, with a legend under the table. The ``nan`` and ``inf`` columns go when every count is 0 (one line
    says so), the ``mark`` column when it is empty. Columns are aligned by one format string per table
    (50,000 rows are one pass each way).
    """
    shown = _stats_columns(rows, marks)
    for digits in STATS_DIGITS:
        table = [_pick_named(STATS_HEADER, shown), *(_pick_named(_stats_cells(r, marks, digits), shown) for r in rows)]
        widths = [max(map(len, column)) for column in zip(*table, strict=True)]
        if sum(widths) + 2 * (len(widths) - 1) <= width:
            line = _row_format(widths, {i for i, name in enumerate(shown) if name in NAME_COLUMNS})
            return "\n".join([*(line.format(*cells).rstrip() for cells in table), *_stats_notes(rows, marks, shown)])
        names = [i for i, name in enumerate(shown) if name in NAME_COLUMNS]
        numbers = [i for i, name in enumerate(shown) if name not in NAME_COLUMNS]
        second = "  " + _row_format(_pick(widths, numbers), set())
        if len(second.format(*_pick(table[0], numbers))) <= width or digits == STATS_DIGITS[-1]:
            break
    first = _row_format([0] * len(names), set(range(len(names))))
    lines = []
    for cells in table:
        lines.append(_fit_names(first.format(*_pick(cells, names)).rstrip(), cells[0], width))
        lines.append(second.format(*_pick(cells, numbers)).rstrip())
    return "\n".join([*lines, *_stats_notes(rows, marks, shown)])


def _fit_names(line: str, path: str, width: int) -> str:
    """A two-line row's first line (path, shape, dtype) in ``width``: the path shortened the way every listing
    shortens keys (layer numbers and the parameter kept), never below 20 characters."""
    from ckpt_tui.core.values.text_plots import shorten

    over = len(line) - width
    if over <= 0 or not line.startswith(path):
        return line
    return shorten(path, max(len(path) - over, 20)) + line[len(path) :]


def _stats_columns(rows: list[Any], marks: dict[int, str]) -> list[str]:
    """The columns the table shows: every one but ``nan`` and ``inf`` when all their counts are 0, and ``mark``
    when no row has a mark or a reason."""
    counted = [row.stats for row in rows if row.stats is not None]
    clean = all(stats.nan == 0 and stats.posinf + stats.neginf == 0 for stats in counted)
    marked = bool(marks) or any(row.stats is None for row in rows)
    return [
        name for name in STATS_HEADER if not (clean and name in ("nan", "inf")) and not (name == "mark" and not marked)
    ]


def _stats_notes(rows: list[Any], marks: dict[int, str], shown: list[str]) -> list[str]:
    """The lines under the table: that no tensor read holds NaN/Inf (when those columns went), and what the
    marks shown mean."""
    notes = []
    read = sum(1 for row in rows if row.stats is not None)
    if "nan" not in shown and read:
        notes.append(f"no NaN/Inf in the {counted(read, 'tensor')} read")
    found = set(marks.values())
    legend = [line for mark, line in MARK_LEGEND.items() if mark in found]
    if legend:
        notes += ["mark:", *("  " + line for line in legend)]
    return notes


def _stats_cells(row: Any, marks: dict[int, str], digits: int = 6) -> list[str]:
    """One row of the ``stats`` table as text, every column of :data:`STATS_HEADER`."""
    cells = [printable_name(to_slash(row.path)) or "(root)", shape_text(row.shape), printable(row.dtype)]
    stats = row.stats
    if stats is None:
        return [*cells, *(["-"] * 9), f"({row.reason})"]
    cells += [stats_number(v, digits) for v in (stats.min, stats.max, stats.mean, stats.std, stats.norm, stats.absmax)]
    zeros = stats.zeros / stats.count if stats.count else 0.0
    return [*cells, zeros_text(zeros), str(stats.nan), str(stats.posinf + stats.neginf), marks.get(id(row), "")]


def _pick_named(cells: Sequence[str], shown: list[str]) -> list[str]:
    """The cells of the columns ``shown`` (``cells`` in :data:`STATS_HEADER` order)."""
    return [cell for cell, name in zip(cells, STATS_HEADER, strict=True) if name in shown]


def _row_format(widths: list[int], left: set[int]) -> str:
    """A format string for cells joined by two spaces: those in ``left`` left-aligned, the rest right-aligned."""
    return "  ".join(f"{{:{'<' if i in left else '>'}{w}}}" for i, w in enumerate(widths))


def _pick(values: list[Any], indices: list[int]) -> list[Any]:
    return [values[i] for i in indices]


def print_stats_csv(rows: list[Any]) -> None:
    """CSV: the JSON's fields, ``path`` joined by ``/`` and ``shape`` as ``2x3``; empty cells for no value."""
    import csv

    from ckpt_tui.core.values.tensor_table import COLUMNS

    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow([*COLUMNS, "reason", "posinf", "neginf"])
    for row in rows:
        cells: list[Any] = []
        for column in COLUMNS:
            value = row.value(column)
            if column == "path":
                value = printable_name(to_slash(value))
            elif column == "shape":
                value = "x".join(str(d) for d in value)
            cells.append("" if value is None else repr(value) if isinstance(value, float) else value)
        signs = ("", "") if row.stats is None else (row.stats.posinf, row.stats.neginf)
        writer.writerow([*cells, row.reason or "", *signs])


class ProgressLine:
    """Core's throttled progress on one updating line of stderr (only when stderr is a terminal and the
    work takes over a second): :attr:`update` is the ``(done, total)`` callback to hand the work."""

    DELAY = 1.0

    def __init__(self, task: str = "stats") -> None:
        import time

        from ckpt_tui.core.runtime.progress import ProgressThrottle

        self.clock = time.monotonic
        self.start = self.clock()
        self.shown = False
        self.live = sys.stderr.isatty()
        self.update = ProgressThrottle(self.show, task)

    def show(self, step: ProgressStep) -> None:
        """Write how far reading has got (the throttle reports each 2% of it)."""
        if not self.live or self.clock() - self.start < self.DELAY:
            return
        sys.stderr.write(
            f"\rreading tensors: {size(step.done)} of {size(step.total)} ({100 * step.fraction:.0f}%), ctrl+c stops "
        )
        sys.stderr.flush()
        self.shown = True

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.shown:  # clear the line, also when interrupted: the one-line message follows
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def print_json(data: Any, *, floatless: bool = False) -> None:
    """One compact JSON object on its own line, all ASCII (with ``transferred`` when remote files were read).

    ``floatless``: the document holds no floats (``info``), so orjson says it exactly as the standard encoder
    would (orjson writes NaN as null, where the documented output has always said NaN).
    """
    from ckpt_tui.core.model.byte_source import transferred

    cost = transferred()
    if cost is not None and isinstance(data, dict):
        data = {**data, "transferred": cost.to_json()}
    # as text: stdout may be any text stream (a test's StringIO); the JSON is ASCII, so decoding is a copy
    sys.stdout.write((_fast_json(data) if floatless else _json(data)).decode("ascii") + "\n")


def print_info_json(summary: Summary) -> None:
    """``info --json``: :func:`print_json` of ``summary.to_json()``, with a flat file's rows rendered from its
    columns (:meth:`~ckpt_tui.core.operations.info.Summary.rows_json`) and put in place by orjson as they are."""
    import orjson

    rows = summary.rows_json()
    fragment = getattr(orjson, "Fragment", None)  # (orjson 3.9.16 and later)
    if rows is None or fragment is None or transferred_cost() is not None:
        print_json(summary.to_json(), floatless=True)
        return
    data = summary.to_json(rows=False)
    data["tensors"] = fragment(rows)
    try:
        out = orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        out = b""
    if not out or not out.isascii():  # said the slow way, as print_json says it
        print_json(summary.to_json(), floatless=True)
        return
    write_ascii(out)


def write_ascii(out: bytes) -> None:
    """ASCII bytes and a newline to stdout: to its byte buffer as they are where its encoding writes ASCII as
    ASCII (no 10 MB decode and encode again), else through the text layer (a test's StringIO, UTF-16)."""
    buffer = getattr(sys.stdout, "buffer", None)
    encoding = getattr(sys.stdout, "encoding", None) or "ascii"
    try:
        plain = "[]".encode(encoding) == b"[]"
    except LookupError:
        plain = False
    if buffer is None or not plain:
        sys.stdout.write(out.decode("ascii") + "\n")
        return
    sys.stdout.flush()  # (what was written as text goes first)
    buffer.write(out)
    buffer.write(b"\n")


def transferred_cost() -> Any:
    """What reading remote files cost so far (None: nothing was fetched)."""
    from ckpt_tui.core.model.byte_source import transferred

    return transferred()


def _json(data: Any) -> bytes:
    """Strict JSON (RFC 8259): a NaN or infinite float is written ``null``, as orjson writes it (the standard
    encoder's bare ``NaN``/``Infinity`` tokens are refused by other languages' parsers); the fields beside
    such a figure (``nan``, ``inf``, ``nonfinite``, ``note``) say why it is missing."""
    import json

    try:
        out = json.dumps(data, default=str, separators=(",", ":"), allow_nan=False)
    except ValueError:
        out = None
    # (a "\\ud..." escape is a character past U+FFFF, or a lone surrogate: only then is the text walked)
    if out is None or "\\ud" in out:
        out = json.dumps(_strict(data), default=str, separators=(",", ":"))
    return out.encode("ascii")


def _strict(data: Any) -> Any:
    """``data`` as strict JSON holds it (dicts, lists and tuples walked): every NaN or infinite float None,
    every lone surrogate in a text or a dict key written as its escape (:func:`json_text`, as paths are)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, str):
        return json_text(data)
    if isinstance(data, dict):
        return {json_text(key) if isinstance(key, str) else key: _strict(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [_strict(value) for value in data]
    return data


def _fast_json(data: Any) -> bytes:
    """orjson, 5-10x faster on 50,000 tensor rows; the standard encoder where orjson would say it otherwise.

    orjson writes non-ASCII text raw (a C1 control in a key would reach the terminal) and refuses ints past
    64 bits and lone surrogates: those documents go the slow way.
    """
    import orjson

    try:
        out = orjson.dumps(data, default=str, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return _json(data)
    return out if out.isascii() else _json(data)
