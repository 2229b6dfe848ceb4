"""The safetensors reader's bulk path (whole-column checks of a plain header) says exactly what its
entry-by-entry walk says, on normal and hostile headers alike.

Each header is read twice from the same bytes: as the reader chooses (the bulk path wherever the header
is plain), and with the bulk path turned off (every entry checked on its own, the way an escaped or
repeated-key header is read). Both must give the same tensors, byte ranges, problems and notes, or the
same one-line error; and ``info --json``'s rows rendered from the columns parse as the dict rows do.
"""

from __future__ import annotations

import json
import struct
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from builders import write_safetensors
from builders_readers import f32_entry, safetensors_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.operations.info import summarize
from ckpt_tui.core.readers import safetensors_file
from ckpt_tui.core.readers.open import open_checkpoint

CODES = ["F32", "F16", "BF16", "I64", "U8", "BOOL", "F8_E4M3", "F4", "X", 7, None]
SIZES = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "U8": 1, "BOOL": 1, "F8_E4M3": 1}


def read(path: Path, wired: bool = False) -> str:
    """Everything the reader gives for a file, as text (or its error); ``wired``: as a forked reader hands
    it back (through orjson's bytes, then made again), where it can."""
    try:
        checkpoint = safetensors_file.read_safetensors(str(path), path.stat().st_size)
    except ReadError as exc:
        return f"error: {exc}"
    wire = safetensors_file.to_wire(checkpoint) if wired else None
    if wire is not None:
        import orjson

        checkpoint = safetensors_file.from_wire(orjson.loads(orjson.dumps(wire)))
    records = None
    tensors = []
    for name, tensor in checkpoint.root.items():
        storage = tensor.storage
        records = storage.source
        tensors.append((name, tensor.dtype, tensor.shape, tensor.stride, tensor.offset, storage.key, storage.numel))
    ranges = sorted(records.ranges.items()) if records is not None else []
    columns = checkpoint.columns
    if columns is not None:  # the columns are the tensors' own fields
        assert columns.dtypes == [t[1] for t in tensors]
        assert columns.numels == [t[6] for t in tensors]
    return repr((tensors, ranges, checkpoint.loader_problems, checkpoint.notes, checkpoint.metadata))


def walked(path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """:func:`read` with the bulk path turned off: every entry on its own."""
    with monkeypatch.context() as patch:
        patch.setattr(safetensors_file, "_plain_tensors", lambda *args: None)
        return read(path)


@st.composite
def entries(draw: st.DrawFn, begin: int) -> tuple[Any, int]:
    """A tensor entry at ``begin``, right or broken in one of the ways a hostile header breaks it."""
    code = draw(st.sampled_from(CODES))
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    count = 1
    for size in shape:
        count *= size
    length = count * SIZES.get(code, 4) if isinstance(code, str) else 4
    offsets: list[Any] = [begin, begin + length]
    entry: dict[str, Any] = {"dtype": code, "shape": shape, "data_offsets": offsets}
    broken = draw(
        st.sampled_from(
            ["no"] * 40
            + ["length", "overlap", "hole", "past end", "float", "bool", "negative", "huge", "missing", "extra"]
            + ["order", "list offsets", "three offsets", "shape not a list", "entry not an object"]
            + ["negative offsets", "huge offsets", "float offset", "bool offset"]
        )
    )
    if broken == "length":
        offsets[1] += 1
    elif broken == "overlap" and begin:
        offsets[0] -= 1
        offsets[1] -= 1
    elif broken == "hole":
        offsets[0] += 2
        offsets[1] += 2
    elif broken == "past end":
        offsets[1] += 10_000
    elif broken == "float":
        shape.append(1.0)
    elif broken == "bool":
        shape.append(True)
    elif broken == "negative":
        shape.append(-1)
    elif broken == "huge":
        shape.extend([0, 2**63])
    elif broken == "missing":
        del entry["shape"]
    elif broken == "extra":
        entry["x"] = [1]
    elif broken == "order":
        offsets.reverse()
    elif broken == "list offsets":
        entry["data_offsets"] = [offsets]
    elif broken == "three offsets":
        offsets.append(0)
    elif broken == "shape not a list":
        entry["shape"] = "ab" if shape else {}
    elif broken == "negative offsets":  # the same length, before the data
        offsets[0] -= 1 << 20
        offsets[1] -= 1 << 20
    elif broken == "huge offsets":  # the same length, past 64 bits
        offsets[0] += 1 << 64
        offsets[1] += 1 << 64
    elif broken == "float offset":
        offsets[1] = float(offsets[1])
    elif broken == "bool offset":
        offsets[0] = begin == 0
    elif broken == "entry not an object":
        return [entry], begin + length
    return entry, begin + max(length, 0)


@st.composite
def headers(draw: st.DrawFn) -> tuple[dict[str, Any], int]:
    """A header of up to 8 entries in any order, with metadata or not, and the data size it tiles."""
    names = draw(st.lists(st.sampled_from(["a", "b", "c.d", "e", "f.g", "h", "é", "z"]), max_size=8, unique=True))
    header: dict[str, Any] = {}
    begin = 0
    for name in names:
        header[name], begin = draw(entries(begin))
    metadata = draw(st.sampled_from([None, {"format": "pt"}, {"n": 1}, ["x"], "no"]))
    if metadata != "no":
        header = {"__metadata__": metadata, **header}
    if draw(st.booleans()):
        header = dict(reversed(list(header.items())))  # the data order differs from the header's
    extra = draw(st.sampled_from([0, 0, 0, 3]))
    return header, begin + extra


@settings(
    max_examples=300,
    deadline=timedelta(seconds=10),
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(made=headers())
def test_the_bulk_path_and_the_walk_agree_on_generated_headers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, made: tuple[dict[str, Any], int]
) -> None:
    header, data_bytes = made
    path = tmp_path / "h.safetensors"
    path.write_bytes(safetensors_bytes(header, bytes(max(data_bytes, 0))))
    assert read(path) == walked(path, monkeypatch)
    assert read(path, wired=True) == read(path)  # handed back by a forked reader: the same


def test_a_file_handed_back_by_a_child_is_the_file_read_here(tmp_path: Path) -> None:
    """:func:`to_wire` and :func:`from_wire` (a shard read by a forked child): the same tensors, ranges,
    problems, metadata, summary and rows, the root still pending until asked for."""
    from ckpt_tui.cli.render import render_info

    state = {f"m.l{i}.w": torch.zeros(i % 3 + 1, 2, dtype=[torch.float32, torch.bfloat16][i % 2]) for i in range(30)}
    path = write_safetensors(state, tmp_path / "m.safetensors", metadata={"format": "pt", "x": "é"})
    assert read(path, wired=True) == read(path)
    here = open_checkpoint(path)
    assert safetensors_file.to_wire(here) is None  # a version taken as it was opened: read again, not handed back
    here.opened_version = None  # (as a shard has it)
    wire = safetensors_file.to_wire(here)
    assert wire is not None
    there = safetensors_file.from_wire(json.loads(json.dumps(wire)))
    assert there.root_pending()
    assert render_info(summarize(there), 3) == render_info(summarize(here), 3)
    assert summarize(there).rows_json() == summarize(here).rows_json()
    assert there.root_pending()
    assert there.columns is not None and there.columns.sources[0].ranges == here.columns.sources[0].ranges


def test_many_tensors_in_shuffled_data_order_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """2,000 entries whose data lie in another order than their names (the header's order is the data's)."""
    header: dict[str, Any] = {}
    begin = 0
    for i in range(2000):
        header[f"module.blocks.{i // 8}.p{i % 8}"] = f32_entry(begin, 1 + i % 3)
        begin += 4 * (1 + i % 3)
    path = tmp_path / "many.safetensors"
    path.write_bytes(safetensors_bytes({"__metadata__": {"format": "pt"}, **header}, bytes(begin)))
    fast = read(path)
    assert "overlaps" not in fast and "unused" not in fast
    assert fast == walked(path, monkeypatch)
    # the same ranges in a header whose order is not the data's: still a tiling
    shuffled = dict(sorted(header.items(), key=lambda item: (item[1]["data_offsets"][0] * 7919) % 8191))
    path.write_bytes(safetensors_bytes(shuffled, bytes(begin)))
    assert read(path) == walked(path, monkeypatch)
    assert "unused" not in read(path)


def test_tiling_problems_are_found_in_any_header_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cases = {
        "overlap": {"b": f32_entry(4, 2), "a": f32_entry(0, 2)},
        "hole": {"a": f32_entry(0, 1), "b": f32_entry(8, 1)},
        "empty at the end": {"a": f32_entry(0, 4), "b": {"dtype": "F32", "shape": [0], "data_offsets": [16, 16]}},
        "empty inside": {"a": f32_entry(0, 4), "b": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]}},
    }
    for name, header in cases.items():
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(safetensors_bytes(header, bytes(16)))
        assert read(path) == walked(path, monkeypatch), name
    assert "overlaps" in read(tmp_path / "overlap.safetensors")
    assert "unused bytes" in read(tmp_path / "hole.safetensors")
    assert "overlaps" in read(tmp_path / "empty inside.safetensors")


@settings(max_examples=40, deadline=timedelta(seconds=10), derandomize=True)
@given(
    names=st.lists(st.text("ab.é\x7f\u2028", min_size=1, max_size=5), min_size=1, max_size=6, unique=True),
    shapes=st.lists(st.lists(st.integers(0, 3), max_size=3), min_size=6, max_size=6),
)
def test_info_rows_rendered_from_columns_parse_as_the_dict_rows(names: list[str], shapes: list[list[int]]) -> None:
    import tempfile

    state = {name: torch.zeros(shapes[i]) for i, name in enumerate(names)}
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = open_checkpoint(write_safetensors(state, Path(folder) / "m.safetensors"))
        summary = summarize(checkpoint)
        rendered = summary.rows_json()
        assert (rendered is None) == (checkpoint.flat_columns() is None)  # (an escaped name: walked)
        if rendered is None:
            return
        assert rendered.isascii()
        assert json.loads(rendered) == summary.to_json()["tensors"]
        assert rendered == json.dumps(summary.to_json()["tensors"], separators=(",", ":")).encode()


def test_info_json_prints_rendered_rows_as_before(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ckpt_tui.cli.entry import main

    state = {f"module.l{i}.weight": torch.zeros(2, 3) for i in range(50)}
    state["module.é"] = torch.zeros(1, dtype=torch.int64)  # non-ASCII: the slow way, same document
    for name, chosen in (("ascii", {k: v for k, v in state.items() if k != "module.é"}), ("other", state)):
        path = write_safetensors(chosen, tmp_path / f"{name}.safetensors")
        assert main(["info", "--json", str(path)]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert printed == json.loads(json.dumps(summarize(open_checkpoint(path)).to_json()))


def test_a_header_length_of_a_real_file_is_read_as_before(tmp_path: Path) -> None:
    """A file the safetensors library wrote: bulk path, columns, no problem."""
    state = {f"w{i}": torch.ones(i % 4 + 1) for i in range(100)}
    path = write_safetensors(state, tmp_path / "lib.safetensors")
    (length,) = struct.unpack("<Q", path.read_bytes()[:8])
    checkpoint = open_checkpoint(path)
    assert length > 0 and checkpoint.columns is not None and not checkpoint.loader_problems


def test_check_of_a_clean_flat_file_counts_every_tensor_as_the_walk_does(tmp_path: Path) -> None:
    """All finite: each tensor counted in one pass; the report is the walked tree's."""
    import dataclasses

    from ckpt_tui.core.operations.check import check_checkpoint

    state = {f"module.l{i}.weight": torch.randn(3, 4) for i in range(300)}
    state["module.bn.num_batches_tracked"] = torch.tensor(7)
    state["exp_avg"] = torch.zeros(3)  # a moment's name, but not under an optimizer's state: not a moment
    checkpoint = open_checkpoint(write_safetensors(state, tmp_path / "m.safetensors"))
    assert checkpoint.flat_columns() is not None
    flat = check_checkpoint(checkpoint).to_json()
    walked = check_checkpoint(dataclasses.replace(checkpoint, columns=None)).to_json()
    assert flat == walked
    assert flat["ok"] and flat["tensors_checked"] == 302 and flat["tensors_skipped"] == 0
