"""Differential testing against the real torch: a fixed-seed slice of generated files, each judged by
ckpt-tui and by ``torch.load`` (``weights_only=True`` and ``False``) in sandboxed children.

The bar: no file where ckpt-tui says "loads" (or ``check`` is clean) while torch refuses it or runs
code from it; no traceback or hang in ckpt-tui. ``scripts/differential.py --count 20000`` runs the long
version of the same comparison.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from differential.generator import GADGETS, NOT_RUN_BY_PICKLE, case, gadget_case
from differential.run import Report, describe, judge, run

from ckpt_tui.cli import main

SEED = 2113
COUNT = 240


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    return run(SEED, range(COUNT), tmp_path_factory.mktemp("differential"))


def test_ckpt_tui_never_says_loads_where_torch_refuses_or_runs_code(report: Report) -> None:
    bad = [describe(o) for o in report.outcomes if o.bad]
    assert not bad, "\n".join(bad[:10])


def test_ckpt_tui_gives_an_answer_for_every_generated_file(report: Report) -> None:
    broken = [describe(o) for o in report.outcomes if o.broken]
    assert not broken, "\n".join(broken[:10])


def test_the_slice_holds_files_torch_loads_refuses_and_runs(report: Report) -> None:
    counts = report.counts()
    torch_says = counts["torch weights_only=True"]
    # a slice that only refuses (or only loads) would compare nothing
    assert torch_says.get("loads", 0) >= COUNT // 5 and torch_says.get("refuses", 0) >= COUNT // 5, counts
    assert counts["code ran (weights_only=False)"] >= 3, counts


def test_the_slice_holds_members_torch_reads_unwritten(report: Report) -> None:
    # each is "bad" (above) if ckpt-tui calls it loading or clean: torch.load returns uninitialised memory
    assert sum(o.unwritten for o in report.outcomes) >= 3, report.counts()


def test_generated_files_are_the_same_for_the_same_seed() -> None:
    assert [case(SEED, i).data for i in range(20)] == [case(SEED, i).data for i in range(20)]


def test_every_gadget_runs_under_weights_only_false_and_is_refused(tmp_path: Path) -> None:
    """Each stdlib gadget or opcode trick, alone in a zip checkpoint: torch refuses it, pickle runs it,
    ckpt-tui refuses it and ``check`` is not clean."""
    paths = {}
    for name in sorted(GADGETS):
        folder = tmp_path / name.replace(" ", "_")
        folder.mkdir()
        made = gadget_case(name)
        (folder / made.name).write_bytes(made.data)
        paths[name] = folder / made.name
    outcomes = judge(list(paths.values()))
    for name, outcome in zip(paths, outcomes, strict=True):
        assert outcome.torch_true.startswith("refuses"), (name, describe(outcome))
        assert outcome.ran == (name not in NOT_RUN_BY_PICKLE), (name, describe(outcome))
        assert outcome.ours == "refuses" and not outcome.clean, (name, describe(outcome))
        assert main(["check", outcome.path]) == 1, name  # refused and unsafe: exit 1, not a read error
