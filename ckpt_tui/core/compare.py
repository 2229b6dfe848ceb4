"""Why a checkpoint does not fit a model: missing, unexpected, mismatched keys, and the fix."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ckpt_tui.core.edits import module_state_dict
from ckpt_tui.core.errors import EditError, ReadError
from ckpt_tui.core.keypath import KeyPath, to_slash
from ckpt_tui.core.state_dicts import PREFIX_ORIGINS, common_prefix, state_dicts
from ckpt_tui.core.tree import Opaque, Tensor, get

KNOWN_PREFIXES = tuple(PREFIX_ORIGINS)
MAX_CANDIDATES = 4


@dataclass(frozen=True)
class Expected:
    """What the reference expects of one key (shape/dtype when known)."""

    shape: tuple[int, ...] | None = None
    dtype: str | None = None


Reference = dict[str, Expected]


@dataclass(frozen=True)
class Step:
    """One step of a suggested fix."""

    kind: str  # extract | strip | add
    arg: str | KeyPath

    def describe(self) -> str:
        """In words: ``extract model``, ``strip 'module.'``."""
        if self.kind == "extract":
            return f"extract {to_slash(self.arg) if isinstance(self.arg, tuple) else self.arg}"
        return f"{'strip' if self.kind == 'strip' else 'add'} {self.arg!r}"

    def option(self) -> list[str]:
        """The ``convert`` options that apply it."""
        if self.kind == "extract":
            assert isinstance(self.arg, tuple)
            return ["--extract", to_slash(self.arg)]
        return ["--strip-prefix" if self.kind == "strip" else "--add-prefix", str(self.arg)]


@dataclass
class Suggestion:
    """A short sequence of edits and how well the result matches."""

    steps: list[Step]
    matched: int
    total: int
    shape_mismatches: int

    def describe(self) -> str:
        """``after extracting model and stripping 'module.': 9/9 keys match, 0 shape mismatches``."""
        what = " and ".join(step.describe() for step in self.steps)
        return f"after {what}: {self.matched}/{self.total} keys match, {self.shape_mismatches} shape mismatches"

    def command(self, path: str, output: str = "fixed.pth") -> str:
        """The exact ``ckpt-tui convert`` command that applies it."""
        options = " ".join(part for step in self.steps for part in step.option())
        return f"ckpt-tui convert {_quote(path)} -o {_quote(output)} {options}"


def _quote(text: str) -> str:
    return text if re.fullmatch(r"[\w./:@+-]+", text) else "'" + text.replace("'", "'\\''") + "'"


@dataclass
class CompareReport:
    """The result of comparing a checkpoint (or a subtree) with a reference."""

    missing: list[str]
    unexpected: list[str]
    shape_mismatches: list[tuple[str, tuple[int, ...], tuple[int, ...]]]
    dtype_mismatches: list[tuple[str, str, str]]
    matched: int
    total: int
    suggestion: Suggestion | None = None

    @property
    def ok(self) -> bool:
        """All keys present and every shape right (dtypes cast on load, so they only warn)."""
        return not self.missing and not self.unexpected and not self.shape_mismatches

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        out: dict[str, Any] = {
            "ok": self.ok,
            "matched": self.matched,
            "reference_keys": self.total,
            "missing": self.missing,
            "unexpected": self.unexpected,
            "shape_mismatches": [
                {"key": k, "checkpoint": list(a), "reference": list(b)} for k, a, b in self.shape_mismatches
            ],
            "dtype_mismatches": [{"key": k, "checkpoint": a, "reference": b} for k, a, b in self.dtype_mismatches],
            "missing_folded": fold_keys(self.missing),
            "unexpected_folded": fold_keys(self.unexpected),
        }
        if self.suggestion is not None:
            out["suggestion"] = {
                "steps": [step.describe() for step in self.suggestion.steps],
                "matched": self.suggestion.matched,
                "shape_mismatches": self.suggestion.shape_mismatches,
                "message": self.suggestion.describe(),
            }
        return out


# ---- references ---------------------------------------------------------------------------


def reference_from_tree(root: Any) -> Reference:
    """Keys, shapes and dtypes of a checkpoint's state_dict (its root, inner state_dict or module)."""
    items = flat_items(root)
    if items is None:
        found = state_dicts(root)
        if not found:
            raise ReadError("the reference holds no state_dict")
        items = flat_items(found[0][1]) or []
    return {k: Expected(v.shape, v.dtype) if isinstance(v, Tensor) else Expected() for k, v in items}


def flat_items(value: Any) -> list[tuple[str, Any]] | None:
    """A dict's (key, value) pairs, or a pickled module's state_dict items; None for anything else."""
    if isinstance(value, Opaque) and value.is_module:
        return list(module_state_dict(value).items())
    if isinstance(value, dict):
        return [(k, v) for k, v in value.items() if isinstance(k, str)]
    return None


SHAPE = re.compile(r"[\[(]([\d,\s]*)[\])]|(\d+(?:\s*[x×]\s*\d+)+)")
DTYPE = re.compile(r"\b(?:torch\.)?((?:b?float|u?int|complex)\d+|bool|float8_\w+)\b")


def reference_from_text(text: str) -> Reference:
    """A keys file: one key a line, optionally followed by a shape (``[81, 256]``, ``81x256``) and a dtype."""
    reference: Reference = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, _, rest = line.partition(" ")
        key = key.rstrip(":=,")
        if not key:
            raise ReadError(f"line {number} of the keys file has no key")
        shape = None
        match = SHAPE.search(rest)
        if match:
            numbers = re.findall(r"\d+", match.group(0))
            shape = tuple(int(n) for n in numbers)
        dtype_match = DTYPE.search(rest)
        reference[key] = Expected(shape, dtype_match.group(1) if dtype_match else None)
    if not reference:
        raise ReadError("the keys file lists no keys")
    return reference


def reference_from_model(spec: str) -> Reference:
    """Import ``package.module:factory``, call it, and read its ``state_dict()``. This runs the user's code."""
    import importlib
    import os
    import sys

    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ReadError(f"--model takes package.module:callable, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        factory: Callable[[], Any] = getattr(importlib.import_module(module_name), attribute)
        model = factory()
    except Exception as exc:  # the user's code can fail in any way; report it in one line
        raise ReadError(f"--model {spec}: {type(exc).__name__}: {exc}") from None
    state = model.state_dict() if hasattr(model, "state_dict") else model
    if not isinstance(state, dict):
        raise ReadError(f"--model {spec} returned neither a module nor a state_dict")
    reference: Reference = {}
    for key, value in state.items():
        shape = tuple(value.shape) if hasattr(value, "shape") else None
        dtype = str(value.dtype).removeprefix("torch.") if hasattr(value, "dtype") else None
        reference[str(key)] = Expected(shape, dtype)
    return reference


def load_reference(against: str | None, model: str | None) -> Reference:
    """The reference named on the command line: a checkpoint, a keys file, or a model factory."""
    if model:
        return reference_from_model(model)
    assert against is not None
    from ckpt_tui.core.reading import open_checkpoint

    try:
        return reference_from_tree(open_checkpoint(against).root)
    except ReadError as exc:
        if "text file" not in str(exc):
            raise
    with open(against, encoding="utf-8") as file:
        return reference_from_text(file.read())


# ---- comparing ----------------------------------------------------------------------------


def compare(value: Any, reference: Reference, suggest: bool = True) -> CompareReport:
    """Compare a checkpoint's subtree with a reference, and look for the edit that fixes it."""
    items = flat_items(value)
    if items is None:
        raise EditError("the compared value is not a dict or module")
    report = _compare_items(items, reference)
    if suggest and not report.ok:
        report.suggestion = suggest_fix(value, reference, report.matched)
    return report


def _compare_items(items: list[tuple[str, Any]], reference: Reference) -> CompareReport:
    have = dict(items)
    missing = [k for k in reference if k not in have]
    unexpected = [k for k in have if k not in reference and k != "_metadata"]
    shapes: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []
    dtypes: list[tuple[str, str, str]] = []
    matched = 0
    for key, expected in reference.items():
        value = have.get(key)
        if value is None and key not in have:
            continue
        matched += 1
        if isinstance(value, Tensor):
            if expected.shape is not None and value.shape != expected.shape:
                shapes.append((key, value.shape, expected.shape))
            if expected.dtype is not None and value.dtype != expected.dtype:
                dtypes.append((key, value.dtype, expected.dtype))
    return CompareReport(missing, unexpected, shapes, dtypes, matched, len(reference))


def _renamed(items: list[tuple[str, Any]], strip: str | None, add: str | None) -> list[tuple[str, Any]]:
    out = []
    for key, value in items:
        if strip and key.startswith(strip):
            key = key[len(strip) :]
        out.append(((add or "") + key, value))
    return out


def _prefix_candidates(keys: list[str], reference: Reference) -> tuple[list[str], list[str]]:
    """Prefixes worth stripping from the checkpoint and adding to it, found by aligning the key sets."""
    ref_keys = list(reference)
    strip: Counter[str] = Counter()
    add: Counter[str] = Counter()
    detected = common_prefix(keys)
    if detected:
        strip[detected] += len(keys)
    ref_prefix = common_prefix(ref_keys)
    if ref_prefix:
        add[ref_prefix] += len(ref_keys)
    ref_set = set(ref_keys)
    key_set = set(keys)
    for key in keys[:2000]:
        parts = key.split(".")
        for cut in range(1, min(4, len(parts))):
            if ".".join(parts[cut:]) in ref_set:
                strip[".".join(parts[:cut]) + "."] += 1
    for ref in ref_keys[:2000]:
        parts = ref.split(".")
        for cut in range(1, min(4, len(parts))):
            if ".".join(parts[cut:]) in key_set:
                add[".".join(parts[:cut]) + "."] += 1
    for prefix in KNOWN_PREFIXES:
        if any(k.startswith(prefix) for k in keys[:100]):
            strip[prefix] += 0
    return [p for p, _ in strip.most_common(MAX_CANDIDATES)], [p for p, _ in add.most_common(MAX_CANDIDATES)]


def suggest_fix(value: Any, reference: Reference, baseline: int) -> Suggestion | None:
    """The shortest sequence of extract / strip / add that makes the most keys match."""
    bases: list[tuple[list[Step], Any]] = [([], value)]
    if not (isinstance(value, Opaque) and value.is_module):
        for path, inner in state_dicts(value):
            if path:
                bases.append(([Step("extract", path)], inner))
    if isinstance(value, Opaque) and value.is_module:
        bases.append(([Step("extract", ())], value))
    best: tuple[tuple[int, int, int], Suggestion] | None = None
    for steps, base in bases:
        items = flat_items(base) or []
        strips, adds = _prefix_candidates([k for k, _ in items], reference)
        options: list[tuple[str | None, str | None]] = [(None, None)]
        options += [(s, None) for s in strips] + [(None, a) for a in adds] + [(s, a) for s in strips for a in adds]
        for strip, add in options:
            trial = _compare_items(_renamed(items, strip, add), reference)
            chain = [*steps] + ([Step("strip", strip)] if strip else []) + ([Step("add", add)] if add else [])
            if not chain:
                continue
            score = (trial.matched, -len(trial.shape_mismatches), -len(chain))
            if best is None or score > best[0]:
                best = (score, Suggestion(chain, trial.matched, trial.total, len(trial.shape_mismatches)))
    if best is None or best[1].matched <= baseline:
        return None
    return best[1]


def apply_suggestion(root: Any, at: KeyPath, suggestion: Suggestion) -> tuple[Any, list[Any]]:
    """Apply a suggestion's steps with the ordinary edits (so the TUI can undo them)."""
    from ckpt_tui.core import edits

    changes = []
    value_path = at
    for step in suggestion.steps:
        if step.kind == "extract":
            assert isinstance(step.arg, tuple)
            target = get(root, value_path)
            if isinstance(target, Opaque) and target.is_module and not step.arg:
                root, change = edits.extract(root, value_path)
            else:
                root, change = edits.extract(root, (*value_path, *step.arg))
            value_path = ()
        elif step.kind == "strip":
            root, change = edits.strip_prefix(root, str(step.arg), value_path)
        else:
            root, change = edits.add_prefix(root, str(step.arg), value_path)
        changes.append(change)
    return root, changes


# ---- folding ------------------------------------------------------------------------------


def fold_keys(keys: Iterable[str]) -> list[str]:
    """Fold keys that differ only in one index: ``layers.{0...31}.attn.q.weight``."""
    groups: dict[str, list[int]] = {}
    order: list[str] = []
    for key in keys:
        parts = key.split(".")
        index = next((i for i, part in enumerate(parts) if part.isdigit()), None)
        if index is None:
            groups.setdefault(key, [])
            order.append(key)
            continue
        pattern = ".".join([*parts[:index], "{}", *parts[index + 1 :]])
        if pattern not in groups:
            groups[pattern] = []
            order.append(pattern)
        groups[pattern].append(int(parts[index]))
    folded = []
    for pattern in order:
        numbers = groups[pattern]
        if not numbers:
            folded.append(pattern)
        elif len(numbers) == 1:
            folded.append(pattern.replace("{}", str(numbers[0]), 1))
        else:
            folded.append(pattern.replace("{}", "{" + _ranges(sorted(set(numbers))) + "}", 1))
    return folded


def _ranges(numbers: list[int]) -> str:
    spans: list[str] = []
    start = previous = numbers[0]
    for number in [*numbers[1:], None]:
        if number is not None and number == previous + 1:
            previous = number
            continue
        spans.append(f"{start}...{previous}" if previous > start else str(start))
        if number is not None:
            start = previous = number
    return ",".join(spans)
