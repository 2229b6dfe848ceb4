"""What ``torch.load(weights_only=True)`` will make of a ``.pth`` the writer writes: one meaning, one place.

The save path judges the data.pkl it has just written (:func:`judge_emitted`), and the browser judges its
staged tree the same way before anything is written (:func:`judge_tree`): the tree is emitted as the writer
emits it, and that pickle goes through the emulation a file's data.pkl gets
(:func:`~ckpt_tui.core.weights_only.verdict.scan_written`). Nothing is imported or run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ckpt_tui.core.errors import Cancelled, WriteError
from ckpt_tui.core.model.tree import Checkpoint
from ckpt_tui.core.runtime import forked
from ckpt_tui.core.weights_only.verdict import FileScan, Verdict, scan_written, verdict_from_scan
from ckpt_tui.core.writers.pickle_emitter import PickleWriter
from ckpt_tui.core.writers.pth import Emitted, emit


@dataclass
class Outlook:
    """What saving a tree as ``.pth`` gives: the writer's refusal, if it refuses, and the verdict of the pickle
    it writes (of the pickle it would write, code included, where it refuses over code)."""

    verdict: Verdict | None
    refusal: str | None = None
    """Why the writer will not write it (one line); None where it writes it."""


def judge_emitted(emitted: Emitted, root: Any) -> Verdict:
    """The verdict of ``emitted`` (``root``'s data.pkl, records numbered as the writer numbers them);
    ``root`` places each blocker in the tree."""
    sizes = {str(index): storage.nbytes for index, storage in enumerate(emitted.storages)}
    return verdict_from_scan(scan_written(emitted.data_pkl, sizes), _written(root))


class JudgeBeside:
    """:func:`judge_emitted` of a pickle about to be written, scanned in a forked child while the caller
    writes it (where no child can run, as the TUI's workers cannot fork: scanned when asked)."""

    def __init__(self, emitted: Emitted, root: Any) -> None:
        self.emitted = emitted
        self.root = root
        sizes = {str(index): storage.nbytes for index, storage in enumerate(emitted.storages)}
        self.child = forked.fork(lambda: scan_written(emitted.data_pkl, sizes).to_wire())

    def verdict(self) -> Verdict:
        """The verdict (the child's scan, or one made here); "cannot tell" where judging fails (the file written
        is no less what was meant: its verification is :mod:`.verify`'s)."""
        wire = self.child.result() if self.child is not None else None
        self.child = None
        try:
            scan = FileScan.from_wire(wire) if wire is not None else None
        except (KeyError, TypeError, ValueError, AttributeError):
            scan = None
        try:
            if scan is None:
                return judge_emitted(self.emitted, self.root)
            return verdict_from_scan(scan, _written(self.root))
        except Exception as exc:  # never a failed save over its verdict
            failed = FileScan("zip")
            failed.doubt(f"the written data.pkl could not be judged ({type(exc).__name__})")
            return verdict_from_scan(failed, None)


def _written(root: Any) -> Checkpoint:
    """A checkpoint of ``root`` as the writer writes it: what the reader flagged about the file read (its
    loader problems, code it runs) is not written."""
    return Checkpoint("", "zip", root, 0)


def judge_tree(root: Any, cancelled: Callable[[], bool] | None = None) -> Outlook:
    """What ``torch.load(weights_only=True)`` makes of ``root`` saved as ``.pth``, before it is saved.

    ``cancelled`` is asked every batch of entries written and between the steps: True raises
    :class:`~ckpt_tui.core.errors.Cancelled` (a newer tree is to be judged instead)."""
    stop = cancelled or _never
    try:
        emitted = emit(root, stop)
    except WriteError as exc:
        refusal = str(exc)
    else:
        _stop_if(stop)
        return Outlook(judge_emitted(emitted, root))
    # the writer refuses it (code, or a framework's object): judge the pickle it would be, written as it is
    writer = PickleWriter(judging=True, cancelled=stop)
    try:
        data = writer.dump(root)
    except WriteError:
        return Outlook(None, refusal)
    _stop_if(stop)
    return Outlook(judge_emitted(Emitted(data, writer.storages, writer.tensors), root), refusal)


def _never() -> bool:
    return False


def _stop_if(cancelled: Callable[[], bool]) -> None:
    """Raise :class:`~ckpt_tui.core.errors.Cancelled` before the scan where the judge is no longer wanted."""
    if cancelled():
        raise Cancelled("cancelled: the staged tree was not judged")
