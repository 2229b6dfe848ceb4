"""Every hint's fix, checked before it is shown: applied in memory to the keys, it must not lower the match
with any model layout the keys fit (:mod:`ckpt_tui.core.conventions.architectures`), nor with the file's
own model weights. Info, check and the browser's header get their findings through :func:`vet_findings`;
the compare report judges its suggestion with :func:`judge_fix`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ckpt_tui.core.conventions.architectures import FIT_SHARE, fitting
from ckpt_tui.core.conventions.findings import COMMON_MODULE_NAMES, Finding, Fix, where
from ckpt_tui.core.conventions.layouts import holds_lightning_weights, without_peft_parts
from ckpt_tui.core.conventions.state_dicts import inner_state_dict, tensor_items
from ckpt_tui.core.errors import CkptError
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.keypath import KeyPath
from ckpt_tui.core.model.tree import get
from ckpt_tui.core.runtime.safe_text import printable

KEY_OPTIONS = frozenset({"--strip-prefix", "--add-prefix", "--drop-keys", "--rename-infix", "--rename-prefix"})
"""The options of a fix that change the keys of a state_dict (an extract alone keeps them as they are)."""


def fit_as_they_are(keys: int) -> str:
    """``3 keys fit as they are``, ``1 key fits as it is``: the keys that fit a model layout before a fix."""
    return f"{counted(keys, 'key')} fit{'s as it is' if keys == 1 else ' as they are'}"


@dataclass(frozen=True)
class OwnWeights:
    """The file's own model weights, as their own fix leaves them: keys that fit them belong to that model."""

    where: str
    keys: frozenset[str]

    def fit(self, keys: Sequence[str]) -> int:
        """How many keys are the model's."""
        return sum(1 for key in keys if key in self.keys)


@dataclass
class FixCheck:
    """What a fix does to the layouts the keys fit: each one it lowers, with its keys before and after."""

    lost: list[tuple[str, int, int]] = field(default_factory=list)
    empty: bool = False

    @property
    def keeps(self) -> bool:
        """The fix lowers no match (and leaves keys to load)."""
        return not self.lost and not self.empty

    def reason(self) -> str:
        """Why the fix is not offered, in words."""
        if self.empty:
            return "it would leave no key"
        name, before, after = self.lost[0]
        return f"it would lose the fit with {name} ({fit_as_they_are(before)}, {after} after it)"


def judge_fix(
    before: Sequence[str],
    after: Sequence[str] | Callable[[], Sequence[str] | None],
    lightning: bool = False,
    own: OwnWeights | None = None,
) -> FixCheck | None:
    """Whether changing the keys ``before`` to ``after`` keeps every match they have (None: ``after``, when
    given as a function that makes it, could not be made).

    The layouts are those ``before`` fits; in a Lightning checkpoint's ``state_dict`` (``lightning``) they
    are measured at the LightningModule's children (its keys less their first component), as no model
    layout is a LightningModule and the fix is meant to reach its child. ``own``: the file's model weights.
    ``after`` is made only when something fits ``before``, so a fix of 50,000 keys that fit nothing costs
    one look at their first components.
    """
    measured = [k.split(".", 1)[1] for k in before if "." in k] if lightning else before
    # a LoRA'd layer's keys (base_layer, lora_A) are no model's: only the rest fit it as they are
    fits = fitting(without_peft_parts(measured))
    own_count = own.fit(before) if own is not None else 0
    owned = own is not None and own_count >= FIT_SHARE * max(1, len(before))
    if not fits and not owned and not callable(after):
        return FixCheck(empty=not [k for k in after if k != "_metadata"])
    if not fits and not owned:
        return FixCheck()
    made = after() if callable(after) else after
    if made is None:
        return None
    keys = list(made)
    check = FixCheck(empty=not [k for k in keys if k != "_metadata"])
    for layout, count in fits:
        now = layout.fit(keys)
        if now < count:
            check.lost.append((f"a Hugging Face {layout.name}", count, now))
    if own is not None and owned and own.fit(keys) < own_count:
        check.lost.append((f"the model weights at {own.where}", own_count, own.fit(keys)))
    return check


@dataclass(frozen=True)
class ComparedModel:
    """The model the keys were last compared with (its file's name and its keys): the evidence a prefix
    finding takes over any guess from the keys alone."""

    name: str
    keys: frozenset[str]


def vet_findings(
    root: Any, findings: list[Finding], flat_keys: list[str] | None = None, compared: ComparedModel | None = None
) -> list[Finding]:
    """The findings with each key-changing fix checked (:func:`judge_fix`): one that would lower a match is
    kept without that edit, saying why. ``flat_keys``: the keys of a root that is one state_dict of plain
    tensors with str keys (a reader's columns): its findings all stand at the root, and are judged on these
    keys without a look at the root's values. ``compared``: the model the user compared with, which decides
    whether a shared prefix is a wrapper or one of its submodules."""
    if compared is not None:
        findings = [_against(root, f, compared, flat_keys) if f.kind == "prefix" and f.prefix else f for f in findings]
    judged = [f for f in findings if f.fix is not None and any(o in KEY_OPTIONS for o, _ in f.fix.pairs())]
    if not judged:
        return findings
    if flat_keys is not None and all(not f.path for f in judged):
        # the root is its own weights (no inner state_dict): each fix judged on its keys, no other weights beside
        return [_vetted(root, f, None, (), flat_keys) if f in judged else f for f in findings]
    own_path = inner_state_dict(root)
    own_path = () if own_path is None else own_path
    elsewhere = any((f.path or ()) != own_path for f in judged)
    own = _own_weights(root, own_path, findings) if elsewhere else None
    return [_vetted(root, f, own, own_path) if f in judged else f for f in findings]


def _against(root: Any, finding: Finding, compared: ComparedModel, flat_keys: list[str] | None = None) -> Finding:
    """A shared prefix judged by the model compared with: its own submodule (its keys have the prefix, or
    stripping would fit it worse) is no wrapper; a strip that makes the keys fit it is offered."""
    assert finding.prefix is not None
    prefix = finding.prefix
    try:
        keys = flat_keys if flat_keys is not None else [k for k, _ in tensor_items(get(root, finding.path or ())) or []]
    except (KeyError, IndexError, TypeError):
        return finding
    if not keys:
        return finding
    before = sum(1 for k in keys if k in compared.keys)
    after = sum(1 for k in keys if k.startswith(prefix) and k[len(prefix) :] in compared.keys)
    start = finding.message.split(": ", 1)[0]
    name = printable(compared.name)
    if after > before and after >= FIT_SHARE * len(keys):
        if finding.fix is not None or prefix.rstrip(".").lower() not in COMMON_MODULE_NAMES:
            # a strip offered already (here, or by the finding about the weights it points to)
            return finding
        fit = "fits" if after == 1 else "fit"
        message = f"{start}: a wrapper: without it {counted(after, 'key')} {fit} {name}, the model compared with"
        return replace(finding, message=message, severity="warning", fix=Fix("--strip-prefix", prefix), answers=True)
    if before == 0 and not any(k.startswith(prefix) for k in compared.keys):
        return finding
    if any(k.startswith(prefix) for k in compared.keys):
        told = f"the model in {name} has them so ({fit_as_they_are(before)}): its submodule, not a wrapper"
    else:
        told = (
            f"not a wrapper: stripping it would lose the fit with {name} ({fit_as_they_are(before)}, {after} after it)"
        )
    return replace(finding, message=f"{start}: {told}", severity="info", fix=None, answers=True)


def _vetted(
    root: Any, finding: Finding, own: OwnWeights | None, own_path: KeyPath, flat_keys: list[str] | None = None
) -> Finding:
    assert finding.fix is not None
    path = finding.path or ()
    if flat_keys is not None:
        before, lightning = flat_keys, False  # (a flat root is no Lightning checkpoint)
    else:
        try:
            before = list(map(operator.itemgetter(0), tensor_items(get(root, path)) or []))
        except (KeyError, IndexError, TypeError):
            return finding
        lightning = holds_lightning_weights(root, path)
    if not before:
        return finding
    theirs = own if path != own_path else None
    fix = finding.fix
    check = judge_fix(before, lambda: _keys_after(root, path, fix, before), lightning, theirs)
    if check is None or check.keeps:
        return finding
    changing = ", ".join(f"{o} {a}" for o, a in fix.pairs() if o in KEY_OPTIONS)
    message = f"{finding.message}; {changing} is not offered: {check.reason()}"
    if finding.kind == "prefix" and theirs is not None and check.lost[-1][0].endswith(theirs.where):
        # the file's own weights hold these keys as they are: the prefix is one of the model's submodules
        start = finding.message.split(": ", 1)[0]
        message = f"{start}: keys of the model weights at {theirs.where} as they are (a submodule of the model)"
    # an extract keeps the keys as they are: it stays, without the edits that would lose the match
    kept = Fix(fix.option, fix.argument) if fix.option == "--extract" else None
    return replace(finding, message=message, severity="info", fix=kept)


def _keys_after(root: Any, path: KeyPath, fix: Fix, before: list[str]) -> list[str] | None:
    """The keys of the state_dict at ``path`` after the fix (None: it cannot be applied)."""
    changing = [(o, a) for o, a in fix.pairs() if o in KEY_OPTIONS]
    if len(changing) == 1 and changing[0][0] == "--strip-prefix" and _all_under(before, changing[0][1]):
        # a prefix every key has comes off every key: no dry run of 50,000 renames
        cut = len(changing[0][1])
        return [k[cut:] if k != "_metadata" else k for k in before]
    return _dry_run(root, path, fix)


def _all_under(keys: list[str], prefix: str) -> bool:
    """Every key (``_metadata`` aside) starts with ``prefix`` and goes on after it (sorted order: the
    smallest and the largest key tell, at C speed)."""
    listed = [k for k in keys if k != "_metadata"] if "_metadata" in keys else keys
    return (
        bool(listed)
        and min(listed).startswith(prefix)
        and max(listed).startswith(prefix)
        and (min(map(len, listed)) > len(prefix))
    )


def _dry_run(root: Any, path: KeyPath, fix: Fix) -> list[str] | None:
    """The keys of the edited state_dict after ``convert`` applies the fix to the tree in memory."""
    from ckpt_tui.core.operations.convert import ConvertOptions, apply_options, path_text

    try:
        options = ConvertOptions.from_pairs(fix.pairs())
        if path and not options.extract:
            options.at = path_text(path)
        result = apply_options(root, options)[0]
        edited = result if options.extract else get(result, path)
    except (CkptError, KeyError, IndexError, TypeError):
        return None
    return [k for k, _ in tensor_items(edited) or []]


def _own_weights(root: Any, path: KeyPath, findings: list[Finding]) -> OwnWeights | None:
    """The file's model weights (its inner state_dict, or the root), as the finding about them would leave
    them when it warns (a DDP checkpoint's weights with ``module.`` stripped)."""
    try:
        keys = [k for k, _ in tensor_items(get(root, path)) or []]
    except (KeyError, IndexError, TypeError):
        return None
    if not keys:
        return None
    fixing = next((f for f in findings if f.path == path and f.severity == "warning" and f.fix is not None), None)
    if fixing is not None and fixing.fix is not None:
        prefix = next((a for o, a in fixing.fix.pairs() if o == "--strip-prefix"), None)
        if prefix:
            keys = [k[len(prefix) :] if k.startswith(prefix) and k != prefix else k for k in keys]
    return OwnWeights(where(path), frozenset(keys))
