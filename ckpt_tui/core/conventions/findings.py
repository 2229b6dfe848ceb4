"""What a checkpoint's tree says about itself: prefixes, inner state_dicts, unsafe globals..."""

from __future__ import annotations

import itertools
import operator
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from ckpt_tui.core.conventions.architectures import Layout, fitting
from ckpt_tui.core.conventions.layouts import (
    ADAPTER_MARK,
    AVERAGED_COUNTER,
    LIGHTNING_MODEL,
    holds_lightning_weights,
    is_averaged_model,
    is_lightning_checkpoint,
    lightning_version,
    peft_fix,
    peft_layout,
)
from ckpt_tui.core.conventions.state_dicts import (
    NOT_GPU,
    PREFIX_ORIGINS,
    common_prefix,
    inner_state_dict,
    is_optimizer,
    is_scheduler,
    prefix_origin,
    root_model_keys,
    state_dicts,
    tensor_items,
)
from ckpt_tui.core.model.dtypes import DTYPES, itemsize
from ckpt_tui.core.model.keypath import Attr, KeyPath, to_json, to_python, to_slash
from ckpt_tui.core.model.tree import FlatColumns, Opaque, Reference, Tensor, is_global_ref, over_whole_storages, walk
from ckpt_tui.core.runtime.safe_text import printable


@dataclass(frozen=True)
class Fix:
    """The edit that resolves a finding, as its ``convert`` option; each surface words it its own way.

    The CLI prints the option (``--strip-prefix module.``); the browser names its key (``p``).
    """

    option: str
    argument: str
    also: tuple[tuple[str, str], ...] = ()
    """Options applied in the same ``convert`` after this one (an extract's ``--strip-prefix``)."""

    def pairs(self) -> list[tuple[str, str]]:
        """Every (option, argument) of the fix, in order."""
        return [(self.option, self.argument), *self.also]


@dataclass(frozen=True)
class Finding:
    """One thing worth telling the user, warnings first. ``message`` names no key and no option."""

    kind: str
    message: str
    severity: str = "info"
    path: KeyPath | None = None
    prefix: str | None = None
    global_name: str | None = None
    fix: Fix | None = None
    restates: bool = False
    """It says again what another finding says (kept for ``info --json`` readers): the text faces show
    one finding per fact and leave it out."""
    answers: bool = False
    """It answers what the user just did (a compare with a model): listed with the warnings, before notes."""

    @property
    def first_listed(self) -> bool:
        """Listed before notes: a warning, or the answer to what the user just did."""
        return self.severity == "warning" or self.answers

    def to_json(self) -> dict[str, Any]:
        """The ``info --json`` form."""
        out: dict[str, Any] = {"kind": self.kind, "severity": self.severity, "message": self.message}
        if self.path is not None:
            out["path"] = to_json(self.path)
        if self.prefix is not None:
            out["prefix"] = self.prefix
        if self.global_name is not None:
            out["global"] = self.global_name
        if self.restates:
            out["restates"] = True
        if self.fix is not None:
            out["fix"] = [self.fix.option, self.fix.argument]
            out["fix_options"] = [list(pair) for pair in self.fix.pairs()]
        return out


TORCHSCRIPT_CLASSES = "__torch__."
"""How a TorchScript archive's pickle names the classes of its modules (``__torch__.Net``)."""


def compute_findings(root: Any, references: Iterable[Reference] | None = None) -> list[Finding]:
    """All findings for a tree, warnings first, from one walk of it (see :func:`~ckpt_tui.core.model.tree.walk`).

    Unsafe globals are looked for everywhere a writer would look (tensor hooks, opaque arguments,
    ``_metadata``...), the rest in what is shown. Each object is considered once.
    """
    refs = list(references if references is not None else walk(root))
    tensors = [(r[0], r[1]) for r in refs if r[3] and r[2] and type(r[1]) is Tensor]
    devices = device_counts([tensor for _, tensor in tensors])
    return walked_findings(root, [r for r in refs if type(r[1]) is not Tensor], tensors, devices)


def walked_findings(
    root: Any, containers: list[Reference], tensors: list[tuple[KeyPath, Tensor]], devices: Counter[str]
) -> list[Finding]:
    """:func:`compute_findings` from what a summary already has: the walk's references to all but
    tensors, each shown tensor at its first reference with its path, and the tensors per device."""
    findings: list[Finding] = []
    unsafe: dict[str, tuple[KeyPath, int]] = {}
    data: dict[str, list[KeyPath]] = {}
    modules: list[tuple[KeyPath, Opaque]] = []
    optimizers: list[KeyPath] = []
    schedulers: list[KeyPath] = []
    for path, value, shown, first in containers:
        if isinstance(value, Opaque) or is_global_ref(value):
            _note_global(value, path, unsafe, data)
            if first and shown and isinstance(value, Opaque) and value.is_module:
                modules.append((path, value))
        if not (first and shown):
            continue
        if is_optimizer(value):
            optimizers.append(path)
        elif is_scheduler(value):
            schedulers.append(path)
    findings += [_unsafe_finding(name, path, count) for name, (path, count) in unsafe.items()]
    refused = _refused_data_finding(data) if data and not unsafe else None
    findings += [refused] if refused is not None else []
    laid_out = tensors + _sparse_parts(tensors)
    findings += [Finding("bad-tensor", f"{where(p)}: {why}", "warning", path=p) for p, why in tensor_problems(laid_out)]
    findings += _device_findings(devices)
    findings += _structure_findings(root, _outermost(modules), optimizers, schedulers)
    return sorted(findings, key=lambda f: f.severity != "warning")


RANK_NUMBER = re.compile(r"(?<=rank)(_?)(\d+)")
"""The rank a per-rank file's name gives (DeepSpeed's ``zero_pp_rank_1_mp_rank_00_optim_states.pt``, ``rank1.pt``)."""
RANK_FILE = re.compile(r".*rank_?\d+.*\.(?:pt|pth|bin|ckpt)\Z", re.S)
"""A key that is a per-rank file's name (the key a folder's reader gives each rank's file)."""


def merge_rank_repeats(findings: list[Finding]) -> list[Finding]:
    """One finding for a fact every rank's file repeats (each rank's optimizer state under its own file's key): said
    once, at the path with the rank in the file name as ``*``, with the ranks it holds for."""
    groups: dict[tuple[Any, ...], list[tuple[Finding, int]]] = {}
    for finding in findings:
        rank_at = _rank_key(finding)
        if rank_at is None:
            continue
        assert finding.path is not None
        path, shown = finding.path, where(finding.path)
        general = (*path[:rank_at], RANK_NUMBER.sub(r"\1*", str(path[rank_at]), count=1), *path[rank_at + 1 :])
        said = finding.message.replace(shown, "\0")
        groups.setdefault((finding.kind, finding.severity, said, general), []).append((finding, rank_at))
    merged: dict[int, Finding | None] = {}
    for (_, _, said, general), members in groups.items():
        if len(members) < 2:
            continue
        first, at = members[0]
        ranks = sorted({_rank(f, at) for f, _ in members})
        text = said.replace("\0", f"{where(general)} (ranks {', '.join(map(str, ranks))})")
        merged[id(first)] = replace(first, message=text)
        merged.update({id(f): None for f, _ in members[1:]})
    out = [merged.get(id(f), f) for f in findings]
    return [f for f in out if f is not None]


def _rank(finding: Finding, at: int) -> int:
    """The rank the key at ``at`` of a finding's path names (:func:`_rank_key` found one there)."""
    assert finding.path is not None
    found = RANK_NUMBER.search(str(finding.path[at]))
    assert found is not None
    return int(found.group(2))


def _rank_key(finding: Finding) -> int | None:
    """Where in its path a finding's message names a per-rank file (the last key giving a rank), or None."""
    path = finding.path
    if not path or where(path) not in finding.message:
        return None
    for index in range(len(path) - 1, -1, -1):
        key = path[index]
        if isinstance(key, str) and RANK_FILE.match(key):
            return index
    return None


def _sparse_parts(tensors: list[tuple[KeyPath, Tensor]]) -> list[tuple[KeyPath, Tensor]]:
    """The tensors a sparse tensor is made of (indices, values), each with its path: laid out in storages too."""
    if all(map(operator.is_, map(_SPARSE, (tensor for _, tensor in tensors)), itertools.repeat(None))):
        return []
    return [
        ((*path, Attr(name)), part)
        for path, tensor in tensors
        if tensor.sparse is not None
        for name, part in tensor.parts() or []
        if isinstance(part, Tensor)
    ]


_SPARSE = operator.attrgetter("sparse")


def _outermost(modules: list[tuple[KeyPath, Opaque]]) -> list[tuple[KeyPath, Opaque]]:
    """The modules no other listed module holds: a whole model is one finding, not one per submodule."""
    paths = {path for path, _ in modules}
    return [(path, module) for path, module in modules if not any(path[:i] in paths for i in range(len(path)))]


def flat_findings(columns: FlatColumns) -> list[Finding]:
    """:func:`compute_findings` for a root its reader gave as columns, without a walk: below such a root
    there is no global, no module, optimizer or scheduler, no GPU tensor, and no layout past its storage.

    Such a root is one state_dict (str keys, every value a plain tensor): not a Lightning checkpoint, no
    inner state_dict, so its findings are those of its keys alone, read from the names column (no dict of
    the keys, no count of the values' types)."""
    if not len(columns):
        return []  # (an empty dict is no state_dict: nothing to find)
    findings, compiled = _state_dict_findings((), columns.names, False, None)
    if compiled:
        findings = _with_compiled_submodules(findings, (), compiled)
    return sorted(findings, key=lambda f: f.severity != "warning")


def _note_global(
    value: Any, path: KeyPath, unsafe: dict[str, tuple[KeyPath, int]], data: dict[str, list[KeyPath]]
) -> None:
    if value.safe:
        # every place a data global is used, as check lists them (a few per name are all a message names)
        places = data.setdefault(value.global_name, [])
        if len(places) < DATA_PLACES:
            places.append(path)
        return
    name = value.global_name
    first, count = unsafe.get(name, (path, 0))
    unsafe[name] = (first, count + 1)


def where(path: KeyPath) -> str:
    """A path for a message: Python that reaches it, every string from the file escaped; "the root" for ()."""
    return printable(to_python(path)) if path else "the root"


def _places(paths: list[KeyPath]) -> str:
    """``ckpt["a"], ckpt["b"], ckpt["c"] (+2 more)``."""
    more = f" (+{len(paths) - PLACES_SHOWN} more)" if len(paths) > PLACES_SHOWN else ""
    return ", ".join(where(path) for path in paths[:PLACES_SHOWN]) + more


def _unsafe_finding(name: str, path: KeyPath, count: int) -> Finding:
    times = f" ({count} uses)" if count > 1 else ""
    message = (
        f"unsafe global {printable(name)} at {where(path)}{times}: NOT executed here; "
        "torch.load(weights_only=False) would import and run it"
    )
    return Finding("unsafe-global", message, "warning", path=path, global_name=name)


DATA_PLACES = 8
"""Places kept per data global (a numpy array in each of 10,000 entries is not listed 10,000 times)."""
PLACES_SHOWN = 3
"""Places a refusal over data names per kind, then ``(+N more)``."""


def _refused_data_finding(data: dict[str, list[KeyPath]]) -> Finding | None:
    """torch.load(weights_only=True) refuses the file over plain data (globals the reader knows as data, ``data``,
    that torch's weights-only allowlist lacks), if it does: the full verdict is ``check``'s."""
    # the allowlist and the verdict's paths, imported only for a tree that holds such data (a state_dict does not)
    from ckpt_tui.core.weights_only.tables import ALLOWED, IMPORTED_ALLOWED
    from ckpt_tui.core.weights_only.verdict import outer_path

    refused = {name: paths for name, paths in data.items() if name not in ALLOWED and name not in IMPORTED_ALLOWED}
    if not refused:
        return None
    places: dict[str, list[KeyPath]] = {}
    for name, paths in refused.items():
        # numpy's arrays, scalars and dtypes each name a few globals: said as one word, where the value is
        shown = places.setdefault("numpy" if name.startswith("numpy.") else printable(name), [])
        for path in paths:
            outer = outer_path(path)
            if outer not in shown:
                shown.append(outer)
    parts = [f"{name} at {_places(paths)}" for name, paths in places.items()]
    more = f" (+{len(parts) - 3} more)" if len(parts) > 3 else ""
    message = f"torch.load(weights_only=True) refuses it over data, not code: {'; '.join(parts[:3])}{more}"
    first = next(iter(refused.values()))[0]
    return Finding("weights-only-data", message, "warning", path=outer_path(first), fix=Fix("--sanitize", ""))


def tensor_problem(tensor: Tensor) -> str | None:
    """Why a tensor's metadata cannot be right (it reaches past its storage), or None."""
    storage = tensor.storage
    if storage is None or storage.location == "meta":
        return None
    return layout_problem(tensor.offset, tensor.shape, tensor.stride, tensor.dtype, storage.numel, storage.dtype)


def tensor_problems(tensors: list[tuple[KeyPath, Tensor]], limit: int = 20) -> list[tuple[KeyPath, str]]:
    """The first ``limit`` tensors whose metadata cannot be right, with why: each distinct layout
    (offset, shape, stride, dtype, storage size) is judged once, however many tensors share it."""
    # (a meta storage has no data, and set_ grows it to what its views reach, as torch's does)
    stored = [(p, t) for p, t in tensors if t.storage is not None and t.storage.location != "meta"]
    if over_whole_storages([tensor for _, tensor in stored]):
        return []  # each laid out as torch.save writes a parameter: it fits
    layouts = list(map(_LAYOUT, (tensor for _, tensor in stored)))
    problems = {layout: layout_problem(*layout) for layout in set(layouts)}
    if not any(problems.values()):
        return []
    bad = ((path, problems[layout]) for (path, _), layout in zip(stored, layouts, strict=True) if problems[layout])
    return list(itertools.islice(bad, limit))  # type: ignore[arg-type]


_LAYOUT = operator.attrgetter("offset", "shape", "stride", "dtype", "storage.numel", "storage.dtype")


def layout_problem(
    offset: int, shape: tuple[int, ...], stride: tuple[int, ...], dtype: str, storage_numel: int, storage_dtype: str
) -> str | None:
    """Why a view (``offset``, ``shape``, ``stride`` in ``dtype`` elements) cannot lie in a storage of
    ``storage_numel`` elements of ``storage_dtype``: it reaches past it, or goes backwards; or None."""
    if dtype not in DTYPES or 0 in shape:
        return None
    last = offset
    for size, step in zip(shape, stride, strict=True):
        if step < 0 and size > 1:  # torch.load accepts a negative stride on a dimension of size 1
            return "has a negative stride"
        last += (size - 1) * step
    needed = (last + 1) * DTYPES[dtype][0]
    available = storage_numel * itemsize(storage_dtype)
    if needed > available:
        return f"needs {needed} bytes of a {available}-byte storage"
    return None


def device_counts(tensors: list[Tensor]) -> Counter[str]:
    """How many tensors were saved on each device (a tensor with a storage: its location tag)."""
    storages = list(map(operator.attrgetter("storage"), tensors))
    if any(map(operator.is_, storages, itertools.repeat(None))):
        return Counter(tensor.device for tensor in tensors)
    return Counter(map(operator.attrgetter("location"), storages))


def _device_findings(devices: Counter[str]) -> list[Finding]:
    gpu = {d: n for d, n in devices.items() if d not in NOT_GPU}
    if not gpu:
        return []
    listed = ", ".join(f"{n} on {printable(d)}" for d, n in sorted(gpu.items()))
    message = (
        f"tensors saved on GPU ({listed}): shown here without one; torch.load on a CPU machine "
        "needs map_location='cpu', or the tags rewritten"
    )
    return [Finding("cuda-tensors", message, "warning", fix=Fix("--map-location", "cpu"))]


def _prefix_findings(root: Any, inner: KeyPath | None = None) -> list[Finding]:
    """A finding for each state_dict whose keys all start with one prefix, with its strip (and the rename
    that takes out ``_orig_mod`` where compiled submodules left it)."""
    findings: list[Finding] = []
    compiled: dict[KeyPath, int] = {}
    for path, value in state_dicts(root):
        keys = list(map(operator.itemgetter(0), tensor_items(value) or []))
        found, compiled[path] = _state_dict_findings(path, keys, holds_lightning_weights(root, path), inner)
        findings += found
    for path, count in compiled.items():
        if count:
            findings = _with_compiled_submodules(findings, path, count)
    return findings


def _state_dict_findings(
    path: KeyPath, keys: list[str], lightning: bool, inner: KeyPath | None
) -> tuple[list[Finding], int]:
    """The prefix finding of the state_dict at ``path`` with these ``keys`` (at most one), and how many of
    its keys hold ``_orig_mod`` inside them (``lightning``: a LightningModule's; ``inner``: where the model
    weights of the tree are)."""
    if is_averaged_model(keys):
        return [_averaged_finding(path, len(keys))], 0
    joined = _joined(keys)
    prefix = common_prefix(keys, lightning)
    compiled = _compiled_submodules(keys, prefix, joined)
    peft = peft_layout(keys) if joined is None or ADAPTER_MARK in joined else None
    # a PEFT model's own keys say LoRA with no prefix left (base_model.model. stripped): still not the base model's
    if not prefix and (peft is None or peft.adapter_only):
        return [], compiled
    if peft is not None and (peft.prefix or not peft.adapter_only):
        # (its first clause names PEFT/LoRA: a header short of room shows only that)
        message = (
            f"all {len(keys)} keys under {where(path)} start with {printable(repr(peft.prefix))}"
            if peft.prefix
            else f"the {len(keys)} keys under {where(path)}"
        )
        message += f": {peft.describe()}" if peft.adapter_only else f", a PEFT/LoRA model's: {peft.details()}"
        if peft.adapter_only:  # nothing to load into the base model alone: no fix
            return [Finding("peft", message, "info", path=path, prefix=peft.prefix)], compiled
        fix = Fix(*peft_fix(peft)[0], also=tuple(peft_fix(peft)[1:]))
        return [Finding("peft", message, "warning", path=path, prefix=peft.prefix, fix=fix)], compiled
    if not prefix:
        return [], compiled
    start = f"all {len(keys)} keys under {where(path)} start with {printable(repr(prefix))}"
    wrappers = [p + "." for p in prefix.split(".") if p + "." in PREFIX_ORIGINS]
    fits = [] if lightning else fitting(keys)
    if fits:
        # the keys as they are fit a model layout core knows (a Hugging Face body under model.,
        # transformer., bert.; CLIP's text_model.): the prefix is part of the model, not a wrapper
        return [_layout_finding(path, prefix, start, fits[0][0], keys)], compiled
    if prefix.startswith(LIGHTNING_MODEL) and not lightning:
        # 'model.' without Lightning's own keys beside it is no evidence of Lightning
        return [_model_prefix_finding(path, prefix, start)], compiled
    if not wrappers and not lightning and prefix.rstrip(".").lower() in COMMON_MODULE_NAMES:
        # one top-level name models give their submodules (features, encoder, backbone): more often the
        # model's own submodule than a wrapper, so a note with nothing to press; a compare with the model
        # tells, and proposes the strip when it is needed
        message = (
            f"{start}: the model's submodule .{printable(prefix.rstrip('.'))}, or a wrapper named so "
            "(a compare with the model tells)"
        )
        return [Finding("prefix", message, "info", path=path, prefix=prefix)], compiled
    message = f"{start}: " + printable(prefix_origin(prefix))
    severity = "warning" if wrappers else "info"
    if lightning and "." not in prefix.rstrip("."):
        # Lightning's own keys beside them: the one first component is the LightningModule's attribute
        # holding the model (.model, .net, .backbone), stripped as Lightning's model. is
        message = f"{start}: the LightningModule's .{printable(prefix.rstrip('.'))}, the model it holds"
        # the model weights' own fix; another copy of them (a DeepSpeed rank's module) only if needed
        severity = "warning" if path == (inner or ()) else severity
    fix = Fix("--strip-prefix", prefix)
    return [Finding("prefix", message, severity, path=path, prefix=prefix, fix=fix)], compiled


def _compiled_submodules(keys: list[str], prefix: str | None, joined: str | None) -> int:
    """How many keys hold ``_orig_mod`` inside them below their wrapper prefix (compiled submodules)."""
    # (one search of the joined keys first: a count over 50,000 keys only where some key holds it)
    if joined is not None and COMPILED_INFIX not in joined:
        return 0
    if prefix and COMPILED_INFIX[1:] in prefix:
        # 'module._orig_mod.': the whole model compiled inside DDP, which the prefix's strip takes away; only an
        # '_orig_mod' after it is a submodule's (its '.' before it kept, to find one right after the prefix)
        start = len(prefix) - 1
        return sum(COMPILED_INFIX in key[start:] for key in keys if isinstance(key, str))
    return sum(map(operator.contains, keys, itertools.repeat(COMPILED_INFIX)))


def _joined(keys: list[str]) -> str | None:
    """The keys in one text, for searches that rule a text out of every key at once (None where a key is
    not a str: then each key is looked at)."""
    try:
        return "\n".join(keys)
    except TypeError:
        return None


COMMON_MODULE_NAMES = frozenset(
    {
        "features",
        "encoder",
        "decoder",
        "backbone",
        "body",
        "trunk",
        "stem",
        "neck",
        "head",
        "heads",
        "classifier",
        "layers",
        "blocks",
        "embeddings",
        "conv",
        "fc",
    }
)
"""Names models give their top-level submodules: keys all under one of them are no evidence of a wrapper."""


LM_HEADS = ("LMHead", "ForCausalLM", "ForMaskedLM", "ForConditionalGeneration", "ForPreTraining")
"""The Hugging Face model names whose head is tied to the input embedding by default."""


COMPILED_INFIX = "._orig_mod."
"""What ``model.block = torch.compile(block)`` puts inside the keys of the compiled submodule."""


def _with_compiled_submodules(findings: list[Finding], path: KeyPath, count: int) -> list[Finding]:
    """The rename that takes ``_orig_mod`` out of keys where ``model.block = torch.compile(block)`` left it:
    added to the fix of the state_dict's own finding (one command), or a finding of its own."""
    said = (
        f"{count} keys under {where(path)} hold '_orig_mod' inside them: submodules replaced by "
        "torch.compile(submodule), whose wrapper holds them as ._orig_mod"
    )
    rename = ("--rename-infix", "_orig_mod=")
    for index, finding in enumerate(findings):
        if finding.path == path and finding.fix is not None and finding.severity == "warning":
            fix = Fix(finding.fix.option, finding.fix.argument, (*finding.fix.also, rename))
            findings[index] = replace(finding, message=f"{finding.message}; {said}", fix=fix)
            return findings
    fix = Fix(*rename, (("--at", to_slash(path)),) if path else ())
    return [*findings, Finding("compiled-submodules", said, "warning", path=path, fix=fix)]


def _averaged_finding(path: KeyPath, count: int) -> Finding:
    """A ``torch.optim.swa_utils.AveragedModel``'s state_dict: the model under ``module.``, ``n_averaged``
    beside it (not DataParallel's ``module.``: the counter says which)."""
    message = (
        f"the {count} keys under {where(path)} are a torch.optim.swa_utils.AveragedModel's (SWA/EMA weights): "
        f"the model under .module, its {AVERAGED_COUNTER} counter beside it"
    )
    fix = Fix("--drop-keys", AVERAGED_COUNTER, (("--strip-prefix", "module."),))
    return Finding("averaged-model", message, "warning", path=path, prefix="module.", fix=fix)


def _model_prefix_finding(path: KeyPath, prefix: str, start: str) -> Finding:
    """Keys under ``model.`` outside a Lightning checkpoint, in no layout core knows: a wrapper holding the
    model as ``.model`` (the strip offered only as "if needed")."""
    message = f"{start}: a wrapper holding the model as .model, or a model whose first submodule is named model"
    return Finding("prefix", message, "info", path=path, prefix=prefix, fix=Fix("--strip-prefix", prefix))


def _layout_finding(path: KeyPath, prefix: str, start: str, layout: Layout, keys: list[str]) -> Finding:
    """Keys that fit a model layout as they are: the prefix is that model's (its body, or a part), no fix
    (stripping it would lose the fit with that layout). Said for from_pretrained, its loader: a model with
    an LM head saved tied (no ``lm_head.`` key) needs more from load_state_dict."""
    body = f" whose body is its .{prefix.rstrip('.')}" if layout.body == prefix and "body" not in layout.name else ""
    message = f"{start}: the layout of a Hugging Face {layout.name}{body}: it loads as it is with from_pretrained"
    if any(head in layout.name for head in LM_HEADS) and not any(key.startswith("lm_head.") for key in keys):
        message += (
            "; load_state_dict needs strict=False and then model.tie_weights() (the LM head is tied to the "
            "input embedding, saved once)"
        )
    return Finding("hf-body", message, path=path, prefix=prefix)


def _root_model_finding(root: Any) -> Finding | None:
    """The model weights at the root beside training state (torchtitan's DCP step: model keys, ``optimizer``,
    ``lr_scheduler``, ``train_state``), with the extract that keeps them alone; None for any other root."""
    keys = root_model_keys(root)
    if keys is None:
        return None
    others = [key for key in root if key not in set(keys)]
    shown = ", ".join(printable(key) for key in others[:SHOWN_BESIDE])
    shown += f" (+{len(others) - SHOWN_BESIDE} more)" if len(others) > SHOWN_BESIDE else ""
    message = (
        f"the model weights are the {len(keys)} tensors at the root, beside {shown} (the layout torchtitan saves "
        "a step in): extracting them leaves the rest out"
    )
    return Finding("inner-state-dict", message, path=(), fix=Fix("--extract", "auto"))


SHOWN_BESIDE = 4


def _structure_findings(
    root: Any, modules: list[tuple[KeyPath, Opaque]], optimizers: list[KeyPath], schedulers: list[KeyPath]
) -> list[Finding]:
    findings: list[Finding] = []
    if is_lightning_checkpoint(root):
        shown = printable(lightning_version(root) or "?")
        findings.append(Finding("lightning", f"a PyTorch Lightning checkpoint (version {shown})"))
    inner = inner_state_dict(root)
    prefixes = _prefix_findings(root, inner)
    wrapped = next((f for f in prefixes if inner and f.path == inner and f.severity == "warning"), None)
    if inner and wrapped is not None and wrapped.prefix is not None:
        # extract and strip in one convert: either alone leaves something load_state_dict rejects, so the
        # prefix's own finding stays (JSON readers look for it) as information, without a fix of its own,
        # marked as restating this one: the text faces say each fact once
        # the wrapped finding's whole fix (a PEFT state_dict also drops its adapters and renames)
        also = tuple(wrapped.fix.pairs()) if wrapped.fix is not None else (("--strip-prefix", wrapped.prefix),)
        fix = Fix("--extract", to_slash(inner), also)
        if wrapped.kind == "prefix":
            start = wrapped.message.split(" start with ", 1)[1]
            message = f"the model weights are under {where(inner)}, and all their keys start with {start}"
            told = f"{wrapped.message.split(':', 1)[0]} (the wrapper prefix of the model weights above)"
            restated = Finding("prefix", told, "info", inner, wrapped.prefix, restates=True)
            prefixes[prefixes.index(wrapped)] = restated
        else:  # a PEFT or AveragedModel layout, said in its own words once, here
            message = f"the model weights are under {where(inner)}; {wrapped.message}"
            prefixes.remove(wrapped)
        findings.append(Finding("inner-state-dict", message, "warning", inner, wrapped.prefix, fix=fix))
    elif inner and not any(path == inner for path, _ in modules):
        # (a pickled module there has its own finding, with the same extract)
        findings.append(
            Finding(
                "inner-state-dict",
                f"the model weights are under {where(inner)}",
                path=inner,
                fix=Fix("--extract", to_slash(inner)),
            )
        )
    elif not inner:
        beside = _root_model_finding(root)
        findings += [beside] if beside is not None else []
    for path, module in modules:
        scripted = module.global_name.startswith(TORCHSCRIPT_CLASSES)
        what = "a TorchScript module" if scripted else "a whole pickled nn.Module"
        without = "its code" if scripted else "its class"
        findings.append(
            Finding(
                "module-pickle",
                f"{what} at {where(path)}: its weights are shown without {without}; extracting it gives its state_dict",
                path=path,
                fix=Fix("--extract", to_slash(path) if path else "auto"),
            )
        )
    findings += prefixes
    # optimizers and schedulers: described (and audited) by core/conventions/training_state.py, from the summary
    return findings
