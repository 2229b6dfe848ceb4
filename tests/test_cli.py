"""The CLI contract: JSON fields, exit codes, one-line errors, and what it imports."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from builders import ddp_state_dict, rewrite_zip, save_cuda_tagged, tiny_state_dict, training_checkpoint

from ckpt_tui.cli import main


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code = main(list(args))
    return code, json.loads(capsys.readouterr().out)


def test_info_json_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save_cuda_tagged(training_checkpoint(), tmp_path / "train.pth")
    code, info = run_json(capsys, "info", "--json", str(path))
    assert code == 0
    assert info["format"] == "zip"
    assert info["file_bytes"] == path.stat().st_size
    tensors = info["tensors"]
    assert info["tensor_count"] == len(tensors) == 9 + 18 + 0
    assert info["parameter_count"] == sum(math.prod(t["shape"]) for t in tensors)
    assert info["devices"] == {"cuda:0": len(tensors)}
    assert info["dtypes"] == {"float32": 26, "int64": 1}
    first = tensors[0]
    assert first["path"] == ["model", "module.conv.weight"]
    assert first["shape"] == [8, 3, 3, 3] and first["dtype"] == "float32" and first["device"] == "cuda:0"
    assert first["nbytes"] == 8 * 3 * 3 * 3 * 4 and isinstance(first["storage"], str)
    kinds = {f["kind"] for f in info["findings"]}
    assert {"prefix", "inner-state-dict", "optimizer", "cuda-tensors"} <= kinds
    prefix = next(f for f in info["findings"] if f["kind"] == "prefix")
    assert prefix["prefix"] == "module." and prefix["path"] == ["model"]


def test_info_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(ddp_state_dict(), tmp_path / "ddp.pth")
    assert main(["info", str(tmp_path / "ddp.pth")]) == 0
    out = capsys.readouterr().out
    assert "torch zip checkpoint" in out
    assert "start with 'module.'" in out
    assert "module.head.weight  Tensor [10, 8] float32 cpu" in out


def test_check_clean_and_nan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(tiny_state_dict(), tmp_path / "ok.pth")
    assert main(["check", str(tmp_path / "ok.pth")]) == 0
    state = tiny_state_dict()
    state["head.bias"][3] = float("nan")
    state["head.weight"][0, 0] = float("inf")
    torch.save(state, tmp_path / "nan.pth")
    capsys.readouterr()
    code, report = run_json(capsys, "check", "--json", str(tmp_path / "nan.pth"))
    assert code == 1 and not report["ok"]
    by_path = {tuple(p["path"]): p for p in report["problems"]}
    assert by_path[("head.bias",)]["nan"] == 1
    assert by_path[("head.weight",)]["inf"] == 1


def test_check_missing_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(tiny_state_dict(), tmp_path / "full.pth")
    broken = rewrite_zip(tmp_path / "full.pth", tmp_path / "broken.pth", drop="data/2")
    assert main(["check", str(broken)]) == 1
    out = capsys.readouterr().out
    assert "missing" in out and "data/2" in out


def bad_inputs(tmp_path: Path) -> dict[str, Path]:
    torch.save(tiny_state_dict(), tmp_path / "good.pth")
    good = (tmp_path / "good.pth").read_bytes()
    (tmp_path / "empty.pth").write_bytes(b"")
    (tmp_path / "truncated.pth").write_bytes(good[: len(good) // 2])
    (tmp_path / "random.pth").write_bytes(os.urandom(4096))
    (tmp_path / "notes.pth").write_text("these are not weights\n")
    (tmp_path / "folder").mkdir()
    (tmp_path / "header.safetensors").write_bytes((10**9).to_bytes(8, "little") + b"{}")
    (tmp_path / "cut.safetensors").write_bytes((40).to_bytes(8, "little") + b'{"a":{"dtype":"F32","shape":[4],')
    legacy = tmp_path / "legacy.pth"
    torch.save(tiny_state_dict(), legacy, _use_new_zipfile_serialization=False)
    (tmp_path / "legacy_cut.pth").write_bytes(legacy.read_bytes()[:300])
    return {
        "missing": tmp_path / "nope.pth",
        "directory": tmp_path / "folder",
        **{p.stem: p for p in tmp_path.iterdir() if p.stem in {"empty", "truncated", "random", "notes"}},
        "header": tmp_path / "header.safetensors",
        "cut": tmp_path / "cut.safetensors",
        "legacy_cut": tmp_path / "legacy_cut.pth",
    }


@pytest.mark.parametrize("command", ["info", "check"])
def test_bad_inputs_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    for name, path in bad_inputs(tmp_path).items():
        assert main([command, str(path)]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("ckpt-tui: ") and err.count("\n") == 1, (name, err)
        assert "Traceback" not in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_permissions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(tiny_state_dict(), tmp_path / "locked.pth")
    (tmp_path / "locked.pth").chmod(0)
    assert main(["info", str(tmp_path / "locked.pth")]) == 2
    assert "permission denied" in capsys.readouterr().err


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)


def test_help_imports_neither_torch_nor_textual() -> None:
    code = (
        "import sys; from ckpt_tui.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules and 'textual' not in sys.modules and 'numpy' not in sys.modules"
    )
    result = run("-c", code)
    assert result.returncode == 0, result.stderr
    assert "ckpt-tui FILE" in result.stdout


def test_core_never_imports_textual() -> None:
    code = (
        "import sys, pkgutil, importlib, ckpt_tui.core\n"
        "for m in pkgutil.iter_modules(ckpt_tui.core.__path__):\n"
        "    importlib.import_module('ckpt_tui.core.' + m.name)\n"
        "assert 'textual' not in sys.modules, 'core imported textual'"
    )
    result = run("-c", code)
    assert result.returncode == 0, result.stderr


def test_info_does_not_import_torch(tmp_path: Path) -> None:
    torch.save(ddp_state_dict(), tmp_path / "ddp.pth")
    code = (
        "import sys; from ckpt_tui.cli import main\n"
        f"assert main(['info', '--json', {str(tmp_path / 'ddp.pth')!r}]) == 0\n"
        "assert 'torch' not in sys.modules"
    )
    result = run("-c", code)
    assert result.returncode == 0, result.stderr


def test_python_dash_m(tmp_path: Path) -> None:
    torch.save(ddp_state_dict(), tmp_path / "ddp.pth")
    result = run("-m", "ckpt_tui", "info", "--json", str(tmp_path / "ddp.pth"))
    assert result.returncode == 0 and json.loads(result.stdout)["tensor_count"] == 9
    bad = run("-m", "ckpt_tui", "info", str(tmp_path / "nothing.pth"))
    assert (
        bad.returncode == 2 and bad.stderr.strip() == f"ckpt-tui: {tmp_path / 'nothing.pth'}: no such file or directory"
    )
