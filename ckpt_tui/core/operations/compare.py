"""Why a checkpoint does not fit a model: missing, unexpected, mismatched keys, and the fix.

The fix is searched, not guessed. Candidates are chains of ``convert`` edits, in the pipeline's
order: extract the weights (the inner state_dict, an EMA copy, a pickled module's state_dict), drop
what the model cannot take (PEFT adapters, the other copy of EMA/live weights, keys it lacks),
strip a prefix (wrappers, or any the reference shows is needed), rename by rules (the PEFT
``base_layer`` infix, renamed modules aligned by structure, see :mod:`ckpt_tui.core.edits.renames`), add
a prefix. Each is scored against the reference; the best is proposed with the match it reaches,
and (through :func:`compare_checkpoint`) checked by applying it to the real tree, so the command
printed is the command that reaches that match.
"""

from __future__ import annotations

import fnmatch
import itertools
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ckpt_tui.core.conventions import layouts
from ckpt_tui.core.conventions.architectures import body_layout, head_of
from ckpt_tui.core.conventions.state_dicts import (
    PREFIX_ORIGINS,
    common_prefix,
    inner_state_dict,
    saved_on_gpu,
    state_dicts,
)
from ckpt_tui.core.edits.renames import MAX_KEYS, Shapes, align, guessed_by_order, infer_rules
from ckpt_tui.core.edits.tree_edits import RenameRule, module_state_dict
from ckpt_tui.core.errors import CkptError, EditError, ReadError
from ckpt_tui.core.model.byte_source import read_small
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.keypath import KeyPath, glob_escape, to_python, to_slash
from ckpt_tui.core.model.tree import Opaque, Tensor, get
from ckpt_tui.core.runtime.shell import join_command, option, path_arg

KNOWN_PREFIXES = tuple(PREFIX_ORIGINS)
MAX_CANDIDATES = 4
LEFTOVER_DROP_LIMIT = 100
EMA_GLOB_LIMIT = 20
SWAPPED_HEAD_KEYS = 8
PART_SHARE = 0.5
"""A fix that adds a prefix must make at least this share of the reference's keys fit: fewer is a part."""
KEYS_FILE_LIMIT = 64 * 1024 * 1024


@dataclass(frozen=True)
class Expected:
    """What the reference expects of one key (shape/dtype when known)."""

    shape: tuple[int, ...] | None = None
    dtype: str | None = None


Reference = dict[str, Expected]


@dataclass(frozen=True)
class Step:
    """One step of a suggested fix: ``extract`` (a KeyPath), ``drop`` (a key), ``drop-keys`` (a glob),
    ``strip`` / ``add`` (a prefix) or ``rename`` (a :class:`RenameRule`)."""

    kind: str
    arg: Any

    def describe(self) -> str:
        """In words: ``extract model``, ``strip 'module.'``."""
        if self.kind == "extract":
            return f"extract {to_slash(self.arg)}" if self.arg else "extract the module's state_dict"
        if self.kind == "drop":
            return f"drop {self.arg!r}"
        if self.kind == "drop-keys":
            return f"drop the keys matching {self.arg!r}"
        if self.kind == "rename":
            assert isinstance(self.arg, RenameRule)
            return self.arg.describe()
        return f"{'strip' if self.kind == 'strip' else 'add'} {self.arg!r}"

    def pair(self) -> tuple[str, str]:
        """The ``convert`` option and argument of a step other than extract (which joins the ``--at``)."""
        if isinstance(self.arg, RenameRule):
            return self.arg.option, self.arg.spec
        return STEP_OPTIONS[self.kind], self.arg


STEP_OPTIONS = {"drop": "--drop", "drop-keys": "--drop-keys", "strip": "--strip-prefix", "add": "--add-prefix"}
"""The ``convert`` option of each kind of step that takes its argument as it is."""


@dataclass
class Suggestion:
    """A chain of edits, and the match it reaches: ``missing``/``unexpected`` are what is left."""

    steps: list[Step]
    matched: int
    total: int
    shape_mismatches: int
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    label: str = ""
    rule_counts: list[int] = field(default_factory=list)
    at: KeyPath = ()
    explicit_target: bool = False
    resized: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    """Keys the fix drops because their size differs from the reference's (key, file's shape, reference's
    shape): the model keeps its fresh init for them, loaded with ``strict=False``."""
    swapped: list[tuple[str, tuple[int, ...], str, tuple[int, ...]]] = field(default_factory=list)
    """A renamed and resized head the fix drops (the file's key, its shape, the reference's key it stands
    for, that key's shape): the model keeps its initial head, loaded with ``strict=False``."""
    fresh_head: str | None = None
    """The fix drops the file's head of another task than the reference's (an MLM head against a sequence
    classifier), whose own head keeps the model's fresh init, loaded with ``strict=False``: that, in words."""
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False)
    """The shapes of the keys left missing (the reference's) or unexpected (the file's) after it."""
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list, repr=False)
    """The shape mismatches left after it (key as the model names it, file's shape, reference's)."""
    keys_after: list[str] | None = field(default=None, repr=False)
    """The keys of the state_dict the fix leaves (set when it is verified on the tree)."""
    guessed: list[tuple[str, str]] = field(default_factory=list)
    """Modules the renames pair by their order alone (the file's module, the reference's): same shapes, names
    that do not say which is which (:func:`~ckpt_tui.core.edits.renames.guessed_by_order`)."""
    map_location: str | None = None
    """Where the weights it keeps were saved on a GPU: ``cpu``, the device tags it rewrites so that the file
    loads on any machine (as ``convert --map-location cpu``)."""

    @property
    def full(self) -> bool:
        """Every key and shape fits after it."""
        return not self.missing and not self.unexpected and not self.shape_mismatches

    def describe(self) -> str:
        """``after extract model and strip 'module.': 9/9 keys match, 0 shape mismatches``."""
        parts: list[str] = []
        for kind, steps in itertools.groupby(self.steps, key=lambda step: step.kind):
            group = list(steps)
            if kind == "drop" and len(group) > 1:
                parts.append(f"drop {counted(len(group), 'key')}")
            elif kind == "drop-keys":
                parts.append("drop the keys matching " + ", ".join(repr(step.arg) for step in group))
            elif kind == "rename":
                parts.append(f"rename by {counted(len(group), 'rule')}")
            else:
                parts += [step.describe() for step in group]
        if self.map_location is not None:
            parts.append(f"map the GPU tags to {self.map_location}")
        what = " and ".join(parts)
        mismatches = "shape mismatch" if self.shape_mismatches == 1 else "shape mismatches"
        return f"after {what}: {self.matched}/{self.total} keys match, {self.shape_mismatches} {mismatches}"

    def rule_lines(self) -> list[str]:
        """Each rename rule with the keys it moves."""
        rules = [s.arg for s in self.steps if s.kind == "rename"]
        return [
            f"{rule.describe()}: {counted(count, 'key')}" for rule, count in zip(rules, self.rule_counts, strict=False)
        ]

    def pairs(self) -> list[tuple[str, str]]:
        """The ``(option, argument)`` pairs of ``convert`` that apply it (as a finding's fix states them)."""
        from ckpt_tui.core.operations.convert import path_text

        pairs: list[tuple[str, str]] = []
        extracts = [s.arg for s in self.steps if s.kind == "extract"]
        if extracts or self.at:
            where = (*self.at, *(extracts[0] if extracts else ()))
            pairs.append(("--extract", path_text(where) if where else "auto"))
        pairs += [step.pair() for step in self.steps if step.kind != "extract"]
        if self.explicit_target:
            pairs.append(("--at", "/"))
        if self.map_location is not None:
            pairs.append(("--map-location", self.map_location))
        return pairs

    def options(self) -> Any:
        """The :class:`~ckpt_tui.core.operations.convert.ConvertOptions` that apply it to the file."""
        from ckpt_tui.core.operations.convert import ConvertOptions

        return ConvertOptions.from_pairs(self.pairs())

    def argv(self, path: str, output: str | None = None) -> list[str]:
        """The exact ``ckpt-tui convert`` arguments that apply it (unquoted)."""
        from ckpt_tui.core.operations.convert import fixed_output_path

        tag = "fixed-" + "-".join(self.label.lower().split()[:1]) if self.label else "fixed"
        output = output or fixed_output_path(path, tag=tag)
        return ["ckpt-tui", "convert", path_arg(path), *option("--output", path_arg(output)), *self.options().argv()]

    def command(self, path: str, output: str | None = None) -> str:
        """The command, each argument quoted for the shell (safe to print and to paste)."""
        return join_command(self.argv(path, output))

    def to_json(self, path: str | None = None) -> dict[str, Any]:
        """JSON form (with the command when the file's path is given)."""
        out: dict[str, Any] = {
            "steps": [step.describe() for step in self.steps],
            "matched": self.matched,
            "shape_mismatches": self.shape_mismatches,
            "missing": self.missing,
            "unexpected": self.unexpected,
            "full_match": self.full,
            "message": self.describe(),
            "resized": [{"key": k, "checkpoint": list(a), "reference": list(b)} for k, a, b in self.resized],
        }
        if self.swapped:
            out["swapped_head"] = [
                {"key": k, "checkpoint": list(a), "reference_key": r, "reference": list(b)}
                for k, a, r, b in self.swapped
            ]
        if self.fresh_head:
            out["other_task_head"] = self.fresh_head
        if self.guessed:
            out["paired_by_order"] = [{"module": old, "reference_module": new} for old, new in self.guessed]
        if self.mismatched:
            out["shape_mismatches_left"] = [
                {"key": k, "checkpoint": list(a), "reference": list(b)} for k, a, b in self.mismatched
            ]
        if self.label:
            out["label"] = self.label
        if self.rule_counts:
            out["rules"] = self.rule_lines()
        if path is not None:
            out["argv"] = self.argv(path)
            out["command"] = join_command(out["argv"])
        return out


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
    alternatives: list[Suggestion] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Layouts recognised (wrappers, PEFT, EMA, tied heads), in words."""
    filled_on_load: list[str] = field(default_factory=list)
    """Reference keys absent from the file that loading fills in (BatchNorm's ``num_batches_tracked``)."""
    tied: list[str] = field(default_factory=list)
    """Missing keys the architecture ties to a weight the file has (``tie_weights()`` fills them)."""
    whole_module: bool = False
    """The compared value is a pickled nn.Module: its state_dict was compared, but the file holds the module."""
    keys: list[str] = field(default_factory=list, repr=False)
    """The compared state_dict's keys."""
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False)
    """The shapes of the missing keys (the reference's, when it has them) and of the unexpected (the file's)."""
    unwritable: str | None = None
    """Why no ``convert`` can write the file (its records are missing): each fix's command is a comment saying so."""

    def reference_keys(self) -> frozenset[str]:
        """The reference's keys, as far as the report knows them: those found, missing, or filled in on load."""
        unexpected = set(self.unexpected)
        return frozenset([k for k in self.keys if k not in unexpected] + self.missing + self.filled_on_load)

    @property
    def ok(self) -> bool:
        """A state_dict with all keys present and every shape right (dtypes cast on load, so they only warn)."""
        return not self.whole_module and not self.missing and not self.unexpected and not self.shape_mismatches

    def to_json(self, path: str | None = None) -> dict[str, Any]:
        """JSON form (suggested commands included when the file's path is given)."""
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
            "notes": self.notes,
            "whole_module": self.whole_module,
            "filled_on_load": self.filled_on_load,
        }
        if self.suggestion is not None:
            out["suggestion"] = self.suggestion.to_json(path)
        if self.alternatives:
            out["alternatives"] = [s.to_json(path) for s in self.alternatives]
        for fix in [out.get("suggestion"), *out.get("alternatives", [])]:
            if fix is not None and self.unwritable is not None and "command" in fix:
                fix["command"] = self.fix_command(fix.pop("argv"))
        return out

    def fix_command(self, argv: list[str]) -> str:
        """The command of a fix, quoted; a shell comment saying why none can work for a file no convert can write
        (pasted, it does nothing)."""
        if self.unwritable is None:
            return join_command(argv)
        return f"# no command: {self.unwritable}"


# ---- references ---------------------------------------------------------------------------


def reference_from_tree(root: Any) -> Reference:
    """Keys, shapes and dtypes of a checkpoint's state_dict (its root, inner state_dict or module)."""
    items = flat_items(root)
    if not any(isinstance(v, Tensor) for _, v in items or []):
        inner = inner_state_dict(root)
        if not inner:
            raise ReadError("the reference holds no state_dict")
        items = flat_items(get(root, inner)) or []
    return {k: Expected(v.shape, v.dtype) if isinstance(v, Tensor) else Expected() for k, v in items or []}


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
            if any(len(n) > 18 for n in numbers):
                raise ReadError(f"line {number} of the keys file has a dimension too large to be real")
            shape = tuple(int(n) for n in numbers)
        dtype_match = DTYPE.search(rest)
        reference[key] = Expected(shape, dtype_match.group(1) if dtype_match else None)
    if not reference:
        raise ReadError("the keys file lists no keys")
    return reference


def read_keys_file(path: str) -> Reference:
    """A keys file from disk: UTF-8 text of at most 64 MB."""
    data = read_small(path, KEYS_FILE_LIMIT, "a keys file over 64 MB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ReadError(f"{path}: the keys file is not UTF-8 text (invalid byte on line {line})") from None
    if "\x00" in text:
        raise ReadError(f"{path}: the keys file holds NUL bytes: not text")
    return reference_from_text(text)


def reference_from_model(spec: str) -> Reference:
    """Import ``package.module:factory``, call it, and read its ``state_dict()``. This runs the user's code."""
    import importlib
    import sys

    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ReadError(f"--model takes package.module:callable, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        factory: Callable[[], Any] = getattr(importlib.import_module(module_name), attribute)
        model = factory()
    except ModuleNotFoundError as exc:
        # the module itself not found: it is looked for in this folder and on PYTHONPATH
        where = (
            " (run from the folder that holds it, or add that folder to PYTHONPATH)"
            if exc.name == module_name.split(".")[0]
            else ""
        )
        raise ReadError(f"--model {spec}: {type(exc).__name__}: {exc}{where}") from None
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
    from ckpt_tui.core.readers.open import open_checkpoint

    try:
        return reference_from_tree(open_checkpoint(against).root)
    except ReadError as exc:
        if "text file" in str(exc) or _looks_like_keys_file(against):
            return read_keys_file(against)
        raise


def _looks_like_keys_file(path: str) -> bool:
    """A small regular file of UTF-8 text (a keys file some format sniff took for something else)."""
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > KEYS_FILE_LIMIT:
            return False
        with open(path, "rb") as file:
            data = file.read()
    except OSError:
        return False
    return b"\x00" not in data and _mostly_text(data.decode("utf-8", "replace"))


def _mostly_text(text: str) -> bool:
    """Text with at most a few bad bytes (a keys file saved in the wrong encoding), not a binary file.

    Such a file is then read as a keys file, so its error names the bad line instead of a pickle opcode.
    """
    if not text.strip():
        return False
    odd = sum(1 for char in text if char == "\ufffd" or (char < " " and char not in "\t\n\r"))
    return odd * 10 <= max(len(text), 40)


# ---- comparing ----------------------------------------------------------------------------


def compare(value: Any, reference: Reference, suggest: bool = True, at: KeyPath = ()) -> CompareReport:
    """Compare a checkpoint's subtree (at ``at``) with a reference, and search for the edits that fix it."""
    items = flat_items(value)
    if items is None:
        raise EditError("the compared value is not a dict or module")
    report = _compare_items(items, reference, getattr(value, "_metadata", None) if isinstance(value, dict) else None)
    if report.filled_on_load:
        report.notes.append(
            f"{len(report.filled_on_load)} num_batches_tracked keys are absent, and BatchNorm fills them in on "
            "load (the file's _metadata has no version 2 for their modules, as in checkpoints that predate them)"
        )
    if isinstance(value, Opaque) and value.is_module:
        report.whole_module = True
        report.notes.append(
            "a whole pickled nn.Module: its state_dict is compared, but load_state_dict takes a state_dict, "
            "not the module; extracting it gives one"
        )
    if suggest and not report.ok:
        found, notes = suggest_fixes(value, reference, report)
        peft = layouts.peft_layout([k for k, _ in items])
        if peft is not None and peft.adapter_only:
            # no base weights to fit: what it is, and no fix (a head's few keys reached are no loadable model)
            found, notes = [], [peft.describe()]
        for suggestion in found:
            suggestion.at = at
        if found:
            report.suggestion, report.alternatives = found[0], found[1:]
        report.notes += notes
        best = report.suggestion
        left = (best.mismatched, best.matched) if best is not None else (report.shape_mismatches, report.matched)
        other = another_model(*left, list(reference))
        if other is not None:
            report.notes.append(other)
        task = best.fresh_head if best is not None else other_task_head(report, reference)
        if task is not None:
            report.notes.append(task)
    report.notes += _tied_notes(report, items, reference)
    return report


def compare_checkpoint(root: Any, at: KeyPath, reference: Reference) -> CompareReport:
    """:func:`compare` of the subtree at ``at``, each suggestion checked by applying its ``convert``
    options to ``root``: what it reaches is measured, not estimated, and a suggestion that fails or
    does not help is dropped."""
    report = compare(get(root, at), reference, at=at)
    found = [s for s in [report.suggestion, *report.alternatives] if s is not None]
    for suggestion in found:
        # the fixed file is to load where it is checked: weights saved on a GPU get their tags rewritten, as the
        # file's own GPU finding asks
        if saved_on_gpu(get(root, (*at, *_extracted(suggestion)))):
            suggestion.map_location = "cpu"
    verified = [s for s in found if verify(root, s, reference) and _helps(s, report)]
    report.suggestion, report.alternatives = (verified[0], verified[1:]) if verified else (None, [])
    if report.suggestion is not None and not report.suggestion.fresh_head:
        # (a head of another task dropped gives up no fit: from_pretrained drops it the same way)
        report.notes += _given_up(root, at, report.suggestion)
    return report


def _given_up(root: Any, at: KeyPath, suggestion: Suggestion) -> list[str]:
    """The fix checked as every hint is (:func:`~ckpt_tui.core.operations.hints.judge_fix`): a match with a
    model layout the keys have that it gives up to reach the reference, said (the reference decides)."""
    from ckpt_tui.core.operations.hints import fit_as_they_are, judge_fix

    before = [k for k, _ in flat_items(get(root, at)) or []]
    if not before or suggestion.keys_after is None:
        return []
    lightning = layouts.holds_lightning_weights(root, at)
    check = judge_fix(before, suggestion.keys_after, lightning)
    if check is None or not check.lost:
        return []
    name, count, after = check.lost[0]
    return [
        f"the fix gives up the fit with {name} ({fit_as_they_are(count)}, {after} after it) to reach the "
        "reference's keys: right when the reference is the model you load into"
    ]


def _extracted(suggestion: Suggestion) -> KeyPath:
    """Where a suggestion's extract takes the weights from, below its ``at`` (``()``: the value itself)."""
    return next((step.arg for step in suggestion.steps if step.kind == "extract" and step.arg), ())


def verify(root: Any, suggestion: Suggestion, reference: Reference) -> bool:
    """Apply the suggestion as ``convert`` would, and set what it reaches from the result (naming the
    edited dict explicitly, ``--at /``, when the default target would be another); False if it fails."""
    result = _apply(root, suggestion, reference)
    if result is None or not _reaches(result, suggestion):
        suggestion.explicit_target = True
        retry = _apply(root, suggestion, reference)
        if retry is not None and (result is None or _reaches(retry, suggestion)):
            result = retry
        else:
            suggestion.explicit_target = False
    if result is None:
        return False
    suggestion.keys_after = result.keys
    suggestion.matched, suggestion.total = result.matched, result.total
    suggestion.missing, suggestion.unexpected = result.missing, result.unexpected
    suggestion.shape_mismatches = len(result.shape_mismatches)
    suggestion.mismatched = result.shape_mismatches
    suggestion.shapes = result.shapes
    return True


def _apply(root: Any, suggestion: Suggestion, reference: Reference) -> CompareReport | None:
    from ckpt_tui.core.operations.convert import apply_options

    try:
        fixed = apply_options(root, suggestion.options())[0]
        return compare(fixed, reference, suggest=False)
    except CkptError:
        return None


def _reaches(result: CompareReport, suggestion: Suggestion) -> bool:
    return (
        result.matched >= suggestion.matched
        and len(result.missing) <= len(suggestion.missing)
        and len(result.unexpected) <= len(suggestion.unexpected)
        and len(result.shape_mismatches) <= suggestion.shape_mismatches
    )


def filled_on_load(key: str, metadata: Any) -> bool:
    """A missing ``num_batches_tracked`` that BatchNorm's ``_load_from_state_dict`` adds itself: the
    checkpoint predates it (no ``version`` 2 for that module in ``_metadata``), so it still loads."""
    module, _, leaf = key.rpartition(".")
    if leaf != "num_batches_tracked":
        return False
    entry = metadata.get(module) if isinstance(metadata, dict) else None
    version = entry.get("version") if isinstance(entry, dict) else None
    return not isinstance(version, int) or version < 2


def _compare_items(items: list[tuple[str, Any]], reference: Reference, metadata: Any = None) -> CompareReport:
    """Keys and shapes against the reference; ``metadata`` is the compared dict's ``_metadata`` attribute (a key of
    that name is a key like any other: load_state_dict reports it unexpected)."""
    have = dict(items)
    missing = [k for k in reference if k not in have]
    filled: list[str] = []
    if missing and all(filled_on_load(k, metadata) for k in missing):  # only they stand between it and a fit
        filled, missing = missing, []
    unexpected = [k for k in have if k not in reference]
    shapes: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []
    dtypes: list[tuple[str, str, str]] = []
    matched = 0
    for key, expected in reference.items():
        if key not in have:
            continue
        value = have[key]
        matched += 1
        if isinstance(value, Tensor):
            if expected.shape is not None and value.shape != expected.shape:
                shapes.append((key, value.shape, expected.shape))
            if expected.dtype is not None and value.dtype != expected.dtype:
                dtypes.append((key, value.dtype, expected.dtype))
    keys = list(have)
    known: dict[str, tuple[int, ...]] = {}
    for key in missing:
        shape = reference[key].shape
        if shape is not None:
            known[key] = shape
    known.update({k: have[k].shape for k in unexpected if isinstance(have[k], Tensor)})
    return CompareReport(
        missing, unexpected, shapes, dtypes, matched, len(reference), filled_on_load=filled, keys=keys, shapes=known
    )


# ---- the search ---------------------------------------------------------------------------


@dataclass
class _Variant:
    """Weights to fit, after extraction and the drops a layout calls for."""

    steps: list[Step]
    items: list[tuple[str, Any]]  # (key after extraction, value), drops applied
    label: str = ""
    strips: list[str] | None = None  # None: search; else only these
    rules: list[RenameRule] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class _Chain:
    variant: _Variant
    strip: str | None
    rules: list[RenameRule]
    add: str | None
    drops: list[str] = field(default_factory=list)
    resized: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    swapped: list[tuple[str, tuple[int, ...], str, tuple[int, ...]]] = field(default_factory=list)
    fresh_head: str | None = None

    def renamed(self) -> list[tuple[str, str, Any]]:
        """(key before renames, key after, value) for every kept key."""
        out = []
        for key, value in self._kept():
            new = self.stripped(key)
            for rule in self.rules:
                new = rule.apply(new)
            out.append((key, (self.add or "") + new, value))
        return out

    def _kept(self) -> list[tuple[str, Any]]:
        drops = set(self.drops)
        return [(k, v) for k, v in self.variant.items if k not in drops]

    def stripped(self, key: str) -> str:
        """``--strip-prefix``'s rule: keys that start with the prefix and go on after it."""
        strip = self.strip
        return key[len(strip) :] if strip and key.startswith(strip) and key != strip else key

    def rule_counts(self) -> list[int]:
        """How many keys each rename rule moves, applied in order."""
        counts = [0] * len(self.rules)
        for key, _ in self._kept():
            new = self.stripped(key)
            for index, rule in enumerate(self.rules):
                renamed = rule.apply(new)
                counts[index] += renamed != new
                new = renamed
        return counts

    def steps(self) -> list[Step]:
        steps = [s for s in self.variant.steps if s.kind == "extract"]
        steps += [Step("drop", key) for key in self.drops]
        steps += [s for s in self.variant.steps if s.kind != "extract"]
        steps += [Step("strip", self.strip)] if self.strip else []
        steps += [Step("rename", rule) for rule in self.rules]
        steps += [Step("add", self.add)] if self.add else []
        return steps


def suggest_fixes(value: Any, reference: Reference, baseline: CompareReport) -> tuple[list[Suggestion], list[str]]:
    """The best fix (live weights first), then alternatives (the EMA weights); and the layouts seen."""
    ref_set = set(reference)
    best_by_label: dict[str, tuple[tuple[Any, ...], Suggestion, _Variant]] = {}
    part: Suggestion | None = None
    for variant in _variants(value):
        chain = _best_prefix_chain(variant, reference, ref_set)
        if chain is None:
            continue
        for candidate in _improved(chain, reference, ref_set):
            suggestion = _evaluate(candidate, reference)
            if (
                suggestion.steps
                and _is_part(suggestion, baseline)
                and (part is None or _score(suggestion) > _score(part))
            ):
                part = suggestion
            if not suggestion.steps or not _helps(suggestion, baseline):
                continue
            score = _score(suggestion)
            current = best_by_label.get(variant.label)
            if current is None or score > current[0]:
                best_by_label[variant.label] = (score, suggestion, variant)
    ranked = sorted(best_by_label.values(), key=lambda entry: (entry[0][0], entry[1].label == "", entry[0]))
    ranked.reverse()
    found = [suggestion for _, suggestion, _ in ranked]
    notes: list[str] = [_part_note(part)] if part is not None and not found else []
    for _, suggestion, variant in ranked:
        for note in variant.notes:
            if note not in notes:
                notes.append(note)
        keys = [k for k, _ in variant.items]
        extracted = [s.arg for s in variant.steps if s.kind == "extract"]
        lightning = bool(extracted) and layouts.holds_lightning_weights(value, extracted[0])
        notes += [n for n in _strip_notes(suggestion, keys, lightning) if n not in notes]
    return found, notes


def _score(suggestion: Suggestion) -> tuple[Any, ...]:
    # a fix that drops the keys of another size reaches a load (strict=False) in one round; one that
    # keeps them still raises on load, so at the same count the drop wins despite its extra steps
    return (
        suggestion.full,
        suggestion.matched - suggestion.shape_mismatches,
        -suggestion.shape_mismatches,
        -len(suggestion.unexpected),
        -len(suggestion.steps),
    )


def _is_part(suggestion: Suggestion, baseline: CompareReport) -> bool:
    """A fix that places the keys, with an added prefix, into a small part of the reference: what the keys
    are, said as a note, never offered as the fix."""
    fitting = suggestion.matched - suggestion.shape_mismatches
    return (
        fitting > baseline.matched - len(baseline.shape_mismatches)
        and any(step.kind == "add" for step in suggestion.steps)
        and fitting < PART_SHARE * suggestion.total
    )


def _part_note(part: Suggestion) -> str:
    """The keys as a part of the reference, in words."""
    added = next(str(step.arg) for step in part.steps if step.kind == "add")
    fitting = part.matched - part.shape_mismatches
    return (
        f"with {added!r} added, {counted(fitting, 'key')} {'is' if fitting == 1 else 'are'} the reference's {added}* "
        f"({fitting} of its {counted(part.total, 'key')}): "
        "a part of the model, not a fix for the whole of it"
    )


def _helps(suggestion: Suggestion, baseline: CompareReport) -> bool:
    """Whether a fix is one: it makes more keys fit (present with the reference's shape) than as they are,
    and an added prefix places a real share of the model, not a few keys into a corner of it."""
    if suggestion.full or baseline.whole_module:
        return True
    fitting = suggestion.matched - suggestion.shape_mismatches
    if fitting > baseline.matched - len(baseline.shape_mismatches):
        # two keys named into a 16-key model by an added prefix is a guess that a part is the whole: the
        # report says what the keys are (a part of the reference), and offers no fix
        return not (any(step.kind == "add" for step in suggestion.steps) and fitting < PART_SHARE * suggestion.total)
    if suggestion.fresh_head and not suggestion.unexpected and not suggestion.shape_mismatches:
        # (nothing more fits: the other task's head is dropped, as from_pretrained drops it)
        return True
    head_only = not baseline.missing and not baseline.unexpected and baseline.shape_mismatches
    return bool(head_only) and suggestion.shape_mismatches == 0


def _evaluate(chain: _Chain, reference: Reference) -> Suggestion:
    renamed = chain.renamed()
    result = _compare_items([(new, value) for _, new, value in renamed], reference)
    # (the keys the rename rules move, as the rules see them: after the strip)
    moved = [(chain.stripped(old), new) for old, new, _ in renamed if chain.rules and chain.stripped(old) != new]
    shapes = {chain.stripped(old): _signature(value) for old, _, value in renamed}
    return Suggestion(
        chain.steps(),
        result.matched,
        result.total,
        len(result.shape_mismatches),
        result.missing,
        result.unexpected,
        chain.variant.label,
        chain.rule_counts(),
        resized=list(chain.resized),
        swapped=list(chain.swapped),
        fresh_head=chain.fresh_head,
        shapes=result.shapes,
        mismatched=result.shape_mismatches,
        guessed=guessed_by_order(moved, shapes) if moved else [],
    )


def _variants(value: Any) -> list[_Variant]:
    """Where the weights may be (the value, its inner state_dicts, a module's state_dict), each with
    the drops its layout calls for (PEFT adapters; one copy of EMA/live weights)."""
    bases: list[_Variant] = []
    if isinstance(value, Opaque) and value.is_module:
        bases.append(_Variant([Step("extract", ())], flat_items(value) or []))
    else:
        own = flat_items(value) or []
        if any(isinstance(v, Tensor) for _, v in own):
            bases.append(_Variant([], own))
        for path, inner in state_dicts(value):
            if path:
                ema = any(layouts.is_ema_name(str(getattr(k, "name", k))) for k in path)
                variant = _Variant([Step("extract", path)], flat_items(inner) or [], "EMA weights" if ema else "")
                if ema:
                    variant.notes.append(f"an EMA copy of the weights at {to_python(path)}")
                bases.append(variant)
    out: list[_Variant] = []
    for base in bases:
        out.append(base)
        out += _peft_variants(base) + _ema_variants(base)
    return out


def _peft_variants(base: _Variant) -> list[_Variant]:
    keys = [k for k, _ in base.items]
    peft = layouts.peft_layout(keys)
    if peft is None:
        return []
    pairs = layouts.peft_fix(peft)
    globs = [argument for option, argument in pairs if option == "--drop-keys"]
    items = _without(base.items, globs)
    rules = [RenameRule.parse(argument, anywhere=True) for option, argument in pairs if option == "--rename-infix"]
    variant = _Variant(
        [*base.steps, *(Step("drop-keys", g) for g in globs)],
        items,
        base.label,
        [peft.prefix] if peft.prefix else None,
        rules,
        [peft.describe()],
    )
    return [variant]


def _ema_variants(base: _Variant) -> list[_Variant]:
    keys = [k for k, _ in base.items]
    prefix = layouts.ema_prefix(keys)
    if not prefix:
        return []
    depth = prefix.count(".")
    live_items = [(k, v) for k, v in base.items if not k.startswith(prefix)]
    ema_items = [(k, v) for k, v in base.items if k.startswith(prefix)]
    others: dict[str, None] = {}
    for key, _ in live_items:
        parts = key.split(".")
        others[glob_escape(".".join(parts[:depth])) + ".*" if len(parts) > depth else glob_escape(key)] = None
    note = f"EMA weights under {prefix!r} beside the live weights: the fix takes the live ones; EMA offered too"
    live_glob = glob_escape(prefix) + "*"
    live = _Variant([*base.steps, Step("drop-keys", live_glob)], _without(base.items, [live_glob]), base.label)
    live.notes.append(note)
    variants = [live]
    if len(others) <= EMA_GLOB_LIMIT:
        rest = [k[len(prefix) :] for k, _ in ema_items]
        strips = [prefix] + [prefix + w for w in layouts.WRAPPERS if sum(k.startswith(w) for k in rest) > len(rest) / 2]
        steps = [*base.steps, *(Step("drop-keys", g) for g in others)]
        variants.append(_Variant(steps, _without(base.items, list(others)), "EMA weights", strips, notes=[note]))
    return variants


def _without(items: list[tuple[str, Any]], globs: list[str]) -> list[tuple[str, Any]]:
    """The items whose keys match none of the globs (as ``--drop-keys`` keeps them)."""
    return [(k, v) for k, v in items if not any(fnmatch.fnmatchcase(k, g) for g in globs)]


def _best_prefix_chain(variant: _Variant, reference: Reference, ref_set: set[str]) -> _Chain | None:
    """The strip/add pair (with the variant's own rules) that matches the most keys."""
    keys = [k for k, _ in variant.items]
    if not keys:
        return None
    strip_options: list[str | None] = list(variant.strips or [])
    if variant.strips is None:
        strip_options = [None, *_strip_candidates(keys, ref_set)]
        for lightning in (False, True):
            wrapper = layouts.wrapper_prefix(keys, lightning)
            if wrapper and wrapper not in strip_options:
                strip_options.append(wrapper)

    def matched(chain: _Chain) -> int:
        return len({new for _, new, _ in chain.renamed()} & ref_set)

    scored = sorted(
        ((matched(_Chain(variant, s, variant.rules, None)), index, s) for index, s in enumerate(strip_options)),
        key=lambda entry: (-entry[0], entry[1]),
    )
    best = (scored[0][0], _Chain(variant, scored[0][2], variant.rules, None))
    if best[0] == len(ref_set):
        return best[1]
    ref_prefix = common_prefix(reference)
    for _, _, strip in scored[:3]:
        stripped = {(k[len(strip) :] if strip and k.startswith(strip) else k): _signature(v) for k, v in variant.items}
        for add in _add_candidates(stripped, reference, ref_prefix):
            trial = _Chain(variant, strip, variant.rules, add)
            count = matched(trial)
            if count > best[0]:
                best = (count, trial)
    return best[1]


def _improved(chain: _Chain, reference: Reference, ref_set: set[str]) -> list[_Chain]:
    """The chain, then the chain with rename rules for what is left, then with leftovers dropped."""
    out = [chain]
    current = _evaluate(chain, reference)
    if current.missing and current.unexpected:
        renamed = _with_renames(chain, reference, ref_set)
        if renamed is not None:
            trial = _evaluate(renamed, reference)
            if _score(trial) > _score(current):
                out.append(renamed)
                chain, current = renamed, trial
    swapped = _swapped_head(chain, current, reference) if current.missing and current.unexpected else []
    if swapped:
        drops = [old for old, _, _, _ in swapped]
        out.append(_Chain(chain.variant, chain.strip, chain.rules, chain.add, drops, swapped=swapped))
    elif (task := other_task_head(current, reference)) is not None:
        leftover = set(current.unexpected)
        drops = [old for old, new, _ in chain.renamed() if new in leftover]
        out.append(_Chain(chain.variant, chain.strip, chain.rules, chain.add, drops, fresh_head=task))
    elif not current.missing and current.unexpected and len(current.unexpected) <= LEFTOVER_DROP_LIMIT:
        leftover = set(current.unexpected)
        drops = [old for old, new, _ in chain.renamed() if new in leftover]
        out.append(_Chain(chain.variant, chain.strip, chain.rules, chain.add, drops))
    elif (
        not current.missing
        and not current.unexpected
        and current.shape_mismatches
        and another_model(current.mismatched, current.matched, list(reference)) is None
    ):
        wrong = {k: (a, b) for k, a, b in current.mismatched}
        pairs = [(old, new) for old, new, _ in chain.renamed() if new in wrong]
        resized = [(old, *wrong[new]) for old, new in pairs]
        out.append(_Chain(chain.variant, chain.strip, chain.rules, chain.add, [old for old, _ in pairs], resized))
    return out


def another_model(
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]], matched: int, order: list[str]
) -> str | None:
    """Why keys of another size are no head to drop, in words; None when they are one (or there are none).

    A head is a minority of the keys, at the end of the model (the last keys in the reference's order), or
    one class count changed wherever its layers stand (inception's auxiliary head beside its last one):
    dropping it keeps the model's fresh init for a layer that is retrained anyway. Most of the model of
    another size, or layers in its middle, is another model or variant: dropping them throws its weights away.
    """
    if not mismatched:
        return None
    count = len(mismatched)
    keys = {key for key, _, _ in mismatched}
    if 2 * count < matched and (set(order[-count:]) == keys or _one_class_count(mismatched)):
        return None
    if 2 * count >= matched:
        where = f"{'most' if 2 * count > matched else 'half'} of the model, not a head"
    else:
        where = "not only at the end of the model, as a head is"
    differ = "differs" if count == 1 else "differ"
    return (
        f"{count} of {counted(matched, 'key')} {differ} in shape, {where}: the reference is probably another model "
        "or variant than the checkpoint's; no fix drops them (that would throw their weights away and keep the model's "
        "initial values)"
    )


def _one_class_count(mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]]) -> bool:
    """Every mismatch is one first dimension changed from one size to one other (a classifier's class count)."""
    changes = {(a[0], b[0]) for _, a, b in mismatched if a and b and a[1:] == b[1:] and len(a) == len(b)}
    return len(changes) == 1 and all(a and b and a[1:] == b[1:] and len(a) == len(b) for _, a, b in mismatched)


def _swapped_head(
    chain: _Chain, current: Suggestion, reference: Reference
) -> list[tuple[str, tuple[int, ...], str, tuple[int, ...]]]:
    """The keys left over as one module of the file that is one module of the reference under another name
    and of another size (``fc.*`` [10, 32] unexpected, ``head.*`` [5, 32] missing: a renamed and resized
    head), paired; empty when the leftovers are anything else."""
    if len(current.missing) != len(current.unexpected) or len(current.missing) > SWAPPED_HEAD_KEYS:
        return []
    theirs = {key.rpartition(".")[0] for key in current.unexpected}
    ours = {key.rpartition(".")[0] for key in current.missing}
    if len(theirs) != 1 or len(ours) != 1:
        return []
    leftover = set(current.unexpected)
    values = {new: (old, value) for old, new, value in chain.renamed() if new in leftover}
    wanted = {key.rpartition(".")[2]: key for key in current.missing}
    pairs = []
    for new in current.unexpected:
        old, value = values[new]
        target = wanted.get(new.rpartition(".")[2])
        shape = reference[target].shape if target is not None else None
        if target is None or not isinstance(value, Tensor) or shape is None or len(shape) != len(value.shape):
            return []
        pairs.append((old, value.shape, target, shape))
    # the same shapes are a rename alone, which the rename rules find: this is for a head of another size
    return pairs if any(a != b for _, a, _, b in pairs) else []


def _with_renames(chain: _Chain, reference: Reference, ref_set: set[str]) -> _Chain | None:
    """The chain without its added prefix, plus the rename rules that align what is left by structure."""
    base = _Chain(chain.variant, chain.strip, chain.rules, None)
    renamed = base.renamed()
    names = [new for _, new, _ in renamed]
    present = set(names)
    signatures = {new: _signature(v) for _, new, v in renamed}
    source = [(new, signatures[new]) for new in names if new not in ref_set]
    target = [(k, e.shape) for k, e in reference.items() if k not in present]
    # numbered modules of a parent with leftovers (a Sequential whose activations were removed: old mlp.2 is new
    # mlp.1): those whose names match are aligned too, or their partners would be taken on their names alone
    stacks = _stacks_left_over([key for key, _ in source] + [key for key, _ in target])
    wider_source = [(new, signatures[new]) for new in names if new not in ref_set or _in_stack(new, stacks)]
    wider_target = [(k, e.shape) for k, e in reference.items() if k not in present or _in_stack(k, stacks)]
    if stacks and max(len(wider_source), len(wider_target)) <= MAX_KEYS:
        source, target = wider_source, wider_target
    pairs = align(source, target)
    if not pairs:
        return None
    shapes = Shapes(signatures, {k: e.shape for k, e in reference.items()})
    head = head_of(list(reference))
    # shapes that coincide do not make one task's head another's (DistilBERT's MLM vocab_transform and its
    # sequence classifier's pre_classifier are both [dim, dim]): from_pretrained drops the one, inits the other
    rules = [r for r in infer_rules(names, pairs, ref_set, shapes) or [] if not _crosses_heads(r, names, head)]
    if not rules:
        return None
    return _Chain(chain.variant, chain.strip, [*chain.rules, *rules], None)


def _crosses_heads(rule: RenameRule, names: list[str], head: Callable[[str], str | None]) -> bool:
    """Whether ``rule`` moves a key of one head of the model into another head."""
    for name in names:
        new = rule.apply(name)
        if new != name and head(name) is not None and head(new) is not None and head(name) != head(new):
            return True
    return False


def other_task_head(report: CompareReport | Suggestion, reference: Reference) -> str | None:
    """In words, when what is left over is one task's head in the file and another's in the reference (an MLM
    checkpoint against a sequence classifier): the file's head is dropped on load and the new one is freshly
    initialised, as ``from_pretrained`` does; None otherwise."""
    if not report.missing or not report.unexpected:
        return None
    head = head_of(list(reference))
    theirs = {head(key) for key in report.unexpected}
    ours = {head(key) for key in report.missing}
    if None in theirs or None in ours or theirs & ours:
        return None
    return (
        f"the checkpoint's {', '.join(sorted(map(str, theirs)))} ({_keys_text(len(report.unexpected))}) is the head of "
        f"another task than the reference's {', '.join(sorted(map(str, ours)))} ({_keys_text(len(report.missing))}): "
        "never renamed into it; it is dropped, as from_pretrained drops it, and the new head is freshly initialised "
        "(load_state_dict(strict=False) keeps the model's initial values for it)"
    )


def _keys_text(number: int) -> str:
    return counted(number, "key")


def _stacks_left_over(keys: list[str]) -> set[str]:
    """The parents of numbered modules among ``keys`` (``mlp`` of ``mlp.4.weight``)."""
    stacks: set[str] = set()
    for key in keys:
        parts = key.split(".")
        stacks.update(".".join(parts[:i]) for i in range(1, len(parts) - 1) if parts[i].isdigit())
    return stacks


def _in_stack(key: str, stacks: set[str]) -> bool:
    """Whether ``key`` is in a numbered module of one of ``stacks``."""
    parts = key.split(".")
    return any(parts[i].isdigit() and ".".join(parts[:i]) in stacks for i in range(1, len(parts) - 1))


def _signature(value: Any) -> tuple[int, ...] | None:
    return value.shape if isinstance(value, Tensor) else None


def _strip_candidates(keys: list[str], ref_set: set[str]) -> list[str]:
    """Prefixes worth stripping: the keys' common prefix, and any whose removal turns keys into reference keys."""
    strip: Counter[str] = Counter()
    detected = common_prefix(keys)
    if detected:
        strip[detected] += len(keys)
    for key in keys[:2000]:
        parts = key.split(".")
        for cut in range(1, min(4, len(parts))):
            if ".".join(parts[cut:]) in ref_set:
                strip[".".join(parts[:cut]) + "."] += 1
    return [p for p, _ in strip.most_common(MAX_CANDIDATES)]


def _add_candidates(keys: dict[str, tuple[int, ...] | None], reference: Reference, ref_prefix: str | None) -> list[str]:
    """Prefixes worth adding: the reference's common prefix, and any that turns keys into reference keys of
    their shape (``weight`` [5, 32] is counted for ``head.``, never for ``features.0.`` of another size)."""
    add: Counter[str] = Counter()
    if ref_prefix:
        add[ref_prefix] += len(reference)
    for ref, expected in list(reference.items())[:2000]:
        parts = ref.split(".")
        for cut in range(1, min(4, len(parts))):
            rest = ".".join(parts[cut:])
            if rest in keys and (expected.shape is None or keys[rest] is None or keys[rest] == expected.shape):
                add[".".join(parts[:cut]) + "."] += 1
    return [p for p, _ in add.most_common(MAX_CANDIDATES)]


def _strip_notes(suggestion: Suggestion, keys: list[str], lightning: bool = False) -> list[str]:
    """What each stripped prefix is: a LightningModule's attribute (in a Lightning checkpoint's state_dict),
    a Hugging Face body (named by the layout its keys fit), or wrappers."""
    notes = []
    for step in suggestion.steps:
        if step.kind != "strip":
            continue
        body = None if lightning else body_layout(keys, str(step.arg))
        if lightning and str(step.arg).startswith(layouts.LIGHTNING_MODEL):
            notes.append(f"keys start with {step.arg!r}: the LightningModule's .model (a PyTorch Lightning checkpoint)")
        elif body is not None:
            notes.append(
                f"keys start with {step.arg!r}: the body of a Hugging Face {body[0].name}; the reference "
                "holds the body alone"
            )
        elif step.arg == "module." and layouts.is_averaged_model(keys):
            notes.append(
                f"keys start with {step.arg!r}: a torch.optim.swa_utils.AveragedModel's .module (SWA/EMA weights, "
                f"its {layouts.AVERAGED_COUNTER} counter beside them)"
            )
        elif layouts.split_wrappers(str(step.arg)) is not None:
            notes.append(f"keys start with {step.arg!r}: {layouts.describe_wrappers(str(step.arg))}")
    return notes


def _tied_notes(report: CompareReport, items: list[tuple[str, Any]], reference: Reference) -> list[str]:
    """Missing weights the architecture ties to one the file has (an LM head, BERT's MLM decoder, T5's
    shared embedding): a note each, and listed in ``report.tied``."""
    missing = report.suggestion.missing if report.suggestion is not None else report.missing
    if not missing:
        return []
    present = {k: _signature(v) for k, v in items}
    absent = set(missing)  # (a list: each key tested against it would cost keys x missing)
    present.update({k: e.shape for k, e in reference.items() if k not in absent})
    notes = []
    for key in missing:
        tied = layouts.tied_head(key, present, reference[key].shape if key in reference else None)
        if tied is not None:
            report.tied.append(key)
            notes.append(
                f"{key} is absent from the file: the architecture ties it to {tied} (same shape), so it is "
                "saved once (Hugging Face tie_weights). Hugging Face's from_pretrained ties it; "
                "load_state_dict needs strict=False and then model.tie_weights()"
            )
    return notes


def apply_suggestion(root: Any, at: KeyPath, suggestion: Suggestion) -> tuple[Any, list[Any]]:
    """Stage a suggestion in the browser (its changes undoable): the options its printed command gives ``convert``
    (:meth:`Suggestion.options`), run by convert's own pipeline, so what ``f`` stages is what the command writes.
    At a subtree ``at`` (and no extract of its own) the browser edits in place: the command's extract of ``at`` is
    left out, and each of its edits is aimed there, the rest of the file staged beside it."""
    from ckpt_tui.core.operations.convert import apply_options, path_text

    options = suggestion.options()
    if at and not any(step.kind == "extract" for step in suggestion.steps):
        # (--drop names a key from the root, every other edit its dict by --at)
        options.extract = None
        options.drop = [path_text((*at, key)) for key in options.drop]
        options.at = path_text(at)
    fixed, changes, _ = apply_options(root, options)
    return fixed, changes


# ---- folding ------------------------------------------------------------------------------


def fold_keys(keys: Iterable[str]) -> list[str]:
    """Fold keys that differ only in one index: ``layers.{0..31}.attn.q.weight``, ``features.{0,1,3,4}.weight``."""
    return [text for text, _ in fold_keys_with_first(keys)]


def fold_keys_with_first(keys: Iterable[str]) -> list[tuple[str, str]]:
    """:func:`fold_keys`, each folded text with the first key it stands for."""
    groups: dict[Any, list[int]] = {}
    first: dict[Any, str] = {}
    search = _INDEX.search
    for key in keys:
        # the first component of 1 to 9 ASCII digits, found in C (a split per key cost seconds at 1M keys)
        found = search(key)
        group: Any = key if found is None else (key[: found.start(1)], key[found.end(1) :])
        if group not in first:
            first[group] = key
            groups[group] = []
        if found is not None:
            groups[group].append(int(found.group(1)))
    folded = []
    for group, numbers in groups.items():
        if isinstance(group, str) or len(set(numbers)) == 1:
            folded.append((first[group], first[group]))
            continue
        before, after = group
        folded.append((before + "{" + _ranges(sorted(set(numbers))) + "}" + after, first[group]))
    return folded


_INDEX = re.compile(r"(?:^|\.)([0-9]{1,9})(?=\.|\Z)")
"""A dotted component of 1 to 9 ASCII digits (``layers.12.attn``): the index keys are folded on."""


def _ranges(numbers: list[int]) -> str:
    """``0..31,40`` or ``0,1,3,4``: the numbers as a shell brace list, a run as ``a..b`` only where it saves width."""
    spans: list[str] = []
    start = previous = numbers[0]
    for number in [*numbers[1:], None]:
        if number is not None and number == previous + 1:
            previous = number
            continue
        # a run of 3 or fewer reads plainer listed (0,1,2 is one character longer than 0..2)
        if previous - start >= _SHORTEST_RANGE - 1:
            spans.append(f"{start}..{previous}")
        else:
            spans.extend(str(n) for n in range(start, previous + 1))
        if number is not None:
            start = previous = number
    return ",".join(spans)


_SHORTEST_RANGE = 4
"""The fewest consecutive numbers written as a range (``0..3``, the notation shells use)."""
