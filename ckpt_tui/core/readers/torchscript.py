"""TorchScript archives (``torch.jit.save``): every pickle ``torch.jit.load`` reads, never the code.

``torch.jit.load`` unpickles ``data.pkl`` (the module, its tensors in ``data/``) and ``constants.pkl``
(tensors in ``constants/``), and on demand the ``*.debug_pkl`` source ranges beside each code file and
other ``*.pkl`` members (``traced_inputs.pkl``). All of them are scanned here. Their globals are the
classes the archive's own ``code/`` defines (``__torch__.…``, known as data by exact name) and the list
builders of ``torch.jit._pickle`` (inert stand-ins below); anything else is reported as usual.

A scripted module stores its parameters, buffers and submodules as plain attributes; the code names
which are which (``__parameters__``, ``__buffers__``, attribute types). Each module object is given the
``_parameters`` / ``_buffers`` / ``_modules`` shape of a pickled ``nn.Module``, so its state_dict is
found, shown and extracted like any module's.
"""

from __future__ import annotations

import dataclasses
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, BinaryIO

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model.tree import Checkpoint, Opaque, iter_nodes, opaque_class
from ckpt_tui.core.readers.torch_zip import ZipLayout, ZipRecords, load_with_records, member_pickle
from ckpt_tui.core.readers.zip_archive import ZipDirectory, fold, inflate_cap, read_member

_CLASS = re.compile(r"^class[ \t]+(\w+)[ \t]*(?:\([ \t]*([\w.]*)[ \t]*\))?[ \t]*:", re.MULTILINE)
_QUOTED = re.compile(r'"([^"\\\n]*)"')
_SETSTATE = re.compile(r"\b__setstate__\b")
"""Any mention of the name, not only ``def __setstate__(``: TorchScript's own parser reads the code, with
its line continuations and spacing, so what defines the method is never guessed narrower than this."""
PICKLE_SUFFIXES = (".pkl", ".debug_pkl")


def _list_of(kind: str) -> Any:
    def build(data: Any) -> Any:
        if not isinstance(data, list):
            raise ValueError(f"torch.jit._pickle.build_{kind} of a non-list")
        return data

    return build


def _tensor_from_id(data: Any) -> Any:
    return data if type(data) is int else None


def _restore_type_tag(value: Any, type_str: Any) -> Any:
    if not isinstance(type_str, str):
        raise ValueError("torch.jit._pickle.restore_type_tag without a type string")
    return value


SCRIPT_GLOBALS: dict[str, Any] = {
    "torch.jit._pickle.build_intlist": _list_of("intlist"),
    "torch.jit._pickle.build_tensorlist": _list_of("tensorlist"),
    "torch.jit._pickle.build_doublelist": _list_of("doublelist"),
    "torch.jit._pickle.build_boollist": _list_of("boollist"),
    "torch.jit._pickle.build_tensor_from_id": _tensor_from_id,
    "torch.jit._pickle.restore_type_tag": _restore_type_tag,
}
"""The TorchScript pickler's helpers (``torch/jit/_pickle.py``): each returns its argument."""

TORCHBIND_WEIGHTS = (
    "__torch__.torch.classes.quantized.LinearPackedParamsBase",
    "__torch__.torch.classes.quantized.Conv2dPackedParamsBase",
    "__torch__.torch.classes.quantized.Conv3dPackedParamsBase",
    "__torch__.torch.classes.quantized.EmbeddingPackedParamsBase",
    "__torch__.torch.classes.sparse.LinearPackedParamsBase",
    "__torch__.torch.classes.rnn.CellParamsBase",
    "__torch__.torch.classes.xnnpack.LinearOpContext",
    "__torch__.torch.classes.xnnpack.Conv2dOpContext",
    "__torch__.torch.classes.xnnpack.TransposeConv2dOpContext",
)
"""Classes torch itself registers (TorchBind) to hold packed weights of quantized and prepacked modules:
their state is the weights, restored by torch's own code. Known as data by exact name, only here."""
SCRIPT_GLOBALS.update((name, opaque_class(name, safe=True)) for name in TORCHBIND_WEIGHTS)


@dataclass
class ScriptClass:
    """A class the archive's code defines: its base, and for modules which attributes hold weights."""

    name: str
    base: str
    parameters: list[str]
    buffers: list[str]
    sets_state: bool

    @property
    def is_module(self) -> bool:
        """A scripted ``nn.Module``."""
        return self.base == "Module"


def read_torchscript(path: str, file: BinaryIO, file_bytes: int, layout: ZipLayout, byteorder: str) -> Checkpoint:
    """Read a TorchScript archive: its module, constants and every other pickle, as data."""
    budget = _Budget(file_bytes)
    classes, code_setstate = _script_classes(file, layout, file_bytes, budget)
    known = classes
    unsafe: set[str] = set()
    problems = list(layout.problems)

    def load(name: str, folder: str, key_prefix: str) -> tuple[Any, list[str]]:
        data = member_pickle(file, layout, name, file_bytes)
        budget.spend(len(data), name)
        records = ZipRecords(path, layout.entries, layout.prefix + folder, file_bytes)
        return load_with_records(
            data, records, key_prefix, f"{path}: {layout.prefix}{name}", unsafe,
            known_classes=known, extra_globals=SCRIPT_GLOBALS, script=True,
        )  # fmt: skip

    module, found = load("data.pkl", "data/", "")
    constants, more = load("constants.pkl", "", "constants/")
    problems += found + more + _jit_load_refusals(module, constants, classes)
    for name in _other_pickles(layout):  # read on demand by torch (debug info, traced inputs): scanned only
        stem = name.rsplit(".", 1)[0]
        try:
            load(name, "", stem + "/")
        except ReadError as exc:
            problems.append(f"{layout.prefix}{name} cannot be read ({_reason(exc)}): torch.jit.load may fail on it")
    notes = ["TorchScript archive: its code/ is listed, never run", *layout.notes]
    _shape_modules(module, classes)
    root: Any = {"module": module, "constants": constants} if constants else module
    return Checkpoint(
        path,
        "torchscript",
        root,
        file_bytes,
        byteorder=byteorder,
        notes=notes,
        unsafe_globals=unsafe,
        loader_problems=problems,
        runs_code=_load_time_code(classes, code_setstate),
        hostile=layout.hostile,
        archive=ZipRecords(path, layout.entries, layout.prefix + "data/", file_bytes),
    )


class _Budget:
    """Bytes the archive's compressed members may inflate to, all together."""

    def __init__(self, file_bytes: int) -> None:
        self.left = inflate_cap(file_bytes)

    def spend(self, size: int, name: str) -> None:
        self.left -= size
        if self.left < 0:
            raise ReadError(f"members up to {name} inflate to more than this file's size can justify (a zip bomb?)")


class ScriptClasses:
    """The classes ``torch.jit.load`` compiles from the archive's code, found as its importer finds them.

    A global ``Q.C`` is class ``C`` of the code file torch's reader returns for ``code/Q.py`` (dots of ``Q``
    as folders): ``findSourceInArchiveFromQualifier`` (``import_source.cpp``) asks for that name, and
    miniz's lookup compares names with ASCII letters lowered, so ``CODE/__torch__.py`` defines ``__torch__.M``
    (:meth:`ZipDirectory.locate`, the lookup every record goes through).
    """

    def __init__(self, entries: ZipDirectory, code: str, files: dict[int, dict[str, ScriptClass]]) -> None:
        self._entries = entries
        self._code = code
        self._files = files
        """Each code file's top-level classes by their own name, by the file's index in the zip."""

    def get(self, name: str) -> ScriptClass | None:
        """The class torch compiles for the global ``name``, or None (torch finds no such class)."""
        qualifier, _, short = name.rpartition(".")
        entry = self._entries.locate(self._code + qualifier.replace(".", "/") + ".py") if qualifier else None
        found = None if entry is None else self._files.get(entry.index, {}).get(short)
        return None if found is None else dataclasses.replace(found, name=name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def setting_state(self) -> list[str]:
        """Every class of every code file torch could read that defines ``__setstate__``."""
        return sorted(c.name for found in self._files.values() for c in found.values() if c.sets_state)


def _script_classes(
    file: BinaryIO, layout: ZipLayout, file_bytes: int, budget: _Budget
) -> tuple[ScriptClasses, list[str]]:
    """Every class the archive's ``code/`` defines, as torch's importer finds them, and the code files that
    name ``__setstate__`` outside any class found here. A code file is any member torch's lookup could
    return for some ``code/….py`` name: its name, ASCII letters lowered, starts with ``code/`` and ends
    with ``.py``."""
    files: dict[int, dict[str, ScriptClass]] = {}
    loose: list[str] = []
    code = layout.prefix + "code/"
    folded = fold(code.encode("utf-8", "surrogateescape"))
    for entry in layout.entries.members:
        name = fold(entry.raw)
        if not (name.startswith(folded) and name.endswith(b".py")) or entry.directory:
            continue
        budget.spend(entry.size, entry.name)
        text = read_member(file, entry, file_bytes).decode("utf-8", "replace")
        # the archive's own spelling, for messages; lookups go by the name torch asks for (ScriptClasses.get)
        module = entry.name[len(code) : -len(".py")].replace("/", ".")
        found = _parse_classes(module, text)
        files[entry.index] = {c.name.rsplit(".", 1)[1]: c for c in found}
        if _SETSTATE.search(text) and not any(c.sets_state for c in found):
            loose.append(entry.name)
    return ScriptClasses(layout.entries, code, files), loose


def _parse_classes(module: str, text: str) -> list[ScriptClass]:
    """The top-level classes of one code file (TorchScript's own printed Python, read as text only)."""
    found = list(_CLASS.finditer(text))
    classes = []
    for index, match in enumerate(found):
        end = found[index + 1].start() if index + 1 < len(found) else len(text)
        body = text[match.start() : end]
        classes.append(
            ScriptClass(
                f"{module}.{match.group(1)}",
                match.group(2) or "",
                _names(body, "__parameters__"),
                _names(body, "__buffers__"),
                _SETSTATE.search(body) is not None,
            )
        )
    return classes


def _names(body: str, attribute: str) -> list[str]:
    match = re.search(rf"^[ \t]+{attribute}[ \t]*=[ \t]*\[([^\]\n]*)\]", body, re.MULTILINE)
    return _QUOTED.findall(match.group(1)) if match else []


def _other_pickles(layout: ZipLayout) -> list[str]:
    """Pickle members torch.jit.load may read besides data.pkl and constants.pkl, by name in the archive
    (names compared as torch's lookup compares them: ASCII letters lowered)."""
    names = [n[len(layout.prefix) :] for n in layout.entries if n.startswith(layout.prefix)]
    skip = (b"data.pkl", b"constants.pkl")
    suffixes = tuple(s.encode() for s in PICKLE_SUFFIXES)

    def other(name: str) -> bool:
        folded = fold(name.encode("utf-8", "surrogateescape"))
        # extra/ holds the user's _extra_files: handed back as bytes, never unpickled by torch
        return folded.endswith(suffixes) and folded not in skip and not folded.startswith(b"extra/")

    return [n for n in names if other(n)]


def _jit_load_refusals(module: Any, constants: Any, classes: ScriptClasses) -> list[str]:
    """Why ``torch.jit.load`` fails before it has a module: its C++ importer (``import.cpp``,
    ``ScriptModuleDeserializer::deserialize``) takes ``constants.pkl`` as a tuple (``toTuple``) and the root
    of ``data.pkl`` as an object (``toObject``) of a class compiled from the archive's code."""
    problems = []
    if type(constants) is not tuple:
        problems.append(f"torch.jit.load fails: constants.pkl holds a {_kind(constants)}, not the tuple it reads")
    if not (isinstance(module, Opaque) and module.global_name in classes):
        problems.append(
            f"torch.jit.load fails: the root of data.pkl is a {_kind(module)}, not an object of a class the "
            "archive's code defines (a TorchScript module); torch.load refuses it as well"
        )
    return problems


def _kind(value: Any) -> str:
    return f"{value.global_name} object" if isinstance(value, Opaque) else type(value).__name__


def _load_time_code(classes: ScriptClasses, loose: list[str]) -> list[str]:
    """What ``torch.jit.load`` runs from the file while loading: the ``__setstate__`` its unpickler calls on
    each object of a class that defines one. That code is the file's own (it can open and write files
    through ``torch.from_file(..., shared=True)``), so it is never clean, whatever it looks like."""
    names = classes.setting_state() + loose
    if not names:
        return []
    more = f" (+{len(names) - 3} more)" if len(names) > 3 else ""
    return [
        f"torch.jit.load runs code from the file while loading: the TorchScript __setstate__ of "
        f"{', '.join(names[:3])}{more}; ckpt-tui does not run it and cannot tell what it does"
    ]


def _shape_modules(root: Any, classes: ScriptClasses) -> None:
    """Give every scripted module object the state of a pickled ``nn.Module``."""
    objects = [v for _, v in iter_nodes(root) if isinstance(v, Opaque) and v.global_name in classes]
    for obj in {id(o): o for o in objects}.values():
        script = classes.get(obj.global_name)
        if script is not None and script.is_module and isinstance(obj.state, dict) and "_parameters" not in obj.state:
            obj.state = _module_state(obj.state, script, classes)


def _module_state(attributes: dict[Any, Any], script: ScriptClass, classes: ScriptClasses) -> dict[Any, Any]:
    def is_submodule(value: Any) -> bool:
        found = classes.get(value.global_name) if isinstance(value, Opaque) else None
        return found is not None and found.is_module

    groups: dict[str, OrderedDict[Any, Any]] = {g: OrderedDict() for g in ("_parameters", "_buffers", "_modules")}
    state: dict[Any, Any] = {}
    for name, value in attributes.items():
        if name in script.parameters:
            groups["_parameters"][name] = value
        elif name in script.buffers:
            groups["_buffers"][name] = value
        elif is_submodule(value):
            groups["_modules"][name] = value
        else:
            state[name] = value
    return {**state, **groups}


def _reason(exc: ReadError) -> str:
    return str(exc).rsplit(": ", 1)[-1]
