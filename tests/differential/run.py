"""One differential run: generate files, judge each by ckpt-tui and by the real torch, compare.

ckpt-tui's side runs here, in-process, while :mod:`differential.torch_side` loads the same files in
its own sandboxed children. An outcome is **bad** when ckpt-tui says "loads" (or ``check`` exits 0)
while torch refuses the file with ``weights_only=True`` or runs code from it with ``weights_only=False``;
it is **strict** when ckpt-tui refuses or cannot tell while torch loads it (counted, allowed).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from differential.generator import case

TORCH_SIDE = Path(__file__).with_name("torch_side.py")
OUR_SECONDS = 60


@dataclass
class Outcome:
    """How both sides judged one file."""

    index: int
    kinds: list[str]
    path: str
    ours: str = ""
    """loads, refuses, cannot tell, n/a, or error: ... (a traceback or hang in ckpt-tui)"""
    clean: bool = False
    """``check`` found no problem (exit 0)."""
    reason: str = ""
    torch_true: str = ""
    torch_false: str = ""
    ran: bool = False

    @property
    def bad(self) -> bool:
        """ckpt-tui calls it loading or clean while torch refuses it, runs code from it, or loads what is
        not on disk (a member it reads unwritten: its allocated buffer, uninitialised)."""
        return (self.ours == "loads" or self.clean) and (self.torch_true != "loads" or self.ran or self.unwritten)

    @property
    def unwritten(self) -> bool:
        """A member torch reads, with bytes on disk, is one miniz extracts without writing them."""
        return any(kind.startswith("zip unwritten") and not kind.endswith("(empty)") for kind in self.kinds)

    @property
    def strict(self) -> bool:
        """ckpt-tui refuses (or cannot tell) where torch loads it."""
        return self.ours in ("refuses", "cannot tell") and self.torch_true == "loads" and not self.ran

    @property
    def broken(self) -> bool:
        """ckpt-tui itself failed (a traceback, a hang) where it should give one line."""
        return self.ours.startswith("error")


@dataclass
class Report:
    """The outcomes of a run, and their counts."""

    outcomes: list[Outcome] = field(default_factory=list)

    def counts(self) -> dict[str, Any]:
        """Totals for the closing note: files, agreements, each direction of disagreement."""
        torch_says = Counter("loads" if o.torch_true == "loads" else o.torch_true.split(":")[0] for o in self.outcomes)
        ours = Counter(o.ours.split(":")[0] for o in self.outcomes)
        return {
            "files": len(self.outcomes),
            "torch weights_only=True": dict(torch_says),
            "code ran (weights_only=False)": sum(o.ran for o in self.outcomes),
            "ckpt-tui": dict(ours),
            "bad (ckpt-tui loads/clean, torch refuses or runs code)": sum(o.bad for o in self.outcomes),
            "strict (ckpt-tui refuses/cannot tell, torch loads)": sum(o.strict for o in self.outcomes),
            "ckpt-tui errors": sum(o.broken for o in self.outcomes),
        }


class _Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Hang


def ours(path: str) -> tuple[str, bool, str]:
    """ckpt-tui's answers: the weights_only verdict, whether ``check`` is clean, and why not."""
    from ckpt_tui.core.errors import CkptError
    from ckpt_tui.core.operations.check import check_checkpoint
    from ckpt_tui.core.readers.open import open_checkpoint
    from ckpt_tui.core.weights_only.verdict import scan_file, verdict_from_scan

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(OUR_SECONDS)
    try:
        judged = verdict_from_scan(scan_file(path), None)
        said = _said(judged)
        try:
            report = check_checkpoint(open_checkpoint(path), progress=lambda done, total: None)
        except CkptError as exc:
            return said, False, _why(judged) or f"check: {exc}"
        judged = report.weights_only or judged
        problems = "; ".join(p.message for p in report.problems)
        return _said(judged), report.ok, _why(judged) or problems
    except _Hang:
        return "error: hang", False, ""
    except Exception as exc:  # a traceback a user would see
        return f"error: {type(exc).__name__}: {exc}"[:300], False, ""
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _why(judged: Any) -> str:
    """What the verdict says stops torch (or what it cannot tell)."""
    unknown = getattr(judged, "unknown", None)
    if judged.reason or not judged.blockers:
        return str(judged.reason or unknown or "")
    return "globals: " + ", ".join(b.name for b in judged.blockers)


def _said(judged: Any) -> str:
    """The verdict's answer in words (``n/a`` where weights_only does not apply)."""
    return {"loads": "loads", "refuses": "refuses", "cannot_tell": "cannot tell"}.get(judged.answer, "n/a")


def judge(paths: list[Path], kinds: list[list[str]] | None = None, first: int = 0) -> list[Outcome]:
    """Judge each file by both sides: torch's in a child process, ckpt-tui's here meanwhile."""
    outcomes = {
        str(path): Outcome(first + number, kinds[number] if kinds else [], str(path))
        for number, path in enumerate(paths)
    }
    child = subprocess.Popen(
        [sys.executable, str(TORCH_SIDE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(json.dumps([[path, _payload(outcome.kinds)] for path, outcome in outcomes.items()]))
    child.stdin.close()
    for outcome in outcomes.values():  # ckpt-tui never runs what it reads: judged in this process
        outcome.ours, outcome.clean, outcome.reason = ours(outcome.path)
    for line in child.stdout:
        answer = json.loads(line)
        outcome = outcomes[answer["path"]]
        outcome.torch_true, outcome.torch_false, outcome.ran = answer["true"], answer["false"], answer["ran"]
    child.wait()
    return list(outcomes.values())


def _payload(kinds: list[str]) -> bool:
    """Whether a file may carry a payload (its ``weights_only=False`` load is then worth running).

    Files judged without their kinds (none given) are all loaded both ways."""
    return not kinds or any(kind.startswith(("gadget", "trick", "zip extra")) for kind in kinds)


def run(seed: int, indices: range, folder: Path, keep: Path | None = None) -> Report:
    """Generate files ``indices`` of run ``seed`` into ``folder``, judge them, compare.

    ``keep``: where to copy the folders of bad and broken outcomes (all are deleted from ``folder``).
    """
    paths, kinds = [], []
    for index in indices:
        made = case(seed, index)
        where = folder / f"case-{index}"
        where.mkdir(parents=True, exist_ok=True)
        (where / made.name).write_bytes(made.data)
        paths.append(where / made.name)
        kinds.append(made.kinds)
    report = Report(judge(paths, kinds, indices.start))
    for outcome in report.outcomes:
        where = Path(outcome.path).parent
        if keep is not None and (outcome.bad or outcome.broken):
            shutil.copytree(where, keep / f"seed-{seed}-{where.name}", dirs_exist_ok=True)
        shutil.rmtree(where, ignore_errors=True)
    return report


def describe(outcome: Outcome) -> str:
    """One line per outcome, for a failing test or the script's log."""
    return json.dumps({**asdict(outcome), "bad": outcome.bad, "strict": outcome.strict})
