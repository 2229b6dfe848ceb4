"""Pure edits: each takes a tree and returns a new tree plus a record of what changed.

The input tree is never modified; unchanged subtrees are shared between old and new, so keeping
every version for undo costs little. Every edit rebuilds through :func:`ckpt_tui.core.model.rebuild.rebuild`:
each object is visited once, shared objects stay shared, and a container that holds itself (a
cycle through dicts, lists or opaque objects) holds its edited copy, never sends an edit round
the cycle forever.
"""

from __future__ import annotations

import bisect
import dataclasses
import fnmatch
import itertools
import operator
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ckpt_tui.core.conventions.layouts import common_first_component, is_lightning_checkpoint, wrapper_prefix
from ckpt_tui.core.conventions.quantized_modules import state_dict_children, state_dict_version
from ckpt_tui.core.conventions.state_dicts import (
    any_optimizer,
    inner_state_dict,
    is_scheduler,
    root_model,
    root_model_keys,
    tensor_items,
)
from ckpt_tui.core.edits.key_renamer import KeyRenamer
from ckpt_tui.core.edits.key_renamer import strips_cleanly as strips_cleanly  # where the edits' callers find it
from ckpt_tui.core.errors import BadArgument, EditError, NothingChanges
from ckpt_tui.core.model.describe import count, counted, plural
from ckpt_tui.core.model.dtypes import DTYPES
from ckpt_tui.core.model.keypath import Attr, KeyPath, key_text, to_python
from ckpt_tui.core.model.keypath import glob_escape as glob_escape  # where the edits' callers find it
from ckpt_tui.core.model.rebuild import Items, Rebuilt, is_container, kids, rebuild
from ckpt_tui.core.model.tree import (
    MODULE_GROUPS,
    Opaque,
    Storage,
    Tensor,
    get,
    iter_reachable,
    iter_tensors,
    module_children,
    non_persistent_buffers,
)
from ckpt_tui.core.pickles.persistent_ids import MAX_DEVICE_INDEX, location_refused

CASTABLE = frozenset({"float64", "float32", "float16", "bfloat16"})
CAST_NAMES = {
    "float16": "float16",
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float32": "float32",
    "fp32": "float32",
    "f32": "float32",
    "float": "float32",
}
"""Every name a cast accepts (``--dtype``, the browser's cast prompt), lower case, without ``torch.``."""
EXAMPLES = 5
MODULE_ENTRIES_LIMIT = 1_000_000


@dataclass
class Change:
    """What an edit did: a title, how many things changed, a few ``old → new`` examples, and notes."""

    title: str
    count: int
    examples: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """Human lines: the title with its count, the notes, then the examples. One change with no example
        (an extract, a delete of one key) is its title alone: '1 changed' would say nothing."""
        out = [self.title if self.count == 1 and not self.examples else f"{self.title}: {self.count} changed"]
        out += [f"  {note}" for note in self.notes]
        out += [f"  {old} → {new}" for old, new in self.examples]
        if self.examples and self.count > len(self.examples):
            out.append(f"  … and {self.count - len(self.examples)} more")
        return out


Result = tuple[Any, Change]


def _describe(path: KeyPath) -> str:
    return to_python(path) if path else "the root"


def _is_module(value: Any) -> bool:
    return isinstance(value, Opaque) and value.is_module


# ---- key renames ------------------------------------------------------------------------


def default_target(root: Any) -> KeyPath:
    """The dict an edit of keys applies to by default: the root state_dict or the detected inner one."""
    if not _is_module(root) and tensor_items(root) is not None:
        return ()
    inner = None if _is_module(root) else inner_state_dict(root)
    if inner:
        return inner
    if _is_module(root):
        raise EditError("the root is a whole pickled module: extract its state_dict first")
    raise EditError("no state_dict found to edit: point the edit at a dict")


def _target_dict(root: Any, path: KeyPath) -> dict[Any, Any]:
    target = get(root, path)
    if _is_module(target):
        raise EditError(f"{_describe(path)} is a whole pickled module: extract its state_dict first")
    if not isinstance(target, dict):
        raise EditError(f"{_describe(path)} is not a dict")
    return target


def _rename_keys(
    root: Any, path: KeyPath, rename: Callable[[str], str | None] | KeyRenamer, title: str
) -> tuple[Rebuilt, dict[Any, Any], Change]:
    """Rename the str keys of the dict at ``path``; refuse a rename that changes nothing or collides.

    ``rename`` gives one key's new name (None: unchanged), or is a :class:`KeyRenamer` that renames
    every key at once.
    """
    target = _target_dict(root, path)
    keys = list(target)
    every = False
    if isinstance(rename, KeyRenamer):
        every = rename.renames_every(keys)
        new_keys = rename.all(keys, every)
    else:
        new_keys = [(rename(k) if isinstance(k, str) else None) or k for k in keys]
    moved = ((old, new) for old, new in zip(keys, new_keys, strict=True) if new != old)
    examples = [(str(old), str(new)) for old, new in itertools.islice(moved, EXAMPLES)]
    if not examples:
        raise NothingChanges(f"{title}: no key of {_describe(path)} changes")
    if not every and len(set(new_keys)) != len(new_keys):
        seen: dict[Any, Any] = {}
        for old, new in zip(keys, new_keys, strict=True):
            if new in seen:
                raise EditError(f"renaming would make {seen[new]!r} and {old!r} both {new!r}")
            seen[new] = old
    changed = len(keys) if every else sum(map(operator.ne, keys, new_keys))

    def edit(items: Items) -> Iterator[tuple[Any, Any]]:
        return zip(new_keys, map(operator.itemgetter(1), items), strict=True)

    rebuilt = rebuild(root, containers={id(target): edit})
    return rebuilt, target, Change(f"{title} in {_describe(path)}", changed, examples)


def wrapper_prefix_at(root: Any, path: KeyPath, lightning: bool | None = None) -> str:
    """The wrapper prefix (``module.``, ``_orig_mod.``, Lightning's ``model.``) on the keys at ``path``."""
    target = get(root, path)
    if lightning is None:
        lightning = path == ("state_dict",) and is_lightning_checkpoint(root)
    keys = [k for k in target if isinstance(k, str)] if isinstance(target, dict) else []
    return wrapper_prefix(keys, lightning)


def no_wrapper_message(root: Any, path: KeyPath) -> str:
    """Why ``auto`` strips nothing here, naming a shared first component that may be a real submodule."""
    target = get(root, path)
    keys = [k for k in target if isinstance(k, str)] if isinstance(target, dict) else []
    message = f"no wrapper prefix (module., _orig_mod.) on the keys of {_describe(path)}"
    shared = common_first_component(keys)
    if shared:
        message += f"; every key starts with {shared!r}, which may be a real submodule: it is stripped only when named"
    return message


def strip_prefix(root: Any, prefix: str, path: KeyPath | None = None, lightning: bool | None = None) -> Result:
    """Remove ``prefix`` from the keys that start with it (and from ``_metadata``, as torch does).

    ``auto`` strips only wrapper prefixes (:func:`ckpt_tui.core.conventions.layouts.wrapper_prefix`); ``lightning``
    says whether the keys come from a Lightning checkpoint (None: tell from ``root``).
    """
    where = default_target(root) if path is None else path
    if prefix == "auto":
        prefix = wrapper_prefix_at(root, where, lightning)
        if not prefix:
            raise EditError(no_wrapper_message(root, where))
    if not prefix:
        raise BadArgument("the prefix is empty")
    if not prefix.endswith("."):
        # 'module' for 'module.': every key it strips would start with '.', a name no model has
        target = _target_dict(root, where)
        cut = [k[len(prefix) :] for k in target if isinstance(k, str) and k.startswith(prefix) and k != prefix]
        if cut and all(rest.startswith(".") for rest in cut):
            raise BadArgument(f"stripping {prefix!r} leaves keys that start with '.' (did you mean {prefix + '.'!r}?)")
    rebuilt, target, change = _rename_keys(root, where, KeyRenamer(strip=prefix), f"strip {prefix!r}")
    _strip_metadata(rebuilt.version_of(target), prefix)
    return rebuilt.root, change


def _strip_metadata(state: Any, prefix: str) -> None:
    """``consume_prefix_in_state_dict_if_present``'s rule for ``_metadata``, on a fresh copy."""
    metadata = getattr(state, "_metadata", None)
    if not isinstance(metadata, dict):
        return
    new = OrderedDict(metadata)
    for key in list(new):
        if isinstance(key, str) and key and (key == prefix.replace(".", "") or key.startswith(prefix)):
            new[key[len(prefix) :]] = new.pop(key)
    state._metadata = new


def add_prefix(root: Any, prefix: str, path: KeyPath | None = None) -> Result:
    """Put ``prefix`` in front of every key (and every ``_metadata`` entry)."""
    if not prefix:
        raise BadArgument("the prefix is empty")
    where = default_target(root) if path is None else path
    rebuilt, target, change = _rename_keys(root, where, KeyRenamer(add=prefix), f"add {prefix!r}")
    state = rebuilt.version_of(target)
    metadata = getattr(state, "_metadata", None)
    if isinstance(metadata, dict):
        bare = prefix.rstrip(".")
        state._metadata = OrderedDict(
            ((prefix + k) if k else bare, v) for k, v in metadata.items() if isinstance(k, str)
        )
    return rebuilt.root, change


@dataclass(frozen=True)
class RenameRule:
    """One key substitution: ``old`` → ``new`` at the start of a key, or (``anywhere``) wherever the
    dotted components of ``old`` appear in a key (``attn`` → ``attention``; ``base_layer`` → nothing)."""

    old: str
    new: str
    anywhere: bool = False

    def apply(self, key: str) -> str:
        """The key after this rule."""
        if not self.anywhere:
            return self.new + key[len(self.old) :] if key.startswith(self.old) else key
        parts = key.split(".")
        old = self.old.split(".")
        new = self.new.split(".") if self.new else []
        out: list[str] = []
        index = 0
        while index < len(parts):
            if parts[index : index + len(old)] == old:
                out += new
                index += len(old)
            else:
                out.append(parts[index])
                index += 1
        return ".".join(out) if out else key

    @property
    def option(self) -> str:
        """The ``convert`` option that states it."""
        return "--rename-infix" if self.anywhere else "--rename-prefix"

    @property
    def spec(self) -> str:
        """``OLD=NEW``, as the option takes it."""
        return f"{self.old}={self.new}"

    def describe(self) -> str:
        """In words."""
        if self.anywhere:
            new = repr(self.new) if self.new else "nothing"
            return f"rename component {self.old!r} → {new} anywhere in a key"
        return f"rename prefix {self.old!r} → {self.new!r}"

    @classmethod
    def parse(cls, spec: str, anywhere: bool = False) -> RenameRule:
        """``OLD=NEW`` (split at the first ``=``); NEW may be empty for a component to remove."""
        old, sep, new = spec.partition("=")
        if not sep or not old:
            raise BadArgument(f"a rename rule takes OLD=NEW, got {spec!r}")
        if anywhere and (old.startswith(".") or old.endswith(".") or new.startswith(".") or new.endswith(".")):
            raise BadArgument(f"--rename-infix takes dotted components without outer dots, got {spec!r}")
        return cls(old, new, anywhere)


class RuleIndex:
    """Rename rules indexed by their prefix: which rule applies next to a key is found by one lookup per
    distinct prefix length, not by trying every rule (a rename map of 100,000 prefixes over 100,000 keys).

    Rules still apply in order, each to the result of the ones before it, exactly as trying them all.
    """

    def __init__(self, rules: Sequence[RenameRule]) -> None:
        self.rules = rules
        self.by_prefix: dict[str, list[int]] = {}
        self.anywhere = [i for i, rule in enumerate(rules) if rule.anywhere]
        for i, rule in enumerate(rules):
            if not rule.anywhere:
                self.by_prefix.setdefault(rule.old, []).append(i)
        self.lengths = sorted({len(prefix) for prefix in self.by_prefix})

    def next_rule(self, key: str, after: int) -> int | None:
        """The first rule after index ``after`` that changes ``key`` or whose prefix starts it (None: none)."""
        best: int | None = None
        for length in self.lengths:
            if length > len(key):
                break
            indices = self.by_prefix.get(key[:length])
            if indices:
                at = bisect.bisect_right(indices, after)
                if at < len(indices) and (best is None or indices[at] < best):
                    best = indices[at]
        start = bisect.bisect_right(self.anywhere, after)
        for i in self.anywhere[start:]:
            if best is not None and i > best:
                break
            if self.rules[i].apply(key) != key:
                return i
        return best


def rename_keys_by_rules(root: Any, rules: Sequence[RenameRule], path: KeyPath | None = None) -> Result:
    """Apply rename rules in order (each to the result of the previous) to every key; count each rule's moves."""
    if not rules:
        raise BadArgument("no rename rules")
    where = default_target(root) if path is None else path
    moved = [0] * len(rules)
    index = RuleIndex(rules)

    def rename(key: str) -> str:
        after = -1
        while (found := index.next_rule(key, after)) is not None:
            new = rules[found].apply(key)
            if new != key:
                moved[found] += 1
                key = new
            after = found
        return key

    rebuilt, _, change = _rename_keys(root, where, rename, "rename keys by rules")
    change.notes = [f"{rule.describe()}: {count} keys" for rule, count in zip(rules, moved, strict=True)]
    return rebuilt.root, change


def drop_keys(root: Any, patterns: Sequence[str], path: KeyPath | None = None) -> Result:
    """Delete every key of the state_dict that matches one of the glob ``patterns`` (``*.lora_A.*``)."""
    where = default_target(root) if path is None else path
    target = _target_dict(root, where)
    doomed = [k for k in target if isinstance(k, str) and any(fnmatch.fnmatchcase(k, p) for p in patterns)]
    if not doomed:
        raise EditError(f"no key of {_describe(where)} matches {', '.join(map(repr, patterns))}")
    drop = set(doomed)

    def edit(items: Items) -> Items:
        return [(k, v) for k, v in items if not (isinstance(k, str) and k in drop)]

    rebuilt = rebuild(root, containers={id(target): edit})
    examples = [(k, "(deleted)") for k in doomed[:EXAMPLES]]
    title = f"delete the keys of {_describe(where)} matching {', '.join(map(repr, patterns))}"
    return rebuilt.root, Change(title, len(doomed), examples)


def rename(root: Any, path: KeyPath, new_name: str) -> Result:
    """Rename one key, keeping its place."""
    if not path:
        raise EditError("the root has no name to change")
    old = path[-1]
    if not isinstance(old, str):
        raise EditError(f"{_describe(path)} is not a named key")
    rebuilt, _, change = _rename_keys(root, path[:-1], lambda k: new_name if k == old else None, f"rename {old!r}")
    return rebuilt.root, change


def delete(root: Any, path: KeyPath) -> Result:
    """Remove a key or a whole subtree (e.g. the optimizer)."""
    if not path:
        raise EditError("cannot delete the root")
    parent, key = get(root, path[:-1]), path[-1]
    in_dict = isinstance(parent, dict) and key in parent
    in_list = isinstance(parent, list) and isinstance(key, int) and 0 <= key < len(parent)
    # an entry of a mapping object (a Counter, a defaultdict): its items, shown as its keys
    in_items = isinstance(parent, Opaque) and not isinstance(key, Attr) and key in parent.items
    if not (in_dict or in_list or in_items):
        raise EditError(f"cannot delete {_describe(path)}")

    def edit(items: Items) -> Items:
        return [(k, v) for k, v in items if k != key]

    rebuilt = rebuild(root, containers={id(parent): edit})
    return rebuilt.root, Change(f"delete {_describe(path)}", 1, [(key_text(key), "(deleted)")])


# ---- extraction -------------------------------------------------------------------------


def module_state_dict(module: Opaque) -> OrderedDict[str, Any]:
    """A pickled ``nn.Module``'s ``state_dict()``, built from its pickled state.

    A module that contains itself has no state_dict (torch's own would recurse forever), and one
    whose shared submodules would give more than a million entries is refused before any is built.
    """
    _check_module_graph(module)
    out: OrderedDict[str, Any] = OrderedDict()
    versions: OrderedDict[str, dict[str, int]] = OrderedDict()
    stack: list[tuple[Iterator[tuple[Any, Any]], str]] = [(state_dict_children(module), "")]
    while stack:
        entries, prefix = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            continue
        key, value = entry
        name = prefix + key_text(key)
        if _is_module(value):
            version = state_dict_version(value)
            if version is not None:
                versions[name] = {"version": version}
            stack.append((state_dict_children(value), name + "."))
        else:
            out[name] = value
    refuse_unreached_tensors(module, {id(t) for v in out.values() for t in (v if isinstance(v, tuple) else (v,))})
    if versions:  # quantized modules load their entries by the version torch records
        out._metadata = versions  # type: ignore[attr-defined]
    return out


def refuse_unreached_tensors(
    module: Opaque, listed: set[int], skipped: Callable[[KeyPath], bool] = lambda path: False
) -> None:
    """Refuse a state_dict that would leave out tensors the module holds outside its parameters and
    buffers (a quantized layer's ``_packed_params``): a file without them would lose weights silently.

    ``listed`` holds the ids of the tensors the state_dict carries; ``skipped`` says which paths the
    user left out on purpose (``--drop``). What torch's own ``state_dict()`` leaves out (non-persistent
    buffers, tensors kept as plain attributes) is left out here too.
    """
    left_out: set[int] = set()  # what torch's state_dict leaves out too
    for _, value, _ in iter_reachable(module):
        if _is_module(value) and isinstance(value.state, dict):
            buffers = value.state.get("_buffers")
            skip = non_persistent_buffers(value.state)
            if isinstance(buffers, dict):  # non-persistent buffers
                left_out.update(id(t) for name, t in buffers.items() if name in skip)
            for name, attribute in value.state.items():  # plain attributes (self.anchors = torch.ones(3))
                if name not in MODULE_GROUPS:
                    left_out.update(id(t) for t in _plain_tensors(attribute))
    lost = [
        path
        for path, value, _ in iter_reachable(module)
        if isinstance(value, Tensor) and id(value) not in listed and id(value) not in left_out and not skipped(path)
    ]
    if lost:
        where = ".".join(key_text(k) for k in lost[0] if not str(key_text(k)).startswith("<"))
        raise EditError(
            f"the module holds {len(lost)} tensor{'s' if len(lost) != 1 else ''} outside its parameters and buffers "
            f"(first at {where!r}), "
            "which its state_dict here would leave out; refused"
        )


def _plain_tensors(value: Any, budget: int = 256) -> list[Tensor]:
    """Tensors held in plain containers (lists, tuples, dicts) of a module attribute, not inside objects."""
    found: list[Tensor] = []
    stack = [value]
    while stack and budget > 0:
        budget -= 1
        item = stack.pop()
        if isinstance(item, Tensor):
            found.append(item)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return found


def _check_module_graph(module: Opaque) -> None:
    """Refuse a module that contains itself, or whose state_dict would be huge (entries counted once
    per distinct submodule, children before parents)."""
    entries: dict[int, int] = {}
    open_ids: set[int] = set()
    stack: list[tuple[Opaque, bool]] = [(module, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            open_ids.discard(id(node))
            total = sum(entries[id(v)] if _is_module(v) else 1 for _, v in module_children(node))
            if total > MODULE_ENTRIES_LIMIT:
                raise EditError("the module's shared submodules give over a million state_dict entries; refused")
            entries[id(node)] = total
            continue
        if id(node) in entries:
            continue
        open_ids.add(id(node))
        stack.append((node, True))
        for key, value in module_children(node):
            if not _is_module(value):
                continue
            if id(value) in open_ids:
                raise EditError(f"the module at {key_text(key)!r} contains itself: it has no state_dict")
            if id(value) not in entries:
                stack.append((value, False))


def extract(root: Any, path: KeyPath | str) -> Result:
    """Make a subtree the new root (``auto``: the detected inner state_dict; modules: their state_dict)."""
    if path == "auto":
        found = () if _is_module(root) else inner_state_dict(root)
        keys = root_model_keys(root) if found is None else None
        if keys is not None:
            return _extract_root_model(root, keys)
        if found is None:
            if tensor_items(root) is not None:
                raise NothingChanges("the root already is a state_dict: nothing to extract")
            raise EditError("no inner state_dict found to extract")
        path = found
    assert not isinstance(path, str)
    value = get(root, path)
    if _is_module(value):
        value = module_state_dict(value)
        title = f"extract the state_dict of the module at {_describe(path)}"
    elif not path:
        raise EditError("the root is already the root")
    else:
        title = f"extract {_describe(path)}"
    tensors = sum(1 for _ in iter_tensors(value))
    dropped = extract_drops(root, path)
    return value, Change(f"{title} ({counted(tensors, 'tensor')})", 1, notes=[dropped] if dropped else [])


def _extract_root_model(root: dict[str, Any], keys: list[str]) -> Result:
    """``--extract auto`` of the model weights at the root beside training state (torchtitan's DCP step): the
    root's tensors become the root; the optimizer, scheduler and train state are left out, and said."""
    kept = set(keys)
    parts = [_dropped((key,), value) for key, value in root.items() if key not in kept]
    shown = parts[:EXTRACT_DROPS_SHOWN]
    more = f" and {len(parts) - len(shown)} more" if len(parts) > len(shown) else ""
    title = f"extract the model weights at the root ({counted(len(keys), 'tensor')})"
    return root_model(root, keys), Change(title, 1, notes=["drops " + ", ".join(shown) + more])


def extract_drops(root: Any, path: KeyPath) -> str | None:
    """What extracting ``path`` leaves out of the file, in one sentence (``drops epoch = 2, the optimizer
    state at ckpt["optimizer"] (1.39M elements), the LR scheduler state at ckpt["scheduler"]``); None when
    nothing is left out."""
    left: list[tuple[KeyPath, Any]] = []
    parent = root
    for depth, key in enumerate(path):
        if not isinstance(parent, dict):
            break
        left += [((*path[:depth], other), value) for other, value in parent.items() if other != key]
        parent = parent.get(key)
    if not left:
        return None
    shown = [_dropped(where, value) for where, value in left[:EXTRACT_DROPS_SHOWN]]
    rest = [key_text(where[-1]) for where, _ in left[EXTRACT_DROPS_SHOWN:]]
    # what else goes is named too (hyper_parameters, loops, ...): "and 3 more" hid what a user may want kept
    named = ", ".join(rest[:EXTRACT_DROPS_NAMED]) + (", …" if len(rest) > EXTRACT_DROPS_NAMED else "")
    more = f" and {len(rest)} more ({named})" if rest else ""
    return "drops " + ", ".join(shown) + more


EXTRACT_DROPS_SHOWN = 6
EXTRACT_DROPS_NAMED = 8
"""Of what an extract drops past the first :data:`EXTRACT_DROPS_SHOWN`, the keys named."""


def _dropped(path: KeyPath, value: Any) -> str:
    """One thing an extract leaves out, in words."""
    where = to_python(path)
    if any_optimizer(value):
        elements = sum(tensor.numel for _, tensor in iter_tensors(value))
        return f"the optimizer state at {where} ({count(elements)} {plural(elements, 'element')})"
    if is_scheduler(value):
        return f"the LR scheduler state at {where}"
    tensors = [tensor for _, tensor in iter_tensors(value)]
    if tensors:
        elements = sum(t.numel for t in tensors)
        return f"{where} ({counted(len(tensors), 'tensor')}, {count(elements)} {plural(elements, 'element')})"
    if isinstance(value, (bool, int, float, str)) and len(repr(value)) <= 40:
        return f"{key_text(path[-1])} = {value!r}"
    return where


def is_flat_state_dict(root: Any) -> bool:
    """The root itself holds the weights: ``--extract auto`` has nothing to do."""
    return not _is_module(root) and tensor_items(root) is not None and root_model_keys(root) is None


# ---- tensors: devices and dtypes ----------------------------------------------------------


def map_tensors(root: Any, convert: Callable[[Tensor], Tensor | None]) -> tuple[Any, int]:
    """A new tree with ``convert`` applied to every tensor once (None keeps it); containers copied as needed."""
    rebuilt = rebuild(root, tensors=convert)
    return rebuilt.root, rebuilt.tensors_changed


def parse_device_map(spec: str) -> Callable[[str], str]:
    """``cpu``, ``cuda:0``, or ``cuda:1=cuda:0,cuda:2=cpu`` as a function of the saved location."""
    spec = spec.strip()
    if not spec:
        raise BadArgument("empty device mapping")
    if "=" not in spec:
        _check_device(spec, target=True)
        return lambda location: spec
    mapping: dict[str, str] = {}
    for part in spec.split(","):
        source, _, target = part.partition("=")
        source, target = source.strip(), target.strip()
        _check_device(source)
        _check_device(target, target=True)
        mapping[source] = target
    return lambda location: mapping.get(location, location)


DEVICE_KINDS = frozenset({"cpu", "cuda", "mps", "xpu", "meta", "hpu", "mtia", "npu", "xla"})
PLUGIN_DEVICES = ("npu",)
"""Devices torch.load restores only through their plugin (torch_npu names its backend ``npu``)."""


def _check_device(text: str, *, target: bool = False) -> None:
    """A device of a mapping; a target must be a location tag torch.load restores (``cpu:0`` is none)."""
    kind, _, index = text.partition(":")
    if kind not in DEVICE_KINDS or (index and not _device_index(index)):
        raise BadArgument(f"not a device: {text!r} (expected cpu, cuda:N with N from 0 to {MAX_DEVICE_INDEX}, ...)")
    if target and kind not in PLUGIN_DEVICES and location_refused(text):
        raise BadArgument(
            f"torch.load cannot restore the location {text!r}: it restores cpu, meta, mps, and cuda, xpu, hpu or "
            "mtia alone or with :N"
        )


def _device_index(text: str) -> bool:
    """An index ``torch.device`` parses as itself: ASCII digits, no leading zero, at most 127."""
    digits = text.isascii() and text.isdigit() and (text == "0" or not text.startswith("0"))
    return digits and int(text) <= MAX_DEVICE_INDEX


def remap_devices(root: Any, spec: str) -> Result:
    """Rewrite the saved location tags; shared storages stay shared."""
    target = parse_device_map(spec)
    storages: dict[int, Storage] = {}
    examples: dict[tuple[str, str], None] = {}

    def convert(tensor: Tensor) -> Tensor | None:
        if tensor.sparse is not None or tensor.quantizer is not None:
            return _with_parts_moved(tensor, move)
        return move(tensor)

    def move(tensor: Tensor) -> Tensor | None:
        storage = tensor.storage
        if storage is None:
            return None
        new_location = target(storage.location)
        if new_location == storage.location:
            return None
        examples.setdefault((storage.location, new_location))
        new_storage = storages.get(id(storage))
        if new_storage is None:
            new_storage = storages[id(storage)] = dataclasses.replace(storage, location=new_location)
        return dataclasses.replace(tensor, storage=new_storage)

    new_root, changed = map_tensors(root, convert)
    if not changed:
        raise NothingChanges(f"no tensor changes device with {spec!r}: nothing to map")
    moves = ", ".join(f"{a} → {b}" for a, b in examples)
    return new_root, Change(f"map devices ({moves})", changed)


def _with_parts_moved(tensor: Tensor, move: Callable[[Tensor], Tensor | None]) -> Tensor | None:
    """A sparse or quantized tensor with ``move`` applied to its own storage and to its component tensors."""

    def moved(parts: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
        if parts is None:
            return None
        return tuple((move(p) or p) if isinstance(p, Tensor) else p for p in parts)

    sparse, quantizer = moved(tensor.sparse), moved(tensor.quantizer)
    base = move(tensor) or tensor
    if base is tensor and sparse == tensor.sparse and quantizer == tensor.quantizer:
        return None
    return dataclasses.replace(base, sparse=sparse, quantizer=quantizer)


def cast_dtype(name: str) -> str:
    """The dtype a cast name stands for: fp16/float16/half, bf16/bfloat16, fp32/float32/float."""
    dtype = CAST_NAMES.get(name.strip().lower().removeprefix("torch."))
    if dtype is None:
        raise EditError(
            f"cannot cast to {name!r}: choose fp16 (float16, half), bf16 (bfloat16) or fp32 (float32, float)"
        )
    return dtype


def cast_scope(root: Any, path: KeyPath | str | None = None) -> KeyPath:
    """What a cast applies to: ``None`` the model's weights (the detected state_dict, else everything),
    ``"all"`` everything, or the given path."""
    if path == "all":
        return ()
    if path is not None:
        assert not isinstance(path, str)
        return path
    if _is_module(root) or tensor_items(root) is not None:
        return ()
    inner = inner_state_dict(root)
    return inner if inner is not None else ()


def _castable(tensor: Tensor, dtype: str) -> bool:
    storage = tensor.storage
    return storage is not None and tensor.dtype in CASTABLE and tensor.dtype != dtype and storage.dtype == tensor.dtype


def cast(root: Any, dtype: str, path: KeyPath | str | None = None) -> Result:
    """Cast floating-point tensors (fp64/fp32/fp16/bf16) to ``dtype``; the bytes convert when saved.

    By default only the model's weights (the detected state_dict) are cast, not optimizer state;
    ``path`` names another subtree, or ``"all"`` everything.
    """
    # (the values wing is loaded by the edits that make values, not by every command that edits)
    from ckpt_tui.core.values.casting import CastSource

    dtype = cast_dtype(dtype)
    scope = cast_scope(root, path)
    chosen = {id(t) for _, t in iter_tensors(get(root, scope)) if _castable(t, dtype)}
    storages: dict[int, Storage] = {}
    examples: dict[tuple[str, str], None] = {}

    def convert(tensor: Tensor) -> Tensor | None:
        if id(tensor) not in chosen:
            return None
        storage = tensor.storage
        assert storage is not None
        if id(storage) not in storages:
            storages[id(storage)] = Storage(
                storage.key, dtype, storage.location, storage.numel, CastSource(storage), DTYPES[dtype][1] or ""
            )
        examples.setdefault((tensor.dtype, dtype))
        return dataclasses.replace(tensor, storage=storages[id(storage)], dtype=dtype)

    new_root, changed = _map_tensors_at(root, scope, convert)
    if not changed:
        already = sum(1 for _, t in iter_tensors(get(root, scope)) if t.dtype == dtype)
        if not already:
            raise EditError(f"no floating-point tensor in {_describe(scope)} to cast to {dtype}")
        # a cast to the dtype the weights have is asked for often (a script run twice): a no-op, said so
        note = f"every floating-point tensor there is already {dtype} ({counted(already, 'tensor')}): nothing to cast"
        return root, Change(f"cast the tensors of {_describe(scope)} to {dtype}", 0, notes=[note])
    casts = ", ".join(f"{a} → {b}" for a, b in examples)
    change = Change(f"cast the tensors of {_describe(scope)} ({casts})", changed)
    if scope:
        outside = [(p, t) for p, t in iter_tensors(root) if p[: len(scope)] != scope and _castable(t, dtype)]
        others = len({id(t) for _, t in outside} - chosen)
        if others:
            change.notes.append(f"{others} floating-point tensors elsewhere (optimizer state, ...) keep their dtype")
        same = [p for p, t in outside if id(t) in chosen]
        if same:
            change.notes.append(
                f"{counted(len(same), 'tensor')} elsewhere ({to_python(same[0])}"
                f"{', ...' if len(same) > 1 else ''}) saved as the same tensor as one cast: "
                f"{'it keeps its' if len(same) == 1 else 'they keep their'} dtype, written apart from the cast one"
            )
    return new_root, change


def _map_tensors_at(root: Any, scope: KeyPath, convert: Callable[[Tensor], Tensor | None]) -> tuple[Any, int]:
    """``convert`` applied to the tensors the containers under ``scope`` hold, each tensor once: a tensor
    object the file also holds in a container elsewhere (``ema = dict(model)``, optimizer state holding a
    weight) stays as it was there. A container itself held elsewhere too is one object, edited once."""
    if not scope:
        return map_tensors(root, convert)
    holders: dict[int, Any] = {}
    seen: set[int] = set()
    stack = [get(root, scope)]
    while stack:
        node = stack.pop()
        if id(node) in seen or not is_container(node):
            continue
        seen.add(id(node))
        for kid in kids(node):
            if isinstance(kid, Tensor):
                holders[id(node)] = node
            elif is_container(kid):
                stack.append(kid)
    if not holders or not all(isinstance(h, (dict, list)) for h in holders.values()):
        # (the scope is a tensor, or tensors held by tuples or objects: converted wherever they are held)
        return map_tensors(root, convert)
    done: dict[int, Tensor | None] = {}

    def version(value: Any) -> Any:
        if not isinstance(value, Tensor):
            return value
        if id(value) not in done:
            done[id(value)] = convert(value)
        return done[id(value)] or value

    def edit(items: Items) -> Items:
        return [(key, version(value)) for key, value in items]

    rebuilt = rebuild(root, containers=dict.fromkeys(holders, edit))
    changed = sum(1 for new in done.values() if new is not None)
    return (rebuilt.root, changed) if changed else (root, 0)
