"""The read-back check of a written .pth refuses a data.pkl whose storages are not the ones meant."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from builders_writer import floats, tensor_op, text, write_zip_checkpoint

from ckpt_tui.core.errors import WriteError
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.writers import pth as pth_writer
from ckpt_tui.core.writers.save import save


def save_with_changed_pickle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: Callable[[bytes], bytes], tensors: int = 2
) -> None:
    """Save a checkpoint of ``tensors`` small tensors while ``change`` rewrites the emitted data.pkl."""
    real_emit = pth_writer.emit

    def changed(root: object) -> pth_writer.Emitted:
        emitted = real_emit(root)
        return pth_writer.Emitted(change(emitted.data_pkl), emitted.storages, emitted.tensors)

    monkeypatch.setattr("ckpt_tui.core.writers.save.emit", changed)
    body = b"".join(text(f"w{i}") + tensor_op(str(i)) for i in range(tensors))
    source = write_zip_checkpoint(
        tmp_path / "in.pth", b"\x80\x02}(" + body + b"u.", {str(i): floats(4) for i in range(tensors)}
    )
    save(open_checkpoint(source).root, tmp_path / "out.pth")


def test_a_record_named_with_another_size_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def resized(data: bytes) -> bytes:
        return data.replace(b"K\x04tQ", b"K\x05tQ", 1)  # the first persistent id: 5 elements

    with pytest.raises(WriteError, match="names record 0 with another type, device or size"):
        save_with_changed_pickle(tmp_path, monkeypatch, resized)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.pth"]


def test_a_record_named_on_another_device_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def moved(data: bytes) -> bytes:
        return data.replace(text("cpu"), text("cuda"), 1)

    with pytest.raises(WriteError, match="names record 0 with another type, device or size"):
        save_with_changed_pickle(tmp_path, monkeypatch, moved)


def test_a_record_named_twice_with_different_ids_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def second_named_first(data: bytes) -> bytes:
        return data.replace(text("1"), text("0"), 1)

    with pytest.raises(WriteError, match="first-use order"):
        save_with_changed_pickle(tmp_path, monkeypatch, second_named_first)


def test_a_persistent_id_that_is_not_a_storage_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def renamed(data: bytes) -> bytes:
        return data.replace(text("storage"), text("storeage"), 1)

    with pytest.raises(WriteError, match="persistent id that is not a storage"):
        save_with_changed_pickle(tmp_path, monkeypatch, renamed)


def test_an_unhashable_persistent_id_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def listed(data: bytes) -> bytes:
        return data.replace(b"(" + text("storage"), b"](" + text("storage"), 1).replace(b"tQ", b"eQ", 1)

    with pytest.raises(WriteError, match="persistent id that is not a storage"):
        save_with_changed_pickle(tmp_path, monkeypatch, listed)


def test_many_tensors_pass_the_check_and_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    save_with_changed_pickle(tmp_path, monkeypatch, lambda data: data, tensors=300)
    loaded = torch.load(tmp_path / "out.pth", weights_only=True)
    assert list(loaded) == [f"w{i}" for i in range(300)]
    assert all(torch.equal(t, torch.arange(4, dtype=torch.float32)) for t in loaded.values())
