"""Paths named inside a checkpoint stay inside its folder: a sharded index's weight_map, DCP storage
paths, DeepSpeed's ``latest``, Accelerate folders and rank sets, read and scanned.

Each hostile name (``/dev/stdin``, a FIFO, ``../x``, an absolute path, a symlink out of the folder) is
one line and exit 2 from ``check``, never a hang (each run has a deadline) nor a read outside.
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
HOSTILE = ["/dev/stdin", "fifo", "../outside.bin", "absolute", "link out"]


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
    if case == "link out":
        (folder / "linked.safetensors").symlink_to(outside)
        return "linked.safetensors"
    return case  # /dev/stdin, ../outside.bin


def linked_entry(case: str, folder: Path, name: str) -> None:
    """An entry ``name`` of ``folder`` that is a FIFO, a link to stdin or a link out of the folder."""
    outside = folder.parent / "outside.bin"
    outside.write_bytes(b"secret outside the folder")
    target = folder / name
    if target.exists():
        target.unlink()
    if case == "fifo":
        os.mkfifo(target)
    elif case == "/dev/stdin":
        target.symlink_to("/dev/stdin")
    else:
        target.symlink_to(outside)


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


@pytest.mark.parametrize("case", ["/dev/stdin", "fifo", "link out"])
def test_a_dcp_metadata_that_is_not_a_file_of_the_folder_is_refused(tmp_path: Path, case: str) -> None:
    folder = write_dcp({"w": torch.ones(4)}, tmp_path / "dcp")
    linked_entry(case, folder, ".metadata")
    assert ".metadata" in check_refuses(folder)


@pytest.mark.parametrize("case", HOSTILE)
def test_deepspeed_latest_naming_a_tag_out_of_the_folder_is_refused(tmp_path: Path, case: str) -> None:
    folder = tmp_path / "ds"
    shutil.copytree(FIXTURES / "deepspeed" / "zero2_fp32", folder)
    tag = (folder / "latest").read_text().strip()
    if case == "fifo":
        (folder / "latest").unlink()
        os.mkfifo(folder / "latest")
    elif case == "link out":
        shutil.move(folder / tag, tmp_path / tag)
        (folder / tag).symlink_to(tmp_path / tag)
    else:
        shutil.copytree(folder / tag, tmp_path / tag)
        name = {"absolute": str(tmp_path / tag), "../outside.bin": f"../{tag}"}.get(case, case)
        (folder / "latest").write_text(name)
    assert "latest" in check_refuses(folder)


@pytest.mark.parametrize("case", ["/dev/stdin", "fifo", "link out"])
def test_an_accelerate_folder_file_that_is_not_a_file_of_the_folder_is_refused(tmp_path: Path, case: str) -> None:
    folder = tmp_path / "state"
    shutil.copytree(FIXTURES / "accelerate" / "save_state", folder)
    linked_entry(case, folder, "scheduler.bin")
    assert "scheduler.bin" in check_refuses(folder)


@pytest.mark.parametrize("case", ["/dev/stdin", "fifo", "link out"])
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
    with pytest.raises(ReadError, match="link out"):  # the exception is for the snapshot folder only
        inside(str(snapshot / "sub"), "blob.bin", "index:")
