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
from ckpt_tui.core.operations.info import summarize
from ckpt_tui.core.readers.open import open_checkpoint


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


def write_torchscript_like(path: Path, data_pkl: bytes) -> Path:
    """A zip laid out like torch.jit.save output, with a hostile constants.pkl."""
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("model/data.pkl", b"\x80\x02c__torch__\nNet\n)\x81}b.")
        archive.writestr("model/code/__torch__.py", "def forward(self): pass\n")
        archive.writestr("model/constants.pkl", data_pkl)
        archive.writestr("model/version", "3\n")
    return path


@pytest.mark.parametrize("name", ["GLOBAL+REDUCE os.system", "BUILD __setstate__ builtins.exec"])
def test_torchscript_like_payload(tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    canary = tmp_path / "CANARY"
    path = write_torchscript_like(tmp_path / "ts.pt", raw_pickles(canary)[name])
    assert open_checkpoint(path).format == "torchscript"
    assert {w for w in name.split() if "." in w} <= unsafe_globals(path)
    run_everything(path, capsys)
    assert not canary.exists()


def test_dcp_metadata_payload_even_outside_the_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from builders import write_dcp

    canary = tmp_path / "CANARY"
    folder = write_dcp({"w": torch.ones(2)}, tmp_path / "dcp")
    metadata = pickle.loads((folder / ".metadata").read_bytes())  # our own file: trusted here
    metadata.planner_data["evil"] = Payload(os.system, touch_command(canary))
    (folder / ".metadata").write_bytes(pickle.dumps(metadata, protocol=4))
    assert open_checkpoint(folder).root["w"].shape == (2,)
    assert "posix.system" in unsafe_globals(folder)
    run_everything(folder, capsys)
    (folder / ".metadata").write_bytes(raw_pickles(canary)["GLOBAL+REDUCE os.system"])
    with pytest.raises(ReadError):
        open_checkpoint(folder)
    assert not canary.exists()


def test_payload_left_only_in_the_memo_is_reported(tmp_path: Path) -> None:
    canary = tmp_path / "CANARY"
    data = b"\x80\x02cos\nsystem\nq\x00}q\x01."  # names os.system, returns an empty dict
    path = tmp_path / "memo.pkl"
    path.write_bytes(data)
    assert open_checkpoint(path).root == {}
    assert unsafe_globals(path) == {"os.system"}
    assert main(["check", str(path)]) == 1
    assert not canary.exists()


def test_convert_refuses_and_runs_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    canary = tmp_path / "CANARY"
    for name, data in raw_pickles(canary).items():
        source = tmp_path / "evil.pkl"
        source.write_bytes(data)
        code = main(["convert", str(source), "-o", str(tmp_path / "out.pth"), "--force"])
        assert code == 2, name
        assert not (tmp_path / "out.pth").exists()
    capsys.readouterr()
    assert not canary.exists()


async def test_tui_shows_payloads_and_runs_nothing(tmp_path: Path) -> None:
    from ckpt_tui.tui.app import CkptApp
    from ckpt_tui.tui.widgets.tree_view import CheckpointTree

    canary = tmp_path / "CANARY"
    ckpt = training_checkpoint()
    ckpt["optimizer"]["state"][0]["evil"] = Payload(os.system, touch_command(canary))
    torch.save(ckpt, tmp_path / "evil.pth")
    app = CkptApp(str(tmp_path / "evil.pth"))
    async with app.run_test(size=(120, 36)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert "posix.system" in str(app.query_one("#summary").content)
        await pilot.press("slash", *"evil", "enter")
        await pilot.pause()
        label = str(app.query_one(CheckpointTree).cursor_node.label)
        assert "posix.system" in label and "not executed" in label
        await pilot.press("ctrl+s", "enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
    assert not canary.exists()
    assert not (tmp_path / "evil.fixed.pth").exists()
