"""Work run in a forked child process beside the main one: the CLI's second core.

Reading a file and judging it the way ``torch.load`` would are two passes of Python over the same
pickle; the GIL keeps threads from running them at once, a forked child does not. The child runs
one function and writes its result back as JSON over a pipe (the parent unpickles nothing). A fork
is made only where it is safe and pays: POSIX, a single thread (never under the TUI's workers), and
more than one usable core. Everywhere else, and whenever the child fails, the caller gets None and
does the work itself, with the same result.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
PR_SET_PDEATHSIG = 1
"""prctl(2): the signal a Linux process gets when its parent ends."""


def usable_cores() -> int:
    """Cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class Forked:
    """A function running in a child process; :meth:`result` waits for its JSON value."""

    def __init__(self, pid: int, fd: int, loads: Callable[[bytes], Any] = json.loads) -> None:
        self.pid = pid
        self.fd = fd
        self.loads = loads

    def result(self) -> Any | None:
        """The function's value, or None when the child failed (it raised, was killed, wrote garbage)."""
        chunks: list[bytes] = []
        try:
            while chunk := os.read(self.fd, 1 << 20):
                chunks.append(chunk)
        finally:
            os.close(self.fd)
            _, status = os.waitpid(self.pid, 0)
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            return None
        try:
            return self.loads(b"".join(chunks))
        except ValueError:  # (orjson's JSONDecodeError is a ValueError too)
            return None


def _die_with(parent: int) -> None:
    """Linux: the kernel kills this child when its parent ends, however it ends (SIGTERM, SIGKILL), so a
    stopped ``check`` leaves nothing reading the file. Elsewhere the child ends with its bounded work."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent ended before the line above took effect
        os._exit(1)


def fork(
    work: Callable[[], Any],
    dumps: Callable[[Any], bytes] = lambda value: json.dumps(value).encode(),
    loads: Callable[[bytes], Any] = json.loads,
) -> Forked | None:
    """Start ``work()`` (returning a JSON value) in a forked child; None where no fork is made. ``dumps`` and
    ``loads``: the JSON encoder and decoder (orjson's, for big answers)."""
    if not hasattr(os, "fork") or threading.active_count() > 1 or usable_cores() < 2:
        return None
    try:
        read, write = os.pipe()
    except OSError:  # out of file descriptors: the caller does the work itself
        return None
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:  # no fork allowed here (process limits, a sandbox)
        os.close(read)
        os.close(write)
        return None
    if pid == 0:  # the child: run, write, and leave without running the parent's exit handlers
        code = 1
        try:
            os.close(read)
            _die_with(parent)
            for name in SIGNALS:  # not the CLI's handlers (they remove the parent's temporary files)
                if hasattr(signal, name):
                    signal.signal(getattr(signal, name), signal.SIG_DFL)
            data = dumps(work())
            view = memoryview(data)
            while view:
                view = view[os.write(write, view) :]
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    return Forked(pid, read, loads)
