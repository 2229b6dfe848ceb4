"""The header cache: the ranges a remote file's open fetched, kept on disk by the file's identity.

Reopening a remote file then costs the one request that tells its identity (an ETag, or the Hub's
commit): the readers' reads of headers, directories and pickles are served from here. Entries live
under ``$XDG_CACHE_HOME/ckpt-tui/remote`` (``~/.cache`` by default), one file per URL; an entry whose
identity differs from the store's is ignored and replaced. A file is written whole or not at all.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import tempfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckpt_tui.core.model.remote import RemoteFile, Stat

MAX_CACHED = 64 << 20
"""Bytes of one file's ranges kept at most (a pickle larger than this is fetched again)."""
_LENGTH = struct.Struct("<I")


def cache_dir() -> str:
    """Where entries live."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ckpt-tui", "remote")


class HeaderCache:
    """Ranges of remote files by URL and identity."""

    def _path(self, url: str) -> str:
        return os.path.join(cache_dir(), hashlib.sha256(url.encode()).hexdigest()[:40] + ".bin")

    def load(self, url: str, stat: Stat) -> list[tuple[int, bytes]]:
        """The ranges kept for ``url`` when they were fetched from the same file (same identity and size)."""
        if not stat.identity:
            return []
        try:
            with open(self._path(url), "rb") as file:
                (length,) = _LENGTH.unpack(file.read(_LENGTH.size))
                meta = json.loads(file.read(length))
                if meta.get("url") != url or meta.get("identity") != stat.identity or meta.get("size") != stat.size:
                    return []
                extents = [(int(start), file.read(int(count))) for start, count in meta["extents"]]
        except (OSError, ValueError, KeyError, TypeError, struct.error):
            return []
        seed = stat.seed
        if seed is not None:  # the bytes the asking brought are kept already
            low, high = seed[0], seed[0] + len(seed[1])
            extents = [(s, d) for s, d in extents if s + len(d) <= low or s >= high]
        return [(s, d) for s, d in extents if s >= 0 and s + len(d) <= stat.size]

    def save(self, source: RemoteFile) -> None:
        """Keep ``source``'s ranges when it fetched something new (best effort: a failure is ignored)."""
        if source.fetched == 0 or not source.identity:
            return
        extents = source.extents()
        if not extents or sum(len(d) for _, d in extents) > MAX_CACHED:
            return
        meta = json.dumps(
            {
                "url": source.name,
                "identity": source.identity,
                "size": source.size,
                "extents": [[s, len(d)] for s, d in extents],
            }
        ).encode()
        folder = cache_dir()
        try:
            os.makedirs(folder, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=folder, prefix=".part-")
            with os.fdopen(handle, "wb") as file:
                file.write(_LENGTH.pack(len(meta)) + meta)
                for _, data in extents:
                    file.write(data)
            os.replace(temporary, self._path(source.name))
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
