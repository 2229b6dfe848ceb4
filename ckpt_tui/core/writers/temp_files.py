"""Temporary files of writes in progress, removed when the process is told to stop.

Every write goes to a hidden temporary file beside its target (see :mod:`.target`). A write
that is interrupted by an exception (SIGINT's ``KeyboardInterrupt`` included) removes its own
file. SIGTERM and SIGHUP are different: Python's default is to die at once, and a write may be
running in a worker thread (the browser saves in one), where no exception can reach it. So the
entry point calls :func:`remove_on_signals` once, from the main thread: on SIGTERM or SIGHUP the
handler removes every registered temporary file, then lets the signal do what it would have done
(the process ends, killed by that signal, as the shell expects).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
from types import FrameType

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))

# path -> None; plain dict operations are atomic under the GIL, so the handler needs no lock
# (a lock could deadlock if the signal arrived while the main thread held it)
_in_progress: dict[str, None] = {}
_installed: set[int] = set()


def register(path: str) -> None:
    """A temporary file (or folder, as a set of shards is written) now exists and must not outlive an interrupted
    write."""
    _in_progress[path] = None


def unregister(path: str) -> None:
    """The temporary file was renamed into place or removed."""
    _in_progress.pop(path, None)


def in_progress() -> list[str]:
    """The temporary files of writes under way (for tests and diagnostics)."""
    return list(_in_progress)


def remove_all() -> None:
    """Remove every registered temporary file (safe to call from a signal handler)."""
    for path in list(_in_progress):
        with contextlib.suppress(OSError):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        _in_progress.pop(path, None)


def _handle(signum: int, frame: FrameType | None) -> None:
    remove_all()
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


_previous: dict[int, signal.Handlers | object] = {}


def remove_on_signals() -> bool:
    """Install the SIGTERM/SIGHUP cleanup (main thread only; idempotent). False where it cannot be installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    for signum in STOP_SIGNALS:
        if signum in _installed:
            continue
        previous = signal.getsignal(signum)
        if previous == signal.SIG_IGN:
            continue  # e.g. under nohup: the process is not meant to stop on this signal
        _previous[signum] = previous
        signal.signal(signum, _handle)
        _installed.add(signum)
    return True
