"""Paths a checkpoint names inside its own folder, resolved one way for every reader and every scan.

A sharded index's ``weight_map``, DCP's ``storage_data`` relative paths and ``.metadata``, DeepSpeed's
``latest``, the files of an Accelerate folder and a rank file's siblings are all names that a file (or
a folder) hands us. :func:`inside` is the one function that turns such a name into a path:

- the name is relative and stays inside the folder (no ``..`` out, no absolute path, no URL);
- a symlink out of the folder is followed as the loaders follow it (weights kept on another disk and
  linked into a run folder, a DeepSpeed tag folder linked from elsewhere, a Hugging Face hub cache's
  ``snapshots/REV/NAME`` into ``blobs/``), but never into the kernel's file systems (``/proc``, ``/sys``,
  ``/dev``, whose "regular files" are no files) nor, for a folder, to one holding the folder (a loop);
  :func:`followed_links` names each link a checkpoint was read through, for its notes;
- what it names is a regular file (or, asked for one, a folder): never a FIFO, a device, a socket or
  ``/dev/stdin``.

Opening never blocks either: :func:`~ckpt_tui.core.model.byte_source.open_stream` opens a local file
with ``O_NONBLOCK`` and refuses what ``fstat`` says is not a regular file.
"""

from __future__ import annotations

import os
import re
from typing import Literal

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model import byte_source as places

DCP_METADATA = ".metadata"
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
"""What ``from_pretrained(folder)`` takes, first found first (transformers' ``_get_resolved_checkpoint_files``)."""
DIFFUSERS_WEIGHTS = (
    "diffusion_pytorch_model.safetensors.index.json",
    "diffusion_pytorch_model.safetensors",
    "diffusion_pytorch_model.bin",
)
"""What diffusers' ``ModelMixin.from_pretrained(folder)`` takes: its index first (``_fetch_index_file``), then the
safetensors file, then the pickle (``allow_pickle`` when ``use_safetensors`` is not given)."""
PEFT_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
"""What ``PeftModel.from_pretrained(folder)`` takes (peft's ``load_peft_weights``)."""
WEIGHTS_LOADERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("from_pretrained", HF_WEIGHTS),
    ("diffusers' from_pretrained", DIFFUSERS_WEIGHTS),
    ("PeftModel.from_pretrained", PEFT_WEIGHTS),
)
"""Each loader that takes one weights file (or index) from a folder by name, with the names it tries in order."""
FOLDER_ENTRIES = (DCP_METADATA, *(name for _, names in WEIGHTS_LOADERS for name in names))
"""What a loader opens in a folder, in the order ckpt-tui's detection looks (``dcp.load``'s ``.metadata``, then
``from_pretrained``'s files): all a folder that cannot be listed (a web server that lists nothing) is asked for."""
HUB_SNAPSHOTS = "snapshots"
HUB_BLOBS = "blobs"


def inside(folder: str, name: object, what: str, kind: Literal["file", "folder"] = "file") -> str:
    """``folder/name``, checked: inside the folder, no link out, a regular file (or a folder).

    ``what`` opens each refusal: ``"model.safetensors.index.json: shard"`` gives
    ``model.safetensors.index.json: shard '../x' leads out of FOLDER``.
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ReadError(f"{what} {name!r} is not a file name")
    if os.path.isabs(name) or places.is_remote(name):
        raise ReadError(f"{what} {name!r} is an absolute path, not a file of {folder}")
    if os.path.normpath(name).split(os.sep)[0] == os.pardir:
        raise ReadError(f"{what} {name!r} leads out of {folder}")
    if places.is_remote(folder):
        return _remote(folder, name, what, kind)
    return _local(folder, name, places.join(folder, name), what, kind)


WEB = ("http://", "https://")


def _remote(folder: str, name: str, what: str, kind: str) -> str:
    """``folder/name`` in a remote store. A server may decode ``%2e%2e`` and resolve it, or take ``\\`` for
    ``/``: a name whose segments, so read, climb out is refused; a URL gets the name percent-encoded, as
    huggingface_hub does (so ``%2e%2e`` is asked for as that literal name, which no loader resolves either)."""
    import urllib.parse  # (remote names only: a local path needs none of it)

    for seen in (name, urllib.parse.unquote(name)):
        if ".." in re.split(r"[/\\]", seen):
            raise ReadError(f"{what} {name!r} leads out of {folder}")
    path = places.join(folder, urllib.parse.quote(name, safe="/") if folder.startswith(WEB) else name)
    found = places.is_dir(path) if kind == "folder" else places.is_file(path)
    if not found:
        raise ReadError(f"{what} {name!r} is missing from {folder}")
    return path


def _local(folder: str, name: str, path: str, what: str, kind: str) -> str:
    out = link_out(folder, path)
    if out is not None:
        why = unfollowed(folder, out, kind)
        if why is not None:
            raise ReadError(f"{what} {name!r} is a link out of {folder} (to {out}): {why}; refused")
    real = os.path.realpath(path)
    try:
        info = os.stat(real)
    except FileNotFoundError:
        raise ReadError(f"{what} {name!r} is missing from {folder}") from None
    except OSError as exc:
        raise ReadError(f"{what} {name!r}: {exc.strerror or exc}") from None
    if kind == "folder":
        if not os.path.isdir(real):
            raise ReadError(f"{what} {name!r} is not a folder")
    elif not os.path.isfile(real):
        raise ReadError(f"{what} {name!r} is {places.file_kind(info.st_mode)}, not a regular file; refused")
    return path


def link_out(folder: str, path: str) -> str | None:
    """Where a local ``path`` of ``folder`` really leads when a link takes it out of the folder; None inside."""
    real = os.path.realpath(path)
    return None if any(_within(real, root) for root in _allowed_roots(folder)) else real


KERNEL_FILE_SYSTEMS = ("/proc", "/sys", "/dev")
"""Where a link out of a folder is never followed: their entries stat as regular files (``/proc/kcore``,
``/proc/self/mem``) or folders, yet reading them reads the kernel's memory, blocks, or never ends."""


def unfollowed(folder: str, out: str, kind: str) -> str | None:
    """Why a link out of ``folder`` to ``out`` is not followed, or None: loaders follow links, so ckpt-tui does,
    except into the kernel's file systems and (for a folder) to a folder holding this one."""
    kernel = next((root for root in KERNEL_FILE_SYSTEMS if _within(out, root)), None)
    if kernel is not None:
        return f"the kernel's {kernel}, never read"
    if kind == "folder" and _within(os.path.realpath(folder), out):
        return "a folder holding it (a loop)"
    return None


def followed_links(folder: str, paths: list[str]) -> list[str]:
    """``NAME -> TARGET`` for each link out of a local ``folder`` that one of ``paths`` (files read from it)
    was read through: the notes say where a linked weights file or tag folder really lies."""
    if places.is_remote(folder):
        return []
    top = os.path.abspath(folder)
    found: dict[str, str] = {}
    for path in paths:
        if places.is_remote(path):
            continue
        current = os.path.abspath(path)
        # each part of the path from the file up to the folder: the file itself, or a folder it lies in
        while _within(current, top) and current != top:
            if os.path.islink(current):
                # (a link between the folder's own entries, or into a hub cache's blobs, is no link out)
                out = link_out(top, current)
                if out is not None:
                    found.setdefault(os.path.relpath(current, top), out)
            current = os.path.dirname(current)
    return [f"{name} -> {out}" for name, out in found.items()]


def _allowed_roots(folder: str) -> list[str]:
    """The folder itself, and for a hub cache snapshot the repository's ``blobs`` folder."""
    real = os.path.realpath(folder)
    roots = [real]
    parent = os.path.dirname(real)
    if os.path.basename(parent) == HUB_SNAPSHOTS:
        blobs = os.path.join(os.path.dirname(parent), HUB_BLOBS)
        if os.path.isdir(blobs) and not os.path.islink(blobs):
            roots.append(blobs)
    return roots


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def named_entry(path: str) -> bool:
    """Whether a folder's listing holds ``path`` as something other than a folder: a FIFO or a link out is
    listed too, so that :func:`inside` refuses it in one line rather than it being passed over."""
    if places.is_remote(path):
        return places.is_file(path)
    return os.path.lexists(path) and not os.path.isdir(path)
