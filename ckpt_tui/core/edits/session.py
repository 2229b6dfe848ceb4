"""An editing session: the current tree, staged edits with undo/redo, nothing on disk until saved."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ckpt_tui.core.edits.tree_edits import Change
from ckpt_tui.core.model.tree import Checkpoint

Edit = Callable[[Any], tuple[Any, Change]]

_versions = itertools.count(1)


@dataclass
class Session:
    """A checkpoint and the versions of its tree produced by edits (index 0 is the file as read).

    ``version`` names the current tree: it changes with every apply, undo and redo, and no two
    sessions share one, so a result computed for an older tree can be told apart and dropped.
    """

    checkpoint: Checkpoint
    versions: list[tuple[Any, Change | None]] = field(default_factory=list, repr=False)
    position: int = 0
    saved_position: int = 0
    version: int = field(default_factory=lambda: next(_versions))

    def __post_init__(self) -> None:
        if not self.versions:
            self.versions = [(self.checkpoint.root, None)]

    @property
    def root(self) -> Any:
        """The tree as edited so far."""
        return self.versions[self.position][0]

    @property
    def unsaved(self) -> int:
        """How many edits differ from what was last saved (or read)."""
        return abs(self.position - self.saved_position)

    @property
    def edited(self) -> bool:
        """Whether the current tree differs from the file as it was read."""
        return self.position != 0

    @property
    def can_undo(self) -> bool:
        """Whether there is an edit to undo."""
        return self.position > 0

    @property
    def can_redo(self) -> bool:
        """Whether there is an undone edit to redo."""
        return self.position + 1 < len(self.versions)

    def preview(self, edit: Edit) -> tuple[Any, Change]:
        """What ``edit`` would give, without applying it (raises EditError if it does not apply)."""
        return edit(self.root)

    def apply(self, new_root: Any, change: Change) -> None:
        """Make a previewed result the current tree (drops any redo history)."""
        del self.versions[self.position + 1 :]
        self.versions.append((new_root, change))
        self.position += 1
        if self.saved_position > self.position - 1:
            self.saved_position = -1
        self.version = next(_versions)

    def undo(self) -> Change | None:
        """Step back one edit; returns the edit undone."""
        if self.position == 0:
            return None
        change = self.versions[self.position][1]
        self.position -= 1
        self.version = next(_versions)
        return change

    def redo(self) -> Change | None:
        """Step forward one edit; returns the edit redone."""
        if self.position + 1 >= len(self.versions):
            return None
        self.position += 1
        self.version = next(_versions)
        return self.versions[self.position][1]

    def mark_saved(self) -> None:
        """The current tree is now on disk."""
        self.saved_position = self.position
