"""Hostile pickles: nothing runs (a canary file never appears) and the finding names the global."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch
from builders import Payload, raw_pickles, rewrite_zip, tiny_state_dict, touch_command, training_checkpoint

from ckpt_tui.cli import main
from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.reader import open_checkpoint
from ckpt_tui.core.summary import summarize


def unsafe_globals(path: Path) -> set[str]:
    findings = summarize(open_checkpoint(path)).findings
    return {f.global_name for f in findings if f.kind == "unsafe-global" and f.global_name}


def run_everything(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    readable = True
    try:
        open_checkpoint(path)
    except ReadError:
        readable = False
    for command in (["info", str(path)], ["info", "--json", str(path)]):
        assert main(command) == (0 if readable else 2)
    assert main(["check", str(path)]) == (1 if readable else 2)
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err


def test_payload_is_armed(tmp_path: Path) -> None:
    canary = tmp_path / "CANARY"
    torch.save({"x": Payload(os.system, touch_command(canary))}, tmp_path / "armed.pth")
    torch.load(tmp_path / "armed.pth", weights_only=False)
    assert canary.exists(), "the fixture must really run code when loaded the unsafe way"


@pytest.mark.parametrize("where", ["top", "optimizer", "legacy", "protocol4"])
def test_torch_saved_payload_never_runs(tmp_path: Path, where: str, capsys: pytest.CaptureFixture[str]) -> None:
    canary = tmp_path / "CANARY"
    payload = Payload(os.system, touch_command(canary))
    ckpt = training_checkpoint()
    kwargs: dict = {}
    if where == "top":
        ckpt["hook"] = payload
    else:
        ckpt["optimizer"]["state"][0]["exp_avg_evil"] = payload
    if where == "legacy":
        kwargs["_use_new_zipfile_serialization"] = False
    if where == "protocol4":
        kwargs["pickle_protocol"] = 4
    path = tmp_path / "evil.pth"
    torch.save(ckpt, path, **kwargs)
    assert unsafe_globals(path) == {"posix.system"}
    run_everything(path, capsys)
    assert not canary.exists()


@pytest.mark.parametrize("name", list(raw_pickles(Path("/x"))))
@pytest.mark.parametrize("container", ["zip", "plain"])
def test_raw_opcode_payloads(tmp_path: Path, name: str, container: str, capsys: pytest.CaptureFixture[str]) -> None:
    canary = tmp_path / "CANARY"
    data = raw_pickles(canary)[name]
    if container == "zip":
        torch.save(tiny_state_dict(), tmp_path / "good.pth")
        path = rewrite_zip(tmp_path / "good.pth", tmp_path / "evil.pth", data_pkl=data)
    else:
        path = tmp_path / "evil.pkl"
        path.write_bytes(data)
    if name.startswith("EXT1"):
        with pytest.raises(ReadError):
            open_checkpoint(path)
    else:
        names = unsafe_globals(path)
        expected = {word for word in name.split() if "." in word}
        assert expected <= names, names
    run_everything(path, capsys)
    assert not canary.exists()


def test_plain_pickle_payload_runs_with_pickle(tmp_path: Path) -> None:
    canary = tmp_path / "CANARY"
    pickle.loads(raw_pickles(canary)["GLOBAL+REDUCE os.system"])
    assert canary.exists(), "the raw payloads must be live"
