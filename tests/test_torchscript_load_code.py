"""A TorchScript archive passes ``check`` only when ``torch.jit.load`` reads it and runs no code from it.

``torch.jit.load`` calls the ``__setstate__`` an archive's own code defines (code from the file: it can write
files through ``torch.from_file(..., shared=True)``); ckpt-tui cannot tell what that code does, so such an
archive is a problem. An archive ``torch.jit.load`` fails on (a checkpoint zip with a stray ``constants.pkl``,
constants that are not a tuple, a root that is no scripted object) is a problem too. Each case is judged against
the real ``torch.jit.load``.
"""

from __future__ import annotations

import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from ckpt_tui.cli import main
from ckpt_tui.core.operations.check import check_checkpoint
from ckpt_tui.core.readers.open import open_checkpoint

ORIGINAL_SETSTATE_END = "    self.training = (state)[2]\n    return None"
WRITING_SETSTATE_END = (
    "    self.training = (state)[2]\n"
    "    t = torch.from_file(self.target, True, 6, dtype=0)\n"
    "    _1 = torch.fill_(t, 65)\n"
    "    self.training = bool(torch.eq(torch.sum(t), -1))\n"
    "    return None"
)


class WithState(nn.Module):
    """A module whose state goes through its own ``__getstate__``/``__setstate__`` (compiled into the archive)."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))
        self.target = target

    @torch.jit.export
    def __getstate__(self) -> tuple[torch.Tensor, str, bool]:
        return (self.w, self.target, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[torch.Tensor, str, bool]) -> None:
        self.w = state[0]
        self.target = state[1]
        self.training = state[2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


def rewrite(source: Path, target: Path, change: Any) -> Path:
    """Copy a zip, each member through ``change(name, data)`` (None drops it)."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as dst:
        for info in src.infolist():
            data = change(info.filename, src.read(info))
            if data is not None:
                dst.writestr(info, data)
    return target


def jit_loads(path: Path) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.jit.load(str(path))
        except Exception:
            return False
    return True


def writing_archive(tmp_path: Path, victim: Path) -> Path:
    """The adversarial F1 archive: its ``__setstate__`` writes 'AAAAAA' over the victim file when loaded."""
    torch.jit.save(torch.jit.script(WithState(str(victim))), str(tmp_path / "plain.pt"))

    def change(name: str, data: bytes) -> bytes | None:
        if name.endswith(".debug_pkl"):
            return None
        if "/code/" in name and name.endswith(".py"):
            changed = data.decode().replace(ORIGINAL_SETSTATE_END, WRITING_SETSTATE_END)
            assert changed != data.decode()
            return changed.encode()
        return data

    return rewrite(tmp_path / "plain.pt", tmp_path / "writes.pt", change)


def test_archive_whose_setstate_writes_a_file_is_a_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("hello world\n")
    path = writing_archive(tmp_path, victim)
    assert jit_loads(path) and victim.read_text() == "AAAAAAworld\n", "torch.jit.load must really run the code"
    victim.write_text("hello world\n")
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "load-runs-code" in out and ".WithState" in out
    assert "load it with torch.jit.load" not in out
    assert victim.read_text() == "hello world\n"


def test_archive_with_a_plain_setstate_is_never_clean(tmp_path: Path) -> None:
    # the setstate torch compiles for the class (assignments only) is still code from the file
    path = tmp_path / "state.pt"
    torch.jit.save(torch.jit.script(WithState(str(tmp_path / "unused"))), str(path))
    assert jit_loads(path)
    report = check_checkpoint(open_checkpoint(path))
    assert [p.kind for p in report.problems] == ["load-runs-code"]
    assert report.weights_only is not None and report.weights_only.answer == "refuses"


def statically_quantized() -> torch.jit.ScriptModule:
    import torch.ao.quantization as q

    torch.manual_seed(0)
    model = nn.Sequential(q.QuantStub(), nn.Conv2d(1, 2, 3), nn.ReLU(), q.DeQuantStub()).eval()
    model.qconfig = q.get_default_qconfig("fbgemm")
    prepared = q.prepare(model)
    prepared(torch.randn(4, 1, 5, 5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.script(q.convert(prepared))


def test_statically_quantized_script_runs_its_conv_setstate_and_says_so(tmp_path: Path) -> None:
    # torch's own quantized Conv2d compiles a __setstate__ that calls more of the archive's code
    # (set_weight_bias): honest answer, torch.jit.load runs code from the file
    path = tmp_path / "qconv.pt"
    statically_quantized().save(str(path))
    assert jit_loads(path)
    problems = check_checkpoint(open_checkpoint(path)).problems
    assert [p.kind for p in problems] == ["load-runs-code"]
    assert "quantized.modules.conv.Conv2d" in problems[0].message


def stray_constants(tmp_path: Path, constants: bytes, *, with_code: bool = False) -> Path:
    """A torch.save checkpoint zip plus an ``archive/constants.pkl`` (and an empty code file)."""
    path = tmp_path / "ckpt.pth"
    torch.save({"w": torch.tensor([1.0, 2.0, 3.0])}, path)

    def keep(name: str, data: bytes) -> bytes:
        return data

    out = rewrite(path, tmp_path / "stray.pth", keep)
    with zipfile.ZipFile(out, "a") as archive:
        folder = archive.namelist()[0].split("/")[0]
        archive.writestr(f"{folder}/constants.pkl", constants)
        if with_code:
            archive.writestr(f"{folder}/code/__torch__.py", "")
    return out


@pytest.mark.parametrize("with_code", [False, True], ids=["no code", "empty code"])
def test_checkpoint_with_a_stray_constants_member_is_a_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], with_code: bool
) -> None:
    path = stray_constants(tmp_path, pickle.dumps((), protocol=2), with_code=with_code)
    assert not jit_loads(path)
    with pytest.raises(RuntimeError):
        torch.load(path, weights_only=True)
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "torch.jit.load fails" in out and "load it with torch.jit.load" not in out


def scripted_with(tmp_path: Path, name: str, *, constants: Any = None, root_pickle: bytes | None = None) -> Path:
    """A real scripted module, its constants.pkl or data.pkl replaced."""
    torch.jit.save(torch.jit.script(nn.Sequential(nn.Linear(2, 2))), str(tmp_path / "plain.pt"))

    def change(member: str, data: bytes) -> bytes:
        if member.endswith("/constants.pkl") and constants is not None:
            return pickle.dumps(constants, protocol=2)
        if member.endswith("/data.pkl") and root_pickle is not None:
            return root_pickle
        return data

    return rewrite(tmp_path / "plain.pt", tmp_path / name, change)


CASES: dict[str, dict[str, Any]] = {
    "as saved": {},
    "constants an empty tuple": {"constants": ()},
    "constants a tuple of values": {"constants": (1, "a", 2.5)},
    "constants a list": {"constants": []},
    "constants a dict": {"constants": {}},
    "constants None": {"constants": None, "root_pickle": None},
    "root a dict": {"root_pickle": pickle.dumps({"a": 1}, protocol=2)},
    "root a list": {"root_pickle": pickle.dumps([1, 2], protocol=2)},
    "root None": {"root_pickle": pickle.dumps(None, protocol=2)},
    "root an int": {"root_pickle": pickle.dumps(3, protocol=2)},
}


@pytest.mark.parametrize("case", list(CASES))
def test_check_passes_a_script_archive_exactly_when_torch_jit_load_reads_it(tmp_path: Path, case: str) -> None:
    options = dict(CASES[case])
    if case == "constants None":
        options = {}
    path = scripted_with(tmp_path, "case.pt", **options)
    report = check_checkpoint(open_checkpoint(path))
    assert report.ok == jit_loads(path), [p.message for p in report.problems]


RENAMED_CODE = {
    "code/ as CODE/": (b"plain/code/", b"plain/CODE/"),
    "__torch__/ as __TORCH__/": (b"plain/code/__torch__/", b"plain/code/__TORCH__/"),
    "the module's file in mixed case": (
        b"code/__torch__/test_torchscript_load_code.py",
        b"Code/__Torch__/TEST_torchscript_load_code.PY",
    ),
    "__torch__/ as __torcx__/ (torch finds no code)": (b"plain/code/__torch__/", b"plain/code/__torcx__/"),
}
"""Same-length renames of the code files (archive folder ``plain/``), in local headers and central directory alike."""


def jit_load_in_child(path: Path) -> bool:
    """Whether the real ``torch.jit.load`` reads ``path``, in a child process (its code runs there)."""
    import subprocess
    import sys

    run = [sys.executable, "-c", "import sys, torch; torch.jit.load(sys.argv[1])", str(path)]
    return subprocess.run(run, capture_output=True, timeout=300, check=False).returncode == 0


@pytest.mark.parametrize("case", list(RENAMED_CODE))
def test_code_files_are_found_as_torch_jit_load_finds_them(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # torch asks its zip reader for code/<qualifier>.py by name: miniz compares names with ASCII letters lowered
    victim = tmp_path / "victim.txt"
    victim.write_text("hello world\n")
    old, new = RENAMED_CODE[case]
    data = writing_archive(tmp_path, victim).read_bytes()
    assert data.count(old) >= 2
    path = tmp_path / "renamed.pt"
    path.write_bytes(data.replace(old, new))
    loads = jit_load_in_child(path)
    ran = victim.read_text() == "AAAAAAworld\n"
    assert ran == loads and loads == ("torcx" not in case), "the canary: torch.jit.load runs the file's code"
    victim.write_text("hello world\n")
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert victim.read_text() == "hello world\n"
    if ran:
        assert "load-runs-code" in out and ".WithState" in out
        assert "torch.jit.load fails" not in out
    else:
        assert "torch.jit.load fails" in out
