"""A key edit the user named that matches no key: the one line that says so, with the closest prefix or
component the keys do have (``--strip-prefix 'moduel.'`` → did you mean ``'module.'``?).

An edit typed by hand that changes nothing is a typo far more often than an intent, so ``convert`` refuses
it (``auto`` edits, which look for what is there, stay quiet no-ops).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

from ckpt_tui.core.edits.tree_edits import RenameRule

CLOSE = 0.6
"""difflib's ratio a candidate must reach to be offered (as ``--drop``'s "did you mean" uses)."""
KEYS_LOOKED_AT = 100_000
"""Keys whose prefixes are candidates: an error path, but a 1M-key file should not make it slow."""


def prefixes(keys: Iterable[str], depth: int) -> list[str]:
    """Every distinct dotted prefix of the keys, up to ``depth`` components, each with its dot (in first-seen
    order, so a tie goes to the one the file has first)."""
    found: dict[str, None] = {}
    for index, key in enumerate(keys):
        if index == KEYS_LOOKED_AT:
            break
        parts = key.split(".")
        for cut in range(1, min(depth, len(parts) - 1) + 1):
            found[".".join(parts[:cut]) + "."] = None
    return list(found)


def runs(keys: Iterable[str], length: int) -> list[str]:
    """Every distinct run of ``length`` dotted components in the keys (what an infix rule can match)."""
    found: dict[str, None] = {}
    for index, key in enumerate(keys):
        if index == KEYS_LOOKED_AT:
            break
        parts = key.split(".")
        for start in range(len(parts) - length + 1):
            found[".".join(parts[start : start + length])] = None
    return list(found)


def closest(name: str, candidates: Sequence[str]) -> str:
    """`` (did you mean 'module.'?)``, or nothing when no candidate is close."""
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=CLOSE)
    return f" (did you mean {close[0]!r}?)" if close else ""


def no_prefix(option: str, prefix: str, keys: Sequence[str], where: str) -> str:
    """``--strip-prefix 'foo.': no key of the root starts with 'foo.' (did you mean …?); nothing written``."""
    meant = closest(prefix, prefixes(keys, prefix.count(".") + 1))
    return f"{option} {prefix!r}: no key of {where} starts with {prefix!r}{meant}; nothing written"


def no_rule_match(rule: RenameRule, keys: Sequence[str], where: str) -> str:
    """The same for a rename rule that moves no key (after the edits before it)."""
    if rule.anywhere:
        meant = closest(rule.old, runs(keys, rule.old.count(".") + 1))
        what = f"has the component {rule.old!r}"
    else:
        meant = closest(rule.old, prefixes(keys, rule.old.count(".") + 1))
        what = f"starts with {rule.old!r}"
    return f"{rule.option} {rule.spec!r}: no key of {where} {what}{meant}; nothing written"


def idle_rule(rules: Sequence[RenameRule], keys: Sequence[str]) -> tuple[RenameRule, list[str]] | None:
    """The first rule that moves no key when the rules apply in order (with the keys as that rule sees
    them), or None when each moves some."""
    current = list(keys)
    for rule in rules:
        renamed = [rule.apply(key) for key in current]
        if renamed == current:
            return rule, current
        current = renamed
    return None
