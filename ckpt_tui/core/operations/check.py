"""``check``: read every tensor's values and collect what would hurt a user."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from ckpt_tui.core.conventions.findings import where
from ckpt_tui.core.conventions.training_state import (
    FLAT_STATE,
    MOMENT_NAMES,
    RESUME_WARNINGS,
    is_moment,
    may_name_moment,
    zero_moment_message,
)
from ckpt_tui.core.errors import ReadError, ReadStopped, UnwrittenRecord
from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.keypath import KeyPath, file_path_json, to_json, to_python
from ckpt_tui.core.model.tree import Checkpoint, Opaque, Reference, Tensor, hidden_tensors, view_key, walk
from ckpt_tui.core.operations.info import Summary, listed_tensors, summarize
from ckpt_tui.core.pickles.unpickle import LEGACY_TENSOR_CLASSES
from ckpt_tui.core.readers.folder import LOADER_TAKES
from ckpt_tui.core.readers.probes import REMOTE_BESIDE
from ckpt_tui.core.readers.safetensors_file import library_refusals
from ckpt_tui.core.runtime import forked
from ckpt_tui.core.runtime.safe_text import printable
from ckpt_tui.core.weights_only.tables import IMPORTS_READ
from ckpt_tui.core.weights_only.verdict import (
    BESIDE_CODE,
    BESIDE_UNREADABLE,
    ScanBeside,
    Verdict,
    beside_code,
    beside_line,
    verdict,
)

if TYPE_CHECKING:  # numpy-backed: imported when values are read (a clean file's scan runs in a child)
    from ckpt_tui.core.values.stats import TensorStats

PROBLEM_KINDS = (
    "unsafe-global",
    "missing-record",
    "bad-tensor",
    "loader-refuses",
    "readers-disagree",
    "odd-layout",
    "load-runs-code",
    BESIDE_CODE,
    BESIDE_UNREADABLE,
    *RESUME_WARNINGS,
)


@dataclass
class Problem:
    """One problem: its kind, where, and the sentence to show."""

    kind: str
    message: str
    path: KeyPath | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        out: dict[str, Any] = {"kind": self.kind, "message": self.message, **self.detail}
        if self.path is not None:
            out["path"] = to_json(self.path)
        return out


@dataclass
class CheckReport:
    """What ``check`` found."""

    summary: Summary
    problems: list[Problem]
    checked: int
    skipped: int
    weights_only: Verdict | None = None
    """Whether ``torch.load(FILE)`` (weights_only=True, the default) loads the file."""
    folder_lines: list[str] = field(default_factory=list)
    """For a folder: which weights file a loader takes from it, and the line on its other files, read for code
    (:func:`beside_line`); empty otherwise."""

    @property
    def ok(self) -> bool:
        """No problems at all."""
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            **file_path_json(self.summary.checkpoint.path),
            "format": self.summary.checkpoint.format,
            "ok": self.ok,
            "tensors_checked": self.checked,
            "tensors_skipped": self.skipped,
            "problems": [p.to_json() for p in self.problems],
            "weights_only": self.weights_only.to_json() if self.weights_only is not None else None,
            "also_in_folder": _beside_json(self.summary.checkpoint),
        }


def check_checkpoint(
    checkpoint: Checkpoint,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    beside: ScanBeside | None = None,
) -> CheckReport:
    """Scan every tensor (each view once) for NaN/Inf; add the unsafe and broken findings.

    Views the batched scan finds all finite need nothing more; the others (NaN/Inf found, or not
    answered by it) are read the exact way, in file order, so counts and errors are as always.
    ``beside``: the weights_only scan of the file, started in a child process before it was read.
    """
    if checkpoint.changed_on_disk():
        # its tree and verdict are the file as it was read: values from another file would mix two
        raise ReadError(f"{checkpoint.path}: the file changed on disk since it was opened; open it again")
    # listing: each tensor once, and the distinct views under them
    columns = checkpoint.flat_columns()  # a flat file's tensors, listed without a walk
    references = None if columns is not None else list(walk(checkpoint.root))
    # (what no shown path reaches is read too: torch.load builds it, a NaN in it is in the loaded file)
    listed = (
        columns.listed() if columns is not None else listed_tensors(references or []) + hidden_tensors(references or [])
    )
    scanned_tensors, first_of_view, positions = _views(listed)
    # the CLI's check of a walked tree scans in a child while the tree is summed up (nothing to report
    # from the child); a flat one is summed up in a few passes, less than the child's copies of its pages
    # (a DCP folder's items are read here: what is odd about them is found as they are read)
    # (a remote file's values are fetched here: every byte fetched counts against --max-download in this process,
    # and what a child fetched would be fetched again here for the exact reads)
    in_child = (
        progress is None
        and cancelled is None
        and columns is None
        and checkpoint.format != "dcp"
        and not places.is_remote(checkpoint.path)
    )
    beside_finite = _finite_beside(first_of_view, checkpoint.byteorder) if in_child else None
    # the findings that are problems
    summary = summarize(checkpoint, references)
    problems = [
        Problem(f.kind, f.message, f.path, {"global": f.global_name} if f.global_name else {})
        for f in summary.findings
        if f.kind in PROBLEM_KINDS
    ]
    # the batched scan: which views are all finite
    finite = _finite_result(beside_finite, len(first_of_view))
    if finite is None:
        finite = _scan_finite(first_of_view, checkpoint.byteorder, len(listed), progress, cancelled)
    # the exact reads: views with NaN/Inf or not answered, and moment buffers that may be all zero
    tally = _Tally(problems)
    exact = _ExactReads(listed, scanned_tensors, checkpoint.byteorder, cancelled, tally)
    exact.tally_views(positions, finite, progress)
    # what reading the items of a distributed checkpoint found odd, beyond its metadata
    said = {p.message for p in problems}
    problems += [Problem("odd-layout", odd) for odd in dict.fromkeys(checkpoint.odd_layout) if odd not in said]
    if tally.zero_moments:
        problems.append(Problem("zero-moments", zero_moment_message(tally.zero_moments), tally.zero_moments[0]))
    problems += _sparse_problems(listed, checkpoint.byteorder, cancelled)
    problems += _quantizer_problems(listed, checkpoint.byteorder)
    problems += _unread_tensors(references or [])
    judged, refused = loader_judgement(checkpoint, beside)
    problems += refused
    return CheckReport(summary, problems, tally.checked, tally.skipped, judged, _folder_lines(checkpoint))


def loader_judgement(
    checkpoint: Checkpoint, beside: ScanBeside | None = None, tensors_only: bool = False
) -> tuple[Verdict, list[Problem]]:
    """The verdict on torch.load(weights_only=True) and the problem it is (``[]`` when none): the one judgement
    ``check`` and ``stats`` both report and exit 1 on. ``tensors_only`` (stats): only a refusal no allowlisting
    lifts, a tensor or record torch cannot load; globals to allowlist and doubt are check's to report."""
    judged = verdict(checkpoint, beside)
    if not _verdict_is_a_problem(judged, checkpoint):
        return judged, []
    if not tensors_only:
        return judged, [weights_only_problem(judged)]
    if judged.reason is None:
        return judged, []
    return judged, [Problem("weights-only", printable(f"torch.load(weights_only=True) refuses it: {judged.reason}"))]


def _folder_lines(checkpoint: Checkpoint) -> list[str]:
    """Which weights file of the folder a loader takes (where others lie beside it), and its other files read for
    code."""
    lines = [note for note in checkpoint.notes if note.startswith(LOADER_TAKES) or note == REMOTE_BESIDE]
    line = beside_line(checkpoint.beside or [])
    return lines + ([line] if line else [])


def _beside_json(checkpoint: Checkpoint) -> list[dict[str, Any]] | None:
    """The folder's other files read for code, as JSON (None: not a folder)."""
    if checkpoint.beside is None:
        return None
    return [
        {"path": f.name, "holds": f.what, "code": beside_code(f), "cannot_tell": f.unreadable}
        for f in checkpoint.beside
    ]


def _scan_finite(
    views: list[Tensor],
    byteorder: str,
    total: int,
    progress: Callable[[int, int], None] | None,
    cancelled: Callable[[], bool] | None,
) -> list[bool | None]:
    """Whether each view is all finite (None: not answered), by the batched scan (the first half of the
    progress bar)."""
    from ckpt_tui.core.values.finite_scan import all_finite

    def scanned(done: int, of: int) -> None:
        if progress is not None:
            progress(done * total // max(1, 2 * of), total)

    return all_finite(views, byteorder, cancelled, scanned)


def _verdict_is_a_problem(judged: Verdict, checkpoint: Checkpoint) -> bool:
    """A refusal by torch.load(weights_only=True) is a problem, but not for a TorchScript archive (torch.jit.load's
    to read) nor where the safetensors library's refusal was said among the findings already."""
    said = judged.route == "safetensors" and bool(library_refusals(checkpoint.loader_problems))
    return judged.loads is False and judged.route != "torchscript" and not said


@dataclass
class _Tally:
    """What a check counts while it reads: problems, tensors checked and skipped, moment buffers all zero."""

    problems: list[Problem]
    checked: int = 0
    skipped: int = 0
    zero_moments: list[KeyPath] = field(default_factory=list)


class _ExactReads:
    """The exact read of a view: its statistics once (a view shared by several tensors is read once), then
    NaN/Inf and all-zero moments counted for each tensor over it."""

    def __init__(
        self,
        listed: list[tuple[KeyPath, Tensor]],
        scanned: list[Tensor],
        byteorder: str,
        cancelled: Callable[[], bool] | None,
        tally: _Tally,
    ) -> None:
        self.listed, self.scanned, self.byteorder, self.cancelled = listed, scanned, byteorder, cancelled
        self.tally = tally
        self.seen: dict[int, TensorStats | None] = {}

    def tally_views(
        self, positions: list[int | None], finite: list[bool | None], progress: Callable[[int, int], None] | None
    ) -> None:
        """Count each listed tensor by its view's scan; read the views the scan leaves open (second half of
        the progress bar)."""
        listed, total = self.listed, len(self.listed)
        paths = list(map(operator.itemgetter(0), listed))
        named = _may_name_moments(paths)
        moments = (
            {i for i, path in enumerate(paths) if path and may_name_moment(path[-1]) and is_moment(path)}
            if named
            else set()
        )
        if not moments and None not in positions and all(map(finite.__getitem__, cast(list[int], positions))):
            # every view read whole and finite, no moment buffer: each listed tensor is checked (in one count)
            self.tally.checked += len(positions)
            if progress is not None and positions:
                progress((2 * total - 1) // 2, total)
            return
        for index, position in enumerate(positions):
            if progress is not None:
                progress((total + index) // 2, total)
            if position is None:
                self.tally.skipped += 1
            elif finite[position] and index not in moments:
                self.tally.checked += 1  # read whole, every value finite: no NaN, no Inf
            elif finite[position] and not _starts_with_zeros(self.scanned[index], self.byteorder):
                self.tally.checked += 1  # a moment buffer that does not start with zeros: not all zero
            else:
                self.read(index, position)

    def read(self, index: int, position: int) -> None:
        """Read listed tensor ``index`` (view ``position``) and count what it holds."""
        path = self.listed[index][0]
        if position not in self.seen:
            self.seen[position] = self._stats(path, self.scanned[index])
        stats = self.seen[position]
        if stats is None:
            return
        self.tally.checked += 1
        if stats.count and stats.zeros == stats.count and is_moment(path):
            self.tally.zero_moments.append(path)
        if stats.nan or stats.inf:
            from ckpt_tui.core.values.nonfinite import describe_nonfinite, locate_nonfinite, sparse_nonfinite

            listed = self.listed[index][1]
            # a second, row-major read of this tensor alone: where the first NaN and Inf are (a sparse
            # tensor's: positions in the tensor, from its indices, not in its stored values)
            where = (
                sparse_nonfinite(listed, self.byteorder)
                if listed.sparse is not None
                else locate_nonfinite(self.scanned[index], self.byteorder, self.cancelled)
            )
            counts: dict[str, Any] = {"nan": stats.nan, "inf": stats.inf, "count": stats.count}
            counts |= {"posinf": stats.posinf, "neginf": stats.neginf}
            if where is not None:
                counts |= {"first_nan": _listed(where.first_nan), "first_inf": _listed(where.first_inf)}
            message = f"{to_python(path)}: {describe_nonfinite(stats, where)}"
            self.tally.problems.append(Problem("nan" if stats.nan else "inf", message, path, counts))

    def _stats(self, path: KeyPath, tensor: Tensor) -> TensorStats | None:
        from ckpt_tui.core.values.stats import tensor_stats

        try:
            return tensor_stats(tensor, self.byteorder, self.cancelled)
        except ReadStopped:
            raise
        except UnwrittenRecord as exc:
            # torch.load gives it uninitialised memory: its values differ at each load, none are in the file
            self.tally.problems.append(Problem("unread-tensor", f"{to_python(path)}: {exc}", path))
            return None
        except ReadError as exc:
            self.tally.problems.append(Problem("unreadable", f"{to_python(path)}: {exc}", path))
            return None


def hidden_nonfinite(listed: list[tuple[KeyPath, Tensor]], byteorder: str = "little") -> list[Problem]:
    """NaN and Inf that a tensor's statistics row does not count, as ``check`` reports them: a sparse tensor's
    stored values (its first NaN/Inf as positions in the tensor) and a quantized tensor's scales."""
    from ckpt_tui.core.values.nonfinite import describe_nonfinite, sparse_nonfinite
    from ckpt_tui.core.values.stats import tensor_stats

    problems = _quantizer_problems(listed, byteorder)
    sparse = {id(t): (path, t) for path, t in reversed(listed) if t.sparse is not None and t.sparse_values}
    for path, tensor in reversed(sparse.values()):
        try:
            stats = tensor_stats(cast(Tensor, tensor.sparse_values), byteorder)
        except ReadStopped:
            raise
        except ReadError as exc:
            problems.append(Problem("unreadable", f"{to_python(path)} (its values): {exc}", path))
            continue
        if stats.nan or stats.inf:
            where = sparse_nonfinite(tensor, byteorder)
            counts: dict[str, Any] = {"nan": stats.nan, "inf": stats.inf, "count": stats.count}
            if where is not None:
                counts |= {"first_nan": _listed(where.first_nan), "first_inf": _listed(where.first_inf)}
            message = f"{to_python(path)}: {describe_nonfinite(stats, where)}"
            problems.append(Problem("nan" if stats.nan else "inf", message, path, counts))
    return problems


def _listed(index: tuple[int, ...] | None) -> list[int] | None:
    """An index as JSON holds it."""
    return None if index is None else list(index)


def _may_name_moments(paths: list[KeyPath]) -> bool:
    """Whether any path may be a moment buffer's: a nested moment's name is one of its path's keys, a flattened
    one's path ends in ``state.FQN.exp_avg``, so where neither is (a state_dict of 50,000 weights), none is looked
    for path by path."""
    try:
        if not MOMENT_NAMES.isdisjoint(itertools.chain.from_iterable(paths)):
            return True
    except TypeError:  # a key that cannot be hashed: looked at path by path
        return True
    try:
        # (a flattened moment's key starts with 'state.': the last keys looked at in one pass at C speed first)
        flat = any(map(str.startswith, map(operator.itemgetter(-1), paths), itertools.repeat(FLAT_STATE)))
    except (TypeError, IndexError):  # a last key that is no string, or the root itself: path by path
        flat = True
    return flat and any(may_name_moment(path[-1]) for path in paths if path)


def _sparse_problems(
    listed: list[tuple[KeyPath, Tensor]], byteorder: str, cancelled: Callable[[], bool] | None
) -> list[Problem]:
    """Sparse tensors whose indices point outside them, or cannot be read (each tensor object once)."""
    sparse = {id(tensor): (path, tensor) for path, tensor in reversed(listed) if tensor.sparse is not None}
    if not sparse:
        return []
    from ckpt_tui.core.values.sparse_checks import sparse_problem

    problems = []
    for path, tensor in reversed(sparse.values()):
        try:
            found = sparse_problem(tensor, byteorder, cancelled)
        except ReadStopped:
            raise
        except ReadError as exc:
            problems.append(Problem("unreadable", f"{to_python(path)} (its indices): {exc}", path))
            continue
        if found is not None:
            problems.append(Problem("sparse-indices", f"{to_python(path)}: {found}", path))
    return problems


def _quantizer_problems(listed: list[tuple[KeyPath, Tensor]], byteorder: str) -> list[Problem]:
    """Quantized tensors whose scales are NaN or infinite: every value they dequantize to is (their integer
    values are finite by type, so the scale is where a NaN sits). Each tensor object once."""
    quantized = {id(t): (path, t) for path, t in reversed(listed) if t.quantizer is not None and len(t.quantizer) > 1}
    if not quantized:
        return []
    import numpy as np

    problems = []
    for path, tensor in reversed(quantized.values()):
        try:
            scales = _scales(tensor.quantizer[1], byteorder)  # type: ignore[index]
        except ReadStopped:
            raise
        except (ReadError, ValueError, TypeError) as exc:
            problems.append(Problem("unreadable", f"{to_python(path)} (its quantizer's scales): {exc}", path))
            continue
        if scales is None:
            continue
        nan, inf = int(np.isnan(scales).sum()), int(np.isinf(scales).sum())
        if nan or inf:
            message = (
                f"{to_python(path)}: {nan} NaN, {inf} Inf of {scales.size} quantizer scales "
                "(every value dequantized with them is NaN or Inf)"
            )
            counts = {"nan": nan, "inf": inf, "count": int(scales.size)}
            problems.append(Problem("nan" if nan else "inf", message, path, counts))
    return problems


def _scales(scale: Any, byteorder: str) -> Any:
    """A quantizer's scales as a float64 array: a per-tensor number, a per-channel list or tensor (None: neither)."""
    import numpy as np

    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        return np.array([float(scale)])
    if isinstance(scale, (list, tuple)) and all(isinstance(v, (int, float)) for v in scale):
        return np.array(scale, dtype=np.float64)
    if isinstance(scale, Tensor) and scale.sparse is None and scale.quantizer is None:
        from ckpt_tui.core.values.tensor_values import TensorReader, decode

        chunks = [decode(chunk, scale.dtype, scale.metadata) for chunk in TensorReader(scale, byteorder).chunks()]
        return np.concatenate(chunks) if chunks else np.zeros(0)
    return None


def _views(listed: list[tuple[KeyPath, Tensor]]) -> tuple[list[Tensor], list[Tensor], list[int | None]]:
    """What is scanned for each listed tensor (a sparse tensor: its values part, where its NaN/Inf sit),
    each distinct view's first tensor, and each listed tensor's view (an index into those; None: skipped)."""
    scanned = [tensor if tensor.sparse is None else (tensor.sparse_values or tensor) for _, tensor in listed]
    storages = list(map(operator.attrgetter("storage"), scanned))
    if (
        set(map(operator.attrgetter("kind"), scanned)) == {"dense"}
        and not any(map(operator.is_, storages, itertools.repeat(None)))
        and len(set(map(id, storages))) == len(storages)
        and "meta" not in set(map(operator.attrgetter("location"), storages))
    ):  # each tensor over its own storage (a state_dict of 50,000): each one view, at C speed
        return scanned, scanned, list(range(len(scanned)))
    views: dict[tuple[Any, ...], int] = {}
    first_of_view: list[Tensor] = []
    positions: list[int | None] = []
    for tensor in scanned:
        # (a tensor over a meta storage has no values: torch.load makes it without data)
        if tensor.storage is None or tensor.kind != "dense" or tensor.storage.location == "meta":
            positions.append(None)
            continue
        view = view_key(tensor)
        position = views.get(view)
        if position is None:
            position = views[view] = len(first_of_view)
            first_of_view.append(tensor)
        positions.append(position)
    return scanned, first_of_view, positions


def _finite_beside(views: list[Tensor], byteorder: str) -> forked.Forked | None:
    """The batched NaN/Inf scan of ``views`` started in a child process (the summary is made meanwhile)."""

    def scan() -> list[int]:
        from ckpt_tui.core.values.finite_scan import all_finite

        return [1 if clean else 0 for clean in all_finite(views, byteorder)]

    return forked.fork(scan)


def _finite_result(child: forked.Forked | None, count: int) -> list[bool | None] | None:
    """The child's answers as :func:`~ckpt_tui.core.values.finite_scan.all_finite` gives them; None without them."""
    wire = child.result() if child is not None else None
    if not isinstance(wire, list) or len(wire) != count:
        return None
    return [True if clean == 1 else None for clean in wire]


def _starts_with_zeros(tensor: Tensor, byteorder: str) -> bool:
    """Whether a tensor's first values are all zero (then the whole tensor is read to tell an unused moment)."""
    from ckpt_tui.core.values.tensor_values import TensorReader

    try:
        return not TensorReader(tensor, byteorder).first(64).any()
    except ReadStopped:
        raise
    except ReadError:
        return True


def weights_only_problem(judged: Verdict) -> Problem:
    """The problem a refusing verdict adds (its blockers in ``detail``)."""
    if judged.answer == "cannot_tell":
        message = f"torch.load(weights_only=True): cannot tell whether it loads: {judged.unknown}"
    elif judged.blockers:
        names = ", ".join(b.name for b in judged.blockers[:5]) + (" …" if len(judged.blockers) > 5 else "")
        refused = counted(len(judged.blockers), "global")
        message = f"torch.load(weights_only=True) refuses it: {refused} not allowed ({names})"
    elif judged.reason is None and judged.needs_import:
        after = (
            f"cannot tell whether it loads: {judged.unknown}" if judged.unknown else f"torch {IMPORTS_READ} loads it"
        )
        message = f"torch.load(weights_only=True) refuses it in a fresh process; with {judged.import_words()}, {after}"
    else:
        message = f"torch.load(weights_only=True) refuses it: {judged.reason}"
    return Problem("weights-only", printable(message), None, {"globals": [b.name for b in judged.blockers]})


TENSOR_MAKERS = LEGACY_TENSOR_CLASSES | {"torch._utils._rebuild_device_tensor_from_cpu_tensor"}
"""Calls torch.load turns into a tensor that the tree keeps as calls: the legacy constructors
(``torch.FloatTensor([...])``, ``torch.IntTensor(4, 4)``, then maybe BUILD's ``set_``) and
``_rebuild_device_tensor_from_cpu_tensor`` (``data.to(dtype, device)``): their values are not read here."""


def _unread_tensors(references: list[Reference]) -> list[Problem]:
    """Tensors torch.load builds that the tree keeps as calls (:data:`TENSOR_MAKERS`), however they are
    called. Their values are not read here (a list converted to the class's dtype, a storage set by BUILD,
    a cast), so their NaN/Inf are not known and a check of the file is never clean; a constructor given
    only sizes makes a tensor of uninitialised memory, whose values differ at each load."""
    found = [
        (path, value)
        for path, value, _, first in references
        if first and isinstance(value, Opaque) and value.global_name in TENSOR_MAKERS
    ]
    uninitialised = [(path, value) for path, value in found if _uninitialised(value)]
    rest = [(path, value) for path, value in found if not _uninitialised(value)]
    problems = []
    if uninitialised:
        value = uninitialised[0][1]
        problems.append(
            _first_unread(
                uninitialised,
                f"{value.global_name}({', '.join(map(str, value.args))}) makes a tensor of uninitialised memory "
                "when torch.load runs it: its values differ at each load",
            )
        )
    if rest:
        problems.append(
            _first_unread(
                rest,
                f"a tensor made by {rest[0][1].global_name}(...), as torch.load builds it; ckpt-tui does not read "
                "such tensors, so their values (NaN/Inf) were not checked",
            )
        )
    return problems


def _first_unread(found: list[tuple[KeyPath, Opaque]], what: str) -> Problem:
    """One problem for tensors of one kind: the first one's place, how many more, and ``what`` it is."""
    path = found[0][0]
    more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
    return Problem("unread-tensor", f"{where(path)}{more}: {what}", path)


def _uninitialised(value: Opaque) -> bool:
    """A legacy constructor called with sizes only, and no storage set afterwards (``torch.IntTensor(4, 4)``)."""
    sizes = value.args
    return (
        value.global_name in LEGACY_TENSOR_CLASSES
        and not value.built
        and bool(sizes)
        and all(type(size) is int for size in sizes)
        and all(size > 0 for size in sizes)
    )
