"""Hand-written pickles on the edges of torch's rules, each judged by us and by the real torch.load.

Tensor state (``_set_obj_state``'s setattr on a rebuilt tensor), files ckpt-tui's reader refuses that
torch loads, legacy tensor constructors, and classes that only look like enums.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from builders_weights_only import write_zip_members
from test_weights_only import run_oracle

from ckpt_tui.cli import main
from ckpt_tui.core.weights_only.verdict import scan_file, verdict_from_scan

# ---- pickle opcodes by hand ---------------------------------------------------------------------------


def G(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def U(text: str) -> bytes:
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def I(number: int) -> bytes:  # noqa: E743
    return b"K" + bytes([number]) if 0 <= number < 256 else b"J" + struct.pack("<i", number)


def T(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


def D(**items: bytes) -> bytes:
    return b"}(" + b"".join(U(k) + v for k, v in items.items()) + b"u"


TRUE, FALSE, NONE, BUILD = b"\x88", b"\x89", b"N", b"b"
OD = G("collections", "OrderedDict") + b")R"


KEYS = {"FloatStorage": "0", "LongStorage": "1", "DoubleStorage": "2"}
"""One storage record per dtype (torch caches storages by key: a second type on one key reuses the first)."""


def pid(numel: int = 4, dtype: str = "FloatStorage") -> bytes:
    return T(U("storage"), G("torch", dtype), U(KEYS[dtype]), U("cpu"), I(numel)) + b"Q"


def tensor(size: int = 4, dtype: str = "FloatStorage") -> bytes:
    return G("torch._utils", "_rebuild_tensor_v2") + T(pid(4, dtype), I(0), T(I(size)), T(I(1)), FALSE, OD) + b"R"


def from_type(state: bytes, new_type: bytes = G("torch", "Tensor")) -> bytes:
    args = T(pid(), I(0), T(I(4)), T(I(1)), FALSE, OD)
    return (
        G("torch._tensor", "_rebuild_from_type_v2")
        + T(G("torch._utils", "_rebuild_tensor_v2"), new_type, args, state)
        + b"R"
    )


def with_state(state: bytes, requires_grad: bytes = TRUE, data: bytes | None = None) -> bytes:
    inner = tensor() if data is None else data
    return G("torch._utils", "_rebuild_parameter_with_state") + T(inner, requires_grad, OD, state) + b"R"


def rebuilt(metadata: bytes) -> bytes:
    """A float tensor with ``metadata`` as _rebuild_tensor_v2's seventh argument."""
    return G("torch._utils", "_rebuild_tensor_v2") + T(pid(), I(0), T(I(4)), T(I(1)), FALSE, OD, metadata) + b"R"


def coo(nnz: int, values: int, size: tuple[int, ...], dense: int = 0, coalesced: bytes = FALSE) -> bytes:
    """A sparse COO tensor: int64 indices (1, nnz), float32 values (values[, dense]) over one storage each."""
    rebuild = G("torch._utils", "_rebuild_tensor_v2")
    indices = rebuild + T(pid(4, "LongStorage"), I(0), T(I(1), I(nnz)), T(I(nnz), I(1)), FALSE, OD) + b"R"
    shape = T(I(values), I(dense)) if dense else T(I(values))
    strides = T(I(dense), I(1)) if dense else T(I(1))
    vals = rebuild + T(pid(4), I(0), shape, strides, FALSE, OD) + b"R"
    dims = T(*(I(n) if n >= 0 else b"J" + struct.pack("<i", n) for n in size))
    layout = G("torch.serialization", "_get_layout") + T(U("torch.sparse_coo")) + b"R"
    return G("torch._utils", "_rebuild_sparse_tensor") + T(layout, T(indices, vals, dims, coalesced)) + b"R"


REQUIRES_GRAD = G("torch._utils", "_rebuild_tensor_v2") + T(pid(), I(0), T(I(4)), T(I(1)), TRUE, OD) + b"R"


def torch_zip(path: Path, body: bytes, header: bytes = b"\x80\x02", numel_bytes: int = 16) -> Path:
    data = header + D(w=tensor(), x=body) + b"."
    members = {"a/data.pkl": data, "a/byteorder": b"little", "a/data/0": bytes(numel_bytes), "a/version": b"3\n"}
    members.update({"a/data/1": bytes(32), "a/data/2": bytes(32)})
    return write_zip_members(path, members)


# ---- the cases ------------------------------------------------------------------------------------------------

STATE_CASES = {
    "state is an int": from_type(I(5)),
    "state sets data to an int": from_type(D(data=I(3))),
    "state sets grad to an int": with_state(D(grad=I(3))),
    "state sets requires_grad to a str": with_state(D(requires_grad=U("x"))),
    "state sets shape": from_type(D(shape=I(1))),
    "state sets __dict__ to an int": from_type(D(__dict__=I(1))),
    "slot state is an int": from_type(T(NONE, I(1))),
    "state sets is_leaf": with_state(D(is_leaf=TRUE)),
    "state is a 3-tuple": from_type(T(NONE, NONE, NONE)),
    "state sets grad to a float64 tensor": from_type(D(grad=tensor(4, "DoubleStorage"))),
    "state sets requires_grad on an int tensor": with_state(D(requires_grad=TRUE), FALSE, tensor(4, "LongStorage")),
    "state sets data to an int tensor on a parameter that requires grad": with_state(D(data=tensor(4, "LongStorage"))),
    "state sets _grad_fn": from_type(D(_grad_fn=I(1))),
    "state sets an attribute named by an int": from_type(b"}" + I(1) + I(2) + b"s"),
    "state is a non-empty list": from_type(b"]" + I(1) + b"a"),
    "Parameter BUILD with requires_grad a str": with_state(NONE) + T(U("x"), NONE, NONE) + BUILD,
    "Parameter BUILD with 2 items": with_state(NONE) + T(TRUE, NONE) + BUILD,
    "Parameter BUILD with 5 items, data an int": with_state(NONE) + T(I(1), NONE, NONE, TRUE, NONE) + BUILD,
    "Parameter BUILD with (False, None, None)": with_state(NONE) + T(FALSE, NONE, NONE) + BUILD,
    "Parameter BUILD with 5 items": with_state(NONE) + T(tensor(), NONE, OD, FALSE, NONE) + BUILD,
    "_rebuild_parameter with a state argument": G("torch._utils", "_rebuild_parameter")
    + T(tensor(), TRUE, OD, NONE)
    + b"R",
    "_rebuild_from_type_v2 of an OrderedDict": G("torch._tensor", "_rebuild_from_type_v2")
    + T(G("collections", "OrderedDict"), G("torch", "Tensor"), b")", NONE)
    + b"R",
    "tensor BUILD (storage, 'x')": tensor() + T(pid(), U("x")) + BUILD,
    "tensor BUILD (storage, 0)": tensor() + T(pid(), I(0)) + BUILD,
    "tensor BUILD past the storage's end": tensor() + T(pid(), I(0), T(I(8)), T(I(1))) + BUILD,
    "tensor BUILD (long storage,)": tensor() + T(pid(4, "LongStorage")) + BUILD,
    "tensor BUILD (long tensor,)": tensor() + T(tensor(4, "LongStorage")) + BUILD,
    "tensor BUILD on one that requires grad": REQUIRES_GRAD + T(pid()) + BUILD,
    "tensor BUILD with a dict": tensor() + D(foo=I(1)) + BUILD,
    "bytearray of text with rot13": G("builtins", "bytearray") + T(U("ab"), U("rot13")) + b"R",
    "_codecs.encode of text with hex": G("_codecs", "encode") + T(U("ab"), U("hex")) + b"R",
    "_codecs.encode of text with zlib": G("_codecs", "encode") + T(U("ab"), U("zlib")) + b"R",
    "_codecs.encode with an unknown encoding": G("_codecs", "encode") + T(U("ab"), U("nonesuch")) + b"R",
    "_codecs.encode latin1 of a euro sign": G("_codecs", "encode") + T(U("\u20ac"), U("latin1")) + b"R",
    "torch.Size of a str": G("torch", "Size") + T(U("ab")) + b"R",
    "tensor metadata sets conj on a float tensor": rebuilt(D(conj=TRUE)),
    "tensor metadata sets conj to False on a float tensor": rebuilt(D(conj=FALSE)),
    "tensor metadata holds a str": rebuilt(D(neg=U("x"))),
    "tensor metadata is a non-empty list": rebuilt(b"]" + I(1) + b"a"),
    "meta tensor with a negative size": G("torch._utils", "_rebuild_meta_tensor_no_storage")
    + T(G("torch", "float32"), T(I(255) + b"J" + struct.pack("<i", -1)), T(I(1), I(1)), FALSE)
    + b"R",
    "state sets grad to a float32 tensor of the wrong size": from_type(D(grad=tensor(2))),
    "sparse COO whose indices and values differ in nnz": coo(2, 3, (5,)),
    "sparse COO whose size has too many dims": coo(2, 2, (5, 5)),
    "sparse COO whose dense sizes differ": coo(2, 2, (5, 3), dense=2),
    "sparse COO with a negative size": coo(2, 2, (-1,)),
    "sparse COO with is_coalesced a str": coo(2, 2, (5,), coalesced=U("x")),
    # accepted
    "state sets grad to a float32 tensor of the right size": from_type(D(grad=tensor(4))),
    "sparse COO": coo(2, 2, (5,)),
    "sparse COO with a dense dim": coo(2, 2, (5, 2), dense=2),
    "sparse COO with indices out of bounds (not validated by default)": coo(2, 2, (1,)),
    "tensor metadata sets neg": rebuilt(D(neg=TRUE)),
    "tensor metadata with another key": rebuilt(D(foo=I(1))),
    "tensor metadata is an empty list": rebuilt(b"]"),
    "tensor metadata is an OrderedDict": rebuilt(OD + U("neg") + I(1) + b"s"),
    "tensor BUILD (storage,)": tensor() + T(pid()) + BUILD,
    "tensor BUILD (tensor,)": tensor() + T(tensor()) + BUILD,
    "tensor BUILD (storage, 0, (4,), (1,))": tensor() + T(pid(), I(0), T(I(4)), T(I(1))) + BUILD,
    "tensor BUILD ()": tensor() + b")" + BUILD,
    "bytearray of text with utf-8": G("builtins", "bytearray") + T(U("ab"), U("utf-8")) + b"R",
    "bytearray of True": G("builtins", "bytearray") + T(TRUE) + b"R",
    "_codecs.encode of hex bytes": G("_codecs", "encode")
    + T(G("_codecs", "encode") + T(U("ab"), U("latin1")) + b"R", U("hex"))
    + b"R",
    "_codecs.encode with an unknown error handler": G("_codecs", "encode") + T(U("ab"), U("utf-8"), U("bogus")) + b"R",
    "torch.Size of a list of bools": G("torch", "Size") + T(b"]" + TRUE + b"a") + b"R",
    "state sets a plain attribute": from_type(D(foo=I(1))),
    "state sets __dict__ to a dict": with_state(D(__dict__=D(foo=I(1)))),
    "state sets requires_grad to False": with_state(D(requires_grad=FALSE)),
    "state sets data to a float64 tensor": with_state(D(data=tensor(4, "DoubleStorage"))),
    "state sets grad to None": from_type(D(grad=NONE)),
    "state sets _backward_hooks to an int": from_type(D(_backward_hooks=I(1))),
    "state is zero": from_type(I(0)),
    "state is (None, dict)": with_state(T(NONE, D(foo=I(2)))),
    "state is an empty list": from_type(b"]"),
    "parameter by _rebuild_from_type_v2 with state": from_type(D(foo=I(1)), G("torch.nn.parameter", "Parameter")),
}
MAY_REFUSE = {  # torch checks what is not emulated: never "loads"
    "state sets grad to a tensor that was BUILD": from_type(D(grad=tensor() + T(pid()) + BUILD)),
    "state sets real": from_type(D(real=I(1))),
}
READER_CASES = {
    "NEWOBJ Parameter": G("torch.nn.parameter", "Parameter") + T(tensor()) + b"\x81",
    "NEWOBJ Tensor": G("torch", "Tensor") + b")\x81",
    "REDUCE torch.Tensor()": G("torch", "Tensor") + b")R",
    "stride None": G("torch._utils", "_rebuild_tensor_v2") + T(pid(), I(0), T(I(4)), NONE, FALSE, OD) + b"R",
    "stride None on _rebuild_tensor": G("torch._utils", "_rebuild_tensor") + T(pid(), I(0), T(I(2), I(2)), NONE) + b"R",
    "OrderedDict BUILD with an attribute": OD + D(foo=I(1)) + BUILD,
    "OrderedDict BUILD of _metadata twice": OD + D(_metadata=b"}") + BUILD + D(_metadata=b"}") + BUILD,
    "set BUILD with an empty dict": G("builtins", "set") + b")R}" + BUILD,
    "device BUILD with an empty dict": G("torch", "device") + T(U("cpu")) + b"R}" + BUILD,
    "device BUILD with an attribute": G("torch", "device") + T(U("cpu")) + b"R" + D(foo=I(1)) + BUILD,
    "torch.Size BUILD with (None, None)": G("torch", "Size") + T(T(I(1))) + b"R" + T(NONE, NONE) + BUILD,
    "bytearray of an int": G("builtins", "bytearray") + T(b"J" + struct.pack("<i", 10**6)) + b"R",
    "bytearray of 16 MiB of zeros (the reader refuses, torch loads)": G("builtins", "bytearray")
    + T(b"J" + struct.pack("<i", 1 << 24))
    + b"R",
    "bytearray of a negative int": G("builtins", "bytearray") + T(b"J" + struct.pack("<i", -1)) + b"R",
    "_codecs.encode rot13": G("_codecs", "encode") + T(U("x"), U("rot13")) + b"R",
    "_codecs.encode utf-16": G("_codecs", "encode") + T(U("x"), U("utf-16")) + b"R",
    "LONG_BINPUT at 0xffffffff": tensor() + b"r\xff\xff\xff\xff",
    "legacy constructor torch.FloatTensor([1])": G("torch", "FloatTensor") + T(b"]" + I(1) + b"a") + b"R",
    "legacy constructor torch.LongTensor()": G("torch", "LongTensor") + b")R",
}


def _build(folder: Path) -> dict[str, Path]:
    paths = {}
    for index, (name, body) in enumerate({**STATE_CASES, **MAY_REFUSE, **READER_CASES}.items()):
        paths[name] = torch_zip(folder / f"c{index}.pth", body)
    paths["protocol byte 0xff"] = torch_zip(folder / "proto.pth", b"N", header=b"\x80\xff")
    return paths


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any, dict[str, Any]]]:
    """Each case: its file, our verdict, and torch.load(weights_only=True)'s result."""
    paths = _build(tmp_path_factory.mktemp("opcodes"))
    results = run_oracle([{"path": str(p)} for p in paths.values()])["results"]
    return {
        name: (path, verdict_from_scan(scan_file(str(path)), None), result)
        for (name, path), result in zip(paths.items(), results, strict=True)
    }


@pytest.mark.parametrize("name", [*STATE_CASES, *READER_CASES, "protocol byte 0xff"])
def test_verdict_agrees_with_torch_load(judged: dict[str, tuple[Path, Any, dict[str, Any]]], name: str) -> None:
    _, ours, torch_result = judged[name]
    assert ours.loads == torch_result["loads"], f"ours: {ours.to_json()}\ntorch: {torch_result['error']}"


@pytest.mark.parametrize("name", list(MAY_REFUSE))
def test_unemulated_setattr_checks_never_say_loads(
    judged: dict[str, tuple[Path, Any, dict[str, Any]]], name: str
) -> None:
    _, ours, _ = judged[name]
    assert ours.loads is False and ours.answer == "cannot_tell" and ours.reason is None
    assert "not emulated" in (ours.unknown or "") or "may reject" in (ours.unknown or "")
    assert ours.headline().startswith("weights_only: CANNOT TELL")


@pytest.mark.parametrize("name", [*READER_CASES, "protocol byte 0xff"])
def test_check_gives_torchs_verdict_even_where_the_reader_refuses(
    judged: dict[str, tuple[Path, Any, dict[str, Any]]], name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _, torch_result = judged[name]
    code = main(["check", "--json", str(path)])
    report = json.loads(capsys.readouterr().out)
    if "readable" in report:  # the reader refuses it: exit 2, with torch's verdict beside the error
        assert code == 2 and report["readable"] is False and report["error"]
        # a file the reader refuses is never "loads": where torch loads it, the answer is "cannot tell"
        expected = "cannot_tell" if torch_result["loads"] else "refuses"
        assert report["weights_only"]["answer"] == expected and report["weights_only"]["loads"] is False
    else:
        assert report["weights_only"]["loads"] == torch_result["loads"]
        # a tensor made by a legacy constructor is kept as the call, its values unread: never clean
        unread = [p for p in report["problems"] if p["kind"] == "unread-tensor"]
        assert all("legacy constructor" in name for _ in unread), report
        assert code == (0 if torch_result["loads"] and not unread else 1), report


@pytest.mark.parametrize(
    "name",
    [
        "stride None",
        "bytearray of an int",
        "_codecs.encode rot13",
        "protocol byte 0xff",
        "legacy constructor torch.FloatTensor([1])",
    ],
)
def test_files_torch_loads_that_the_reader_now_reads_clean(
    judged: dict[str, tuple[Path, Any, dict[str, Any]]], name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _, torch_result = judged[name]
    assert torch_result["loads"] is True
    # a legacy constructor's tensor is read by the verdict, but its values are not: unread-tensor, exit 1
    assert main(["check", str(path)]) == (1 if "legacy constructor" in name else 0)
    out = capsys.readouterr().out
    assert "weights_only: torch.load loads it" in out
    assert ("unread-tensor" in out) == ("legacy constructor" in name)


def test_unreadable_file_text_shows_the_verdict_and_the_error(
    judged: dict[str, tuple[Path, Any, dict[str, Any]]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _, _ = judged["OrderedDict BUILD with an attribute"]
    assert main(["check", str(path)]) == 2
    captured = capsys.readouterr()
    assert "weights_only: CANNOT TELL whether torch.load loads it (as torch 2.6-2.14 judge it)" in captured.out
    assert "ckpt-tui's reader refuses it" in captured.out
    assert captured.err.startswith("ckpt-tui: ") and "_metadata" in captured.err


# ---- classes that only look like enums ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("global_name", "body"),
    [
        ("sympy.polys.polytools.Poly", G("sympy.polys.polytools", "Poly") + T(U("__import__('os')")) + b"R"),
        ("mylib.Evil", G("mylib", "Evil") + T(I(1)) + b"R"),
        ("sympy.Poly", G("sympy", "Poly") + T(U("x")) + b"R"),
    ],
)
def test_a_class_called_with_one_value_is_code_with_no_allowlisting_line(
    tmp_path: Path, global_name: str, body: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    path = torch_zip(tmp_path / "e.pth", body)
    assert main(["check", "--json", str(path)]) == 1
    wo = json.loads(capsys.readouterr().out)["weights_only"]
    assert wo["blockers"][0]["global"] == global_name and wo["blockers"][0]["kind"] == "code"
    assert "may be an enum member" in wo["blockers"][0]["note"]
    assert wo["add_safe_globals"] is None
    assert main(["check", str(path)]) == 1
    text = capsys.readouterr().out
    assert f"  code  {global_name}" in text and "add_safe_globals" not in text


# ---- slice and range: data in check, data in --sanitize -------------------------------------------------------


def test_slice_and_range_are_data_and_sanitize_to_dicts_that_load(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    path = tmp_path / "s.pth"
    torch.save({"s": slice(1, 2), "r": range(3), "w": torch.ones(2)}, path)
    blockers = {b["global"]: b["kind"] for b in _check_json(path)["weights_only"]["blockers"]}
    assert blockers == {"builtins.slice": "data", "builtins.range": "data"}
    out = tmp_path / "s.sanitized.pth"
    assert main(["convert", str(path), "-o", str(out), "--sanitize"]) == 0
    loaded = torch.load(out, weights_only=True)
    assert loaded["s"] == {"__class__": "builtins.slice", "start": 1, "stop": 2, "step": None}
    assert loaded["r"] == {"__class__": "builtins.range", "start": 0, "stop": 3, "step": 1}
    assert torch.equal(loaded["w"], torch.ones(2))


def _check_json(path: Path) -> dict[str, Any]:
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        main(["check", "--json", str(path)])
    return json.loads(buffer.getvalue())


def test_tensor_attribute_table_is_torchs() -> None:
    torch = pytest.importorskip("torch")
    from ckpt_tui.core.weights_only.tables import TENSOR_ATTRIBUTES

    descriptors = set()
    for cls in torch.nn.Parameter.__mro__:
        descriptors |= {name for name, value in vars(cls).items() if hasattr(type(value), "__set__")}
    descriptors.discard("__class__")  # object's, in the table as "may"
    assert descriptors <= set(TENSOR_ATTRIBUTES), descriptors - set(TENSOR_ATTRIBUTES)
    for name, rule in TENSOR_ATTRIBUTES.items():
        if rule == "read-only":
            with pytest.raises((AttributeError, TypeError, RuntimeError)):
                setattr(torch.zeros(2), name, torch.zeros(2))


def test_every_allowlisting_line_names_what_torch_compares() -> None:
    """torch compares the file's ``module.name`` with ``obj.__module__.obj.__qualname__`` (or the name given)."""
    import builtins
    import importlib
    import importlib.util

    from ckpt_tui.core.weights_only import tables

    pytest.importorskip("numpy")
    names = [*sorted(tables._PLAIN_DATA), "numpy.dtypes.Float32DType", "numpy._core.multiarray._reconstruct"]
    for name in names:
        entry = tables.data_global(name)
        assert entry is not None
        if entry.module.startswith("omegaconf") and importlib.util.find_spec("omegaconf") is None:
            continue
        namespace = {"builtins": builtins, entry.module.split(".")[0]: importlib.import_module(entry.module)}
        obj = eval(entry.expression, namespace)  # our own table's expression
        assert entry.by_name or f"{obj.__module__}.{obj.__qualname__}" == name, name
