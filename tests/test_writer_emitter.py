"""The emitter's short way for usual tensors writes exactly what its general way writes, and refuses the same."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch

from ckpt_tui.core.errors import WriteError
from ckpt_tui.core.model.tree import Storage, Tensor
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.writers.pickle_emitter import PickleWriter


def general_way_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PickleWriter, "_save_usual_entries", lambda self, items, index, stop: index)


def emitted(root: Any) -> bytes:
    return PickleWriter(lambda s: s.key).dump(root)


def varied_tree() -> OrderedDict[str, Any]:
    """Usual tensors of several layouts and geometries, tied ones, views, and tensors that are not usual."""
    float_storage = Storage("0", "float32", "cpu", 400)
    tree: OrderedDict[str, Any] = OrderedDict()
    for index in range(600):
        storage = Storage(str(index + 1), ("float32", "float16", "int64")[index % 3], ("cpu", "cuda:0")[index % 2], 12)
        shape, stride = ((3, 4), (4, 1)) if index % 4 else ((4, 3), (1, 4))
        tree[f"layer.{index}.w"] = Tensor(storage, 0, shape, stride, storage.dtype, requires_grad=index % 5 == 0)
    for index in range(50):
        tree[f"view.{index}"] = Tensor(float_storage, index * 8, (2, 4), (4, 1), "float32")
    tree["tied"] = tree["layer.7.w"]
    tree["hooked"] = Tensor(float_storage, 0, (4,), (1,), "float32", hooks=OrderedDict(h=1))
    tree["neg"] = Tensor(float_storage, 0, (4,), (1,), "float32", metadata={"neg": True})
    tree["param"] = Tensor(float_storage, 0, (4,), (1,), "float32", parameter=True)
    tree["x" * 80] = Tensor(float_storage, 4, (4,), (1,), "float32")  # a long key
    tree["cast"] = Tensor(float_storage, 0, (4,), (1,), "float16")  # a dtype other than its storage's
    tree["untyped"] = Tensor(Storage("u", "float32", "cpu", 4, type_name="UntypedStorage"), 0, (4,), (1,), "float32")
    tree["nested"] = {"a": [tree["layer.3.w"], Tensor(float_storage, 0, (4,), (1,), "float32")]}
    return tree


def test_the_short_way_writes_the_same_bytes_as_the_general_way(monkeypatch: pytest.MonkeyPatch) -> None:
    tree = varied_tree()
    short = PickleWriter(lambda s: s.key)
    data = short.dump(tree)
    general_way_only(monkeypatch)
    general = PickleWriter(lambda s: s.key)
    assert data == general.dump(tree)
    assert short.tensors == general.tensors == 600 + 50 + 7 + 2  # a tied tensor counts at each place


def test_a_written_tree_of_usual_tensors_loads_in_torch(tmp_path: Path) -> None:
    state = {f"b.{i}.w": torch.randn(i % 3 + 1, 4, requires_grad=i % 2 == 0).detach() for i in range(400)}
    state["b.0.view"] = state["b.0.w"][:, 1:]
    torch.save(state, tmp_path / "in.pth")
    from ckpt_tui.core.writers.save import save

    save(open_checkpoint(tmp_path / "in.pth").root, tmp_path / "out.pth")
    loaded = torch.load(tmp_path / "out.pth", weights_only=True)
    assert list(loaded) == list(state)
    for name, tensor in state.items():
        assert torch.equal(loaded[name], tensor) and loaded[name].stride() == tensor.stride()
    assert loaded["b.0.view"].untyped_storage().data_ptr() == loaded["b.0.w"].untyped_storage().data_ptr()


def test_a_tensor_reaching_past_its_storage_is_refused_after_many_usual_ones() -> None:
    tree = OrderedDict(
        (f"w{i}", Tensor(Storage(str(i), "float32", "cpu", 12), 0, (3, 4), (4, 1), "float32")) for i in range(5)
    )
    tree["past"] = Tensor(Storage("p", "float32", "cpu", 12), 1, (3, 4), (4, 1), "float32")  # a geometry not seen yet
    with pytest.raises(WriteError, match=r"needs 52 bytes of a 48-byte storage .* at ckpt\[\"past\"\]"):
        emitted(tree)
    tree = OrderedDict(
        (f"w{i}", Tensor(Storage(str(i), "float32", "cpu", 12), 0, (3, 4), (4, 1), "float32")) for i in range(5)
    )
    tree["small"] = Tensor(Storage("s", "float32", "cpu", 11), 0, (3, 4), (4, 1), "float32")  # a smaller storage
    with pytest.raises(WriteError, match=r"needs 48 bytes of a 44-byte storage .* at ckpt\[\"small\"\]"):
        emitted(tree)
