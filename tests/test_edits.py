"""Edits on hostile and real trees: cycles kept, never followed forever; ``auto`` strips only wrapper
prefixes and is a no-op with a note when there is nothing to do; casts aim at the model's weights."""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from builders import (
    ddp_state_dict,
    ghost_module,
    lightning_checkpoint,
    save_cuda_tagged,
    tiny_state_dict,
    training_checkpoint,
)
from torch import nn

from ckpt_tui.cli import main
from ckpt_tui.core.edits import tree_edits as edits
from ckpt_tui.core.errors import EditError
from ckpt_tui.core.model.tree import Opaque, Storage, Tensor, opaque_class
from ckpt_tui.core.operations.convert import ConvertOptions, apply_options, resolve_path
from ckpt_tui.core.readers.open import open_checkpoint


def cyclic_checkpoint() -> dict[str, Any]:
    """A DDP state_dict, a dict holding itself, a list inside itself that also holds the state_dict."""
    state = ddp_state_dict()
    meta: dict[str, Any] = {"name": "run"}
    meta["self"] = meta
    loop: list[Any] = []
    loop.append(loop)
    loop.append(state)
    meta["loop"] = loop
    return {"model": state, "meta": meta}


EDITS = {
    "map-location": ["--map-location", "cpu"],
    "dtype": ["--dtype", "fp16"],
    "dtype everywhere": ["--dtype", "half", "--at", "/"],
    "strip-prefix": ["--strip-prefix", "module."],
    "strip-prefix auto": ["--strip-prefix", "auto"],
    "add-prefix": ["--add-prefix", "net."],
    "rename": ["--rename", "model=weights"],
    "rename rules": ["--rename-prefix", "module.head.=module.classifier."],
    "drop": ["--drop", "meta/name"],
    "drop-keys": ["--drop-keys", "*.bn.*"],
}


@pytest.mark.parametrize("name", list(EDITS))
def test_every_edit_keeps_cycles_in_the_output(tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    source = save_cuda_tagged(cyclic_checkpoint(), tmp_path / "cyclic.pth")
    out = tmp_path / "out.pth"
    assert main(["convert", str(source), "-o", str(out), *EDITS[name]]) == 0, capsys.readouterr().err
    loaded = torch.load(out, weights_only=False, map_location="cpu")
    meta = loaded["meta"]
    assert meta["self"] is meta
    assert meta["loop"][0] is meta["loop"]
    weights = loaded.get("model", loaded.get("weights"))
    assert meta["loop"][1] is weights  # still one object, edited once
    if name.startswith("dtype"):
        assert all(t.dtype == torch.float16 for t in weights.values() if t.is_floating_point())


def test_a_self_containing_state_dict_is_edited_once(tmp_path: Path) -> None:
    state: OrderedDict[str, Any] = ddp_state_dict()
    state["module.me"] = state
    torch.save(state, tmp_path / "self.pth")
    root = open_checkpoint(tmp_path / "self.pth").root
    new, change = edits.strip_prefix(root, "module.", ())
    assert change.count == len(state)
    assert new["me"] is new and "conv.weight" in new


def fake_tensor(numel: int = 4) -> Tensor:
    return Tensor(Storage("0", "float32", "cuda:0", numel), 0, (numel,), (1,), "float32")


def test_cycles_through_opaque_args_state_items_and_lists() -> None:
    thing = opaque_class("somepkg.Thing")()
    tensor = fake_tensor()
    thing.args = ([thing, tensor],)  # what a pickle can build: the object appended to its own args' list
    thing.state = {"me": thing, "weight": tensor}
    thing.items = {"again": thing}
    thing.list_items = [thing]
    root = {"model": {"w": tensor}, "obj": thing}
    new, change = edits.remap_devices(root, "cpu")
    assert change.count == 1
    copy = new["obj"]
    assert isinstance(copy, Opaque) and copy is not thing
    assert copy.args[0][0] is copy
    assert copy.state["me"] is copy and copy.items["again"] is copy and copy.list_items[0] is copy
    assert copy.state["weight"] is new["model"]["w"] and new["model"]["w"].device == "cpu"
    assert thing.state["weight"].device == "cuda:0"  # the input is never modified
    cast, _ = edits.cast(new, "bf16", "all")
    assert cast["obj"].args[0][1].dtype == "bfloat16" and cast["obj"].args[0][0] is cast["obj"]


def test_a_tuple_inside_a_list_inside_the_tuple() -> None:
    tensor = fake_tensor()
    holder: list[Any] = []
    pair = (holder, tensor)
    holder.append(pair)
    new, changed = edits.map_tensors({"t": pair}, lambda t: Tensor(None, 0, t.shape, t.stride, "float16"))
    assert changed == 1
    assert new["t"][0][0] is new["t"] and new["t"][1].dtype == "float16"


def test_a_module_containing_itself_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    model._modules["again"] = model
    torch.save(model, tmp_path / "loop.pt")
    root = open_checkpoint(tmp_path / "loop.pt").root
    with pytest.raises(EditError, match="contains itself"):
        edits.extract(root, "auto")
    assert main(["convert", str(tmp_path / "loop.pt"), "-o", str(tmp_path / "o.pth"), "--extract", "auto"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ckpt-tui: ") and err.count("\n") == 1 and "contains itself" in err


def test_shared_submodules_with_exponentially_many_paths_are_refused(tmp_path: Path) -> None:
    leaf = nn.Linear(1, 1)
    for _ in range(60):
        parent = nn.Module()
        parent.a = leaf
        parent.b = leaf
        leaf = parent
    torch.save(leaf, tmp_path / "dag.pt")
    root = open_checkpoint(tmp_path / "dag.pt").root
    with pytest.raises(EditError, match="million"):
        edits.extract(root, ())


# ---- auto ---------------------------------------------------------------------------------


def mobilenet_like() -> OrderedDict[str, torch.Tensor]:
    """Every key under ``features.``: a real submodule (as in a published MobileNet's backbone)."""
    torch.manual_seed(0)
    model = nn.Module()
    model.features = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 1))
    return model.state_dict()


def test_strip_prefix_auto_keeps_a_real_module_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(mobilenet_like(), tmp_path / "mobilenet.pth")
    out = tmp_path / "out.pth"
    assert main(["convert", str(tmp_path / "mobilenet.pth"), "-o", str(out), "--strip-prefix", "auto"]) == 0
    printed = capsys.readouterr().out
    assert "note: --strip-prefix auto: no wrapper prefix" in printed and "'features.'" in printed
    assert list(torch.load(out)) == list(mobilenet_like())
    root = open_checkpoint(tmp_path / "mobilenet.pth").root
    with pytest.raises(EditError) as error:
        edits.strip_prefix(root, "auto")  # what the browser's strip key asks for
    assert "features." in str(error.value) and "--" not in str(error.value)
    assert next(iter(edits.strip_prefix(root, "features.")[0])) == "0.weight"  # named: stripped


def test_auto_model_prefix_only_in_a_lightning_layout() -> None:
    lightning = lightning_checkpoint()
    assert edits.wrapper_prefix_at(lightning, ("state_dict",)) == "model."
    plain = {"model." + k: v for k, v in tiny_state_dict().items()}
    assert edits.wrapper_prefix_at(plain, ()) == ""


def test_wrapper_stacks() -> None:
    compiled_ddp = nn.DataParallel(torch.compile(nn.Linear(2, 2))).state_dict()
    assert edits.wrapper_prefix_at(compiled_ddp, ()) == "module._orig_mod."
    ddp_compiled = torch.compile(nn.DataParallel(nn.Linear(2, 2))).state_dict()
    assert edits.wrapper_prefix_at(ddp_compiled, ()) == "_orig_mod.module."


def test_auto_edits_run_over_a_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = {
        "flat": tiny_state_dict(),
        "ddp": ddp_state_dict(),
        "features": mobilenet_like(),
        "train": training_checkpoint(),
        "lightning": lightning_checkpoint(),
    }
    expected = {"flat": "conv.weight", "ddp": "conv.weight", "features": "features.0.weight"}
    expected |= {"train": "conv.weight", "lightning": "conv.weight"}
    for name, obj in files.items():
        torch.save(obj, tmp_path / f"{name}.pth")
        out = tmp_path / f"{name}.out.pth"
        argv = ["convert", str(tmp_path / f"{name}.pth"), "-o", str(out), "--extract", "auto", "--strip-prefix", "auto"]
        assert main(argv) == 0, (name, capsys.readouterr().err)
        assert next(iter(torch.load(out))) == expected[name], name
    printed = capsys.readouterr().out
    assert "note: --extract auto: the file already is a flat state_dict" in printed


# ---- cast ---------------------------------------------------------------------------------


def test_dtype_casts_the_model_not_the_optimizer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(training_checkpoint(), tmp_path / "train.pth")
    out = tmp_path / "half.pth"
    assert main(["convert", str(tmp_path / "train.pth"), "-o", str(out), "--dtype", "half"]) == 0
    assert "floating-point tensors elsewhere (optimizer state, ...) keep their dtype" in capsys.readouterr().out
    loaded = torch.load(out, weights_only=False)
    assert loaded["model"]["module.conv.weight"].dtype == torch.float16
    assert loaded["optimizer"]["state"][0]["exp_avg"].dtype == torch.float32
    everything = tmp_path / "all.pth"
    assert main(["convert", str(tmp_path / "train.pth"), "-o", str(everything), "--dtype", "bf16", "--at", "/"]) == 0
    assert torch.load(everything, weights_only=False)["optimizer"]["state"][0]["exp_avg"].dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("alias", "dtype"),
    [
        ("fp16", "float16"),
        ("float16", "float16"),
        ("half", "float16"),
        ("bf16", "bfloat16"),
        ("bfloat16", "bfloat16"),
        ("fp32", "float32"),
        ("float32", "float32"),
        ("float", "float32"),
    ],
)
def test_cast_aliases(alias: str, dtype: str) -> None:
    assert edits.cast_dtype(alias) == dtype


def test_bad_dtype_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(tiny_state_dict(), tmp_path / "a.pth")
    with pytest.raises(SystemExit) as exit_info:
        main(["convert", str(tmp_path / "a.pth"), "-o", str(tmp_path / "b.pth"), "--dtype", "int8"])
    assert exit_info.value.code == 2
    assert "fp16" in capsys.readouterr().err


# ---- paths and keys -----------------------------------------------------------------------


def test_resolve_path_with_slashes_in_keys() -> None:
    root = {"/abs": {"a/b": 1, "a": {"b": 2}}, "x": [10, {"y": 3}]}
    assert resolve_path(root, "/abs/a/b") == ("/abs", "a/b")
    assert resolve_path(root, "x/1/y") == ("x", 1, "y")
    assert resolve_path(root, "") == ()
    with pytest.raises(EditError):
        resolve_path(root, "nothing")


def test_drop_keys_by_glob(tmp_path: Path) -> None:
    torch.save(tiny_state_dict(), tmp_path / "a.pth")
    root = open_checkpoint(tmp_path / "a.pth").root
    new, change = edits.drop_keys(root, ["bn.*"])
    assert change.count == 5 and list(new) == ["conv.weight", "conv.bias", "head.weight", "head.bias"]
    assert edits.glob_escape("a[*]?") == "a[[][*][]][?]"
    with pytest.raises(EditError):
        edits.drop_keys(root, ["nothing.*"])


def test_rename_options_round_trip_through_argv() -> None:
    options = ConvertOptions(
        extract="-odd",
        drop=["a/b"],
        drop_keys=["*.lora_A.*"],
        strip_prefix="module.",
        rename_rules=[edits.RenameRule("x.", "y."), edits.RenameRule("attn", "", anywhere=True)],
        add_prefix="-x.",
        at="/",
        dtype="float16",
    )
    from ckpt_tui.cli import build_parser

    args = build_parser().parse_args(["convert", "f.pth", "-o", "o.pth", *options.argv()])
    assert args.extract == "-odd" and args.add_prefix == "-x." and args.at == "/"
    assert args.rename_rules == options.rename_rules and args.drop_keys == ["*.lora_A.*"]


def test_apply_options_reports_notes_not_errors_for_auto(tmp_path: Path) -> None:
    torch.save(tiny_state_dict(), tmp_path / "a.pth")
    root = open_checkpoint(tmp_path / "a.pth").root
    _, changes, notes = apply_options(root, ConvertOptions(extract="auto", strip_prefix="auto"))
    assert not changes and len(notes) == 2
    assert json.dumps(notes)  # plain strings


def test_ghost_objects_in_cycles_stay_refused_on_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with ghost_module() as module:

        class Thing:
            pass

        Thing.__module__ = module.__name__
        Thing.__qualname__ = "Thing"
        module.Thing = Thing  # type: ignore[attr-defined]
        thing = Thing()
        thing.me = thing  # type: ignore[attr-defined]
        thing.weight = torch.ones(2)  # type: ignore[attr-defined]
        torch.save({"model": tiny_state_dict(), "obj": thing}, tmp_path / "ghost.pth")
    assert "ghost_models" not in sys.modules
    code = main(["convert", str(tmp_path / "ghost.pth"), "-o", str(tmp_path / "o.pth"), "--dtype", "fp16", "--at", "/"])
    assert code == 2 and "unsafe" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "ghost.pth"), "-o", str(tmp_path / "o.pth"), "--drop", "obj"]) == 0


def test_extracting_a_self_containing_subtree_keeps_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "cyclic.pth"
    torch.save(cyclic_checkpoint(), source)
    out = tmp_path / "meta.pth"
    assert main(["convert", str(source), "-o", str(out), "--extract", "meta"]) == 0, capsys.readouterr().err
    meta = torch.load(out, weights_only=False)
    assert meta["self"] is meta and meta["loop"][0] is meta["loop"]


def test_strips_cleanly_only_when_every_key_has_more_than_the_prefix() -> None:
    """info prints the strip command without a dry run only when the strip cannot fail."""
    from ckpt_tui.core.edits.tree_edits import strip_prefix, strips_cleanly
    from ckpt_tui.core.model.tree import Tensor

    one = Tensor(None, 0, (1,), (1,), "float32")
    assert strips_cleanly({"module.a": one, "module.b": one}, "module.")
    assert strip_prefix({"module.a": one, "module.b": one}, "module.")[1].count == 2
    assert not strips_cleanly({"module.a": one, "module.": one}, "module.")  # a key that is the prefix stays
    assert not strips_cleanly({"module.a": one, "b": one}, "module.")
    assert not strips_cleanly({"module.a": one, 3: one}, "module.")
    assert not strips_cleanly({"module.a": one}, "auto")
    assert not strips_cleanly({"model": {"module.a": one}}, "module.")
