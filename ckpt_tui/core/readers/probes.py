"""The detection table's cheap questions about a path (:data:`~ckpt_tui.core.readers.open.DETECTION`),
answered without importing a reader: is it a file of a DCP or DeepSpeed folder, does its head start like
a safetensors header or a pickle.

Each reader is imported by the row that reads its format, so opening one file imports one reader
(``info`` of a ``.pth`` imports neither the safetensors, DCP, DeepSpeed nor folder readers).
"""

from __future__ import annotations

import codecs
import os
import pickle
import re
import struct
from typing import Any

from ckpt_tui.core.model import byte_source as places
from ckpt_tui.core.model.contained import inside, named_entry

# ---- DCP -----------------------------------------------------------------------------------------

METADATA = ".metadata"


def is_dcp_folder(folder: str) -> bool:
    """A folder with DCP's ``.metadata`` (any entry but a folder: :func:`~ckpt_tui.core.readers.dcp.read_dcp`
    refuses one that is not a regular file of the folder)."""
    return named_entry(places.join(folder, METADATA))


def dcp_folder_of(path: str) -> str | None:
    """The DCP folder a ``.metadata`` or ``.distcp`` file belongs to (None for other files)."""
    name = os.path.basename(path)
    if name != METADATA and not name.endswith(".distcp"):
        return None
    folder = places.parent(path)
    return folder if is_dcp_folder(folder) else None


# ---- DeepSpeed -----------------------------------------------------------------------------------

LATEST = "latest"
MODEL_STATES = "_model_states.pt"
OPTIM_STATES = "_optim_states.pt"
STAGE0_MODEL = r"mp_rank_\d+_model_states\.pt"
"""With ZeRO disabled, each model-parallel rank saves one file: module, optimizer and the rest together."""


def _natural(text: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def deepspeed_files(folder: str, suffix: str) -> list[str]:
    """A folder's entries ending in ``suffix``, in natural order (``rank_10`` after ``rank_2``)."""
    # every entry but a folder: one that is not a regular file of the folder is refused when opened
    names = [n for n in places.list_dir(folder) if n.endswith(suffix) and named_entry(places.join(folder, n))]
    return sorted(names, key=_natural)


def lists_its_folder(path: str) -> bool:
    """Whether the folder a path lies in can be listed (local, a bucket, the Hub, a web server's listing page)."""
    return not places.is_remote(path) or places.store_of(path).lists(places.parent(path))


def deepspeed_folder(path: str) -> str | None:
    """The ZeRO tag folder (``global_stepN``) that ``path`` is, holds (``latest``) or lies in; else None."""
    if places.is_dir(path):
        folder = path
        tag = _latest_tag(path)
        if tag is not None:
            folder = inside(path, tag, f"{places.join(path, LATEST)}: tag folder", kind="folder")
    elif path.endswith((MODEL_STATES, OPTIM_STATES)):
        folder = places.parent(path)
        if not lists_its_folder(path):
            return None  # a web server that lists nothing: the file opens alone (its reader says how to get the rest)
    else:
        return None
    models = deepspeed_files(folder, MODEL_STATES)
    if models and (deepspeed_files(folder, OPTIM_STATES) or all(re.fullmatch(STAGE0_MODEL, n) for n in models)):
        return folder
    return None


def _latest_tag(folder: str) -> str | None:
    """The tag ``latest`` names, when it names something (checked by the caller); ``latest`` itself is
    read only as a regular file of the folder."""
    where = places.join(folder, LATEST)
    if not named_entry(where):  # none, or a folder named latest (no tag file)
        return None
    with places.open_stream(inside(folder, LATEST, f"{folder}:")) as file:
        text = file.read(4096)
    tag = text.decode("utf-8", errors="replace").strip()
    if len(text) == 4096 or not tag:
        return None
    if places.is_remote(folder) or os.path.isabs(tag) or os.path.lexists(os.path.join(folder, tag)):
        return tag  # a tag that is there, or that leads elsewhere (refused by the caller)
    return None


# ---- a file's first bytes ------------------------------------------------------------------------

MAX_HEADER = 100_000_000
"""The safetensors library's cap on a header's length."""
JSON_WHITESPACE = b" \t\n\r"


def header_length(head: bytes, file_bytes: int) -> int | None:
    """A safetensors file's declared header length when it fits the file and the library's cap, else None."""
    if len(head) < 8:
        return None
    (length,) = struct.unpack_from("<Q", head)
    if length < 2 or length > min(MAX_HEADER, file_bytes - 8):
        return None
    return length


def looks_like_safetensors(head: bytes, file_bytes: int) -> bool:
    """A length that fits, then a JSON object (after JSON whitespace): worth parsing as safetensors."""
    length = header_length(head, file_bytes)
    if length is None:
        return False
    start = head[8 : 8 + length].lstrip(JSON_WHITESPACE)
    return start[:1] == b"{" or (not start and length > len(head) - 8)


def looks_like_text(head: bytes) -> bool:
    """UTF-8 (a character cut at the end of ``head`` allowed) without control bytes other than whitespace."""
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return False
    return not any(ord(c) < 32 and c not in "\t\n\r\f" for c in text)


PICKLE_OPCODES = frozenset(
    code[0] for name, code in vars(pickle).items() if name.isupper() and type(code) is bytes and len(code) == 1
)
"""The first bytes of every pickle opcode: the pickle module's one-byte opcode constants (``pickletools.opcodes``
lists the same, but costs an import to read a file)."""


SETS = frozenset({"sharded", "dcp", "dcp-hf", "deepspeed", "folder", "ranks"})
"""The formats read from several files of a folder."""
REMOTE_BESIDE = (
    "files beside a remote checkpoint were not read: only those its reader reads were checked for code "
    "(download the folder and check it to read every file a loader could unpickle)"
)
"""The note on a set of files read from a URL: its folder's other files, which a local check reads for code, are
not listed or read there."""
