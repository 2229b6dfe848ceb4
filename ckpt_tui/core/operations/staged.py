"""The browser's staged tree, said as what it is: its findings, and what ``torch.load(weights_only=True)``
makes of it once saved, beside what the file on disk is.

The tree a user has edited is not the file on disk: the file's loader problems and unsafe globals stay with
the file, and only what the tree holds is written. The verdict of what is written is the writer's own
(:mod:`ckpt_tui.core.writers.judge`); the words here put each blocker as data or code, with its way out.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ckpt_tui.core.conventions.findings import Finding
from ckpt_tui.core.model.tree import Checkpoint
from ckpt_tui.core.operations.convert_options import ConvertOptions, convert_command
from ckpt_tui.core.operations.hints import ComparedModel
from ckpt_tui.core.operations.info import Summary, summarize
from ckpt_tui.core.runtime.safe_text import printable
from ckpt_tui.core.weights_only.verdict import Blocker, Verdict

FILE_LEVEL = ("loader-refuses", "readers-disagree", "load-runs-code")
"""Findings about how the file on disk is read, not about the tree in it."""
NAMES_SHOWN = 3


def staged_summary(on_disk: Checkpoint, root: Any, edited: bool, compared: ComparedModel | None = None) -> Summary:
    """The summary of ``root``, the tree staged from ``on_disk`` (``compared``: as :func:`summarize`); once
    ``edited``, a finding about the file on disk says so, and an unsafe global the staged tree no longer holds
    is said to be the file's alone."""
    summary = summarize(dataclasses.replace(on_disk, root=root), compared=compared)
    if edited:
        summary.findings = [_on_disk(finding) for finding in summary.findings]
    return summary


def _on_disk(finding: Finding) -> Finding:
    """A finding about the file on disk, said to be about it (others as they are)."""
    if finding.kind == "unsafe-global" and finding.path is None:
        # the staged tree does not hold it (a tree that does gets its own finding, with its path)
        name = printable(finding.global_name or "?")
        message = (
            f"the file on disk holds unsafe global {name} (NOT executed here; torch.load of that file would run "
            "it); your edited tree does not: saving leaves it out"
        )
        return dataclasses.replace(finding, message=message)
    if finding.kind in FILE_LEVEL:
        return dataclasses.replace(finding, message=f"the file on disk: {finding.message}")
    return finding


def code_blockers(verdict: Verdict) -> list[Blocker]:
    """The blockers that are code (torch refuses them, and they must never be allowlisted)."""
    return [blocker for blocker in verdict.blockers if blocker.kind == "code"]


def blocker_words(verdict: Verdict, where: bool = True) -> str:
    """``CODE: posix.system at ckpt["payload"]`` (code first; ``where`` it is), or ``data, not code:
    argparse.Namespace, numpy`` where every blocker is plain data; the reason where nothing is named."""
    code = code_blockers(verdict)
    if code:
        shown = "; ".join(printable(b.name) + (f" at {printable(b.where())}" if where else "") for b in code[:2])
        more = f" (+{len(code) - 2} more)" if len(code) > 2 else ""
        return f"CODE: {shown}{more}"
    if verdict.blockers:
        # numpy's arrays, scalars and dtypes each need a name or two: said as one word
        names = list(
            dict.fromkeys("numpy" if b.name.startswith("numpy.") else printable(b.name) for b in verdict.blockers)
        )
        more = " …" if len(names) > NAMES_SHOWN else ""
        return f"data, not code: {', '.join(names[:NAMES_SHOWN])}{more}"
    if verdict.reason is None and verdict.needs_import:
        return printable(f"it needs {verdict.import_words()}")
    return printable(verdict.reason or verdict.unknown or "")


def sanitize_command(path: str) -> str:
    """``ckpt-tui convert FILE --output FILE.sanitized.pth --sanitize``, quoted for the shell."""
    return convert_command(path, ConvertOptions(sanitize=True))


def sanitizable(verdict: Verdict) -> bool:
    """Whether ``--sanitize`` makes it load: every blocker is data, and nothing else refuses it."""
    return bool(verdict.blockers) and verdict.reason is None and not code_blockers(verdict)
