"""The model layouts core knows by their keys: Hugging Face architectures, each as its head model (the
body under its attribute, ``model.``/``bert.``/``transformer.``, heads beside it) and its base model (the
body alone). A file *fits* a layout when the layout explains most of its keys; a hint's fix is checked
against every layout the keys fit (see :mod:`ckpt_tui.core.operations.hints`).

Each family is written from the key names transformers gives the class (``_tied_weights_keys`` and the
modules' attribute names); tests build the real models and hold each family to them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

JOIN_FROM = 256
"""From this many keys, :func:`fitting` rules anchors out by one search of the joined keys per anchor."""
FIT_SHARE = 0.8
"""A layout fits keys when it explains at least this share of them (a few keys of the user's own beside it)."""


@dataclass(frozen=True)
class Family:
    """One architecture's keys: what its body holds (``parts``, regexes under the body attribute), the
    parts it always has (``anchors``), and the heads its task classes put beside the body. ``base_model``:
    the class of the body alone (``""``: none is a layout of its own)."""

    head_model: str
    base_model: str
    body: str
    parts: tuple[str, ...]
    anchors: tuple[str, ...]
    heads: tuple[str, ...] = ()


@dataclass(frozen=True)
class Layout:
    """A model layout: a name a user knows, and the full-key patterns it explains."""

    name: str
    pattern: re.Pattern[str]
    anchors: tuple[re.Pattern[str], ...]
    body: str
    """The attribute the body sits under (``model.``), or ``""`` (a base model, or a family without one)."""

    def fit(self, keys: Sequence[str], joined: str | None = None) -> int:
        """How many keys the layout explains; 0 when one of its anchors has no key. ``joined``: the keys
        as :func:`joined_keys` gives them, to rule anchors out by their literal start in one search."""
        if not all(_some_key_matches(anchor, keys, joined) for anchor in self.anchors):
            return 0
        return sum(1 for _ in filter(None, map(self.pattern.match, keys)))


N = r"\d+\."
ENCODER_PARTS = (r"embeddings\.", r"encoder\.", r"pooler\.")
ENCODER_ANCHORS = (r"embeddings\.", rf"encoder\.layer\.{N}")
SEQ2SEQ_PARTS = (r"shared\.", r"encoder\.", r"decoder\.")
SEQ2SEQ_ANCHORS = (rf"encoder\.layers\.{N}", rf"decoder\.layers\.{N}")
SEQ2SEQ_HEADS = (r"lm_head\.", r"final_logits_bias$", r"classification_head\.", r"qa_outputs\.")
FAMILIES: tuple[Family, ...] = (
    Family(
        "Llama-style model (Llama, Mistral, Qwen2, Gemma)",
        "LlamaModel",
        "model.",
        (r"embed_tokens\.", rf"layers\.{N}", r"norm\.", r"rotary_emb\."),
        (r"embed_tokens\.", rf"layers\.{N}"),
        (r"lm_head\.", r"score\."),
    ),
    Family(
        "GPT2LMHeadModel",
        "GPT2Model",
        "transformer.",
        (r"wte\.", r"wpe\.", rf"h\.{N}", r"ln_f\."),
        (r"wte\.", rf"h\.{N}"),
        (r"lm_head\.", r"score\.", r"multiple_choice_head\."),
    ),
    Family(
        "GPTNeoXForCausalLM",
        "GPTNeoXModel",
        "gpt_neox.",
        (r"embed_in\.", rf"layers\.{N}", r"final_layer_norm\.", r"rotary_emb\.", r"emb_dropout\."),
        (r"embed_in\.", rf"layers\.{N}"),
        (r"embed_out\.",),
    ),
    Family(
        "OPTForCausalLM",
        "OPTModel",
        "model.",
        (r"decoder\.",),
        (r"decoder\.embed_tokens\.", rf"decoder\.layers\.{N}"),
        (r"lm_head\.", r"score\."),
    ),
    Family(
        "BertFor*",
        "BertModel",
        "bert.",
        ENCODER_PARTS,
        ENCODER_ANCHORS,
        (r"cls\.", r"classifier\.", r"qa_outputs\."),
    ),
    Family(
        "RobertaFor*",
        "RobertaModel",
        "roberta.",
        ENCODER_PARTS,
        ENCODER_ANCHORS,
        (r"lm_head\.", r"classifier\.", r"qa_outputs\."),
    ),
    Family(
        "ElectraFor*",
        "ElectraModel",
        "electra.",
        (*ENCODER_PARTS, r"embeddings_project\."),
        ENCODER_ANCHORS,
        (r"discriminator_predictions\.", r"generator_predictions\.", r"generator_lm_head\.", r"classifier\."),
    ),
    Family(
        "AlbertFor*",
        "AlbertModel",
        "albert.",
        ENCODER_PARTS,
        (r"embeddings\.", r"encoder\.albert_layer_groups\."),
        (r"predictions\.", r"sop_classifier\.", r"classifier\.", r"qa_outputs\."),
    ),
    Family(
        "DistilBertFor*",
        "DistilBertModel",
        "distilbert.",
        (r"embeddings\.", r"transformer\."),
        (r"embeddings\.", rf"transformer\.layer\.{N}"),
        (r"vocab_transform\.", r"vocab_layer_norm\.", r"vocab_projector\.", r"pre_classifier\.", r"classifier\."),
    ),
    Family(
        "ViTFor*",
        "ViTModel",
        "vit.",
        (r"embeddings\.", r"encoder\.", rf"layers\.{N}", r"layernorm\.", r"pooler\."),
        (r"embeddings\.", rf"(?:encoder\.layer|layers)\.{N}"),
        (r"classifier\.",),
    ),
    Family(
        "WhisperForConditionalGeneration",
        "WhisperModel",
        "model.",
        SEQ2SEQ_PARTS,
        (r"encoder\.conv1\.", *SEQ2SEQ_ANCHORS),
        (r"proj_out\.",),
    ),
    Family(
        "BART-style model (BART, mBART, Marian, Pegasus)",
        "BartModel",
        "model.",
        SEQ2SEQ_PARTS,
        SEQ2SEQ_ANCHORS,
        SEQ2SEQ_HEADS,
    ),
    Family(
        "T5ForConditionalGeneration",
        "T5EncoderModel",
        "",
        (r"shared\.", r"encoder\.", r"decoder\."),
        (rf"encoder\.block\.{N}",),
        (r"lm_head\.",),
    ),
    Family(
        "CLIPModel",
        "CLIPTextModel",
        "",
        (r"text_model\.", r"vision_model\.", r"visual_projection\.", r"text_projection\.", r"logit_scale$"),
        (r"text_model\.", r"vision_model\."),
    ),
    Family("CLIPTextModelWithProjection", "", "", (r"text_model\.",), (r"text_model\.encoder\.",)),
    Family("CLIPVisionModelWithProjection", "", "", (r"vision_model\.",), (r"vision_model\.encoder\.",)),
)
"""Architectures by their keys. Several share one layout (Mistral, Qwen2, Gemma keep Llama's; mBART, Marian,
Pegasus keep BART's): the layout is named after the first. ``For*`` stands for any of the family's heads."""
GENERIC_BODIES = (
    "model",
    "transformer",
    "bert",
    "roberta",
    "xlm_roberta",
    "deberta",
    "electra",
    "albert",
    "distilbert",
    "mpnet",
    "longformer",
    "gpt_neox",
    "vit",
    "swin",
    "convnext",
    "wav2vec2",
    "hubert",
)
"""Hugging Face ``base_model_prefix`` names: a body under one of them holding an embedding and numbered
blocks is a Hugging Face model's, whatever its family (BLOOM's and Falcon's transformer.word_embeddings,
MPT's transformer.blocks.N, Phi's model.final_layernorm)."""
EMBEDDING = r"(?:embeddings?|embed_tokens|wte|word_embeddings|embed_in|feature_extractor|patch_embed)\."
BLOCKS = rf"(?:(?:encoder\.|decoder\.)?(?:layers?|h|blocks?)\.{N}|encoder\.|decoder\.)"
FAMILIES += tuple(
    Family(f"model whose body is its .{name}", "", f"{name}.", (r"\w",), (EMBEDDING, BLOCKS), (r"lm_head\.",))
    for name in GENERIC_BODIES
)


def _source(prefix: str, parts: tuple[str, ...], heads: tuple[str, ...] = ()) -> str:
    body = f"{re.escape(prefix)}(?:{'|'.join(parts)})"
    return f"(?:{body}|{'|'.join(heads)})" if heads else body


@dataclass(frozen=True)
class _Planned:
    """A layout before its patterns are compiled (most files rule most layouts out by their anchors' first
    component: compiling them all took tens of milliseconds of every ``info``)."""

    name: str
    pattern: str
    anchors: tuple[str, ...]
    body: str


@cache
def _planned() -> tuple[_Planned, ...]:
    """Every layout, uncompiled: each family's head model, then its base model (the body alone, no attribute)."""
    out: list[_Planned] = []
    seen: set[str] = set()
    for family in FAMILIES:
        anchors = tuple(re.escape(family.body) + anchor for anchor in family.anchors)
        out.append(_Planned(family.head_model, _source(family.body, family.parts, family.heads), anchors, family.body))
        base = _source("", family.parts)
        if family.body and family.base_model and base not in seen:
            # one layout for bodies keyed alike (BERT's, RoBERTa's, ELECTRA's): named after the first
            seen.add(base)
            out.append(_Planned(family.base_model, base, family.anchors, ""))
    return tuple(out)


@cache
def _layout(index: int) -> Layout:
    plan = _planned()[index]
    return Layout(plan.name, re.compile(plan.pattern), tuple(map(re.compile, plan.anchors)), plan.body)


def layouts() -> tuple[Layout, ...]:
    """Every layout: each family's head model, then its base model (the body alone, no attribute)."""
    return tuple(map(_layout, range(len(_planned()))))


def fitting(keys: Sequence[str]) -> list[tuple[Layout, int]]:
    """The layouts these keys fit (each explains :data:`FIT_SHARE` of them at least), best first, with
    how many keys each explains."""
    global _last_fitting
    listed = [key for key in keys if key != "_metadata"] if "_metadata" in keys else list(keys)
    if not listed:
        return []
    last = _last_fitting
    if last[0] == listed:  # the findings and the check of their fixes ask of the same keys
        return list(last[1])
    found = _fitting(listed)
    _last_fitting = (listed, found)
    return list(found)


_last_fitting: tuple[list[str] | None, list[tuple[Layout, int]]] = (None, [])
"""The keys :func:`fitting` was last asked about, and its answer."""


def _fitting(listed: list[str]) -> list[tuple[Layout, int]]:
    heads = _first_components(listed)
    joined = joined_keys(listed) if len(listed) > JOIN_FROM else None
    found = []
    for index, plan in enumerate(_planned()):
        # a first look in a set: each anchor's first component must be some key's (before any compiling)
        if not all(_first(anchor) in heads.union([None]) for anchor in plan.anchors):
            continue
        layout = _layout(index)
        count = layout.fit(listed, joined)
        if count and count >= FIT_SHARE * len(listed):
            found.append((layout, count))
    return sorted(found, key=lambda item: -item[1])


def joined_keys(keys: Sequence[str]) -> str | None:
    """Every key after a newline, in one text; None when a key is not a str or holds a newline (then the
    text's lines would not be the keys)."""
    try:
        joined = "\n" + "\n".join(keys)
    except TypeError:
        return None
    return joined if joined.count("\n") == len(keys) else None


def _some_key_matches(anchor: re.Pattern[str], keys: Sequence[str], joined: str | None) -> bool:
    """``any(map(anchor.match, keys))``; with the keys ``joined`` (:func:`joined_keys`), a key the
    anchor's literal start begins, or a match of the anchor at a line's start, is searched for first:
    none, and no key matches (a match of a key is a match of any text that starts with it, for a pattern
    that looks at nothing after what it matches); a found line is a key, checked on its own."""
    if joined is None:
        return any(map(anchor.match, keys))
    if "\n" + _literal_start(anchor.pattern) not in joined:
        return False
    if not LOOKS_AHEAD.search(anchor.pattern):
        found = _line_start(anchor.pattern).search(joined)
        if found is None:
            return False
        end = joined.find("\n", found.start() + 1)
        if anchor.match(joined[found.start() + 1 : end if end >= 0 else len(joined)]):
            return True
    return any(map(anchor.match, keys))


LOOKS_AHEAD = re.compile(r"\$|\\[bBZ]|\(\?[=!<]")
"""What in a pattern looks past its match (an end, a word boundary, a lookaround): such an anchor is
matched key by key."""


@cache
def _line_start(pattern: str) -> re.Pattern[str]:
    return re.compile("\n(?:" + pattern + ")")


@cache
def _literal_start(pattern: str) -> str:
    """The text every match of ``pattern`` starts with: its leading letters, digits, ``_`` and escaped dots,
    up to the first other construct (a group, a class, a quantifier's operand left out); ``""`` for a
    pattern with an alternative at its top level."""
    depth = 0
    escaped = False
    for char in pattern:  # a top-level | makes the start of either branch possible
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        elif char == "|" and depth == 0:
            return ""
    out: list[str] = []
    at = 0
    while at < len(pattern):
        char = pattern[at]
        if char.isalnum() or char == "_":
            literal, step = char, 1
        elif pattern.startswith("\\.", at):
            literal, step = ".", 2
        else:
            break
        if pattern[at + step : at + step + 1] in ("?", "*", "+", "{"):
            break  # (a character that may be left out or repeated ends the literal before it)
        out.append(literal)
        at += step
    return "".join(out)


def _first_components(keys: list[str]) -> set[str]:
    """The keys' first dotted components (``model.``); one look when all share one (their smallest and
    largest do, in sorted order), as a wrapped state_dict of 50,000 keys does."""
    low, high = min(keys), max(keys)
    head = low.split(".", 1)[0] + "."
    if "." in low and high.startswith(head):
        return {head}
    return {k.split(".", 1)[0] + "." for k in keys}


def _first(pattern: str) -> str | None:
    """The literal first component of an anchor pattern (``model.`` of ``model\\.embed_tokens\\.``), or None."""
    literal = pattern.split("\\.", 1)[0]
    return literal + "." if re.fullmatch(r"\w+", literal) else None


def body_layout(keys: Sequence[str], prefix: str) -> tuple[Layout, int] | None:
    """The best layout these keys fit whose body sits under ``prefix`` (a Hugging Face body, not a wrapper)."""
    return next(((layout, n) for layout, n in fitting(keys) if layout.body == prefix), None)


@cache
def _heads_by_model() -> dict[str, re.Pattern[str]]:
    """Each family's head model, with one pattern holding a group per head, in the family's order."""
    out: dict[str, re.Pattern[str]] = {}
    for family in FAMILIES:
        if family.heads and family.head_model not in out:
            out[family.head_model] = re.compile("|".join(f"({head})" for head in family.heads))
    return out


def head_of(keys: Sequence[str]) -> Callable[[str], str | None]:
    """Which head of its family a key lies in, by name (``vocab_transform``), by the family whose head model
    ``keys`` fit best (a reference's keys); None for a body key, and for every key when the keys fit no head
    model. A head is one task's module beside the body: one is never another's."""
    model = next((layout.name for layout, _ in fitting(keys) if layout.body), None)
    pattern = _heads_by_model().get(model or "")
    if pattern is None:
        return lambda key: None
    family = next(family for family in FAMILIES if family.head_model == model)
    heads = [re.sub(r"\\(.)", r"\1", head).rstrip(".$") for head in family.heads]

    def head(key: str) -> str | None:
        found = pattern.match(key)
        return heads[found.lastindex - 1] if found is not None and found.lastindex else None

    return head
