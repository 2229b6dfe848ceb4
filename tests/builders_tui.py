"""Files for the browser's tests, built with real torch, and helpers to drive the browser with Pilot.

``fixed_training_checkpoint`` holds fixed tensors (no training step), so every value it shows is the
same on every CPU: the snapshots depend on it.
"""

from __future__ import annotations

import argparse
import io
import sys
import types
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from builders import TinyNet, rewrite_zip, save_cuda_tagged
from rich.console import Console
from torch import nn

from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.screens.browser import BrowserScreen
from ckpt_tui.tui.widgets.tree_view import CheckpointTree, NodeData

MARKUP_VALUES = {
    "path": "[/data/imagenet]",
    "click": "[@click=app.screenshot('pwned.svg')]click me[/]",
    "bold": "[b]not bold[/b]",
    "escape": "red\x1b[31mRED\x07\x9b2J",
    "osc": "\x1b]52;c;cHduZWQ=\x07title",
    "bidi": "abc\u202edcba",
}


def fixed(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, start: float = -1.0) -> torch.Tensor:
    """A tensor of evenly spaced values (the same bytes on every machine)."""
    count = 1
    for size in shape:
        count *= size
    if dtype.is_floating_point:
        return torch.linspace(start, 1.0, count, dtype=torch.float64).to(dtype).reshape(shape)
    return torch.arange(count, dtype=dtype).reshape(shape)


def fixed_state_dict(prefix: str = "module.") -> OrderedDict[str, torch.Tensor]:
    """TinyNet's state_dict layout (keys, shapes, ``_metadata``) with fixed values, keys under ``prefix``."""
    template = TinyNet().state_dict()
    state: OrderedDict[str, torch.Tensor] = OrderedDict(
        (prefix + key, fixed(tuple(value.shape), value.dtype)) for key, value in template.items()
    )
    metadata = template._metadata  # type: ignore[attr-defined]
    state._metadata = OrderedDict(  # type: ignore[attr-defined]
        ((prefix.rstrip(".") + ("." + name if name else "")) if prefix else name, value)
        for name, value in metadata.items()
    )
    return state


def fixed_training_checkpoint() -> dict[str, Any]:
    """A DDP training checkpoint as ``torch.save`` writes it, with fixed tensors instead of trained ones."""
    model = fixed_state_dict()
    parameters = [key for key in model if "running" not in key and "num_batches" not in key]
    state = {
        index: {
            "step": torch.tensor(1.0),
            "exp_avg": fixed(tuple(model[key].shape), start=-0.01),
            "exp_avg_sq": fixed(tuple(model[key].shape), start=0.0),
        }
        for index, key in enumerate(parameters)
    }
    optimizer = {
        "state": state,
        "param_groups": [
            {
                "lr": 1e-3,
                "betas": (0.9, 0.999),
                "eps": 1e-8,
                "weight_decay": 0,
                "amsgrad": False,
                "params": list(range(len(parameters))),
            }
        ],
    }
    scheduler = {"step_size": 5, "gamma": 0.1, "base_lrs": [1e-3], "last_epoch": 1, "_step_count": 2}
    return {
        "epoch": 3,
        "model": model,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "args": argparse.Namespace(lr=1e-3, arch="tiny"),
    }


def save_fixed_training(path: Path) -> Path:
    """The fixed training checkpoint, tagged as saved on ``cuda:0``."""
    return save_cuda_tagged(fixed_training_checkpoint(), path)


def encoder_state_dict(layers: int = 4) -> OrderedDict[str, torch.Tensor]:
    """A flat state_dict with nested modules: ``encoder.layers.N.{attn,mlp}.*`` and a ``head``."""
    state: OrderedDict[str, torch.Tensor] = OrderedDict()
    state["embed.weight"] = fixed((10, 4))
    for layer in range(layers):
        for part in ("attn.q", "attn.k", "mlp.fc"):
            state[f"encoder.layers.{layer}.{part}.weight"] = fixed((4, 4))
            state[f"encoder.layers.{layer}.{part}.bias"] = fixed((4,))
    state["head.weight"] = fixed((2, 4))
    state["head.bias"] = fixed((2,))
    metadata: OrderedDict[str, dict[str, int]] = OrderedDict([("", {"version": 1})])
    for layer in range(layers):
        metadata[f"encoder.layers.{layer}"] = {"version": 1}
    state._metadata = metadata  # type: ignore[attr-defined]
    return state


def layered_checkpoint(path: Path, count: int = 6) -> Path:
    """``count`` layers of fixed values and Adam-like state: layer 2 exploded (x50), layer 3 dead (all zero),
    layer 4 holds a NaN (the layers view's tests and screenshots)."""
    model: OrderedDict[str, torch.Tensor] = OrderedDict()
    for index in range(count):
        model[f"layers.{index}.weight"] = fixed((4, 4))
        model[f"layers.{index}.bias"] = fixed((4,), start=-0.5)
    model["layers.2.weight"] = fixed((4, 4)) * 50
    model["layers.3.weight"] = torch.zeros(4, 4)
    model["layers.4.weight"][0, 0] = float("nan")
    state = {i: {"exp_avg": fixed((4, 4)), "exp_avg_sq": fixed((4, 4), start=0.0)} for i in range(2 * count)}
    optimizer = {"state": state, "param_groups": [{"lr": 0.1, "params": list(range(2 * count))}]}
    torch.save({"model": model, "optimizer": optimizer, "epoch": 1}, path)
    return path


# ---- hostile files -------------------------------------------------------------------------


def markup_checkpoint() -> dict[str, Any]:
    """Keys and values that are Rich markup or terminal escapes; a tensor under each key."""
    state: dict[str, Any] = {}
    for name, text in MARKUP_VALUES.items():
        state[text] = torch.ones(2)
        state[f"value.{name}"] = text
    hidden = list(MARKUP_VALUES.values())[-1]
    state["nested"] = {"[red]inner[/red]": {"\x1b[8mhidden": hidden}}
    return state


EVIL_MODULE = "[@click=app.quit]evil\x1b[8m"
EVIL_CLASS = "Thing[/b]"


def save_hostile_names(path: Path) -> Path:
    """A checkpoint whose global names, location tags, keys and values carry markup and escapes.

    The global is written as a stand-in module and renamed in ``data.pkl`` afterwards (pickle itself
    refuses to name a module that cannot be imported).
    """
    stand_in = "ckpt_tui_test_stand_in"
    module = types.ModuleType(stand_in)
    sys.modules[stand_in] = module
    try:

        class Thing:
            def __init__(self, arg: str) -> None:
                self.arg = arg

            def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
                return Thing, (self.arg,)

        Thing.__module__ = stand_in
        Thing.__qualname__ = "Thing"
        module.Thing = Thing  # type: ignore[attr-defined]
        checkpoint = markup_checkpoint()
        checkpoint["object"] = Thing("[/data/imagenet] \x1b]0;title\x07")
        plain = path.with_name(path.name + ".plain")
        save_cuda_tagged(checkpoint, plain, device="cpu\x1b[8m[/]")
    finally:
        del sys.modules[stand_in]
    with zipfile.ZipFile(plain) as archive:
        pickled = next(archive.read(n) for n in archive.namelist() if n.endswith("/data.pkl"))
    renamed = pickled.replace(f"{stand_in}\nThing\n".encode(), f"{EVIL_MODULE}\n{EVIL_CLASS}\n".encode())
    assert renamed != pickled
    rewrite_zip(plain, path, data_pkl=renamed)
    plain.unlink()
    return path


class Shared(nn.Module):
    """A module whose two children are the same module: paths double at every level."""

    def __init__(self, child: nn.Module) -> None:
        super().__init__()
        self.left = child
        self.right = child


def save_shared_modules(path: Path, depth: int = 60) -> Path:
    """``torch.save`` of a module DAG with 2**depth paths (a few KB on disk)."""
    module: nn.Module = nn.Linear(2, 2)
    for _ in range(depth):
        module = Shared(module)
    torch.save(module, path)
    return path


def save_shared_lists(path: Path, depth: int = 60, keys: int = 200) -> Path:
    """A dict whose values are one list nested ``depth`` deep, each level holding the next twice."""
    level: list[Any] = [torch.zeros(1)]
    for _ in range(depth):
        level = [level, level]
    torch.save({f"k{i}": level for i in range(keys)}, path)
    return path


# ---- driving the browser ---------------------------------------------------------------------


async def loaded(pilot: Any) -> CheckpointTree:
    """Wait until the file is read and counted; the tree."""
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    return browser(pilot.app).tree_view


async def settle(pilot: Any, *keys: str) -> None:
    """Press keys, letting workers and the screen catch up after each."""
    for key in keys:
        await pilot.press(key)
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def browser(app: CkptApp) -> BrowserScreen:
    """The browser screen."""
    return app.browser


def cursor_data(app: CkptApp) -> NodeData:
    """What the cursor is on."""
    node = browser(app).tree_view.cursor_node
    assert node is not None and node.data is not None
    return node.data


def cursor_path(app: CkptApp) -> tuple[Any, ...]:
    """The key path under the cursor."""
    return cursor_data(app).path


def text_of(widget: Any) -> str:
    """What a Static shows, as plain text."""
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(widget.content)
    return console.export_text()


def status(app: CkptApp) -> str:
    """The status line."""
    return text_of(browser(app).query_one("#status"))


def detail(app: CkptApp) -> str:
    """The detail panel: metadata and stats."""
    screen = browser(app)
    parts = ("#detail-meta", "#detail-stats", "#detail-storage")
    return "".join(text_of(screen.query_one(part)) for part in parts)


def header(app: CkptApp) -> str:
    """The summary header."""
    return text_of(browser(app).query_one("#summary"))


def screen_text(app: CkptApp) -> str:
    """Everything on the terminal, as plain text (what a user reads; any raw control character kept)."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True, record=True)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()
