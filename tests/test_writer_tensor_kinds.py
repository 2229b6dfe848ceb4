"""Sparse and quantized tensors: read as tensors (counted, shown), written back as torch writes them."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from builders_writer import floats, global_op, quantized, sparse, storage_pid, tensor_op, text, write_zip_checkpoint

from ckpt_tui.cli import main
from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model.tree import iter_tensors, type_label
from ckpt_tui.core.operations.info import summarize
from ckpt_tui.core.readers.open import open_checkpoint


def save(obj: object, path: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(obj, path)
    return path


def test_sparse_and_quantized_tensors_are_counted_and_labelled(tmp_path: Path) -> None:
    path = save({**sparse(), **quantized()}, tmp_path / "kinds.pth")
    summary = summarize(open_checkpoint(path))
    assert len(summary.tensors) == 6
    labels = {str(p[0]): type_label(t) for p, t in summary.tensors}
    assert labels["coo"] == "Tensor (sparse_coo)" and labels["csr"] == "Tensor (sparse_csr)"
    assert labels["per_channel"] == "Tensor (quantized)"
    assert summary.dtypes == {"float32": 3, "qint8": 2, "quint8": 1}
    shapes = {str(p[0]): t.shape for p, t in summary.tensors}
    assert shapes["coo"] == (4, 5) and shapes["per_tensor"] == (3, 4)


def test_sparse_tensor_bytes_are_its_stored_parts(tmp_path: Path) -> None:
    dense = torch.zeros(100, 100)
    dense[3, 7] = 1.0
    path = save({"s": dense.to_sparse()}, tmp_path / "s.pth")
    (_, tensor), *_ = iter_tensors(open_checkpoint(path).root)
    assert tensor.nbytes == 2 * 8 + 4  # one int64 index pair and one float32 value, not 100 x 100 floats
    assert tensor.device == "cpu"


def test_sparse_and_quantized_to_safetensors_are_refused_with_the_reason(tmp_path: Path, capsys) -> None:
    for name, builder in (("sparse", sparse), ("quantized", quantized)):
        path = save(builder(), tmp_path / f"{name}.pth")
        code = main(["convert", str(path), "-o", str(tmp_path / f"{name}.safetensors")])
        err = capsys.readouterr().err
        assert code == 2 and "cannot be written as safetensors" in err and name.split("_")[0][:6] in err
        assert not (tmp_path / f"{name}.safetensors").exists()


def test_remapping_devices_moves_every_part_of_sparse_and_quantized_tensors(tmp_path: Path, capsys) -> None:
    path = save({**sparse(), **quantized()}, tmp_path / "kinds.pth")
    assert main(["convert", str(path), "-o", str(tmp_path / "gpu.pth"), "--map-location", "cuda:1"]) == 0
    data = open_checkpoint(tmp_path / "gpu.pth")
    locations = set()
    for _, tensor in iter_tensors(data.root):
        parts = [p for p in (tensor.sparse or ()) + (tensor.quantizer or ()) if hasattr(p, "storage")]
        locations |= {p.storage.location for p in [tensor, *parts] if p.storage is not None}
    assert locations == {"cuda:1"}
    loaded = torch.load(tmp_path / "gpu.pth", weights_only=True, map_location="cpu")
    assert torch.equal(loaded["coo"].to_dense(), sparse()["coo"].to_dense())
    assert torch.equal(loaded["per_channel"].int_repr(), quantized()["per_channel"].int_repr())


def qtensor(params: bytes) -> bytes:
    return (
        global_op("torch._utils._rebuild_qtensor")
        + b"("
        + storage_pid("0", 4, "torch.QInt8Storage")
        + b"K\x00K\x04\x85K\x01\x85"
        + params
        + b"\x89"
        + global_op("collections.OrderedDict")
        + b")Rt"
        + b"R"
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # (an int scale is a float to torch's argument parser: a str is no number)
        (qtensor(global_op("torch.per_tensor_affine") + text("1") + b"K\x02\x87"), "quantizer"),
        (qtensor(b"(" + global_op("torch.per_channel_affine") + b"K\x01K\x02K\x00t"), "quantizer"),  # not tensors
        (qtensor(text("per_tensor_affine")), "quantizer"),
        (
            global_op("torch._utils._rebuild_sparse_tensor")
            + global_op("torch.serialization._get_layout")
            + text("torch.sparse_coo")
            + b"\x85R"
            + b"(K\x01K\x02K\x03t\x86R",
            "sparse",
        ),
        (
            global_op("torch._utils._rebuild_sparse_tensor")
            + global_op("torch.serialization._get_layout")
            + text("torch.strided")
            + b"\x85R"
            + b"("
            + tensor_op()
            + tensor_op()
            + b"K\x04\x85t\x86R",
            "sparse",
        ),
    ],
    ids=["str-scale", "per-channel-without-tensors", "no-qscheme", "coo-of-ints", "strided-is-not-sparse"],
)
def test_malformed_sparse_or_quantized_rebuilds_are_one_read_error(tmp_path: Path, body: bytes, message: str) -> None:
    path = write_zip_checkpoint(tmp_path / "bad.pth", b"\x80\x02}(" + text("x") + body + b"u.", {"0": floats(4)})
    with pytest.raises(ReadError, match=message):
        open_checkpoint(path)


def test_the_written_tensor_count_is_the_one_info_gives(tmp_path: Path) -> None:
    from ckpt_tui.core.writers.save import save as write

    shared = torch.ones(3)
    path = save(
        {"a": shared, "b": shared, "nested": [shared, {"c": shared.t()}], **sparse(), **quantized()}, tmp_path / "t.pth"
    )
    checkpoint = open_checkpoint(path)
    result = write(checkpoint.root, tmp_path / "out.pth")
    assert (
        result.tensors
        == len(summarize(checkpoint).tensors)
        == len(summarize(open_checkpoint(tmp_path / "out.pth")).tensors)
    )
