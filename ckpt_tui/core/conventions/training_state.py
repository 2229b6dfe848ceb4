"""Training state, audited: optimizer and LR scheduler state that would make a resume go wrong.

Everything here comes from the dicts of ``optimizer.state_dict()`` / ``scheduler.state_dict()`` and
the checkpoint's own counters (``global_step``, ``step``, ``iteration``, ``epoch``: Lightning writes
``global_step`` and ``epoch`` beside ``optimizer_states`` and ``lr_schedulers``); nothing is
imported. The only values read are the optimizers' ``step`` counters (0-d tensors of 4 or 8 bytes,
at most :data:`STEP_READS` per optimizer); moment buffers are not read here: ``check``, which reads
every tensor, says which are all zero (:func:`zero_moment_problem`).

Warnings (a resume goes wrong): an Adam-style optimizer whose step disagrees with the checkpoint's
step counter; a stateful optimizer with no state while the counters say training ran; optimizer
state for more parameters than the model holds, or shaped for another model; a scheduler that
never stepped, whose ``last_epoch`` is past every counter the checkpoint saves, or a OneCycleLR at its
``total_steps`` (stepping it again raises). Notes (facts): per optimizer its kind, parameter groups
with their LR, parameters covered and steps; per scheduler its ``last_epoch`` and LR.
"""

from __future__ import annotations

import math
import re
import reprlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ckpt_tui.core.conventions.findings import Finding, where
from ckpt_tui.core.conventions.state_dicts import BUFFER_NAMES, FLAT_OPTIMIZER_PARTS, PARAMETER_DTYPES
from ckpt_tui.core.errors import CkptError, ReadStopped
from ckpt_tui.core.model import keypath
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.keypath import KeyPath
from ckpt_tui.core.model.tree import Tensor
from ckpt_tui.core.runtime.safe_text import printable

COUNTER_KEYS = ("global_step", "step", "iteration", "iter", "epoch")
STEP_COUNTERS = ("global_step", "step", "iteration", "iter")
MOMENT_NAMES = frozenset({"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer"})
STATE_NAMES = MOMENT_NAMES | {"step", "square_avg", "acc_delta", "sum", "grad_avg", "mu", "eta", "ax", "prev"}
"""The per-parameter state torch's optimizers keep (Adam's moments and step, RMSprop, Adadelta, Adagrad, ASGD,
Rprop): a flattened entry so named (``state.FQN.step``) is optimizer state, a model's ``state.fc.weight`` is not."""
RESUME_WARNINGS = (
    "step-mismatch",
    "optimizer-fresh",
    "optimizer-size",
    "optimizer-shapes",
    "scheduler-fresh",
    "scheduler-mismatch",
    "scheduler-finished",
)
"""The kinds of finding that say a resume goes wrong: ``check`` counts them as problems."""
STEP_READS = 256
"""Step counters read per optimizer at most (the first and the last parameters' of each group)."""
SHOWN = 4


@dataclass
class OptimizerFacts:
    """What an optimizer's state_dict says about itself."""

    path: KeyPath
    kind: str
    group_lrs: list[Any]
    group_steps: list[tuple[float, float] | None]
    """Per group: the smallest and largest step among its parameters with state (None: no state)."""
    parameters: int
    with_state: int
    stateful: bool
    """Whether it keeps per-parameter state once stepped (Adam family, SGD with momentum)."""
    moment_shapes: Counter[tuple[int, ...]] = field(default_factory=Counter)

    @property
    def steps(self) -> tuple[float, float] | None:
        """The smallest and largest step over every group (None: no step counter at all)."""
        known = [s for s in self.group_steps if s is not None]
        return (min(s[0] for s in known), max(s[1] for s in known)) if known else None


def training_findings(
    root: Any,
    optimizers: Iterable[tuple[KeyPath, dict[Any, Any]]],
    schedulers: Iterable[tuple[KeyPath, dict[Any, Any]]],
    model_parameters: list[tuple[int, ...]] | None,
    byteorder: str = "little",
    numbered: dict[int, list[tuple[int, ...]]] | None = None,
) -> list[Finding]:
    """The findings about optimizer and scheduler state (see the module docstring). ``numbered``: for a save of
    several models (Accelerate's ``model``, ``model_1``...), each one's parameter shapes by its number."""
    counters = _counters(root)
    facts = [_optimizer_facts(path, value, byteorder) for path, value in optimizers]
    findings: list[Finding] = []
    for fact in facts:
        findings += _optimizer_findings(fact, counters, *_models_for(fact.path, model_parameters, numbered))
    findings += _step_agreement(facts, counters)
    steps = [f.steps[1] for f in facts if f.steps is not None]
    for path, value in schedulers:
        findings += _scheduler_findings(path, value, counters, max(steps) if steps else None)
    return findings


NUMBERED_OPTIMIZER = re.compile(r"optimizer(?:_([1-9]\d*))?")


def _models_for(
    path: KeyPath, model: list[tuple[int, ...]] | None, numbered: dict[int, list[tuple[int, ...]]] | None
) -> tuple[list[tuple[int, ...]] | None, list[tuple[int, ...]] | None]:
    """The parameter shapes an optimizer is compared with: its own model's, and every model's of the save.

    Accelerate's ``load_state`` loads ``optimizer_N`` into the N-th prepared optimizer and ``model_N`` into the N-th
    model; an optimizer may hold any of the models' parameters (one optimizer over two models), so its state is
    foreign only when no model of the save has its shapes, and it covers too much only past all of them."""
    if not numbered:
        return model, model
    named = NUMBERED_OPTIMIZER.fullmatch(path[0]) if path and isinstance(path[0], str) else None
    number = int(named.group(1) or 0) if named is not None else None
    every = [shape for _, shapes in sorted(numbered.items()) for shape in shapes]
    return numbered.get(number, model) if number is not None else model, every


def _counters(root: Any) -> dict[str, float]:
    if not isinstance(root, dict):
        return {}
    out: dict[str, float] = {}
    for key in COUNTER_KEYS:
        value = root.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[key] = value
    return out


def _optimizer_facts(path: KeyPath, value: dict[Any, Any], byteorder: str) -> OptimizerFacts:
    groups = [g for g in value.get("param_groups", []) if isinstance(g, dict)]
    state = value.get("state") if isinstance(value.get("state"), dict) else {}
    assert isinstance(state, dict)
    kinds = {_kind(g) for g in groups}
    kind = kinds.pop() if len(kinds) == 1 else "mixed"
    reads = [STEP_READS // max(1, len(groups))]
    group_steps = []
    for group in groups:
        params = group.get("params") if isinstance(group.get("params"), list) else []
        assert isinstance(params, list)
        group_steps.append(_group_steps(params, state, byteorder, reads))
    shapes = _moment_shapes(state)
    stateful = any("betas" in g or _number(g.get("momentum")) for g in groups)
    return OptimizerFacts(
        path,
        kind,
        [g.get("lr") for g in groups],
        group_steps,
        sum(len(g["params"]) for g in groups if isinstance(g.get("params"), list)),
        sum(1 for entry in state.values() if isinstance(entry, dict) and entry),
        stateful,
        shapes,
    )


def _moment_shapes(state: dict[Any, Any]) -> Counter[tuple[int, ...]]:
    """How many parameters' first moment (Adam's ``exp_avg``, SGD's ``momentum_buffer``) has each shape."""
    shapes: Counter[tuple[int, ...]] = Counter()
    for entry in state.values():
        if isinstance(entry, dict):
            moment = next((entry[n] for n in ("exp_avg", "momentum_buffer") if isinstance(entry.get(n), Tensor)), None)
            if moment is not None:
                shapes[moment.shape] += 1
    return shapes


def _kind(group: dict[Any, Any]) -> str:
    if "betas" in group:
        return "Adam-style"
    if "momentum" in group:
        return "SGD-style"
    return "optimizer"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value != 0


def _group_steps(
    params: list[Any], state: dict[Any, Any], byteorder: str, reads: list[int]
) -> tuple[float, float] | None:
    """The smallest and largest ``step`` of a group's parameters (the first and last ones when many)."""
    entries = [state[p] for p in params if _hashable(p) and isinstance(state.get(p), dict)]
    budget = reads[0]
    if len(entries) > budget:
        entries = entries[: budget // 2] + entries[len(entries) - budget // 2 :]
    steps = [s for s in (_step_value(e.get("step"), byteorder) for e in entries) if s is not None]
    return (min(steps), max(steps)) if steps else None


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _step_value(value: Any, byteorder: str) -> float | None:
    """A ``step``: a number, or a 0-d (or one-element) tensor whose value is read from the file."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, Tensor) or value.numel != 1 or value.storage is None:
        return None
    from ckpt_tui.core.values.tensor_values import TensorReader, decode

    try:
        reader = TensorReader(value, byteorder)
        read = decode(reader.first(1), value.dtype, value.metadata)
    except ReadStopped:
        raise
    except CkptError:
        return None
    number = float(read[0]) if read.size else math.nan
    return number if math.isfinite(number) else None


def _count(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:g}"


def _lr_text(lrs: list[Any]) -> str:
    shown = [f"{v:g}" if isinstance(v, (int, float)) else printable(reprlib.repr(v)) for v in lrs[:SHOWN]]
    return ", ".join(shown) + (f", … ({len(lrs)} groups)" if len(lrs) > SHOWN else "")


def _steps_text(fact: OptimizerFacts) -> str:
    if fact.steps is None:
        if fact.with_state:
            return "no per-parameter step"
        # plain SGD (no momentum) keeps no state however long it ran: its empty state says nothing of steps
        return "never stepped (no state)" if fact.stateful else "no per-parameter state (none kept without momentum)"
    per_group = [s for s in fact.group_steps if s is not None]
    if all(s[0] == s[1] for s in per_group) and len({s[0] for s in per_group}) == 1:
        return f"step {_count(per_group[0][0])}"
    parts = [
        "-" if s is None else (_count(s[0]) if s[0] == s[1] else f"{_count(s[0])}–{_count(s[1])}")
        for s in fact.group_steps
    ]
    return "steps by group " + ", ".join(parts[:SHOWN]) + (" …" if len(parts) > SHOWN else "")


def _optimizer_findings(
    fact: OptimizerFacts,
    counters: dict[str, float],
    model_parameters: list[tuple[int, ...]] | None,
    every_parameter: list[tuple[int, ...]] | None = None,
) -> list[Finding]:
    """``model_parameters``: the shapes of the model it pairs with; ``every_parameter``: of every model of the save
    (the same list for a save of one model)."""
    groups = len(fact.group_lrs)
    every = every_parameter if every_parameter is not None else model_parameters
    flat = _flat_partitions(fact, model_parameters, every)
    # ZeRO's flat partitions are said in the optimizer's own line: a count of the model's parameters beside
    # them would be another model's (a pipeline stage holds some of them) and a second line says nothing more
    held = (
        f"{counted(fact.parameters, 'flat vector')} (DeepSpeed ZeRO's partitions: not compared with the model's shapes)"
        if flat
        else counted(fact.parameters, "parameter")
    )
    line = (
        f"optimizer state at {where(fact.path)}: {fact.kind}, {groups} param group{'' if groups == 1 else 's'} "
        f"(lr {_lr_text(fact.group_lrs)}), {held}, {_steps_text(fact)}"
    )
    findings = [Finding("optimizer", line, path=fact.path)]
    progress = {k: v for k, v in counters.items() if v > 0}
    if fact.stateful and fact.with_state == 0 and fact.parameters and progress:
        said = ", ".join(f"{k} {_count(v)}" for k, v in progress.items())
        findings.append(
            Finding(
                "optimizer-fresh",
                f"optimizer at {where(fact.path)} has no state (never stepped, or saved fresh) while the checkpoint "
                f"says {said}: resuming restarts its moments",
                "warning",
                path=fact.path,
            )
        )
    if model_parameters is None or every is None or flat:
        return findings
    model = len(model_parameters)
    if fact.parameters > len(every):
        held = f"the model holds {model}" if every is model_parameters else f"the save's models hold {len(every)}"
        findings.append(
            Finding(
                "optimizer-size",
                f"optimizer at {where(fact.path)} covers {counted(fact.parameters, 'parameter')}, {held}: "
                "it belongs to another model (optimizer.load_state_dict refuses it)",
                "warning",
                path=fact.path,
            )
        )
    elif fact.parameters < model:
        findings.append(
            Finding(
                "optimizer-coverage",
                f"optimizer at {where(fact.path)} covers {fact.parameters} of the model's {model} tensors "
                "(frozen parameters, buffers the file cannot tell from parameters, or several optimizers)",
                path=fact.path,
            )
        )
    foreign = fact.moment_shapes - Counter(every)
    if foreign:
        shown = ", ".join(str(list(shape)) for shape in list(foreign)[:SHOWN])
        findings.append(
            Finding(
                "optimizer-shapes",
                f"optimizer at {where(fact.path)} holds state shaped {shown} that no model parameter has: "
                "it was saved for another model (resuming fails on the first step)",
                "warning",
                path=fact.path,
            )
        )
    return findings


def _flat_partitions(
    fact: OptimizerFacts, model_parameters: list[tuple[int, ...]] | None, every: list[tuple[int, ...]] | None
) -> bool:
    """Whether an optimizer holds DeepSpeed ZeRO's flat partitions: fewer entries than the model has parameters
    (and no more than the save's models have), each a 1-D vector, some of a length no parameter has (an optimizer
    over a model's biases alone holds vectors shaped as they are)."""
    if model_parameters is None or every is None or fact.parameters > len(every):
        return False
    vectors = bool(fact.moment_shapes) and all(len(shape) == 1 for shape in fact.moment_shapes)
    return fact.parameters < len(model_parameters) and vectors and bool(fact.moment_shapes - Counter(every))


def _step_agreement(facts: list[OptimizerFacts], counters: dict[str, float]) -> list[Finding]:
    """Adam-style steps against the checkpoint's step counter (one, or the sum over several optimizers)."""
    counter = next(((k, counters[k]) for k in STEP_COUNTERS if k in counters), None)
    counted = [f for f in facts if f.steps is not None]
    if counter is None or not counted:
        return []
    name, value = counter
    tops = [f.steps[1] for f in counted if f.steps is not None]
    if any(abs(value - t) <= 1 for t in tops) or (len(tops) > 1 and sum(tops) == value):
        return []  # within 1: code that saves the next step to run (step + 1) is as right as the last one
    fact = counted[0]
    steps = ", ".join(_count(t) for t in tops)
    return [
        Finding(
            "step-mismatch",
            f"optimizer step {steps} at {where(fact.path)} but {name} is {_count(value)}: "
            "resuming pairs the schedule and bias correction with the wrong step",
            "warning",
            path=fact.path,
        )
    ]


def _scheduler_line(path: KeyPath, value: dict[Any, Any], last: float) -> str:
    """``LR scheduler state at ckpt["scheduler"]: last_epoch 5 of total_steps 100, lr 0.001``, and whether its
    lambdas were saved."""
    lrs = value.get("_last_lr") or value.get("base_lrs") or []
    total = value.get("total_steps")
    line = f"LR scheduler state at {where(path)}: last_epoch {_count(last)}"
    if isinstance(total, int) and not isinstance(total, bool):
        line += f" of total_steps {total}"
    line += f", lr {_lr_text(lrs)}" if isinstance(lrs, list) and lrs else ""
    lambdas = value.get("lr_lambdas")
    if isinstance(lambdas, list) and any(item is None for item in lambdas):
        line += "; its lr_lambda functions are not saved (resuming needs the same code)"
    return line


def _scheduler_findings(
    path: KeyPath, value: dict[Any, Any], counters: dict[str, float], optimizer_step: float | None
) -> list[Finding]:
    last = value.get("last_epoch")
    if not isinstance(last, (int, float)) or isinstance(last, bool):
        return [Finding("scheduler", f"LR scheduler state at {where(path)}", path=path)]
    total = value.get("total_steps")
    findings = [Finding("scheduler", _scheduler_line(path, value, last), path=path)]
    # a schedule that ran to its end, or one that does not agree with the training counters
    if isinstance(total, int) and not isinstance(total, bool) and last >= total:
        findings.append(
            Finding(
                "scheduler-finished",
                f"LR scheduler at {where(path)} is at step {_count(last)} of its total_steps {total}: "
                "stepping it again raises (OneCycleLR), so resuming fails",
                "warning",
                path=path,
            )
        )
        return findings
    steps = {k: v for k, v in counters.items() if k in STEP_COUNTERS}
    if optimizer_step is not None:
        steps.setdefault("optimizer step", optimizer_step)
    epoch = counters.get("epoch")
    known = ({"epoch": epoch} if epoch is not None else {}) | steps
    if not known:
        return findings
    if last == 0 and any(v >= 1 for v in known.values()):
        said = ", ".join(f"{k} {_count(v)}" for k, v in known.items())
        findings.append(
            Finding(
                "scheduler-fresh",
                f"LR scheduler at {where(path)} never stepped (last_epoch 0) while the checkpoint says {said}: "
                "resuming restarts the LR schedule",
                "warning",
                path=path,
            )
        )
    elif _stepped_past(last, counters, optimizer_step):
        said = " nor ".join(f"{k} {_count(v)}" for k, v in known.items())
        findings.append(
            Finding(
                "scheduler-mismatch",
                f"LR scheduler at {where(path)} has last_epoch {_count(last)}, matching neither {said}: "
                "it stepped more often than training ran, so the schedule resumes at another point",
                "warning",
                path=path,
            )
        )
    return findings


def _stepped_past(last: float, counters: dict[str, float], optimizer_step: float | None) -> bool:
    """Whether a scheduler's ``last_epoch`` is more than 1 past every counter the checkpoint saves
    (``epoch``, ``global_step``...) and matches no optimizer step. Below them it may step per epoch or
    every few steps; within 1 of the optimizer's step it stepped once per step (OneCycle, warmup)."""
    if optimizer_step is not None and abs(last - optimizer_step) <= 1:
        return False
    known = [v for k, v in counters.items() if k in STEP_COUNTERS or k == "epoch"]
    return bool(known) and all(last - v > 1 for v in known)


FLAT_STATE = FLAT_OPTIMIZER_PARTS[0]
FLAT_MOMENT_ENDS = tuple(f".{name}" for name in MOMENT_NAMES)


def is_moment(path: KeyPath) -> bool:
    """A moment buffer of an optimizer's per-parameter state: nested (``...["state"][i]["exp_avg"]``), or
    flattened as torch flattens it for torchtitan (``...["state.FQN.exp_avg"]``, see
    :func:`~ckpt_tui.core.conventions.state_dicts.is_flat_optimizer`)."""
    if len(path) >= 3 and path[-1] in MOMENT_NAMES and path[-3] == "state":
        return True
    return bool(path) and _flat_state_entry(path[-1]) in MOMENT_NAMES


def may_name_moment(key: object) -> bool:
    """Whether a key may be the last of a moment buffer's path (:func:`is_moment`): a cheap test over every key."""
    return key in MOMENT_NAMES or (type(key) is str and key.startswith(FLAT_STATE) and key.endswith(FLAT_MOMENT_ENDS))


def _flat_state_entry(key: object) -> str | None:
    """The name of a flattened optimizer's per-parameter state entry (``state.FQN.exp_avg``: ``exp_avg``, its FQN
    never empty); None for any other key."""
    if type(key) is not str or not key.startswith(FLAT_STATE):
        return None
    fqn, _, name = key[len(FLAT_STATE) :].rpartition(".")
    return name if fqn else None


def zero_moment_message(paths: list[KeyPath]) -> str:
    """The ``check`` problem for moment buffers that are all zero, naming the first few."""
    shown = ", ".join(where(p) for p in paths[:SHOWN]) + (
        f" (+{len(paths) - SHOWN} more)" if len(paths) > SHOWN else ""
    )
    are = "is" if len(paths) == 1 else "are"
    return (
        f"{counted(len(paths), 'optimizer moment buffer')} {are} all zero: {shown}: a resume runs with empty moments "
        "(state reset, or gradients that were always zero)"
    )


ROLES = ("parameter", "buffer", "counter", "optimizer state", "other")
"""What a tensor of a checkpoint is (:func:`tensor_role`), in the order reports list them: the model's
weights first."""


def tensor_role(path: KeyPath, tensor: Tensor, model_at: KeyPath | None = None) -> str:
    """What a tensor of a checkpoint is, for ranking how far it moved: a ``counter`` (an integer or bool
    tensor: it moves by steps, not by training), a ``buffer`` (BatchNorm's running statistics follow the
    data, not the gradient), ``optimizer state``, a ``parameter``, or, when the model's weights are under
    ``model_at`` (:func:`~ckpt_tui.core.conventions.state_dicts.inner_state_dict`), ``other`` for a tensor
    outside them that is not optimizer state (a callback's best score, a loop's counter)."""
    if model_at and tuple(path[: len(model_at)]) != tuple(model_at) and not _optimizer_path(path):
        return "other"
    if tensor.dtype not in PARAMETER_DTYPES:
        return "counter"
    if _optimizer_path(path):
        return "optimizer state"
    if path and keypath.key_text(path[-1]).rsplit(".", 1)[-1] in BUFFER_NAMES:
        return "buffer"
    return "parameter"


def is_step_counter(path: KeyPath) -> bool:
    """An optimizer's per-parameter ``step`` (Adam keeps it as a float tensor): a count of steps, not a value."""
    return _optimizer_path(path) and "step" in (path[-1], _flat_state_entry(path[-1]))


def _optimizer_path(path: KeyPath) -> bool:
    """A moment buffer, or a value under an optimizer's ``state`` (nested, or flattened: ``state.FQN.step``)."""
    return is_moment(path) or "state" in path[:-2] or (bool(path) and _flat_state_entry(path[-1]) in STATE_NAMES)
