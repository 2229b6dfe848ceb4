"""Layouts a file fits (``conventions/architectures.py``): ruling anchors out by a search of the joined keys
gives exactly what matching every key gives."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt_tui.core.conventions import architectures
from ckpt_tui.core.conventions.architectures import fitting

PARTS = ["model", "layers", "0", "12", "embed_tokens", "norm", "bert", "embeddings", "encoder", "layer", "h"]
PARTS += ["transformer", "wte", "decoder", "weight", "module", "text_model", "x\nmodel", "model\n", "é", ""]


@settings(max_examples=60, deadline=timedelta(seconds=20), derandomize=True)
@given(
    stems=st.lists(st.lists(st.sampled_from(PARTS), min_size=1, max_size=5), min_size=1, max_size=12),
    count=st.integers(architectures.JOIN_FROM - 10, architectures.JOIN_FROM + 40),
    newlines=st.booleans(),
)
def test_joined_search_finds_the_layouts_the_key_by_key_match_finds(
    stems: list[list[str]], count: int, newlines: bool
) -> None:
    keys = [".".join(stems[i % len(stems)]) + f".{i % 7}.weight" for i in range(count)]
    keys = keys if newlines else [key.replace("\n", "") for key in keys]
    joined = fitting(keys)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(architectures, "JOIN_FROM", 10**9)
        patch.setattr(architectures, "_last_fitting", (None, []))  # (asked again, not answered from memory)
        assert joined == fitting(keys)


@pytest.mark.parametrize("first", ["model.embed_tokens.weight", "model.zz.weight"])
def test_many_keys_fit_the_layouts_they_fit_key_by_key(first: str) -> None:
    keys = [f"model.layers.{i}.mlp.w{j}.weight" for i in range(100) for j in range(3)] + [first, "model.norm.weight"]
    found = fitting(keys)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(architectures, "JOIN_FROM", 10**9)
        patch.setattr(architectures, "_last_fitting", (None, []))  # (asked again, not answered from memory)
        assert found == fitting(keys)
    llama = [layout.name for layout, _ in found if layout.name.startswith("Llama")]
    assert llama == (["Llama-style model (Llama, Mistral, Qwen2, Gemma)"] if "embed" in first else [])


@pytest.mark.parametrize(
    ("pattern", "start"),
    [("model\\.layers\\.\\d+\\.", "model.layers."), ("ab?c", "a"), ("x\\.y|z", ""), ("(?:a|b)\\.", "")],
)
def test_the_literal_start_of_an_anchor(pattern: str, start: str) -> None:
    assert architectures._literal_start(pattern) == start


def test_asked_twice_the_same_answer_is_given_again() -> None:
    keys = ["model.embed_tokens.weight"] + [f"model.layers.{i}.w.weight" for i in range(300)]
    first = fitting(keys)
    assert fitting(list(keys)) == first and fitting(keys[:-1]) == architectures._fitting(keys[:-1])
