"""Time and memory follow the file's size, not its number of paths (issue 9 §4), and wrong types
get one line (issue 9 §3).

Each command runs in a child process with a wall-clock guard and an address-space cap, so a walk
that followed every path (2**60 of them in a 20 KB file) fails the test instead of hanging it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

GUARD_SECONDS = 240  # a hang guard, not a timing assertion: linear walks take well under a second
MEMORY_CAP = 3 << 30


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    cap = f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_CAP}, {MEMORY_CAP}))"
    code = f"{cap}; import sys; from ckpt_tui.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=GUARD_SECONDS, env=env
    )


def shared_modules(depth: int) -> nn.Module:
    """A module whose two children are one module, ``depth`` levels down: 2**depth paths to the leaf."""
    module: nn.Module = nn.Linear(2, 2)
    for _ in range(depth):
        parent = nn.Module()
        parent.left = module
        parent.right = module
        module = parent
    return module


def shared_lists(depth: int) -> dict[str, object]:
    """Lists that each hold the one before twice: 2**depth paths to one tensor."""
    value: object = [torch.ones(2)]
    for _ in range(depth):
        value = [value, value]
    return {"w": torch.zeros(3), "laughs": value}


def assert_fine(result: subprocess.CompletedProcess[str], codes: tuple[int, ...] = (0, 1)) -> None:
    assert result.returncode in codes, result.stderr[-500:]
    assert "Traceback" not in result.stderr and "MemoryError" not in result.stderr


def test_modules_sharing_children_sixty_levels_deep_are_walked_once(tmp_path: Path) -> None:
    path = tmp_path / "shared_modules.pth"
    torch.save(shared_modules(60), path)
    assert path.stat().st_size < 50_000
    for command in (["info", str(path)], ["info", "--json", str(path)], ["check", str(path)]):
        assert_fine(run_cli(*command))
    assert_fine(run_cli("convert", str(path), "-o", str(tmp_path / "out.pth"), "--extract", "auto"), (0, 1, 2))


def test_shared_lists_repeated_in_a_dict_are_walked_once(tmp_path: Path) -> None:
    path = tmp_path / "shared_lists.pth"
    torch.save(shared_lists(60), path)
    for command in (["info", str(path)], ["info", "--json", str(path)], ["check", str(path)]):
        assert_fine(run_cli(*command))
    result = run_cli("convert", str(path), "-o", str(tmp_path / "out.pth"))
    assert_fine(result, (0,))
    assert (tmp_path / "out.pth").stat().st_size < 4 * path.stat().st_size


@pytest.mark.parametrize(
    "edit",
    [
        ["--map-location", "cpu"],
        ["--dtype", "fp16"],
        ["--strip-prefix", "a."],
        ["--add-prefix", "module."],
        [],
    ],
    ids=["map-location", "dtype", "strip-prefix", "add-prefix", "plain"],
)
def test_a_dict_that_contains_itself_goes_through_every_edit(tmp_path: Path, edit: list[str]) -> None:
    state: dict[str, object] = {"a.w": torch.ones(2), "a.b": torch.zeros(3)}
    state["self"] = state
    path = tmp_path / "self.pth"
    torch.save(state, path)
    assert_fine(run_cli("info", str(path)))
    result = run_cli("convert", str(path), "-o", str(tmp_path / "out.pth"), *edit)
    assert_fine(result, (0, 1, 2))  # written, or "nothing to change" / a refusal, in one line
    assert result.stderr.count("\n") <= 1


def test_a_module_that_contains_itself_is_shown_once(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    model._modules["loop"] = model  # a cycle nn.Module allows
    path = tmp_path / "loop.pth"
    torch.save(model, path)
    for command in (["info", str(path)], ["check", str(path)], ["info", "--json", str(path)]):
        assert_fine(run_cli(*command))
    assert_fine(run_cli("convert", str(path), "-o", str(tmp_path / "out.pth"), "--extract", "auto"), (0, 1, 2))


HUGE = 10**5000  # beyond CPython's 4,300-digit int-to-str limit


@pytest.mark.parametrize(
    "value",
    [{"step": HUGE}, {HUGE: torch.ones(1)}, {"w": torch.ones(1), "n": [1, -HUGE]}],
    ids=["value", "key", "nested"],
)
def test_ints_beyond_the_digit_limit_never_give_a_traceback(tmp_path: Path, value: dict) -> None:
    path = tmp_path / "huge.pth"
    torch.save(value, path)
    for command in (["info", str(path)], ["info", "--json", str(path)], ["check", str(path)]):
        assert_fine(run_cli(*command), (0, 1, 2))
    assert_fine(run_cli("convert", str(path), "-o", str(tmp_path / "out.pth")), (0, 2))
    assert_fine(run_cli("diff", str(path), str(path)), (0, 1, 2))


def test_a_shape_whose_element_count_overflows_is_one_line(tmp_path: Path) -> None:
    from builders_readers import write_view_file

    path = write_view_file(tmp_path / "big.pth", 0, (2**62, 2**62, 2**62), (0, 0, 0))
    for command in (["info", str(path)], ["info", "--json", str(path)], ["check", str(path)]):
        result = run_cli(*command)
        assert_fine(result, (0, 1, 2))


def test_non_persistent_buffers_that_are_not_a_set_are_data(tmp_path: Path) -> None:
    model = nn.BatchNorm1d(2)
    model.__dict__["_non_persistent_buffers_set"] = ["running_mean", {"x": 1}]
    path = tmp_path / "odd_buffers.pth"
    torch.save(model, path)
    for command in (["info", str(path)], ["check", str(path)]):
        assert_fine(run_cli(*command), (0, 1, 2))
    assert_fine(run_cli("convert", str(path), "-o", str(tmp_path / "out.pth"), "--extract", "auto"), (0, 1, 2))


def test_the_repr_of_an_opened_hostile_tree_is_bounded(tmp_path: Path) -> None:
    """Textual describes a worker by the repr of its arguments: a checkpoint's must not walk its paths."""
    from ckpt_tui.core.edits.session import Session
    from ckpt_tui.core.operations.info import summarize
    from ckpt_tui.core.readers.open import open_checkpoint

    path = tmp_path / "shared.pth"
    torch.save(shared_modules(60), path)
    checkpoint = open_checkpoint(str(path))
    for value in (checkpoint, Session(checkpoint), summarize(checkpoint)):
        assert len(repr(value)) < 10 * path.stat().st_size  # linear in the file, not in its 2**60 paths


def test_every_browser_worker_is_described_without_the_repr_of_its_arguments() -> None:
    """``@work`` without ``description=`` reprs every argument (a tree of 2**60 paths) on the UI thread."""
    import ast

    tui = Path(__file__).parents[1] / "ckpt_tui" / "tui"
    undescribed = []
    for source in tui.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            is_work = isinstance(node, ast.Call) and getattr(node.func, "id", "") == "work"
            if is_work and not any(keyword.arg == "description" for keyword in node.keywords):
                undescribed.append(f"{source.name}:{node.lineno}")
    assert not undescribed


def test_state_dicts_holding_a_tensor_with_metadata_or_hooks_read_in_bulk_and_one_by_one_alike(tmp_path: Path) -> None:
    """A conj view (pickled with metadata ``{'conj': True}``) among many tensors: the bulk walk and checks
    step aside (the metadata dict is never hashed) and every command answers as for a small file."""
    from ckpt_tui.cli import main

    state = {f"w{i}": torch.randn(4) for i in range(100)}
    state["c"] = torch.randn(4, dtype=torch.complex64).conj()
    torch.save(state, tmp_path / "conj.pth")
    assert torch.load(tmp_path / "conj.pth", weights_only=True)["c"].is_conj()
    for command in (["info"], ["check"], ["stats"], ["info", "--json"]):
        assert main([*command, str(tmp_path / "conj.pth")]) == 0
