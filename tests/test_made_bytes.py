"""Bytes made rather than copied (a cast, rewritten tensors, pieces of several files) come through one
interface: each record source says what it can do (``model/made_bytes.MadeRecords``), and the values
reader and the writers ask that, never what it is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ckpt_tui.cli import main
from ckpt_tui.core.edits.tree_edits import cast
from ckpt_tui.core.errors import EditError
from ckpt_tui.core.model.assembled import AssembledRecords
from ckpt_tui.core.model.made_bytes import MemorySource, made_records
from ckpt_tui.core.operations.average import AveragedRecords
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.values.casting import CastSource
from ckpt_tui.core.values.tensor_values import TensorReader
from ckpt_tui.core.writers.tensor_data import tensor_bytes

PACKAGE = Path(__file__).parent.parent / "ckpt_tui"
ZIP_SOURCES = r"(ZipRecords|EmbeddedRecords|SafetensorsRecords|LegacyRecords)\b"
ZIP_TYPE_CHECK = re.compile(rf"(isinstance|type)\(.*\b{ZIP_SOURCES}|\bis (not )?{ZIP_SOURCES}")
"""A reader's record source recognised by its type (only the readers may: the others ask what it can do)."""


def test_no_consumer_asks_a_byte_sources_type() -> None:
    asking = re.compile(r"isinstance\(.*Source|type\(.*Source")
    found = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "byte_source.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if asking.search(line)
    ]
    assert found == []


def test_no_module_outside_the_readers_asks_if_a_source_is_a_zip() -> None:
    asking = ZIP_TYPE_CHECK
    found = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.parent.name != "readers"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if asking.search(line)
    ]
    assert found == []


def test_the_guard_catches_a_type_check_of_zip_records() -> None:
    asking = ZIP_TYPE_CHECK
    checks = ("if type(source) is ZipRecords:", "isinstance(archive, ZipRecords)", "kind is EmbeddedRecords")
    for line in (*checks, "x is not ZipRecords", "if type(source) is not SafetensorsRecords:"):
        assert asking.search(line), line


def test_a_safetensors_file_gives_its_header_ranges_and_a_zip_none(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    save_file({"a": torch.arange(6.0), "b": torch.ones(2, 3)}, str(tmp_path / "m.safetensors"))
    source = open_checkpoint(str(tmp_path / "m.safetensors")).root["a"].storage.source
    header = source.header_ranges()
    assert header is source
    begin, end = header.ranges["a"]
    assert end - begin == 24 and header.data_start > 8
    torch.save({"a": torch.arange(6.0)}, tmp_path / "m.pth")
    assert open_checkpoint(str(tmp_path / "m.pth")).root["a"].storage.source.header_ranges() is None


def test_a_zip_says_what_it_can_do_and_other_sources_say_none(tmp_path: Path) -> None:
    torch.save({"a": torch.arange(6.0), "b": torch.ones(2, 3)}, tmp_path / "m.pth")
    source = open_checkpoint(str(tmp_path / "m.pth")).root["a"].storage.source
    members = source.zip_members()
    assert members is not None and members.batched_members() is members
    assert set(source.stored_spans()) == {"0", "1"} and source.stored_places(["0", "9"])[1] is None
    assert members.entries.get(members.folder + "0").size == 24
    save_file({"a": torch.arange(6.0)}, tmp_path / "m.safetensors")
    for other in (open_checkpoint(str(tmp_path / "m.safetensors")).root["a"].storage.source, MemorySource(b"")):
        assert other.zip_members() is None and other.batched_members() is None
        assert other.stored_spans() is None and other.stored_places(["a"]) is None


@pytest.mark.parametrize("made", [CastSource, MemorySource, AssembledRecords, AveragedRecords])
def test_every_made_source_says_what_it_can_do(made: type) -> None:
    assert made.in_place is False
    assert hasattr(made, "made_on_save") and callable(made.check_view) and callable(made.view_elements)


def views() -> dict[str, torch.Tensor]:
    """Strided views (each of its own storage: safetensors holds no two views of one), and values past bf16's range."""
    base = [torch.arange(24, dtype=torch.float32).reshape(4, 6) / (7 + n) for n in range(3)]
    return {"t": base[0].t(), "row": base[1][1], "part": base[2][1:, ::2], "big": torch.tensor([1e39, -1e39]).double()}


@pytest.mark.parametrize("suffix", ["pth", "safetensors"])
def test_cast_views_are_saved_as_torch_casts_them(tmp_path: Path, suffix: str) -> None:
    saved = views()
    if suffix == "pth":  # and a view beside its whole storage: both stay views of one (cast) storage
        saved["w"] = saved["t"].t()
    torch.save(saved, tmp_path / "f32.pth")
    out = tmp_path / f"half.{suffix}"
    assert main(["convert", str(tmp_path / "f32.pth"), "-o", str(out), "--dtype", "bfloat16", "--at", "/"]) == 0
    loaded = load_file(out) if suffix == "safetensors" else torch.load(out, weights_only=True)
    for key, value in saved.items():
        assert loaded[key].dtype == torch.bfloat16
        assert torch.equal(loaded[key], value.to(torch.bfloat16)), key
    if suffix == "pth":
        assert loaded["t"].untyped_storage().data_ptr() == loaded["w"].untyped_storage().data_ptr()


def test_cast_values_are_made_for_a_save_and_refused_before_it(tmp_path: Path) -> None:
    torch.save(views(), tmp_path / "f32.pth")
    root, _ = cast(open_checkpoint(str(tmp_path / "f32.pth")).root, "float16", "all")
    part = root["part"]
    made = made_records(part.storage.source)
    assert made is not None and made.made_on_save == "cast values"
    with pytest.raises(EditError, match="exist once it is saved"):
        TensorReader(part)
    data = b"".join(tensor_bytes(part))
    assert torch.equal(torch.frombuffer(bytearray(data), dtype=torch.float16).reshape(3, 3), views()["part"].half())


def test_bytes_in_a_file_are_not_made(tmp_path: Path) -> None:
    torch.save(views(), tmp_path / "f32.pth")
    checkpoint = open_checkpoint(str(tmp_path / "f32.pth"))
    assert made_records(checkpoint.root["t"].storage.source) is None
