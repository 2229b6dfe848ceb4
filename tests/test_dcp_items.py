"""DCP items read as ``dcp.load`` reads them, checked against the real loader.

``dcp.load`` (and ``dcp_to_torch_save``) reads a non-tensor item with ``torch.load(BytesIO(item),
weights_only=False)`` and a tensor item with ``torch.load(..., weights_only=True)``: an item may be a zip
archive or a legacy-format stream (five pickles), and every pickle torch unpickles runs. Each folder here
is written by ``dcp.save`` and its items replaced by other ``torch.save`` output; the real loader runs in a
child process (a canary file shows whether code ran), and ckpt-tui must say what it does.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from builders import write_dcp

from ckpt_tui.cli import main

LOADER = """
import json, sys, warnings
warnings.simplefilter("ignore")
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
folder, out = sys.argv[1], sys.argv[2]
try:
    dcp_to_torch_save(folder, out)
    state = torch.load(out, weights_only=False)
    print(json.dumps({"ok": True, "lr": repr(state["extra"]["lr"]), "w": state["w"].tolist()}))
except BaseException as exc:
    print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"[-400:]}))
"""


class Payload:
    """Pickles as ``os.system("touch CANARY")``."""

    def __init__(self, canary: Path) -> None:
        self.canary = canary

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.canary}",))


def _saved(value: Any, legacy: bool = False) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer, _use_new_zipfile_serialization=not legacy)
    return buffer.getvalue()


W = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 0.5


def _folder(
    tmp_path: Path, lr_item: bytes | None = None, w_item: bytes | None = None, v_item: bytes | None = None
) -> Path:
    """``dcp.save({"w": W, "extra": {"lr": 0.1}})`` (and ``"v": W`` with ``v_item``) with its items replaced:
    one ``.distcp`` file holding the given bytes, ``.metadata`` rewritten to place them (as
    FileSystemWriter would)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    state: dict[str, Any] = {"w": W, "extra": {"lr": 0.1}}
    if v_item is not None:
        state["v"] = W.clone()
    folder = write_dcp(state, tmp_path / "ckpt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metadata = FileSystemReader(str(folder)).read_metadata()
    lr_item = lr_item if lr_item is not None else _saved(0.1)
    blobs = {"extra.lr": lr_item, "w": w_item if w_item is not None else _saved(W)}
    if v_item is not None:
        blobs["v"] = v_item
    for name in os.listdir(folder):
        if name.endswith(".distcp"):
            (folder / name).unlink()
    data = b""
    places = {}
    for fqn, blob in blobs.items():
        places[fqn] = (len(data), len(blob))
        data += blob
    (folder / "__0_0.distcp").write_bytes(data)
    metadata.storage_data = {index: _StorageInfo("__0_0.distcp", *places[index.fqn]) for index in metadata.storage_data}
    with open(folder / ".metadata", "wb") as file:
        pickle.dump(metadata, file)
    return folder


def _real_load(folder: Path, tmp_path: Path) -> dict[str, Any]:
    """What ``dcp_to_torch_save`` does with the folder, in a child process."""
    done = subprocess.run(
        [sys.executable, "-c", LOADER, str(folder), str(tmp_path / "torch_out.pt")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return dict(json.loads(done.stdout.splitlines()[-1]))


def test_a_legacy_format_non_tensor_item_with_a_payload_is_unsafe_as_dcp_load_runs_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    canary = tmp_path / "CANARY"
    folder = _folder(tmp_path, lr_item=_saved(Payload(canary), legacy=True))
    assert main(["check", str(folder)]) == 1
    out = capsys.readouterr().out
    assert "unsafe-global" in out and "posix.system" in out
    assert "dcp.load RUNS code from it: posix.system" in out
    assert not canary.exists()
    assert main(["check", "--json", str(folder)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [p["global"] for p in report["problems"] if p["kind"] == "unsafe-global"] == ["posix.system"]
    assert not canary.exists()
    # the real loader runs it
    _real_load(folder, tmp_path)
    assert canary.exists()


def _with_bad_id(item: bytes) -> bytes:
    """The item with its .data/serialization_id's first byte made 0xff (not UTF-8), same length."""
    import zipfile

    data = bytearray(item)
    with zipfile.ZipFile(io.BytesIO(item)) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("/.data/serialization_id"))
    name_length, extra_length = struct.unpack_from("<HH", data, info.header_offset + 26)
    data[info.header_offset + 30 + name_length + extra_length] = 0xFF
    return bytes(data)


def test_a_tensor_item_like_another_but_for_an_id_torch_cannot_decode_is_judged_on_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # items of one layout share a verdict; a serialization id that is not UTF-8 makes torch.load fail
    bad = _with_bad_id(_saved(W))
    with pytest.raises(UnicodeDecodeError):
        torch.load(io.BytesIO(bad), weights_only=True)
    folder = _folder(tmp_path, w_item=_saved(W), v_item=bad)
    main(["check", "--json", str(folder)])
    report = json.loads(capsys.readouterr().out)
    assert "not UTF-8" in json.dumps(report["weights_only"]), report["weights_only"]


def _tar_polyglot(canary: Path) -> bytes:
    """A valid tar archive whose first member's name is a pickle of ``os.system("touch CANARY")``."""
    import tarfile

    name = f"cposix\nsystem\n(S'touch {canary}'\ntR."
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        member = tarfile.TarInfo(name)
        tar.addfile(member, io.BytesIO(b""))
    return buffer.getvalue()


def test_a_tar_item_is_unpickled_as_torch_load_unpickles_a_bytesio(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # torch.load never tries a BytesIO as tar: it unpickles the tar's first bytes, running this payload
    canary = tmp_path / "CANARY"
    item = _tar_polyglot(canary)
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(item)) as tar:
        assert tar.getnames()
    folder = _folder(tmp_path, lr_item=item)
    assert main(["check", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "it is UNSAFE" in err and "posix.system" in err and len(err.strip().splitlines()) == 1
    assert not canary.exists()
    _real_load(folder, tmp_path)
    assert canary.exists()


def test_a_legacy_format_non_tensor_item_is_read_as_torch_load_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _folder(tmp_path, lr_item=_saved(0.25, legacy=True), w_item=_saved(W, legacy=True))
    real = _real_load(folder, tmp_path)
    assert real["ok"] and real["lr"] == "0.25" and real["w"] == W.tolist()
    assert main(["check", str(folder)]) == 0, capsys.readouterr()
    capsys.readouterr()
    out = tmp_path / "ours.pt"
    assert main(["convert", str(folder), "-o", str(out)]) == 0, capsys.readouterr()
    ours = torch.load(out, weights_only=True)
    assert ours["extra"]["lr"] == 0.25
    assert torch.equal(ours["w"], W)


def test_a_plain_pickle_item_is_unreadable_and_unsafe_with_whole_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    canary = tmp_path / "CANARY"
    folder = _folder(tmp_path, lr_item=pickle.dumps(Payload(canary), protocol=2))
    assert main(["check", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "item 'extra.lr'" in err and "it is UNSAFE" in err and "posix.system" in err
    assert len(err.strip().splitlines()) == 1
    assert main(["check", "--json", str(folder)]) == 2
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["readable"] is False and "it is UNSAFE" in report["error"]
    assert report["weights_only"]["route"] == "dcp"
    assert not canary.exists()
    # dcp.load unpickles it (running the payload), then fails on the magic number
    real = _real_load(folder, tmp_path)
    assert not real["ok"] and "magic number" in real["error"]
    assert canary.exists()


def test_a_legacy_item_whose_magic_number_pickle_is_a_payload_is_unsafe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The magic-number pickle runs ``os.system``, drops its result and pushes the magic number: torch.load
    then loads the item as usual, after running the payload."""
    canary = tmp_path / "CANARY"
    legacy = _saved(0.1, legacy=True)
    magic = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)
    assert legacy.startswith(magic)
    command = f"touch {canary}".encode()
    payload = b"\x80\x02cposix\nsystem\nX" + len(command).to_bytes(4, "little") + command + b"\x85R0"
    folder = _folder(tmp_path, lr_item=payload + magic[2:] + legacy[len(magic) :])
    assert main(["check", str(folder)]) == 1
    out = capsys.readouterr().out
    assert "unsafe-global" in out and "posix.system" in out
    assert not canary.exists()
    real = _real_load(folder, tmp_path)
    assert real["ok"] and real["lr"] == "0.1"
    assert canary.exists()


def _hidden_payload(canary: Path) -> bytes:
    """``torch.save(W)`` whose data.pkl calls ``os.system`` and drops the result (POP) before the tensor."""
    import zipfile

    command = f"touch {canary}".encode()
    gadget = b"cposix\nsystem\nX" + len(command).to_bytes(4, "little") + command + b"\x85R0"
    rewritten = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(_saved(W))) as source, zipfile.ZipFile(rewritten, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            if info.filename.endswith("/data.pkl"):
                data = data[:2] + gadget + data[2:]  # after PROTO
            target.writestr(info.filename, data)
    return rewritten.getvalue()


@pytest.mark.parametrize("second", [False, True], ids=["alone", "beside-a-clean-item-of-its-shape"])
def test_a_tensor_item_with_a_hidden_payload_is_refused_as_dcp_load_refuses_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], second: bool
) -> None:
    """A tensor item is read with weights_only=True: a call hidden by POP before the tensor makes dcp.load
    fail (nothing runs), so the folder is not clean, though the tensor reads. Items of one shape are judged
    once: the payload's item is still judged on its own bytes."""
    canary = tmp_path / "CANARY"
    folder = (
        _folder(tmp_path, v_item=_hidden_payload(canary))
        if second
        else _folder(tmp_path, w_item=_hidden_payload(canary))
    )
    real = _real_load(folder, tmp_path)
    assert not real["ok"] and "weights_only" in real["error"].lower()
    assert not canary.exists()
    assert main(["check", "--json", str(folder)]) == 1
    report = json.loads(capsys.readouterr().out)
    verdict = report["weights_only"]
    assert verdict["answer"] == "refuses" and ("tensor item 'v'" if second else "tensor item 'w'") in verdict["reason"]
    assert main(["check", str(folder)]) == 1
    assert "weights_only: torch.load REFUSES it" in capsys.readouterr().out
    assert not canary.exists()


def test_a_clean_dcp_folder_stays_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _folder(tmp_path)
    assert _real_load(folder, tmp_path)["ok"]
    assert main(["check", "--json", str(folder)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["weights_only"]["answer"] is None


def test_a_metadata_pickle_that_is_only_a_payload_is_unreadable_and_unsafe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``dcp.load`` reads ``.metadata`` with ``pickle.load``: a payload there runs before anything fails."""
    canary = tmp_path / "CANARY"
    folder = _folder(tmp_path)
    (folder / ".metadata").write_bytes(pickle.dumps(Payload(canary), protocol=2))
    assert main(["check", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "not a DCP Metadata object" in err and "it is UNSAFE" in err and "posix.system" in err
    assert main(["check", "--json", str(folder)]) == 2
    assert "it is UNSAFE" in json.loads(capsys.readouterr().out)["error"]
    assert not canary.exists()
    real = _real_load(folder, tmp_path)
    assert not real["ok"]
    assert canary.exists()
