"""``convert --sanitize``: outputs load with the real ``torch.load(weights_only=True)``, values unchanged."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_weights_only import ACCEPTED, REFUSED

from ckpt_tui.cli import main
from ckpt_tui.core.edits.sanitize import sanitize
from ckpt_tui.core.errors import WriteError
from ckpt_tui.core.model.tree import Tensor
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.runtime.safe_text import from_printable, printable

HERE = Path(__file__).parent
NOT_SANITIZED = {"functools.partial", "missing storage record", "numpy object array"}
NOT_SANITIZED |= {"record compressed with bzip2", "record compressed with lzma", "record with a bad local header"}
NOT_SANITIZED |= {"a float stride equal to an int one"}  # broken files: no rewrite of values mends them
NO_SAME_PATHS = {"TorchScript archive", "sharded .bin"}
CASES = [name for name in {**REFUSED, **ACCEPTED} if name not in NOT_SANITIZED]


@dataclass
class Outcome:
    """One fixture sanitized: exit code, printed lines, and what real torch says about the output."""

    source: Path
    output: Path
    code: int
    stdout: str
    stderr: str
    oracle: dict[str, Any] | None = None


def run_cli(*args: str) -> tuple[int, str, str]:
    """The CLI in-process, with its output captured."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def run_oracle(jobs: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Load outputs (weights_only=True) and sources (trusted fixtures) with real torch in a fresh process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(HERE / "sanitize_oracle.py")],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=True,
    )
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    """Every sanitizable fixture through ``convert --sanitize``, then through real torch."""
    results: dict[str, Outcome] = {}
    fixtures = {**REFUSED, **ACCEPTED}
    for index, name in enumerate(CASES):
        folder = tmp_path_factory.mktemp(f"s{index}")
        source = fixtures[name](folder)
        output = folder / "sanitized.pth"
        code, stdout, stderr = run_cli("convert", str(source), "-o", str(output), "--sanitize")
        results[name] = Outcome(source, output, code, stdout, stderr)
    jobs = [
        {"source": str(o.source), "output": str(o.output), "compare": name not in NO_SAME_PATHS}
        for name, o in results.items()
        if o.code == 0
    ]
    for job, result in zip(jobs, run_oracle(jobs), strict=True):
        name = next(n for n, o in results.items() if str(o.output) == job["output"])
        results[name].oracle = result
    return results


@pytest.mark.parametrize("name", CASES)
def test_sanitized_output_loads_with_weights_only_and_keeps_every_value(
    outcomes: dict[str, Outcome], name: str
) -> None:
    outcome = outcomes[name]
    assert outcome.code == 0, outcome.stderr
    assert "torch.load(weights_only=True) accepts it" in outcome.stdout
    assert outcome.oracle is not None and outcome.oracle["loads"], outcome.oracle
    assert outcome.oracle["mismatches"] == [], outcome.oracle["mismatches"]


def test_tensor_and_array_values_were_compared(outcomes: dict[str, Outcome]) -> None:
    compared = {name: o.oracle["compared"] for name, o in outcomes.items() if o.oracle}
    assert compared["numpy arrays of many dtypes"] == 10
    assert compared["pickled nn.Module"] == 5  # its state_dict: no non-persistent buffer
    assert compared["every dtype"] == 20


def test_prints_a_line_per_kind_of_rewrite(outcomes: dict[str, Outcome]) -> None:
    assert "numpy array → tensor: 10 (numpy.ndarray)" in outcomes["numpy arrays of many dtypes"].stdout
    assert "namespace → dict: 1 (argparse.Namespace)" in outcomes["argparse.Namespace"].stdout
    assert "nn.Module → its state_dict: 1 (ghost_models.GhostNet)" in outcomes["pickled nn.Module"].stdout
    assert "enum → its value: 2 (builders_weights_only.Color, builders_weights_only.Mode)" in (
        outcomes["int enum and str enum"].stdout
    )
    assert "datetime → ISO 8601 string: 3" in outcomes["datetime"].stdout
    assert "object → dict with __class__: 1 (ghost_config.Config)" in outcomes["custom class"].stdout


def test_rewritten_values(outcomes: dict[str, Outcome]) -> None:
    import torch

    load = lambda name: torch.load(outcomes[name].output, weights_only=True)  # noqa: E731
    assert load("argparse.Namespace")["args"] == {"lr": 1e-3, "arch": "tiny"}
    assert load("pathlib") == {"out": "/runs/7", "files": ["a.txt"]}
    assert load("datetime") == {"saved": "2024-05-01T12:30:00", "took": "P0DT7200S", "day": "2024-05-01"}
    assert load("int enum and str enum") == {"color": 2, "mode": "train"}
    assert load("numpy scalar") == {"best_acc": 0.93, "step": 7, "flag": True}
    assert load("custom class")["config"] == {
        "__class__": "ghost_config.Config",
        "lr": 0.1,
        "layers": [64, 32],
        "name": "run-7",
    }
    if "OmegaConf DictConfig" in outcomes:
        config = load("OmegaConf DictConfig")["hyper_parameters"]
        assert config == {"lr": 0.001, "epochs": 3, "name": "x", "layers": [1, 2], "sub": {"on": True, "none": None}}
    module = load("pickled DataParallel")
    assert list(module) == [  # torch's order: a module's own tensors, then its children's
        "module.scale",
        "module.encoder.0.weight",
        "module.encoder.0.bias",
        "module.head.weight",
        "module.head.bias",
    ]
    assert module._metadata[""] == {"version": 1} and "module.encoder.0" in module._metadata


def test_code_is_refused_with_its_path_then_dropped(tmp_path: Path) -> None:
    source = REFUSED["functools.partial"](tmp_path)
    code, _, stderr = run_cli("convert", str(source), "-o", str(tmp_path / "out.pth"), "--sanitize")
    assert code == 1 and "builtins.max" in stderr and 'ckpt["fn"]' in stderr
    assert "(leave them out with --drop fn, or trust the file)" in stderr  # the option, ready to paste
    assert not (tmp_path / "out.pth").exists()
    code, stdout, stderr = run_cli(
        "convert", str(source), "-o", str(tmp_path / "out.pth"), "--sanitize", "--drop", "fn"
    )
    assert code == 0, stderr
    assert 'dropped (--drop): 1 (ckpt["fn"])' in stdout
    import torch

    assert list(torch.load(tmp_path / "out.pth", weights_only=True)) == ["w"]


def test_object_arrays_are_refused(tmp_path: Path) -> None:
    source = REFUSED["numpy object array"](tmp_path)
    code, _, stderr = run_cli("convert", str(source), "-o", str(tmp_path / "o.pth"), "--sanitize")
    assert code == 1 and "'O8'" in stderr and 'ckpt["ragged"]' in stderr


def test_drop_reaches_inside_objects(tmp_path: Path) -> None:
    source = REFUSED["SimpleNamespace"](tmp_path)
    code, _, stderr = run_cli("convert", str(source), "-o", str(tmp_path / "o.pth"), "--sanitize", "--drop", "cfg/tags")
    assert code == 0, stderr
    import torch

    assert torch.load(tmp_path / "o.pth", weights_only=True) == {"cfg": {"lr": 0.1, "nested": {"k": 1}}}


def test_sanitize_is_a_pure_edit(tmp_path: Path) -> None:
    checkpoint = open_checkpoint(REFUSED["numpy array"](tmp_path))
    before = checkpoint.root["mean"]
    root, change = sanitize(checkpoint.root)
    assert checkpoint.root["mean"] is before, "the source tree is left as it was (undo keeps it)"
    assert isinstance(root["mean"], Tensor) and root["mean"].dtype == "float32" and root["mean"].shape == (3,)
    assert root["model"] is checkpoint.root["model"] or isinstance(root["model"], OrderedDict)
    assert change.count == 1 and change.lines()[1] == "  numpy array → tensor: 1 (numpy.ndarray)"


def test_written_file_is_read_back_with_the_emulation(tmp_path: Path) -> None:
    from ckpt_tui.core.operations.convert import loads_with_weights_only

    refused = REFUSED["argparse.Namespace"](tmp_path)
    with pytest.raises(WriteError, match="still be refused"):
        loads_with_weights_only(refused)


@pytest.mark.parametrize(
    "text", ["plain", "esc\x1b[2J\x1b]0;pwn\x07key", "bidi\u202eabc", "nl\nx", "c1\x9b", "lone\udc80", "é ü 漢"]
)
def test_from_printable_reads_back_what_printable_shows(text: str) -> None:
    assert from_printable(printable(text)) == text


def test_from_printable_keeps_escapes_printable_never_writes() -> None:
    assert from_printable(r"\x41 \u00e9 \x1b") == "\\x41 \\u00e9 \x1b"


class _QuantizedNet(torch.nn.Module):
    """An embedding and two linears, the linears dynamic-quantized (``torch.ao``)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.fc = torch.nn.Linear(4, 3)
        self.fc2 = torch.nn.Linear(3, 2)


def quantized_whole_module() -> torch.nn.Module:
    """``quantize_dynamic`` of :class:`_QuantizedNet`, fixed weights."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(_QuantizedNet(), {torch.nn.Linear}, dtype=torch.qint8)


def test_a_dynamic_quantized_whole_module_keeps_its_packed_weights(tmp_path: Path) -> None:
    model = quantized_whole_module()
    source, output = tmp_path / "whole_module.pth", tmp_path / "s.pth"
    torch.save(model, source)
    code, out, err = run_cli("convert", str(source), "-o", str(output), "--sanitize")
    assert code == 0, err
    assert "9 tensors" in out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = torch.load(output, weights_only=True)
        expected = model.state_dict()
        assert list(loaded) == list(expected)
        fresh = quantized_whole_module()
        fresh.load_state_dict(loaded)
        for key, value in fresh.state_dict().items():
            if isinstance(value, tuple):  # the packed (weight, bias)
                assert all(torch.equal(a, b) for a, b in zip(value, expected[key], strict=True))
            elif isinstance(value, torch.Tensor):
                assert torch.equal(value, expected[key]), key
