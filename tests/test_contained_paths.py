"""Paths named inside a checkpoint stay inside its folder: a sharded index's weight_map, DCP storage
paths, DeepSpeed's ``latest``, Accelerate folders and rank sets, read and scanned.

Each hostile name (``/dev/stdin``, a FIFO, ``../x``, an absolute path, a symlink into ``/proc``) is one line
and exit 2 from ``check``, never a hang (each run has a deadline) nor a read outside. A symlink out of the folder
to a regular file or folder elsewhere is followed, as the loaders follow it, and named in the notes (R10B-13).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from builders import write_dcp, write_sharded_safetensors

from ckpt_tui.cli import main
from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model.byte_source import open_stream
from ckpt_tui.core.model.contained import inside
from ckpt_tui.core.weights_only.verdict import scan_file

FIXTURES = Path(__file__).parent / "fixtures"
DEADLINE = 60.0
HOSTILE = ["/dev/stdin", "fifo", "../outside.bin", "absolute", "link into /proc"]
PROC_FILE = "/proc/self/environ"
"""A kernel file that stats as a regular file (the environment, secrets included): a link to it is never followed."""


def within_deadline(work: Callable[[], Any]) -> Any:
    """``work()`` in a daemon thread: a hang fails the test instead of blocking it forever."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # handed to the test below
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(DEADLINE)
    assert not thread.is_alive(), "hung (a FIFO or stdin was opened?)"
    if "error" in box:
        raise box["error"]
    return box["value"]


def check_refuses(path: Path) -> str:
    """``check PATH``: exit 2 and one line on stderr, in time; the line."""
    out, err = io.StringIO(), io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return main(["check", str(path)])

    code = within_deadline(run)
    lines = err.getvalue().strip().splitlines()
    assert code == 2, (out.getvalue(), err.getvalue())
    assert len(lines) == 1 and "Traceback" not in err.getvalue(), err.getvalue()
    return lines[0]


def hostile_name(case: str, folder: Path) -> str:
    """A name (relative to ``folder``) of each hostile kind; the files it needs are made here."""
    outside = folder.parent / "outside.bin"
    outside.write_bytes(b"secret outside the folder")
    if case == "fifo":
        os.mkfifo(folder / "pipe.safetensors")
        return "pipe.safetensors"
    if case == "absolute":
        return str(outside)
    if case == "link into /proc":
        (folder / "linked.safetensors").symlink_to(PROC_FILE)
        return "linked.safetensors"
    return case  # /dev/stdin, ../outside.bin


def linked_entry(case: str, folder: Path, name: str) -> None:
    """An entry ``name`` of ``folder`` that is a FIFO, a link to stdin or a link into ``/proc``."""
    target = folder / name
    if target.exists():
        target.unlink()
    if case == "fifo":
        os.mkfifo(target)
    elif case == "/dev/stdin":
        target.symlink_to("/dev/stdin")
    else:
        target.symlink_to(PROC_FILE)


@pytest.mark.parametrize("case", HOSTILE)
def test_a_weight_map_name_is_refused_by_the_reader_and_the_scan(tmp_path: Path, case: str) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    index = write_sharded_safetensors({"a": torch.ones(2), "b": torch.zeros(2)}, folder)
    name = hostile_name(case, folder)
    data = json.loads(index.read_text())
    data["weight_map"]["b"] = name
    index.write_text(json.dumps(data))
    line = check_refuses(folder)
    assert "shard" in line and "outside.bin" not in line.split(":", 1)[0]
    scan = within_deadline(lambda: scan_file(str(index)))
    assert scan.reason and repr(name)[1:-1] in scan.reason


@pytest.mark.parametrize("case", HOSTILE)
def test_a_dcp_storage_path_is_refused(tmp_path: Path, case: str) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    folder = write_dcp({"w": torch.ones(4)}, tmp_path / "dcp")
    name = hostile_name(case, folder)
    metadata = FileSystemReader(str(folder)).read_metadata()
    for info in metadata.storage_data.values():
        info.relative_path = name
    with open(folder / ".metadata", "wb") as file:
        pickle.dump(metadata, file)
    assert "storage file" in check_refuses(folder)


@pytest.mark.parametrize("case", ["/dev/stdin", "fifo", "link into /proc"])
def test_a_dcp_metadata_that_is_not_a_file_of_the_folder_is_refused(tmp_path: Path, case: str) -> None:
    folder = write_dcp({"w": torch.ones(4)}, tmp_path / "dcp")
    linked_entry(case, folder, ".metadata")
    assert ".metadata" in check_refuses(folder)


@pytest.mark.parametrize("case", [*HOSTILE, "loop"])
def test_deepspeed_latest_naming_a_tag_out_of_the_folder_is_refused(tmp_path: Path, case: str) -> None:
    folder = tmp_path / "ds"
    shutil.copytree(FIXTURES / "deepspeed" / "zero2_fp32", folder)
    tag = (folder / "latest").read_text().strip()
    if case == "fifo":
        (folder / "latest").unlink()
        os.mkfifo(folder / "latest")
    elif case in ("link into /proc", "loop"):
        shutil.rmtree(folder / tag)
        # (/proc/self is a folder of the kernel's; the folder's parent holds the folder: a loop)
        (folder / tag).symlink_to("/proc/self" if case != "loop" else tmp_path)
    else:
        shutil.copytree(folder / tag, tmp_path / tag)
        name = {"absolute": str(tmp_path / tag), "../outside.bin": f"../{tag}"}.get(case, case)
        (folder / "latest").write_text(name)
    assert "latest" in check_refuses(folder)


@pytest.mark.parametrize("case", ["/dev/stdin", "fifo", "link into /proc"])
def test_an_accelerate_folder_file_that_is_not_a_file_of_the_folder_is_refused(tmp_path: Path, case: str) -> None:
    folder = tmp_path / "state"
    shutil.copytree(FIXTURES / "accelerate" / "save_state", folder)
    linked_entry(case, folder, "scheduler.bin")
    assert "scheduler.bin" in check_refuses(folder)


@pytest.mark.parametrize("case", ["/dev/stdin", "fifo", "link into /proc"])
def test_a_rank_file_beside_that_is_not_a_file_of_the_folder_is_refused(tmp_path: Path, case: str) -> None:
    folder = tmp_path / "ranks"
    shutil.copytree(FIXTURES / "torch_distributed" / "fsdp1_local", folder)
    linked_entry(case, folder, "model_rank1.pt")
    assert "model_rank1.pt" in check_refuses(folder / "model_rank0.pt")


def test_a_fifo_given_directly_is_refused_without_waiting(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.pth")
    assert "FIFO" in check_refuses(tmp_path / "pipe.pth")
    with pytest.raises(ReadError, match="FIFO"):
        within_deadline(lambda: open_stream(str(tmp_path / "pipe.pth")))


def test_links_inside_the_folder_and_a_hub_cache_snapshot_are_followed(tmp_path: Path) -> None:
    repo = tmp_path / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    (repo / "snapshots" / "abc").mkdir(parents=True)
    (repo / "blobs" / "123").write_bytes(b"weights")
    snapshot = repo / "snapshots" / "abc"
    (snapshot / "model.safetensors").symlink_to("../../blobs/123")
    (snapshot / "sub").mkdir()
    (snapshot / "sub" / "x.bin").write_bytes(b"x")
    (snapshot / "alias.bin").symlink_to("sub/x.bin")
    assert inside(str(snapshot), "model.safetensors", "index:") == str(snapshot / "model.safetensors")
    assert inside(str(snapshot), "alias.bin", "index:") == str(snapshot / "alias.bin")
    assert inside(str(snapshot), "sub/x.bin", "index:") == str(snapshot / "sub" / "x.bin")
    (snapshot / "sub" / "blob.bin").symlink_to("../../../blobs/123")
    # out of the snapshot's subfolder: followed as any link out to a regular file is
    assert inside(str(snapshot / "sub"), "blob.bin", "index:") == str(snapshot / "sub" / "blob.bin")
    (snapshot / "environ").symlink_to(PROC_FILE)
    with pytest.raises(ReadError, match="the kernel's /proc"):
        inside(str(snapshot), "environ", "index:")


# ---- links out of the folder to regular files and folders are followed, as the loaders follow them (R10B-13) ----


def info_out(capsys: pytest.CaptureFixture[str], path: Path) -> str:
    """``info PATH``: exit 0; its output."""
    assert main(["info", str(path)]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_a_weights_file_linked_from_another_folder_opens_as_from_pretrained_takes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import save_file

    store, run = tmp_path / "store", tmp_path / "run"
    store.mkdir()
    run.mkdir()
    weights = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3)}
    save_file(weights, store / "model.safetensors")
    (run / "config.json").write_text("{}")
    # weights kept elsewhere and linked into the run folder: from_pretrained(run) opens the link
    (run / "model.safetensors").symlink_to("../store/model.safetensors")
    out = info_out(capsys, run)
    assert f"model.safetensors -> {store}/model.safetensors" in out and "from_pretrained" in out
    assert main(["convert", str(run), "-o", str(tmp_path / "out.pth")]) == 0
    got = torch.load(tmp_path / "out.pth", weights_only=True)
    assert got.keys() == weights.keys() and all(torch.equal(got[k], weights[k]) for k in weights)
    assert main(["check", str(run)]) == 0
    # the output is written beside the link, never through it
    assert (store / "model.safetensors").is_file() and not (store / "out.pth").exists()


def test_a_deepspeed_tag_folder_linked_from_another_disk_opens_as_deepspeed_loads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = FIXTURES / "deepspeed" / "zero2_fp32"
    disk = tmp_path / "disk2"
    shutil.copytree(source / "global_step2", disk / "global_step2")
    folder = tmp_path / "ckpt"
    folder.mkdir()
    shutil.copy(source / "latest", folder / "latest")
    (folder / "global_step2").symlink_to(disk / "global_step2")
    out = info_out(capsys, folder)
    assert f"global_step2 -> {disk}/global_step2" in out and "DeepSpeed ZeRO-2" in out
    assert main(["convert", str(folder), "--extract", "fp32_weights", "-o", str(tmp_path / "fp32.pt")]) == 0
    got = torch.load(tmp_path / "fp32.pt", weights_only=True)
    want = torch.load(source / "expected_fp32.pt", weights_only=False)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert main(["check", str(folder)]) == 0


def test_a_shard_and_a_dcp_data_file_linked_elsewhere_are_read_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    write_sharded_safetensors({"a": torch.ones(2), "b": torch.arange(2.0)}, sharded)
    shard = sharded / "model-00002-of-00002.safetensors"
    shutil.move(shard, elsewhere / shard.name)
    shard.symlink_to(elsewhere / shard.name)
    out = info_out(capsys, sharded)
    assert f"{shard.name} -> {elsewhere}/{shard.name}" in out
    # a link between the folder's own files is no link out: not in the note
    first = sharded / "model-00001-of-00002.safetensors"
    (sharded / "kept").mkdir()
    shutil.move(first, sharded / "kept" / first.name)
    first.symlink_to(Path("kept") / first.name)
    out = info_out(capsys, sharded)
    assert f"{shard.name} -> {elsewhere}/{shard.name}" in out and f"{first.name} ->" not in out
    dcp = write_dcp({"w": torch.arange(4.0)}, tmp_path / "dcp")
    data = next(dcp.glob("*.distcp"))
    shutil.move(data, elsewhere / data.name)
    data.symlink_to(elsewhere / data.name)
    assert f"{data.name} -> {elsewhere}/{data.name}" in info_out(capsys, dcp)
    assert main(["check", str(dcp)]) == 0 and main(["check", str(sharded)]) == 0
