"""Process-wide switches, changed in one place: the cyclic garbage collector and the heap cap.

Library code asks for them only for the duration of a ``with`` block (:func:`gc_paused`,
:func:`heap_cap`); both are counted and locked, so two worker threads reading files at once
never undo each other's switch. Freezing the objects alive after a load (:func:`freeze_gc`) is
the entry point's choice (the CLI and the TUI call it); no library function does it for them.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
from collections.abc import Iterator

try:
    import resource
except ImportError:  # not on Windows: the heap cap is skipped there
    resource = None  # type: ignore[assignment]

HEADROOM = 1 << 30
GROWTH_PER_BYTE = 16

_lock = threading.Lock()
_gc_pauses = 0
_gc_was_enabled = True
_caps = 0
_saved_limit: tuple[int, int] | None = None


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic GC stays off inside the block (it dominates building trees of many objects).

    Nested and concurrent blocks are counted: the GC comes back as it was when the last one ends.
    """
    global _gc_pauses, _gc_was_enabled
    with _lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


BLAS_THREADS = ("OPENBLAS_NUM_THREADS",)
"""numpy's wheels use OpenBLAS (torch's own threads, OMP_NUM_THREADS, are left alone)."""


def single_threaded_blas() -> None:
    """Keep numpy's BLAS on the calling thread for the rest of the process (the entry point's choice).

    Dot products here are taken in segments on our own worker threads; a BLAS pool beside them only
    spins after each call, waiting for work that never comes (a tenth of a second of a core on a 2 GB
    ``check``, taken from the workers on a small machine). Only before numpy is imported, and only where
    the user has not chosen a count.
    """
    if "numpy" in sys.modules:
        return
    for name in BLAS_THREADS:
        os.environ.setdefault(name, "1")


GC_THRESHOLDS = (50_000, 20, 1000)
"""A young-generation collection every 50,000 allocations (Python's default: 700)."""


def collect_less_often() -> None:
    """Run the cyclic GC less often for the rest of the process: the entry point's choice, like
    :func:`freeze_gc`. Reading a file of 50,000 tensors and summing it up allocates hundreds of
    thousands of objects that stay alive, which the default thresholds traverse again and again
    (a third of ``info``'s time on a 50,000-key file). Cycles are still collected, and reference
    counting frees everything else at once, so memory stays bounded."""
    gc.set_threshold(*GC_THRESHOLDS)


def settle_young() -> None:
    """Collect the young generations now, from the worker thread that has just built a big result that stays
    alive (an edited tree, a summary of 50,000 tensors): its survivors reach the oldest generation, which
    no young collection traverses again. Otherwise a later young collection, triggered by whichever thread
    allocates next (often the TUI's event loop), walks them all at once. The TUI's workers call it."""
    gc.collect(1)


def freeze_gc() -> None:
    """Move every object alive now out of the GC's reach (a loaded tree is never cyclic garbage).

    Later collections, and the one at exit, then skip the tree. Call it after a load, from the CLI
    command or the TUI, never from library code.
    """
    gc.freeze()


def data_in_use() -> int | None:
    """This process's data segment (heap and anonymous mappings) in bytes, where Linux tells."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def memory_room() -> int | None:
    """Bytes this process may still map before a limit set on it (``RLIMIT_AS``, ``RLIMIT_DATA``)
    refuses more; None where no limit is set (or none can be read)."""
    if resource is None:
        return None
    rooms = []
    for limit, field in ((resource.RLIMIT_AS, "VmSize:"), (resource.RLIMIT_DATA, "VmData:")):
        soft, _ = resource.getrlimit(limit)
        used = _status_bytes(field) if soft != resource.RLIM_INFINITY else None
        if used is not None:
            rooms.append(max(0, soft - used))
    return min(rooms) if rooms else None


def _status_bytes(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` in bytes, where Linux tells."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


@contextlib.contextmanager
def heap_cap(pickle_bytes: int) -> Iterator[None]:
    """Cap the heap's growth (``RLIMIT_DATA``) while an unpickler runs on ``pickle_bytes`` of input.

    A one-byte LONG_BINPUT with a huge index makes CPython's unpickler grow its memo to that index
    (gigabytes, zeroed one by one); real pickles need a small multiple of their size. Under the cap
    such a file fails at once with MemoryError. File-backed mappings do not count against it.
    Concurrent blocks only ever raise the cap; the limit that was there before comes back when the
    last one ends.
    """
    global _caps, _saved_limit
    in_use = data_in_use() if resource is not None else None
    if in_use is None:
        yield
        return
    wanted = in_use + HEADROOM + GROWTH_PER_BYTE * pickle_bytes
    with _lock:
        entered = _raise_cap(wanted)
        if entered:
            _caps += 1
    try:
        yield
    finally:
        if entered:
            with _lock:
                _caps -= 1
                if _caps == 0 and _saved_limit is not None:
                    with contextlib.suppress(ValueError, OSError):
                        resource.setrlimit(resource.RLIMIT_DATA, _saved_limit)
                    _saved_limit = None


def _raise_cap(wanted: int) -> bool:
    """Set the data limit to ``wanted`` unless a lower one we did not set is already there (under the lock)."""
    global _saved_limit
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if _caps == 0:
        if soft != resource.RLIM_INFINITY and soft <= wanted:
            return False  # someone else's limit is stricter: keep it
        if hard != resource.RLIM_INFINITY and wanted > hard:
            return False
        try:
            resource.setrlimit(resource.RLIMIT_DATA, (wanted, hard))
        except (ValueError, OSError):
            return False
        _saved_limit = (soft, hard)
        return True
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_DATA, (wanted, hard))
    return True
