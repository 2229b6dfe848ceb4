"""The terminal put back as it was when a stop signal ends the browser.

``q`` quits through Textual, which leaves the alternate screen, shows the cursor, stops mouse reporting and
restores the terminal's mode. SIGTERM and SIGHUP end the process without that (Python's default, or the write
cleanup's handler, which removes a temporary file and then dies by the signal): the shell was left in raw mode
on the alternate screen, reporting every mouse move. :func:`restored_on_signals` runs the browser with handlers
that put the terminal back first, then hand the signal on to whatever handled it before.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from ckpt_tui.core.writers.temp_files import STOP_SIGNALS

LEAVE = (
    "\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1006l\x1b[?1015l"  # mouse reporting off (every mode Textual turns on)
    "\x1b[?2004l"  # bracketed paste off
    "\x1b[?25h"  # cursor shown
    "\x1b[?1049l"  # back to the main screen
)
"""What a terminal needs to be as the shell left it, but its mode."""


def _restore(fd: int, mode: list[Any] | None) -> None:
    """Write :data:`LEAVE` and restore the terminal's mode (a hung-up terminal takes neither: no matter)."""
    with contextlib.suppress(OSError):
        os.write(fd, LEAVE.encode())
    if mode is not None:
        import termios

        with contextlib.suppress(OSError, termios.error):
            termios.tcsetattr(fd, termios.TCSANOW, mode)


@contextlib.contextmanager
def restored_on_signals() -> Iterator[None]:
    """Inside: SIGTERM and SIGHUP put the terminal back, then go on as they would have (main thread only)."""
    if threading.current_thread() is not threading.main_thread() or not sys.stdout.isatty():
        yield
        return
    fd = sys.stdout.fileno()
    try:
        import termios

        mode: list[Any] | None = termios.tcgetattr(sys.stdin.fileno())
    except (ImportError, OSError, ValueError):
        mode = None
    previous: dict[int, Any] = {}

    def handle(signum: int, frame: FrameType | None) -> None:
        _restore(fd, mode)
        prior = previous.get(signum, signal.SIG_DFL)
        signal.signal(signum, prior if prior is not None else signal.SIG_DFL)
        if callable(prior):
            prior(signum, frame)
        else:
            os.kill(os.getpid(), signum)

    for signum in STOP_SIGNALS:
        prior = signal.getsignal(signum)
        if prior == signal.SIG_IGN:
            continue  # (under nohup: not meant to stop on it)
        previous[signum] = prior
        signal.signal(signum, handle)
    try:
        yield
    finally:
        for signum, prior in previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signum, prior if prior is not None else signal.SIG_DFL)


def run(app: Any) -> None:
    """``app.run()`` with the terminal put back if a stop signal ends it."""
    with restored_on_signals():
        app.run()
