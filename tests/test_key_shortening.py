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


def initials(short: str, key: str) -> list[str]:
    """The components of ``short`` cut to one letter (that are longer in ``key``)."""
    whole = set(re.findall(r"[A-Za-z_]\w*", key))
    return [part for part in re.findall(r"(?<![\w…])[A-Za-z_](?![\w…])", short) if part not in whole]


def test_every_bert_key_reads_apart_from_the_others_and_keeps_its_layer_number_and_parameter() -> None:
    keys = list(bert_state_dict())
    assert any(len(key) > 45 for key in keys)
    for width in range(26, max(map(len, keys)) + 1):
        for shown in ([shorten(key, width) for key in keys], shorten_all(keys, width)):
            assert repeated(shown) == {}, width
            for key, short in zip(keys, shown, strict=True):
                assert len(short) <= width
                assert short == key or len(key) > width  # a key that fits is whole
                assert short.endswith("." + key.rsplit(".", 1)[-1]) or short == key
                assert re.findall(r"\d+", short) == re.findall(r"\d+", key), (key, short)
                assert initials(short, key) == [], (key, short)  # never a name to its first letter


def test_a_key_gives_up_its_start_then_the_middle_of_its_longest_name_never_a_letter_alone() -> None:
    key = "model.layers.0.post_attention_layernorm.weight"
    assert shorten(key, 60) == key
    assert shorten(key, 41) == "…layers.0.post_attention_layernorm.weight"
    assert shorten(key, 36) == "…0.post_attention_layernorm.weight"
    assert shorten(key, 30) == "…0.post_attention_…norm.weight"
    assert shorten(key, 22) == "…0.post_att…orm.weight"
    # too narrow even for that: its numbers and leaf, and the names that fit, a run left out said "…"
    assert shorten(key, 12) == "…0.…weight"
    assert shorten("module.layer3.0.downsample.0.weight", 20) == "…layer3.0.…0.weight"
    assert shorten("module.layer3.0.downsample.0.weight", 22) == "…r3.0.down…le.0.weight"
    assert shorten("state_dict/module.bn1.num_batches_tracked", 38) == "…module.bn1.num_batches_tracked"
    assert shorten("fp32_weights/bn.num_batches_tracked", 34) == "…bn.num_batches_tracked"
    assert shorten('ckpt["optimizer"]["state"][0]["exp_avg"]', 30) == '…["state"][0]["exp_avg"]'
    assert shorten('ckpt["optimizer"]["state"][0]["exp_avg"]', 16) == '…[0]["exp_avg"]'
    assert shorten("short.key", 30) == "short.key"
    assert shorten("abcdefghij", 1) == "…"
    assert shorten("a key with spaces that is far too long", 20) == "…hat is far too long"
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
def test_diff_stats_rows_of_a_bert_read_apart_at_80_columns_and_keep_their_numbers_at_60(
    tmp_path: Path, width: int
) -> None:
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
    for section in report.sections[:2]:
        rows = [row for row in section.rows if row.key is not None]
        assert len(rows) == len(weights)
        assert all(len(row.text) <= room for row in rows)
        keys = [row.text.split(" ")[0] for row in rows]
        if width == 80:
            assert repeated(keys) == {}, section.title
        for key, row in zip(keys, rows, strict=True):
            # every layer number and parameter stays, and no name is cut to its initial
            assert re.findall(r"\d+", key) == re.findall(r"\d+", str(row.key))
            assert key.endswith(str(row.key).rsplit(".", 1)[-1])
            assert initials(key, str(row.key)) == []


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


def test_a_listing_cuts_only_the_keys_that_do_not_fit_and_those_under_one_path_alike() -> None:
    shown = dict(zip(TRANSFORMER, shorten_all(TRANSFORMER, 34), strict=True))
    assert all(len(text) <= 34 for text in shown.values())
    # the keys that fit are whole; those that do not give up the start of encoder.layers. alike
    assert shown["encoder.layers.0.self_attn.in_proj_weight"] == "…layers.0.self_attn.in_proj_weight"
    assert shown["encoder.layers.2.self_attn.in_proj_bias"] == "…layers.2.self_attn.in_proj_bias"
    assert shown["encoder.layers.2.norm1.bias"] == "encoder.layers.2.norm1.bias"
    assert shown["backbone.0.weight"] == "backbone.0.weight" and shown["head.weight"] == "head.weight"


LLAMA = [
    "model.embed_tokens.weight",
    *(
        f"model.layers.{i}.{name}.weight"
        for i in range(2)
        for name in ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "mlp.down_proj")
    ),
]


def test_a_listing_that_fits_is_left_whole_and_a_narrower_one_cuts_one_name_to_one_length() -> None:
    assert shorten_all(TRANSFORMER, 60) == TRANSFORMER
    narrow = dict(zip(LLAMA, shorten_all(LLAMA, 24), strict=True))
    assert all(len(text) <= 24 for text in narrow.values())
    assert narrow["model.embed_tokens.weight"] == "…embed_tokens.weight"
    assert narrow["model.layers.1.mlp.down_proj.weight"] == "…1.mlp.down_proj.weight"
    # post_attention_layernorm cut alike in both layers, never to its initial
    cut = [text for key, text in narrow.items() if "post_attention" in key]
    assert cut == ["…0.post_atte…norm.weight", "…1.post_atte…norm.weight"]


def test_a_listing_of_reprs_falls_back_to_one_key_at_a_time() -> None:
    texts = ["a key with spaces that is far too long", "short"]
    assert shorten_all(texts, 12) == [shorten(texts[0], 12), "short"]
