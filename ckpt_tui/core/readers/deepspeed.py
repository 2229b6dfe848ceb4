"""DeepSpeed ZeRO stage 1, 2 and 3 checkpoints: ``latest``, ``global_stepN/``, model and optimizer states.

The fp32 master weights are rebuilt from the flat fp32 partitions the way DeepSpeed's ``zero_to_fp32``
rebuilds them (param shapes from the model states, partitions from the optimizer states, alignment
padding, frozen and tied parameters, buffers turned to fp32), as assembled tensors: nothing is read until
asked for, and only the fp32 partitions are read (never the Adam moments). No DeepSpeed is imported.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from ckpt_tui.core.errors import CkptError, ReadError
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.assembled import AssembledRecords, Piece
from ckpt_tui.core.model.contained import inside, named_entry
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.tree import Checkpoint, Opaque, Storage, Tensor
from ckpt_tui.core.readers.probes import MODEL_STATES, OPTIM_STATES, deepspeed_files
from ckpt_tui.core.runtime.shell import join_command, path_arg

FP32_KEY = "fp32_weights"
FLOATING = ("float64", "float32", "float16", "bfloat16")


OpenFile = Any  # Callable[[str], Checkpoint]: the plain reader of one torch file


def _dict(value: Any, what: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise ReadError(f"{what}: not a dict (not a DeepSpeed checkpoint?)")
    return value


def _int(value: Any, what: str) -> int:
    if isinstance(value, Opaque) and value.args and type(value.args[0]) is int:  # ZeroStageEnum(2)
        value = value.args[0]
    if type(value) is not int or value < 0:
        raise ReadError(f"{what}: expected a non-negative int")
    return value


def _shape(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not all(type(n) is int and n >= 0 for n in value):
        raise ReadError(f"{what}: malformed parameter shape")
    return tuple(value)


def _flat(value: Any, what: str) -> Tensor:
    if not isinstance(value, Tensor) or len(value.shape) != 1 or not value.is_contiguous() or value.storage is None:
        raise ReadError(f"{what}: a flat partition is not a 1-D stored tensor")
    return value


class Partition:
    """One rank's flat fp32 partition: a stored 1-D tensor; slices of it become pieces."""

    def __init__(self, tensor: Tensor, where: str) -> None:
        self.tensor = tensor
        self.where = where

    def piece(self, start: int, count: int, at: int) -> Piece:
        """Elements ``start:start+count`` of this partition, placed at ``at`` in a flat parameter."""
        base = self.tensor

        def load() -> Tensor:
            return Tensor(base.storage, base.offset + start, (count,), (1,), base.dtype)

        return Piece((at,), (count,), f"{self.where} [{start}:{start + count}]", load)


def read_deepspeed(folder: str, open_file: OpenFile) -> Checkpoint:
    """Open a ZeRO tag folder: module states, optimizer states, and the fp32 weights zero_to_fp32 would write."""
    model_names = deepspeed_files(folder, MODEL_STATES)
    optim_names = deepspeed_files(folder, OPTIM_STATES)
    models = [open_file(inside(folder, n, f"{folder}:")) for n in model_names]
    layers = _pipeline_layers(folder)
    if layers:
        stage_optims = {n: open_file(inside(folder, n, f"{folder}:")) for n in optim_names}
        return _read_pipeline(folder, layers, dict(zip(model_names, models, strict=True)), stage_optims, open_file)
    if not optim_names:
        return _read_stage0(folder, model_names, models)
    optims = [open_file(inside(folder, n, f"{folder}:")) for n in optim_names]
    what = folder
    first = _dict(optims[0].root, what).get("optimizer_state_dict")
    first = _dict(first, f"{optim_names[0]}: optimizer_state_dict")
    # DeepSpeed's bf16 optimizer (ZeRO disabled, up to DeepSpeed 0.16) partitions its fp32 master copies as
    # ZeRO-1 does, in files that name no stage
    bf16_optimizer = "zero_stage" not in first and _is_bf16_optimizer(first)
    if "zero_stage" not in first and not bf16_optimizer:
        raise ReadError(f"{optim_names[0]}: not a ZeRO checkpoint (no zero_stage)")
    stage = 0 if bf16_optimizer else _int(first["zero_stage"], f"{optim_names[0]}: zero_stage")
    counts = first.get("partition_count")
    world = (
        max(_int(c, "partition_count") for c in counts) if isinstance(counts, list) else _int(counts, "partition_count")
    )
    model_parallel = sorted({match.group(0) for name in optim_names if (match := MP_RANK.search(name))})
    if len(model_parallel) > 1:
        raise ReadError(_model_parallel(folder, len(model_parallel), world))
    if world != len(optims):
        raise ReadError(
            f"{folder}: expected {world} *_optim_states.pt files, found {len(optims)} (a rank did not save?)"
        )
    key = "single_partition_of_fp32_groups" if stage <= 2 else "fp32_flat_groups"
    if stage > 3:
        raise ReadError(f"{folder}: unknown ZeRO stage {stage}")
    groups: list[list[Partition]] = []  # [rank][group]
    for name, optim in zip(optim_names, optims, strict=True):
        state = _dict(_dict(optim.root, name).get("optimizer_state_dict"), name)
        flat = state.get(key)
        if not isinstance(flat, list):
            raise ReadError(f"{name}: no {key} list")
        groups.append([Partition(_flat(t, f"{name}: {key}[{i}]"), f"{name} {key}[{i}]") for i, t in enumerate(flat)])
    model = _dict(models[0].root, model_names[0])
    if "buffer_names" not in model or "module" not in model:
        raise ReadError(f"{model_names[0]}: not a model states file (no buffer_names)")
    source = AssembledRecords(folder)
    states = [_dict(m.root, n) for m, n in zip(models, model_names, strict=True)]
    paddings = first.get("param_alignment_paddings")
    weights, unlisted = _fp32_weights(model, states, groups, stage, world, paddings, source)
    if bf16_optimizer:
        _untrained_weights(weights, model, source)
    root: dict[str, Any] = {
        FP32_KEY: weights,
        "model_states": {name: m.root for name, m in zip(model_names, models, strict=True)},
        "optimizer_states": {name: o.root for name, o in zip(optim_names, optims, strict=True)},
    }
    total = sum(c.file_bytes for c in [*models, *optims])
    saved = "model_states and optimizer_states are the files as saved"
    notes = [
        f"DeepSpeed ZeRO stage {stage}, {counted(world, 'rank')}: {FP32_KEY} is what zero_to_fp32 writes "
        f"(convert with --extract {FP32_KEY}); {saved}",
    ]
    if bf16_optimizer:
        notes = [
            f"DeepSpeed with ZeRO disabled (stage 0) and its bf16 optimizer, {counted(world, 'rank')}: {FP32_KEY} "
            f"are the fp32 master weights rebuilt from the optimizer files (convert with --extract {FP32_KEY}; "
            f"zero_to_fp32 refuses these files); {saved}"
        ]
    if unlisted and not bf16_optimizer:
        shown = ", ".join(unlisted[:3]) + (", …" if len(unlisted) > 3 else "")
        notes.append(
            f"{counted(len(unlisted), 'frozen parameter')} ({shown}) taken from the module as saved: DeepSpeed lists "
            f"no frozen parameters at ZeRO-{stage} (frozen_param_shapes is None) and its zero_to_fp32 leaves them out"
        )
    unsafe = set().union(*(c.unsafe_globals for c in [*models, *optims]))
    # the layout names no surface's option or key: each face offers the extract its own way (its findings)
    where = f"weights: ckpt[{FP32_KEY!r}]"
    zero = "ZeRO disabled (stage 0), bf16 optimizer" if bf16_optimizer else f"ZeRO-{stage}"
    layout = f"{_saved_by(model, folder)}DeepSpeed {zero}, {counted(world, 'rank')}, {_module_dtype(model)}; {where}"
    checkpoint = Checkpoint(folder, "deepspeed", root, total, notes=notes, unsafe_globals=unsafe, layout=layout)
    checkpoint.buffer_names = {(FP32_KEY,): _buffer_names(model)}
    return checkpoint


def _is_bf16_optimizer(state: dict[Any, Any]) -> bool:
    """Whether an optimizer state is DeepSpeed's ``BF16_Optimizer``'s: flat fp32 partitions and their count, and
    each parameter's place in them (``param_slice_mappings``), with no ZeRO stage."""
    return all(key in state for key in ("single_partition_of_fp32_groups", "partition_count", "param_slice_mappings"))


MP_RANK = re.compile(r"mp_rank_\d+")
"""The model-parallel rank a DeepSpeed file names (``zero_pp_rank_0_mp_rank_01_optim_states.pt``)."""
PIPELINE_LAYER = re.compile(r"layer_(\d+)-model_states\.pt")
"""A pipeline-parallel save's file of one layer's state_dict (``PipelineModule.save_state_dict``; a layer split by
tensor parallelism as well is saved as several files, ``layer_NN-model_RR-model_states.pt``, not read as one)."""
LAYER_FILE = re.compile(r"layer_\d+-(?:.+-)?model_states\.pt")
"""Any file of one pipeline layer: whole, or a tensor-parallel slice of it."""


def _pipeline_layers(folder: str) -> list[str]:
    """The layer files of a pipeline-parallel save, by layer index (none for any other save)."""
    try:
        names = places.list_dir(folder)
    except (OSError, CkptError):
        return []
    found = [(int(match.group(1)), name) for name in names if (match := PIPELINE_LAYER.fullmatch(name))]
    return [name for _, name in sorted(found)]


def _read_pipeline(
    folder: str, layers: list[str], models: dict[str, Checkpoint], optims: dict[str, Checkpoint], open_file: OpenFile
) -> Checkpoint:
    """A ``PipelineModule``'s save: each ``layer_NN-model_states.pt`` is one layer's state_dict, read as
    ``load_state_dir`` reads it into layer NN; the weights are the layers' together, under the names the
    module's own state_dict gives them (``2.weight``, as ``param_shapes`` in the model states lists them). The
    stages' model and optimizer states are kept as saved (their modules are None: the layers hold the weights)."""
    files = [open_file(inside(folder, name, f"{folder}:")) for name in layers]
    weights: dict[str, Any] = {}
    for name, layer in zip(layers, files, strict=True):
        index = int(PIPELINE_LAYER.fullmatch(name).group(1))  # type: ignore[union-attr]
        for key, value in _dict(layer.root, name).items():
            if not isinstance(key, str):
                raise ReadError(f"{places.join(folder, name)}: a state_dict key that is not a string")
            weights[f"{index}.{key}"] = value
    states = [_dict(m.root, n) for n, m in models.items()]
    first = states[0] if states else {}
    named = first.get("mp_world_size")
    stages = named if type(named) is int else len(models)
    ranks = first.get("dp_world_size")
    ranks_text = counted(ranks, "data-parallel rank") if type(ranks) is int and ranks > 0 else "ranks unknown"
    optimizer = next(iter(optims.values()), None)
    state = optimizer.root.get("optimizer_state_dict") if optimizer and isinstance(optimizer.root, dict) else None
    stage = state.get("zero_stage") if isinstance(state, dict) else None
    zero = f"ZeRO-{_int(stage, 'zero_stage')}" if stage is not None else "ZeRO disabled"
    root: dict[str, Any] = {
        "module": weights,
        "model_states": {name: m.root for name, m in models.items()},
        "optimizer_states": {name: o.root for name, o in optims.items()},
    }
    every = [*files, *models.values(), *optims.values()]
    dtype = _module_dtype({"module": weights})
    layout = (
        f"DeepSpeed pipeline-parallel ({counted(stages, 'stage')}, {counted(len(layers), 'layer file')}), {zero}, "
        f"{ranks_text}, {dtype}; weights: ckpt['module']"
    )
    notes = [
        f"DeepSpeed pipeline-parallel save: module is the {counted(len(layers), 'layer file')} ({layers[0]} … "
        f"{layers[-1]}) as PipelineModule.load_state_dir reads them, each layer's keys under its index; "
        "model_states and optimizer_states are the stages' files as saved (convert with --extract module)"
    ]
    checkpoint = Checkpoint(
        folder,
        "deepspeed",
        root,
        sum(c.file_bytes for c in every),
        notes=notes,
        unsafe_globals=set().union(*(c.unsafe_globals for c in every)),
        loader_problems=[f"{os.path.basename(c.path)}: {p}" for c in every for p in c.loader_problems],
        layout=layout,
    )
    checkpoint.buffer_names = {("module",): frozenset().union(*map(_buffer_names, states))}
    return checkpoint


def _model_parallel(folder: str, ranks: int, world: int) -> str:
    """The refusal of a pipeline- or model-parallel save (optimizer files for several model-parallel ranks): not read
    as one checkpoint, with the files that do open (each pipeline layer's state_dict)."""
    try:
        layers = sorted(name for name in places.list_dir(folder) if LAYER_FILE.fullmatch(name))
    except (OSError, CkptError):
        layers = []
    said = (
        f"{folder}: a DeepSpeed pipeline- or model-parallel save ({counted(ranks, 'model-parallel rank')} x "
        f"{counted(world, 'data-parallel rank')}), which ckpt-tui does not read as one checkpoint"
    )
    if not layers:
        return said
    shown = f"{layers[0]} … {layers[-1]}" if len(layers) > 1 else layers[0]
    example = join_command(["ckpt-tui", path_arg(places.join(folder, layers[0]))])
    return f"{said}; each of {shown} holds one pipeline layer's weights: open one ({example})"


def _untrained_weights(weights: dict[str, Tensor], model: dict[Any, Any], source: AssembledRecords) -> None:
    """The module's tensors the bf16 optimizer does not hold (frozen parameters), from the module as saved,
    floating point ones widened to fp32 as the buffers are."""
    module = _dict(model["module"], "module")
    for name, value in module.items():
        if isinstance(name, str) and name not in weights and isinstance(value, Tensor):
            weights[name] = _whole(name, value, "float32" if value.dtype in FLOATING else value.dtype, source)


def _saved_by(model: dict[Any, Any], folder: str) -> str:
    """Who drove DeepSpeed: Lightning leaves its client state in the model states; Accelerate's
    ``save_state`` its ``random_states_0.pkl`` beside the tag folder (``pytorch_model``)."""
    if "pytorch-lightning_version" in model:
        return "Lightning (DeepSpeed strategy): "
    if named_entry(places.join(places.parent(folder), ACCELERATE_RANDOM_STATES)):
        return "Accelerate (DeepSpeed plugin): "
    return ""


ACCELERATE_RANDOM_STATES = "random_states_0.pkl"


def _module_dtype(model: dict[Any, Any]) -> str:
    """The training dtype: that of the module's floating-point parameters as saved (bf16, fp16, fp32)."""
    module = model.get("module")
    dtypes = [v.dtype for v in module.values() if isinstance(v, Tensor)] if isinstance(module, dict) else []
    floating = [d for d in dtypes if d in FLOATING]
    dtype = max(set(floating), key=floating.count) if floating else "float32"
    return SHORT_DTYPES.get(dtype, dtype)


SHORT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}


def _read_stage0(folder: str, names: list[str], models: list[Checkpoint]) -> Checkpoint:
    """ZeRO disabled: ``mp_rank_NN_model_states.pt`` holds the whole module and the (unpartitioned) optimizer."""
    states = [_dict(m.root, n) for m, n in zip(models, names, strict=True)]
    for name, state in zip(names, states, strict=True):
        if "module" not in state:
            raise ReadError(f"{os.path.join(folder, name)}: not a DeepSpeed model states file (no module)")
        stage = _configured_stage(state)
        if stage:  # a ZeRO checkpoint whose partitions are gone: the module alone is not what was trained
            raise ReadError(f"{folder}: ZeRO stage {stage} checkpoint without its *_optim_states.pt files")
    root: Any = models[0].root if len(models) == 1 else {n: m.root for n, m in zip(names, models, strict=True)}
    where = "ckpt['module']" if len(models) == 1 else f"ckpt[{names[0]!r}]['module'] (one per model-parallel rank)"
    notes = [
        f"DeepSpeed with ZeRO disabled (stage 0): {', '.join(names)} holds the whole module and optimizer; "
        f"the weights are {where} (convert with --extract auto)"
    ]
    optimizer = states[0].get("optimizer")
    kind = _optimizer_kind(optimizer)
    ranks = states[0].get("dp_world_size")
    ranks_text = counted(ranks, "rank") if type(ranks) is int and ranks > 0 else "ranks unknown"
    parallel = f" x {len(models)} model-parallel" if len(models) > 1 else ""
    layout = (
        f"DeepSpeed ZeRO disabled (stage 0), {ranks_text}{parallel}, {_module_dtype(states[0])}{kind}; weights: {where}"
    )
    checkpoint = Checkpoint(
        folder,
        "deepspeed",
        root,
        sum(m.file_bytes for m in models),
        notes=notes,
        unsafe_globals=set().union(*(m.unsafe_globals for m in models)),
        loader_problems=[f"{n}: {p}" for n, m in zip(names, models, strict=True) for p in m.loader_problems],
        layout=layout,
    )
    if len(models) == 1:
        checkpoint.buffer_names = {("module",): _buffer_names(states[0])}
    return checkpoint


def _configured_stage(state: dict[Any, Any]) -> int:
    """The ZeRO stage the saved ``ds_config`` asked for (0 when it says nothing)."""
    config = state.get("ds_config")
    zero = config.get("zero_optimization") if isinstance(config, dict) else None
    stage = zero.get("stage") if isinstance(zero, dict) else None
    return stage if type(stage) is int and stage >= 0 else 0


def _optimizer_kind(optimizer: Any) -> str:
    """Which mixed-precision wrapper saved the optimizer: DeepSpeed's unfused one keeps fp32 master copies
    per parameter (``fp32_groups``), its fused one a flat copy per group (``fp32_groups_flat``)."""
    if not isinstance(optimizer, dict):
        return ""
    if "fp32_groups_flat" in optimizer:
        return ", fused optimizer (flat fp32 master copy)"
    if "fp32_groups" in optimizer:
        return ", unfused optimizer (fp32 master copies)"
    return ""


def _buffer_names(model: dict[Any, Any]) -> frozenset[str]:
    """The module's buffers as its model states name them (``buffer_names``)."""
    names = model.get("buffer_names")
    return frozenset(n for n in names if isinstance(n, str)) if isinstance(names, list) else frozenset()


def _fp32_weights(
    model: dict[Any, Any],
    model_states: list[dict[Any, Any]],
    groups: list[list[Partition]],
    stage: int,
    world: int,
    paddings: Any,
    source: AssembledRecords,
) -> tuple[dict[str, Tensor], list[str]]:
    """The weights zero_to_fp32 writes, and the frozen parameters it leaves out that were taken from the module."""
    # buffers, whole in the model states
    weights: dict[str, Tensor] = {}
    module = _dict(model["module"], "module")
    names = _buffer_names(model)
    for name, value in module.items():
        if name in names and isinstance(value, Tensor):
            target = "float32" if value.dtype in FLOATING else value.dtype
            weights[name] = _whole(name, value, target, source)
    # frozen parameters, then the trained ones from the optimizer's partitions
    unlisted = _frozen_weights(weights, model, model_states, stage, world, source)
    shapes = model.get("param_shapes")
    if not isinstance(shapes, list) or not all(isinstance(g, dict) for g in shapes):
        raise ReadError("model states: param_shapes is not a list of dicts")
    if stage <= 2:
        _zero2(weights, shapes, groups, world, paddings, source)
    else:
        _zero3(weights, shapes, groups, world, source)
    shared = model.get("shared_params")
    for alias, target in shared.items() if isinstance(shared, dict) else ():
        if isinstance(alias, str) and target in weights:
            weights[alias] = weights[target]
    return weights, unlisted


def _frozen_weights(
    weights: dict[str, Tensor],
    model: dict[Any, Any],
    model_states: list[dict[Any, Any]],
    stage: int,
    world: int,
    source: AssembledRecords,
) -> list[str]:
    """The frozen parameters: whole in rank 0's model states (ZeRO 1 and 2), or partitioned over every
    rank's (ZeRO 3); the names of those the save does not list, taken from the module (:func:`_frozen_from_module`)."""
    frozen = model.get("frozen_param_shapes")
    if not isinstance(frozen, dict):
        return _frozen_from_module(weights, model, source) if stage <= 2 else []
    for name, shape in frozen.items():
        fragments = [_dict(m.get("frozen_param_fragments"), "frozen_param_fragments").get(name) for m in model_states]
        if stage > 2:
            weights[name] = _frozen_zero3(name, _shape(shape, name), fragments, world, source)
            continue
        fragment = fragments[0]
        if not isinstance(fragment, Tensor):
            raise ReadError(f"frozen parameter {name!r} has no fragment")
        weights[name] = _whole(name, fragment, "float32" if fragment.dtype in FLOATING else fragment.dtype, source)
    return []


def _frozen_from_module(weights: dict[str, Tensor], model: dict[Any, Any], source: AssembledRecords) -> list[str]:
    """The frozen parameters of a save that does not list them (DeepSpeed's ZeRO-1 saves ``frozen_param_shapes``
    None, and its zero_to_fp32 then leaves them out): the module's tensors that are neither buffers, trained
    (``param_shapes``) nor tied to another (``shared_params``), whole in the module below ZeRO-3, widened to
    fp32 as the listed ones are; their names."""
    shapes = model.get("param_shapes")
    groups = shapes if isinstance(shapes, list) else []
    trained = {name for group in groups if isinstance(group, dict) for name in group}
    shared = model.get("shared_params")
    skipped = weights.keys() | trained | (set(shared) if isinstance(shared, dict) else set())
    taken = []
    for name, value in _dict(model["module"], "module").items():
        if isinstance(name, str) and isinstance(value, Tensor) and name not in skipped:
            weights[name] = _whole(name, value, "float32" if value.dtype in FLOATING else value.dtype, source)
            taken.append(name)
    return taken


def _whole(name: str, stored: Tensor, dtype: str, source: AssembledRecords) -> Tensor:
    """A stored tensor as an assembled one of ``dtype`` (bf16/fp16 buffers widen to fp32 on read)."""
    shape = stored.shape
    piece = Piece(tuple(0 for _ in shape), shape, "model states", lambda: stored)
    return _logical(name, shape, dtype, [piece], source, shape, stored.requires_grad)


def _logical(
    name: str,
    shape: tuple[int, ...],
    dtype: str,
    pieces: list[Piece],
    source: AssembledRecords,
    grid: tuple[int, ...],
    requires_grad: bool,
) -> Tensor:
    """A tensor read from ``pieces``; it requires grad when what it is cut from did (as torch's narrow/cat keep)."""
    numel = math.prod(shape)
    storage = Storage(name, dtype, "cpu", numel, source)
    source.add(name, grid, pieces)
    stride = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
    return Tensor(storage, 0, shape, stride, dtype, requires_grad)


def _zero2(
    weights: dict[str, Tensor],
    shapes: list[dict[Any, Any]],
    groups: list[list[Partition]],
    world: int,
    paddings: Any,
    source: AssembledRecords,
) -> None:
    """Stage 1/2: each group is the concatenation of every rank's partition; params follow one another."""
    if any(len(rank) != len(shapes) for rank in groups):
        raise ReadError(f"{counted(len(shapes), 'parameter group')} in the model states, not in every optimizer file")
    if paddings is not None and not (
        isinstance(paddings, list)
        and len(paddings) == len(shapes)
        and all(
            isinstance(g, list) and len(g) == len(s) and all(type(n) is int and n >= 0 for n in g)
            for g, s in zip(paddings, shapes, strict=True)
        )
    ):
        raise ReadError("param_alignment_paddings do not match the parameter groups")
    for index, group_shapes in enumerate(shapes):
        parts = [rank[index] for rank in groups]
        starts = [0]
        for part in parts:
            starts.append(starts[-1] + part.tensor.numel)
        available = starts[-1]
        offset = 0
        for position, (name, raw_shape) in enumerate(group_shapes.items()):
            shape = _shape(raw_shape, str(name))
            numel = math.prod(shape)
            if offset + numel > available:
                raise ReadError(f"{name!r} needs elements {offset}:{offset + numel}; group {index} holds {available}")
            pieces = _pieces(parts, starts, offset, numel)
            grad = any(p.tensor.requires_grad for p in parts)
            weights[str(name)] = _logical(str(name), shape, "float32", pieces, source, (numel,), grad)
            offset += numel
            if paddings is not None:
                offset += paddings[index][position]
        align = 2 * world
        if align * math.ceil(offset / align) != align * math.ceil(available / align):
            raise ReadError(
                f"group {index}: consumed {counted(offset, 'element')} out of {available} (not a matching checkpoint)"
            )


def _pieces(parts: list[Partition], starts: list[int], begin: int, count: int) -> list[Piece]:
    """Pieces covering elements ``begin:begin+count`` of the concatenation of ``parts``."""
    pieces = []
    for part, start, stop in zip(parts, starts, starts[1:], strict=False):
        low, high = max(begin, start), min(begin + count, stop)
        if low < high:
            pieces.append(part.piece(low - start, high - low, low - begin))
    return pieces


def _zero3(
    weights: dict[str, Tensor],
    shapes: list[dict[Any, Any]],
    groups: list[list[Partition]],
    world: int,
    source: AssembledRecords,
) -> None:
    """Stage 3: every param is split in ``world`` equal padded parts, one per rank, at the same offset."""
    flat_shapes = {str(name): _shape(shape, str(name)) for group in shapes for name, shape in group.items()}
    sizes = [p.tensor.numel for p in groups[0]]
    if any([p.tensor.numel for p in rank] != sizes for rank in groups):
        raise ReadError("ZeRO-3 ranks hold flat groups of different sizes")
    starts = [0]
    for size in sizes:
        starts.append(starts[-1] + size)
    offset = 0
    for name, shape in flat_shapes.items():
        numel = math.prod(shape)
        part = math.ceil(numel / world)
        if offset + part > starts[-1]:
            raise ReadError(f"{name!r} lies past the end of the flat groups")
        pieces = []
        for rank in range(world):
            keep = min(part, numel - rank * part)
            if keep <= 0:
                break
            for piece in _pieces(groups[rank], starts, offset, keep):
                piece.offsets = (piece.offsets[0] + rank * part,)
                pieces.append(piece)
        grad = any(p.tensor.requires_grad for rank in groups for p in rank)
        weights[name] = _logical(name, shape, "float32", pieces, source, (numel,), grad)
        offset += part
    if offset * world != starts[-1] * world:
        raise ReadError(
            f"consumed {counted(offset * world, 'element')} out of {starts[-1] * world} (not a matching checkpoint)"
        )


def _frozen_zero3(
    name: str, shape: tuple[int, ...], fragments: list[Any], world: int, source: AssembledRecords
) -> Tensor:
    numel = math.prod(shape)
    pieces = []
    at = 0
    for rank, fragment in enumerate(fragments):
        if not isinstance(fragment, Tensor) or len(fragment.shape) != 1:
            raise ReadError(f"frozen parameter {name!r}: rank {rank} has no flat fragment")
        keep = min(fragment.numel, numel - at)
        if keep <= 0:
            break
        partition = Partition(fragment, f"rank {rank} frozen_param_fragments[{name!r}]")
        pieces.append(partition.piece(0, keep, at))
        at += keep
    dtype = "float32" if fragments[0].dtype in FLOATING else fragments[0].dtype
    grad = any(isinstance(f, Tensor) and f.requires_grad for f in fragments)
    return _logical(name, shape, dtype, pieces, source, (numel,), grad)
