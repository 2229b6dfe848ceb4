"""A DCP folder whose metadata or items no saver writes is read as ``dcp.load`` reads it, against the real loader.

The folder is the FSDP2 checkpoint two gloo processes wrote (``tests/fixtures/torch_distributed/dcp_fsdp2``, made by
``scripts/make_torch_distributed_fixtures.py``), copied and tampered with torch's own metadata classes: an item
larger than its chunk (``narrow_tensor_by_index`` narrows it), overlapping or duplicate chunks (``copy_`` in the
loader's read order, the later winning), another dtype in the metadata or in an item (``copy_`` casts), a chunk
reaching past the tensor. What ``dcp_to_torch_save`` loads, ``convert`` writes and ``stats`` shows, with an
``odd-layout`` finding naming what is odd; what it refuses is never called clean.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from ckpt_tui.cli import main

FIXTURE = Path(__file__).parent / "fixtures" / "torch_distributed" / "dcp_fsdp2"
KEY = "model.fc1.weight"
"""[12, 8], saved as two chunks: rows 0:6 in ``__0_0.distcp``, rows 6:12 in ``__1_0.distcp``."""


def _metadata(folder: Path) -> Any:
    from torch.distributed.checkpoint import FileSystemReader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return FileSystemReader(str(folder)).read_metadata()


def _entry(metadata: Any, offsets: tuple[int, ...]) -> tuple[Any, Any]:
    """The storage_data key and info of KEY's chunk at ``offsets``."""
    return next((k, v) for k, v in metadata.storage_data.items() if k.fqn == KEY and tuple(k.offset) == offsets)


def _move_chunk(metadata: Any, size: tuple[int, ...], offsets: tuple[int, ...], sizes: tuple[int, ...]) -> None:
    """KEY resized to ``size``, its second chunk placed at ``offsets`` (its storage entry re-keyed, a later
    entry for the same place replacing the first, as unpickling the dict does)."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    entry = metadata.state_dict_metadata[KEY]
    entry.size = torch.Size(size)
    entry.chunks[1] = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))
    key, info = _entry(metadata, (6, 0))
    del metadata.storage_data[key]
    metadata.storage_data[MetadataIndex(KEY, offsets, 1)] = info


def _replace_item(folder: Path, metadata: Any, item: torch.Tensor, offsets: tuple[int, ...] = (6, 0)) -> None:
    """The item of KEY's chunk at ``offsets`` (the second) replaced by ``torch.save(item)``, appended to its file."""
    _, info = _entry(metadata, offsets)
    buffer = io.BytesIO()
    torch.save(item, buffer)
    path = folder / info.relative_path
    info.offset, info.length = path.stat().st_size, len(buffer.getvalue())
    with open(path, "ab") as file:
        file.write(buffer.getvalue())


ROWS = torch.arange(80, dtype=torch.float32).reshape(10, 8) * 0.25 - 7.0
CASES: dict[str, tuple[Callable[[Path, Any], None], str]] = {
    "item larger than its chunk": (
        lambda f, m: _replace_item(f, m, ROWS[:9].clone()),
        "the chunk at [6, 0]: its item is [9, 8], the chunk [6, 8]; torch narrows it to [6, 8]",
    ),
    "item wider than its chunk": (
        lambda f, m: _replace_item(f, m, ROWS[:6].repeat(1, 2).clone()),
        "its item is [6, 16], the chunk [6, 8]; torch narrows it to [6, 8]",
    ),
    "overlapping chunks": (
        lambda f, m: _move_chunk(m, (10, 8), (4, 0), (6, 8)),
        "chunks [0:6, 0:8] and [4:10, 0:8] overlap; torch copies the one at [4, 0] last",
    ),
    "two chunks at one place": (
        lambda f, m: _move_chunk(m, (6, 8), (0, 0), (6, 8)),
        "two chunks at [0, 0]; torch reads one stored item for both",
    ),
    "chunk reaching past the tensor": (
        lambda f, m: _move_chunk(m, (10, 8), (6, 0), (6, 8)),
        "the chunk at [6, 0] ([6, 8]) reaches past the tensor ([10, 8]); torch reads its first [4, 8]",
    ),
    "float64 in the metadata": (
        lambda f, m: setattr(m.state_dict_metadata[KEY].properties, "dtype", torch.float64),
        "the chunk at [0, 0]: its item is float32, the tensor float64; torch casts it (copy_)",
    ),
    "float64 item": (
        lambda f, m: _replace_item(f, m, torch.tensor([[0.1, 1e40, -2.5, 3.7, -1e-46, 7.0, 1 / 3, -0.0]] * 6).double()),
        "the chunk at [6, 0]: its item is float64, the tensor float32; torch casts it (copy_)",
    ),
    "bfloat16 item": (
        lambda f, m: _replace_item(f, m, ROWS[:6].to(torch.bfloat16)),
        "the chunk at [6, 0]: its item is bfloat16, the tensor float32; torch casts it (copy_)",
    ),
}


def _overlap_across_files(folder: Path, metadata: Any) -> None:
    """Rows 0:12 in ``__0_0.distcp`` (read first), rows 6:10 in ``__1_0.distcp``: the second chunk ends first, so
    torch plans it first, but it reads file by file: the second chunk's rows are copied last."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    chunks = metadata.state_dict_metadata[KEY].chunks
    chunks[0] = ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([12, 8]))
    chunks[1] = ChunkStorageMetadata(offsets=torch.Size([6, 0]), sizes=torch.Size([4, 8]))
    _replace_item(folder, metadata, torch.arange(96.0).reshape(12, 8), offsets=(0, 0))


CASES["overlapping chunks read file by file"] = (
    _overlap_across_files,
    "chunks [0:12, 0:8] and [6:10, 0:8] overlap; torch copies the one at [6, 0] last",
)
REFUSED = {
    "item smaller than its chunk": lambda f, m: _replace_item(f, m, ROWS[:5].clone()),
    "item of another rank": lambda f, m: _replace_item(f, m, ROWS[:6].reshape(6, 8, 1).clone()),
}


def _tampered(tmp_path: Path, change: Callable[[Path, Any], None]) -> Path:
    folder = tmp_path / "ckpt"
    shutil.copytree(FIXTURE, folder)
    metadata = _metadata(folder)
    change(folder, metadata)
    with open(folder / ".metadata", "wb") as file:
        pickle.dump(metadata, file)
    return folder


def _real(folder: Path, out: Path) -> dict[str, Any] | None:
    """What ``dcp_to_torch_save`` loads (None when it refuses)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp_to_torch_save(str(folder), str(out))
    except BaseException:  # (its CheckpointException is no Exception)
        return None
    return dict(torch.load(out, weights_only=False))


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{prefix}{key}/").items()}
    if isinstance(value, list):
        return {k: v for index, item in enumerate(value) for k, v in _flat(item, f"{prefix}{index}/").items()}
    return {prefix: value}


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("case", list(CASES))
def test_what_dcp_load_loads_is_what_convert_writes_with_the_oddity_said(tmp_path: Path, case: str) -> None:
    change, oddity = CASES[case]
    folder = _tampered(tmp_path, change)
    real = _real(folder, tmp_path / "torch.pt")
    assert real is not None, "the real loader loads it"
    code, out, err = _cli("check", str(folder))
    assert code == 1, out + err
    assert f"[odd-layout] {KEY}: " in out and oddity in out
    code, _, err = _cli("convert", str(folder), "-o", str(tmp_path / "ours.pth"))
    assert code == 0, err
    ours = _flat(torch.load(tmp_path / "ours.pth", weights_only=True))
    theirs = _flat(real)
    tensors = {key for key, value in theirs.items() if isinstance(value, torch.Tensor)}
    assert tensors <= set(ours)
    for key in tensors:
        assert ours[key].dtype == theirs[key].dtype, key
        assert torch.equal(ours[key], theirs[key]), (key, ours[key], theirs[key])


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_dcp_load_refuses_is_never_clean(tmp_path: Path, case: str) -> None:
    folder = _tampered(tmp_path, REFUSED[case])
    assert _real(folder, tmp_path / "torch.pt") is None
    code, out, err = _cli("check", str(folder))
    assert code in (1, 2) and "OK" not in out, out + err
    assert "holds shape" in out + err
    # the odd-layout words never say torch narrows what it refuses
    assert "torch narrows" not in out + err
    code, _, err = _cli("convert", str(folder), "-o", str(tmp_path / "ours.pth"))
    assert code == 2 and "holds shape" in err
    assert not (tmp_path / "ours.pth").exists()


def test_an_item_of_a_dtype_whose_cast_is_not_emulated_is_cannot_tell(tmp_path: Path) -> None:
    folder = _tampered(tmp_path, lambda f, m: _replace_item(f, m, (ROWS[:6] * 4).to(torch.int32)))
    assert _real(folder, tmp_path / "torch.pt") is not None  # torch casts int32 to float32
    code, out, _ = _cli("check", str(folder))
    assert code == 1
    assert "its item is int32, the tensor float32; torch casts it (copy_), which ckpt-tui does not emulate" in out
    assert "[unreadable]" in out


def test_the_untouched_folder_has_no_oddity(tmp_path: Path) -> None:
    code, out, _ = _cli("check", str(FIXTURE))
    assert code == 0 and "odd-layout" not in out, out
