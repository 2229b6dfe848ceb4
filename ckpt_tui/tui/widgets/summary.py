"""The summary header: what the file is, at a glance, warnings first (all findings are one key away)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from rich.text import Text
from textual.widgets import Static

from ckpt_tui.core.conventions.findings import Finding
from ckpt_tui.core.model import byte_source
from ckpt_tui.core.model.describe import size
from ckpt_tui.core.model.formats import format_name
from ckpt_tui.core.operations.check import CheckReport
from ckpt_tui.core.operations.info import Summary
from ckpt_tui.core.operations.staged import blocker_words, code_blockers, sanitizable, sanitize_command
from ckpt_tui.core.runtime.safe_text import printable, printable_path
from ckpt_tui.core.weights_only.verdict import CANNOT_TELL, Verdict
from ckpt_tui.core.writers.judge import Outlook

MAX_FINDINGS = 3
READ_PROBLEMS = {
    "nan": "with NaN",
    "inf": "with Inf",
    "unreadable": "unreadable",
    "sparse-indices": "sparse with indices outside it",
}
DELETE_KEY = "d on it deletes it"
SANITIZE_KEY = "s rewrites it as plain data"
CHECK_KEY = "C"
"""The browser's key that reads every tensor (the CLI's ``ckpt-tui check``)."""
FIX_KEYS = {
    "--strip-prefix": "p strips it",
    "--extract": "x on it extracts it",
    "--map-location": "m maps the devices",
}


def finding_text(finding: Finding, readonly: bool = False, brief: bool = False) -> Text:
    """One finding: a marker in words (``!`` warning, ``·`` note), the message, and the browser key that fixes it
    (none when read-only: no key edits then). ``brief``: the message's first clause, the fact before its
    explanation (a header short of room; ``f`` lists it whole)."""
    warning = finding.severity == "warning"
    text = Text()
    text.append("! " if warning else "· ", style="bold red" if warning else "")
    message = finding.message.split(": ", 1)[0] if brief else finding.message
    text.append(printable(message), style="" if warning else "italic")
    options = [option for option, _ in finding.fix.pairs()] if finding.fix else []
    keys = [FIX_KEYS[option] for option in options if option in FIX_KEYS]
    if not readonly and keys:
        # (a PEFT fix also drops the adapters and renames: no key of its own does that, a compare's fix does)
        rest = (
            "" if all(option in FIX_KEYS for option in options) else ": part of the fix; c with your model stages all"
        )
        text.append(f" ({', then '.join(keys)}{rest})", style="italic")
    return text


@dataclass(frozen=True)
class Judged:
    """What the header knows of ``torch.load(weights_only=True)``: the verdict of the file on disk, and once the
    tree is edited, of what saving it writes (None while that is being judged)."""

    on_disk: Verdict | None = None
    edited: bool = False
    staged: Outlook | None = None


HINTS = ("full", "short", "none")
"""How a refusal's way out is said: the whole command (the ``f`` list), its gist (the header), or not at all (a
header too narrow for it)."""


def _hint(verdict: Verdict, path: str, readonly: bool, edited: bool, hint: str) -> str:
    """The way out of a refusal, in the browser's keys: delete the code, or sanitize the data (``s``; the CLI
    when read-only)."""
    code = code_blockers(verdict)
    if hint == "none":
        return ""
    if code:
        # code at the root (a whole pickled model) is not a key to delete
        deletable = all(blocker.paths and all(blocker.paths) and not blocker.assembled for blocker in code)
        return f" ({DELETE_KEY})" if deletable and not readonly else ""
    if not sanitizable(verdict):
        return ""
    if not readonly:
        # the browser's own edit, the one convert --sanitize makes: no second file, no shell
        if hint == "short" or edited:
            return f" ({SANITIZE_KEY})"
        return f" ({SANITIZE_KEY}; on the command line: {sanitize_command(path)})"
    if edited:
        return " (save, then `ckpt-tui convert SAVED -o OUT --sanitize` makes it load)"
    if hint == "short":
        return " (`ckpt-tui convert --sanitize` makes it load; f shows the command)"
    return f" (`{sanitize_command(path)}` makes it load)"


def sanitize_applies(judged: Judged) -> bool:
    """Whether the browser offers its sanitize edit (``convert --sanitize``'s) for the current tree: torch.load
    refuses a global in it. The edit itself then rewrites each object it can as plain data, or names the code
    it will not rewrite and the ``--drop`` that leaves it out: what it does, not the verdict's data/code split
    (a dataclass of the training script is "code" to import and plain fields to sanitize)."""
    verdict = _current_verdict(judged)
    return verdict is not None and verdict.answer != CANNOT_TELL and not verdict.loads and bool(verdict.blockers)


def strip_applies(summary: Summary) -> bool:
    """Whether the browser offers its strip-prefix key in the footer: a finding names a prefix the keys share, or
    its fix strips one (a press where none does still says so)."""
    for finding in summary.findings:
        pairs = finding.fix.pairs() if finding.fix else []
        if finding.prefix or any(option == "--strip-prefix" for option, _ in pairs):
            return True
    return False


def sanitize_unavailable(judged: Judged) -> str:
    """Why the sanitize edit is not offered for the current tree, in a line."""
    verdict = _current_verdict(judged)
    if verdict is None:
        return "nothing to sanitize yet: the weights_only verdict is still being worked out"
    if verdict.loads:
        return "nothing to sanitize: torch.load(weights_only=True) loads it as it is"
    if verdict.answer == CANNOT_TELL:
        unknown = printable(verdict.unknown or "")
        return f"sanitize cannot help: ckpt-tui cannot tell whether torch.load loads it ({unknown})"
    return f"sanitize cannot help: torch.load refuses it for no global ({printable(verdict.reason or '')})"


def _current_verdict(judged: Judged) -> Verdict | None:
    """The verdict about what saving gives once the tree is edited and judged, else about the file on disk."""
    return judged.staged.verdict if judged.edited and judged.staged is not None else judged.on_disk


def _refused_words(verdict: Verdict, path: str, readonly: bool, edited: bool, hint: str) -> str:
    """``torch.load REFUSES it: CODE: posix.system at ckpt["payload"] (d on it deletes it)``, or why not "loads"."""
    if verdict.answer == CANNOT_TELL:
        return f"CANNOT TELL whether torch.load loads it: {printable(verdict.unknown or '')}"
    return f"torch.load REFUSES it: {blocker_words(verdict)}{_hint(verdict, path, readonly, edited, hint)}"


def verdict_line(judged: Judged, path: str, readonly: bool = False, hint: str = "short") -> tuple[str, bool] | None:
    """The header's weights_only line and whether it warns (None: nothing to say): about the tree as staged
    once it is edited and judged, else about the file on disk, said so when the tree is edited; ``hint``: how
    the way out is said (:data:`HINTS`)."""
    disk = judged.on_disk
    staged = judged.staged
    if judged.edited and staged is not None:
        if staged.verdict is None:
            return f"what you save: ckpt-tui will not write it: {printable(staged.refusal or '')}", True
        verdict = staged.verdict
        if staged.refusal is not None and code_blockers(verdict):
            words = f"{blocker_words(verdict)}{_hint(verdict, path, readonly, True, hint)}"
            return f"weights_only, what you save: torch.load REFUSES it, and ckpt-tui will not write it: {words}", True
        if verdict.loads:
            line = "weights_only: what you save loads with torch.load"
            if verdict.devices:
                line += f" on a machine with {', '.join(verdict.devices[:3])}"
            if disk is not None and disk.loads is False and disk.blockers:
                line += (
                    f" (your edits remove what the file on disk is refused over: {blocker_words(disk, where=False)})"
                )
            elif disk is not None and disk.loads is False:
                line += " (the file on disk is not: your edits and the writer remove what torch refuses)"
            return line, False
        return f"weights_only, what you save: {_refused_words(verdict, path, readonly, True, hint)}", True
    if disk is None or disk.loads is None:
        return None
    # torch.jit.load reads a TorchScript archive that torch.load(weights_only=True) refuses
    refused = disk.loads is False and disk.route != "torchscript"
    if disk.blockers or disk.answer == CANNOT_TELL:
        words = _refused_words(disk, path, readonly, judged.edited, hint)
    else:
        words = disk.headline().removeprefix("weights_only: ")
    where = "weights_only, the file on disk" if judged.edited else "weights_only"
    return f"{where}: {words}", refused


def verdict_finding(judged: Judged, path: str, readonly: bool = False) -> Finding | None:
    """The header's weights_only line as a finding for the ``f`` list, where it warns (at its first blocker)."""
    line = verdict_line(judged, path, readonly, "full")
    if line is None or not line[1]:
        return None
    verdict = judged.staged.verdict if judged.edited and judged.staged is not None else judged.on_disk
    at = next((b.paths[0] for b in verdict.blockers if b.paths), None) if verdict is not None else None
    return Finding("weights-only", line[0], "warning", at)


def summary_text(
    summary: Summary,
    nan_tensors: int = 0,
    limit: int = MAX_FINDINGS,
    weights_only: Judged | None = None,
    check: CheckReport | None = None,
    readonly: bool = False,
    verdict_note: bool = True,
    more: bool = True,
    hint: str = "short",
    values: bool = True,
    width: int | None = None,
    keys: bool = True,
    remote: bool = True,
    brief: bool = False,
) -> Text:
    """Two lines of totals, the weights_only verdict when known, then the first findings (``f`` lists them all).

    ``verdict_note``: say the verdict also when torch.load loads the file (a refusal is always said); ``more``: say
    how many findings are not shown; ``hint``: how a refusal's way out is said (:data:`HINTS`); ``values``: say
    that the values are not read yet, until a full check (``check``) has read them; ``width``: the totals break
    between their phrases to fit it, never inside "5514 params"; ``keys``: each finding names the key that fixes
    it; ``remote``: say what a remote file cost (it shares the dtypes' line where there is room); ``brief``: each
    finding's first clause only (:func:`finding_text`)."""
    ckpt = summary.checkpoint
    text = Text()
    text.append(printable_path(os.path.basename(ckpt.path.rstrip("/")) or ckpt.path), style="bold")
    edited = weights_only is not None and weights_only.edited
    # once edited, the size is the file's and the counts are the staged tree's: each is said to be which
    parts: list[str | Text] = [
        f"  {printable(format_name(ckpt.format))}",
        f"{size(ckpt.file_bytes)} on disk" if edited else size(ckpt.file_bytes),
        ("as edited: " if edited else "") + summary.tensors_text(),
        summary.counts_text(),
    ]
    text.append_text(separated(parts, width, text.cell_len))
    text.append("\n")
    if ckpt.layout:
        text.append(f"{printable(ckpt.layout)}\n", style="italic")
    tensors: list[str | Text] = []
    # the tensors' bytes only where they are not most of the file (a second, unnamed "93.6 MB" read as noise)
    if summary.tensor_bytes < 0.95 * ckpt.file_bytes:
        tensors.append(f"{size(summary.tensor_bytes)} in tensors")
    dtypes = ", ".join(f"{printable(d)} {n}" for d, n in summary.dtypes.most_common(4))
    devices = ", ".join(f"{printable(d)} {n}" for d, n in summary.devices.most_common(4))
    tensors.append(f"dtypes {dtypes or '-'}")
    on_cuda = any("cuda" in d for d in summary.devices)
    tensors.append(Text.assemble("saved on ", (devices or "-", "bold yellow" if on_cuda else "")))
    cost = byte_source.transferred() if remote and byte_source.is_remote(ckpt.path) else None
    if cost is not None:
        tensors.append(Text(f"remote: {cost.line()}", style="italic"))
    text.append_text(separated(tensors, width))
    if nan_tensors:
        text.append(f"\n! {nan_tensors} tensors hold NaN/Inf", style="bold red")
    if check is not None:
        text.append_text(check_text(check))
    elif values:
        # nothing has read the values yet: without this line a file full of NaN reads as clean (C replaces it)
        unread = summary.unread_values(CHECK_KEY)
        if unread is not None:
            text.append(f"\n· values {unread}", style="italic")
    line = verdict_line(weights_only, ckpt.path, readonly, hint) if weights_only is not None else None
    # a line that says the edits removed a refusal is always said: the file's refusal was said before
    said = line is not None and (line[1] or verdict_note or "your edits remove" in line[0])
    if line is not None and said:
        words, refused = line
        text.append("\n! " if refused else "\n· ", style="bold red" if refused else "")
        text.append(words, style="" if refused else "italic")
    findings = listed_findings(summary, line is not None)
    shown = findings[:limit]
    for finding in shown:
        text.append("\n")
        text.append_text(finding_text(finding, readonly or not keys, brief))
    hidden = len(findings) - len(shown)
    if hidden > 0 and more:
        text.append(f"\n  … {more_findings(hidden, bool(shown) or said)}", style="italic")
    return text


def separated(parts: list[str | Text], width: int | None, start: int = 0) -> Text:
    """``parts`` joined by `` · ``, a line broken between two parts (in place of the separator) where the next
    would not fit in ``width`` after ``start`` cells; a part wider than a line wraps at its own spaces."""
    text = Text()
    column = start
    for index, part in enumerate(parts):
        piece = Text(part) if isinstance(part, str) else part
        if index and width is not None and column + 3 + piece.cell_len > width:
            text.append("\n")
            column = 0
        elif index:
            text.append(" · ")
            column += 3
        text.append_text(piece)
        column += piece.cell_len
    return text


def more_findings(hidden: int, some_shown: bool) -> str:
    """The line for findings the header has no room for: "more" only below findings (or the verdict) it shows."""
    if some_shown:
        return f"{hidden} more finding{'s' if hidden != 1 else ''}: f lists them all"
    return "1 finding: f lists it" if hidden == 1 else f"{hidden} findings: f lists them"


def listed_findings(summary: Summary, verdict_said: bool) -> list[Finding]:
    """The summary's findings as the browser lists them: where the weights_only line is said, the reader's own
    note that torch refuses plain data in the tree is that line's to say."""
    if not verdict_said:
        return summary.shown_findings
    return [finding for finding in summary.shown_findings if finding.kind != "weights-only-data"]


def read_problem_counts(report: CheckReport) -> Counter[str]:
    """Tensors with NaN, with Inf (each counted on its own: one tensor may hold both), unreadable, and sparse
    with indices outside them."""
    kinds: Counter[str] = Counter()
    for problem in report.problems:
        if problem.kind in ("unreadable", "sparse-indices"):
            kinds[problem.kind] += 1
        elif problem.kind in ("nan", "inf"):
            for kind in ("nan", "inf"):
                if problem.detail.get(kind, problem.kind == kind):
                    kinds[kind] += 1
    return kinds


def check_findings(report: CheckReport) -> list[Finding]:
    """What reading every tensor found, as findings (warnings) for the ``f`` list."""
    return [
        Finding(f"check-{problem.kind}", problem.message, "warning", problem.path)
        for problem in report.problems
        if problem.kind in READ_PROBLEMS or problem.kind == "zero-moments"
    ]


def check_text(report: CheckReport) -> Text:
    """The header line of a full check (``C``): what reading every tensor found."""
    kinds = read_problem_counts(report)
    if not kinds:
        return Text(f"\n· every tensor read ({report.checked}): no NaN/Inf, no unreadable record", style="italic")
    found = ", ".join(f"{kinds[kind]} {words}" for kind, words in READ_PROBLEMS.items() if kinds[kind])
    text = Text("\n! ", style="bold red")
    # the marked lines may be far down a long tree: the key that lists them (enter goes to one) is named
    text.append(f"every tensor read ({report.checked}): {found} (marked !! in the tree: f lists them)")
    return text


def fitted_summary(
    summary: Summary,
    lines: int,
    measure: Callable[[Text], int],
    weights_only: Judged | None = None,
    check: CheckReport | None = None,
    readonly: bool = False,
    width: int | None = None,
) -> Text:
    """The summary in at most ``lines`` lines (``width`` wide) as ``measure`` counts them: a narrow screen first
    leaves out the note that torch.load loads the file, then findings that are notes (the last line says how many
    more ``f`` lists), then the line that the values are not read yet, then
    warnings down to the first, then the first one's keys, and rather than the first finding, the line of how
    many; the line of how many more is left out only where it counts notes alone, and the line of what a remote
    file cost only where a warning needs its room. Before each finding goes, the way out of a refusal does
    (``f`` lists it in full)."""
    # the line that the values are not read is a note: it stays before notes among the findings, and gives way
    # before a warning does (a header with a warning in it does not read as clean)
    said = weights_only is not None and verdict_line(weights_only, summary.checkpoint.path, readonly) is not None
    # (a finding that answers the compare the user just made stays as long as a warning does)
    warnings = sum(f.first_listed for f in listed_findings(summary, said)[:MAX_FINDINGS])
    tries = [(True, True, MAX_FINDINGS, True, True, True)]
    tries += [(False, True, limit, True, True, True) for limit in range(MAX_FINDINGS, warnings - 1, -1)]
    last = [(False, False, limit, True, True) for limit in range(max(warnings, 1), 0, -1)]
    # the line of how many more gives way to the first finding only where what it counts are notes: a warning
    # is never hidden uncounted (the first finding's keys go first, f names them)
    if not any(finding.severity == "warning" for finding in listed_findings(summary, said)[1:]):
        last.append((False, False, 1, False, True))
    last.append((False, False, 1, True, False))
    # what a remote file cost gives way to a warning, and only to one
    tries += [(*attempt, True) for attempt in last]
    if warnings:
        tries += [(*attempt, False) for attempt in last]
    # rather than no finding at all, each one's first clause (the fact before its explanation: f lists it whole)
    each: list[tuple[bool, bool, int, bool, bool, bool, bool]] = [(*attempt, False) for attempt in tries]
    each += [(*attempt, True) for attempt in tries]
    each += [(False, False, 0, True, True, True, False), (False, False, 0, True, True, False, False)]
    for note, values, limit, more, keys, remote, brief in each:
        for hint in ("short", "none"):
            text = summary_text(
                summary, 0, limit, weights_only, check, readonly, note, more, hint, values, width, keys, remote, brief
            )
            if measure(text) <= lines:
                return text
    return text


class SummaryHeader(Static):
    """Shows a Summary (or a line while the file is read and counted)."""

    def __init__(self, text: str = "", **kwargs: object) -> None:
        super().__init__(Text(text), **kwargs)  # type: ignore[arg-type]
        self.summary: Summary | None = None
        self.shown: tuple[Judged | None, CheckReport | None] = (None, None)
        self.readonly = False
        """Findings name no edit key (the browser was opened with --readonly)."""
        self.stale: str | None = None
        """Said first when the file changed on disk since it was opened (the tree is the file as it was)."""

    def mark_stale(self, line: str) -> None:
        """Say ``line`` first, above the summary, from now on."""
        self.stale = line
        if self.summary is not None:
            self.update(self._fitted(self.summary, *self.shown))
        else:
            self.update(self._stale_text())

    def _stale_text(self) -> Text:
        return Text(printable(self.stale or ""), style="bold reverse")

    def show(self, summary: Summary, weights_only: Judged | None = None, check: CheckReport | None = None) -> None:
        """Render a summary, with the weights_only verdicts known and a full check's result when known."""
        self.summary = summary
        self.shown = (weights_only, check)
        self.update(self._fitted(summary, weights_only, check))
        self.set_class(True, "-complete")
        # the header grows from one line to several: lay the screen out again once this paint is done,
        # or an update that lands mid-layout can leave it one line high
        self.call_after_refresh(self.refresh, layout=True)

    def _fitted(self, summary: Summary, weights_only: Judged | None, check: CheckReport | None) -> Text:
        """The summary in the lines the header has (its max-height, less its border) at its width: what does not
        fit is left out in an order (``fitted_summary``), not cut wherever the height ends."""
        width = (self.content_region.width or self.app.size.width - 2) if self.is_mounted else 78
        limit = self.styles.max_height
        lines = int(limit.resolve(self.screen.size, self.app.size)) if limit is not None and self.is_mounted else 7
        console = self.app.console

        width = max(width, 20)

        def measure(text: Text) -> int:
            return len(text.wrap(console, width))

        if self.stale is None:
            return fitted_summary(summary, lines - 1, measure, weights_only, check, self.readonly, width)
        stale = self._stale_text()
        rest = fitted_summary(summary, lines - 1 - measure(stale), measure, weights_only, check, self.readonly, width)
        return Text.assemble(stale, "\n", rest)

    def on_resize(self) -> None:
        if self.summary is not None:
            self.update(self._fitted(self.summary, *self.shown))

    def show_text(self, text: str, hold: bool = False) -> None:
        """A line in place of the summary (escaped: it may name the file); ``hold``: in the lines the summary
        took (a recount after an edit), so that the tree below stays where it is until the new summary comes."""
        lines = self.content_size.height if hold and self.summary is not None and self.is_mounted else 1
        self.summary = None
        # a header that shrinks and grows back moves the tree twice: each move lays out and repaints the screen
        self.update(Text(printable(text) + "\n" * max(lines - 1, 0), style="italic"))
        self.set_class(False, "-complete")
