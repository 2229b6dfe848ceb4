"""Long keys shortened to fit a column keep what tells them apart: the layer's number, the parameter's name,
and where each component was (its initial), so layer 0 and layer 1 never read the same; a table says the
start all its rows share once, above them (``under model_state_dict/``)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import torch

from ckpt_tui.core.operations.convert import select
from ckpt_tui.core.operations.layer_change import layer_change
from ckpt_tui.core.operations.reports import describe_layer_change
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.values.text_plots import shared_start, shorten, shorten_all


def bert_state_dict() -> dict[str, torch.Tensor]:
    """A tiny BERT's weights, as transformers names them (two layers: the keys differ by the layer's number)."""
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = tf.BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32
    )
    return {key: value.clone() for key, value in tf.BertModel(config).state_dict().items()}


def repeated(rows: list[str]) -> dict[str, int]:
    return {row: n for row, n in Counter(rows).items() if n > 1}


def test_every_bert_key_reads_apart_from_the_others_and_keeps_its_layer_number_and_parameter() -> None:
    keys = list(bert_state_dict())
    assert any(len(key) > 45 for key in keys)
    for width in range(15, max(map(len, keys)) + 1):
        shown = [shorten(key, width) for key in keys]
        assert repeated(shown) == {}, width
        for key, short in zip(keys, shown, strict=True):
            assert len(short) <= width
            assert short.endswith("." + key.rsplit(".", 1)[-1]) or short == key
            assert re.findall(r"\d+", short) == re.findall(r"\d+", key), (key, short)


def test_components_go_to_their_initials_from_the_left_the_last_one_cut_keeping_what_fits() -> None:
    key = "encoder.layer.0.attention.output.LayerNorm.weight"
    assert shorten(key, 60) == key
    assert shorten(key, 43) == "e.layer.0.attention.output.LayerNorm.weight"
    assert shorten(key, 38) == "e.l.0.attenti….output.LayerNorm.weight"
    assert shorten(key, 20) == "e.l.0.a.o.La….weight"
    assert shorten(key, 18) == "e.l.0.a.o.L.weight"
    # too narrow even for the initials: their end, from a component's start
    assert shorten(key, 16) == "…0.a.o.L.weight"
    assert shorten("model_state_dict/module.layer1.0.conv1.weight", 20) == "…yer1.0.conv1.weight"
    assert shorten('ckpt["optimizer_state_dict"]["state"][0]["step"]', 30) == 'c["opti…"]["state"][0]["step"]'
    assert shorten("short.key", 30) == "short.key"
    assert shorten("abcdefghij", 1) == "…"
    key = "model_state_dict/module.layer1.0.conv1.weight"
    assert all(len(shorten(key, width)) <= width for width in range(0, len(key) + 1))


def test_the_shared_start_ends_at_a_component_and_leaves_every_key_something() -> None:
    assert shared_start(["model_state_dict/0.weight", "model_state_dict/1.bias"]) == "model_state_dict/"
    optimizer = ['ckpt["opt"]["state"][0]["exp_avg"]', 'ckpt["opt"]["state"][1]["exp_avg"]']
    assert shared_start(optimizer) == 'ckpt["opt"]["state"]'
    assert shared_start(["layer10.weight", "layer1.weight"]) == ""
    assert shared_start(["embeddings.x", "encoder.y"]) == ""
    assert shared_start(["only.one"]) == ""


@pytest.mark.parametrize("width", [80, 60])
def test_diff_stats_rows_of_a_bert_never_read_the_same_at_80_and_60_columns(tmp_path: Path, width: int) -> None:
    weights = bert_state_dict()
    torch.save(weights, tmp_path / "a.pth")
    torch.save({key: value + 0.01 for key, value in weights.items()}, tmp_path / "b.pth")
    sides = [
        select(open_checkpoint(str(tmp_path / name)), None, None, side)
        for name, side in (("a.pth", "a"), ("b.pth", "b"))
    ]
    room = max(60, width - 2)  # the browser's report rows; 60 at the least
    report = describe_layer_change(layer_change(*sides), "a.pth", "b.pth", room)
    # the table's key column, then the plot's
    for section, column in zip(report.sections[:2], (room - 40, min(30, room // 3)), strict=True):
        rows = [row for row in section.rows if row.key is not None]
        assert len(rows) == len(weights)
        assert all(len(row.text) <= room for row in rows)
        keys = [row.text[:column].rstrip() for row in rows]
        assert repeated(keys) == {}, section.title
        # every layer number stays
        assert [re.findall(r"\d+", key) for key in keys] == [re.findall(r"\d+", str(row.key)) for row in rows]


def test_a_table_of_one_state_dict_says_its_start_once_in_its_title(tmp_path: Path, capsys) -> None:
    from ckpt_tui.cli import main

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    torch.save({"model_state_dict": model.state_dict()}, tmp_path / "a.pth")
    with torch.no_grad():
        model[0].weight.add_(1)
    torch.save({"model_state_dict": model.state_dict()}, tmp_path / "b.pth")
    main(["diff", str(tmp_path / "a.pth"), str(tmp_path / "b.pth"), "--stats"])
    out = capsys.readouterr().out
    assert "per layer, under model_state_dict/ (" in out
    table = out.split("per layer, under model_state_dict/")[1].split("relative change by layer")[0]
    assert "\n  0.weight " in table and "model_state_dict/" not in table


def test_where_the_initials_are_too_long_the_layer_number_outranks_the_parameters_whole_name() -> None:
    key = "encoder.layer.0.attention.self.query.weight"
    assert shorten(key, 15) == "…0.a.s.q.weight"
    assert shorten(key, 11) == "…0.a.s.q.w"
    # a key without a number keeps its parameter whole
    assert shorten("embeddings.word_embeddings.weight", 9) == "…w.weight"
    keys = list(bert_state_dict())
    for width in (12, 13, 14):
        assert repeated([shorten(key, width) for key in keys]) == {}, width


# ---- one rule per listing: the keys of one list shortened alike ------------------------------------------

TRANSFORMER = [
    "backbone.0.weight",
    *(
        f"encoder.layers.{i}.{name}"
        for i in range(3)
        for name in ("self_attn.in_proj_weight", "self_attn.in_proj_bias", "linear1.weight", "norm1.bias")
    ),
    "encoder.norm.weight",
    "head.weight",
]


def test_a_listing_cuts_a_path_to_its_initial_in_every_key_under_it_and_only_there() -> None:
    shown = dict(zip(TRANSFORMER, shorten_all(TRANSFORMER, 34), strict=True))
    assert all(len(text) <= 34 for text in shown.values())
    # every key under encoder.layers reads e.l.N., the long ones and the short ones alike
    assert shown["encoder.layers.0.self_attn.in_proj_weight"] == "e.l.0.self_attn.in_proj_weight"
    assert shown["encoder.layers.2.norm1.bias"] == "e.l.2.norm1.bias"
    assert shown["encoder.norm.weight"] == "e.norm.weight"
    # keys under no cut path stay whole
    assert shown["backbone.0.weight"] == "backbone.0.weight" and shown["head.weight"] == "head.weight"


def test_a_listing_that_fits_is_left_whole_and_a_narrower_one_cuts_deeper_alike() -> None:
    assert shorten_all(TRANSFORMER, 60) == TRANSFORMER
    narrow = shorten_all(TRANSFORMER, 24)
    assert all(len(text) <= 24 for text in narrow)
    layers = [text for key, text in zip(TRANSFORMER, narrow, strict=True) if key.startswith("encoder.layers.")]
    # one cut for the listing: the same components to their initials in every layer's key
    assert [text[: len("e.l.0.")] for text in layers] == [f"e.l.{i}." for i in range(3) for _ in range(4)]
    assert len({text[len("e.l.0.") :] for text in layers}) == 4  # the 4 names of a layer, alike in each


def test_a_listing_of_reprs_falls_back_to_one_key_at_a_time() -> None:
    texts = ["a key with spaces that is far too long", "short"]
    assert shorten_all(texts, 12) == [shorten(texts[0], 12), "short"]
