"""The rebuild functions torch's allowlist names beside ``_rebuild_tensor_v2`` (device copies, numpy, wrapper
subclasses, nested and quantized tensors) and BUILD slot state on a Counter, judged by the real ``torch.load``
and by ckpt-tui: torch's own answer where the emulation models it, "cannot tell" where it does not, never
"loads" (or a clean ``check``) where torch refuses."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
import torch
from differential.assemble import Build, Call, G, Pid
from differential.run import Outcome, describe, judge
from test_differential_cases import OD, meta, v2, zip_file

UTILS = "torch._utils"


def counter_slots(slots: dict[str, object], state: object = None) -> Build:
    """A Counter given BUILD ``(state, slots)``: torch's load_build sets each slot item with setattr."""
    return Build(Call(G("collections", "Counter"), ()), (state, slots))


def from_cpu(data: object = None, dtype: object = None, device: object = "cpu", grad: object = False) -> Call:
    args = (v2() if data is None else data, dtype, device, grad)
    return Call(G(UTILS, "_rebuild_device_tensor_from_cpu_tensor"), args)


def from_numpy(data: object) -> Call:
    return Call(G(UTILS, "_rebuild_device_tensor_from_numpy"), (data, G("torch", "float32"), "cpu", False))


def wrapper(cls: G) -> Call:
    layout = Call(G("torch.serialization", "_get_layout"), ("torch.strided",))
    device = Call(G("torch", "device"), ("cpu",))
    args = (cls, G("torch", "float32"), (3,), (1,), 0, layout, device, False)
    return Call(G(UTILS, "_rebuild_wrapper_subclass"), args)


def qtensor(grad: object) -> Call:
    storage = Pid(("storage", G("torch", "QInt8Storage"), "0", "cpu", 24))
    params = (G("torch", "per_tensor_affine"), 0.5, 0)
    return Call(G(UTILS, "_rebuild_qtensor"), (storage, 0, (24,), (1,), params, grad, OD))


def typed_storage(size: tuple[int, ...], *args: object, cls: str = "TypedStorage") -> Call:
    storage = Call(G("torch.storage", cls), args)
    stride = (size[1], 1) if len(size) == 2 else (1,)
    return Call(G(UTILS, "_rebuild_tensor_v2"), (storage, 0, size, stride, False, OD))


def sparse_coo(size: tuple[int, ...]) -> Call:
    """An empty COO tensor (two sparse dims) of this size, over int64 parts of no elements."""

    def part(shape: tuple[int, ...]) -> Call:
        storage = Pid(("storage", G("torch", "LongStorage"), "0", "cpu", 3))
        return Call(G(UTILS, "_rebuild_tensor_v2"), (storage, 0, shape, (1,) * len(shape), False, OD))

    layout = Call(G("torch.serialization", "_get_layout"), ("torch.sparse_coo",))
    values = part((0, *size[2:]))
    return Call(G(UTILS, "_rebuild_sparse_tensor"), (layout, (part((2, 0)), values, size, False)))


F16, I64 = G("torch", "float16"), G("torch", "int64")

EMULATED: dict[str, object] = {
    # F8: BUILD slot state on a Counter
    "Counter slot __class__ = OrderedDict": counter_slots({"__class__": G("collections", "OrderedDict")}),
    "Counter slot __class__ = torch.Size": counter_slots({"__class__": G("torch", "Size")}),
    "Counter slot __class__ = 5": counter_slots({"__class__": 5}),
    "Counter slot __class__ = Counter": counter_slots({"__class__": G("collections", "Counter")}),
    "Counter slot __dict__ = 5": counter_slots({"__dict__": 5}),
    "Counter slot __dict__ = [1]": counter_slots({"__dict__": [1]}),
    "Counter slot __dict__ = {x: 1}": counter_slots({"__dict__": {"x": 1}}),
    "Counter slot __dict__ = OrderedDict()": counter_slots({"__dict__": OD}),
    "Counter slot __weakref__ = None": counter_slots({"__weakref__": None}),
    "Counter slot keys = 1": counter_slots({"keys": 1}),
    "Counter slot x, then __dict__ = 5": counter_slots({"x": 1, "__dict__": 5}),
    "Counter state {x: 1}, slot y": counter_slots({"y": 2}, {"x": 1}),
    # F12: _rebuild_device_tensor_from_cpu_tensor
    "from_cpu float16 on cpu": from_cpu(dtype=F16),
    "from_cpu dtype None": from_cpu(),
    "from_cpu device None": from_cpu(device=None),
    "from_cpu on meta": from_cpu(device="meta"),
    "from_cpu on cpu:3": from_cpu(device="cpu:3"),
    "from_cpu of a list": from_cpu(data=[1.0]),
    "from_cpu of an int": from_cpu(data=3),
    "from_cpu dtype 'float32'": from_cpu(dtype="float32"),
    "from_cpu dtype 1": from_cpu(dtype=1),
    "from_cpu int64 requires_grad": from_cpu(dtype=I64, grad=True),
    "from_cpu float requires_grad": from_cpu(grad=True),
    "from_cpu requires_grad 'x'": from_cpu(grad="x"),
    "from_cpu requires_grad 1": from_cpu(grad=1),
    "from_cpu requires_grad None": from_cpu(grad=None),
    "from_cpu of a meta tensor on cpu": from_cpu(data=meta(), device="cpu"),
    # _rebuild_device_tensor_from_numpy: only a numpy array (a refused global) would do
    "from_numpy of a tensor": from_numpy(v2()),
    "from_numpy of a list": from_numpy([1.0, 2.0]),
    # _rebuild_wrapper_subclass: no class torch allowlists defines __torch_dispatch__
    "wrapper subclass torch.Tensor": wrapper(G("torch", "Tensor")),
    "wrapper subclass Parameter": wrapper(G("torch.nn.parameter", "Parameter")),
    "wrapper subclass torch.FloatTensor": wrapper(G("torch", "FloatTensor")),
    # _rebuild_qtensor sets requires_grad on a quantized tensor
    "qint8 requires_grad True": qtensor(True),
    "qint8 requires_grad False": qtensor(False),
    "qint8 requires_grad 1": qtensor(1),
    # a storage built by calling TypedStorage (allowlisted): the default dtype, of a size or of numbers
    "TypedStorage([5.0, 6.0, 7.0]) under a tensor": typed_storage((3,), [5.0, 6.0, 7.0]),
    "TypedStorage([1, True, 2.5]) under a tensor": typed_storage((3,), [1, True, 2.5]),
    "TypedStorage(4) under a tensor": typed_storage((2, 2), 4),
    "TypedStorage(2) under a tensor of 3": typed_storage((3,), 2),
    "TypedStorage(-1)": typed_storage((0,), -1),
    "TypedStorage('ab')": typed_storage((2,), "ab"),
    "TypedStorage() under an empty tensor": typed_storage((0,)),
    # each number becomes a float as Python converts it: an int past the float range fails, one below is inf
    "TypedStorage([2**1100]) under a tensor": typed_storage((1,), [2**1100]),
    "TypedStorage([1.0, -(2**1024)]) under a tensor": typed_storage((2,), [1.0, -(2**1024)]),
    "TypedStorage([2**1000]) under a tensor": typed_storage((1,), [2**1000]),
    # a sparse tensor's element count: refused past 2**64 even where a later 0 makes it 0, as a meta tensor's
    "sparse COO of size (3, 4)": sparse_coo((3, 4)),
    "sparse COO of size (2**32, 2**32, 0)": sparse_coo((2**32, 2**32, 0)),
    "sparse COO of size (2**40, 2**30)": sparse_coo((2**40, 2**30)),
    "sparse COO of size (0, 2**62, 2**62)": sparse_coo((0, 2**62, 2**62)),
    "sparse COO of size (2**62, 3)": sparse_coo((2**62, 3)),
    "sparse COO of size (2**40, 2**30, 0)": sparse_coo((2**40, 2**30, 0)),
    "sparse COO of size (2**62, 2, 0)": sparse_coo((2**62, 2, 0)),
    # nested tensors with parts that are not tensors
    "nested of lists": Call(G(UTILS, "_rebuild_nested_tensor"), ([1.0], [[1]], [[1]], [0])),
}
"""Each value is pickled as ``{"a": value}`` into a zip checkpoint whose one record holds 24 bytes."""

WITHOUT_MAP_LOCATION: dict[str, object] = {
    "from_cpu on 'nonsense'": from_cpu(device="nonsense"),
    "from_cpu on 'CPU'": from_cpu(device="CPU"),
    "from_cpu on a list": from_cpu(device=["cpu"]),
}
"""Devices ``torch.load(path)`` refuses, which ``map_location="cpu"`` (the differential run's) replaces: the
verdict answers for ``torch.load(path)`` and says so."""

NOT_EMULATED: dict[str, object] = {
    "from_cpu of a meta tensor on meta": from_cpu(data=meta(), device="meta"),
    "from_cpu of a meta tensor, device None": from_cpu(data=meta(), device=None),
    "from_cpu on cuda": from_cpu(device="cuda"),
    "from_cpu on device 0": from_cpu(device=0),
    "from_cpu on torch.device('cpu')": from_cpu(device=Call(G("torch", "device"), ("cpu",))),
    "from_cpu of a tensor that requires grad, without it": from_cpu(data=v2(grad=True), dtype=F16),
    "TypedStorage([[1.0]])": typed_storage((1,), [[1.0]]),
    "UntypedStorage(12) under a tensor": typed_storage((3,), 12, cls="UntypedStorage"),
    "UntypedStorage([1, 2, 3]) under a tensor": typed_storage((3,), [1, 2, 3], cls="UntypedStorage"),
}
"""Cases whose answer depends on what is not modelled (the machine's devices, autograd's leaves)."""


def _nested(folder: Path, name: str, offsets: list[int] | None = None, sizes: list[int] | None = None) -> Path:
    """A nested tensor saved by torch; its offsets or sizes record then rewritten (records 1: sizes, 3: offsets)."""
    buffer = io.BytesIO()
    torch.save({"n": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])}, buffer)
    members = {}
    with zipfile.ZipFile(buffer) as source:
        for info in source.infolist():
            members[info.filename] = source.read(info)
    prefix = next(n for n in members if n.endswith("data.pkl"))[: -len("data.pkl")]
    if offsets is not None:
        members[prefix + "data/3"] = torch.tensor(offsets, dtype=torch.int64).numpy().tobytes()
    if sizes is not None:
        members[prefix + "data/1"] = torch.tensor(sizes, dtype=torch.int64).numpy().tobytes()
    path = folder / name / f"{name}.pth"
    path.parent.mkdir()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as out:
        for member, data in members.items():
            out.writestr(member, data)
    return path


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    folder = tmp_path_factory.mktemp("rebuilds")
    files = {}
    for number, (name, value) in enumerate({**EMULATED, **WITHOUT_MAP_LOCATION, **NOT_EMULATED}.items()):
        (folder / f"r{number}").mkdir()
        files[name] = zip_file(folder / f"r{number}" / f"r{number}.pth", value)
    files["nested, as saved"] = _nested(folder, "n0")
    files["nested, an offset past the buffer"] = _nested(folder, "n1", offsets=[0, 100000])
    files["nested, a negative offset"] = _nested(folder, "n2", offsets=[0, -1])
    files["nested, a size past the buffer"] = _nested(folder, "n3", sizes=[2, 30])
    files["nested, the last component one past the buffer"] = _nested(folder, "n4", offsets=[0, 3])
    return dict(zip(files, judge(list(files.values())), strict=True))


def test_emulated_rebuilds_get_torchs_own_answer(outcomes: dict[str, Outcome]) -> None:
    wrong = []
    for name in EMULATED:
        outcome = outcomes[name]
        torch_says = "loads" if outcome.torch_true == "loads" else "refuses"
        # (a tensor these functions make loads unread: check may report that, never call a refused file clean)
        if outcome.ours != torch_says or (outcome.clean and torch_says != "loads"):
            wrong.append(f"{name}: {describe(outcome)}")
    assert not wrong, "\n".join(wrong)


def test_a_device_only_map_location_makes_valid_is_refused_with_that_hint(outcomes: dict[str, Outcome]) -> None:
    for name in WITHOUT_MAP_LOCATION:
        outcome = outcomes[name]
        assert outcome.torch_true == "loads", describe(outcome)  # under map_location="cpu"
        assert outcome.ours == "refuses" and "map_location" in outcome.reason, describe(outcome)


def test_the_cases_hold_both_answers(outcomes: dict[str, Outcome]) -> None:
    answers = {outcomes[name].torch_true == "loads" for name in EMULATED}
    assert answers == {True, False}


def test_what_is_not_modelled_is_cannot_tell_and_check_reports_it(outcomes: dict[str, Outcome]) -> None:
    for name in [*NOT_EMULATED, *(n for n in outcomes if n.startswith("nested, "))]:
        outcome = outcomes[name]
        assert outcome.ours == "cannot tell" and not outcome.clean, (name, describe(outcome))


def test_nested_tensors_out_of_their_buffer_are_refused_by_torch(outcomes: dict[str, Outcome]) -> None:
    """The fixtures do what they claim: torch loads the saved one and refuses the ones out of the buffer."""
    assert outcomes["nested, as saved"].torch_true == "loads"
    for name in ("an offset past the buffer", "a size past the buffer", "the last component one past the buffer"):
        assert outcomes[f"nested, {name}"].torch_true.startswith("refuses"), name


def test_no_rebuild_case_is_called_loads_where_torch_refuses(outcomes: dict[str, Outcome]) -> None:
    bad = [f"{name}: {describe(o)}" for name, o in outcomes.items() if o.bad or o.broken]
    assert not bad, "\n".join(bad)
