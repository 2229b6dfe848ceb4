"""The diff report (``D``): the staged tree (with its pending edits) against another file, as ``diff``
reports it. When the keys match only under a subtree or with a wrapper prefix stripped, core says so
and ``a`` compares that way; ``s`` asks for the per-layer change, with the keys taken the way they match;
``w`` swaps the sides (the other file as A)."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from rich.text import Text

from ckpt_tui.core.model.keypath import KeyPath
from ckpt_tui.core.model.tree import Checkpoint
from ckpt_tui.tui.screens.report import Job, MeasureLayers, ReportScreen, row_width

if TYPE_CHECKING:
    from ckpt_tui.core.operations.diff import Alignment, Side
    from ckpt_tui.core.operations.reports import Report as Described


def side_name(name: str, side: Side | None) -> str:
    """A file's name, with how its keys were taken (``a.pth (under ckpt["model"] with 'module.' stripped)``)."""
    words = side.words() if side is not None else ""
    return f"{name} ({words})" if words else name


def taken_sides(
    mine: Checkpoint, other: str, alignment: Alignment | None, swapped: bool = False
) -> tuple[Checkpoint, Checkpoint]:
    """The staged tree and the file ``other``, read, both taken as ``alignment`` takes them (in a worker); the
    other file first when ``swapped``."""
    from ckpt_tui.core.readers.open import open_checkpoint

    theirs = open_checkpoint(other)
    if alignment is not None:
        a, b = alignment.apply(mine.root, theirs.root)
        mine, theirs = dataclasses.replace(mine, root=a), dataclasses.replace(theirs, root=b)
    return (theirs, mine) if swapped else (mine, theirs)


def turned(alignment: Alignment) -> Alignment:
    """``alignment`` with its sides the other way round."""
    return dataclasses.replace(alignment, a=alignment.b, b=alignment.a)


class PairReportScreen(ReportScreen):
    """A report on the staged tree against another file (diff, per-layer change): both sides taken as
    ``alignment`` takes them, rows jumping to keys of the staged tree; ``a`` compares the way core
    found the keys match."""

    def __init__(
        self,
        mine: Checkpoint,
        other: str,
        display_name: str,
        alignment: Alignment | None = None,
        swapped: bool = False,
    ) -> None:
        self.mine = mine
        self.other = other
        self.display_name = display_name
        self.alignment = alignment
        """How the keys are taken, A as the staged tree (whichever side is shown first)."""
        self.swapped = swapped
        """The other file as A (the changes relative to it), the staged tree as B."""
        self._paths: dict[str, KeyPath] | None = None
        super().__init__(self.heading(), self.doing())

    def heading(self) -> str:
        """The title while working."""
        raise NotImplementedError

    def doing(self) -> str:
        """The working line."""
        raise NotImplementedError

    def names(self) -> tuple[str, str]:
        """A's and B's names, with how their keys are taken."""
        a = self.alignment.a if self.alignment is not None else None
        b = self.alignment.b if self.alignment is not None else None
        names = side_name(self.display_name, a), side_name(os.path.basename(self.other), b)
        return (names[1], names[0]) if self.swapped else names

    def files(self) -> tuple[str, str]:
        """A's and B's names as the counts say them (the files alone)."""
        names = self.display_name, os.path.basename(self.other)
        return (names[1], names[0]) if self.swapped else names

    def realign_offered(self) -> Alignment | None:
        """The way core found the keys match, when not yet compared that way (the staged tree's side as A)."""
        realign = getattr(self.report, "alignment", None)
        if self.alignment is not None or realign is None:
            return None
        return turned(realign) if self.swapped else realign

    def hints(self) -> list[str]:
        return (["a: compare that way"] if self.realign_offered() is not None else []) + ["w: swap sides"]

    def action_swap(self) -> None:
        if self.not_yet():
            return
        self.swapped, self._paths = not self.swapped, None
        self.title_text, self.working = self.heading(), self.doing()
        self.start()

    def offers(self, described: Described) -> Text:
        """The one key that compares the way the keys match (the staged tree, as diffed), when they do."""
        if self.realign_offered() is None:
            return Text()
        return Text("\na compares that way here (the staged tree, with its edits)", style="bold")

    def path_of(self, target: Any) -> KeyPath | None:
        """A row's key (a key of A as compared) as a path of the staged tree."""
        from ckpt_tui.core.operations.diff import key_paths

        if not isinstance(target, str):
            return None
        # swapped, a row's key is the other file's, as compared: the staged tree's key of that name
        if self._paths is None:
            taken = self.alignment.a.take(self.mine.root) if self.alignment is not None else self.mine.root
            self._paths = key_paths(taken)
        path = self._paths.get(target)
        if path is None or self.alignment is None:
            return path
        return self.alignment.a.source_path(self.mine.root, path)

    def action_realign(self) -> None:
        if self.not_yet():
            return
        realign = self.realign_offered()
        if realign is None:
            super().action_realign()
            return
        self.alignment, self._paths = realign, None
        self.title_text, self.working = self.heading(), self.doing()
        self.start()


class DiffScreen(PairReportScreen):
    """Diff the staged tree with ``other``; dismissed with a jump, a request for the per-layer change, or None."""

    TASK = "diff"

    def heading(self) -> str:
        a, b = self.names()
        return f"Diff {a} with {b}"

    def doing(self) -> str:
        return f"diffing with {os.path.basename(self.other)}"

    def job(self) -> Job:
        mine, other, alignment, swapped = self.mine, self.other, self.alignment, self.swapped

        def run(progress: Any, cancelled: Any) -> Any:
            from ckpt_tui.core.operations.diff import diff

            a, b = taken_sides(mine, other, alignment, swapped)
            return diff(a, b, progress=progress)

        return run

    def described(self, report: Any) -> Described:
        from ckpt_tui.core.operations.reports import describe_diff

        # the title names how each side's keys are taken; the counts name the files alone
        a, b = self.files()
        return describe_diff(report, a, b, width=row_width(self.app.size.width))

    def hints(self) -> list[str]:
        return [*super().hints(), "s: per-layer change"]

    def action_layer_change(self) -> None:
        if self.not_yet():
            return
        # where the keys match only another way, as they are they pair up little but the optimizer state:
        # the layers are measured the way they match (the title says so)
        self.dismiss(MeasureLayers(self.other, self.alignment or self.realign_offered(), self.swapped))
