"""Big-endian torch zips: values as torch.load leaves them, storage type by tensor dtype.

torch swaps a big-endian file's storage in units of its storage type's element (``TypedStorage.byteswap``),
then reads the tensor's own dtype over those bytes. torch.save itself writes uint16..64, float8 and complex32
tensors over an ``UntypedStorage`` (single bytes: nothing swapped), so a big-endian host's save of a uint16
tensor loads byte-swapped on a little-endian one, and that is what is shown. Every combination is compared with
the real ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from builders_readers import StorageRef, pickle_with_pids, torch_zip_members, write_zip

from ckpt_tui.cli import main
from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.values.tensor_values import TensorReader, read_order

STORAGES = {
    "UntypedStorage": (torch.UntypedStorage, 1),
    "ByteStorage": (torch.ByteStorage, 1),
    "BoolStorage": (torch.BoolStorage, 1),
    "CharStorage": (torch.CharStorage, 1),
    "HalfStorage": (torch.HalfStorage, 2),
    "BFloat16Storage": (torch.BFloat16Storage, 2),
    "FloatStorage": (torch.FloatStorage, 4),
    "IntStorage": (torch.IntStorage, 4),
    "DoubleStorage": (torch.DoubleStorage, 8),
    "LongStorage": (torch.LongStorage, 8),
    "ComplexFloatStorage": (torch.ComplexFloatStorage, 8),
}
DTYPES = [
    torch.uint8,
    torch.int16,
    torch.uint16,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.int32,
    torch.uint32,
    torch.float64,
    torch.int64,
    torch.complex64,
    torch.float8_e4m3fn,
]
DATA = bytes(range(1, 17))


class ViewV3:
    """A tensor as ``torch._utils._rebuild_tensor_v3(storage, offset, size, stride, grad, hooks, dtype)``."""

    def __init__(self, storage: StorageRef, size: int, dtype: torch.dtype) -> None:
        self.args = (storage, 0, (size,), (1,), False, OrderedDict(), dtype)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return torch._utils._rebuild_tensor_v3, self.args


def big_endian_file(path: Path, storage: str, dtype: torch.dtype, data: bytes = DATA) -> Path:
    """A zip whose byteorder record says big, ``w`` a ``dtype`` tensor over all of a ``storage`` record."""
    storage_type, unit = STORAGES[storage]
    ref = StorageRef(numel=len(data) // unit, storage_type=storage_type)
    view = ViewV3(ref, len(data) // dtype.itemsize, dtype)
    members = torch_zip_members(pickle_with_pids({"w": view}), {"0": data}, byteorder=b"big")
    return write_zip(path, members)


def shown_bytes(path: Path) -> bytes:
    """The bytes of ``w``'s values as ckpt-tui reads them, in this machine's order."""
    checkpoint = open_checkpoint(path)
    chunks = list(TensorReader(checkpoint.root["w"], checkpoint.byteorder).chunks())
    values = np.concatenate(chunks)
    return values.astype(values.dtype.newbyteorder("="), copy=False).tobytes()


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_values_are_torchs_or_refused_for_every_storage_and_dtype(
    storage: str, dtype: torch.dtype, tmp_path: Path
) -> None:
    path = big_endian_file(tmp_path / "w.pth", storage, dtype)
    loaded = torch.load(path, weights_only=True)["w"]
    checkpoint = open_checkpoint(path)
    if read_order(checkpoint.root["w"], checkpoint.byteorder) is None:
        # torch swaps in units of one size under values of another: never shown as other values
        with pytest.raises(ReadError, match="byte-swapped by torch in units of another size"):
            shown_bytes(path)
        return
    assert shown_bytes(path) == loaded.view(torch.uint8).numpy().tobytes()


def test_a_big_endian_hosts_uint16_save_is_shown_as_torch_loads_it(tmp_path: Path, capsys: Any) -> None:
    # torch.save on a big-endian host: an UntypedStorage holding native (big-endian) uint16 values
    path = big_endian_file(tmp_path / "u16.pth", "UntypedStorage", torch.uint16, np.array([1, 2, 3], ">u2").tobytes())
    assert torch.load(path, weights_only=True)["w"].tolist() == [256, 512, 768]
    assert main(["stats", str(path), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["tensors"]
    assert (row["min"], row["max"]) == (256, 768)


def test_a_nan_under_byte_storage_is_found_by_check(tmp_path: Path, capsys: Any) -> None:
    path = big_endian_file(tmp_path / "nan.pth", "ByteStorage", torch.float32, np.array([np.nan, 1.0], "<f4").tobytes())
    assert torch.load(path, weights_only=True)["w"].isnan().tolist() == [True, False]
    assert main(["check", str(path)]) == 1
    assert "NaN" in capsys.readouterr().out


def test_an_empty_tensor_over_any_storage_reads(tmp_path: Path) -> None:
    storage_type, _ = STORAGES["HalfStorage"]
    ref = StorageRef(numel=8, storage_type=storage_type)
    members = torch_zip_members(pickle_with_pids({"w": ViewV3(ref, 0, torch.float32)}), {"0": DATA}, byteorder=b"big")
    path = write_zip(tmp_path / "empty.pth", members)
    assert torch.load(path, weights_only=True)["w"].numel() == 0
    checkpoint = open_checkpoint(path)
    assert list(TensorReader(checkpoint.root["w"], checkpoint.byteorder).chunks()) == []
