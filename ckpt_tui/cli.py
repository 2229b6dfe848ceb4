"""Command line: ``ckpt-tui FILE`` opens the browser; ``info``, ``check``, ``demo`` run headless.

Exit codes are API: 0 clean, 1 problems found, 2 unreadable input or refused work.
Heavy modules (torch, textual, numpy) are imported only by the commands that need them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from ckpt_tui.core.model.tree import Checkpoint
    from ckpt_tui.core.weights_only.verdict import ScanBeside

from ckpt_tui import __version__
from ckpt_tui.core.errors import CkptError, EditError, ReadError

COMMANDS = ("info", "check", "stats", "convert", "diff", "average", "demo", "open")
EPILOG = """\
commands:
  ckpt-tui FILE [--readonly]    open FILE in the browser (no FILE: the demo; no terminal: print its info)
  ckpt-tui info FILE [--json]   summary: format, tensors, dtypes, devices, findings (with the fix), tree
  ckpt-tui check FILE [--json]  read every tensor: NaN/Inf, unsafe globals, missing records
  ckpt-tui check FILE --against REF | --model PKG.MOD:FACTORY [--at PATH] [--json]
                                does it fit the model? missing/unexpected/mismatched keys, and the fix
  ckpt-tui stats FILE [--at PATH] [--json | --csv] [--sort COLUMN]
                                per tensor: min, max, mean, std, L2 norm, max |x|, zeros, NaN/Inf counts
  ckpt-tui diff A B [--at-a PATH] [--at-b PATH] [--strip-prefix[-a|-b] P] [--json]
                                keys on one side only, shape/dtype changes, value differences
  ckpt-tui diff A B [C ...] --stats [--json]
                                per layer: relative change, cosine, norms (3+ files: norms across the series)
  ckpt-tui average A B [C ...] -o OUT [--weights W1,W2,...] [--at PATH]
                                weighted mean of the floating-point tensors (model soup, SWA), streamed
  ckpt-tui convert FILE -o OUT  fix and save; edits apply in this order: --extract, --drop, --drop-keys,
                                --rename, --strip-prefix, --rename-prefix/--rename-infix/--rename-map,
                                --add-prefix, --map-location, --dtype
                                --sanitize rewrites what torch.load(weights_only=True) refuses
  ckpt-tui demo                 write a DDP-style training checkpoint and open it

exit codes: 0 ok (check: fits / clean; diff: identical), 1 problems found / does not fit / different /
            an edit does not apply, 2 unreadable input, bad arguments or refused write
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (no heavy imports)."""
    parser = argparse.ArgumentParser(
        prog="ckpt-tui",
        description="Open, check and fix PyTorch checkpoints without loading them or running their pickle.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"ckpt-tui {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    info = sub.add_parser("info", help="print a summary of a checkpoint")
    info.add_argument("file", nargs="+", help="a checkpoint, or several rank files opened as one")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.add_argument("--depth", type=int, default=2, help="levels of the tree to print (default 2)")
    check = sub.add_parser(
        "check",
        help="read every tensor and report NaN/Inf and unsafe content, or compare with a model",
        description="Without --against/--model: read every tensor (NaN/Inf, unsafe globals, broken records). "
        "With them: compare keys and shapes with a reference and suggest the fix. --model imports and runs "
        "YOUR code (package.module:callable returning an nn.Module or a state_dict); nothing else ever does.",
    )
    check.add_argument("file", nargs="+", help="a checkpoint, or several rank files opened as one")
    check.add_argument("--json", action="store_true", help="print one JSON object")
    reference = check.add_mutually_exclusive_group()
    reference.add_argument("--against", metavar="REF", help="another checkpoint, or a text file of keys [shapes]")
    reference.add_argument("--model", metavar="IMPORT:CALLABLE", help="build the reference by calling your code")
    check.add_argument("--at", metavar="PATH", help="compare this subtree of FILE (default: the whole file)")
    stats = sub.add_parser(
        "stats",
        help="read every tensor: min, max, mean, std, L2 norm, max |x|, zeros, NaN and Inf, one row each",
        description="Statistics of the finite values of every tensor (NaN and Inf counted apart), in float64, "
        "streamed in bounded memory; each view of the same bytes is read once. --sort: path and dtype A-Z, "
        "every other column largest first. Tensors whose values are not read (sparse, quantized, meta, a "
        "missing record) get a row with no statistics and a reason.",
    )
    stats.add_argument("file", nargs="+", help="a checkpoint, or several rank files opened as one")
    stats.add_argument("--at", metavar="PATH", help="only this subtree (e.g. model)")
    stats_format = stats.add_mutually_exclusive_group()
    stats_format.add_argument("--json", action="store_true", help='print {"tensors": [...]}')
    stats_format.add_argument("--csv", action="store_true", help="print CSV with a header line")
    stats.add_argument(
        "--sort", metavar="COLUMN", type=_stats_column, help="sort by a column (" + ", ".join(_COLUMNS) + ")"
    )
    diff_ = sub.add_parser("diff", help="compare two checkpoints key by key and value by value")
    diff_.add_argument("a")
    diff_.add_argument("b")
    diff_.add_argument("more", nargs="*", metavar="C", help="more rank files: an N-way summary of what agrees")
    diff_.add_argument("--strip-prefix", metavar="P", help="remove this key prefix on both sides first")
    diff_.add_argument("--at-a", metavar="PATH", help="compare this subtree of A (e.g. model)")
    diff_.add_argument("--at-b", metavar="PATH", help="compare this subtree of B")
    diff_.add_argument("--strip-prefix-a", metavar="P", help="remove this key prefix from A's state_dict")
    diff_.add_argument("--strip-prefix-b", metavar="P", help="remove this key prefix from B's state_dict")
    diff_.add_argument(
        "--stats",
        action="store_true",
        help="per layer: relative change |a-b|/|a|, cosine, norms, with a plot (3+ files: norms across them)",
    )
    diff_.add_argument("--json", action="store_true", help="print one JSON object")
    average = sub.add_parser(
        "average",
        help="average checkpoints (model soup, SWA): streamed, atomic and verified",
        description="Writes the first file with every floating-point tensor replaced by the weighted mean of that "
        "tensor in every file (float64, rounded once to the first file's dtype). Weights are divided by their "
        "sum. Integer, bool and other tensors, and every non-tensor value, come from the first file.",
    )
    average.add_argument("files", nargs="+", metavar="FILE", help="two or more checkpoints with the same keys")
    average.add_argument("-o", "--output", required=True, help="the file to write")
    average.add_argument("--weights", metavar="W1,W2,...", help="one number per file (default: equal)")
    average.add_argument("--at", metavar="PATH", help="average and write only this subtree (e.g. state_dict)")
    average.add_argument("--format", choices=["pth", "safetensors"], help="output format (default: from -o's suffix)")
    average.add_argument("--force", action="store_true", help="replace an existing output")
    convert = sub.add_parser(
        "convert",
        help="edit and save a checkpoint (.pth or .safetensors), streaming, atomic and verified",
        description="Edits apply in this order: extract, drop, drop-keys, rename, strip prefix, rename rules "
        "(--rename-prefix/--rename-infix in the order given, then --rename-map), add prefix, map devices, cast. "
        "Key paths use / between levels (--extract model, --drop optimizer). auto edits with nothing to do "
        "are a no-op with a note, so one command runs over a batch of files.",
    )
    convert.add_argument("file", nargs="+", help="a checkpoint, or several rank files opened as one")
    convert.add_argument("-o", "--output", help="the file to write (required unless --dry-run)")
    convert.add_argument("--extract", metavar="PATH|auto", help="make this subtree the root (auto: the weights)")
    convert.add_argument("--drop", metavar="PATH", action="append", default=[], help="delete a key or subtree")
    convert.add_argument(
        "--drop-keys", metavar="GLOB", action="append", default=[], help="delete the state_dict keys matching a glob"
    )
    convert.add_argument("--rename", metavar="OLD=NEW", action="append", default=[], help="rename one key (a path)")
    convert.add_argument(
        "--strip-prefix", metavar="P|auto", help="remove a key prefix (auto: module., _orig_mod., Lightning's model.)"
    )
    convert.add_argument(
        "--rename-prefix",
        metavar="OLD=NEW",
        dest="rename_rules",
        action="append",
        type=_prefix_rule,
        default=[],
        help="rename every key that starts with OLD (split at the first =)",
    )
    convert.add_argument(
        "--rename-infix",
        metavar="OLD=NEW",
        dest="rename_rules",
        action="append",
        type=_infix_rule,
        help="replace the dotted components OLD by NEW anywhere in a key (attn=attention; NEW empty: remove)",
    )
    convert.add_argument("--rename-map", metavar="FILE", help='a JSON object of prefix renames {"old.": "new."}')
    convert.add_argument("--add-prefix", metavar="P", help="put a prefix in front of every key")
    convert.add_argument(
        "--at", metavar="PATH", help="the dict the key edits and --dtype apply to (default: the detected state_dict)"
    )
    convert.add_argument("--map-location", metavar="SPEC", help="cpu, cuda:0, or cuda:1=cuda:0,cuda:2=cpu")
    convert.add_argument(
        "--dtype",
        type=_cast_dtype,
        metavar="fp16|bf16|fp32",
        help="cast the model's floating-point tensors (float16/half, bfloat16, float32/float; --at / for all)",
    )
    convert.add_argument(
        "--sanitize",
        action="store_true",
        help="rewrite what torch.load(weights_only=True) refuses (numpy, Namespace, OmegaConf, pickled modules...) "
        "as plain data it loads; code is refused unless --drop names it",
    )
    convert.add_argument("--format", choices=["pth", "safetensors"], help="output format (default: from -o's suffix)")
    convert.add_argument(
        "--max-shard-size",
        metavar="SIZE",
        help="write Hugging Face safetensors shards of at most SIZE (5GB, 500MB) and their index into the folder -o",
    )
    convert.add_argument("--force", action="store_true", help="replace an existing output (even the input)")
    convert.add_argument("--dry-run", action="store_true", help="print what would change; write nothing")
    demo = sub.add_parser("demo", help="write the demo checkpoint and open it")
    demo.add_argument("--print", dest="print_only", action="store_true", help="print its info instead of opening it")
    demo.add_argument("--readonly", action="store_true", help="browse only: no edits, no saving")
    open_ = sub.add_parser("open", help="open a checkpoint in the browser (the default command)")
    open_.add_argument("file", nargs="+", help="a checkpoint, or several rank files opened as one")
    open_.add_argument("--readonly", action="store_true", help="browse only: no edits, no saving")
    return parser


_COLUMNS = ("path", "shape", "dtype", "numel", "min", "max", "mean", "std", "norm", "absmax", "zeros", "nan", "inf")
"""The columns of ``stats`` (as ``tensor_table.COLUMNS``, without importing numpy for --help)."""


def _stats_column(text: str) -> str:
    if text not in _COLUMNS:
        raise argparse.ArgumentTypeError(f"unknown column {text!r}; one of {', '.join(_COLUMNS)}")
    return text


def _cast_dtype(text: str) -> str:
    from ckpt_tui.core.edits.tree_edits import cast_dtype

    try:
        return cast_dtype(text)
    except EditError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _prefix_rule(text: str) -> Any:
    return _rule(text, anywhere=False)


def _infix_rule(text: str) -> Any:
    return _rule(text, anywhere=True)


def _rule(text: str, anywhere: bool) -> Any:
    from ckpt_tui.core.edits.tree_edits import RenameRule
    from ckpt_tui.core.runtime.shell import from_argv

    try:
        return RenameRule.parse(from_argv(text), anywhere)
    except EditError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


OPEN_FLAGS = ("--readonly",)


def with_command(args_list: list[str]) -> list[str]:
    """The arguments with the implied command made explicit: ``FILE`` and ``--readonly FILE`` open the
    browser, nothing at all opens the demo."""
    flags = [a for a in args_list if a in OPEN_FLAGS]
    rest = [a for a in args_list if a not in OPEN_FLAGS]
    if not rest:
        return ["demo", *flags]
    if rest[0] in COMMANDS:
        return [*rest, *flags]
    if rest[0].startswith("-"):
        return args_list
    return ["open", *rest, *flags]


def run() -> NoReturn:
    """The ``ckpt-tui`` script and ``python -m ckpt_tui``: :func:`main`, then a quick exit.

    Once the output is flushed nothing is left to do: files were written, verified and synced by the
    commands themselves. Leaving at once skips freeing a big file's tree object by object (a tenth of a
    second on 50,000 tensors, more than many commands take to do their work).
    """
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # the reader of our output left: nothing more to say
        pass
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit code."""
    args_list = with_command(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    args = parser.parse_args(args_list)
    _keys_from_argv(args)
    from ckpt_tui.core.runtime import process
    from ckpt_tui.core.writers.temp_files import remove_on_signals

    process.collect_less_often()  # the tree read stays alive until exit: no GC pass after pass over it
    remove_on_signals()  # SIGTERM/SIGHUP remove the temporary file of a write under way (any thread's)
    try:
        return _run(args)
    except EditError as exc:
        _error(exc)
        return 1
    except CkptError as exc:
        _error(exc)
        return 2
    except KeyboardInterrupt:
        print("ckpt-tui: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


PATH_ARGUMENTS = frozenset({"file", "files", "a", "b", "more", "output", "against", "model", "rename_map"})


def _keys_from_argv(args: argparse.Namespace) -> None:
    """Key and prefix arguments as the file holds them (a key with a lone surrogate round-trips)."""
    from ckpt_tui.core.runtime.shell import from_argv

    for name, value in vars(args).items():
        if name in PATH_ARGUMENTS:
            continue
        if isinstance(value, str):
            setattr(args, name, from_argv(value))
        elif isinstance(value, list) and all(isinstance(item, str) for item in value):
            setattr(args, name, [from_argv(item) for item in value])


def _error(exc: Exception) -> None:
    """The one-line error, with anything from the file in it escaped."""
    from ckpt_tui.core.runtime.safe_text import printable

    print(f"ckpt-tui: {printable(str(exc))}", file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    files = getattr(args, "file", None)
    if isinstance(files, list):  # several files open together as one checkpoint (rank files)
        args.file = files[0] if len(files) == 1 else files
    if args.command == "info":
        return cmd_info(args.file, args.json, args.depth)
    if args.command == "check" and (args.against or args.model):
        return cmd_compare(args.file, args.against, args.model, args.at, args.json)
    if args.command == "check":
        return cmd_check(args.file, args.json)
    if args.command == "stats":
        return cmd_stats(args.file, args.at, "json" if args.json else "csv" if args.csv else "text", args.sort)
    if args.command == "diff" and args.stats:
        return cmd_diff_stats(args)
    if args.command == "diff" and args.more:
        return cmd_rank_diff([args.a, args.b, *args.more], args.json)
    if args.command == "average":
        return cmd_average(args)
    if args.command == "diff":
        return cmd_diff(args)
    if args.command == "convert":
        return cmd_convert(args)
    if args.command == "open":
        return cmd_open(args.file, args.readonly)
    return cmd_demo(getattr(args, "print_only", False), getattr(args, "readonly", False))


def open_for_command(path: str | list[str]) -> Checkpoint:
    """Read a checkpoint for a headless command, then freeze it out of the GC's reach (it lives until exit)."""
    from ckpt_tui.core.readers.open import open_checkpoint
    from ckpt_tui.core.runtime import process

    with process.gc_paused():  # frozen before the GC comes back: no pass over the objects just made
        checkpoint = open_checkpoint(path)
        process.freeze_gc()
    return checkpoint


def cmd_info(path: str | list[str], as_json: bool, depth: int) -> int:
    """``info``: the summary, as text or JSON."""
    from ckpt_tui.core.operations.info import summarize

    summary = summarize(open_for_command(path))
    if as_json:
        _print_json(summary.to_json())
    else:
        from ckpt_tui.report import render_info

        print(render_info(summary, depth))
    return 0


def cmd_check(path: str | list[str], as_json: bool) -> int:
    """``check``: read every tensor's values; exit 1 on NaN/Inf, unsafe globals or broken records."""
    from ckpt_tui.core.operations.check import check_checkpoint
    from ckpt_tui.core.weights_only.verdict import ScanBeside

    beside = ScanBeside(path) if isinstance(path, str) and os.path.isfile(path) else None  # on the second core
    try:
        checkpoint = open_for_command(path)
    except ReadError as exc:
        _print_unreadable_verdict(path, exc, as_json, beside)
        raise
    report = check_checkpoint(checkpoint, beside=beside)
    if as_json:
        _print_json(report.to_json())
    else:
        from ckpt_tui.report import render_check

        print(render_check(report))
    return 0 if report.ok else 1


def cmd_stats(path: str | list[str], at: str | None, output: str, sort: str | None) -> int:
    """``stats``: every tensor's statistics as a table, JSON or CSV (exit 0; 2 unreadable or a bad --at)."""
    from ckpt_tui.core.model.tree import get
    from ckpt_tui.core.operations.convert import resolve_option_path
    from ckpt_tui.core.values.tensor_table import sort_rows, tensor_paths, tensor_rows

    checkpoint = open_for_command(path)
    where = resolve_option_path(checkpoint.root, at, "--at") if at else ()
    tensors = tensor_paths(get(checkpoint.root, where), where)
    with _ProgressLine() as progress:
        rows = list(tensor_rows(tensors, checkpoint.byteorder, progress=progress.update))
    if sort:
        rows = sort_rows(rows, sort)
    if output == "json":
        _print_json({"tensors": [row.to_json() for row in rows]})
    elif output == "csv":
        _print_stats_csv(rows)
    else:
        import shutil

        from ckpt_tui.core.conventions.layer_marks import marks
        from ckpt_tui.report import render_stats

        if not rows:
            print("no tensors" + (f" under {at}" if at else ""))
            return 0
        print(render_stats(rows, marks(rows), shutil.get_terminal_size((80, 24)).columns))
    return 0


def _print_stats_csv(rows: list[Any]) -> None:
    """CSV: the JSON's fields, ``path`` joined by ``/`` and ``shape`` as ``2x3``; empty cells for no value."""
    import csv

    from ckpt_tui.core.model.keypath import to_slash
    from ckpt_tui.core.runtime.safe_text import printable
    from ckpt_tui.core.values.tensor_table import COLUMNS

    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow([*COLUMNS, "reason"])
    for row in rows:
        cells: list[Any] = []
        for column in COLUMNS:
            value = row.value(column)
            if column == "path":
                value = printable(to_slash(value))
            elif column == "shape":
                value = "x".join(str(d) for d in value)
            cells.append("" if value is None else repr(value) if isinstance(value, float) else value)
        writer.writerow([*cells, row.reason or ""])


class _ProgressLine:
    """One updating line on stderr (only when stderr is a terminal and the work takes over a second)."""

    DELAY = 1.0
    EVERY = 0.2

    def __init__(self) -> None:
        import time

        self.clock = time.monotonic
        self.start = self.clock()
        self.last = 0.0
        self.shown = False
        self.live = sys.stderr.isatty()

    def update(self, done: int, total: int) -> None:
        """Show how far reading has got, at most five times a second."""
        now = self.clock()
        if not self.live or now - self.start < self.DELAY or now - self.last < self.EVERY:
            return
        from ckpt_tui.core.model.describe import size

        self.last = now
        percent = 100 * done / total if total else 100.0
        sys.stderr.write(f"\rreading tensors: {size(done)} of {size(total)} ({percent:.0f}%), ctrl+c stops ")
        sys.stderr.flush()
        self.shown = True

    def __enter__(self) -> _ProgressLine:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.shown:  # clear the line, also when interrupted: the one-line message follows
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def _print_unreadable_verdict(
    path: str | list[str], exc: ReadError, as_json: bool, beside: ScanBeside | None = None
) -> None:
    """A file ckpt-tui's reader refuses still gets torch.load(weights_only=True)'s verdict, from the scan alone."""
    scan = beside.result() if beside is not None else None
    if not isinstance(path, str) or not os.path.isfile(path):
        return
    from ckpt_tui.core.weights_only.verdict import scan_file, verdict_from_scan

    try:
        judged = verdict_from_scan(scan or scan_file(path), None)
    except Exception:  # a hostile file: the read error alone is reported
        return
    if judged.loads is None:
        return
    # the scan may find nothing wrong, but a file the reader refuses is never "loads"
    judged.doubt(f"ckpt-tui's reader refuses it ({exc})")
    if as_json:
        _print_json({"path": path, "readable": False, "error": str(exc), "weights_only": judged.to_json()})
        return
    from ckpt_tui.report import verdict_lines

    lines = verdict_lines(judged, path, readable=False)
    print("\n".join(lines))


def cmd_compare(path: str | list[str], against: str | None, model: str | None, at: str | None, as_json: bool) -> int:
    """``check --against/--model``: exit 0 when every key and shape fits, 1 when not."""
    from ckpt_tui.core.model.tree import Opaque, get
    from ckpt_tui.core.operations.compare import compare_checkpoint, load_reference
    from ckpt_tui.core.operations.convert import resolve_option_path

    checkpoint = open_for_command(path)
    path = checkpoint.path
    reference = load_reference(against, model)
    where = resolve_option_path(checkpoint.root, at, "--at") if at else ()
    report = compare_checkpoint(checkpoint.root, where, reference)
    if as_json:
        _print_json(report.to_json(path))
    else:
        from ckpt_tui.core.operations.reports import describe_compare, render_text

        value = get(checkpoint.root, where)
        module = isinstance(value, Opaque) and value.is_module
        name = against if against else f"--model {model}"
        print(render_text(describe_compare(report, path, str(name), where, module)))
    return 0 if report.ok else 1


def cmd_diff(args: argparse.Namespace) -> int:
    """``diff``: exit 0 when identical, 1 when they differ."""
    from ckpt_tui.core.operations.diff import diff

    a, b = _two_sides(args)
    report = diff(a, b, args.strip_prefix)
    if args.json:
        _print_json(report.to_json())
    else:
        from ckpt_tui.core.operations.reports import describe_diff, render_text

        print(render_text(describe_diff(report, _side(args.a, args.at_a), _side(args.b, args.at_b))))
    return 0 if report.identical else 1


def _two_sides(args: argparse.Namespace) -> tuple[Any, Any]:
    """A and B of ``diff``, each opened and narrowed by its ``--at-*`` and ``--strip-prefix-*``."""
    from ckpt_tui.core.operations.convert import select

    a = select(open_for_command(args.a), args.at_a, args.strip_prefix_a, "a")
    return a, select(open_for_command(args.b), args.at_b, args.strip_prefix_b, "b")


def cmd_rank_diff(paths: list[str], as_json: bool) -> int:
    """``diff R0 R1 R2 ...``: which ranks agree bit for bit; exit 0 when all do, 1 when not."""
    from ckpt_tui.core.operations.rank_diff import rank_diff, render_rank_diff
    from ckpt_tui.core.readers.open import open_checkpoint

    report = rank_diff([open_checkpoint(p) for p in paths])
    if as_json:
        _print_json(report.to_json())
    else:
        print(render_rank_diff(report))
    return 0 if report.identical else 1


def cmd_diff_stats(args: argparse.Namespace) -> int:
    """``diff A B --stats``: how far each layer moved (exit 0); with more files, norms across the series."""
    from ckpt_tui.core.operations.convert import select
    from ckpt_tui.core.operations.layer_change import layer_change, norm_series
    from ckpt_tui.core.operations.reports import describe_layer_change, describe_norm_series, render_text

    if args.more:
        if args.at_b or args.strip_prefix_b:
            raise ReadError("with more than two files, use --at-a and --strip-prefix-a (applied to every file)")
        paths = [args.a, args.b, *args.more]
        sides = [select(open_for_command(p), args.at_a, args.strip_prefix_a, "a") for p in paths]
        series = norm_series(sides, args.strip_prefix)
        if args.json:
            _print_json(series.to_json(paths))
        else:
            print(render_text(describe_norm_series(series, paths), limit=sys.maxsize))
        return 0
    a, b = _two_sides(args)
    report = layer_change(a, b, args.strip_prefix)
    if args.json:
        _print_json(report.to_json())
    else:
        described = describe_layer_change(report, _side(args.a, args.at_a), _side(args.b, args.at_b))
        print(render_text(described, limit=sys.maxsize))
    return 0


def cmd_average(args: argparse.Namespace) -> int:
    """``average``: write the weighted mean of the files' floating-point tensors (exit 0)."""
    from ckpt_tui.core.operations.average import average
    from ckpt_tui.core.runtime.safe_text import printable

    plan, result = average(args.files, args.output, args.weights, args.at, args.format, force=args.force)
    for line in plan.lines():
        print(printable(line))
    print(printable(result.line()))
    return 0


def _side(path: str, at: str | None) -> str:
    return f"{path} at {at}" if at else path


def cmd_convert(args: argparse.Namespace) -> int:
    """``convert``: apply the edits in their fixed order, then save (or print them with --dry-run)."""
    from ckpt_tui.core.operations.convert import ConvertOptions, convert
    from ckpt_tui.core.runtime.safe_text import printable

    options = ConvertOptions(
        extract=args.extract,
        drop=args.drop,
        drop_keys=args.drop_keys,
        rename=args.rename,
        strip_prefix=args.strip_prefix,
        rename_rules=args.rename_rules or [],
        rename_map=args.rename_map,
        add_prefix=args.add_prefix,
        at=args.at,
        map_location=args.map_location,
        dtype=args.dtype,
        sanitize=args.sanitize,
    )
    if not args.dry_run and not args.output:
        print("ckpt-tui: convert needs -o OUT (or --dry-run)", file=sys.stderr)
        return 2
    if args.max_shard_size and not args.dry_run:
        from ckpt_tui.core.writers.hf_shards import convert_to_shards

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
        outcome = convert(args.file, options, args.output, args.format, force=args.force, dry_run=args.dry_run)
    for note in outcome.notes:
        print(f"note: {printable(note)}")
    for change in outcome.changes:
        print("\n".join(printable(line) for line in change.lines()))
    if not outcome.changes:
        print("no edits: the checkpoint is written as it is" if outcome.result else "no edits")
    if outcome.result is not None:
        print(printable(outcome.result.line()))
    return 0


def cmd_open(path: str | list[str], readonly: bool) -> int:
    """Open the browser (Textual is imported only here); with no terminal, print ``info`` instead."""
    if not (sys.stdout.isatty() and sys.stdin.isatty()):
        return cmd_info(path, False, 2)
    from ckpt_tui.tui.app import CkptApp

    if isinstance(path, list):  # rank files: open_checkpoint takes the list
        name = f"{len(path)} files: " + ", ".join(p.rstrip("/").rsplit("/", 1)[-1] for p in path)
        CkptApp(path, readonly=readonly, display_name=name).run()
        return 0
    CkptApp(path, readonly=readonly).run()
    return 0


def cmd_demo(print_only: bool, readonly: bool = False) -> int:
    """``demo``: write the demo checkpoint, then open it (or print its info)."""
    from ckpt_tui.core.operations.demo import write_demo

    path = write_demo()
    if print_only or not (sys.stdout.isatty() and sys.stdin.isatty()):
        print(f"demo checkpoint written to {path}", file=sys.stderr)
        return cmd_info(str(path), False, 2)
    return cmd_open(str(path), readonly)


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, default=str, separators=(",", ":")))
    sys.stdout.write("\n")
