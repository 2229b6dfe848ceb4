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
