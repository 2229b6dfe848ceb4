"""Completion for path prompts: the rest of the first file name that starts with what was typed."""

from __future__ import annotations

import os

from textual.suggester import Suggester

MAX_ENTRIES = 5000  # a huge folder is listed only this far


class PathSuggester(Suggester):
    """Suggests file and folder names (folders end in ``/``); accept with → or Tab."""

    def __init__(self) -> None:
        super().__init__(use_cache=False, case_sensitive=True)

    async def get_suggestion(self, value: str) -> str | None:
        """The completed path, or None."""
        return complete_path(value)


def complete_path(value: str) -> str | None:
    """``/data/ckp`` → ``/data/ckpt/`` when that is the first entry of ``/data`` starting with ``ckp``."""
    if not value:
        return None
    folder, _, start = value.rpartition(os.sep)
    listed = os.path.expanduser(folder + os.sep if folder or value.startswith(os.sep) else ".")
    try:
        with os.scandir(listed) as entries:
            names = []
            for index, entry in enumerate(entries):
                if index >= MAX_ENTRIES:
                    break
                if entry.name.startswith(start) and (start.startswith(".") or not entry.name.startswith(".")):
                    names.append(entry.name + (os.sep if _is_dir(entry) else ""))
    except OSError:
        return None
    if not names:
        return None
    best = min(names, key=lambda name: (len(name), name))
    if best == start:
        return None
    return value[: len(value) - len(start)] + best


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False
