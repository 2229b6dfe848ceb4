"""``convert --dtype`` casts what it names (the model's weights, or ``--at``), and only there: a tensor
object the file also holds elsewhere (``ema = dict(model.state_dict())``, optimizer state holding a weight)
keeps its dtype there, and the dry run and the report say so. Checked with the real ``torch.load``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ckpt_tui.cli import main


def _ema_file(path: Path) -> Path:
    torch.manual_seed(0)
    state = torch.nn.Linear(2, 2).state_dict()
    torch.save({"model": state, "ema": dict(state), "epoch": 1}, path)
    return path


def test_a_shallow_copied_ema_keeps_its_dtype_and_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _ema_file(tmp_path / "ema.pth")
    out = tmp_path / "ema16.pth"
    assert main(["convert", str(source), "-o", str(out), "--dtype", "fp16"]) == 0
    said = capsys.readouterr().out
    assert 'ckpt["ema"]["weight"]' in said and "keep their dtype" in said
    before, after = torch.load(source, weights_only=True), torch.load(out, weights_only=True)
    assert {t.dtype for t in after["model"].values()} == {torch.float16}
    for key, tensor in before["ema"].items():
        assert after["ema"][key].dtype == torch.float32
        assert torch.equal(after["ema"][key], tensor)
        assert torch.equal(after["model"][key], tensor.half())


def test_the_dry_run_says_what_stays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _ema_file(tmp_path / "ema.pth")
    out = tmp_path / "never.pth"
    assert main(["convert", str(source), "-o", str(out), "--dtype", "fp16", "--dry-run"]) == 0
    said = capsys.readouterr().out
    assert "2 changed" in said and "2 tensors elsewhere" in said and "keep their dtype" in said
    assert not out.exists()


def test_optimizer_state_holding_the_same_tensor_keeps_its_dtype(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    weight = torch.arange(4, dtype=torch.float32)
    source = tmp_path / "src.pth"
    torch.save({"model": {"module.b": weight}, "opt": {"m": weight}}, source)
    out = tmp_path / "out.pth"
    assert main(["convert", str(source), "-o", str(out), "--dtype", "fp16", "--at", "model"]) == 0
    assert 'ckpt["opt"]["m"]' in capsys.readouterr().out
    loaded = torch.load(out, weights_only=True)
    assert loaded["model"]["module.b"].dtype == torch.float16
    assert loaded["opt"]["m"].dtype == torch.float32 and torch.equal(loaded["opt"]["m"], weight)


def test_a_tensor_held_twice_inside_the_scope_is_cast_once_and_stays_shared(tmp_path: Path) -> None:
    weight = torch.ones(3)
    source = tmp_path / "tied.pth"
    torch.save({"model": {"emb.weight": weight, "head.weight": weight}}, source)
    out = tmp_path / "out.pth"
    assert main(["convert", str(source), "-o", str(out), "--dtype", "bf16"]) == 0
    loaded = torch.load(out, weights_only=True)["model"]
    assert loaded["emb.weight"].dtype == torch.bfloat16
    assert loaded["emb.weight"].untyped_storage().data_ptr() == loaded["head.weight"].untyped_storage().data_ptr()
