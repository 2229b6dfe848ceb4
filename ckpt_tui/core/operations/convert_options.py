"""What ``convert`` is asked to do (:class:`ConvertOptions`, written back as arguments by
:meth:`ConvertOptions.argv`) and where a fixed copy goes (:func:`fixed_output_path`): what a printed fix
command needs, without the pipeline of :mod:`ckpt_tui.core.operations.convert` (``info`` prints fixes,
and imports only this)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ckpt_tui.core.errors import EditError
from ckpt_tui.core.model import byte_source
from ckpt_tui.core.model.keypath import KeyPath, key_text
from ckpt_tui.core.runtime.shell import join_command, option, path_arg

if TYPE_CHECKING:
    from ckpt_tui.core.edits.tree_edits import RenameRule

FIXED_SUFFIXES = (".json", ".index", ".safetensors", ".bin", ".pth", ".pt", ".ckpt", ".tar", ".pkl")


@dataclass
class ConvertOptions:
    """The edits asked for on the command line."""

    extract: str | None = None
    drop: list[str] = field(default_factory=list)
    drop_keys: list[str] = field(default_factory=list)
    rename: list[str] = field(default_factory=list)
    strip_prefix: str | None = None
    rename_rules: list[RenameRule] = field(default_factory=list)
    rename_map: str | None = None
    add_prefix: str | None = None
    at: str | None = None
    map_location: str | None = None
    dtype: str | None = None
    sanitize: bool = False
    """Rewrite what torch.load(weights_only=True) refuses as plain data (``--drop`` then reaches inside objects)."""

    @classmethod
    def from_pairs(cls, pairs: list[tuple[str, str]]) -> ConvertOptions:
        """The options a list of ``(option, argument)`` states (a finding's fix, a suggestion), as the CLI
        would read them."""
        options = cls()
        for name, argument in pairs:
            attribute = EDIT_OPTIONS.get(name)
            if attribute is None:
                raise EditError(f"{name} is not a convert edit")
            value = getattr(options, attribute)
            if attribute == "rename_rules":
                from ckpt_tui.core.edits.tree_edits import RenameRule

                value.append(RenameRule.parse(argument, anywhere=name == "--rename-infix"))
            elif isinstance(value, list):
                value.append(argument)
            else:
                setattr(options, attribute, argument)
        return options

    def argv(self) -> list[str]:
        """The ``convert`` arguments that ask for exactly these edits (unquoted; see ``core.shell``)."""
        out: list[str] = []
        for name, attribute in EDIT_OPTIONS.items():
            value = getattr(self, attribute)
            if attribute == "rename_rules":
                # both rule options share the field: each rule names its own option, in the rules' order
                if name == "--rename-prefix":
                    out += [word for rule in value for word in option(rule.option, rule.spec)]
            elif isinstance(value, list):
                out += [word for item in value for word in option(name, item)]
            elif value is not None:
                out += option(name, value)
        return out


EDIT_OPTIONS: dict[str, str] = {
    "--extract": "extract",
    "--drop": "drop",
    "--drop-keys": "drop_keys",
    "--rename": "rename",
    "--strip-prefix": "strip_prefix",
    "--rename-prefix": "rename_rules",
    "--rename-infix": "rename_rules",
    "--rename-map": "rename_map",
    "--add-prefix": "add_prefix",
    "--at": "at",
    "--map-location": "map_location",
    "--dtype": "dtype",
}
"""Each ``convert`` edit option and the :class:`ConvertOptions` field it sets, in the order
:meth:`ConvertOptions.argv` writes them (the order :func:`apply_options` applies them in)."""


def path_text(path: KeyPath) -> str:
    """A key path in the ``/`` form :func:`resolve_path` reads back."""
    return "/".join(key_text(key) for key in path)


def fixed_output_path(source: str, directory: str | None = None, tag: str = "fixed") -> str:
    """A new file name for a fixed copy of ``source``: ``NAME.fixed.pth`` (``.safetensors`` for a
    safetensors input; another ``tag`` for another variant) beside it (or in ``directory``), numbered
    past any file that exists, never the input."""
    normalized = os.path.normpath(source)
    if directory is None:
        # a remote checkpoint's copy is written here, in the current folder
        directory = "" if byte_source.is_remote(source) else os.path.dirname(normalized)
    name = os.path.basename(normalized) or "checkpoint"
    suffix = ".safetensors" if name.endswith(".safetensors") else ".pth"
    stem = name
    while any(stem.endswith(s) and len(stem) > len(s) for s in FIXED_SUFFIXES):
        stem = stem[: stem.rindex(".")]
    for number in range(1, 10_000):
        candidate = os.path.join(directory, f"{stem}.{tag}{'' if number == 1 else f'-{number}'}{suffix}")
        if not os.path.lexists(candidate) and not _same_file(candidate, source):
            return candidate
    raise EditError("no free output name")


def convert_command(path: str, options: ConvertOptions) -> str:
    """``ckpt-tui convert PATH --output NEW options``, quoted for the shell: the one way both faces print a
    fix. The new file lies beside the input, named ``.sanitized`` when sanitizing is all it does, ``.fixed``
    otherwise (:func:`fixed_output_path`)."""
    only_sanitize = options == ConvertOptions(sanitize=True)
    output = fixed_output_path(path, tag="sanitized" if only_sanitize else "fixed")
    extra = [*(["--sanitize"] if options.sanitize else []), *options.argv()]
    return join_command(["ckpt-tui", "convert", path_arg(path), *option("--output", path_arg(output)), *extra])


def _same_file(a: str, b: str) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)
