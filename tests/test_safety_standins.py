"""The reader's stand-ins refuse state they did not validate (issue 9 §3, BUILD on stand-ins).

pickle's BUILD calls ``__setstate__`` (or updates ``__dict__``) on whatever is on the stack. A file
could apply it to a tensor after ``_rebuild_tensor_v2`` validated its shape and storage, to a
rebuild function (changing it for every later file), or to an OrderedDict (shadowing ``items``).
Each is a one-line error; what torch itself writes still reads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from builders_readers import StorageRef, View, pickle_with_pids, torch_zip_members, write_zip

from ckpt_tui.cli import main
from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model.tree import Tensor
from ckpt_tui.core.readers.open import open_checkpoint

MARK = "@@built@@"


def built_file(tmp_path: Path, target: object, state: bytes) -> Path:
    """A torch zip whose ``x`` is ``target`` with BUILD applied using the pickled ``state`` (protocol 2)."""
    data_pkl = pickle_with_pids({"w": View(StorageRef(numel=4), 0, (4,), (1,)), "x": target, "y": MARK})
    marker = b"X" + len(MARK).to_bytes(4, "little") + MARK.encode()
    # the value of "x" is the last thing before the "y" key; apply BUILD to it right there
    head, _, tail = data_pkl.partition(b"X\x01\x00\x00\x00y")
    data_pkl = head + state + b"b" + b"X\x01\x00\x00\x00y" + tail
    assert marker in data_pkl
    return write_zip(tmp_path / "built.pth", torch_zip_members(data_pkl, {"0": bytes(16)}))


def refused(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(ReadError):
        open_checkpoint(path)
    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


SHAPE_STATE = b"}X\x05\x00\x00\x00shape(J\x00\xe1\xf5\x05tu"  # {"shape": (100000000,)}


def test_build_on_a_tensor_after_it_was_validated_is_refused(tmp_path: Path, capsys) -> None:
    path = built_file(tmp_path, View(StorageRef(numel=4), 0, (4,), (1,)), SHAPE_STATE)
    refused(path, capsys)


def test_build_on_a_tensor_with_a_slot_state_is_refused(tmp_path: Path, capsys) -> None:
    state = b"N}X\x06\x00\x00\x00offset(J\x00\x00\x00\x01u\x86"  # (None, {"offset": 16777216})
    path = built_file(tmp_path, View(StorageRef(numel=4), 0, (4,), (1,)), state)
    refused(path, capsys)


def test_build_on_an_ordered_dict_shadowing_its_methods_is_refused(tmp_path: Path, capsys) -> None:
    from collections import OrderedDict

    state = b"}X\x05\x00\x00\x00itemsK\x01s"  # {"items": 1}
    refused(built_file(tmp_path, OrderedDict(a=1), state), capsys)


def test_metadata_that_is_not_a_dict_of_str_keys_is_refused(tmp_path: Path, capsys) -> None:
    from collections import OrderedDict

    state = b"}X\t\x00\x00\x00_metadata}K\x01K\x02ss"  # {"_metadata": {1: 2}}
    refused(built_file(tmp_path, OrderedDict(a=1), state), capsys)
    state = b"}X\t\x00\x00\x00_metadata]s"  # {"_metadata": []}
    refused(built_file(tmp_path, OrderedDict(a=1), state), capsys)


@pytest.mark.parametrize(
    "target",
    [torch.float32, torch.Size([2, 3]), torch.device("cpu"), torch.strided],
    ids=["dtype", "size", "device", "layout"],
)
def test_build_on_a_torch_constant_is_refused(tmp_path: Path, target: object, capsys) -> None:
    refused(built_file(tmp_path, target, b"}X\x01\x00\x00\x00aK\x01s"), capsys)


def test_build_on_a_rebuild_function_is_refused_and_changes_nothing(tmp_path: Path, capsys) -> None:
    data_pkl = b"\x80\x02}(X\x01\x00\x00\x00xctorch._utils\n_rebuild_tensor_v2\n}X\x08\x00\x00\x00__code__K\x01sbu."
    path = write_zip(tmp_path / "fn.pth", torch_zip_members(data_pkl, {}))
    refused(path, capsys)
    fine = tmp_path / "fine.pth"
    torch.save({"w": torch.arange(4.0)}, fine)
    assert open_checkpoint(fine).root["w"].shape == (4,)


def test_what_torch_writes_with_state_still_reads(tmp_path: Path) -> None:
    """Tensors and parameters carrying Python attributes: torch pickles their state through BUILD-free rebuilds."""
    tensor = torch.arange(4.0)
    tensor.note = "kept"  # type: ignore[attr-defined]
    parameter = torch.nn.Parameter(torch.ones(2))
    parameter.tag = 3  # type: ignore[attr-defined]
    path = tmp_path / "state.pth"
    torch.save({"t": tensor, "p": parameter, "frozen": torch.nn.Parameter(torch.ones(1), requires_grad=False)}, path)
    root = open_checkpoint(path).root
    assert isinstance(root["t"], Tensor) and root["t"].shape == (4,)
    assert root["p"].parameter and root["p"].requires_grad
    assert root["frozen"].parameter and not root["frozen"].requires_grad
    assert main(["convert", str(path), "-o", str(tmp_path / "out.pth")]) == 0
    loaded = torch.load(tmp_path / "out.pth", weights_only=False)
    assert torch.equal(loaded["t"], tensor) and loaded["p"].requires_grad
