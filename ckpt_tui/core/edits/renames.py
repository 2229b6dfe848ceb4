"""Renamed modules: pair a checkpoint's keys with a reference's by structure, then find the few
substitution rules that turn one set of names into the other.

Pairing: the keys left over on each side (in the checkpoint, not the reference; and the reverse)
are aligned in module order by tensor shape, the longest common subsequence of the two shape
sequences (a renamed model keeps its architecture, so its shapes come in the same order); keys the
order left out whose shape is left once on each side are paired too. A side listed by name (a
safetensors header) has no module order: there only a shape, or a shape and last component, found
once on each side pairs (never ``key`` with ``query`` because both are ``[16, 16]`` weights), and then keys of
one shape, last component and layer numbers pair where each is the other's one best by the words of the parts
their names do not share (``attention.query`` with ``q_proj``, ``output.dense`` with ``o_proj``). Partners
of one shape are then chosen so that last components agree (``bias_ih`` with ``bias_ih``), and a pair of two kinds of
tensor (a ``bias`` with a ``weight``, unless the names are synonyms such as ``gamma``/``weight``)
is dropped. Last, sibling modules that shapes cannot tell apart take the partners their names say
(:func:`_named_siblings`: numbered ones in the order of their numbers, named ones by shared words).

Rules: starting from the pairs, each round looks at the first place where each pair's dotted components still
differ and proposes rules that would fix it, from the most general (a component renamed anywhere: ``attn`` →
``attention``) to the most specific (one module's prefix). The rule that brings the most keys closest to their
partner, without moving a key away from its partner, without putting a key on a reference key of another
shape, without touching keys that already match, without making two keys collide and without carrying as many
keys into modules the reference lacks, or leaving as many keys of the module it renames into unfilled, as it
brings to their partners (a module is not another because two of its shapes fit), is kept (a key the pairing
left alone that a rule puts on a reference key nothing else aims at counts as fixed too). An index that
differs (``model.1`` → ``model.0``) is proposed as one rule anchored on the named component before it, for
every module at once. Rounds stop when every pair matches or no rule helps. Then the answer is measured by the
keys it places on reference keys: rules whose removal places no fewer are dropped, and one rule that places as
many replaces the list.
Ties go to the rule met first, so the rules do not change from run to run.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

from ckpt_tui.core.edits.tree_edits import RenameRule
from ckpt_tui.core.errors import EditError

MAX_KEYS = 5000
LCS_CELLS = 250_000
MAX_RULES = 64
CANDIDATES_PER_ROUND = 12
SINGLE_CANDIDATES = 48
DONE = 1_000_000

Signature = tuple[int, ...] | None

LEAF_SYNONYMS = (
    ("gamma", "weight"),  # normalization layers ported from TensorFlow
    ("beta", "bias"),
    ("moving_mean", "running_mean"),
    ("moving_variance", "running_var"),
    ("weight_g", "original0"),  # weight_norm, then its parametrization
    ("weight_v", "original1"),
    ("w", "weight"),  # hand-written and JAX/Flax models
    ("b", "bias"),
    ("kernel", "weight"),
    ("scale", "weight"),
    ("embedding", "weight"),
)
"""Last components that name the same kind of tensor under two conventions."""


@dataclass(frozen=True)
class Shapes:
    """The shape of each key (by its name before any rule) and of each reference key."""

    keys: Mapping[str, Signature]
    reference: Mapping[str, Signature]

    def clash(self, key: str, new: str) -> bool:
        """Whether naming ``key`` ``new`` puts it on a reference key of another shape."""
        mine, theirs = self.keys.get(key), self.reference.get(new)
        return mine is not None and theirs is not None and mine != theirs


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
    if _name_sorted(source) or _name_sorted(target):
        # keys listed by name (a safetensors header), not in module order: the order says nothing about
        # which of several same-shape tensors is which (key and query, layernorm_before and _after), so
        # only a shape and last component left once on each side pair (an LSTM's weight_ih with weight_ih)
        by_leaf = _unique_by_leaf(source, target)
        found = by_leaf + _unique_leftovers(source, target, by_leaf)
        found += _by_numbers_and_words(source, target, found)
        return _named_siblings(_same_kind(found, dict(source)), dict(source))
    if a == b:
        pairs = [(x, y) for (x, _), (y, _) in zip(source, target, strict=True)]
    elif len(a) * len(b) > LCS_CELLS:
        pairs = _pair_by_shape(source, target)
    else:
        pairs = []
        for start_a, start_b, size in SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks():
            pairs += [(source[start_a + i][0], target[start_b + i][0]) for i in range(size)]
    return _named_siblings(_same_kind(pairs + _unique_leftovers(source, target, pairs), dict(source)), dict(source))


def _name_sorted(keys: Sequence[tuple[str, Signature]]) -> bool:
    """Keys in name order, several of one shape among them: a listing sorted by name, where module order
    (a module's weight before its bias) would not be."""
    names = [key for key, _ in keys]
    shapes = Counter(sig for _, sig in keys)
    return len(names) > 2 and names == sorted(names) and max(shapes.values()) > 1


def _unique_by_leaf(
    source: Sequence[tuple[str, Signature]], target: Sequence[tuple[str, Signature]]
) -> list[tuple[str, str]]:
    """Keys whose shape and last component are found once on each side, paired."""
    in_source = Counter((sig, leaf(key)) for key, sig in source)
    in_target = Counter((sig, leaf(key)) for key, sig in target)
    partner = {(sig, leaf(key)): key for key, sig in target if in_target[sig, leaf(key)] == 1}
    return [
        (key, partner[sig, leaf(key)])
        for key, sig in source
        if in_source[sig, leaf(key)] == 1 and (sig, leaf(key)) in partner
    ]


def _unique_leftovers(
    source: Sequence[tuple[str, Signature]], target: Sequence[tuple[str, Signature]], pairs: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """Keys left unpaired whose shape is left once on each side: paired wherever they stand (a module
    the order put elsewhere, such as a head listed before the body)."""
    paired_source, paired_target = {a for a, _ in pairs}, {b for _, b in pairs}
    left_source = [(key, sig) for key, sig in source if key not in paired_source]
    left_target = [(key, sig) for key, sig in target if key not in paired_target]
    in_source, in_target = Counter(sig for _, sig in left_source), Counter(sig for _, sig in left_target)
    partner = {sig: key for key, sig in left_target if in_source[sig] == 1 and in_target[sig] == 1}
    return [(key, partner[sig]) for key, sig in left_source if sig in partner]


MAX_NAMED_GROUP = 64
"""Keys of one kind and numbers on each side that :func:`_by_numbers_and_words` compares each with each."""


def _by_numbers_and_words(
    source: Sequence[tuple[str, Signature]], target: Sequence[tuple[str, Signature]], pairs: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """Keys left unpaired in a listing by name, of one shape and last component on each side: paired where their
    numbers agree (layer 0 with layer 0) and, among several, where each is the other's one best by the words their
    names share (``attention.query`` with ``q_proj``, ``output.dense`` with ``o_proj``); where names tie, none."""
    paired_source, paired_target = {a for a, _ in pairs}, {b for _, b in pairs}
    groups: dict[tuple[Signature, str, tuple[str, ...]], tuple[list[str], list[str]]] = {}
    for side, keys, paired in ((0, source, paired_source), (1, target, paired_target)):
        for key, sig in keys:
            if key not in paired:
                numbers = tuple(part for part in key.split(".") if part.isdigit())
                groups.setdefault((sig, leaf(key), numbers), ([], []))[side].append(key)
    found: list[tuple[str, str]] = []
    for mine, theirs in groups.values():
        if 1 <= len(mine) == len(theirs) <= MAX_NAMED_GROUP:
            found += _mutual_best(mine, theirs)
    return found


def _mutual_best(mine: list[str], theirs: list[str]) -> list[tuple[str, str]]:
    """Pairs, round by round, of the keys each of which is the other's one best by the words of the parts their
    names do not share (``layer.0.attention.output.dense`` and ``layers.0.attention.o_proj``: ``output`` and
    ``o``); one key on each side pairs as it is."""
    if len(mine) == 1:
        return [(mine[0], theirs[0])]
    score = {(m, t): _words_shared(*_differing(m, t)) for m in mine for t in theirs}
    found: list[tuple[str, str]] = []
    left_mine, left_theirs = list(mine), list(theirs)
    while left_mine:
        best_of = {m: _one_best(left_theirs, [score[m, t] for t in left_theirs]) for m in left_mine}
        best_for = {t: _one_best(left_mine, [score[m, t] for m in left_mine]) for t in left_theirs}
        mutual = [(m, t) for m, t in best_of.items() if t is not None and best_for[t] == m]
        if not mutual:
            break
        found += mutual
        left_mine = [m for m in left_mine if m not in dict(mutual)]
        left_theirs = [t for t in left_theirs if t not in {t for _, t in mutual}]
        if len(left_mine) == 1:
            found.append((left_mine[0], left_theirs[0]))
            break
    return found


def _one_best(others: list[str], scores: list[int]) -> str | None:
    """The one of ``others`` with the highest score above zero, or None when none or several have it."""
    top = max(scores)
    return others[scores.index(top)] if top > 0 and scores.count(top) == 1 else None


def _differing(mine: str, theirs: str) -> tuple[str, str]:
    """The module components of two keys, less those both have."""
    a, b = _module(mine).split("."), _module(theirs).split(".")
    return ".".join(x for x in a if x not in b), ".".join(y for y in b if y not in a)


def leaf(key: str) -> str:
    """A key's last component: what kind of tensor it holds (``weight``, ``bias``, ``running_mean``...)."""
    return key.rsplit(".", 1)[-1]


def _same_kind(pairs: list[tuple[str, str]], shapes: dict[str, Signature]) -> list[tuple[str, str]]:
    """The pairs with partners swapped among keys of one shape so that last components agree
    (``bias_hh`` with ``bias_hh``, never with ``bias_ih``) or are synonyms (``gamma`` and ``weight``);
    those that still hold different kinds of tensor (a ``bias`` with a ``weight``) are left out.
    Linear in the pairs: partners are looked up by last component."""
    groups: dict[Signature, list[int]] = {}
    for index, (key, _) in enumerate(pairs):
        groups.setdefault(shapes.get(key), []).append(index)
    chosen: dict[int, str] = {}
    for indices in groups.values():
        targets = [pairs[i][1] for i in indices]
        place = {target: n for n, target in enumerate(targets)}
        free: dict[str, deque[str]] = {}
        for target in targets:
            free.setdefault(leaf(target), deque()).append(target)
        for kinds in (_same_leaf, _synonyms):
            for i in indices:
                queues = [free[k] for k in kinds(leaf(pairs[i][0])) if free.get(k)]
                if i not in chosen and queues:  # the first free partner, in the reference's order
                    chosen[i] = min(queues, key=lambda queue: place[queue[0]]).popleft()
    return [(key, chosen[i]) for i, (key, _) in enumerate(pairs) if i in chosen]


def _named_siblings(pairs: list[tuple[str, str]], shapes: dict[str, Signature]) -> list[tuple[str, str]]:
    """The pairs with sibling modules that shapes cannot tell apart (a q, k and v projection; the layers of a
    stack) given the partners their names say. Modules of one parent, each of whose tensors pairs with the same
    kind and shape in modules of one parent on the other side, are interchangeable to the alignment, whose order
    is then a guess: numbered siblings pair in the order of their numbers (``layers.1`` saved before ``layers.0``
    still pairs with ``layers.1``; ``mlp.0, 2, 4`` with ``mlp.0, 1, 2``, what was removed between them shifting the
    rest), named ones by the words their names share (``q_proj`` with ``query``, never with ``value``), in the
    alignment's order where the names say nothing."""
    moved: dict[str, str] = {}
    for members in _interchangeable(pairs, shapes):
        moved.update(_sibling_partners(members))
    if not moved:
        return pairs
    return [
        (key, f"{moved[_module(key)]}.{leaf(partner)}" if _module(key) in moved else partner) for key, partner in pairs
    ]


def _interchangeable(pairs: Sequence[tuple[str, str]], shapes: Mapping[str, Signature]) -> list[list[tuple[str, str]]]:
    """Groups of two or more sibling modules, each ``(module, partner module)``, that shapes cannot tell apart:
    modules of one parent whose tensors pair with the same kinds and shapes in modules of one parent."""
    modules: dict[str, dict[str, str]] = {}
    for key, partner in pairs:
        modules.setdefault(_module(key), {})[leaf(key)] = partner
    groups: dict[tuple[str, str, tuple[tuple[str, str, Signature], ...]], list[tuple[str, str]]] = {}
    for module, partners in modules.items():
        targets = {_module(partner) for partner in partners.values()}
        if len(targets) != 1 or not module:
            continue
        target = targets.pop()
        kinds = tuple(
            sorted((name, leaf(partner), shapes.get(f"{module}.{name}")) for name, partner in partners.items())
        )
        groups.setdefault((_parent(module), _parent(target), kinds), []).append((module, target))
    return [members for members in groups.values() if len(members) > 1]


def guessed_by_order(pairs: Sequence[tuple[str, str]], shapes: Mapping[str, Signature]) -> list[tuple[str, str]]:
    """The module pairs (``fc1`` → ``proj_b``) among sibling modules that shapes cannot tell apart and whose names
    do not say which is which (no number, no shared word decides between two of them): paired by their order,
    a guess the user should check."""
    guessed: list[tuple[str, str]] = []
    for members in _interchangeable(pairs, shapes):
        if all(_last(module).isdigit() and _last(target).isdigit() for module, target in members):
            continue
        doubtful = set()
        for i, (first, first_target) in enumerate(members):
            for second, second_target in members[i + 1 :]:
                kept = _words_shared(_last(first), _last(first_target))
                kept += _words_shared(_last(second), _last(second_target))
                swapped = _words_shared(_last(first), _last(second_target))
                swapped += _words_shared(_last(second), _last(first_target))
                if swapped >= kept:
                    doubtful |= {first, second}
        guessed += [(module, target) for module, target in members if module in doubtful]
    return guessed


def _sibling_partners(members: list[tuple[str, str]]) -> dict[str, str]:
    """Each interchangeable sibling module's partner module where its name says another than the alignment gave."""
    mine, theirs = [_last(module) for module, _ in members], [_last(target) for _, target in members]
    if all(name.isdigit() for name in mine + theirs):
        chosen = [t for _, t in sorted(zip(map(int, theirs), (target for _, target in members), strict=True))]
        ordered = [m for _, m in sorted(zip(map(int, mine), (module for module, _ in members), strict=True))]
        found = dict(zip(ordered, chosen, strict=True))
    else:
        found = _by_words(members)
    return {module: target for module, target in found.items() if dict(members)[module] != target}


def _by_words(members: list[tuple[str, str]]) -> dict[str, str]:
    """Partners chosen by the words sibling names share (the alignment's partner where they tie), greedily in the
    alignment's order: the best-scoring free partner of each module."""
    targets = [target for _, target in members]
    score = {(m, t): _words_shared(_last(m), _last(t)) for m, _ in members for t in targets}
    if not any(score.values()):
        return dict(members)
    free, found = list(targets), {}
    # the modules whose names speak most clearly first (a module whose words match no partner takes what is left)
    for module, given in sorted(members, key=lambda pair: -max(score[pair[0], t] for t in targets)):
        best = max(free, key=lambda t: (score[module, t], t == given))
        found[module] = best
        free.remove(best)
    return found


def _words_shared(mine: str, theirs: str) -> int:
    """How much two module names say they are the same: 2 for each word of ``mine`` found in ``theirs``, 1 for one
    that begins the other (``q`` and ``query``, ``attn`` and ``attention``)."""
    words = re.findall(r"[a-z]+|[0-9]+", theirs.lower())
    total = 0
    for word in re.findall(r"[a-z]+|[0-9]+", mine.lower()):
        if word in words:
            total += 2
        elif word.isalpha() and any(w.isalpha() and (w.startswith(word) or word.startswith(w)) for w in words):
            total += 1
    return total


def _module(key: str) -> str:
    return key.rsplit(".", 1)[0] if "." in key else ""


def _parent(module: str) -> str:
    return module.rsplit(".", 1)[0] if "." in module else ""


def _last(module: str) -> str:
    return module.rsplit(".", 1)[-1]


def _same_leaf(name: str) -> tuple[str, ...]:
    return (name,)


def _synonyms(name: str) -> tuple[str, ...]:
    return tuple(other for pair in LEAF_SYNONYMS if name in pair for other in pair if other != name)  # in order


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


def infer_rules(
    keys: Sequence[str], pairs: Sequence[tuple[str, str]], reference: set[str], shapes: Shapes | None = None
) -> list[RenameRule] | None:
    """Rules that, applied in order to every key, take the paired keys to their partners (at least
    half of them: shape alignment can pair a few keys wrongly); None when no short list of rules does
    (names that share no structure would need one rule per key). With ``shapes``, no rule puts a key
    on a reference key of another shape. Of two rule lists, the one that places more keys on reference
    keys wins, then the shorter: one rule that fixes every key beats three that fix some."""
    goals = dict(pairs)
    for key in keys:
        if key in reference and key not in goals:
            goals[key] = key
    search = _Search(keys, goals, reference, shapes)
    rules = search.greedy()
    if rules is None:
        return None
    rules = search.pruned(rules)
    single = search.best_single()
    if single is not None and len(rules) > 1 and search.placed([single]) >= search.placed(rules):
        return [single]
    return rules


class _Search:
    """The greedy search for rename rules, and the measure that compares its answers."""

    def __init__(self, keys: Sequence[str], goals: dict[str, str], reference: set[str], shapes: Shapes | None) -> None:
        self.keys, self.goals, self.reference, self.shapes = list(keys), goals, reference, shapes
        # reference keys no pair aims at: a key the alignment left unpaired (two of one shape in a listing by
        # name) that a rule puts there is fixed too
        self.free = reference - set(goals.values()) - set(keys)
        self.modules = {key[:cut] for key in reference for cut in _dots(key)}
        self.first: Counter[RenameRule] = Counter()

    def greedy(self) -> list[RenameRule] | None:
        """Rules picked one round at a time, each the one that brings keys closest to their partners."""
        goals = self.goals
        current = {key: key for key in self.keys}
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
                counts.update(list(dict.fromkeys(candidates(old, new))))  # each once, in a fixed order (not a set's)
            if not rules:
                self.first = counts
            best: RenameRule | None = None
            best_gain = 0
            for rule, _ in counts.most_common(CANDIDATES_PER_ROUND):
                gain = _gain(rule, current, goals, self.shapes, (self.free, self.modules, self.reference))
                if gain > best_gain:
                    best, best_gain = rule, gain
            if best is None:  # pairs no rule fixes: the alignment guessed them wrong, unless most are left
                return rules if rules and len(pending) * 2 <= first else None
            moved = sum(1 for name in current.values() if best.apply(name) != name)
            if len(pending) > (MAX_RULES - len(rules)) * moved:
                return None  # even rules as good as the best one could not finish
            rules.append(best)
            current = {k: best.apply(name) for k, name in current.items()}

    def placed(self, rules: Sequence[RenameRule]) -> int:
        """How many keys the rules leave on a reference key (of their shape); -1 when two keys become one."""
        names = []
        for key in self.keys:
            name = key
            for rule in rules:
                name = rule.apply(name)
            if self.shapes is not None and name != key and self.shapes.clash(key, name):
                return -1
            names.append(name)
        if len(set(names)) != len(names):
            return -1
        return sum(1 for name in names if name in self.reference)

    def pruned(self, rules: list[RenameRule]) -> list[RenameRule]:
        """The rules without those whose removal places no fewer keys (a later general rule did their work)."""
        placed = self.placed(rules)
        for index in range(len(rules) - 1, -1, -1):
            shorter = rules[:index] + rules[index + 1 :]
            if len(rules) > 1 and self.placed(shorter) >= placed:
                rules = shorter
        return rules

    def best_single(self) -> RenameRule | None:
        """The one rule, of the first round's most frequent candidates, that places the most keys."""
        best: RenameRule | None = None
        best_placed = 0
        for rule, _ in self.first.most_common(SINGLE_CANDIDATES):
            placed = self.placed([rule])
            if placed > best_placed:
                best, best_placed = rule, placed
        return best


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
    anchor = next((k for k in range(i1 - 1, -1, -1) if not a[k].isdigit()), None)
    if anchor is not None and i2 > i1 and j2 > j1 and all(part.isdigit() for part in a[i1:i2]):
        # an index that differs (Sequential's ``model.1`` → ``model.0`` once a Dropout is gone) in every
        # module at once: one rule, anchored on the named component before it so other indices stay
        out.append(RenameRule(".".join(a[anchor:i2]), ".".join([*a[anchor:i1], *b[j1:j2]]), anywhere=True))
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


def _dots(key: str) -> list[int]:
    """Where each module path of a key ends (``a.b.c``: after ``a``, after ``a.b``)."""
    return [index for index, char in enumerate(key) if char == "."]


def _gain(
    rule: RenameRule,
    current: dict[str, str],
    goals: dict[str, str],
    shapes: Shapes | None,
    reference: tuple[set[str], set[str], set[str]],
) -> int:
    """How much closer the rule brings keys to their partners (a key with no partner put on a reference key
    nothing else aims at counts as one reaching its partner); 0 if it moves any key away from its partner,
    puts one on a reference key of another shape, makes two keys one, or carries as many keys into modules the
    reference lacks (or leaves as many keys of the module it renames into unfilled) as it moves keys that have a
    partner. ``reference``: the reference keys no pair aims at, every module path of the reference's keys, and
    the reference's keys."""
    free, modules, keys = reference
    gain = paired = astray = 0
    renamed: list[str] = []
    for key, name in current.items():
        new = rule.apply(name)
        renamed.append(new)
        if new == name:
            continue
        if shapes is not None and shapes.clash(key, new):
            return 0
        goal = goals.get(key)
        if goal is not None:
            delta = _progress(new, goal) - _progress(name, goal)
            if delta < 0:
                return 0
            gain += delta
            paired += 1
        elif new in free:
            gain += DONE
        elif "." in new and new.rsplit(".", 1)[0] not in modules:
            astray += 1
    if gain and len(set(renamed)) != len(renamed):
        return 0
    # shapes that coincide do not make one module another: a rule taking an MLM head's transform (dense and
    # LayerNorm) to BERT's pooler (dense alone) brings two keys to partners and two into a module nowhere in the
    # reference, where a true rename of a model leaves at most a few extra buffers behind
    if astray and astray >= paired:
        return 0
    # and the other way round: BERT's pooler (dense) renamed into an MLM head's transform leaves its LayerNorm empty
    if paired and rule.new and not rule.anywhere:
        names = set(renamed)
        unfilled = sum(1 for key in keys if key.startswith(rule.new) and key not in names)
        if unfilled >= paired:
            return 0
    return gain
