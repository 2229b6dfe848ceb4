"""Entry point of the command line: parse, run the command's handler, turn errors into exit codes.

Exit codes are API: 0 clean, 1 problems found, 2 unreadable input or refused work.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from ckpt_tui.cli.parser import COMMANDS, build_parser, explain, mistyped_command, with_command
from ckpt_tui.core.errors import BadArgument, CkptError, EditError, NoSuchKey
from ckpt_tui.core.runtime.leaving import leave


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
    # (temporary files made on the way, such as a compressed DCP folder's items, go: os._exit runs no atexit)
    leave()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit code."""
    _tolerant_streams()
    given = list(sys.argv[1:] if argv is None else argv)
    mistyped = mistyped_command(given)
    if mistyped is not None:
        _error(mistyped)
        return 2
    args_list = with_command(given)
    # (a command's own arguments only: what parsing its line reads)
    parser = build_parser(args_list[0] if args_list and args_list[0] in COMMANDS else None)
    args, extras = parser.parse_known_args(args_list)
    if extras:  # said by the command's own parser: it knows the options that were meant
        command = _subparser(parser, args.command)
        print(f"{command.prog}: {explain(command, 'unrecognized arguments: ' + ' '.join(extras))}", file=sys.stderr)
        return 2
    _keys_from_argv(args)
    from ckpt_tui.core.runtime import process

    process.collect_less_often()  # the tree read stays alive until exit: no GC pass after pass over it
    process.single_threaded_blas()
    if args.command not in READ_ONLY:
        from ckpt_tui.core.writers.temp_files import remove_on_signals

        remove_on_signals()  # SIGTERM/SIGHUP remove the temporary file of a write under way (any thread's)
    try:
        return _run(args)
    except (NoSuchKey, BadArgument) as exc:  # a path not in the file, a malformed option: a bad argument
        _error(exc, args)
        return 2
    except EditError as exc:
        _error(exc, args)
        return 1
    except CkptError as exc:
        _error(exc, args)
        return 2
    except KeyboardInterrupt:
        print("ckpt-tui: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader left before the verdict was printed (`| head -1`): exit as a process SIGPIPE ends, never as
        # "identical" or "clean"; what is not yet written is dropped, not raised again at exit
        _drop_stdout()
        return SIGPIPE_EXIT


READ_ONLY = frozenset({"info", "check", "stats", "diff"})
"""Commands that write no file (nothing to remove on a signal)."""
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


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    """The parser of ``command`` (the top-level one when there is none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            found: argparse.ArgumentParser = action.choices[command]
            return found
    return parser


SIGPIPE_EXIT = 128 + 13
"""The exit status of a process the SIGPIPE signal ended (141), as the shell reports it: no verdict was given."""


def _drop_stdout() -> None:
    """Point standard output at /dev/null, so that nothing left in its buffer is written (or fails) again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        # (a stream with no descriptor, in a test: nothing to redirect)
        return


def _tolerant_streams() -> None:
    """Output whose encoding cannot write every character (``PYTHONIOENCODING=ascii``, a latin-1 locale)
    gets backslash escapes for the rest: the tree's glyphs and the file's key names never end in a traceback."""
    for stream in (sys.stdout, sys.stderr):
        encoding = str(getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "")
        reconfigure = getattr(stream, "reconfigure", None)
        if encoding in ("utf8", "utf8sig") or reconfigure is None:
            continue
        try:
            reconfigure(errors="backslashreplace")
        except (ValueError, OSError, TypeError):
            # (a stream that cannot change its error handler now: left as it is)
            continue


def _error(exc: Exception | str, args: argparse.Namespace | None = None) -> None:
    """The one-line error, with anything from the file in it escaped, and the files of ``args`` named as given."""
    from ckpt_tui.core.runtime.safe_text import printable, with_file_names

    print(f"ckpt-tui: {printable(with_file_names(str(exc), _arguments(args)))}", file=sys.stderr)


def _arguments(args: argparse.Namespace | None) -> list[str]:
    """Every text argument (the files among them)."""
    found: list[str] = []
    for value in vars(args).values() if args is not None else ():
        values = value if isinstance(value, list) else [value]
        found += (item for item in values if isinstance(item, str))
    return found


def _run(args: argparse.Namespace) -> int:
    """The command's handler, from the table."""
    from ckpt_tui.cli.commands import HANDLERS

    files = getattr(args, "file", None)
    if isinstance(files, list):  # several files open together as one checkpoint (rank files)
        args.file = files[0] if len(files) == 1 else files
    if getattr(args, "max_download", None) is not None:
        from ckpt_tui.core.model import remote

        remote.TRANSFER.limit = args.max_download
    try:
        return HANDLERS[args.command or "demo"](args)
    finally:
        _say_transferred(args)


def _say_transferred(args: argparse.Namespace) -> None:
    """The bytes fetched from remote stores against the files' sizes, last (``--json`` has them inside)."""
    from ckpt_tui.core.model.byte_source import transferred

    cost = transferred()
    if cost is None or getattr(args, "json", False) or args.command in ("open", None):
        return
    print(cost.line(), file=sys.stderr if getattr(args, "csv", False) else sys.stdout)
