"""A safetensors root summed up from its columns (``FlatColumns``) says exactly what a walk of it says.

``info`` on a big flat file takes the column path; every comparison here is against the walked path
(``summarize`` given the walk) on the same checkpoint, as text and as JSON, and the orjson parse
against json's on the same bytes.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from builders import write_safetensors
from builders_readers import f32_entry, safetensors_bytes, summaries
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpt_tui.cli.render import _fast_json, _json, render_info
from ckpt_tui.core.edits import tree_edits as edits
from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.operations.info import summarize
from ckpt_tui.core.readers import safetensors_file
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.runtime import forked

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int8, torch.bool]
KEY_PARTS = ["module", "_orig_mod", "model", "layer", "bn", "0", "weight", "bias", "running_mean", "running_var"]
KEY_PARTS += ["num_batches_tracked", "state_dict", "loops", "last_epoch", "base_lrs", "_metadata", "é"]
KEY_PARTS += ["lora_A", "base_model", "embed_tokens", "layers"]


def tensor_of(dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


@settings(
    max_examples=60,
    deadline=timedelta(seconds=10),
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    keys=st.lists(st.lists(st.sampled_from(KEY_PARTS), min_size=1, max_size=4), min_size=1, max_size=12),
    dtypes=st.lists(st.sampled_from(DTYPES), min_size=12, max_size=12),
    shapes=st.lists(st.lists(st.integers(0, 3), max_size=3), min_size=12, max_size=12),
    metadata=st.one_of(st.none(), st.dictionaries(st.sampled_from(["format", "x"]), st.text("pt. é", max_size=4))),
)
def test_columns_say_what_the_walk_says(
    tmp_path: Path, keys: list[list[str]], dtypes: list[torch.dtype], shapes: list[list[int]], metadata: Any
) -> None:
    names = list(dict.fromkeys(".".join(parts) for parts in keys))
    state = {name: tensor_of(dtypes[i], shapes[i]) for i, name in enumerate(names)}
    path = write_safetensors(state, tmp_path / "model.safetensors", metadata=metadata)
    flat, walked = summaries(path, columns=True)
    assert flat == walked
    assert json.loads(_fast_json(flat[1])) == json.loads(_json(walked[1]))  # what info --json prints


@pytest.mark.parametrize(
    "names",
    [
        ["module.a.weight", "module.a.bias", "module.bn.running_mean", "module.bn.num_batches_tracked"],
        ["_orig_mod.module.x", "_orig_mod.module.y"],
        ["state_dict", "loops"],  # keys a Lightning checkpoint has, as tensors
        ["running_mean"],
        ["only"],
        ["model.layers.0._orig_mod.w", "model.layers.1._orig_mod.w"],  # compiled submodules under a prefix
        ["module.a._orig_mod.w", "module.b.w"],
        ["base_model.model.a.lora_A.weight", "base_model.model.a.base_layer.weight"],  # a PEFT state_dict
        ["base_model.model.a.lora_A.weight", "base_model.model.a.lora_B.weight"],
        ["model.embed_tokens.weight", "model.layers.0.mlp.w", "model.norm.weight"],  # a layout that fits
        ["a.b", "a.b.c", "a.bc"],  # a key that is another's start
        ["n_averaged", "module.x", "module.y"],  # an AveragedModel's
    ],
)
def test_named_like_wrappers_and_buffers(tmp_path: Path, names: list[str]) -> None:
    state = {name: torch.ones(2, dtype=torch.int64 if "batches" in name else torch.float32) for name in names}
    flat, walked = summaries(write_safetensors(state, tmp_path / "m.safetensors"), columns=True)
    assert flat == walked


def test_a_root_that_looks_like_a_scheduler_is_audited_as_one(tmp_path: Path) -> None:
    state = {"last_epoch": torch.ones(1), "base_lrs": torch.ones(1), "_step_count": torch.ones(1)}
    path = write_safetensors(state, tmp_path / "m.safetensors")
    flat, walked = summaries(path, columns=True)
    assert flat == walked
    assert open_checkpoint(path).flat_columns() is not None


def test_holes_and_an_empty_file(tmp_path: Path) -> None:
    holed = {"a": f32_entry(0, 2), "b": f32_entry(12, 1)}  # 4 unused bytes before b
    (tmp_path / "holes.safetensors").write_bytes(safetensors_bytes(holed, bytes(16)))
    (tmp_path / "empty.safetensors").write_bytes(safetensors_bytes({}))
    for name in ("holes.safetensors", "empty.safetensors"):
        flat, walked = summaries(tmp_path / name, columns=True)
        assert flat == walked
    assert "unused bytes" in summaries(tmp_path / "holes.safetensors", columns=True)[0][0]


def test_an_edit_gives_a_tree_without_columns(tmp_path: Path) -> None:
    state = {f"module.l{i}.weight": torch.ones(2) for i in range(5)}
    checkpoint = open_checkpoint(write_safetensors(state, tmp_path / "m.safetensors"))
    assert checkpoint.flat_columns() is not None
    root, _ = edits.strip_prefix(checkpoint.root, "module.")
    edited = dataclasses.replace(checkpoint, root=root)
    assert edited.flat_columns() is None
    assert sorted(edited.root) == [f"l{i}.weight" for i in range(5)]
    assert not [f for f in summarize(edited).findings if f.kind == "prefix"]


def test_a_size_past_int64_is_still_refused(tmp_path: Path) -> None:
    """The reader checks each layout as check_tree would, and leaves the wording to it."""
    entry = {"dtype": "F32", "shape": [0, 2**63], "data_offsets": [0, 0]}
    path = tmp_path / "big.safetensors"
    path.write_bytes(safetensors_bytes({"a": entry}))
    with pytest.raises(ReadError, match="does not fit in int64"):
        open_checkpoint(path)


HEADERS = {
    "huge int in a shape": {"a": {"dtype": "F32", "shape": [2**64], "data_offsets": [0, 0]}},
    "huge int in the metadata": {"__metadata__": {"n": 2**70}, "a": f32_entry(0, 1)},
    "float in the metadata": {"__metadata__": {"n": 1.5}, "a": f32_entry(0, 1)},
    "nested metadata": {"__metadata__": {"n": {"m": [1, 2**65]}}, "a": f32_entry(0, 1)},
    "huge offset": {"a": {"dtype": "F32", "shape": [1], "data_offsets": [2**64 + 1, 2**64 + 5]}},
    "negative size": {"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}},
    "extra field": {"a": {**f32_entry(0, 1), "x": 2**80}},
    "plain": {"__metadata__": {"format": "pt"}, "b": f32_entry(4, 1), "a": f32_entry(0, 1)},
}
TEXTS = {
    "NaN in the metadata": '{"__metadata__":{"n":NaN},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
    "1E400 in a shape": '{"a":{"dtype":"F32","shape":[1E400],"data_offsets":[0,4]}}',
    "repeated key": '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],'
    '"data_offsets":[0,4]}}',
    "escaped name": '{"\\u0061":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
}


def outcome(path: Path) -> str:
    try:
        checkpoint = open_checkpoint(path)
    except ReadError as exc:
        return f"error: {exc}"
    summary = summarize(checkpoint)
    return render_info(summary, 3) + json.dumps(summary.to_json(), default=str)


@pytest.mark.parametrize("name", [*HEADERS, *TEXTS])
def test_orjson_reads_as_json_does(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """orjson reads ints past 64 bits as floats: such headers are read from json's parse, as before."""
    header = HEADERS.get(name) or TEXTS[name]
    path = tmp_path / "h.safetensors"
    path.write_bytes(safetensors_bytes(header, bytes(8)))
    fast = outcome(path)
    monkeypatch.setattr(safetensors_file, "orjson", None)
    assert fast == outcome(path)


def test_check_reads_a_flat_file_as_it_reads_a_walked_one(tmp_path: Path) -> None:
    from ckpt_tui.core.operations.check import check_checkpoint

    state = {f"module.l{i}.weight": torch.randn(3, 4) for i in range(70)}
    state["module.l5.weight"][1, 2] = float("nan")
    state["module.bn.running_var"] = torch.full((3,), float("inf"))
    state["module.bn.num_batches_tracked"] = torch.tensor(7)
    checkpoint = open_checkpoint(write_safetensors(state, tmp_path / "m.safetensors"))
    assert checkpoint.flat_columns() is not None
    flat = check_checkpoint(checkpoint).to_json()
    walked = check_checkpoint(dataclasses.replace(checkpoint, columns=None)).to_json()
    assert flat == walked
    assert [p["kind"] for p in flat["problems"]].count("nan") == 1


def test_a_shard_set_of_flat_shards_says_what_its_walk_says(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    names = [f"model.layers.{i // 4}.w{i % 4}.weight" for i in range(40)]
    weight_map = {}
    for shard in range(3):
        file = f"model-{shard + 1:05d}-of-00003.safetensors"
        part = names[shard::3]
        save_file({n: torch.full((2, i % 3 + 1), float(i)) for i, n in enumerate(part)}, str(tmp_path / file))
        weight_map.update(dict.fromkeys(part, file))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": weight_map}))
    flat, walked = summaries(index, columns=True)
    assert flat == walked
    assert [row["path"] for row in flat[1]["tensors"]] == [[n] for n in weight_map]


def test_a_shard_set_with_a_tied_shard_is_walked(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(2)}, str(tmp_path / "one.safetensors"))
    tied = torch.ones(2)
    torch.save({"b": tied, "c": tied}, tmp_path / "two.bin")  # one storage under two keys: no columns
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "one.safetensors", "b": "two.bin", "c": "two.bin"}}))
    flat, walked = summaries(index, columns=False)
    assert flat == walked


def shard_outcome(index: Path) -> str:
    """What ``info`` says of a shard set (text and JSON), its tensors' fields, or its one-line error."""
    try:
        checkpoint = open_checkpoint(index)
    except ReadError as exc:
        return f"error: {exc}"
    summary = summarize(checkpoint)
    shown = render_info(summary, 3) + json.dumps(summary.to_json(), default=str)
    tensors = [(k, t.shape, t.dtype, t.storage.key, t.storage.source.path) for k, t in checkpoint.root.items()]
    return shown + repr(tensors)


@settings(
    max_examples=60,
    deadline=timedelta(seconds=20),
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    held=st.lists(
        st.lists(st.sampled_from(["a", "b.c", "d", "model.e", "é", "f"]), max_size=4, unique=True),
        min_size=1,
        max_size=3,
    ),
    claims=st.lists(
        st.tuples(st.sampled_from(["a", "b.c", "d", "model.e", "é", "f", "g"]), st.integers(0, 3)), max_size=3
    ),
    faithful=st.booleans(),
    broken=st.sampled_from(["none", "hole", "overlap", "tail", "metadata", "garbage"]),
    at=st.integers(0, 2),
)
def test_a_shard_set_says_what_its_walk_says_whatever_the_index_claims(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    held: list[list[str]],
    claims: list[tuple[str, int]],
    faithful: bool,
    broken: str,
    at: int,
) -> None:
    """The set's columns (gathered from its shards' columns) and the key-by-key assembly agree on any
    index: keys in the wrong shard, in no shard, a shard named that does not exist, keys no entry names,
    an empty map, and a shard whose header the library refuses (a hole, an overlap, bytes after the
    data, metadata not of strings) or that is no checkpoint at all; the same error, or the same info and
    the same tensors. Shards read by a forked child (the later half) say what shards read here say."""
    from safetensors.torch import save_file

    from ckpt_tui.core.readers import sharded

    files = [f"model-{i + 1:05d}-of-00003.safetensors" for i in range(len(held))]
    for i, (file, names) in enumerate(zip(files, held, strict=True)):
        save_file({n: torch.full((i + 1, len(n)), float(i)) for n in names}, str(tmp_path / file))
    at = min(at, len(held) - 1)
    if broken == "garbage":
        (tmp_path / files[at]).write_bytes(b"not a checkpoint at all")
    elif held[at] and broken != "none":  # a shard written by hand, broken one way
        header: dict[str, Any] = {"__metadata__": {"n": 1}} if broken == "metadata" else {}
        begin = 0
        for n in held[at]:
            header[n] = f32_entry(begin, 2)
            begin += 8 if broken != "hole" else 12
        if broken == "overlap" and len(held[at]) > 1:
            header[held[at][-1]] = f32_entry(begin - 12, 2)
        data = bytes(begin + (4 if broken == "tail" else 0))
        (tmp_path / files[at]).write_bytes(safetensors_bytes(header, data))
    # the true map (when ``faithful``), then the claims: keys moved, added, or sent to a missing file
    weight_map = {n: file for file, names in zip(files, held, strict=True) for n in names} if faithful else {}
    weight_map.update({key: [*files, "missing.safetensors"][min(shard, len(files))] for key, shard in claims})
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": weight_map}))
    gathered = shard_outcome(index)
    with monkeypatch.context() as patch:
        patch.setattr(sharded, "_assembled", lambda *args: None)
        walked = shard_outcome(index)
    assert gathered == walked
    with monkeypatch.context() as patch:  # no child: every shard read here, in turn
        patch.setattr(forked, "fork", lambda *args: None)
        alone = shard_outcome(index)
    assert gathered == alone


def test_a_child_reads_the_later_shards_of_a_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A set of four shards: the last two come back from the forked child as columns, and info says what
    it says with every shard read here."""
    from safetensors.torch import save_file

    from ckpt_tui.core.readers import sharded

    weight_map = {}
    for shard in range(4):
        file = f"model-{shard + 1:05d}-of-00004.safetensors"
        part = {f"model.layers.{shard}.w{i}": torch.full((2, i + 1), float(i)) for i in range(5)}
        save_file(part, str(tmp_path / file))
        weight_map.update(dict.fromkeys(part, file))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": weight_map}))
    handed: list[str] = []
    made = sharded.from_wire

    def spied(wire: dict[str, Any]) -> Any:
        handed.append(Path(wire["path"]).name)
        return made(wire)

    monkeypatch.setattr(sharded, "from_wire", spied)
    probe = forked.fork(lambda: 0)
    if probe is None:
        pytest.skip("no second core or no fork here")
    assert probe.result() == 0
    both = shard_outcome(index)
    assert handed == ["model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors"]
    monkeypatch.setattr(forked, "fork", lambda *args: None)
    assert shard_outcome(index) == both


def test_rows_shown_before_the_root_is_made_are_its_own_objects(tmp_path: Path) -> None:
    """The top of info's tree is made alone; the root made later holds those very tensors (file and set)."""
    from safetensors.torch import save_file

    names = [f"model.layers.{i}.w.weight" for i in range(30)]
    save_file({n: torch.ones(2) for n in names[::2]}, str(tmp_path / "a.safetensors"))
    save_file({n: torch.ones(3) for n in names[1::2]}, str(tmp_path / "b.safetensors"))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {n: "ab"[i % 2] + ".safetensors" for i, n in enumerate(names)}}))
    for path in (tmp_path / "a.safetensors", index):
        checkpoint = open_checkpoint(path)
        columns = checkpoint.flat_columns()
        assert columns is not None and checkpoint.root_pending()
        head = columns.head(5)
        assert checkpoint.root_pending()
        root = checkpoint.root
        assert not checkpoint.root_pending() and checkpoint.flat_columns() is columns
        assert all(root[name] is tensor for name, tensor in head)
        assert checkpoint.root is root and columns.listed() == list(zip(zip(root), root.values(), strict=True))


def test_threads_asking_at_once_get_one_root(tmp_path: Path) -> None:
    """The browser's UI thread and its workers may ask for a pending root together: one root is made."""
    import threading

    path = write_safetensors({f"k{i}": torch.ones(1) for i in range(3000)}, tmp_path / "m.safetensors")
    checkpoint = open_checkpoint(path)
    assert checkpoint.root_pending()
    start = threading.Barrier(4)
    roots: list[Any] = []

    def ask() -> None:
        start.wait()
        roots.append(checkpoint.root)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(roots) == 4 and all(root is roots[0] for root in roots)
