"""Key layouts that training code and libraries leave in state_dicts, recognised by their names.

- wrapper prefixes: ``module.`` (DataParallel/DDP), ``_orig_mod.`` (torch.compile), one level of
  each in either order (``module._orig_mod.``), and Lightning's ``model.`` in front inside a Lightning
  checkpoint (Lightning unwraps DDP before saving, so a ``module.`` there is the user's submodule; a
  second ``module.`` is a real child of the wrapped model, as timm's ``ModelEmaV2.module``);
- PEFT/LoRA: ``base_model.model.`` in front, ``.base_layer.`` around each wrapped layer's own
  weights, ``lora_A``/``lora_B``/... adapter weights beside them;
- EMA copies of the weights: ``ema.``, ``model_ema.``, ``ema_model.``, ``module.ema.`` ... keys
  beside the live ones, or a separate entry of the checkpoint;
- Hugging Face models: a ``model.``/``transformer.`` body, and an output head tied to the input
  embedding (``lm_head.weight``) that the file leaves out.

Only the wrapper prefixes are ever removed without being named: any other shared first component
(``features.``, ``backbone.``) may be a real submodule of the model.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.keypath import glob_escape

WRAPPERS = ("module.", "_orig_mod.")
LIGHTNING_MODEL = "model."
PEFT_PREFIX = "base_model.model."
PEFT_BASE = "base_layer"
SAVED_COPIES = "modules_to_save"
"""peft's ``ModulesToSaveWrapper`` (a head under ``task_type=SEQ_CLS``): ``.modules_to_save.<adapter>.`` is the
copy that trains, ``.original_module.`` the frozen original beside it."""
ORIGINAL_COPY = "original_module"
HF_BODIES = ("model.", "transformer.")
EMBEDDINGS = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "shared.weight", "embed_in.weight")
TIES = (
    ("lm_head.weight", EMBEDDINGS),  # causal LMs: Llama, GPT-2, GPT-NeoX, T5 v1.0
    ("cls.predictions.decoder.weight", ("word_embeddings.weight",)),  # BERT's MLM head
    ("cls.predictions.decoder.bias", ("cls.predictions.bias",)),
    ("lm_head.decoder.weight", ("word_embeddings.weight",)),  # RoBERTa's MLM head
    ("lm_head.decoder.bias", ("lm_head.bias",)),
    ("predictions.decoder.weight", ("word_embeddings.weight",)),  # ALBERT, ELECTRA generator
    ("predictions.decoder.bias", ("predictions.bias",)),
    ("encoder.embed_tokens.weight", ("shared.weight",)),  # T5, BART: one shared embedding
    ("decoder.embed_tokens.weight", ("shared.weight",)),
)
"""Weights that architectures tie to another (``_tied_weights_keys`` in transformers): the first is saved
once, as the second, and ``tie_weights()`` makes the model's first the same tensor again."""
EMA_NAMES = frozenset({"ema", "model_ema", "ema_model", "ema_state_dict", "state_dict_ema", "ema_state", "ema_params"})


def is_lightning_checkpoint(root: Any) -> bool:
    """A PyTorch Lightning checkpoint: its version string, or a ``state_dict`` dict beside loops, callbacks
    or optimizer states (a state_dict whose tensors are named so is not one)."""
    if not isinstance(root, dict):
        return False
    if lightning_version(root) is not None:
        return True
    return isinstance(root.get("state_dict"), dict) and any(
        k in root for k in ("loops", "callbacks", "optimizer_states")
    )


def holds_lightning_weights(root: Any, path: Sequence[Any]) -> bool:
    """Whether the state_dict at ``path`` is a LightningModule's: a Lightning checkpoint's ``state_dict``, or
    the weights of a DeepSpeed folder Lightning wrote (its model states carry Lightning's own keys)."""
    if not isinstance(root, dict) or not path:
        return False
    if tuple(path) == ("state_dict",):
        return is_lightning_checkpoint(root)
    states = root.get("model_states")
    if path[0] not in ("fp32_weights", "model_states") or not isinstance(states, dict):
        return False
    return any(isinstance(state, dict) and lightning_version(state) is not None for state in states.values())


def lightning_version(root: dict[Any, Any]) -> str | None:
    """The Lightning version a checkpoint names, when it names one as a string."""
    for key in ("pytorch-lightning_version", "lightning_version"):
        if isinstance(root.get(key), str):
            return str(root[key])
    return None


def next_wrappers(taken: Sequence[str], lightning: bool) -> tuple[str, ...]:
    """The wrapper prefixes that can come after the ones ``taken`` (outermost first): one level of each
    kind; in a Lightning ``state_dict``, ``model.`` in front and no ``module.`` (Lightning unwraps DDP)."""
    if lightning:
        kinds: tuple[str, ...] = ((LIGHTNING_MODEL,) if not taken else ()) + ("_orig_mod.",)
    else:
        kinds = WRAPPERS
    return tuple(w for w in kinds if w not in taken)


def wrapper_prefix(keys: Iterable[str], lightning: bool = False) -> str:
    """The stack of wrapper prefixes every key starts with (``module._orig_mod.``), or ``""``.

    One level of each wrapper (``module.module.x`` loses one ``module.``, as torch's
    ``consume_prefix_in_state_dict_if_present`` does); ``model.`` counts only in front, and only when
    ``lightning`` says the keys come from a Lightning checkpoint's ``state_dict``. Every key must go on
    after the prefix.
    """
    key_list = [k for k in keys if k != "_metadata"]
    if not key_list:
        return ""
    taken: list[str] = []
    while True:
        prefix = "".join(taken)
        step = next((w for w in next_wrappers(taken, lightning) if _all_under(key_list, prefix + w)), None)
        if step is None:
            return prefix
        taken.append(step)


def _all_under(keys: list[str], prefix: str) -> bool:
    return all(k.startswith(prefix) and len(k) > len(prefix) for k in keys)


WRAPPER_ORIGINS = {
    "module.": "DataParallel/DDP",
    "_orig_mod.": "torch.compile",
    "model.": "a wrapper holding the model as .model (a LightningModule, a training wrapper)",
}


def split_wrappers(prefix: str, lightning: bool = True) -> list[str] | None:
    """The wrapper prefixes a prefix is made of (``module._orig_mod.`` → both), or None if it is not a stack.

    ``lightning`` True accepts the stacks of either layout (a Lightning ``model.`` or DDP's ``module.``).
    """
    layouts = (True, False) if lightning else (False,)
    for in_lightning in layouts:
        parts: list[str] = []
        rest = prefix
        while rest:
            step = next((w for w in next_wrappers(parts, in_lightning) if rest.startswith(w)), None)
            if step is None:
                break
            parts.append(step)
            rest = rest[len(step) :]
        if parts and not rest:
            return parts
    return None


def describe_wrappers(prefix: str) -> str:
    """What put a wrapper stack on the keys, outermost first: ``torch.compile inside DataParallel/DDP``."""
    parts = split_wrappers(prefix) or []
    names = [WRAPPER_ORIGINS[p] for p in parts]
    if not names:
        return f"every key sits under {prefix.rstrip('.')!r}"
    return "saved from " + " inside ".join(reversed(names))


def common_first_component(keys: Iterable[str]) -> str:
    """The first dotted component shared by every key (``features.``), or ``""``."""
    key_list = [k for k in keys if k != "_metadata"]
    if not key_list or any("." not in k for k in key_list):
        return ""
    heads = {k.split(".", 1)[0] for k in key_list}
    return heads.pop() + "." if len(heads) == 1 else ""


# ---- PEFT / LoRA --------------------------------------------------------------------------


@dataclass(frozen=True)
class PeftLayout:
    """Where a PEFT model's adapters and base weights are."""

    adapter_components: tuple[str, ...]  # lora_A, lora_B, ...
    adapter_keys: int
    base_layers: int  # keys under a .base_layer.
    prefix: str  # base_model.model. (or "" when absent), after any wrapper
    adapter_only: bool = False  # no base weights: what PeftModel.save_pretrained writes
    saved_modules: int = 0
    """Tensors beside the adapters in an adapter file: the trained copies of ``modules_to_save`` (a head)."""
    trained_copy: str = ""
    """The adapter whose ``modules_to_save`` copy the fix keeps (``default``): the copy that trained, the one
    peft loads; ``""`` when no module is wrapped so."""
    trained_keys: int = 0  # keys under .modules_to_save.<trained_copy>.
    original_keys: int = 0  # keys under .original_module.: the untrained copies
    other_copies: tuple[str, ...] = ()  # other adapters' modules_to_save copies, left out

    def describe(self) -> str:
        """In words."""
        parts = ", ".join(self.adapter_components)
        if self.adapter_only:
            saved = (
                f" and {counted(self.saved_modules, 'tensor')} of modules_to_save (trained copies of whole modules)"
                if self.saved_modules
                else ""
            )
            return (
                f"PEFT/LoRA adapter weights only ({self.adapter_keys}: {parts}){saved}; the base model's weights are "
                "not in it: load it onto the base model with peft (PeftModel.from_pretrained), nothing here to fix"
            )
        return f"PEFT/LoRA layout: {self.details()}"

    def details(self) -> str:
        """A PEFT model's layout and what its fix keeps, in words (after ``PEFT/LoRA layout:``)."""
        parts = ", ".join(self.adapter_components)
        base = (
            f"{self.base_layers} base weights under .{PEFT_BASE}."
            if self.base_layers
            else f"the base weights beside them (no .{PEFT_BASE}.: an older peft)"
        )
        return (
            f"{self.adapter_keys} adapter weights ({parts}), {base}; the fix keeps the base "
            f"weights{self._saved_words()} and leaves the adapters out: the LoRA'd layers get the base model's "
            "weights without the fine-tune (merging is not done here: peft's merge_and_unload() keeps it)"
        )

    def _saved_words(self) -> str:
        if not self.trained_copy:
            return ""
        others = f", and the other adapters' ({', '.join(self.other_copies)})" if self.other_copies else ""
        return (
            f" and the trained modules_to_save copy ({counted(self.trained_keys, 'key')} under "
            f".{SAVED_COPIES}.{self.trained_copy}., the copy peft loads), dropping the untrained "
            f".{ORIGINAL_COPY}. ({counted(self.original_keys, 'key')}){others},"
        )


ADAPTER_MARK = "lora_"


def is_adapter_component(component: str) -> bool:
    """``lora_A``, ``lora_B``, ``lora_embedding_A``, ``lora_magnitude_vector``..."""
    return component.startswith(ADAPTER_MARK)


def peft_layout(keys: Sequence[str]) -> PeftLayout | None:
    """The PEFT layout of these keys, when they hold LoRA adapters."""
    # an adapter component is a part that starts with lora_: without that text in any key, none is there
    # (one pass at C speed instead of splitting 50,000 keys)
    if not any(map(operator.contains, keys, itertools.repeat(ADAPTER_MARK))):
        return None
    components: dict[str, None] = {}
    adapters = 0
    base = 0
    adapted: set[str] = set()
    others: set[str] = set()
    copies: dict[str, int] = {}
    originals = 0
    for key in keys:
        parts = key.split(".")
        found = [index for index, part in enumerate(parts[:-1]) if is_adapter_component(part)]
        if found:
            adapters += 1
            components.update(dict.fromkeys(parts[index] for index in found))
            adapted.add(".".join(parts[: found[0]]))
        elif key != "_metadata":
            others.add(".".join(parts[:-1]))
            base += PEFT_BASE in parts[:-1]
            originals += ORIGINAL_COPY in parts[:-1]
            copy = _saved_copy(parts)
            if copy is not None:
                copies[copy] = copies.get(copy, 0) + 1
    if not adapters:
        return None
    # the layers the adapters wrap, none with its base weight: an adapter file, whose other tensors are the
    # trained copies of modules_to_save (peft saves a head so), never a base model to keep
    based = any(module in others or f"{module}.{PEFT_BASE}" in others for module in adapted)
    saved = 0 if based else sum(1 for k in keys if k != "_metadata") - adapters
    layout = PeftLayout(tuple(components), adapters, base, _peft_prefix(keys), not based, saved)
    if not based or not copies:
        return layout
    # peft loads its active adapter's copy: 'default' unless the run named its adapter otherwise
    kept = "default" if "default" in copies else next(iter(copies))
    rest = tuple(name for name in copies if name != kept)
    return replace(layout, trained_copy=kept, trained_keys=copies[kept], original_keys=originals, other_copies=rest)


def _saved_copy(parts: list[str]) -> str | None:
    """The adapter a key's ``modules_to_save`` copy belongs to (``…classifier.modules_to_save.default.weight``)."""
    if SAVED_COPIES not in parts:
        return None
    index = parts.index(SAVED_COPIES)
    return parts[index + 1] if index + 2 < len(parts) else None


def _peft_prefix(keys: Sequence[str]) -> str:
    """``base_model.model.`` with the wrappers in front of it (DDP's ``module.``, a LightningModule's ``model.``),
    when every key starts with that; else ``""``."""
    listed = [k for k in keys if k != "_metadata"]
    at = listed[0].find(PEFT_PREFIX) if listed else -1
    if at < 0:
        return ""
    prefix = listed[0][: at + len(PEFT_PREFIX)]
    if at and split_wrappers(prefix[:at]) is None:
        return ""
    return prefix if _all_under(listed, prefix) else ""


def without_peft_parts(keys: Sequence[str]) -> Sequence[str]:
    """The keys of a PEFT model that a model without peft has too: none under ``lora_*``, ``base_layer``,
    ``original_module`` or ``modules_to_save`` (the keys themselves when they are no PEFT model's)."""
    peft = peft_layout(keys)
    if peft is None or peft.adapter_only:
        return keys
    marks = {PEFT_BASE, ORIGINAL_COPY, SAVED_COPIES}
    return [k for k in keys if not any(p in marks or is_adapter_component(p) for p in k.split(".")[:-1])]


def peft_fix(peft: PeftLayout) -> list[tuple[str, str]]:
    """The ``convert`` options that make a PEFT state_dict the base model's: leave the adapters out (and the
    untrained ``original_module`` copies of ``modules_to_save``), strip ``base_model.model.``, take the
    ``base_layer`` (and ``modules_to_save.<adapter>``) out of the wrapped layers' keys. ``check --model``
    searches from these edits, and ``info`` offers them as they are."""
    pairs = [("--drop-keys", f"*.{glob_escape(component)}.*") for component in peft.adapter_components]
    if peft.trained_copy:
        pairs.append(("--drop-keys", f"*.{ORIGINAL_COPY}.*"))
        pairs += [("--drop-keys", f"*.{SAVED_COPIES}.{glob_escape(name)}.*") for name in peft.other_copies]
    pairs += [("--strip-prefix", peft.prefix)] if peft.prefix else []
    pairs += [("--rename-infix", f"{PEFT_BASE}=")] if peft.base_layers else []
    return pairs + ([("--rename-infix", f"{SAVED_COPIES}.{peft.trained_copy}=")] if peft.trained_copy else [])


# ---- EMA ----------------------------------------------------------------------------------

AVERAGED_COUNTER = "n_averaged"
"""The step counter ``torch.optim.swa_utils.AveragedModel`` keeps beside the model it holds as ``.module``."""


def is_averaged_model(keys: Sequence[str]) -> bool:
    """An ``AveragedModel`` state_dict (SWA or EMA weights): ``n_averaged``, every other key under ``module.``."""
    if AVERAGED_COUNTER not in keys:  # (first: one search, where the rest is a pass per key)
        return False
    rest = [k for k in keys if k not in (AVERAGED_COUNTER, "_metadata")]
    return bool(rest) and all(k.startswith("module.") and k != "module." for k in rest)


def is_ema_name(name: str) -> bool:
    """``ema``, ``model_ema``, ``ema_model``, ``state_dict_ema``...: a name that says EMA."""
    lowered = name.lower()
    return lowered in EMA_NAMES or "ema" in lowered.replace("-", "_").split("_")


def ema_prefix(keys: Sequence[str]) -> str:
    """The prefix of EMA weights kept beside the live ones in one state_dict (``ema.``, ``module.ema.``), or ``""``.

    Found only when some keys are under it and some are not (the live weights).
    """
    counts: dict[str, int] = {}
    for key in keys:
        parts = key.split(".")
        for depth in (1, 2):
            if len(parts) > depth and is_ema_name(parts[depth - 1]):
                if depth == 2 and parts[0] + "." not in WRAPPERS:
                    continue
                prefix = ".".join(parts[:depth]) + "."
                counts[prefix] = counts.get(prefix, 0) + 1
                break
    if not counts:
        return ""
    prefix, number = max(counts.items(), key=lambda item: item[1])
    return prefix if 0 < number < len(keys) else ""


# ---- Hugging Face -------------------------------------------------------------------------


def tied_head(missing: str, present: dict[str, tuple[int, ...] | None], shape: tuple[int, ...] | None) -> str | None:
    """The weight a missing one is tied to by its architecture (:data:`TIES`: ``lm_head.weight`` ↔
    ``model.embed_tokens.weight``, BERT's ``cls.predictions.decoder.bias`` ↔ ``cls.predictions.bias``,
    T5's ``encoder.embed_tokens.weight`` ↔ ``shared.weight``), present with the same shape; else None."""
    for head, targets in TIES:
        if missing != head and not missing.endswith("." + head):
            continue
        start = missing[: len(missing) - len(head)]
        for key, found in present.items():
            if key == missing or (shape is not None and found != shape):
                continue
            # the tied weight sits beside the head (same model prefix) or anywhere for embeddings
            if any(key == start + t or (t in EMBEDDINGS and key.endswith("." + t)) or key == t for t in targets):
                return key
    return None
