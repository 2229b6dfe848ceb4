"""The argument parser of ``ckpt-tui`` and the implied command (``FILE`` opens the browser).

No heavy imports here: ``--help`` imports neither torch, numpy nor textual.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from ckpt_tui import __version__
from ckpt_tui.core.errors import EditError

COMMANDS = ("info", "check", "stats", "convert", "diff", "average", "demo", "open")
DESCRIPTION = "Open, check and fix PyTorch checkpoints without loading them or running their pickle."

COMMAND_LINES = (
    ("ckpt-tui FILE [--readonly]", "open FILE in the browser (no FILE: the demo; no terminal: print its info)"),
    ("ckpt-tui info FILE [--json]", "summary: format, tensors, dtypes, devices, findings (with the fix), tree"),
    ("ckpt-tui check FILE [--json]", "read every tensor: NaN/Inf, unsafe globals, missing records"),
    (
        "ckpt-tui check FILE --against REF | --model PKG.MOD:FACTORY [--at PATH] [--json]",
        "does it fit the model? missing/unexpected/mismatched keys, and the fix",
    ),
    (
        "ckpt-tui stats FILE [--at PATH] [--json | --csv] [--sort COLUMN]",
        "per tensor: min, max, mean, std, L2 norm, max |x|, zeros, NaN/Inf counts",
    ),
    (
        "ckpt-tui diff A B [--at-a PATH] [--at-b PATH] [--strip-prefix[-a|-b] P] [--json]",
        "keys on one side only, shape/dtype changes, value differences",
    ),
    (
        "ckpt-tui diff A B [C ...] --stats [--json]",
        "per layer: relative change, cosine, norms (3+ files: norms across the series)",
    ),
    (
        "ckpt-tui average A B [C ...] -o OUT [--weights W1,W2,...] [--at PATH]",
        "weighted mean of the floating-point tensors (model soup, SWA), streamed",
    ),
    (
        "ckpt-tui convert FILE -o OUT",
        "fix and save; edits apply in this order: --extract, --drop, --drop-keys, --rename, --strip-prefix, "
        "--rename-prefix/--rename-infix/--rename-map, --add-prefix, --map-location, --dtype; "
        "--sanitize rewrites what torch.load(weights_only=True) refuses",
    ),
    ("ckpt-tui demo", "write a DDP-style training checkpoint and open it"),
)
"""What ``--help`` lists after the options: each command's form and what it does (wrapped when printed)."""

EXIT_CODES = (
    "0 ok (check: fits / clean; diff, diff --stats: identical), 1 problems found / does not fit / different / "
    "an edit does not apply, 2 unreadable input, bad arguments or refused write"
)


def epilog(width: int) -> str:
    """The commands and exit codes after ``--help``'s options, wrapped to ``width`` columns between words."""
    import textwrap

    # the meanings start in one column when the terminal leaves them room, else under their form
    column = 32 if width >= 72 else 6
    lines = ["commands:"]
    for form, meaning in COMMAND_LINES:
        wrap = textwrap.TextWrapper(
            width=width, break_long_words=False, break_on_hyphens=False, subsequent_indent=" " * column
        )
        if len(form) + 2 < column - 1:
            lines += wrap.wrap(f"  {form}".ljust(column) + meaning)
            continue
        lines += textwrap.wrap(
            form, width, initial_indent="  ", subsequent_indent="      ", break_long_words=False, break_on_hyphens=False
        )
        lines += wrap.wrap(" " * column + meaning)
    lines.append("")
    lines += textwrap.wrap(
        "exit codes: " + EXIT_CODES, width, subsequent_indent=" " * 12, break_long_words=False, break_on_hyphens=False
    )
    return "\n".join(lines) + "\n"


USAGE = {
    "info": "ckpt-tui info FILE [--json] [--depth N]",
    "check": "ckpt-tui check FILE [--against REF | --model PKG.MOD:FACTORY] [--at PATH] [--json]",
    "stats": "ckpt-tui stats FILE [--at PATH] [--json | --csv] [--sort COLUMN]",
    "diff": "ckpt-tui diff A B [C ...] [--stats] [--json]",
    "average": "ckpt-tui average A B [C ...] -o OUT [--weights W1,W2,...]",
    "convert": "ckpt-tui convert FILE -o OUT [--extract PATH|auto] [--strip-prefix P|auto] [--drop PATH] ...",
    "demo": "ckpt-tui demo [--print] [--readonly]",
    "open": "ckpt-tui FILE [--readonly]",
}
"""One line of each command's form, said after an argument error (in place of argparse's usage dump)."""


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line that says the way forward: what is missing and the command's
    form, the option meant by a mistyped one; never a usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {explain(self, message)}\n")

    def format_help(self) -> str:
        if self.epilog is not None:
            import textwrap

            # the raw parts wrapped as argparse wraps its own text: at the terminal's width, between words
            width = terminal_columns() - 2
            self.epilog = epilog(width)
            self.description = textwrap.fill(DESCRIPTION, width)
        return super().format_help()

    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse makes a formatter for every argument added (to check its metavar), and each one imports
        # shutil for the terminal's width: the same width, found without shutil's import (a command's start)
        return self.formatter_class(prog=self.prog, width=terminal_columns() - 2)  # type: ignore[call-arg]


def terminal_columns() -> int:
    """``shutil.get_terminal_size().columns``, as argparse asks it: ``COLUMNS``, else the terminal, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
        columns = columns or 80
    return columns


def explain(parser: argparse.ArgumentParser, message: str) -> str:
    """argparse's message, said for a user: missing arguments by name with the command's form, the option
    meant by a mistyped one."""
    command = parser.prog.removeprefix("ckpt-tui").strip()
    required = re.fullmatch(r"the following arguments are required: (.*)", message)
    if required:
        names = [_argument_name(parser, name) for name in required.group(1).split(", ")]
        form = f" (usage: {USAGE[command]})" if command in USAGE else ""
        return f"missing {' and '.join(names)}{form}"
    unknown = re.fullmatch(r"unrecognized arguments: (.*)", message)
    if unknown:
        return unrecognized(parser, unknown.group(1).split())
    return message.removeprefix("argument ")


def _argument_name(parser: argparse.ArgumentParser, name: str) -> str:
    """``B``, ``FILE`` or ``-o OUTPUT``: an argument as its usage writes it."""
    for action in parser._actions:
        if name in ("/".join(action.option_strings), action.metavar, action.dest):
            metavar = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
            return f"{action.option_strings[0]} {metavar}" if action.option_strings else metavar
    return name


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every option the parser takes (``--json``, ``-o``, ...)."""
    return [option for action in parser._actions for option in action.option_strings]


def unrecognized(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """What was not understood, with the option meant when one is close to it."""
    first = extras[0]
    if not first.startswith("-"):
        return f"unexpected argument {first!r} ({parser.prog} --help lists what it takes)"
    name = first.split("=", 1)[0]
    import difflib

    close = difflib.get_close_matches(name, option_strings(parser), n=1, cutoff=0.6)
    if close:
        return f"no option {name}; did you mean {close[0]}?"
    return f"no option {name} ({parser.prog} --help lists every option)"


def mistyped_command(args_list: list[str]) -> str | None:
    """``ckpt-tui inof x.pth``: a first word that is no file and is close to a command, as the line meant."""
    if not args_list or args_list[0] in COMMANDS or args_list[0].startswith("-"):
        return None
    word = args_list[0]
    if "/" in word or os.path.lexists(word):
        return None  # a path (or a URL): the browser opens it, or says why not
    import difflib

    close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.6)
    if not close:
        return None
    meant = " ".join(["ckpt-tui", close[0], *args_list[1:]])
    return f"{word}: no such command or file; did you mean: {meant}"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser (no heavy imports); ``command``: the one command whose arguments are added.

    Parsing a command's line reads that command's subparser only: a command starts without building the
    others (the list of commands, each one's help and every message are the same; ``--help`` builds all).
    """
    parser = Parser(
        prog="ckpt-tui",
        description=DESCRIPTION,
        epilog="",  # (written when help is printed, wrapped to the terminal: Parser.format_help)
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"ckpt-tui {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.add_parser("info", help="print a summary of a checkpoint")
    sub.add_parser(
        "check",
        help="read every tensor and report NaN/Inf and unsafe content, or compare with a model",
        description="Without --against/--model: read every tensor (NaN/Inf, unsafe globals, broken records). "
        "With them: compare keys and shapes with a reference and suggest the fix. --model imports and runs "
        "YOUR code (package.module:callable returning an nn.Module or a state_dict); nothing else ever does.",
    )
    sub.add_parser(
        "stats",
        help="read every tensor: min, max, mean, std, L2 norm, max |x|, zeros, NaN and Inf, one row each",
        description="Statistics of the finite values of every tensor (NaN and Inf counted apart), in float64, "
        "streamed in bounded memory; each view of the same bytes is read once. --sort: path and dtype A-Z, "
        "every other column largest first. Tensors whose values are not read (sparse, quantized, meta, a "
        "missing record) get a row with no statistics and a reason.",
    )
    sub.add_parser("diff", help="compare two checkpoints key by key and value by value")
    sub.add_parser(
        "average",
        help="average checkpoints (model soup, SWA): streamed, atomic and verified",
        description="Writes the first file with every floating-point tensor replaced by the weighted mean of that "
        "tensor in every file (float64, rounded once to the first file's dtype). Weights are divided by their "
        "sum. Integer, bool and other tensors, and every non-tensor value, come from the first file.",
    )
    sub.add_parser(
        "convert",
        help="edit and save a checkpoint (.pth or .safetensors), streaming, atomic and verified",
        description="Edits apply in this order: extract, drop, drop-keys, rename, strip prefix, rename rules "
        "(--rename-prefix/--rename-infix in the order given, then --rename-map), add prefix, map devices, cast. "
        "Key paths use / between levels (--extract model, --drop optimizer), or the Python form messages print "
        "(--drop 'ckpt[\"payload\"]'). auto edits with nothing to do "
        "are a no-op with a note, so one command runs over a batch of files; so are --map-location and --dtype "
        "when the tensors already are so. A key edit named by hand (--strip-prefix P, --rename, --rename-prefix, "
        "--rename-infix, --rename-map, --drop-keys) that matches no key is a typo: refused in one line, exit 2, "
        "nothing written.",
    )
    sub.add_parser("demo", help="write the demo checkpoint and open it")
    sub.add_parser("open", help="open a checkpoint in the browser (the default command)")
    for name, subparser in sub.choices.items():
        if command is None or name == command:
            ARGUMENTS[name](subparser)
    return parser


def _info_arguments(info: argparse.ArgumentParser) -> None:
    info.add_argument("file", nargs="+", help="a checkpoint, or several rank files opened as one")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.add_argument("--depth", type=int, default=2, help="levels of the tree to print (default 2)")
    _max_download(info)


def _check_arguments(check: argparse.ArgumentParser) -> None:
    check.add_argument("file", nargs="+", help="a checkpoint, or several rank files opened as one")
    check.add_argument("--json", action="store_true", help="print one JSON object")
    reference = check.add_mutually_exclusive_group()
    reference.add_argument("--against", metavar="REF", help="another checkpoint, or a text file of keys [shapes]")
    reference.add_argument("--model", metavar="IMPORT:CALLABLE", help="build the reference by calling your code")
    check.add_argument("--at", metavar="PATH", help="compare this subtree of FILE (default: the whole file)")
    _max_download(check)


def _stats_arguments(stats: argparse.ArgumentParser) -> None:
    stats.add_argument("file", nargs="+", help="a checkpoint, or several rank files opened as one")
    stats.add_argument("--at", metavar="PATH", help="only this subtree (e.g. model)")
    stats_format = stats.add_mutually_exclusive_group()
    stats_format.add_argument("--json", action="store_true", help='print {"tensors": [...]}')
    stats_format.add_argument("--csv", action="store_true", help="print CSV with a header line")
    stats.add_argument(
        "--sort", metavar="COLUMN", type=_stats_column, help="sort by a column (" + ", ".join(_COLUMNS) + ")"
    )
    _max_download(stats)


def _diff_arguments(diff_: argparse.ArgumentParser) -> None:
    diff_.add_argument("a")
    diff_.add_argument("b")
    # default=[]: argparse calls a "*" positional without a default required, and names it when B is missing
    diff_.add_argument(
        "more", nargs="*", default=[], metavar="C", help="more rank files: an N-way summary of what agrees"
    )
    diff_.add_argument("--strip-prefix", metavar="P", help="remove this key prefix on both sides first")
    diff_.add_argument("--at-a", metavar="PATH", help="compare this subtree of A (e.g. model)")
    diff_.add_argument("--at-b", metavar="PATH", help="compare this subtree of B")
    diff_.add_argument("--strip-prefix-a", metavar="P", help="remove this key prefix from A's state_dict")
    diff_.add_argument("--strip-prefix-b", metavar="P", help="remove this key prefix from B's state_dict")
    diff_.add_argument(
        "--stats",
        action="store_true",
        help="per layer: relative change |a-b|/|a|, cosine, norms, with a plot (3+ files: norms across them); "
        "exits as diff does: 0 when no layer moved, 1 when a layer or key differs",
    )
    diff_.add_argument("--json", action="store_true", help="print one JSON object")
    _max_download(diff_)


def _average_arguments(average: argparse.ArgumentParser) -> None:
    average.add_argument("files", nargs="+", metavar="FILE", help="two or more checkpoints with the same keys")
    average.add_argument("-o", "--output", required=True, type=_local_output, help="the file to write")
    average.add_argument("--weights", metavar="W1,W2,...", help="one number per file (default: equal)")
    average.add_argument("--at", metavar="PATH", help="average and write only this subtree (e.g. state_dict)")
    average.add_argument("--format", choices=["pth", "safetensors"], help="output format (default: from -o's suffix)")
    average.add_argument("--force", action="store_true", help="replace an existing output")
    _max_download(average)
    average.add_argument(
        "--allow-nan",
        action="store_true",
        help="write the average even where an input holds NaN or Inf (the average holds them too)",
    )


def _convert_arguments(convert: argparse.ArgumentParser) -> None:
    convert.add_argument("file", nargs="+", help="a checkpoint, or several rank files opened as one")
    convert.add_argument("-o", "--output", type=_local_output, help="the file to write (required unless --dry-run)")
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
    _max_download(convert)


def _demo_arguments(demo: argparse.ArgumentParser) -> None:
    demo.add_argument("--print", dest="print_only", action="store_true", help="print its info instead of opening it")
    demo.add_argument("--readonly", action="store_true", help="browse only: no edits, no saving")


def _open_arguments(open_: argparse.ArgumentParser) -> None:
    open_.add_argument("file", nargs="+", help="a checkpoint, or several rank files opened as one")
    open_.add_argument("--readonly", action="store_true", help="browse only: no edits, no saving")
    _max_download(open_)


def _max_download(remote_reading: argparse.ArgumentParser) -> None:
    remote_reading.add_argument(
        "--max-download",
        metavar="SIZE",
        type=_size,
        help="most bytes fetched from a remote store (hf://, s3://, https://...) for values (default 1G)",
    )


ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "info": _info_arguments,
    "check": _check_arguments,
    "stats": _stats_arguments,
    "diff": _diff_arguments,
    "average": _average_arguments,
    "convert": _convert_arguments,
    "demo": _demo_arguments,
    "open": _open_arguments,
}
"""Each command's arguments, added to its subparser (in :data:`COMMANDS`' order)."""


_COLUMNS = ("path", "shape", "dtype", "numel", "min", "max", "mean", "std", "norm", "absmax", "zeros", "nan", "inf")
"""The columns of ``stats`` (as ``tensor_table.COLUMNS``, without importing numpy for --help)."""


def _size(text: str) -> int:
    from ckpt_tui.core.model.remote import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _local_output(text: str) -> str:
    """An output path: a URL is refused, never taken for a local folder named ``s3:``."""
    from ckpt_tui.core.model.byte_source import is_remote

    if is_remote(text):
        raise argparse.ArgumentTypeError(
            f"takes a local path, not {text.split('://', 1)[0]}://...: remote stores are read-only here "
            "(write a local file, then upload it)"
        )
    return text


def _stats_column(text: str) -> str:
    if text not in _COLUMNS:
        import difflib

        close = difflib.get_close_matches(text, _COLUMNS, n=1)
        meant = f" (did you mean {close[0]}?)" if close else ""
        raise argparse.ArgumentTypeError(f"unknown column {text!r}{meant}; one of {', '.join(_COLUMNS)}")
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
