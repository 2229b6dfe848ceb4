"""What a process removes as it leaves (temporary files it made). The CLI leaves by ``os._exit``, which runs no
``atexit`` handler, so it calls :func:`leave` first; any other exit (the browser, tests) runs them through
``atexit``. Each runs once, in the process that registered it (a forked child, which leaves by ``os._exit``,
runs none of its parent's)."""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable

_removals: list[tuple[int, Callable[[], None]]] = []


def remove_on_leaving(removal: Callable[[], None]) -> None:
    """Run ``removal`` as this process leaves."""
    _removals.append((os.getpid(), removal))
    atexit.register(leave)


def leave() -> None:
    """Run this process's removals (each once)."""
    me = os.getpid()
    while _removals:
        owner, removal = _removals.pop()
        if owner == me:
            removal()
