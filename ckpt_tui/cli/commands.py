"""One handler per command, in :data:`HANDLERS`: each takes the parsed arguments and returns the exit code.

Heavy modules (torch, textual, numpy) are imported inside the handlers that need them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ckpt_tui.cli.render import ProgressLine, print_info_json, print_json, print_stats_csv
from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.keypath import file_path_json

if TYPE_CHECKING:
    from ckpt_tui.core.model.tree import Checkpoint
    from ckpt_tui.core.readers.read_once import PickleBytes
    from ckpt_tui.core.readers.zip_archive import ZipDirectory
    from ckpt_tui.core.weights_only.verdict import FileScan, Verdict


def open_for_command(path: str | list[str]) -> Checkpoint:
    """Read a checkpoint for a headless command, then freeze it out of the GC's reach (it lives until exit)."""
    from ckpt_tui.core.readers.open import open_checkpoint
    from ckpt_tui.core.runtime import process

    with process.gc_paused():  # frozen before the GC comes back: no pass over the objects just made
        checkpoint = open_checkpoint(path)
        process.freeze_gc()
    return checkpoint


def open_named(paths: list[str]) -> list[Checkpoint]:
    """Files named side by side (diff's), each read as the file named (``readers.open.as_named``)."""
    from ckpt_tui.core.readers.open import as_named, open_checkpoint
    from ckpt_tui.core.runtime import process

    with process.gc_paused():
        checkpoints = as_named(paths, [open_checkpoint(path) for path in paths])
        process.freeze_gc()
    return checkpoints


def within_budget(checkpoint: Checkpoint, what: str, tensors: list[Any] | None = None) -> None:
    """Refuse up front, in one line saying how much, values of a remote checkpoint past ``--max-download``."""
    from ckpt_tui.core.model import byte_source

    if not byte_source.is_remote(checkpoint.path):
        return
    from ckpt_tui.core.model.remote import ensure_values_budget
    from ckpt_tui.core.model.tree import iter_tensors

    listed = tensors if tensors is not None else [t for _, t in iter_tensors(checkpoint.root)]
    ensure_values_budget(checkpoint.path, listed, what)


def _past_budget(*checkpoints: Checkpoint) -> str | None:
    """Why the values of these checkpoints may not be read (remote ones past ``--max-download``, all of them together:
    the cap is the command's), or None."""
    from ckpt_tui.core.model import byte_source

    far = [checkpoint for checkpoint in checkpoints if byte_source.is_remote(checkpoint.path)]
    if not far:
        return None
    from ckpt_tui.core.model.remote import ensure_values_budget
    from ckpt_tui.core.model.tree import iter_tensors

    names = " and ".join(dict.fromkeys(checkpoint.path for checkpoint in far))
    try:
        ensure_values_budget(names, [t for c in far for _, t in iter_tensors(c.root)], "comparing values")
    except ReadError as exc:
        return str(exc)
    return None


def terminal_width() -> int | None:
    """The terminal's width when the output goes to one (``COLUMNS`` first, as the help asks it), else None:
    text sent to a pipe or a file keeps each item on one line, for grep and scripts."""
    if not sys.stdout.isatty():
        return None
    from ckpt_tui.cli.parser import terminal_columns

    return terminal_columns()


def info(args: argparse.Namespace) -> int:
    """``info``: the summary, as text or JSON."""
    return _info(args.file, args.json, args.depth)


def _info(path: str | list[str], as_json: bool, depth: int) -> int:
    from ckpt_tui.core.operations.info import summarize

    summary = summarize(open_for_command(path))
    if as_json:
        print_info_json(summary)
    else:
        from ckpt_tui.cli.render import render_info

        print(render_info(summary, depth, terminal_width()))
    return 0


def check(args: argparse.Namespace) -> int:
    """``check``: read every tensor's values; exit 1 on NaN/Inf, unsafe globals or broken records.
    With ``--against``/``--model``: does the file fit the reference."""
    if args.against or args.model:
        return _compare(args.file, args.against, args.model, args.at, args.json)
    return _check(args.file, args.json)


def _check(path: str | list[str], as_json: bool) -> int:
    from ckpt_tui.core.operations.check import check_checkpoint
    from ckpt_tui.core.readers.read_once import when_pickle_read
    from ckpt_tui.core.weights_only.verdict import ScanBeside

    # the verdict on the second core, over the bytes the tree is read from: a zip's or legacy file's pickle is
    # read once, and judged in a child started as soon as it is read; other files once read
    beside = ScanBeside()
    given = path if isinstance(path, str) and os.path.isfile(path) else None

    def pickle_read(read: str, what_was_read: ZipDirectory | PickleBytes) -> None:
        if read == given:  # (not a file inside a folder the given file opens)
            beside.start(read, what_was_read)

    try:
        with when_pickle_read(pickle_read):
            checkpoint = open_for_command(path)
    except ReadError as exc:
        # the child's scan, where one started (over the pickle the reader read before it failed)
        _print_unreadable_verdict(path, exc, as_json, beside.result(given))
        raise
    if given is not None:
        beside.start(checkpoint.path)
    within_budget(checkpoint, "check (it reads every tensor)")
    report = check_checkpoint(checkpoint, beside=beside)
    if as_json:
        print_json(report.to_json())
    else:
        from ckpt_tui.cli.render import render_check

        print(render_check(report))
    return 0 if report.ok else 1


NONFINITE_NOTE = (
    "NaN/Inf found: min, max, mean, std, norm and absmax are of the finite values;\n"
    "ckpt-tui check says where the first NaN and the first Inf of each tensor are"
)
"""Under a ``stats`` table that holds NaN or Inf."""


def stats(args: argparse.Namespace) -> int:
    """``stats``: every tensor's statistics as a table, JSON or CSV (exit 0; 1 when a tensor holds NaN or Inf;
    2 unreadable or a bad --at)."""
    output = "json" if args.json else "csv" if args.csv else "text"
    return _stats(args.file, args.at, output, args.sort)


def _stats(path: str | list[str], at: str | None, output: str, sort: str | None) -> int:
    from ckpt_tui.core.model.tree import get
    from ckpt_tui.core.operations.convert import resolve_option_path
    from ckpt_tui.core.values.tensor_table import sort_rows, tensor_paths, tensor_rows
    from ckpt_tui.core.weights_only.verdict import ScanBeside

    checkpoint = open_for_command(path)
    where = resolve_option_path(checkpoint.root, at, "--at") if at else ()
    tensors = tensor_paths(get(checkpoint.root, where), where)
    within_budget(checkpoint, "stats", [tensor for _, tensor in tensors])
    # torch.load's verdict on the file, judged in a child on the second core while the values are read
    beside = ScanBeside.of(checkpoint) if isinstance(path, str) and os.path.isfile(path) else None
    with ProgressLine() as progress:
        rows = list(tensor_rows(tensors, checkpoint.byteorder, progress=progress.update))
    if sort:
        rows = sort_rows(rows, sort)
    # NaN or Inf is a problem found (exit 1, as check says it), whichever form the table takes; so are the
    # NaN/Inf a row does not count (a sparse tensor's values, a quantized tensor's scales) and a file torch
    # refuses for a tensor or record it cannot load: check's own judgement of each
    from ckpt_tui.core.operations.check import hidden_nonfinite, loader_judgement
    from ckpt_tui.core.runtime.safe_text import printable

    hidden = hidden_nonfinite([(row.path, row.tensor) for row in rows], checkpoint.byteorder)
    hidden += loader_judgement(checkpoint, beside, tensors_only=True)[1]
    found = 1 if hidden or any(row.nonfinite or row.unreadable for row in rows) else 0
    if output == "json":
        print_json({"tensors": [row.to_json() for row in rows], "problems": [p.to_json() for p in hidden]})
    elif output == "csv":
        print_stats_csv(rows)
    else:
        import shutil

        from ckpt_tui.cli.render import render_stats
        from ckpt_tui.core.conventions.layer_marks import marks

        if not rows:
            print("no tensors" + (f" under {at}" if at else ""))
        else:
            print(render_stats(rows, marks(rows), shutil.get_terminal_size((80, 24)).columns))
        if any(row.nonfinite for row in rows):
            print(NONFINITE_NOTE)
        for problem in hidden:
            print(f"! [{problem.kind}] {printable(problem.message)}")
    return found


def _print_unreadable_verdict(
    path: str | list[str], exc: ReadError, as_json: bool, scan: FileScan | None = None
) -> None:
    """A file or folder ckpt-tui's reader refuses still gets torch.load(weights_only=True)'s verdict, from the
    scan alone (``scan``: already made, else made here); ``--json`` always prints its document."""
    judged = _verdict_alone(path, scan)
    answers = judged is not None and judged.loads is not None
    if judged is not None and answers:
        # the scan may find nothing wrong, but a file the reader refuses is never "loads"
        judged.doubt(f"ckpt-tui's reader refuses it ({exc})")
    if as_json:
        # a script parsing stdout gets JSON for every refusal, with or without a verdict
        verdict = judged.to_json() if judged is not None else None
        print_json({**file_path_json(path), "readable": False, "error": str(exc), "weights_only": verdict})
        return
    if judged is None or not answers:
        return
    from ckpt_tui.cli.render import verdict_lines

    print("\n".join(verdict_lines(judged, path if isinstance(path, str) else path[0], readable=False)))


def _verdict_alone(path: str | list[str], scan: FileScan | None) -> Verdict | None:
    """The verdict from the scan alone (None: several paths, a missing path, or a scan that fails)."""
    if not isinstance(path, str) or not os.path.exists(path):
        return None
    from ckpt_tui.core.weights_only.verdict import scan_file, verdict_from_scan

    try:
        judged = verdict_from_scan(scan or scan_file(path), None)
    except Exception:  # a hostile file: the read error alone is reported
        return None
    return judged


def _compare(path: str | list[str], against: str | None, model: str | None, at: str | None, as_json: bool) -> int:
    """``check --against/--model``: exit 0 when every key and shape fits, 1 when not."""
    from ckpt_tui.core.model.tree import Opaque, get
    from ckpt_tui.core.operations.compare import compare_checkpoint, load_reference
    from ckpt_tui.core.operations.convert import resolve_option_path

    checkpoint = open_for_command(path)
    path = checkpoint.path
    reference = load_reference(against, model)
    where = resolve_option_path(checkpoint.root, at, "--at") if at else ()
    report = compare_checkpoint(checkpoint.root, where, reference)
    if report.suggestion is not None:
        from ckpt_tui.core.operations.info import missing_records

        report.unwritable = missing_records(checkpoint.root)
    if as_json:
        print_json(report.to_json(path))
    else:
        from ckpt_tui.core.operations.reports import describe_compare, render_text

        value = get(checkpoint.root, where)
        module = isinstance(value, Opaque) and value.is_module
        name = against if against else f"--model {model}"
        print(render_text(describe_compare(report, path, str(name), where, module), width=terminal_width()))
    return 0 if report.ok else 1


def diff(args: argparse.Namespace) -> int:
    """``diff``: exit 0 when identical, 1 when they differ; ``--stats``: how far each layer moved; three or
    more files: which ranks agree."""
    if args.stats:
        return _diff_stats(args)
    if args.more:
        return _rank_diff([args.a, args.b, *args.more], args.json)
    return _diff(args)


def _diff(args: argparse.Namespace) -> int:
    from ckpt_tui.core.operations.diff import diff as diff_of

    a, b = _two_sides(args)
    report = diff_of(a, b, args.strip_prefix, values_refused=_past_budget(a, b))
    if args.json:
        print_json(report.to_json())
    else:
        from ckpt_tui.core.operations.reports import describe_diff, render_text

        # the paths as given make the whole command only when no option already narrows a side
        given = args.at_a or args.at_b or args.strip_prefix or args.strip_prefix_a or args.strip_prefix_b
        paths = None if given or not isinstance(args.a, str) else (args.a, args.b)
        described = describe_diff(report, _side(args.a, args.at_a), _side(args.b, args.at_b), paths)
        print(render_text(described, width=terminal_width()))
    return 0 if report.identical else 1


def _two_sides(args: argparse.Namespace) -> tuple[Any, Any]:
    """A and B of ``diff``, each opened and narrowed by its ``--at-*`` and ``--strip-prefix-*``."""
    a, b = open_named([args.a, args.b])
    return _narrowed(a, args.at_a, args.strip_prefix_a, "a"), _narrowed(b, args.at_b, args.strip_prefix_b, "b")


def _narrowed(checkpoint: Any, at: str | None, strip_prefix: str | None, side: str) -> Any:
    """One side of ``diff`` narrowed by ``--at-SIDE`` and ``--strip-prefix-SIDE`` (convert's edits are imported
    only when one is given)."""
    if not at and not strip_prefix:
        return checkpoint
    from ckpt_tui.core.operations.convert import select

    return select(checkpoint, at, strip_prefix, side)


def _rank_diff(paths: list[str], as_json: bool) -> int:
    """``diff R0 R1 R2 ...``: which ranks agree bit for bit; exit 0 when all do, 1 when not."""
    from ckpt_tui.core.operations.rank_diff import rank_diff, render_rank_diff

    report = rank_diff(open_named(paths))
    if as_json:
        print_json(report.to_json())
    else:
        print(render_rank_diff(report))
    return 0 if report.identical else 1


def _diff_stats(args: argparse.Namespace) -> int:
    """``diff A B --stats``: how far each layer moved; with more files, norms across the series. Exit 0 when
    nothing moved, 1 when a layer or key differs (as ``diff`` exits)."""
    from ckpt_tui.core.operations.layer_change import layer_change, norm_series
    from ckpt_tui.core.operations.reports import describe_layer_change, describe_norm_series, render_text

    if args.more:
        if args.at_b or args.strip_prefix_b:
            raise ReadError("with more than two files, use --at-a and --strip-prefix-a (applied to every file)")
        paths = [args.a, args.b, *args.more]
        sides = [_narrowed(side, args.at_a, args.strip_prefix_a, "a") for side in open_named(paths)]
        series = norm_series(sides, args.strip_prefix)
        if args.json:
            print_json(series.to_json(paths))
        else:
            print(render_text(describe_norm_series(series, paths), limit=sys.maxsize, width=terminal_width()))
        return 0 if series.unchanged else 1
    a, b = _two_sides(args)
    report = layer_change(a, b, args.strip_prefix)
    if args.json:
        print_json(report.to_json())
    else:
        described = describe_layer_change(report, _side(args.a, args.at_a), _side(args.b, args.at_b))
        print(render_text(described, limit=sys.maxsize, width=terminal_width()))
    return 0 if report.unchanged else 1


def average(args: argparse.Namespace) -> int:
    """``average``: write the weighted mean of the files' floating-point tensors (exit 0)."""
    from ckpt_tui.core.operations.average import average as average_files
    from ckpt_tui.core.runtime.safe_text import printable

    plan, result = average_files(
        args.files, args.output, args.weights, args.at, args.format, force=args.force, allow_nan=args.allow_nan
    )
    for line in plan.lines():
        print(printable(line))
    print(printable(result.line()))
    return 0


def _side(path: str, at: str | None) -> str:
    """A compared side as reports name it: the file as a user types it (``bad\\xff.pth``), and its subtree."""
    from ckpt_tui.core.runtime.safe_text import printable_path

    name = printable_path(path)
    return f"{name} at {at}" if at else name


def convert(args: argparse.Namespace) -> int:
    """``convert``: apply the edits in their fixed order, then save (or print them with --dry-run)."""
    from ckpt_tui.core.operations.convert import EDIT_OPTIONS, ConvertOptions
    from ckpt_tui.core.operations.convert import convert as convert_file
    from ckpt_tui.core.runtime.safe_text import printable

    # each edit option's argparse dest is its ConvertOptions field (EDIT_OPTIONS names both)
    options = ConvertOptions(**{field: getattr(args, field) for field in EDIT_OPTIONS.values()}, sanitize=args.sanitize)
    if not args.dry_run and not args.output:
        print("ckpt-tui: convert needs -o OUT (or --dry-run)", file=sys.stderr)
        return 2
    if args.max_shard_size and not args.dry_run:
        from ckpt_tui.core.operations.convert import convert_to_shards

        if args.format == "pth":
            print("ckpt-tui: --max-shard-size writes safetensors shards", file=sys.stderr)
            return 2
        changes, notes, written = convert_to_shards(args.file, options, args.output, args.max_shard_size)
        for note in notes:
            print(f"note: {printable(note)}")
        for change in changes:
            print("\n".join(printable(line) for line in change.lines()))
        print(printable(written.line()))
        return 0
    from ckpt_tui.core.runtime import process

    with process.gc_paused():  # a short-lived command over one tree: the cyclic GC only costs time
        outcome = convert_file(args.file, options, args.output, args.format, force=args.force, dry_run=args.dry_run)
    for note in outcome.notes:
        print(f"note: {printable(note)}")
    for change in outcome.changes:
        print("\n".join(printable(line) for line in change.lines()))
    if not outcome.changes and outcome.result is not None:
        print("no edits: the checkpoint is written as it is")
    elif not outcome.changes:
        print("no edits")
    if outcome.result is not None:
        print(printable(outcome.result.line()))
    elif args.dry_run:
        print(f"dry run: nothing written{f' ({printable(args.output)} not made)' if args.output else ''}")
    return 0


def open_(args: argparse.Namespace) -> int:
    """``open`` (the default command): the browser."""
    return _open(args.file, args.readonly)


def _open(path: str | list[str], readonly: bool) -> int:
    """Open the browser (Textual is imported only here); with no terminal, print ``info`` instead."""
    if not (sys.stdout.isatty() and sys.stdin.isatty()):
        return _info(path, False, 2)
    from ckpt_tui.tui.app import CkptApp
    from ckpt_tui.tui.terminal import run as run_browser

    if isinstance(path, list):  # rank files: open_checkpoint takes the list
        name = f"{counted(len(path), 'file')}: " + ", ".join(p.rstrip("/").rsplit("/", 1)[-1] for p in path)
        run_browser(CkptApp(path, readonly=readonly, display_name=name))
        return 0
    run_browser(CkptApp(path, readonly=readonly))
    return 0


def demo(args: argparse.Namespace) -> int:
    """``demo`` (no arguments at all): write the demo checkpoint, then open it (or print its info)."""
    print_only: bool = getattr(args, "print_only", False)
    readonly: bool = getattr(args, "readonly", False)
    from ckpt_tui.core.operations.demo import demo_files, write_files

    files = demo_files()
    if print_only or not (sys.stdout.isatty() and sys.stdin.isatty()):
        write_files(files)
        print(
            f"demo checkpoint written to {files.checkpoint}, the bare model's state_dict to {files.reference} "
            f"(ckpt-tui check {files.checkpoint} --against {files.reference} prints the fix)",
            file=sys.stderr,
        )
        return _info(str(files.checkpoint), False, 2)
    from ckpt_tui.tui.app import CkptApp

    # the browser paints first and writes the files in its open worker (importing torch alone takes seconds)
    preparing = ("writing the demo files…", lambda: write_files(files))
    app = CkptApp(str(files.checkpoint), readonly=readonly, welcome=files.welcome(), prepare=preparing)
    # c offers the reference at once: the README's walkthrough is c, enter
    app.remember("compare", str(files.reference))
    from ckpt_tui.tui.terminal import run as run_browser

    run_browser(app)
    return 0


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "info": info,
    "check": check,
    "stats": stats,
    "convert": convert,
    "diff": diff,
    "average": average,
    "open": open_,
    "demo": demo,
}
"""Each command's handler; ``open`` is the browser, the default when the first argument is a file."""
