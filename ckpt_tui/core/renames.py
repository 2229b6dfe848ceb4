"""Renamed modules: pair a checkpoint's keys with a reference's by structure, then find the few
substitution rules that turn one set of names into the other.

Pairing: the keys left over on each side (in the checkpoint, not the reference; and the reverse)
are aligned in module order by tensor shape, the longest common subsequence of the two shape
sequences (a renamed model keeps its architecture, so its shapes come in the same order).

Rules: starting from the pairs, each round looks at the first place where each pair's dotted
components still differ and proposes rules that would fix it, from the most general (a component
renamed anywhere: ``attn`` → ``attention``) to the most specific (one module's prefix). The rule
that brings the most keys closest to their partner, without moving a key away from its partner,
without touching keys that already match and without making two keys collide, is kept. Rounds
stop when every pair matches or no rule helps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from difflib import SequenceMatcher

from ckpt_tui.core.edits import RenameRule
from ckpt_tui.core.errors import EditError

MAX_KEYS = 5000
LCS_CELLS = 250_000
MAX_RULES = 64
CANDIDATES_PER_ROUND = 12
DONE = 1_000_000

Signature = tuple[int, ...] | None


def align(source: Sequence[tuple[str, Signature]], target: Sequence[tuple[str, Signature]]) -> list[tuple[str, str]]:
    """Pairs (checkpoint key, reference key) whose shapes line up in module order.

    Identical shape sequences pair position by position; small ones by their longest common
    subsequence; large ones by the k-th key of each shape on one side with the k-th on the other.
    """
    if not source or not target or len(source) > MAX_KEYS or len(target) > MAX_KEYS:
        return []
    if any(sig is None for _, sig in target) or any(sig is None for _, sig in source):
        return []
    a, b = [s for _, s in source], [s for _, s in target]
    if a == b:
        return [(x, y) for (x, _), (y, _) in zip(source, target, strict=True)]
    if len(a) * len(b) > LCS_CELLS:
        return _pair_by_shape(source, target)
    pairs: list[tuple[str, str]] = []
    for start_a, start_b, size in SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks():
        pairs += [(source[start_a + i][0], target[start_b + i][0]) for i in range(size)]
    return pairs


def _pair_by_shape(
    source: Sequence[tuple[str, Signature]], target: Sequence[tuple[str, Signature]]
) -> list[tuple[str, str]]:
    waiting: dict[Signature, list[str]] = {}
    for key, sig in reversed(target):
        waiting.setdefault(sig, []).append(key)
    pairs = []
    for key, sig in source:
        queue = waiting.get(sig)
        if queue:
            pairs.append((key, queue.pop()))
    return pairs


def infer_rules(keys: Sequence[str], pairs: Sequence[tuple[str, str]], reference: set[str]) -> list[RenameRule] | None:
    """Rules that, applied in order to every key, take the paired keys to their partners (at least
    half of them: shape alignment can pair a few keys wrongly); None when no short list of rules does
    (names that share no structure would need one rule per key)."""
    goals = dict(pairs)
    for key in keys:
        if key in reference and key not in goals:
            goals[key] = key
    current = {key: key for key in keys}
    rules: list[RenameRule] = []
    first = sum(1 for k, goal in goals.items() if k != goal)
    while True:
        pending = [(current[k], goal) for k, goal in goals.items() if current[k] != goal]
        if not pending:
            return rules
        if len(rules) == MAX_RULES:
            return None
        counts: Counter[RenameRule] = Counter()
        for old, new in pending:
            counts.update(set(candidates(old, new)))
        best: RenameRule | None = None
        best_gain = 0
        for rule, _ in counts.most_common(CANDIDATES_PER_ROUND):
            gain = _gain(rule, current, goals)
            if gain > best_gain:
                best, best_gain = rule, gain
        if best is None:  # pairs no rule fixes: the alignment guessed them wrong, unless most are left
            return rules if rules and len(pending) * 2 <= first else None
        moved = sum(1 for name in current.values() if best.apply(name) != name)
        if len(pending) > (MAX_RULES - len(rules)) * moved:
            return None  # even rules as good as the best one could not finish
        rules.append(best)
        current = {k: best.apply(name) for k, name in current.items()}


def candidates(old: str, new: str) -> list[RenameRule]:
    """Rules that fix the first difference between two dotted names, general ones first."""
    a, b = old.split("."), new.split(".")
    ops = [op for op in SequenceMatcher(None, a, b, autojunk=False).get_opcodes() if op[0] != "equal"]
    if not ops:
        return []
    _, i1, i2, j1, j2 = ops[0]
    out: list[RenameRule] = []
    if i1 > 0 and i2 > i1 and not all(part.isdigit() for part in a[i1:i2]):
        out.append(RenameRule(".".join(a[i1:i2]), ".".join(b[j1:j2]), anywhere=True))
        if i2 - i1 > 1 and j2 - j1 > 1:
            out.append(RenameRule(a[i1], b[j1], anywhere=True))
    if i1 > 0 and i2 == i1 and not a[i1 - 1].isdigit():
        out.append(RenameRule(a[i1 - 1], ".".join([a[i1 - 1], *b[j1:j2]]), anywhere=True))
    if i1 == 0 and i2 > 1 and j2 > 1:
        out.append(RenameRule(a[0] + ".", b[0] + "."))
    for _, _, x2, _, y2 in ops[:3]:
        if x2 == 0 and y2 < len(b) and a[0] == b[y2]:  # inserted in front: anchor on the next component
            x2, y2 = 1, y2 + 1
        if 0 < x2 < len(a) and y2 < len(b):
            out.append(RenameRule(".".join(a[:x2]) + ".", ".".join(b[:y2]) + "." if y2 else ""))
        elif x2 == len(a) and y2 == len(b):
            out.append(RenameRule(old, new))
    return [rule for rule in out if _expressible(rule)]


def _expressible(rule: RenameRule) -> bool:
    """The rule survives being printed as ``OLD=NEW`` and read back."""
    try:
        return RenameRule.parse(rule.spec, rule.anywhere) == rule
    except EditError:
        return False


def _progress(name: str, goal: str) -> int:
    if name == goal:
        return DONE
    a, b = name.split("."), goal.split(".")
    same = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        same += 1
    return same


def _gain(rule: RenameRule, current: dict[str, str], goals: dict[str, str]) -> int:
    """How much closer the rule brings keys to their partners; 0 if it moves any key away from its
    partner or makes two keys one."""
    gain = 0
    renamed: list[str] = []
    for key, name in current.items():
        new = rule.apply(name)
        renamed.append(new)
        if new == name:
            continue
        goal = goals.get(key)
        if goal is not None:
            delta = _progress(new, goal) - _progress(name, goal)
            if delta < 0:
                return 0
            gain += delta
    if gain and len(set(renamed)) != len(renamed):
        return 0
    return gain
