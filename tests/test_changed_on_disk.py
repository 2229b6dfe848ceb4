"""A file replaced or rewritten after it was opened is never read under the tree and verdict of the file it
was: reading every tensor (``check``, the browser's ``C``) refuses in one line instead of mixing the two."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.operations.check import check_checkpoint
from ckpt_tui.core.readers.open import open_checkpoint


def saved(path: Path, value: float) -> Path:
    torch.save({"w": torch.full((4,), value), "b": torch.zeros(2)}, path)
    return path


@pytest.mark.parametrize("how", ["replaced", "rewritten"])
def test_reading_values_of_a_file_changed_since_it_was_opened_is_refused(tmp_path: Path, how: str) -> None:
    path = saved(tmp_path / "model.pth", 1.0)
    checkpoint = open_checkpoint(str(path))
    assert check_checkpoint(checkpoint).ok
    if how == "replaced":
        os.replace(saved(tmp_path / "other.pth", float("nan")), path)
    else:
        saved(path, float("nan"))
        os.utime(path, ns=(0, 10**18))  # a rewrite within the clock's tick still gets another version
    with pytest.raises(ReadError, match="changed on disk since it was opened; open it again"):
        check_checkpoint(checkpoint)
    assert not check_checkpoint(open_checkpoint(str(path))).ok  # opened again: the NaN file, as it is


def test_a_file_left_alone_reads_as_opened(tmp_path: Path) -> None:
    path = saved(tmp_path / "model.pth", 1.0)
    checkpoint = open_checkpoint(str(path))
    # read by another process, not written (os.utime would move the change time: that is a change)
    assert path.read_bytes()
    assert check_checkpoint(checkpoint).ok
