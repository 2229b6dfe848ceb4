"""A storage key that is one of torch's objects (a ``torch.Size``, a dtype, a device, a layout): torch reads the
record ``data/{key}``, named by that object's own text, and loads the file; ckpt-tui cannot say that text for its
stand-ins, so it answers "cannot tell", never "refuses", and no message shows its own classes."""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_weights_only import checked_answer, torch_answer

from ckpt_tui.cli import main

_STORAGE = object()


class _Tensor:
    """Pickled as torch pickles a tensor of four float32 values on the persistent storage."""

    def __reduce__(self) -> tuple[Any, ...]:
        return torch._utils._rebuild_tensor_v2, (_STORAGE, 0, (4,), (1,), False, collections.OrderedDict())


def saved_with_key(path: Path, key: Any) -> Path:
    """A zip checkpoint ``{"a": tensor}`` whose storage key is ``key``, its record named ``data/{key}`` as torch
    names it."""

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            return ("storage", torch.FloatStorage, key, "cpu", 4) if obj is _STORAGE else None

    data = io.BytesIO()
    Pickler(data, protocol=2).dump({"a": _Tensor()})
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", data.getvalue())
        archive.writestr("archive/byteorder", "little")
        archive.writestr(f"archive/data/{key}", torch.arange(4, dtype=torch.float32).numpy().tobytes())
        archive.writestr("archive/version", "3\n")
    return path


@pytest.mark.parametrize(
    "key",
    [torch.Size([2, 3]), torch.float32, torch.device("cpu"), torch.strided, torch.per_tensor_affine],
    ids=["size", "dtype", "device", "layout", "qscheme"],
)
def test_a_torch_object_as_storage_key_is_cannot_tell_in_the_files_words(tmp_path: Path, capsys, key: Any) -> None:
    path = saved_with_key(tmp_path / "key.pth", key)
    assert torch_answer(path) == "loads"
    assert checked_answer(path, capsys) == "cannot_tell"
    for command in ("check", "info"):
        main([command, str(path)])
        captured = capsys.readouterr()
        said = captured.out + captured.err
        assert "object at 0x" not in said and "WSize" not in said and "TorchSize" not in said
        assert "REFUSES" not in said


class _Meta:
    """Pickled as torch pickles a meta tensor: ``_rebuild_meta_tensor_no_storage(dtype, size, stride, False)``."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __reduce__(self) -> tuple[Any, ...]:
        return torch._utils._rebuild_meta_tensor_no_storage, (self.dtype, (2,), (1,), False)


def _torch_dtypes() -> list[torch.dtype]:
    from ckpt_tui.core.model.dtypes import DTYPES

    return [getattr(torch, name) for name in DTYPES if isinstance(getattr(torch, name, None), torch.dtype)]


@pytest.mark.parametrize("dtype", _torch_dtypes(), ids=str)
def test_a_meta_tensor_of_every_dtype_is_judged_as_torch_loads_it(tmp_path: Path, capsys, dtype: torch.dtype) -> None:
    """torch cannot make an empty meta tensor of a quantized dtype (no QuantizedMeta kernel): refused, never
    'loads' (adv12a F7); every other dtype loads."""
    data = io.BytesIO()
    pickle.Pickler(data, protocol=2).dump({"a": _Meta(dtype)})
    path = tmp_path / "meta.pth"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", data.getvalue())
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/version", "3\n")
    expected = torch_answer(path)
    assert checked_answer(path, capsys) == expected


class _OffsetByTensor:
    """A tensor whose storage offset (or size element) is a 0-dim integer tensor: set_ takes its value."""

    def __init__(self, where: str) -> None:
        self.where = where

    def __reduce__(self) -> tuple[Any, ...]:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            storage = torch.arange(8.0).storage()
        three = torch.tensor(3)
        offset, size = (three, (2,)) if self.where == "offset" else (0, (three,))
        return torch._utils._rebuild_tensor_v2, (storage, offset, size, (1,), False, collections.OrderedDict())


@pytest.mark.parametrize("where", ["offset", "size"])
def test_a_tensor_as_a_storage_offset_or_size_is_cannot_tell(tmp_path: Path, capsys, where: str) -> None:
    """torch's set_ takes a one-element integer tensor's value (__index__): it loads; that value is not read by the
    verdict, so 'cannot tell', never 'refuses' (adv12a F9)."""
    path = tmp_path / "odd.pth"
    torch.save({"a": _OffsetByTensor(where)}, path)
    assert torch_answer(path) == "loads"
    assert checked_answer(path, capsys) == "cannot_tell"
