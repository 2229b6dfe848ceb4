"""convert: every edit, both formats, checked by loading the result with torch or safetensors."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from builders import (
    Payload,
    TinyNet,
    compiled_state_dict,
    ddp_state_dict,
    lightning_checkpoint,
    many_keys,
    save_cuda_tagged,
    save_whole_module,
    tiny_state_dict,
    touch_command,
    training_checkpoint,
    write_safetensors,
)
from safetensors import safe_open
from safetensors.torch import load_file

from ckpt_tui.cli import main
from ckpt_tui.core.edits.tree_edits import parse_device_map
from ckpt_tui.core.operations.info import summarize
from ckpt_tui.core.readers.open import open_checkpoint

consume_prefix = torch.nn.modules.utils.consume_prefix_in_state_dict_if_present


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def convert(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["convert", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_same(loaded: dict, expected: dict, ordered: bool = True) -> None:
    """Same keys (in the same order, unless the format sorts them), dtypes and values."""
    assert (list(loaded) if ordered else sorted(loaded)) == (list(expected) if ordered else sorted(expected))
    for key, value in expected.items():
        assert loaded[key].dtype == value.dtype, key
        assert torch.equal(loaded[key], value), key


@pytest.mark.parametrize(
    ("builder", "prefix"),
    [(ddp_state_dict, "module."), (compiled_state_dict, "_orig_mod.")],
)
def test_strip_prefix_pth_matches_torch(tmp_path: Path, capsys, builder, prefix: str) -> None:
    source = tmp_path / "in.pth"
    torch.save(builder(), source)
    before = digest(source)
    code, out, _ = convert(capsys, source, "-o", tmp_path / "out.pth", "--strip-prefix", "auto")
    assert code == 0 and "verified" in out
    loaded = torch.load(tmp_path / "out.pth", weights_only=True)
    expected = builder()
    consume_prefix(expected, prefix)
    assert isinstance(loaded, OrderedDict)
    assert_same(loaded, expected)
    assert loaded._metadata == expected._metadata
    assert digest(source) == before


def test_training_checkpoint_extract_strip_drop(tmp_path: Path, capsys) -> None:
    source = tmp_path / "train.pth"
    ckpt = training_checkpoint()
    torch.save(ckpt, source)
    code, _, _ = convert(capsys, source, "-o", tmp_path / "w.pth", "--extract", "auto", "--strip-prefix", "module.")
    assert code == 0
    expected = ckpt["model"]
    consume_prefix(expected, "module.")
    assert_same(torch.load(tmp_path / "w.pth", weights_only=True), expected)
    code, _, _ = convert(capsys, source, "-o", tmp_path / "slim.pth", "--drop", "optimizer", "--drop", "scheduler")
    assert code == 0
    slim = torch.load(tmp_path / "slim.pth", weights_only=False)
    assert list(slim) == ["epoch", "model", "args"]
    assert slim["args"].lr == 1e-3


def test_a_path_is_taken_in_the_python_form_messages_show_as_well_as_with_slashes(tmp_path: Path, capsys) -> None:
    source = tmp_path / "train.pth"
    ckpt = training_checkpoint()
    torch.save(ckpt, source)
    dropped = 'ckpt["optimizer"]["state"][0]'
    code, _, _ = convert(capsys, source, "-o", tmp_path / "a.pth", "--extract", "ckpt['model']")
    assert code == 0
    assert_same(torch.load(tmp_path / "a.pth", weights_only=True), ckpt["model"])
    code, _, _ = convert(capsys, source, "-o", tmp_path / "b.pth", "--drop", dropped, "--drop", "ckpt.scheduler")
    assert code == 0
    written = torch.load(tmp_path / "b.pth", weights_only=False)
    assert 0 not in written["optimizer"]["state"] and 1 in written["optimizer"]["state"] and "scheduler" not in written
    code, _, err = convert(capsys, source, "-o", tmp_path / "c.pth", "--drop", 'ckpt["model"]["nope"]')
    assert code == 2 and "no key 'nope' at ckpt[\"model\"]" in err and not (tmp_path / "c.pth").exists()


def test_lightning_extract_and_strip(tmp_path: Path, capsys) -> None:
    torch.save(lightning_checkpoint(), tmp_path / "l.ckpt")
    code, _, _ = convert(
        capsys,
        tmp_path / "l.ckpt",
        "-o",
        tmp_path / "m.safetensors",
        "--extract",
        "state_dict",
        "--strip-prefix",
        "model.",
    )
    assert code == 0
    assert_same(load_file(tmp_path / "m.safetensors"), dict(tiny_state_dict()), ordered=False)


def test_add_prefix_and_rename(tmp_path: Path, capsys) -> None:
    torch.save(tiny_state_dict(), tmp_path / "plain.pth")
    code, _, _ = convert(capsys, tmp_path / "plain.pth", "-o", tmp_path / "ddp.pth", "--add-prefix", "module.")
    assert code == 0
    loaded = torch.load(tmp_path / "ddp.pth", weights_only=True)
    assert_same(loaded, ddp_state_dict())
    torch.nn.DataParallel(TinyNet()).load_state_dict(loaded)  # strict: every key fits the real wrapper
    code, _, _ = convert(capsys, tmp_path / "plain.pth", "-o", tmp_path / "r.pth", "--rename", "head.weight=fc.weight")
    assert code == 0
    keys = list(torch.load(tmp_path / "r.pth", weights_only=True))
    assert keys == [k.replace("head.weight", "fc.weight") for k in tiny_state_dict()]


def test_rename_collision_refused(tmp_path: Path, capsys) -> None:
    state = ddp_state_dict()
    state["conv.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / "mixed.pth")
    code, _, err = convert(capsys, tmp_path / "mixed.pth", "-o", tmp_path / "x.pth", "--strip-prefix", "module.")
    assert code == 1
    assert "'module.conv.weight'" in err and "'conv.weight'" in err
    assert not (tmp_path / "x.pth").exists()


def test_an_edit_with_nothing_to_do_is_a_note_exit_0_and_the_file_written_as_it_is(tmp_path: Path, capsys) -> None:
    torch.save(tiny_state_dict(), tmp_path / "plain.pth")
    for edit in (["--strip-prefix", "auto"], ["--map-location", "cpu"], ["--dtype", "fp32"]):
        code, out, err = convert(capsys, tmp_path / "plain.pth", "-o", tmp_path / "x.pth", *edit, "--force")
        assert code == 0 and not err and ("note: nothing changes: " in out or "nothing stripped" in out), edit
        assert "no edits: the checkpoint is written as it is" in out, edit
        assert set(torch.load(tmp_path / "x.pth")) == set(tiny_state_dict()), edit
    # a no-op beside an edit that changes something: the note, and the file with that change
    code, out, _ = convert(
        capsys, tmp_path / "plain.pth", "-o", tmp_path / "x.pth", "--map-location", "cpu", "--dtype", "fp16", "--force"
    )
    assert code == 0 and "nothing to map" in out
    assert {t.dtype for t in torch.load(tmp_path / "x.pth").values() if t.is_floating_point()} == {torch.float16}
    # to another format, the file is written all the same
    code, out, _ = convert(capsys, tmp_path / "plain.pth", "-o", tmp_path / "x.safetensors", "--dtype", "fp32")
    assert code == 0 and (tmp_path / "x.safetensors").exists()


def test_cuda_tagged_remapped_to_cpu_loads_without_map_location(tmp_path: Path, capsys) -> None:
    source = save_cuda_tagged(training_checkpoint(), tmp_path / "gpu.pth")
    code, _, _ = convert(capsys, source, "-o", tmp_path / "cpu.pth", "--map-location", "cpu")
    assert code == 0
    loaded = torch.load(tmp_path / "cpu.pth", weights_only=False)
    assert loaded["model"]["module.head.weight"].device.type == "cpu"
    code, _, _ = convert(capsys, tmp_path / "cpu.pth", "-o", tmp_path / "cuda1.pth", "--map-location", "cuda:1")
    assert code == 0
    devices = summarize(open_checkpoint(tmp_path / "cuda1.pth")).devices
    assert set(devices) == {"cuda:1"}
    code, _, _ = convert(capsys, source, "-o", tmp_path / "m.pth", "--map-location", "cuda:0=cuda:3")
    assert set(summarize(open_checkpoint(tmp_path / "m.pth")).devices) == {"cuda:3"}


def test_cast_pth_and_safetensors(tmp_path: Path, capsys) -> None:
    state = tiny_state_dict()
    torch.save(state, tmp_path / "f32.pth")
    for dtype, torch_dtype in (("float16", torch.float16), ("bfloat16", torch.bfloat16)):
        for suffix in ("pth", "safetensors"):
            out = tmp_path / f"{dtype}.{suffix}"
            assert convert(capsys, tmp_path / "f32.pth", "-o", out, "--dtype", dtype)[0] == 0
            loaded = load_file(out) if suffix == "safetensors" else torch.load(out, weights_only=True)
            expected = {k: v.to(torch_dtype) if v.is_floating_point() else v for k, v in state.items()}
            assert_same(loaded, expected, ordered=suffix == "pth")


def test_tied_weights_stay_shared_in_pth(tmp_path: Path, capsys) -> None:
    weight = torch.randn(5, 3)
    torch.save(
        {"module.embed.weight": weight, "module.lm_head.weight": weight, "module.t": weight.t()}, tmp_path / "t.pth"
    )
    assert convert(capsys, tmp_path / "t.pth", "-o", tmp_path / "o.pth", "--strip-prefix", "module.")[0] == 0
    loaded = torch.load(tmp_path / "o.pth", weights_only=True)
    assert loaded["embed.weight"].data_ptr() == loaded["lm_head.weight"].data_ptr()
    assert loaded["t"].untyped_storage().data_ptr() == loaded["embed.weight"].untyped_storage().data_ptr()
    assert torch.equal(loaded["t"], weight.t())


def test_tied_weights_in_safetensors_recorded_as_alias(tmp_path: Path, capsys) -> None:
    weight = torch.randn(5, 3)
    torch.save({"embed.weight": weight, "lm_head.weight": weight}, tmp_path / "t.pth")
    code, out, _ = convert(capsys, tmp_path / "t.pth", "-o", tmp_path / "o.safetensors")
    # the success line says which names torch.load of the output will not return
    assert code == 0 and "tied weights stored once (lm_head.weight = embed.weight" in out
    assert list(torch.load(tmp_path / "o.safetensors")) == ["embed.weight"]
    with safe_open(tmp_path / "o.safetensors", "pt") as handle:
        assert list(handle.keys()) == ["embed.weight"]
        assert handle.metadata() == {"format": "pt", "lm_head.weight": "embed.weight"}
        assert torch.equal(handle.get_tensor("embed.weight"), weight)
    torch.save({"w": weight, "wt": weight.t()}, tmp_path / "views.pth")
    code, _, err = convert(capsys, tmp_path / "views.pth", "-o", tmp_path / "v.safetensors")
    assert code == 2 and "share memory" in err and not (tmp_path / "v.safetensors").exists()


def test_nested_to_safetensors_suggests_extract(tmp_path: Path, capsys) -> None:
    torch.save(training_checkpoint(), tmp_path / "t.pth")
    code, _, err = convert(capsys, tmp_path / "t.pth", "-o", tmp_path / "t.safetensors")
    assert code == 2 and "--extract" in err
    assert not list(tmp_path.glob("*.safetensors")) and not list(tmp_path.glob(".*.tmp"))


def test_legacy_and_safetensors_inputs_to_pth(tmp_path: Path, capsys) -> None:
    state = tiny_state_dict()
    torch.save(state, tmp_path / "old.pth", _use_new_zipfile_serialization=False)
    assert convert(capsys, tmp_path / "old.pth", "-o", tmp_path / "new.pth")[0] == 0
    assert_same(torch.load(tmp_path / "new.pth", weights_only=True), state)
    bf = {"a": torch.randn(4, 4).to(torch.bfloat16), "b": torch.arange(6)}
    write_safetensors(bf, tmp_path / "in.safetensors")
    assert convert(capsys, tmp_path / "in.safetensors", "-o", tmp_path / "st.pth")[0] == 0
    assert_same(torch.load(tmp_path / "st.pth", weights_only=True), bf)


def test_whole_module_extracted_as_state_dict(tmp_path: Path, capsys) -> None:
    path = save_whole_module(tmp_path / "whole.pt")
    code, _, err = convert(capsys, path, "-o", tmp_path / "x.pth")
    assert code == 2 and "ghost_models.GhostNet" in err
    assert convert(capsys, path, "-o", tmp_path / "sd.pth", "--extract", "auto")[0] == 0
    loaded = torch.load(tmp_path / "sd.pth", weights_only=True)
    assert list(loaded) == ["scale", "encoder.0.weight", "encoder.0.bias", "head.weight", "head.bias"]


def test_unsafe_global_dropped_then_written(tmp_path: Path, capsys) -> None:
    canary = tmp_path / "CANARY"
    ckpt = training_checkpoint()
    ckpt["hook"] = Payload(os.system, touch_command(canary))
    torch.save(ckpt, tmp_path / "evil.pth")
    code, _, err = convert(capsys, tmp_path / "evil.pth", "-o", tmp_path / "out.pth")
    assert code == 2 and "posix.system" in err and not (tmp_path / "out.pth").exists()
    assert convert(capsys, tmp_path / "evil.pth", "-o", tmp_path / "out.pth", "--drop", "hook")[0] == 0
    torch.load(tmp_path / "out.pth", weights_only=False)
    assert not canary.exists()


def test_existing_target_and_input_need_force(tmp_path: Path, capsys) -> None:
    source = tmp_path / "in.pth"
    torch.save(ddp_state_dict(), source)
    before = digest(source)
    (tmp_path / "taken.pth").write_bytes(b"keep me")
    code, _, err = convert(capsys, source, "-o", tmp_path / "taken.pth", "--strip-prefix", "auto")
    assert code == 2 and "--force" in err and (tmp_path / "taken.pth").read_bytes() == b"keep me"
    code, _, err = convert(capsys, source, "-o", source, "--strip-prefix", "auto")
    assert code == 2 and "input" in err and digest(source) == before
    assert convert(capsys, source, "-o", source, "--strip-prefix", "auto", "--force")[0] == 0
    assert next(iter(torch.load(source, weights_only=True))) == "conv.weight"


def test_dry_run_writes_nothing(tmp_path: Path, capsys) -> None:
    torch.save(ddp_state_dict(), tmp_path / "in.pth")
    code, out, _ = convert(capsys, tmp_path / "in.pth", "--dry-run", "--strip-prefix", "auto", "-o", tmp_path / "o.pth")
    assert code == 0 and "module.conv.weight → conv.weight" in out and "9 changed" in out
    assert not (tmp_path / "o.pth").exists()


def test_output_in_a_missing_folder_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    torch.save(ddp_state_dict(), tmp_path / "in.pth")
    code, _, err = convert(capsys, tmp_path / "in.pth", "-o", tmp_path / "missing" / "o.pth")
    assert code == 2 and "no such directory" in err


def test_many_records_zip64_and_debug_offsets(tmp_path: Path, capsys) -> None:
    state = many_keys(70_000)
    torch.save(state, tmp_path / "many.pth")
    assert convert(capsys, tmp_path / "many.pth", "-o", tmp_path / "out.pth", "--add-prefix", "module.")[0] == 0
    code = (
        "import torch, sys; sd = torch.load(sys.argv[1], weights_only=True, mmap=True); "
        "assert len(sd) == 70000 and float(sd['module.layers.17499.p3'][0]) == 69999.0; "
        "assert all(t.untyped_storage().data_ptr() % 64 == 0 for t in list(sd.values())[:100])"
    )
    env = {**os.environ, "TORCH_SERIALIZATION_DEBUG": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "out.pth")], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_cast_out_of_range_gives_inf_as_torch_does_and_prints_no_warning(tmp_path: Path) -> None:
    import subprocess
    import sys

    torch.save({"a": torch.tensor([1e30, -1e30, 1.0]), "b": torch.randn(3).bfloat16()}, tmp_path / "m.pth")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ckpt_tui",
            "convert",
            str(tmp_path / "m.pth"),
            "-o",
            str(tmp_path / "h.pth"),
            "--dtype",
            "fp16",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and done.stderr == ""
    assert torch.equal(torch.load(tmp_path / "h.pth", weights_only=True)["a"], torch.tensor([1e30, -1e30, 1.0]).half())


def test_a_pth_with_numpy_arrays_is_written_and_said_to_need_allowing(tmp_path: Path, capsys) -> None:
    """numpy arrays are data (written as they are), but torch.load(weights_only=True) refuses them:
    the line says so and names --sanitize, which writes a file that loads."""
    import numpy as np

    source = tmp_path / "sevenn_like.pth"
    torch.save({"model": {"w": torch.ones(2)}, "cutoff": np.array([5.0], dtype=np.float32)}, source)
    assert main(["convert", str(source), "-o", str(tmp_path / "out.pth")]) == 0
    printed = capsys.readouterr().out
    assert "torch.load(weights_only=True) refuses it: it holds numpy." in printed and "_reconstruct" in printed
    assert "--sanitize rewrites them as plain data" in printed
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(tmp_path / "out.pth", weights_only=True)
    assert main(["convert", str(source), "-o", str(tmp_path / "clean.pth"), "--sanitize"]) == 0
    assert "refuses it" not in capsys.readouterr().out
    assert torch.equal(torch.load(tmp_path / "clean.pth", weights_only=True)["model"]["w"], torch.ones(2))


def test_an_omegaconf_object_is_refused_with_what_to_do(tmp_path: Path, capsys) -> None:
    from omegaconf import OmegaConf

    source = tmp_path / "lightning_like.ckpt"
    torch.save({"state_dict": {"w": torch.ones(2)}, "hparams": OmegaConf.create({"lr": 0.1})}, source)
    assert main(["convert", str(source), "-o", str(tmp_path / "out.pth")]) == 2
    err = capsys.readouterr().err
    assert "refusing to write the unsafe global omegaconf" in err and "--sanitize rewrites data objects" in err
    assert not (tmp_path / "out.pth").exists()


def test_device_tags_left_out_of_a_safetensors_file_are_said(tmp_path: Path, capsys) -> None:
    """safetensors stores no device: converting lpips' cuda:0-tagged weights says the tags are not kept."""
    source = save_cuda_tagged({"a.weight": torch.ones(2), "b.weight": torch.zeros(3)}, tmp_path / "gpu.pth")
    assert main(["convert", str(source), "-o", str(tmp_path / "out.safetensors")]) == 0
    out = capsys.readouterr().out
    assert "left out (safetensors holds tensor values only): the device tag cuda:0 of 'a.weight', 'b.weight'" in out
    assert load_file(tmp_path / "out.safetensors")["b.weight"].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "option",
    [
        ["--map-location", "cuda:99999999999999999999"],
        ["--map-location", "cuda:128"],
        ["--map-location", "cuda:01"],
        ["--map-location", "cuda:-1"],
        ["--map-location", "cpu=cpu=cpu"],
        # location tags torch.load cannot restore: written, the file would load nowhere
        ["--map-location", "cpu:0"],
        ["--map-location", "meta:0"],
        ["--map-location", "xla:0"],
        ["--map-location", "cuda:0=cpu:1"],
        ["--rename", "="],
        ["--rename-infix", "="],
    ],
)
def test_a_malformed_edit_argument_is_a_bad_argument(tmp_path: Path, capsys, option: list[str]) -> None:
    # exit 2 (bad argument), never 1 ("the edit does not apply"), and no output, whatever the file
    torch.save({"w": torch.arange(4.0)}, tmp_path / "ok.pth")
    try:
        code, _, err = convert(capsys, tmp_path / "ok.pth", "-o", tmp_path / "x.pth", *option)
    except SystemExit as exc:  # refused by the option parser itself
        code, err = exc.code, capsys.readouterr().err
    assert code == 2 and err.strip().count("\n") == 0, err
    assert not (tmp_path / "x.pth").exists()


@pytest.mark.parametrize("index", [0, 1, 127])
def test_a_device_index_torch_parses_is_written_as_given(index: int) -> None:
    # torch keeps an index in 8 bits: 127 is the last that loads as itself
    assert str(torch.device(f"cuda:{index}")) == f"cuda:{index}"
    assert str(torch.device("cuda:128")) != "cuda:128"
    assert parse_device_map(f"cuda:{index}")("cpu") == f"cuda:{index}"


@pytest.mark.parametrize("target", ["cpu", "meta", "cuda", "cuda:3", "xpu:1", "hpu", "mtia:0", "mps"])
def test_every_location_a_map_may_write_is_one_torch_load_restores(target: str) -> None:
    # the reader's own rule for the tags torch.load restores, run on what a map writes
    from ckpt_tui.core.pickles.persistent_ids import location_refused

    assert parse_device_map(f"cpu={target}")("cpu") == target
    assert not location_refused(target)


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (["--strip-prefix", "foo."], "--strip-prefix 'foo.': no key of the root starts with 'foo.'; nothing written"),
        (["--strip-prefix", "moduel."], "starts with 'moduel.' (did you mean 'module.'?); nothing written"),
        (["--strip-prefix", "module"], "stripping 'module' leaves keys that start with '.' (did you mean 'module.'?)"),
        (["--rename-prefix", "foo.=bar."], "--rename-prefix 'foo.=bar.': no key of the root starts with 'foo.'"),
        (["--rename-infix", "hed=head"], "no key of the root has the component 'hed' (did you mean 'head'?)"),
        (["--drop-keys", "*.nothere"], "--drop-keys '*.nothere': no key of the root matches '*.nothere'"),
    ],
)
def test_a_key_edit_named_by_hand_that_matches_nothing_is_refused_in_one_line(
    tmp_path: Path, capsys, edit: list[str], said: str
) -> None:
    """A typo'd prefix used to write an unchanged copy and exit 0; --drop of a missing key already said so, exit 2."""
    torch.save(ddp_state_dict(), tmp_path / "ddp.pth")
    code, out, err = convert(capsys, tmp_path / "ddp.pth", "-o", tmp_path / "x.pth", *edit)
    assert code == 2 and said in err and err.count("\n") == 1 and not out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ddp.pth"]


def test_each_rename_rule_named_by_hand_must_move_a_key(tmp_path: Path, capsys) -> None:
    torch.save(ddp_state_dict(), tmp_path / "ddp.pth")
    argv = ["--rename-prefix", "module.=net.", "--rename-prefix", "modul.=x."]
    code, _, err = convert(capsys, tmp_path / "ddp.pth", "-o", tmp_path / "x.pth", *argv)
    # the second rule sees the keys the first made: nothing of it is left, and it is named
    assert code == 2 and "--rename-prefix 'modul.=x.': no key of the root starts with 'modul.'" in err
    assert not (tmp_path / "x.pth").exists()
    code, _, _ = convert(capsys, tmp_path / "ddp.pth", "-o", tmp_path / "x.pth", "--rename-prefix", "module.=net.")
    assert code == 0 and all(k.startswith("net.") for k in torch.load(tmp_path / "x.pth", weights_only=True))
