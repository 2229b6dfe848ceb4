"""``convert``: the fixed pipeline of edits, then save.

The edits apply in this order, whatever the order on the command line:

1. ``--extract PATH|auto``   make a subtree the root (a pickled module becomes its state_dict)
2. ``--drop PATH``...        delete keys or subtrees
3. ``--drop-keys GLOB``...   delete the state_dict's keys that match a glob
4. ``--rename OLD=NEW``...   rename one key (a path)
5. ``--strip-prefix P|auto`` remove a key prefix (auto: wrapper prefixes only)
6. ``--rename-prefix OLD=NEW``, ``--rename-infix OLD=NEW``, ``--rename-map FILE``: rename rules, in
   the order given (the map file's last), each applied to the result of the previous
7. ``--add-prefix P``        put a prefix in front of every key
8. ``--map-location SPEC``   rewrite the saved device tags
9. ``--dtype fp16|bf16|fp32`` cast floating-point tensors (the model's weights unless ``--at``)

Steps 3 and 5-7 (and 9) apply to the dict ``--at PATH`` names, by default the detected state_dict.
:meth:`ConvertOptions.argv` writes options back as arguments, so a suggested fix is printed as
exactly the options this pipeline applies.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpt_tui.core.conventions.state_dicts import inner_state_dict
from ckpt_tui.core.edits import tree_edits as edits
from ckpt_tui.core.edits import unmatched
from ckpt_tui.core.edits.tree_edits import Change, RenameRule
from ckpt_tui.core.errors import BadArgument, EditError, NoSuchKey, NothingChanges, ReadError, WriteError
from ckpt_tui.core.model import byte_source
from ckpt_tui.core.model.describe import counted
from ckpt_tui.core.model.keypath import KeyPath, key_text, to_python
from ckpt_tui.core.model.tree import Checkpoint, Opaque, child, children, get, iter_tensors
from ckpt_tui.core.operations.convert_options import EDIT_OPTIONS as EDIT_OPTIONS  # where callers find them
from ckpt_tui.core.operations.convert_options import ConvertOptions
from ckpt_tui.core.operations.convert_options import fixed_output_path as fixed_output_path
from ckpt_tui.core.operations.convert_options import path_text as path_text
from ckpt_tui.core.readers.open import open_checkpoint

if TYPE_CHECKING:  # the writer imports numpy: loaded only when a file is written
    from ckpt_tui.core.writers.hf_shards import ShardedResult
    from ckpt_tui.core.writers.save import WriteResult

RENAME_MAP_LIMIT = 16 * 1024 * 1024


@dataclass
class ConvertOutcome:
    """The changes made, notes on ``auto`` edits that had nothing to do, and what was written (None: dry run)."""

    changes: list[Change]
    result: WriteResult | None
    notes: list[str] = field(default_factory=list)


def resolve_path(root: Any, text: str) -> KeyPath:
    """A ``/``-separated path resolved against the tree. Keys may themselves hold ``/`` (the longest
    name that is a key wins), and a key may start or end with one; empty parts are separators. The Python
    form every message shows (``ckpt["model"]["fc.weight"]``, ``ckpt["state"][0]``) is read as well."""
    keys = python_keys(text)
    if keys is not None:
        return _resolve_keys(root, keys)
    parts = text.split("/")
    path: list[Any] = []
    value = root
    index = 0
    while index < len(parts):
        for end in range(len(parts), index, -1):
            key = _match_key(value, "/".join(parts[index:end]))
            if key is not None:
                path.append(key)
                value = child(value, key)
                index = end
                break
        else:
            if parts[index] == "":
                index += 1
                continue
            raise NoSuchKey(no_key_message(value, parts[index], tuple(path)))
    return tuple(path)


def python_keys(text: str) -> list[Any] | None:
    """The keys of a path written as Python from ``ckpt`` (``ckpt["model"][0].name``, ``ckpt[None]``,
    ``ckpt[(1, 2)]``), None when ``text`` is not one (a ``/`` path). Each key is read as a literal, never
    evaluated."""
    if not text.startswith(("ckpt[", "ckpt.")):
        return None
    import ast

    try:
        node = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return None
    keys: list[Any] = []
    while not isinstance(node, ast.Name):
        if isinstance(node, ast.Subscript):
            try:
                keys.append(ast.literal_eval(node.slice))
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                return None
            node = node.value
        elif isinstance(node, ast.Attribute):
            keys.append(node.attr)
            node = node.value
        else:
            return None
    return keys[::-1] if node.id == "ckpt" else None


def _resolve_keys(root: Any, keys: list[Any]) -> KeyPath:
    path: list[Any] = []
    value = root
    for key in keys:
        if isinstance(key, str):
            found = _match_key(value, key)
        elif isinstance(key, int) and not isinstance(key, bool):
            found = _match_index(value, key)
        else:
            found = _match_literal(value, key)
        # (a None key found is the key None: only the sentinel says no key matched)
        if found is _NO_KEY or (found is None and key is not None):
            raise NoSuchKey(no_key_message(value, repr(key) if not isinstance(key, str) else key, tuple(path)))
        path.append(found)
        value = child(value, found)
    return tuple(path)


_NO_KEY = object()
"""What :func:`_match_literal` gives when no key matches (``None`` is a key it can find)."""


def _match_literal(value: Any, key: Any) -> Any:
    """A dict's key equal to ``key`` and of its type (``None``, ``True``, ``0.5``, ``b'x'``, ``(1, 2)``): ``True``
    does not name the key ``1``."""
    if not isinstance(value, (dict, Opaque)):
        return _NO_KEY
    return next((k for k, _ in children(value) if type(k) is type(key) and _same(k, key)), _NO_KEY)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # a key object whose comparison fails is not the key asked for
        return False


def _match_index(value: Any, index: int) -> Any:
    if isinstance(value, dict) and index in value:
        return index
    if isinstance(value, (list, tuple)) and 0 <= index < len(value):
        return index
    return _match_key(value, str(index))


KEYS_SHOWN = 10
"""The keys a "no key" error lists (then "… N more")."""


def no_key_message(value: Any, name: str, path: KeyPath) -> str:
    """``no key 'model' at the root; did you mean 'model_state_dict'? keys there: epoch, …``: the way forward."""
    where = to_python(path) if path else "the root"
    keys = [key_text(key) for key, _ in children(value)] if isinstance(value, (dict, list, tuple, Opaque)) else []
    if not keys:
        return f"no key {name!r} at {where}: it holds no keys"
    import difflib  # (an error path: not imported by every command that names a fix)

    # a misspelling, else a key that holds the name (model → model_state_dict)
    close = difflib.get_close_matches(name, keys, n=1, cutoff=0.6) or [key for key in keys if name in key][:1]
    meant = f" (did you mean {close[0]!r}?)" if close else ""
    shown = ", ".join(keys[:KEYS_SHOWN]) + (f", … {len(keys) - KEYS_SHOWN} more" if len(keys) > KEYS_SHOWN else "")
    return f"no key {name!r} at {where}{meant}; keys there: {shown}"


def _prefix_rename_hint(root: Any, old: str, new: str) -> str:
    """``no key 'fc' at the root: to rename every key that starts with 'fc.', use --rename-prefix fc.=head.``:
    the option a ``--rename`` of a module's name (no key of its own, the start of others) means; else ""."""
    keys = [key_text(key) for key, _ in children(root)] if isinstance(root, (dict, Opaque)) else []
    start = old if old.endswith(".") else old + "."
    if "/" in old or not any(key.startswith(start) for key in keys):
        return ""
    rule = f"{start}={new}{'' if new.endswith('.') else '.'}"
    return f"no key {old!r} at the root: to rename every key that starts with {start!r}, use --rename-prefix {rule}"


def resolve_option_path(root: Any, text: str, option_name: str) -> KeyPath:
    """A path given to a read-only option (``check --at``, ``diff --at-a``): a path that is not in the
    file is a bad argument (exit 2), not a finding."""
    try:
        return resolve_path(root, text)
    except EditError as exc:
        raise ReadError(f"{option_name} {text!r}: {exc}") from None


def _match_key(value: Any, name: str) -> Any:
    if isinstance(value, dict) and name in value:
        return name
    for key, _ in children(value) if isinstance(value, (dict, list, tuple, Opaque)) else []:
        if key_text(key) == name:
            return key
    return None


def read_rename_map(path: str) -> list[RenameRule]:
    """A rename-map file: a JSON object ``{"old.prefix.": "new.prefix.", ...}``, applied in order."""
    data = byte_source.read_small(path, RENAME_MAP_LIMIT, "the rename map is over 16 MB")
    try:
        mapping = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ReadError(f"{path}: not a JSON rename map ({type(exc).__name__})") from None
    if not isinstance(mapping, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
        raise ReadError(f'{path}: a rename map is one JSON object of strings, {{"old.": "new."}}')
    if not mapping or "" in mapping:
        raise ReadError(f"{path}: the rename map has no rules, or an empty prefix")
    return [RenameRule(old, new) for old, new in mapping.items()]


def apply_options(root: Any, options: ConvertOptions) -> tuple[Any, list[Change], list[str]]:
    """Apply the edits in their documented order; return the tree, the changes and notes on
    ``auto`` edits that had nothing to do (a no-op, not an error, so batches can run)."""
    lightning = _is_lightning_state_dict(root, options.extract)
    edit = _Edits(root, options)
    edit.extract()
    edit.drop()
    edit.rename()
    edit.strip_prefix(lightning)
    edit.rename_rules_and_add_prefix()
    edit.devices_and_dtype()
    return edit.root, edit.changes, edit.notes


class _Edits:
    """The tree while :func:`apply_options` edits it, one phase a method, with the changes and notes so far."""

    def __init__(self, root: Any, options: ConvertOptions) -> None:
        self.root = root
        self.options = options
        self.changes: list[Change] = []
        self.notes: list[str] = []

    def run(self, edit: Callable[..., tuple[Any, Change]], *args: Any) -> None:
        """Keep an edit's tree and change; an edit with nothing to do is a note (as in the browser), and a
        change of nothing (a cast to the dtype the tensors have) too."""
        try:
            root, change = edit(*args)
        except NothingChanges as exc:
            self.notes.append(f"nothing changes: {exc}")
            return
        if change.count == 0:
            self.notes.append("nothing changes: " + "; ".join([f"{change.title}: 0 changed", *change.notes]))
            return
        self.root = root
        self.changes.append(change)

    def named(
        self, message: Callable[[list[str], str], str], edit: Callable[..., tuple[Any, Change]], *args: Any
    ) -> None:
        """An edit of keys the user named: one that changes nothing is a mistake (a typo), refused in one line
        that ``message`` words from the edited dict's keys and its name; nothing is written."""
        try:
            root, change = edit(*args)
        except NothingChanges:
            root, change = self.root, Change("", 0)
        if change.count == 0:
            where = self.at()
            where = edits.default_target(self.root) if where is None else where
            target = get(self.root, where)
            keys = [k for k in target if isinstance(k, str)] if isinstance(target, dict) else []
            raise NoSuchKey(message(keys, to_python(where) if where else "the root"))
        self.root = root
        self.changes.append(change)

    def at(self) -> KeyPath | None:
        """The dict ``--at`` names in the tree as it is now (None: the detected state_dict)."""
        return resolve_path(self.root, self.options.at) if self.options.at is not None else None

    def extract(self) -> None:
        """``--extract``: a subtree becomes the root (auto on a flat state_dict: a note)."""
        extract = self.options.extract
        if extract == "auto" and edits.is_flat_state_dict(self.root):
            self.notes.append("--extract auto: the file already is a flat state_dict; nothing to extract")
        elif extract:
            target = "auto" if extract == "auto" else resolve_path(self.root, extract)
            self.run(edits.extract, self.root, target)

    def drop(self) -> None:
        """``--sanitize`` (which drops what ``--drop`` names itself), else ``--drop``; then ``--drop-keys``."""
        options = self.options
        if options.sanitize:
            from ckpt_tui.core.edits.sanitize import sanitize

            # a sanitized file is asked for even when nothing needs rewriting: its save verifies it loads
            self.root, change = sanitize(self.root, [resolve_path(self.root, path) for path in options.drop])
            self.changes.append(change)
        for path in [] if options.sanitize else options.drop:
            self.run(edits.delete, self.root, resolve_path(self.root, path))
        if options.drop_keys:
            globs = ", ".join(map(repr, options.drop_keys))
            try:
                self.run(edits.drop_keys, self.root, options.drop_keys, self.at())
            except NoSuchKey:
                raise
            except EditError as exc:
                if "matches" not in str(exc):
                    raise
                raise NoSuchKey(f"--drop-keys {globs}: {exc}; nothing written") from None

    def rename(self) -> None:
        """``--rename OLD=NEW``, one path each."""
        for spec in self.options.rename:
            old, sep, new = spec.rpartition("=")
            if not sep or not old or not new:
                raise BadArgument(f"--rename takes OLD=NEW, got {spec!r}")
            same = f"--rename {spec!r}: the key already has that name; nothing written"

            def said(keys: list[str], where: str, same: str = same) -> str:
                return same

            try:
                path = resolve_path(self.root, old)
            except EditError as exc:
                raise type(exc)(_prefix_rename_hint(self.root, old, new) or str(exc)) from None
            self.named(said, edits.rename, self.root, path, new)

    def strip_prefix(self, lightning: bool) -> None:
        """``--strip-prefix`` (auto with no wrapper prefix: a note)."""
        strip = self.options.strip_prefix
        if strip == "auto":
            where = self.at()
            where = edits.default_target(self.root) if where is None else where
            if edits.wrapper_prefix_at(self.root, where, lightning or None):
                self.run(edits.strip_prefix, self.root, "auto", where, lightning or None)
            else:
                self.notes.append(
                    "--strip-prefix auto: " + edits.no_wrapper_message(self.root, where) + "; nothing stripped"
                )
        elif strip:
            self.named(
                lambda keys, where: unmatched.no_prefix("--strip-prefix", strip, keys, where),
                edits.strip_prefix,
                self.root,
                strip,
                self.at(),
            )

    def rename_rules_and_add_prefix(self) -> None:
        """``--rename-prefix``/``--rename-infix`` in their order, then ``--rename-map``; then ``--add-prefix``."""
        options = self.options
        rules = [*options.rename_rules, *(read_rename_map(options.rename_map) if options.rename_map else [])]
        if options.rename_rules:
            # each rule typed on the command line must move a key; a map's rules may cover other files' keys
            where = self.at()
            where = edits.default_target(self.root) if where is None else where
            target = get(self.root, where)
            keys = [k for k in target if isinstance(k, str)] if isinstance(target, dict) else []
            idle = unmatched.idle_rule(options.rename_rules, keys)
            if idle is not None:
                raise NoSuchKey(unmatched.no_rule_match(idle[0], idle[1], to_python(where) if where else "the root"))
        if rules:
            source = options.rename_map
            its_prefixes = "its prefix" if len(rules) == 1 else f"any of its {counted(len(rules), 'prefix')}"
            self.named(
                lambda keys, where: (
                    f"--rename-map {source!r}: no key of {where} starts with {its_prefixes}; nothing written"
                ),
                edits.rename_keys_by_rules,
                self.root,
                rules,
                self.at(),
            )
        if options.add_prefix:
            self.run(edits.add_prefix, self.root, options.add_prefix, self.at())

    def devices_and_dtype(self) -> None:
        """``--map-location``, then ``--dtype``."""
        if self.options.map_location:
            self.run(edits.remap_devices, self.root, self.options.map_location)
        if self.options.dtype:
            self.run(edits.cast, self.root, self.options.dtype, self.at())


def _is_lightning_state_dict(root: Any, extract: str | None) -> bool:
    """Whether the keys edited after ``extract`` are a Lightning checkpoint's ``state_dict``."""
    from ckpt_tui.core.conventions.layouts import is_lightning_checkpoint

    if not extract or not is_lightning_checkpoint(root):
        return False
    if extract == "auto":
        return inner_state_dict(root) == ("state_dict",)
    return extract.strip("/") == "state_dict"


TORCHSCRIPT_WHOLE = (
    "a TorchScript archive's module objects cannot be written as a checkpoint; use --extract auto for its weights"
)


def convert(
    path: str | list[str],
    options: ConvertOptions,
    output: str | None,
    fmt: str | None = None,
    *,
    force: bool = False,
    dry_run: bool = False,
) -> ConvertOutcome:
    """Read, edit, and (unless dry) save with verification."""
    checkpoint = open_checkpoint(path)
    refused = checkpoint.unwritable()
    if refused and not dry_run and output is not None:
        raise WriteError(refused)
    writes_modules = not (options.extract or options.sanitize or dry_run or output is None)
    if checkpoint.format == "torchscript" and writes_modules:  # --sanitize replaces the module objects
        raise WriteError(TORCHSCRIPT_WHOLE)
    root, changes, notes = apply_options(checkpoint.root, options)
    if dry_run or output is None:
        # what a run with -o would refuse is said now, not found out after the dry run looked fine
        return ConvertOutcome(changes, None, [*notes, *([f"writing it is refused: {refused}"] if refused else [])])
    within_budget(checkpoint.path, root)
    from ckpt_tui.core.writers.save import save

    # edits that all had nothing to do still write -o OUT, as a verified re-save: a script that runs the
    # same command over many files gets every output, and the notes say nothing changed
    check = loads_with_weights_only if options.sanitize else None
    result = save(
        root,
        output,
        fmt,
        byteorder=checkpoint.byteorder,
        force=force,
        inputs=tuple(checkpoint.input_files()),
        metadata=checkpoint.metadata,
        check=check,
    )
    if options.dtype:
        from ckpt_tui.core.values.casting import cast_losses

        # what a narrower dtype could not hold (fp16 past ±65504, below 6e-8) is said, never written silently
        lost = cast_losses(root)
        if lost is not None:
            notes.append(lost)
    return ConvertOutcome(changes, result, notes)


def convert_to_shards(
    path: str | list[str], options: ConvertOptions, output: str, max_size: str
) -> tuple[list[Change], list[str], ShardedResult]:
    """``convert … --max-shard-size SIZE -o DIR``: open, apply the edits, write the shards (changes, notes, result)."""
    # the writers load only for a command that writes: info and check, which name fixes, never do
    from ckpt_tui.core.writers.hf_shards import parse_size, save_hf_shards
    from ckpt_tui.core.writers.target import check_folder_target

    limit = parse_size(max_size)
    # the folder is checked before the work of reading and writing
    check_folder_target(output)
    checkpoint = open_checkpoint(path)
    if checkpoint.byteorder != "little":
        raise WriteError("big-endian checkpoints cannot be written as safetensors")
    root, changes, notes = apply_options(checkpoint.root, options)
    within_budget(checkpoint.path, root)
    # as save_pretrained does: the model's config beside the shards, so from_pretrained reads the folder
    configs = model_configs(path)
    if not configs:
        notes.append(
            "no Hugging Face config.json beside the source: from_pretrained on the output needs the model's "
            "config.json copied in (save_pretrained writes it beside the shards)"
        )
    return changes, notes, save_hf_shards(root, output, limit, configs)


def within_budget(path: str, root: Any) -> None:
    """Refuse up front, in one line, writing a remote checkpoint whose values are past ``--max-download``."""
    if byte_source.is_remote(path):
        from ckpt_tui.core.model.remote import ensure_values_budget

        ensure_values_budget(path, (tensor for _, tensor in iter_tensors(root)), "convert (it copies every tensor)")


HF_CONFIGS = ("config.json", "generation_config.json")
"""The files ``save_pretrained`` writes beside a model's weights, which ``from_pretrained`` reads."""


def model_configs(source: str | list[str]) -> list[str]:
    """The Hugging Face config files in the source's folder (the folder itself, or the file's), when its
    ``config.json`` is one (a JSON object naming ``model_type`` or ``architectures``): never another
    project's config.json."""
    if not isinstance(source, str) or "://" in source:
        return []
    folder = source if os.path.isdir(source) else os.path.dirname(source) or "."
    config = os.path.join(folder, HF_CONFIGS[0])
    try:
        with open(config, encoding="utf-8") as file:
            parsed = json.loads(file.read(1 << 20))
    except (OSError, ValueError, RecursionError):  # (nested past the parser's depth: no config to copy)
        return []
    if not isinstance(parsed, dict) or not ({"model_type", "architectures"} & set(parsed)):
        return []
    return [os.path.join(folder, name) for name in HF_CONFIGS if os.path.isfile(os.path.join(folder, name))]


def select(
    checkpoint: Checkpoint, at: str | None, strip_prefix: str | None, side: str, at_option: str | None = None
) -> Checkpoint:
    """The checkpoint narrowed to the subtree ``at`` (a module becomes its state_dict), with
    ``strip_prefix`` removed from its state_dict's keys: one side of ``diff --at-a/--strip-prefix-a``.
    ``at_option`` names the option in errors (default ``--at-SIDE``)."""
    root = checkpoint.root
    at_option = at_option or f"--at-{side}"
    if at:
        where = resolve_option_path(root, at, at_option)
        value = get(root, where)
        try:
            root = edits.extract(root, where)[0] if where or _is_module(value) else value
        except EditError as exc:
            raise ReadError(f"{at_option} {at!r}: {exc}") from None
    if strip_prefix:
        try:
            root = edits.strip_prefix(root, strip_prefix)[0]
        except EditError as exc:
            raise ReadError(f"--strip-prefix-{side} {strip_prefix!r}: {exc}") from None
    return dataclasses.replace(checkpoint, root=root)


def _is_module(value: Any) -> bool:
    return isinstance(value, Opaque) and value.is_module


def loads_with_weights_only(path: Path) -> str:
    """Refuse a written file that ``torch.load(weights_only=True)`` would still refuse (emulated, nothing run)."""
    from ckpt_tui.core.weights_only.verdict import verdict

    judged = verdict(open_checkpoint(path))
    if judged.loads is False:
        what = "not surely load" if judged.answer == "cannot_tell" else "still be refused"
        raise WriteError(f"the sanitized file would {what}: {judged.headline()}; nothing was replaced")
    return "torch.load(weights_only=True) accepts it (emulated)"
