"""A negative stride where torch's ``set_`` replaces it: the tree shows the strides torch's tensor has.

``TensorImpl::set_sizes_and_strides`` replaces each negative stride (innermost first: 1 for the last
dimension, else the next stride times the next size, at least 1); torch refuses a negative stride on a
dimension longer than 1 unless a size is 0. Generated layouts against the real ``torch.load``.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import torch
from builders_readers import StorageRef, View, pickle_with_pids, torch_zip_members, write_zip

from ckpt_tui.core.operations.check import check_checkpoint
from ckpt_tui.core.readers.open import open_checkpoint


def layouts() -> list[tuple[tuple[int, ...], tuple[int, ...], int]]:
    """Shapes of 1 to 3 dimensions of sizes 0 to 3, with strides from -6 to 6 (a negative one in each)."""
    pick = random.Random(7)
    found = []
    for dims in (1, 2, 3):
        for shape in itertools.product(range(4), repeat=dims):
            for _ in range(3):
                stride = [pick.randint(-6, 6) for _ in shape]
                stride[pick.randrange(dims)] = -pick.randint(1, 6)
                found.append((shape, tuple(stride), pick.randint(0, 3)))
    return found


def test_strides_are_torchs_and_refusals_are_torchs(tmp_path: Path) -> None:
    checked = 0
    for number, (shape, stride, offset) in enumerate(layouts()):
        path = tmp_path / f"{number}.pth"
        view = View(StorageRef(numel=64), offset, shape, stride)
        write_zip(path, torch_zip_members(pickle_with_pids({"w": view}), {"0": bytes(256)}))
        try:
            loaded = torch.load(path, weights_only=True)["w"]
        except RuntimeError:
            loaded = None
        checkpoint = open_checkpoint(path)
        report = check_checkpoint(checkpoint)
        if loaded is None:
            assert not report.ok, (shape, stride)
            continue
        assert checkpoint.root["w"].stride == loaded.stride(), (shape, stride)
        assert report.ok, (shape, stride, [p.message for p in report.problems])
        checked += 1
    assert checked > 100
