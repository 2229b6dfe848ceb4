"""Save a tree as ``.pth`` (torch zip) or ``.safetensors``: streamed, atomic and verified.

Every write goes to a temporary file beside the target (:mod:`.target`), is fsynced, checked
against what was meant (:mod:`.verify`), and only then renamed over the target. Nothing is left
behind on failure, on Ctrl-C, or on SIGTERM/SIGHUP (:mod:`.temp_files`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt_tui.core.errors import CkptError, WriteError
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.tree import Storage
from ckpt_tui.core.runtime.safe_text import printable_path
from ckpt_tui.core.weights_only.verdict import REFUSES, Verdict
from ckpt_tui.core.writers.judge import JudgeBeside
from ckpt_tui.core.writers.pth import emit, write_pth
from ckpt_tui.core.writers.target import check_room, check_target, temporary_beside
from ckpt_tui.core.writers.verify import verify_pth, verify_safetensors

Progress = Callable[[int, int], None]
CancelCheck = Callable[[], bool]
FORMATS = ("pth", "safetensors")


@dataclass
class WriteResult:
    """What was written and how it was checked."""

    path: str
    format: str
    tensors: int
    records: int
    nbytes: int
    aliases: dict[str, str]
    verified: str
    storages: list[Storage] = field(default_factory=list, repr=False)
    left_out: list[str] = field(default_factory=list)
    """What the source held that the format cannot hold (safetensors: hooks, Python state), said in the line."""
    weights_only: Verdict | None = None
    """What ``torch.load(weights_only=True)`` makes of a written ``.pth`` (:mod:`.judge`); None for safetensors."""

    def line(self) -> str:
        """One line for the user."""
        left = f"; left out (safetensors holds tensor values only): {'; '.join(self.left_out)}" if self.left_out else ""
        path = printable_path(str(self.path))
        line = (
            f"wrote {path} ({self.format}, {counted(self.tensors, 'tensor')}, {counted(self.records, 'record')}, "
            f"{self.nbytes} bytes); verified: {self.verified}{left}"
        )
        if self.aliases and self.format == "safetensors":
            # safetensors holds each tensor once: load_file returns the kept name only, so strict loads miss the others
            tied = ", ".join(f"{alias} = {name}" for alias, name in list(self.aliases.items())[:4])
            extra = f" and {len(self.aliases) - 4} more" if len(self.aliases) > 4 else ""
            line += (
                f"; tied weights stored once ({tied}{extra}, in __metadata__): load_file returns the name after '='"
                " only; from_pretrained, safetensors' load_model, or load_state_dict(strict=False) and tying them"
                " after, restores the others"
            )
        judged = self.weights_only
        if judged is not None and judged.loads is False:
            line += "; " + refusal_line(judged)
        return line

    def short(self, width: int = 78) -> str:
        """One line of at most ``width`` characters, the weights_only verdict first: ``saved NAME, verified:
        loads with torch.load(weights_only=True)`` (for a long name the verdict's words shorten first, then
        the name in the middle; :meth:`line` has the details)."""
        judged = self.weights_only
        if judged is None:
            leads = ("safetensors, no pickle: nothing for weights_only to refuse", "safetensors")
        elif judged.loads:
            leads = ("loads with torch.load(weights_only=True)", "loads (weights_only)")
        elif judged.answer == REFUSES:
            leads = ("torch.load(weights_only=True) REFUSES it", "weights_only REFUSES it")
        else:
            leads = ("CANNOT TELL if torch.load(weights_only=True) loads it", "weights_only: CANNOT TELL")
        name = os.path.basename(self.path)
        # the name is what the user typed: shorten the verdict's words first, the name only when still too long
        for lead in leads:
            line = f"{lead} · saved {{}}, verified"
            room = max(width - len(line) + 2, 9)
            if len(name) <= room:
                return line.format(name)
        name = name[: (room - 1) // 2] + "…" + name[len(name) - (room - 1 - (room - 1) // 2) :]
        return line.format(name)


def refusal_line(judged: Verdict) -> str:
    """Why ``torch.load(weights_only=True)`` will not load what was written, and the way out."""
    names = [blocker.name for blocker in judged.blockers]
    if names and judged.reason is None and all(blocker.kind == "data" for blocker in judged.blockers):
        more = len(names) - 4
        shown = ", ".join(names[:4]) + (f" and {more} more" if more > 0 else "")
        return (
            f"torch.load(weights_only=True) refuses it: it holds {shown} (data, not on torch's "
            "allowlist): --sanitize rewrites them as plain data, `check` names what to allow instead"
        )
    return judged.headline()


def output_format(target: str | os.PathLike[str], fmt: str | None) -> str:
    """The format asked for, else the one the file name says (``.safetensors``), else ``pth``."""
    fmt = fmt or ("safetensors" if Path(target).suffix == ".safetensors" else "pth")
    if fmt not in FORMATS:
        raise WriteError(f"unknown output format {fmt!r} (pth or safetensors)")
    # torch.load (2.13+) hands any path ending in .safetensors to the safetensors library
    if fmt == "pth" and os.fspath(target).endswith(".safetensors"):
        raise WriteError(
            "a .pth file named *.safetensors would not load: torch.load (2.13+) hands such paths to "
            "safetensors; name the output .pth, or write it as safetensors"
        )
    return fmt


def save(
    root: Any,
    target: str | os.PathLike[str],
    fmt: str | None = None,
    *,
    byteorder: str = "little",
    force: bool = False,
    inputs: tuple[str, ...] = (),
    metadata: Mapping[Any, Any] | None = None,
    progress: Progress | None = None,
    cancelled: CancelCheck | None = None,
    check: Callable[[Path], str] | None = None,
) -> WriteResult:
    """Write ``root`` to ``target`` atomically and verify it; refuse what cannot be written faithfully.

    ``metadata`` is the source's own safetensors metadata, kept in a ``.safetensors`` output. ``check``
    is a further verification of the written (temporary) file: it raises to refuse it, and returns
    words for the ``verified`` line.
    """
    fmt = output_format(target, fmt)
    plan = None
    if fmt == "safetensors":
        from ckpt_tui.core.writers.safetensors_out import SafetensorsPlan  # with numpy: not needed for a .pth

        plan = SafetensorsPlan(root, byteorder, metadata)
    emitted = emit(root) if plan is None else None
    checked = check_target(target, force, inputs)
    # the verdict on the data.pkl, in a child where one can run, while the records are written
    judging = JudgeBeside(emitted, root) if emitted is not None else None
    if plan is not None:
        check_room(checked, sum(plan.sizes))
    try:
        with temporary_beside(checked) as temp:
            file = temp.open()
            temp_path = Path(temp.path)
            if plan is not None:
                written = plan.write(file, progress, cancelled)
                temp.start_sync()
                verified = verify_safetensors(temp_path, written)
                result = WriteResult(
                    "",
                    fmt,
                    written.tensors + len(written.aliases),
                    written.tensors,
                    written.nbytes,
                    written.aliases,
                    verified,
                    left_out=plan.left_out,
                )
            else:
                assert emitted is not None and judging is not None
                pth = write_pth(emitted, file, checked.path.stem, byteorder, progress, cancelled)
                temp.start_sync()
                verified = verify_pth(temp_path, pth)
                result = WriteResult("", fmt, pth.tensors, len(pth.storages), pth.nbytes, {}, verified, pth.storages)
                result.weights_only = judging.verdict()
            if check is not None:
                result.verified += ", " + check(temp_path)
            temp.commit()
    except CkptError:
        raise
    except OSError as exc:
        raise WriteError(f"cannot write {checked.path}: {exc.strerror or exc}") from None
    result.path = str(checked.path)
    return result
