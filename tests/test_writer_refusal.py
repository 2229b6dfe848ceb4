"""Nothing unsafe is ever written: the emitter refuses what it would emit, and the written file is scanned again."""

from __future__ import annotations

import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
from builders_writer import (
    HOSTILE_PLACES,
    floats,
    global_op,
    hostile_source,
    payload,
    tensor_op,
    text,
    write_zip_checkpoint,
)
from safetensors.torch import load_file

from ckpt_tui.cli import main
from ckpt_tui.core.errors import ReadError, WriteError
from ckpt_tui.core.model.tree import Device, Layout, Storage, Symbol, Tensor, opaque_class
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.writers import pth as pth_writer
from ckpt_tui.core.writers import target as target_module
from ckpt_tui.core.writers.pickle_emitter import PickleWriter
from ckpt_tui.core.writers.save import save

WHERE = {
    "backward_hooks": 'ckpt["w"].backward_hooks["h"]',
    "tensor_metadata": 'ckpt["w"].metadata["m"]',
    "parameter_state": 'ckpt["p"].parameter_state["x"]',
    "_metadata": 'ckpt._metadata[""]["version"]',
    "opaque_args": "ckpt[\"ns\"]['args[0]']",
    "opaque_state": 'ckpt["ns"].lr',
    "tensor_state": 'ckpt["w"].python_state["x"]',
    "tensor_class": 'ckpt["w"].python_type',
    "metadata_not_a_dict": 'ckpt["w"].metadata',
    "empty_state_metadata": 'ckpt["p"].parameter_state._metadata["m"]',
    "opaque_from_type": 'ckpt["ns"].x',
}
LEFT_OUT_OF_SAFETENSORS = {
    "backward_hooks": "backward hooks of 'w'",
    "parameter_state": "Parameter state of 'p'",
    "_metadata": None,  # torch's own state_dict version record: every module's state_dict has one
    "tensor_state": "tensor attributes of 'w'",
    "tensor_class": "tensor subclass of 'w'",
    "empty_state_metadata": "Parameter state of 'p'",
}


def convert(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str]:
    code = main(["convert", *map(str, args)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("where", HOSTILE_PLACES)
def test_unsafe_global_outside_the_tree_walk_is_refused_with_its_place(tmp_path: Path, capsys, where: str) -> None:
    canary = tmp_path / "CANARY"
    source = hostile_source(where, f"touch {canary}", tmp_path)
    code, err = convert(capsys, source, "-o", tmp_path / "out.pth")
    assert code == 2 and f"refusing to write the unsafe global posix.system at {WHERE[where]}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [source.name]
    assert not canary.exists()


@pytest.mark.parametrize("where", HOSTILE_PLACES)
def test_safetensors_output_refuses_or_leaves_out_what_it_cannot_hold(tmp_path: Path, capsys, where: str) -> None:
    """safetensors holds tensor values only: hooks, Parameter state and ``_metadata`` are not written at all;
    tensor metadata that is not a conj/neg bit, and non-tensors, are refused."""
    source = hostile_source(where, "touch /nonexistent/x", tmp_path)
    code = main(["convert", str(source), "-o", str(tmp_path / "out.safetensors")])
    out = capsys.readouterr().out
    if where in LEFT_OUT_OF_SAFETENSORS:
        assert code == 0
        said = LEFT_OUT_OF_SAFETENSORS[where]
        assert (f"left out (safetensors holds tensor values only): {said}" in out) if said else "left out" not in out
        data = (tmp_path / "out.safetensors").read_bytes()
        assert b"posix" not in data and b"system" not in data
        assert next(iter(load_file(tmp_path / "out.safetensors").values())).tolist() == [0.0, 1.0, 2.0, 3.0]
    else:
        assert code == 2 and not (tmp_path / "out.safetensors").exists()


def test_the_hostile_sources_do_run_code_under_the_real_loader(tmp_path: Path) -> None:
    """The payloads above are real: torch.load(weights_only=False) runs every one of them."""
    sources = [hostile_source(where, f"touch {tmp_path / ('ran-' + where)}", tmp_path) for where in HOSTILE_PLACES]
    code = (
        "import sys, torch\n"
        "for p in sys.argv[1:]:\n"
        "    try: torch.load(p, weights_only=False)\n"
        "    except Exception: pass"
    )
    subprocess.run([sys.executable, "-c", code, *map(str, sources)], capture_output=True, timeout=300, check=False)
    assert sorted(p.name for p in tmp_path.glob("ran-*")) == sorted(f"ran-{where}" for where in HOSTILE_PLACES)


def test_dropping_the_part_that_holds_it_makes_the_write_possible(tmp_path: Path, capsys) -> None:
    source = hostile_source("opaque_args", "touch /nonexistent/x", tmp_path)
    assert convert(capsys, source, "-o", tmp_path / "out.pth", "--drop", "ns")[0] == 0
    assert open_checkpoint(tmp_path / "out.pth").unsafe_globals == set()


def test_a_layout_name_from_the_file_never_becomes_a_global(tmp_path: Path) -> None:
    data = b"\x80\x02}(" + text("layout") + global_op("torch.serialization._get_layout") + text("posix.system")
    data += b"\x85R" + text("w") + tensor_op() + b"u."
    path = write_zip_checkpoint(tmp_path / "layout.pth", data, {"0": floats(4)})
    with pytest.raises(ReadError, match="unknown tensor layout"):
        open_checkpoint(path)


def storage() -> Storage:
    return Storage("0", "float32", "cpu", 4)


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (opaque_class("posix.system"), "posix.system"),  # a bare global
        (opaque_class("argparse.Namespace", safe=True)(opaque_class("os.getcwd")), "os.getcwd"),  # in args
        (Symbol("posix.system"), "posix.system"),  # a constant that is not one
        (Layout("posix.system"), "posix.system"),
    ],
)
def test_the_emitter_refuses_every_global_it_does_not_know(value: object, named: str) -> None:
    with pytest.raises(WriteError, match=named):
        PickleWriter(lambda s: s.key).dump({"x": [1, {"y": value}]})


def test_an_unsafe_callee_or_reconstructed_class_is_refused() -> None:
    unsafe = opaque_class("subprocess.Popen")
    called = unsafe("ls")
    result = called()  # calling the result of a call: the callee is what would run
    with pytest.raises(WriteError, match=r"subprocess.Popen at ckpt\[\"r\"\].callee"):
        PickleWriter(lambda s: s.key).dump({"r": result})
    rebuilt = unsafe.__new__(unsafe)
    rebuilt.how, rebuilt.args = "reconstructor", (opaque_class("builtins.object", safe=True), None)
    with pytest.raises(WriteError, match=r"subprocess\.Popen"):
        PickleWriter(lambda s: s.key).dump({"r": rebuilt})


def test_keyword_arguments_of_an_opaque_object_are_refused_not_dropped() -> None:
    namespace = opaque_class("argparse.Namespace", safe=True).__new__(opaque_class("argparse.Namespace", safe=True))
    namespace.kwargs = {"lr": 0.1}
    with pytest.raises(WriteError, match="keyword arguments"):
        PickleWriter(lambda s: s.key).dump({"args": namespace})


def test_safe_values_everywhere_are_written() -> None:
    tensor = Tensor(storage(), 0, (4,), (1,), "float32", hooks=OrderedDict(), metadata={"neg": True})
    tree = OrderedDict(w=tensor, dev=Device("cuda", 0), dtype=Symbol("torch.float16"), layout=Layout("torch.strided"))
    tree._metadata = OrderedDict({"": {"version": 1}})  # type: ignore[attr-defined]
    data = PickleWriter(lambda s: s.key).dump(tree)
    assert b"torch.serialization\n_get_layout" in data and b"torch\nstrided" not in data


def test_the_written_file_is_scanned_again_and_an_unsafe_global_refuses_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should the emitter ever let one through, the read-back scan still refuses the write."""
    smuggled = b"\x80\x02}(" + text("x") + payload("touch /nonexistent") + b"u."

    def leaky(root: object) -> pth_writer.Emitted:
        return pth_writer.Emitted(smuggled, [], 0)

    monkeypatch.setattr("ckpt_tui.core.writers.save.emit", leaky)
    with pytest.raises(WriteError, match=r"holds unsafe globals \(posix.system\); nothing was replaced"):
        save({"x": 1}, tmp_path / "out.pth")
    assert list(tmp_path.iterdir()) == []


def test_a_pickle_naming_other_storages_than_meant_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_emit = pth_writer.emit

    def renumbered(root: object) -> pth_writer.Emitted:
        emitted = real_emit(root)
        wrong = emitted.data_pkl.replace(b"X\x01\x00\x00\x000", b"X\x01\x00\x00\x007")  # record "0" named "7"
        return pth_writer.Emitted(wrong, emitted.storages, emitted.tensors)

    monkeypatch.setattr("ckpt_tui.core.writers.save.emit", renumbered)
    source = tmp_path / "in.pth"
    write_zip_checkpoint(source, b"\x80\x02}(" + text("w") + tensor_op() + b"u.", {"0": floats(4)})
    with pytest.raises(WriteError, match="first-use order"):
        save(open_checkpoint(source).root, tmp_path / "out.pth")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.pth"]


def test_bytes_changed_on_disk_after_writing_are_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_sync = target_module.TempFile.start_sync

    def corrupting_sync(self: target_module.TempFile) -> None:
        real_sync(self)
        with open(self.path, "r+b") as handle:
            handle.seek(100)
            byte = handle.read(1)
            handle.seek(100)
            handle.write(bytes([byte[0] ^ 0xFF]))

    monkeypatch.setattr(target_module.TempFile, "start_sync", corrupting_sync)
    source = tmp_path / "in.pth"
    write_zip_checkpoint(source, b"\x80\x02}(" + text("w") + tensor_op() + b"u.", {"0": floats(4)})
    for name in ("out.pth", "out.safetensors"):
        with pytest.raises(WriteError, match="not what was written; nothing was replaced"):
            save(open_checkpoint(source).root, tmp_path / name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.pth"]


def test_shared_values_are_written_once_so_the_output_stays_the_size_of_the_input(tmp_path: Path, capsys) -> None:
    """A pickle can reference one object many times; the written pickle references it the same way."""
    body = text("y" * 100_000) + b"q\x000"  # a long string in memo 0 (then popped)
    for level in range(1, 40):  # each list holds the one before twice: 2**39 paths to the string
        body += b"](h" + bytes([level - 1]) + b"h" + bytes([level - 1]) + b"eq" + bytes([level])
        body += b"0" if level < 39 else b""
    data = b"\x80\x02}(" + text("w") + tensor_op() + text("laughs") + body + b"u."
    source = write_zip_checkpoint(tmp_path / "laughs.pth", data, {"0": floats(4)})
    assert convert(capsys, source, "-o", tmp_path / "out.pth")[0] == 0
    assert (tmp_path / "out.pth").stat().st_size < 2 * source.stat().st_size


def test_a_tree_nested_deeper_than_any_checkpoint_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    deep = b"](" * 2000 + b"]" + b"e" * 2000  # lists nested 2000 deep, where the tree walk does not look
    hooks = global_op("collections.OrderedDict") + b")R(" + text("h") + deep + b"u"
    data = b"\x80\x02}(" + text("w") + tensor_op(hooks=hooks) + b"u."
    source = write_zip_checkpoint(tmp_path / "deep.pth", data, {"0": floats(4)})
    code, err = convert(capsys, source, "-o", tmp_path / "out.pth")
    assert code == 2 and "nested" in err and "deep" in err and err.count("\n") == 1 and len(err) < 300
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep.pth"]


@pytest.mark.parametrize("name", ["out.safetensors", "out.SAFETENSORS", "out.pth"])
def test_pth_output_named_safetensors_is_refused_as_torch_load_would_not_read_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    # torch.load (2.13+) hands paths ending in exactly .safetensors to the safetensors library
    import torch

    from ckpt_tui.cli import main

    source = tmp_path / "src.pth"
    torch.save({"w": torch.ones(2)}, source)
    output = tmp_path / name
    code = main(["convert", str(source), "-o", str(output), "--format", "pth"])
    refused = name.endswith(".safetensors")
    assert code == (2 if refused else 0)
    assert output.exists() == (not refused)
    if refused:
        assert "torch.load (2.13+) hands such paths to safetensors" in capsys.readouterr().err
    else:
        assert torch.equal(torch.load(output, weights_only=True)["w"], torch.ones(2))
