"""An empty storage record named with several dtypes: torch.load keeps no empty storage for a key's later uses, so
each tensor gets its own dtype (what ckpt-tui shows), while torch.load(mmap=True) keeps the first (a 0-byte slice
of the mapped file has a data pointer): the two modes load other dtypes, and the verdict says so in a note."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from builders_readers import StorageRef, View, pickle_with_pids, torch_zip_members, write_zip

from ckpt_tui.cli import main


def empty(storage_type: object, key: str = "0") -> View:
    return View(StorageRef(key=key, numel=0, storage_type=storage_type), 0, (0,), (1,))


def test_an_empty_record_under_two_dtypes_is_noted_as_loading_apart_with_mmap(tmp_path: Path, capsys) -> None:
    tensors = {"a": empty(torch.FloatStorage), "b": empty(torch.LongStorage), "c": empty(torch.BoolStorage)}
    path = write_zip(tmp_path / "reused.pth", torch_zip_members(pickle_with_pids(tensors), {"0": b""}))
    plain = torch.load(path, weights_only=True)
    mapped = torch.load(path, weights_only=True, mmap=True)
    assert [t.dtype for t in plain.values()] == [torch.float32, torch.int64, torch.bool]
    assert [t.dtype for t in mapped.values()] == [torch.float32] * 3  # the two modes differ: the note's claim
    assert main(["info", "--json", str(path)]) == 0
    shown = [row["dtype"] for row in json.loads(capsys.readouterr().out)["tensors"]]
    assert shown == ["float32", "int64", "bool"]
    assert main(["check", "--json", str(path)]) == 0
    notes = json.loads(capsys.readouterr().out)["weights_only"]["notes"]
    assert any("data/0 is empty and named as float32 and as int64" in note and "mmap=True" in note for note in notes)


def test_empty_records_each_under_its_own_key_need_no_note(tmp_path: Path, capsys) -> None:
    """What torch.save writes for empty tensors: a record each (the modes agree)."""
    path = tmp_path / "saved.pth"
    torch.save({"a": torch.zeros(0), "b": torch.zeros(0, dtype=torch.long)}, path)
    assert main(["check", "--json", str(path)]) == 0
    assert not any("mmap=True" in note for note in json.loads(capsys.readouterr().out)["weights_only"]["notes"])
