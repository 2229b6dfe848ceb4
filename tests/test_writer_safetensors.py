"""``.safetensors`` output as the ``safetensors`` library writes it: order, alignment, header, metadata."""

from __future__ import annotations

import itertools
import json
import struct
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file, save_model
from torch import nn

from ckpt_tui.cli import main
from ckpt_tui.core.model.dtypes import itemsize
from ckpt_tui.core.readers.safetensors_file import SAFETENSORS_DTYPES

TRANSFORMERS_FORMATS = ["pt", "tf", "flax", "mlx"]


def transformers_refuses(path: Path) -> bool:
    """transformers' check before loading a safetensors file (``modeling_utils``), in its strict form.

    Recent versions refuse ``metadata.get("format") not in ["pt", "tf", "flax", "mlx"]`` when there is
    metadata; older ones (and the Flax loader) also refuse a file without any metadata.
    """
    with safe_open(path, framework="pt") as handle:
        metadata = handle.metadata()
    return metadata is None or metadata.get("format") not in TRANSFORMERS_FORMATS


def header(path: Path) -> tuple[dict, int]:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + length]), 8 + length


def mixed() -> dict[str, torch.Tensor]:
    """Every dtype safetensors knows, named so that name order and dtype order disagree."""
    base = torch.linspace(-3, 3, 12).reshape(3, 4)
    return {
        "a.f32": base.clone(),
        "b.i64": torch.arange(5),  # after a float32: 4 mod 8 if written in insertion order
        "c.bf16": base.to(torch.bfloat16),
        "Z.f64": base.double(),
        "d.u8": torch.arange(7, dtype=torch.uint8),
        "e.bool": base > 0,
        "f.f16": base.half(),
        "g.i8": torch.tensor([-3, 4, 5], dtype=torch.int8),
        "h.i16": torch.tensor([300, -2], dtype=torch.int16),
        "i.i32": torch.tensor([1, 2, 3], dtype=torch.int32),
        "j.fp8": base.to(torch.float8_e4m3fn),
        "k.fp8b": base.to(torch.float8_e5m2),
        "l.u16": torch.tensor([1, 65535], dtype=torch.int32).to(torch.uint16),
        "m.u32": torch.tensor([7], dtype=torch.int64).to(torch.uint32),
        "n.c64": torch.complex(base[0], base[1]),
        "é.unicode": torch.ones(2),
        "B.upper": torch.zeros(3, dtype=torch.int64),
        "empty": torch.zeros(0, 4),
        "scalar": torch.tensor(1.5),
    }


def convert(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str]:
    code = main(["convert", *map(str, args)])
    return code, capsys.readouterr().err


@pytest.fixture
def library_file(tmp_path: Path) -> Path:
    path = tmp_path / "library.safetensors"
    save_file(mixed(), path, metadata={"format": "pt"})
    return path


def test_pth_to_safetensors_is_byte_identical_to_the_library(tmp_path: Path, library_file: Path, capsys) -> None:
    torch.save(mixed(), tmp_path / "in.pth")
    assert convert(capsys, tmp_path / "in.pth", "-o", tmp_path / "ours.safetensors")[0] == 0
    assert (tmp_path / "ours.safetensors").read_bytes() == library_file.read_bytes()


def test_safetensors_round_trip_is_byte_identical(tmp_path: Path, library_file: Path, capsys) -> None:
    assert convert(capsys, library_file, "-o", tmp_path / "again.safetensors")[0] == 0
    assert (tmp_path / "again.safetensors").read_bytes() == library_file.read_bytes()


def test_every_offset_is_aligned_to_its_dtype_and_the_data_has_no_holes(tmp_path: Path, capsys) -> None:
    torch.save(mixed(), tmp_path / "in.pth")
    assert convert(capsys, tmp_path / "in.pth", "-o", tmp_path / "out.safetensors")[0] == 0
    entries, data_start = header(tmp_path / "out.safetensors")
    assert data_start % 8 == 0
    entries.pop("__metadata__")
    spans = sorted(entry["data_offsets"] for entry in entries.values())
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    for name, entry in entries.items():
        begin = entry["data_offsets"][0]
        assert begin % itemsize(SAFETENSORS_DTYPES[entry["dtype"]]) == 0, name
    assert entries["b.i64"]["data_offsets"][0] % 8 == 0


def test_tensor_order_is_the_library_order_after_an_edit(tmp_path: Path, capsys) -> None:
    source = {f"module.{name}": tensor for name, tensor in mixed().items()}
    torch.save(source, tmp_path / "ddp.pth")
    assert (
        convert(capsys, tmp_path / "ddp.pth", "-o", tmp_path / "ours.safetensors", "--strip-prefix", "module.")[0] == 0
    )
    save_file(mixed(), tmp_path / "theirs.safetensors", metadata={"format": "pt"})
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()


def test_a_prefix_strip_copies_the_data_section_unchanged(tmp_path: Path, capsys) -> None:
    state = OrderedDict((f"module.layer{i}.weight", torch.full((256, 256), float(i))) for i in range(40))
    save_file(state, tmp_path / "in.safetensors", metadata={"format": "pt"})
    assert (
        convert(capsys, tmp_path / "in.safetensors", "-o", tmp_path / "out.safetensors", "--strip-prefix", "auto")[0]
        == 0
    )
    _, source_start = header(tmp_path / "in.safetensors")
    entries, start = header(tmp_path / "out.safetensors")
    assert (tmp_path / "out.safetensors").read_bytes()[start:] == (tmp_path / "in.safetensors").read_bytes()[
        source_start:
    ]
    assert "layer0.weight" in entries


def test_format_pt_is_always_there_and_transformers_accepts_it(tmp_path: Path, capsys) -> None:
    torch.save(OrderedDict(w=torch.ones(2)), tmp_path / "in.pth")
    assert convert(capsys, tmp_path / "in.pth", "-o", tmp_path / "out.safetensors")[0] == 0
    with safe_open(tmp_path / "out.safetensors", framework="pt") as handle:
        assert handle.metadata() == {"format": "pt"}
    assert not transformers_refuses(tmp_path / "out.safetensors")
    save_file({"w": torch.ones(2)}, tmp_path / "bare.safetensors")
    assert transformers_refuses(tmp_path / "bare.safetensors")
    assert convert(capsys, tmp_path / "bare.safetensors", "-o", tmp_path / "fixed.safetensors")[0] == 0
    with safe_open(tmp_path / "fixed.safetensors", framework="pt") as handle:
        assert handle.metadata() == {"format": "pt"}
    assert not transformers_refuses(tmp_path / "fixed.safetensors")


def test_source_metadata_is_kept_and_merged(tmp_path: Path, capsys) -> None:
    save_file({"w": torch.ones(2)}, tmp_path / "in.safetensors", metadata={"author": "me", "step": "1200"})
    assert convert(capsys, tmp_path / "in.safetensors", "-o", tmp_path / "out.safetensors")[0] == 0
    with safe_open(tmp_path / "out.safetensors", framework="pt") as handle:
        assert handle.metadata() == {"format": "pt", "author": "me", "step": "1200"}
    assert not transformers_refuses(tmp_path / "out.safetensors")


def test_a_declared_framework_format_is_kept(tmp_path: Path, capsys) -> None:
    """A Flax-written file keeps "flax": its tensors still follow Flax's layout, which transformers converts."""
    save_file({"kernel": torch.ones(2, 3)}, tmp_path / "flax.safetensors", metadata={"format": "flax"})
    assert convert(capsys, tmp_path / "flax.safetensors", "-o", tmp_path / "out.safetensors")[0] == 0
    with safe_open(tmp_path / "out.safetensors", framework="pt") as handle:
        assert handle.metadata() == {"format": "flax"}


def test_metadata_that_is_not_text_is_refused_for_safetensors_only(tmp_path: Path, capsys) -> None:
    head = json.dumps({"__metadata__": {"step": 3}, "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})
    raw = head.encode() + b" " * (-len(head) % 8)
    (tmp_path / "odd.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + struct.pack("<2f", 1, 2))
    code, err = convert(capsys, tmp_path / "odd.safetensors", "-o", tmp_path / "out.safetensors")
    assert code == 2 and "'step'" in err and "not text" in err
    assert not (tmp_path / "out.safetensors").exists()
    assert convert(capsys, tmp_path / "odd.safetensors", "-o", tmp_path / "out.pth")[0] == 0


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(6, 4)
        self.lm_head = nn.Linear(4, 6, bias=False)
        self.lm_head.weight = self.embed.weight


def test_tied_weights_are_written_once_under_the_name_save_model_keeps(tmp_path: Path, capsys) -> None:
    torch.manual_seed(0)
    model = Tied()
    torch.save(model.state_dict(), tmp_path / "tied.pth")
    assert convert(capsys, tmp_path / "tied.pth", "-o", tmp_path / "ours.safetensors")[0] == 0
    save_model(model, str(tmp_path / "theirs.safetensors"), metadata={"format": "pt"})
    ours, ours_start = header(tmp_path / "ours.safetensors")
    theirs, theirs_start = header(tmp_path / "theirs.safetensors")
    assert ours == theirs
    assert ours["__metadata__"] == {"format": "pt", "lm_head.weight": "embed.weight"}
    ours_data = (tmp_path / "ours.safetensors").read_bytes()[ours_start:]
    assert ours_data == (tmp_path / "theirs.safetensors").read_bytes()[theirs_start:]
    loaded = load_file(tmp_path / "ours.safetensors")
    assert torch.equal(loaded["embed.weight"], model.embed.weight.detach())


def test_different_views_of_one_storage_are_refused_but_disjoint_slices_are_written(tmp_path: Path, capsys) -> None:
    qkv = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    torch.save({"q": qkv[0:2], "k": qkv[2:4], "v": qkv[4:6]}, tmp_path / "split.pth")
    assert convert(capsys, tmp_path / "split.pth", "-o", tmp_path / "split.safetensors")[0] == 0
    loaded = load_file(tmp_path / "split.safetensors")
    assert torch.equal(loaded["k"], qkv[2:4]) and torch.equal(loaded["v"], qkv[4:6])
    torch.save({"w": qkv, "rows": qkv[1:3]}, tmp_path / "overlap.pth")
    code, err = convert(capsys, tmp_path / "overlap.pth", "-o", tmp_path / "overlap.safetensors")
    assert code == 2 and "share memory" in err


def test_strided_and_cast_tensors_are_written_contiguously(tmp_path: Path, capsys) -> None:
    weight = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    other = torch.linspace(-1, 1, 12).reshape(3, 4)
    torch.save({"t": weight.t(), "cols": other[:, ::2]}, tmp_path / "views.pth")
    assert convert(capsys, tmp_path / "views.pth", "-o", tmp_path / "v.safetensors")[0] == 0
    loaded = load_file(tmp_path / "v.safetensors")
    assert torch.equal(loaded["t"], weight.t()) and torch.equal(loaded["cols"], other[:, ::2])
    assert convert(capsys, tmp_path / "views.pth", "-o", tmp_path / "b.safetensors", "--dtype", "bfloat16")[0] == 0
    loaded = load_file(tmp_path / "b.safetensors")
    assert torch.equal(loaded["t"], weight.t().to(torch.bfloat16))
    assert torch.equal(loaded["cols"], other[:, ::2].to(torch.bfloat16))


def test_conjugated_and_negated_views_are_written_with_their_values(tmp_path: Path, capsys) -> None:
    """torch keeps conj/neg as bits in data.pkl; safetensors has no such bits, so the values are resolved."""
    z = torch.complex(torch.tensor([1.0, -2.0]), torch.tensor([3.0, 4.0]))
    state = {
        "conj": z.conj(),
        "neg": torch._neg_view(torch.complex(torch.tensor([5.0]), torch.tensor([-6.0]))),
        "neg_real": torch._neg_view(torch.tensor([1.5, -2.5])),
    }
    torch.save(state, tmp_path / "bits.pth")
    assert convert(capsys, tmp_path / "bits.pth", "-o", tmp_path / "bits.safetensors")[0] == 0
    loaded = load_file(tmp_path / "bits.safetensors")
    for name, tensor in state.items():
        assert not loaded[name].is_conj() and not loaded[name].is_neg()
        assert torch.equal(loaded[name], tensor.resolve_conj().resolve_neg()), name


def test_a_tied_lm_head_is_written_under_the_embeddings_name_as_save_pretrained_keeps_it(tmp_path: Path, capsys):
    """A GPT-2's LM head is tied to its input embedding: the name kept is the embedding's, first in the
    state_dict (save_model's smallest name would be lm_head.weight), the same header transformers'
    save_pretrained writes; the model then loads it with strict=False and re-ties the head."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=16, n_positions=8)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    torch.save(model.state_dict(), tmp_path / "gpt2.pth")
    assert convert(capsys, tmp_path / "gpt2.pth", "-o", tmp_path / "ours.safetensors")[0] == 0
    ours, _ = header(tmp_path / "ours.safetensors")
    assert "transformer.wte.weight" in ours and "lm_head.weight" not in ours
    assert ours["__metadata__"]["lm_head.weight"] == "transformer.wte.weight"
    model.save_pretrained(tmp_path / "hf")
    theirs, _ = header(tmp_path / "hf" / "model.safetensors")
    assert sorted(k for k in ours if k != "__metadata__") == sorted(k for k in theirs if k != "__metadata__")
    fresh = transformers.GPT2LMHeadModel(config)
    missing, unexpected = fresh.load_state_dict(load_file(tmp_path / "ours.safetensors"), strict=False)
    assert missing == ["lm_head.weight"] and not unexpected
    fresh.tie_weights()
    assert torch.equal(fresh.lm_head.weight, model.transformer.wte.weight)
