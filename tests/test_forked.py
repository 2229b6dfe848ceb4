"""Work in a forked child gives the caller the same answer as work done in place, or none at all."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from builders import write_safetensors

from ckpt_tui.cli import main
from ckpt_tui.core.operations.check import check_checkpoint
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.runtime import forked
from ckpt_tui.core.weights_only.verdict import FileScan, ScanBeside, scan_file, verdict

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX only")


def test_the_childs_json_value_comes_back() -> None:
    child = forked.fork(lambda: {"a": [1, 2.5, None, "x\udcff"]})
    if child is None:
        pytest.skip("one usable core: no fork is made")
    assert child.result() == {"a": [1, 2.5, None, "x\udcff"]}


def test_a_child_that_raises_or_dies_gives_none_and_prints_nothing(capfd: Any) -> None:
    def boom() -> Any:
        raise RuntimeError("nope")

    for work in (boom, lambda: os._exit(3), lambda: object()):  # raises, exits, returns no JSON value
        child = forked.fork(work)
        if child is None:
            pytest.skip("one usable core: no fork is made")
        assert child.result() is None
    assert capfd.readouterr() == ("", "")


def test_no_fork_while_other_threads_run() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert forked.fork(lambda: 1) is None
    finally:
        stop.set()
        thread.join()


def test_a_file_scan_survives_the_trip_to_json(tmp_path: Path) -> None:
    args = argparse.Namespace(lr=0.1)
    torch.save(
        {"w": torch.ones(2), "args": args, "kind": argparse.Namespace, "dev": torch.device("cpu")}, tmp_path / "m.pth"
    )
    scan = scan_file(str(tmp_path / "m.pth"))
    assert scan.refused
    assert FileScan.from_wire(scan.to_wire()) == scan


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_check_gives_the_same_report_with_and_without_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    state = {f"t{i}": torch.randn(3, 4) for i in range(50)}
    state["bad"] = torch.tensor([1.0, float("nan")])
    path = tmp_path / f"m{suffix}"
    if suffix == ".pth":
        torch.save({"model": state, "epoch": 3}, path)
    else:
        write_safetensors(state, path)
    opened = open_checkpoint(path)
    with_children = check_checkpoint(opened, beside=ScanBeside.of(opened)).to_json()
    monkeypatch.setattr(forked, "fork", lambda work: None)
    alone = check_checkpoint(open_checkpoint(path)).to_json()
    assert with_children == alone
    assert [p["kind"] for p in alone["problems"]] == ["nan"]


def test_the_verdict_of_a_folder_is_the_same_from_the_child(tmp_path: Path) -> None:
    folder = tmp_path / "shards"
    folder.mkdir()
    write_safetensors({"a": torch.ones(2)}, folder / "model-00001-of-00002.safetensors")
    write_safetensors({"b": torch.ones(2)}, folder / "model-00002-of-00002.safetensors")
    index = {
        "metadata": {},
        "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    checkpoint = open_checkpoint(folder)
    assert verdict(checkpoint, ScanBeside.of(checkpoint)).to_json() == verdict(checkpoint).to_json()


def test_check_of_an_unreadable_file_still_prints_torchs_verdict(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "m.pth"
    torch.save({"w": torch.ones(2)}, path)
    data = bytearray(path.read_bytes())
    path.write_bytes(bytes(data[: len(data) // 2]))  # truncated: the reader refuses it
    assert main(["check", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out.startswith("weights_only: torch.load REFUSES it") and "truncated" in out
    assert err.startswith("ckpt-tui: ") and err.count("\n") == 1 and "Traceback" not in out + err


def test_a_refused_fork_means_the_work_is_done_here(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def refused() -> int:
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", refused)
    assert forked.fork(lambda: 1) is None
    torch.save({"w": torch.ones(3)}, tmp_path / "m.pth")
    assert main(["check", str(tmp_path / "m.pth")]) == 0


def test_the_script_flushes_everything_and_exits_with_the_commands_code(tmp_path: Path) -> None:
    state = {f"layer{i}.weight": torch.ones(2) for i in range(3000)}
    torch.save(state, tmp_path / "m.pth")
    python = [sys.executable, "-m", "ckpt_tui"]
    done = subprocess.run([*python, "info", "--json", str(tmp_path / "m.pth")], capture_output=True, text=True)
    assert done.returncode == 0 and len(json.loads(done.stdout)["tensors"]) == 3000
    broken = subprocess.run([*python, "info", str(tmp_path / "nothing.pth")], capture_output=True, text=True)
    assert broken.returncode == 2 and broken.stderr.startswith("ckpt-tui: ") and broken.stdout == ""
    piped = subprocess.run(
        f"{shlex.quote(sys.executable)} -m ckpt_tui info --json {shlex.quote(str(tmp_path / 'm.pth'))} | head -c 10",
        shell=True,
        capture_output=True,
        text=True,
    )
    assert piped.stdout == '{"path":"/' and piped.stderr == ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_child_dies_with_its_parent_however_the_parent_ends(tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        "from ckpt_tui.core.runtime import forked\n"
        "child = forked.fork(lambda: time.sleep(60))\n"
        "print(child.pid if child else 0, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    if not pid:
        parent.kill()
        pytest.skip("one usable core: no fork is made")
    parent.kill()  # SIGKILL: no handler of ours runs
    parent.wait()
    for _ in range(200):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except FileNotFoundError:
            break
        if state == "Z":  # killed, waiting for init to reap it
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        pytest.fail("the child outlived its parent")
