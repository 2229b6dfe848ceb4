"""How far a long task has got: one throttled report, which both faces render (the browser posts it as
a message, the command line writes it on one updating line)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProgressStep:
    """A task ``fraction`` (0..1) done: ``done`` of ``total`` units (bytes, tensors) where they are known,
    ``request`` the asker's request it is for (the detail panel's stats)."""

    task: str
    fraction: float
    done: int = 0
    total: int = 0
    request: int = 0


class ProgressThrottle:
    """A task's progress callback, called as ``(done, total)`` or through :meth:`fraction`: reports a
    :class:`ProgressStep` each time another :data:`STEP` of the work is done, and nothing once
    ``cancelled`` (at most 50 reports however often it is called)."""

    STEP = 0.02

    def __init__(
        self,
        report: Callable[[ProgressStep], object],
        task: str,
        request: int = 0,
        cancelled: Callable[[], bool] | None = None,
    ) -> None:
        self.report, self.task, self.request, self.cancelled = report, task, request, cancelled
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        self.fraction(done / total if total else 1.0, done, total)

    def fraction(self, fraction: float, done: int = 0, total: int = 0) -> None:
        """Report ``fraction`` when it is :data:`STEP` past the last one reported."""
        if fraction - self.last < self.STEP or (self.cancelled is not None and self.cancelled()):
            return
        self.last = fraction
        self.report(ProgressStep(self.task, fraction, done, total, self.request))
