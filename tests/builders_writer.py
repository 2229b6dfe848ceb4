"""Sources for the writer's tests: real torch objects of every kind a checkpoint holds, and hostile pickles."""

from __future__ import annotations

import pickle
import struct
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

warnings.filterwarnings("ignore", message=".*quantize.*deprecated.*")
warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")


def _fixed(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(dtype)


def plain() -> OrderedDict[str, torch.Tensor]:
    """A model's state_dict: OrderedDict with ``_metadata``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
    return model.state_dict()


def views() -> dict[str, torch.Tensor]:
    """Views sharing one storage: transposed, sliced with an offset, strided."""
    weight = _fixed(6, 4)
    return {"w": weight, "t": weight.t(), "rows": weight[2:4], "cols": weight[:, ::2], "elem": weight[5, 3]}


def parameters() -> dict[str, Any]:
    """Parameters with and without requires_grad, one with Python state (``_rebuild_parameter_with_state``)."""
    trained = nn.Parameter(_fixed(3, 2))
    frozen = nn.Parameter(_fixed(2), requires_grad=False)
    stateful = nn.Parameter(_fixed(2, 2, seed=1))
    stateful.tag = "encoder"  # type: ignore[attr-defined]
    return {"trained": trained, "frozen": frozen, "stateful": stateful, "leaf": _fixed(2).requires_grad_()}


def hooks() -> dict[str, Any]:
    """Tensors and Parameters with hooks registered (torch does not save hooks)."""
    tensor = _fixed(3).requires_grad_()
    tensor.register_hook(lambda grad: grad)
    parameter = nn.Parameter(_fixed(2, 2))
    parameter.register_hook(lambda grad: grad * 2)
    return {"tensor": tensor, "parameter": parameter}


def metadata_dicts() -> dict[str, Any]:
    """Nested state_dicts with ``_metadata``, as a model with submodules gives them."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2)), nn.LayerNorm(2))
    return {"model": model.state_dict(), "ema": model.state_dict(keep_vars=False)}


def dtypes() -> dict[str, torch.Tensor]:
    """One tensor of each unusual dtype, a conjugated complex, an empty and a 0-d tensor."""
    base = _fixed(4, 3)
    return {
        "bf16": base.to(torch.bfloat16),
        "fp16": base.to(torch.float16),
        "fp64": base.to(torch.float64),
        "fp8_e4m3": base.to(torch.float8_e4m3fn),
        "fp8_e5m2": base.to(torch.float8_e5m2),
        "uint16": torch.tensor([1, 2, 60000], dtype=torch.int32).to(torch.uint16),
        "uint32": torch.tensor([7, 2**31 + 5], dtype=torch.int64).to(torch.uint32),
        "int8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "int64": torch.arange(5),
        "complex": torch.complex(base[0], base[1]),
        "conj": torch.complex(base[0], base[1]).conj(),
        "bool": base > 0,
        "empty": torch.zeros(0, 3),
        "scalar": torch.tensor(2.5),
    }


def sparse() -> dict[str, torch.Tensor]:
    """Sparse COO (coalesced and not) and CSR tensors."""
    dense = _fixed(4, 5).relu()
    uncoalesced = torch.sparse_coo_tensor(torch.tensor([[0, 0, 1], [1, 1, 2]]), torch.tensor([1.0, 2.0, 3.0]), (2, 3))
    return {"coo": dense.to_sparse(), "uncoalesced": uncoalesced, "csr": dense.to_sparse_csr()}


def quantized() -> dict[str, torch.Tensor]:
    """qint8 tensors quantized per tensor and per channel, and a quint8."""
    base = _fixed(3, 4)
    return {
        "per_tensor": torch.quantize_per_tensor(base, 0.05, 3, torch.qint8),
        "per_channel": torch.quantize_per_channel(
            base, torch.tensor([0.1, 0.2, 0.05], dtype=torch.float64), torch.tensor([0, 1, -1]), 0, torch.qint8
        ),
        "quint8": torch.quantize_per_tensor(base, 0.1, 10, torch.quint8),
    }


def nested() -> dict[str, Any]:
    """Dicts, lists and tuples nested, holding tensors and every plain value torch's loader allows."""
    shared = _fixed(2, 2)
    return {
        "layers": [{"w": _fixed(2, seed=2), "b": (shared, shared.t())}, [shared, {"deep": (1, 2.5, "x")}]],
        "again": shared,
        "none": None,
        "flag": True,
        "count": 7,
        "big": 2**70,
        "ratio": 0.125,
        "name": "résumé [/data] \x1b",
        "raw": b"\x00\xff",
        "buffer": bytearray(b"ab"),
        "ids": {3, 1, 2},
        "z": 1 + 2j,
        "device": torch.device("cuda", 1),
        "dtype": torch.float16,
        "size": torch.Size([2, 3]),
        "layout": torch.sparse_coo,
        "qscheme": torch.per_channel_affine,
        "counter": __import__("collections").Counter({"a": 2}),
    }


def training() -> dict[str, Any]:
    """A training checkpoint without a Namespace: model, Adam state, scheduler, epoch."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 5)
    inputs = torch.tensor([[0.5, -1.0, 2.0], [1.0, 0.25, -0.5]])
    model(inputs).sum().backward()
    optimizer.step()
    scheduler.step()
    return {
        "epoch": 3,
        "model": OrderedDict(("module." + k, v) for k, v in model.state_dict().items()),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
    }


SOURCES: dict[str, Callable[[], Any]] = {
    "plain": plain,
    "views": views,
    "parameters": parameters,
    "hooks": hooks,
    "metadata": metadata_dicts,
    "dtypes": dtypes,
    "sparse": sparse,
    "quantized": quantized,
    "nested": nested,
    "training": training,
}


def save_source(name: str, layout: str, folder: Path) -> Path:
    """Build source ``name`` and save it as torch does: ``zip`` (protocol 2), ``legacy`` or ``protocol4``."""
    path = folder / f"{name}-{layout}.pth"
    obj = SOURCES[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if layout == "legacy":
            torch.save(obj, path, _use_new_zipfile_serialization=False)
        elif layout == "protocol4":
            torch.save(obj, path, pickle_protocol=4)
        else:
            torch.save(obj, path)
    return path


# ---- hand-written pickles (hostile or unusual) -------------------------------------------


def global_op(qualname: str) -> bytes:
    """``GLOBAL module name``."""
    module, _, name = qualname.rpartition(".")
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def text(value: str) -> bytes:
    """``BINUNICODE``."""
    data = value.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def storage_pid(key: str, numel: int, storage_type: str = "torch.FloatStorage") -> bytes:
    """A persistent id ``('storage', type, key, 'cpu', numel)``."""
    return (
        b"("
        + text("storage")
        + global_op(storage_type)
        + text(key)
        + text("cpu")
        + b"J"
        + struct.pack("<i", numel)
        + b"tQ"
    )


def tensor_op(
    key: str = "0", numel: int = 4, hooks: bytes | None = None, metadata: bytes | None = None, shape: int = 4
) -> bytes:
    """``_rebuild_tensor_v2(storage, 0, (shape,), (1,), False, hooks[, metadata])``."""
    hooks = hooks if hooks is not None else global_op("collections.OrderedDict") + b")R"
    return (
        global_op("torch._utils._rebuild_tensor_v2")
        + b"("
        + storage_pid(key, numel)
        + b"K\x00"
        + b"K"
        + bytes([shape])
        + b"\x85K\x01\x85\x89"
        + hooks
        + (metadata or b"")
        + b"tR"
    )


def payload(command: str) -> bytes:
    """``posix.system(command)``: what ``torch.load(weights_only=False)`` would run."""
    return global_op("posix.system") + text(command) + b"\x85R"


def write_zip_checkpoint(path: Path, data_pkl: bytes, records: dict[str, bytes]) -> Path:
    """A torch zip checkpoint with a hand-written data.pkl (records stored, as torch stores them)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", data_pkl)
        archive.writestr("archive/byteorder", "little")
        for key, data in records.items():
            archive.writestr(f"archive/data/{key}", data)
        archive.writestr("archive/version", "3\n")
    return path


def floats(count: int) -> bytes:
    """``count`` little-endian float32 values 0, 1, 2, ..."""
    return struct.pack(f"<{count}f", *range(count))


def pickled(obj: Any) -> bytes:
    """``pickle.dumps`` at protocol 2 (for hand-made plain pickles)."""
    return pickle.dumps(obj, protocol=2)


def hostile_source(where: str, command: str, folder: Path) -> Path:
    """A zip checkpoint whose only unsafe global sits in ``where`` (a place the tree walk does not show)."""
    system = payload(command)
    ordered = global_op("collections.OrderedDict") + b")R"
    bodies = {
        "backward_hooks": b"}(" + text("w") + tensor_op(hooks=ordered + b"(" + text("h") + system + b"u") + b"u",
        "tensor_metadata": b"}(" + text("w") + tensor_op(metadata=b"}(" + text("m") + system + b"u") + b"u",
        "parameter_state": b"}("
        + text("p")
        + global_op("torch._utils._rebuild_parameter_with_state")
        + b"("
        + tensor_op()
        + b"\x88"
        + ordered
        + b"}("
        + text("x")
        + system
        + b"u"
        + b"tR"
        + b"u",
        "_metadata": ordered
        + b"("
        + text("w")
        + tensor_op()
        + b"u"
        + b"}"
        + text("_metadata")
        + b"}("
        + text("")
        + b"}("
        + text("version")
        + system
        + b"u"
        + b"u"
        + b"sb",
        "opaque_args": b"}("
        + text("w")
        + tensor_op()
        + text("ns")
        + global_op("argparse.Namespace")
        + b"("
        + system
        + b"tR"
        + b"u",
        "opaque_state": b"}("
        + text("w")
        + tensor_op()
        + text("ns")
        + global_op("argparse.Namespace")
        + b")R}("
        + text("lr")
        + system
        + b"ub"
        + b"u",
        "tensor_state": b"}("
        + text("w")
        + from_type(tensor_op(), global_op("torch.Tensor"), b"}(" + text("x") + system + b"u")
        + b"u",
        "tensor_class": b"}(" + text("w") + from_type(tensor_op(), system, b"}") + b"u",
        "metadata_not_a_dict": b"}(" + text("w") + tensor_op(metadata=system) + b"u",
        "empty_state_metadata": b"}("
        + text("p")
        + global_op("torch._utils._rebuild_parameter_with_state")
        + b"("
        + tensor_op()
        + b"\x88"
        + ordered
        + ordered
        + b"}"
        + text("_metadata")
        + b"}("
        + text("m")
        + system
        + b"u"
        + b"sb"
        + b"tR"
        + b"u",
        "opaque_from_type": b"}("
        + text("w")
        + tensor_op()
        + text("ns")
        + global_op("torch._tensor._rebuild_from_type_v2")
        + b"("
        + global_op("argparse.Namespace")
        + global_op("torch.Tensor")
        + b")"
        + b"}("
        + text("x")
        + system
        + b"u"
        + b"tR"
        + b"u",
    }
    data = b"\x80\x02" + bodies[where] + b"."
    path = folder / f"hostile-{where}.pth"
    return write_zip_checkpoint(path, data, {"0": floats(4)})


def from_type(tensor: bytes, new_type: bytes, state: bytes) -> bytes:
    """``_rebuild_from_type_v2(func, new_type, args, state)`` around a ``tensor_op`` (its function and arguments)."""
    assert tensor.endswith(b"tR")
    return global_op("torch._tensor._rebuild_from_type_v2") + b"(" + _func_then(tensor[:-1], new_type) + state + b"tR"


def _func_then(call: bytes, inserted: bytes) -> bytes:
    """``GLOBAL f`` + ``inserted`` + ``(args t``: the function, then ``inserted``, then the argument tuple."""
    end = call.index(b"\n", call.index(b"\n") + 1) + 1
    return call[:end] + inserted + call[end:]


HOSTILE_PLACES = (
    "backward_hooks",
    "tensor_metadata",
    "parameter_state",
    "_metadata",
    "opaque_args",
    "opaque_state",
    "tensor_state",
    "tensor_class",
    "metadata_not_a_dict",
    "empty_state_metadata",
    "opaque_from_type",
)
"""Places an unsafe global can hide that a tree walk does not show as a child (the writer must still refuse it)."""


def loads_with_torch(path: Path, **kwargs: Any) -> bool:
    """Whether ``torch.load(weights_only=True, map_location='cpu')`` reads the file."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.load(path, weights_only=True, map_location="cpu", **kwargs)
    except Exception:
        return False
    return True


def torch_load(path: Path) -> Any:
    """``torch.load(weights_only=True, map_location='cpu')`` without its warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(path, weights_only=True, map_location="cpu")


def raw_bytes_of(tensor: torch.Tensor) -> bytes:
    """A dense tensor's elements as bytes (conjugation and negation resolved)."""
    resolved = tensor.resolve_conj().resolve_neg().contiguous().reshape(-1)
    return resolved.view(torch.uint8).numpy().tobytes() if resolved.numel() else b""
