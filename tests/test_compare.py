"""Compare a checkpoint with a model or another checkpoint; diff two checkpoints (real DDP ranks too)."""

from __future__ import annotations

import json
import os
import socket
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from builders import (
    compiled_state_dict,
    ddp_state_dict,
    lightning_checkpoint,
    tiny_state_dict,
    training_checkpoint,
)

from ckpt_tui.cli import main
from ckpt_tui.core.operations.compare import compare, fold_keys, reference_from_text, reference_from_tree
from ckpt_tui.core.readers.open import open_checkpoint


def check_json(capsys, *args: str) -> tuple[int, dict]:
    code = main(["check", *map(str, args), "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture
def plain(tmp_path: Path) -> Path:
    torch.save(tiny_state_dict(), tmp_path / "plain.pth")
    return tmp_path / "plain.pth"


def test_ddp_against_plain_suggests_strip(tmp_path: Path, plain: Path, capsys) -> None:
    torch.save(ddp_state_dict(), tmp_path / "ddp.pth")
    code, report = check_json(capsys, tmp_path / "ddp.pth", "--against", plain)
    assert code == 1
    assert len(report["missing"]) == 9 and len(report["unexpected"]) == 9
    assert report["suggestion"]["steps"] == ["strip 'module.'"]
    assert report["suggestion"]["matched"] == 9
    assert report["suggestion"]["command"].endswith("--strip-prefix module.")


def test_training_checkpoint_suggests_extract_then_strip(tmp_path: Path, plain: Path, capsys) -> None:
    torch.save(training_checkpoint(), tmp_path / "train.pth")
    code, report = check_json(capsys, tmp_path / "train.pth", "--against", plain)
    assert code == 1
    assert report["suggestion"]["steps"] == ["extract model", "strip 'module.'"]
    assert "9/9 keys match, 0 shape mismatches" in report["suggestion"]["message"]
    command = report["suggestion"]["command"].split()
    assert command[command.index("--extract") + 1] == "model"
    fixed = tmp_path / "fixed.pth"
    assert main(["convert", str(tmp_path / "train.pth"), "-o", str(fixed), *command[command.index("--extract") :]]) == 0
    capsys.readouterr()
    assert main(["check", str(fixed), "--against", str(plain)]) == 0


def test_compiled_and_lightning(tmp_path: Path, plain: Path, capsys) -> None:
    torch.save(compiled_state_dict(), tmp_path / "compiled.pth")
    _, report = check_json(capsys, tmp_path / "compiled.pth", "--against", plain)
    assert report["suggestion"]["steps"] == ["strip '_orig_mod.'"]
    torch.save(lightning_checkpoint(), tmp_path / "l.ckpt")
    _, report = check_json(capsys, tmp_path / "l.ckpt", "--against", plain)
    assert report["suggestion"]["steps"] == ["extract state_dict", "strip 'model.'"]


def test_plain_against_ddp_suggests_add(tmp_path: Path, plain: Path, capsys) -> None:
    torch.save(ddp_state_dict(), tmp_path / "ddp.pth")
    _, report = check_json(capsys, plain, "--against", tmp_path / "ddp.pth")
    assert report["suggestion"]["steps"] == ["add 'module.'"]


def test_classifier_head_shape_mismatch(tmp_path: Path, plain: Path, capsys) -> None:
    torch.save(tiny_state_dict(classes=81), tmp_path / "coco.pth")
    code, report = check_json(capsys, tmp_path / "coco.pth", "--against", plain)
    assert code == 1 and not report["missing"] and not report["unexpected"]
    assert report["shape_mismatches"] == [
        {"key": "head.weight", "checkpoint": [81, 8], "reference": [10, 8]},
        {"key": "head.bias", "checkpoint": [81], "reference": [10]},
    ]
    assert main(["check", str(tmp_path / "coco.pth"), "--against", str(plain)]) == 1
    out = capsys.readouterr().out
    assert "head.weight: [81, 8] vs [10, 8]" in out and "--drop head.weight --drop head.bias" in out


def test_matching_file_exits_0(plain: Path, capsys) -> None:
    assert main(["check", str(plain), "--against", str(plain)]) == 0
    assert capsys.readouterr().out.startswith("OK: 9/9")


def test_model_factory_in_a_temporary_module(tmp_path: Path, capsys, monkeypatch) -> None:
    (tmp_path / "mymodels.py").write_text(
        textwrap.dedent("""
        import torch.nn as nn
        def build():
            return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    """)
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    state = torch.nn.DataParallel(
        torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    ).state_dict()
    torch.save(state, tmp_path / "dp.pth")
    code, report = check_json(capsys, tmp_path / "dp.pth", "--model", "mymodels:build")
    assert code == 1 and report["suggestion"]["steps"] == ["strip 'module.'"]
    assert main(["check", str(tmp_path / "dp.pth"), "--model", "mymodels:nothing"]) == 2
    assert "nothing" in capsys.readouterr().err


def test_keys_file_reference(tmp_path: Path) -> None:
    text = "# keys\nconv.weight [8, 3, 3, 3] float32\nconv.bias (8,)\nhead.weight 10x8\nhead.bias\n"
    reference = reference_from_text(text)
    assert reference["conv.weight"].shape == (8, 3, 3, 3) and reference["conv.weight"].dtype == "float32"
    assert reference["head.weight"].shape == (10, 8) and reference["head.bias"].shape is None
    torch.save(tiny_state_dict(), tmp_path / "plain.pth")
    report = compare(open_checkpoint(tmp_path / "plain.pth").root, reference)
    assert report.matched == 4 and set(report.unexpected) == {
        "bn.weight",
        "bn.bias",
        "bn.running_mean",
        "bn.running_var",
        "bn.num_batches_tracked",
    }


def test_fold_keys() -> None:
    keys = [f"layers.{i}.attn.q.weight" for i in range(32)] + ["layers.40.attn.q.weight", "head.weight"]
    assert fold_keys(keys) == ["layers.{0..31,40}.attn.q.weight", "head.weight"]


def test_fold_keys_lists_short_runs_as_a_shell_brace_list() -> None:
    keys = [f"features.{i}.weight" for i in (0, 1, 3, 4, 6, 7, 8, 10, 11, 12, 13)]
    assert fold_keys(keys) == ["features.{0,1,3,4,6,7,8,10..13}.weight"]


def test_reference_from_module_pickle(tmp_path: Path) -> None:
    from builders import save_whole_module

    reference = reference_from_tree(open_checkpoint(save_whole_module(tmp_path / "w.pt")).root)
    assert list(reference) == ["scale", "encoder.0.weight", "encoder.0.bias", "head.weight", "head.bias"]


# ---- diff ---------------------------------------------------------------------------------


def test_diff_prefix_normalised(tmp_path: Path, plain: Path, capsys) -> None:
    torch.save(ddp_state_dict(), tmp_path / "ddp.pth")
    assert main(["diff", str(tmp_path / "ddp.pth"), str(plain)]) == 1
    capsys.readouterr()
    assert main(["diff", str(tmp_path / "ddp.pth"), str(plain), "--strip-prefix", "module."]) == 0
    assert "identical" in capsys.readouterr().out


def test_diff_values(tmp_path: Path, capsys) -> None:
    state = tiny_state_dict()
    torch.save(state, tmp_path / "a.pth")
    state["head.weight"] = state["head.weight"] + 0.5
    state["conv.bias"] = state["conv.bias"] + 1e-9
    torch.save(state, tmp_path / "b.pth")
    code = main(["diff", str(tmp_path / "a.pth"), str(tmp_path / "b.pth"), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    changes = {c["key"]: c for c in report["value_changes"]}
    assert changes["head.weight"]["max_abs_diff"] == pytest.approx(0.5)
    assert not changes["head.weight"]["allclose"]
    assert changes["conv.bias"]["allclose"]
    assert report["identical_tensors"] == 7


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


DDP_SCRIPT = """
import os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
sys.path.insert(0, sys.argv[3])
from builders import TinyNet, leave_process_group
rank, folder = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", rank=rank, world_size=2)
torch.manual_seed(0)
model = DDP(TinyNet())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(4, 3, 6, 6)).sum().backward()  # the same batch on both ranks
opt.step()
torch.save(model.state_dict(), f"{folder}/rank{rank}.pth")
torch.manual_seed(rank)
model(torch.randn(4, 3, 6, 6)).sum().backward()  # each rank its own batch: BN running stats diverge
opt.step()
torch.save(model.state_dict(), f"{folder}/rank{rank}_own.pth")
dist.barrier()
if rank == 1:
    with torch.no_grad():
        for p in model.module.parameters():
            p.add_(0.25)
    torch.save(model.state_dict(), f"{folder}/rank{rank}_more.pth")
leave_process_group()
"""


def test_two_ddp_ranks(tmp_path: Path, capsys) -> None:
    import subprocess

    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "GLOO_SOCKET_IFNAME": "lo"}
    script = tmp_path / "ddp_run.py"
    script.write_text(DDP_SCRIPT)
    tests = str(Path(__file__).parent)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(tmp_path), tests],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for rank in (0, 1)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err.decode()[-2000:]
    assert main(["diff", str(tmp_path / "rank0.pth"), str(tmp_path / "rank1.pth")]) == 0
    assert "identical: 9 tensors" in capsys.readouterr().out
    assert main(["diff", str(tmp_path / "rank0_own.pth"), str(tmp_path / "rank1_own.pth"), "--json"]) == 1
    own = json.loads(capsys.readouterr().out)
    # gradients are all-reduced, so weights agree; BatchNorm running stats are per-rank buffers
    assert {c["key"] for c in own["value_changes"]} == {"module.bn.running_mean", "module.bn.running_var"}
    code = main(["diff", str(tmp_path / "rank1_own.pth"), str(tmp_path / "rank1_more.pth"), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    changed = {c["key"]: c["max_abs_diff"] for c in report["value_changes"]}
    assert changed["module.head.weight"] == pytest.approx(0.25)
    assert set(changed) == {
        "module.conv.weight",
        "module.conv.bias",
        "module.bn.weight",
        "module.bn.bias",
        "module.head.weight",
        "module.head.bias",
    }


# ---- every suggestion, pasted --------------------------------------------------------------


def keys_file(tmp: Path) -> Path:
    lines = [f"{k} {list(v.shape)} {str(v.dtype).removeprefix('torch.')}" for k, v in tiny_state_dict().items()]
    tmp.write_text("\n".join(lines) + "\n")
    return tmp


def dp_module(tmp: Path) -> Path:
    from builders import save_whole_module

    return save_whole_module(tmp, data_parallel=True)


def whole_module(tmp: Path) -> Path:
    from builders import save_whole_module

    return save_whole_module(tmp)


def module_reference(tmp: Path) -> Path:
    from builders import ghost_module
    from torch import nn

    with ghost_module():
        model = nn.Module()
        model.encoder = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        model.head = nn.Linear(4, 2)
        model.register_buffer("scale", torch.ones(2))
        state = model.state_dict()
    torch.save(state, tmp)
    return tmp


def saved(obj_factory):  # type: ignore[no-untyped-def]
    def write(tmp: Path) -> Path:
        torch.save(obj_factory(), tmp)
        return tmp

    return write


SUGGESTION_FIXTURES = {
    "ddp against plain": (saved(ddp_state_dict), saved(tiny_state_dict)),
    "training checkpoint against plain": (saved(training_checkpoint), saved(tiny_state_dict)),
    "compiled against plain": (saved(compiled_state_dict), saved(tiny_state_dict)),
    "lightning against plain": (saved(lightning_checkpoint), saved(tiny_state_dict)),
    "plain against ddp": (saved(tiny_state_dict), saved(ddp_state_dict)),
    "training checkpoint against a keys file": (saved(training_checkpoint), keys_file),
    "whole pickled module against its state_dict": (whole_module, module_reference),
    "whole DataParallel module against its state_dict": (dp_module, module_reference),
    "classifier head of another size": (saved(lambda: tiny_state_dict(classes=81)), saved(tiny_state_dict)),
}


@pytest.mark.parametrize("name", list(SUGGESTION_FIXTURES))
def test_every_suggested_command_runs_verbatim_and_reaches_its_match(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    from printed_commands import Shell

    make_source, make_reference = SUGGESTION_FIXTURES[name]
    source = make_source(tmp_path / "source.pth")
    reference = make_reference(tmp_path / "reference.txt" if "keys file" in name else tmp_path / "reference.pth")
    code, report = check_json(capsys, source, "--against", reference)
    assert code == 1
    suggestion = report["suggestion"]
    if "module" in name:
        assert "--extract" in suggestion["argv"]
    shell = Shell(tmp_path)
    before = set(tmp_path.iterdir())
    result = shell.paste(suggestion["command"])
    assert result.returncode == 0, result.stderr
    assert len(shell.invocations()) == 1
    (output,) = set(tmp_path.iterdir()) - before - {tmp_path / ".shim-log"}
    assert output != source
    code, after = check_json(capsys, output, "--against", reference)
    assert after["matched"] == suggestion["matched"] and after["missing"] == suggestion["missing"]
    assert code == (0 if suggestion["full_match"] else 1)
    assert suggestion["full_match"] or name == "classifier head of another size"


def test_model_factory_suggestion_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    from printed_commands import Shell

    (tmp_path / "factories.py").write_text("from builders import TinyNet\ndef build():\n    return TinyNet()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    torch.save(training_checkpoint(), tmp_path / "train.pth")
    code, report = check_json(capsys, tmp_path / "train.pth", "--model", "factories:build")
    assert code == 1
    assert Shell(tmp_path).paste(report["suggestion"]["command"]).returncode == 0
    assert main(["check", str(tmp_path / "train.fixed.pth"), "--model", "factories:build"]) == 0


def test_at_subtree_suggestion_extracts_it(tmp_path: Path, plain: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from printed_commands import Shell

    torch.save(training_checkpoint(), tmp_path / "train.pth")
    code, report = check_json(capsys, tmp_path / "train.pth", "--at", "model", "--against", plain)
    assert code == 1 and report["suggestion"]["steps"] == ["strip 'module.'"]
    argv = report["suggestion"]["argv"]
    assert argv[argv.index("--extract") + 1] == "model"
    assert Shell(tmp_path).paste(report["suggestion"]["command"]).returncode == 0
    assert main(["check", str(tmp_path / "train.fixed.pth"), "--against", str(plain)]) == 0


def test_old_batchnorm_checkpoints_without_num_batches_tracked(
    tmp_path: Path, plain: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from builders import TinyNet

    old = {k: v for k, v in tiny_state_dict().items() if not k.endswith("num_batches_tracked")}  # no _metadata
    torch.save(old, tmp_path / "old.pth")
    TinyNet().load_state_dict(torch.load(tmp_path / "old.pth"), strict=True)  # torch fills it in
    code, report = check_json(capsys, tmp_path / "old.pth", "--against", plain)
    assert code == 0 and report["filled_on_load"] == ["bn.num_batches_tracked"] and not report["missing"]
    modern = tiny_state_dict()
    del modern["bn.num_batches_tracked"]  # _metadata says version 2: BatchNorm will not fill it
    torch.save(modern, tmp_path / "modern.pth")
    with pytest.raises(RuntimeError, match="num_batches_tracked"):
        TinyNet().load_state_dict(torch.load(tmp_path / "modern.pth"), strict=True)
    code, report = check_json(capsys, tmp_path / "modern.pth", "--against", plain)
    assert code == 1 and report["missing"] == ["bn.num_batches_tracked"]
    ddp_old = {"module." + k: v for k, v in old.items()}
    torch.save(ddp_old, tmp_path / "ddp_old.pth")
    code, report = check_json(capsys, tmp_path / "ddp_old.pth", "--against", plain)
    assert code == 1 and report["suggestion"]["full_match"]


def test_a_model_module_not_found_says_where_it_is_looked_for(tmp_path: Path, capsys) -> None:
    torch.save({"w": torch.ones(2)}, tmp_path / "m.pth")
    assert main(["check", str(tmp_path / "m.pth"), "--model", "no_such_models_here:make"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "No module named 'no_such_models_here'" in err and "PYTHONPATH" in err
