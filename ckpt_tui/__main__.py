"""``python -m ckpt_tui``: the same entry point as the ``ckpt-tui`` script."""

from ckpt_tui.cli import run

run()
