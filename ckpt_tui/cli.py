"""Command line: ``ckpt-tui FILE`` opens the browser; ``info``, ``check``, ``demo`` run headless.

Exit codes are API: 0 clean, 1 problems found, 2 unreadable input or refused work.
Heavy modules (torch, textual, numpy) are imported only by the commands that need them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from ckpt_tui import __version__
from ckpt_tui.core.errors import CkptError, EditError

COMMANDS = ("info", "check", "convert", "diff", "demo", "open")
EPILOG = """\
commands:
  ckpt-tui FILE [--readonly]    open FILE in the browser (no FILE: the demo)
  ckpt-tui info FILE [--json]   summary: format, tensors, dtypes, devices, findings, tree
  ckpt-tui check FILE [--json]  read every tensor: NaN/Inf, unsafe globals, missing records
  ckpt-tui check FILE --against REF | --model PKG.MOD:FACTORY [--at PATH] [--json]
                                does it fit the model? missing/unexpected/mismatched keys, and the fix
  ckpt-tui diff A B [--strip-prefix P] [--json]
                                keys on one side only, shape/dtype changes, value differences
  ckpt-tui convert FILE -o OUT  fix and save: --extract, --drop, --rename, --strip-prefix,
                                --add-prefix, --map-location, --dtype (applied in that order)
  ckpt-tui demo                 write a DDP-style training checkpoint and open it

exit codes: 0 ok, 1 problems found / edit does not apply, 2 unreadable input or refused write
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
    info.add_argument("file")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.add_argument("--depth", type=int, default=2, help="levels of the tree to print (default 2)")
    check = sub.add_parser(
        "check",
        help="read every tensor and report NaN/Inf and unsafe content, or compare with a model",
        description="Without --against/--model: read every tensor (NaN/Inf, unsafe globals, broken records). "
        "With them: compare keys and shapes with a reference and suggest the fix. --model imports and runs "
        "YOUR code (package.module:callable returning an nn.Module or a state_dict); nothing else ever does.",
    )
    check.add_argument("file")
    check.add_argument("--json", action="store_true", help="print one JSON object")
    reference = check.add_mutually_exclusive_group()
    reference.add_argument("--against", metavar="REF", help="another checkpoint, or a text file of keys [shapes]")
    reference.add_argument("--model", metavar="IMPORT:CALLABLE", help="build the reference by calling your code")
    check.add_argument("--at", metavar="PATH", help="compare this subtree of FILE (default: the whole file)")
    diff_ = sub.add_parser("diff", help="compare two checkpoints key by key and value by value")
    diff_.add_argument("a")
    diff_.add_argument("b")
    diff_.add_argument("--strip-prefix", metavar="P", help="remove this key prefix on both sides first")
    diff_.add_argument("--json", action="store_true", help="print one JSON object")
    convert = sub.add_parser(
        "convert",
        help="edit and save a checkpoint (.pth or .safetensors), streaming, atomic and verified",
        description="Edits apply in this order: extract, drop, rename, strip prefix, add prefix, map devices, cast. "
        "Key paths use / between levels (--extract model, --drop optimizer).",
    )
    convert.add_argument("file")
    convert.add_argument("-o", "--output", help="the file to write (required unless --dry-run)")
    convert.add_argument("--extract", metavar="PATH|auto", help="make this subtree the root (auto: the weights)")
    convert.add_argument("--drop", metavar="PATH", action="append", default=[], help="delete a key or subtree")
    convert.add_argument("--rename", metavar="OLD=NEW", action="append", default=[], help="rename one key (a path)")
    convert.add_argument("--strip-prefix", metavar="P|auto", help="remove a key prefix (auto: the detected one)")
    convert.add_argument("--add-prefix", metavar="P", help="put a prefix in front of every key")
    convert.add_argument("--at", metavar="PATH", help="the dict --strip/--add-prefix edit (default: the detected one)")
    convert.add_argument("--map-location", metavar="SPEC", help="cpu, cuda:0, or cuda:1=cuda:0,cuda:2=cpu")
    convert.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], help="cast floating-point tensors")
    convert.add_argument("--format", choices=["pth", "safetensors"], help="output format (default: from -o's suffix)")
    convert.add_argument("--force", action="store_true", help="replace an existing output (even the input)")
    convert.add_argument("--dry-run", action="store_true", help="print what would change; write nothing")
    demo = sub.add_parser("demo", help="write the demo checkpoint and open it")
    demo.add_argument("--print", dest="print_only", action="store_true", help="print its info instead of opening it")
    demo.add_argument("--readonly", action="store_true", help="browse only: no edits, no saving")
    open_ = sub.add_parser("open", help="open a checkpoint in the browser (the default command)")
    open_.add_argument("file")
    open_.add_argument("--readonly", action="store_true", help="browse only: no edits, no saving")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list:
        args_list = ["demo"]
    elif args_list and args_list[0] not in COMMANDS and not args_list[0].startswith("-"):
        args_list.insert(0, "open")
    parser = build_parser()
    args = parser.parse_args(args_list)
    try:
        return _run(args)
    except EditError as exc:
        print(f"ckpt-tui: {exc}", file=sys.stderr)
        return 1
    except CkptError as exc:
        print(f"ckpt-tui: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ckpt-tui: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def _run(args: argparse.Namespace) -> int:
    if args.command == "info":
        return cmd_info(args.file, args.json, args.depth)
    if args.command == "check" and (args.against or args.model):
        return cmd_compare(args.file, args.against, args.model, args.at, args.json)
    if args.command == "check":
        return cmd_check(args.file, args.json)
    if args.command == "diff":
        return cmd_diff(args.a, args.b, args.strip_prefix, args.json)
    if args.command == "convert":
        return cmd_convert(args)
    if args.command == "open":
        return cmd_open(args.file, args.readonly)
    return cmd_demo(getattr(args, "print_only", False), getattr(args, "readonly", False))


def open_for_command(path: str) -> Any:
    """Read a checkpoint for a headless command, then freeze it out of the GC's reach (it lives until exit)."""
    from ckpt_tui.core import process
    from ckpt_tui.core.reading import open_checkpoint

    checkpoint = open_checkpoint(path)
    process.freeze_gc()
    return checkpoint


def cmd_info(path: str, as_json: bool, depth: int) -> int:
    """``info``: the summary, as text or JSON."""
    from ckpt_tui.core.summary import summarize

    summary = summarize(open_for_command(path))
    if as_json:
        _print_json(summary.to_json())
    else:
        from ckpt_tui.report import render_info

        print(render_info(summary, depth))
    return 0


def cmd_check(path: str, as_json: bool) -> int:
    """``check``: read every tensor's values; exit 1 on NaN/Inf, unsafe globals or broken records."""
    from ckpt_tui.core.check import check_checkpoint

    report = check_checkpoint(open_for_command(path))
    if as_json:
        _print_json(report.to_json())
    else:
        from ckpt_tui.report import render_check

        print(render_check(report))
    return 0 if report.ok else 1


def cmd_compare(path: str, against: str | None, model: str | None, at: str | None, as_json: bool) -> int:
    """``check --against/--model``: exit 0 when every key and shape fits, 1 when not."""
    from ckpt_tui.core.compare import compare, load_reference
    from ckpt_tui.core.convert import resolve_path
    from ckpt_tui.core.tree import get

    checkpoint = open_for_command(path)
    reference = load_reference(against, model)
    where = resolve_path(checkpoint.root, at) if at else ()
    report = compare(get(checkpoint.root, where), reference)
    if as_json:
        data = report.to_json()
        if report.suggestion is not None:
            data["suggestion"]["command"] = report.suggestion.command(path)
        _print_json(data)
    else:
        from ckpt_tui.report import render_compare

        print(render_compare(report, path))
    return 0 if report.ok else 1


def cmd_diff(a: str, b: str, strip_prefix: str | None, as_json: bool) -> int:
    """``diff``: exit 0 when identical, 1 when they differ."""
    from ckpt_tui.core.diff import diff

    report = diff(open_for_command(a), open_for_command(b), strip_prefix)
    if as_json:
        _print_json(report.to_json())
    else:
        from ckpt_tui.report import render_diff

        print(render_diff(report, a, b))
    return 0 if report.identical else 1


def cmd_convert(args: argparse.Namespace) -> int:
    """``convert``: apply the edits in their fixed order, then save (or print them with --dry-run)."""
    from ckpt_tui.core.convert import ConvertOptions, convert

    options = ConvertOptions(
        extract=args.extract,
        drop=args.drop,
        rename=args.rename,
        strip_prefix=args.strip_prefix,
        add_prefix=args.add_prefix,
        at=args.at,
        map_location=args.map_location,
        dtype=args.dtype,
    )
    if not args.dry_run and not args.output:
        print("ckpt-tui: convert needs -o OUT (or --dry-run)", file=sys.stderr)
        return 2
    from ckpt_tui.core import process

    with process.gc_paused():  # a short-lived command over one tree: the cyclic GC only costs time
        outcome = convert(args.file, options, args.output, args.format, force=args.force, dry_run=args.dry_run)
    for change in outcome.changes:
        print("\n".join(change.lines()))
    if not outcome.changes:
        print("no edits: the checkpoint is written as it is")
    if outcome.result is not None:
        print(outcome.result.line())
    return 0


def cmd_open(path: str, readonly: bool) -> int:
    """Open the browser (Textual is imported only here)."""
    from ckpt_tui.tui.app import CkptApp

    CkptApp(path, readonly=readonly).run()
    return 0


def cmd_demo(print_only: bool, readonly: bool = False) -> int:
    """``demo``: write the demo checkpoint, then open it (or print its info)."""
    from ckpt_tui.core.demo import write_demo

    path = write_demo()
    if print_only or not sys.stdout.isatty():
        print(f"demo checkpoint written to {path}", file=sys.stderr)
        return cmd_info(str(path), False, 2)
    return cmd_open(str(path), readonly)


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, default=str, separators=(",", ":")))
    sys.stdout.write("\n")
