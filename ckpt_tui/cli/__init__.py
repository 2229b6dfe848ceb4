"""Command line: ``ckpt-tui FILE`` opens the browser; ``info``, ``check``, ``stats``, ``diff``, ``average``,
``convert`` and ``demo`` run headless.

:mod:`~ckpt_tui.cli.parser` builds the arguments, :mod:`~ckpt_tui.cli.commands` holds one handler per
command, :mod:`~ckpt_tui.cli.render` turns reports into text. Importing this package is light: torch, numpy
and textual are imported by the commands that need them.
"""

from ckpt_tui.cli.entry import main, run
from ckpt_tui.cli.parser import build_parser, with_command

__all__ = ["build_parser", "main", "run", "with_command"]
