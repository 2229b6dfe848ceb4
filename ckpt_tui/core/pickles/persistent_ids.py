"""Persistent ids as ``torch.load`` reads them: field counts, keys and location tags checked per format.

torch unpacks a zip checkpoint's id as exactly ``('storage', type, key, location, numel)`` and a legacy
file's as exactly ``('storage', type, key, location, numel, view)`` (or ``('module', class, file,
source)``); any other length fails. ``torch.jit.load`` reads the first five fields of a TorchScript
archive's id and ignores any more (published archives carry six). torch restores a storage only to a
location some registered deserializer accepts. Here such ids are still read (their first fields),
and each way torch would refuse them becomes one line in ``loader_problems``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ckpt_tui.core.model.tree import INT64_LIMIT, Storage
from ckpt_tui.core.pickles.unpickle import StorageType, StorageView, storage_from_pid

ZIP_FIELDS = 5
LEGACY_FIELDS = 6
_BACKEND_TAG = re.compile(r"(?:cuda|xpu|mtia|hpu|privateuseone)(?::(0|[1-9][0-9]{0,2}))?")
_DEVICE_STRING = re.compile(
    r"(?:cpu|cuda|ipu|xpu|mkldnn|opengl|opencl|ideep|hip|ve|fpga|maia|xla|lazy|vulkan|mps|meta|hpu|mtia|privateuseone)"
    r"(?::(0|[1-9][0-9]{0,2}))?"
)
"""What ``c10::Device`` parses: TorchScript restores a storage to any such device."""
MAX_DEVICE_INDEX = 127

Make = Callable[[str, str, str, int, str], Storage]


def script_location_refused(tag: str) -> bool:
    """Whether ``torch.jit.load`` refuses a location tag (it is no device string torch knows)."""
    match = _DEVICE_STRING.fullmatch(tag)
    return match is None or (match.group(1) is not None and int(match.group(1)) > MAX_DEVICE_INDEX)


def location_refused(tag: str) -> bool:
    """Whether ``torch.load`` refuses a location tag wherever only torch's own deserializers are registered.

    ``cpu`` and ``meta`` restore anywhere; ``mps*`` on a Mac; ``cuda``, ``xpu``, ``mtia``, ``hpu`` and
    ``privateuseone`` (optionally ``:N``, as ``torch.device`` parses it) where that device exists.
    """
    if tag in ("cpu", "meta") or tag.startswith("mps"):
        return False
    match = _BACKEND_TAG.fullmatch(tag)
    return match is None or (match.group(1) is not None and int(match.group(1)) > MAX_DEVICE_INDEX)


META = "meta"
"""The location torch turns into a storage without data (``_meta_deserialize``)."""


class PersistentIds:
    """Turns a file's persistent ids into storages, noting every way torch's loader would refuse them."""

    def __init__(self, fields: int, make: Make, script: bool = False, make_for_int: Make | None = None) -> None:
        self.fields = fields
        self.make = make
        self.make_for_int = make_for_int or make
        """Makes the storage of an int key (a legacy file keeps its bytes apart from those of the str key)."""
        self.script = script
        self.refused = script_location_refused if script else location_refused
        self.cache: dict[Any, Storage | StorageView] = {}
        """By the key object, as torch's ``loaded_storages`` / ``deserialized_objects``: ``0`` and ``"0"`` are
        two storages (of one zip record ``data/0``, each read as its own type)."""
        self.int_keys = False
        self.lengths: set[int] = set()
        self.locations: set[str] = set()
        self.checked: set[str] = set()

    def __call__(self, pid: Any) -> Any:
        # this runs once per tensor (50,000 times on big state_dicts): the usual id goes straight through
        if type(pid) is tuple and len(pid) == self.fields and pid[0] == "storage":
            key, location = pid[2], pid[3]
            if type(key) is str and self.fields == ZIP_FIELDS and type(pid[1]) is StorageType:
                # torch's zip loader looks a key's storage up before it reads the use's location or size: a
                # later use of a key is the storage first made for it, whatever that use says
                cached = self.cache.get(key)
                if cached is not None and not _empty(cached):
                    return cached
            if type(key) is str and type(location) is str:
                if location not in self.checked:
                    self.checked.add(location)
                    if self.refused(location):
                        self.locations.add(location)
                kind, numel = pid[1], pid[4]
                # storage_from_pid's work, inline for the usual zip id
                usual = self.fields == ZIP_FIELDS and type(kind) is StorageType and type(numel) is int
                if usual and 0 <= numel < INT64_LIMIT:
                    storage = self.cache.get(key)
                    if storage is None or _empty(storage):
                        made = self.make(key, kind.dtype, location, numel, kind.name)
                        if storage is None and (location != META or self.fields != ZIP_FIELDS):
                            self.cache[key] = made
                        storage = made
                    return storage
                return storage_from_pid(pid, self.make, self._cache_for(key, location))  # a legacy view, or
                # refused in its words
        return self._unusual(pid)

    def _unusual(self, pid: Any) -> Any:
        """Ids torch.load still reads (bytes, int keys, legacy modules) or refuses (wrong field counts)."""
        if type(pid) is tuple and pid and _text(pid[0]) == "module" and self.fields == LEGACY_FIELDS:
            if len(pid) != 4:
                self.lengths.add(len(pid))
            return pid[1] if len(pid) > 1 else None  # the class (legacy whole-module files)
        if type(pid) is not tuple or len(pid) < ZIP_FIELDS or _text(pid[0]) != "storage":
            return storage_from_pid(pid, self.make, self.cache)  # refuses it, in its words
        # torch.jit.load reads fields 0-4 by index (args.at(4)): more are ignored, fewer fail
        if len(pid) != self.fields and not (self.script and len(pid) > self.fields):
            self.lengths.add(len(pid))
        key, location = pid[2], _text(pid[3])
        if isinstance(location, str) and self.refused(location):
            self.locations.add(location)
        view = pid[5:6] if self.fields == LEGACY_FIELDS else ()
        if type(key) is int or (self.fields == ZIP_FIELDS and not self.script and formatted_key(key)):
            # torch names the record f"data/{key}" whatever its type, but caches the storage by the key object
            self.int_keys = True
            made = ("storage", pid[1], str(key), location, pid[4], *view)
            return storage_from_pid(made, self.make_for_int, self._cache_for(key, location), slot=key)
        made = ("storage", pid[1], key, location, pid[4], *view)
        return storage_from_pid(made, self.make, self._cache_for(key, location))

    def _cache_for(self, key: Any, location: Any) -> dict[Any, Storage | StorageView]:
        """Where a storage is looked up and kept for the key's later uses: torch's zip loader keeps no storage
        without data (a ``meta`` one: each later use of its key reads the record again, at that use's location;
        one kept before is still found); legacy files keep all."""
        if self.fields != ZIP_FIELDS or location != META:
            return self.cache
        try:
            kept = self.cache.get(key)
        except TypeError:
            return self.cache  # (an unhashable key: refused there, in its words)
        return {} if kept is None else {key: kept}

    def problems(self) -> list[str]:
        """Why torch.load would refuse these ids, one line each."""
        out = []
        if self.script and self.int_keys:
            out.append("a persistent id's record key is an int: torch.jit.load reads it as a string and fails")
        if self.lengths:
            counts = ", ".join(str(n) for n in sorted(self.lengths))
            wants = "torch.jit.load reads at least" if self.script else "torch.load unpacks exactly"
            out.append(f"persistent ids with {counts} fields: {wants} {self.fields}, refuses them")
        if self.locations:
            tags = ", ".join(repr(t) for t in sorted(self.locations)[:5])
            loader = "torch.jit.load" if self.refused is script_location_refused else "torch.load"
            out.append(
                f"location tags torch itself cannot restore ({tags}): {loader} refuses the file unless a plugin can"
            )
        return out


_PLAIN_KEYS = (int, bool, float, complex, bytes, type(None))
"""Key types whose ``str`` is the same in any Python: torch's ``f"data/{key}"`` names the same record."""
_MAX_KEY_DEPTH = 8


def _empty(storage: Any) -> bool:
    """A storage of no bytes kept for its key: torch hands a later use of the key a storage of its own (the zip
    loader keeps none without data, the legacy one makes a new one of the use's type), so each use keeps its dtype."""
    return type(storage) is Storage and storage.nbytes == 0


def formatted_key(key: Any, depth: int = 0) -> bool:
    """Whether ``torch.load`` reads a zip record for this non-str key (a plain value, or a tuple of them,
    hashable as its storage cache needs), named as ``str(key)`` names it here."""
    # an int past Python's digit limit fails str() in torch too: left to refuse as a corrupt id
    if type(key) is int:
        return key.bit_length() < 10_000
    if type(key) in _PLAIN_KEYS:
        return True
    if type(key) is tuple and depth < _MAX_KEY_DEPTH:
        return all(type(k) is str or formatted_key(k, depth + 1) for k in key)
    return False


def _text(value: Any) -> Any:
    """torch decodes bytes in ids as ASCII (files pickled by Python 2)."""
    if isinstance(value, bytes):
        try:
            return value.decode("ascii")
        except UnicodeDecodeError:
            return value
    return value
