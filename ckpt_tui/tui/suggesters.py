"""Completion for path prompts: the shortest name that starts with what was typed (→), and every one (tab:
their common start, then each in turn, as a shell does)."""

from __future__ import annotations

import os

from textual.suggester import Suggester

MAX_ENTRIES = 5000  # a huge folder is listed only this far


class PathSuggester(Suggester):
    """Suggests file and folder names (folders end in ``/``); accept with → or Tab. A relative path is looked up
    in ``base`` (the folder a prompt shows), else in the working directory."""

    def __init__(self, base: str = "") -> None:
        super().__init__(use_cache=False, case_sensitive=True)
        self.base = base

    async def get_suggestion(self, value: str) -> str | None:
        """The completed path, or None."""
        return complete_path(value, self.base)


def complete_path(value: str, base: str = "") -> str | None:
    """``/data/ckp`` → ``/data/ckpt/`` when that is the shortest entry of ``/data`` starting with ``ckp``."""
    names = path_candidates(value, base)
    if not names:
        return None
    start = value.rpartition(os.sep)[2]
    best = min(names, key=lambda name: (len(name), name))
    if best == start:
        return None
    return value[: len(value) - len(start)] + best


def path_candidates(value: str, base: str = "") -> list[str]:
    """The names in ``value``'s folder that start with its last part (folders ending in ``/``), sorted."""
    if not value:
        return []
    folder, _, start = value.rpartition(os.sep)
    listed = os.path.expanduser(folder + os.sep if folder or value.startswith(os.sep) else ".")
    if base and not os.path.isabs(listed):
        listed = os.path.join(base, listed)
    names = []
    try:
        with os.scandir(listed) as entries:
            for index, entry in enumerate(entries):
                if index >= MAX_ENTRIES:
                    break
                if entry.name.startswith(start) and (start.startswith(".") or not entry.name.startswith(".")):
                    names.append(entry.name + (os.sep if _is_dir(entry) else ""))
    except OSError:
        return []
    return sorted(names)


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False
