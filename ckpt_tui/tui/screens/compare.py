"""The compare report (``c``): a subtree or a module group of the staged tree against a reference
checkpoint or a keys file, as ``check --against`` reports it; ``f`` applies the suggested fix here."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from rich.text import Text

from ckpt_tui.core.edits import group_edits
from ckpt_tui.core.errors import EditError, ReadError
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.keypath import KeyPath
from ckpt_tui.core.model.tree import Opaque, get
from ckpt_tui.core.runtime.safe_text import printable
from ckpt_tui.tui.host import BrowserHost
from ckpt_tui.tui.screens.report import ApplyFix, Job, ReportScreen, Section, row_width
from ckpt_tui.tui.targets import Target
from ckpt_tui.tui.text import data, where

if TYPE_CHECKING:
    from ckpt_tui.core.operations.reports import Report as Described


def fix_command(host: BrowserHost, suggestion: Any) -> list[str]:
    """The ``convert`` command that applies a suggestion to the file on disk (core's, as the CLI prints it),
    after what it assumes (lines)."""
    session = host.session
    assert session is not None
    source = host.path
    assumption: list[str] = []
    if session.edited:
        if not session.unsaved and host.last_saved is not None:
            source = host.last_saved
        else:
            source = host.default_save_path()
            edits = counted(session.unsaved, "staged edit") if session.unsaved else "staged edits"
            verb = "is" if session.unsaved == 1 else "are"
            assumption = [f"(this assumes the {edits} {verb} saved first, to {source})"]
    return [*assumption, suggestion.command(source)]


def in_group(path: KeyPath | None, target: Target) -> KeyPath | None:
    """A compared key's path in the tree: a group's keys were compared without the group's prefix."""
    if path is None or target.prefix is None or not path:
        return path
    return (*path[:-1], target.prefix + str(path[-1]))


class CompareScreen(ReportScreen):
    """Compare ``target`` of ``root`` with ``reference``; dismissed with a jump, the fix to apply, or None."""

    TASK = "compare"

    def __init__(self, host: BrowserHost, root: Any, target: Target, reference: str, display_name: str) -> None:
        name = os.path.basename(reference)
        super().__init__(f"Compare {target.describe()} with {name}", f"comparing with {name}")
        self.host = host
        self.root = root
        self.target = target
        self.reference = reference
        self.display_name = display_name

    def job(self) -> Job:
        root, target, reference = self.root, self.target, self.reference
        session = self.host.session
        refused = session.checkpoint.unwritable() if session is not None else None

        def run(progress: Any, cancelled: Any) -> Any:
            from ckpt_tui.core.operations.compare import compare, compare_checkpoint, load_reference

            # a group is compared as the state_dict x would extract; anything else as check --at does
            try:
                get(root, target.path)
            except (KeyError, IndexError, TypeError):
                raise EditError(f"{where(target.path)} is no longer in the tree") from None
            group = (
                group_edits.group_state_dict(root, target.path, target.prefix) if target.prefix is not None else None
            )
            try:
                loaded = load_reference(reference, None)
            except OSError as exc:
                raise ReadError(f"{reference}: {exc.strerror or exc}") from None
            report = compare(group, loaded) if group is not None else compare_checkpoint(root, target.path, loaded)
            if report.suggestion is not None:
                from ckpt_tui.core.operations.info import missing_records

                # as check --against says it: a fix no save can write is not offered
                report.unwritable = refused or missing_records(root)
            return report

        return run

    @property
    def fixable(self) -> bool:
        """Whether ``f`` applies the report's fix here (a group's fix needs it extracted first)."""
        report = self.report
        return (
            report is not None
            and report.suggestion is not None
            and report.unwritable is None
            and self.target.prefix is None
        )

    def described(self, report: Any) -> Described:
        from ckpt_tui.core.operations.reports import describe_compare

        target = self.target
        if target.prefix is not None:
            # a group is a part: said first, so no one reads its verdict as the file's
            count = len(report.keys)
            self.title_text = (
                f"Compared only {target.describe()} ({count} key{'' if count == 1 else 's'}) with "
                f"{os.path.basename(self.reference)}; g then c compares the whole file"
            )
        value = get(self.root, target.path) if target.prefix is None else None
        module = isinstance(value, Opaque) and value.is_module
        # the keys fitted to the list's width by one rule, their shapes kept (not cut at the end)
        return describe_compare(
            report,
            self.display_name,
            os.path.basename(self.reference),
            target.path,
            module,
            row_width(self.app.size.width),
        )

    def offers(self, described: Described) -> Text:
        """Core's suggested fix in one line, then how to apply it: ``f`` here, or the command for the file on
        disk (its details lead the list, so the command stays on screen at 80×24)."""
        shown = Text()
        if not described.fixes:
            return shown
        fix = described.fixes[0]
        shown.append(f"\n{fix.title}: ")
        shown.append(fix.summary, style="bold")
        if self.report is not None and self.report.unwritable is not None:
            shown.append(f"\nno fix can be saved: {self.report.unwritable}")
        elif self.target.prefix is not None:
            shown.append("\n(for the group extracted as a state_dict: x on the group does that first)")
        else:
            offered = self.fixable and not self.host.readonly
            shown.append("\nf applies it here as one undoable edit; " if offered else "\n")
            shown.append("on the command line:\n")
            shown.append("\n".join(printable(line) for line in self.commands(fix.suggestion)))
        for alternative in described.fixes[1:2] if self.target.prefix is None else []:
            # the other weights a user may want (the EMA copy, the usual reason to keep one), with its own key
            shown.append(f"\n{alternative.title}: ")
            shown.append(alternative.summary, style="bold")
            offered = self.alternative_fixable and not self.host.readonly
            shown.append("\ne applies it instead; " if offered else "\n")
            shown.append("its command is listed below")
        return shown

    def details(self, described: Described) -> list[Section]:
        """The suggested fix's details (the keys it resizes or drops, what keeps its fresh init) first, then
        each alternative's with its command."""
        first: list[Section] = []
        if described.fixes and described.fixes[0].details:
            fix = described.fixes[0]
            first.append((f"{fix.title}, in detail", [(None, data(detail)) for detail in fix.details]))
        # then each alternative, its details and its command (as check --against prints them)
        for alternative in described.fixes[1:] if self.target.prefix is None else []:
            lines = [*alternative.details, *self.commands(alternative.suggestion)]
            first.append((alternative.title, [(None, data(line)) for line in lines]))
        return first

    def commands(self, suggestion: Any) -> list[str]:
        """A fix's command for the file on disk (what it assumes first), or why none can write it."""
        if self.report is not None and self.report.unwritable is not None:
            return [self.report.fix_command([])]
        return fix_command(self.host, suggestion)

    @property
    def alternative_fixable(self) -> bool:
        """Whether ``e`` applies the report's alternative fix (the EMA weights) here."""
        return self.fixable and bool(self.report.alternatives)

    def hints(self) -> list[str]:
        # read-only: f still says why it does nothing (the browser's edit check), but is not offered
        if not self.fixable or self.host.readonly:
            return []
        return ["f: apply the suggested fix", *(["e: the alternative"] if self.alternative_fixable else [])]

    def path_of(self, target: Any) -> KeyPath | None:
        # the rows jump to the key paths core gives (a group's keys carry the group's prefix)
        return in_group(target, self.target) if isinstance(target, tuple) else None

    def action_fix(self) -> None:
        if self.not_yet():
            return
        if self.fixable:
            self.dismiss(ApplyFix(self.report.suggestion, self.target.path))
        else:
            super().action_fix()

    def action_fix_alternative(self) -> None:
        if self.not_yet():
            return
        if self.alternative_fixable:
            self.dismiss(ApplyFix(self.report.alternatives[0], self.target.path))
        else:
            super().action_fix_alternative()
