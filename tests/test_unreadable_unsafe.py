"""A pickle the reader refuses is still called unsafe when it names an unsafe global.

The reader's refusals stay (a second BUILD, an ``OrderedDict`` state other than ``_metadata``, a
persistent id that is not a storage's); the one-line error then says "UNSAFE" and names every unsafe
global the pickle's opcodes name, before the failure or after it. Exit status 2 (unreadable), as for
every unreadable file. ``torch.load(weights_only=False)`` runs each of these payloads.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from builders_writer import floats, global_op, payload, tensor_op, text, write_zip_checkpoint

from ckpt_tui.cli import main

ORDERED = global_op("collections.OrderedDict") + b")R"


def bodies(command: str) -> dict[str, bytes]:
    """Structures the reader refuses, each holding ``posix.system(command)``."""
    system = payload(command)
    return {
        "namespace_second_build": global_op("argparse.Namespace")
        + b")R}("
        + text("__setstate__")
        + global_op("posix.system")
        + b"ub"
        + text(command)
        + b"b",
        "ordered_dict_metadata_payload": ORDERED + b"}(" + text("_metadata") + system + b"ub",
        # (a key of its own: a later use of a key is its first storage, whatever location it says)
        "location_tag_payload": global_op("torch._utils._rebuild_tensor_v2")
        + b"(("
        + text("storage")
        + global_op("torch.FloatStorage")
        + text("1")
        + system
        + b"K\x04tQK\x00K\x04\x85K\x01\x85\x89"
        + ORDERED
        + b"tR",
    }


def zip_with(path: Path, body: bytes, after: bytes = b"") -> Path:
    data = b"\x80\x02}(" + text("w") + tensor_op() + text("x") + body + after + b"u."
    return write_zip_checkpoint(path, data, {"0": floats(4)})


def check(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, str]:
    code = main(["check", str(path)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("where", list(bodies("x")))
def test_a_refused_structure_holding_a_payload_is_called_unsafe(tmp_path: Path, capsys, where: str) -> None:
    canary = tmp_path / "CANARY"
    path = zip_with(tmp_path / f"{where}.pth", bodies(f"touch {canary}")[where])
    code, err = check(capsys, path)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "UNSAFE" in err and "posix.system" in err and "NOT executed here" in err
    assert not canary.exists()


def test_the_payloads_do_run_under_the_real_loader(tmp_path: Path) -> None:
    paths = [zip_with(tmp_path / f"{w}.pth", b) for w, b in bodies(f"touch {tmp_path}/ran").items()]
    code = "import sys, torch\ntry: torch.load(sys.argv[1], weights_only=False)\nexcept Exception: pass"
    for path in paths:
        (tmp_path / "ran").unlink(missing_ok=True)
        subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, timeout=120, check=False)
        assert (tmp_path / "ran").exists(), path.name


def test_a_global_named_after_the_point_of_failure_is_found_in_the_opcodes(tmp_path: Path, capsys) -> None:
    refused = ORDERED + b"}(" + text("other") + b"K\x01ub"  # refused before the payload is reached
    after = text("later") + global_op("subprocess.Popen") + b"\x85"  # never built by the reader
    code, err = check(capsys, zip_with(tmp_path / "late.pth", refused, after))
    assert code == 2 and "UNSAFE" in err and "subprocess.Popen" in err


def test_a_memoized_stack_global_is_found_at_protocol_4(tmp_path: Path, capsys) -> None:
    def short(value: str) -> bytes:
        return b"\x8c" + bytes([len(value)]) + value.encode() + b"\x94"

    refused = ORDERED + b"}(" + text("other") + b"K\x01ub"
    stack_global = short("posix") + short("system") + b"\x93\x94" + b"h\x00h\x01\x93"  # memo fetches, twice
    data = b"\x80\x04}(" + text("x") + refused + text("y") + stack_global + b"u."
    (tmp_path / "plain.pkl").write_bytes(data)
    code, err = check(capsys, tmp_path / "plain.pkl")
    assert code == 2 and "UNSAFE" in err and "posix.system" in err


def test_a_truncated_plain_pickle_still_names_its_payload(tmp_path: Path, capsys) -> None:
    data = pickle.dumps({"w": [1, 2, 3]}, protocol=2)[:-3] + global_op("os.system")
    (tmp_path / "cut.pkl").write_bytes(data)
    code, err = check(capsys, tmp_path / "cut.pkl")
    assert code == 2 and "UNSAFE" in err and "os.system" in err


def test_a_corrupt_pickle_with_only_known_globals_is_not_called_unsafe(tmp_path: Path, capsys) -> None:
    refused = ORDERED + b"}(" + text("other") + b"K\x01ub"
    code, err = check(capsys, zip_with(tmp_path / "plain.pth", refused))
    assert code == 2 and "corrupt pickle" in err and "UNSAFE" not in err


def test_a_payload_in_the_hooks_of_a_parameters_data_is_called_unsafe(tmp_path: Path, capsys) -> None:
    """torch sets those hooks on the data tensor, then drops it: the payload runs, the value vanishes."""
    hooks = ORDERED + b"(" + text("h") + payload("touch /nonexistent/x") + b"u"
    parameter = global_op("torch._utils._rebuild_parameter") + b"(" + tensor_op(hooks=hooks) + b"\x88" + ORDERED + b"tR"
    data = b"\x80\x02}(" + text("p") + parameter + b"u."
    code, err = check(capsys, write_zip_checkpoint(tmp_path / "p.pth", data, {"0": floats(4)}))
    assert code == 2 and "UNSAFE" in err and "posix.system" in err


def test_a_payload_as_requires_grad_is_called_unsafe_not_read_as_false(tmp_path: Path, capsys) -> None:
    tensor = tensor_op().replace(b"\x89" + ORDERED, payload("touch /nonexistent/x") + ORDERED, 1)
    data = b"\x80\x02}(" + text("w") + tensor + b"u."
    code, err = check(capsys, write_zip_checkpoint(tmp_path / "g.pth", data, {"0": floats(4)}))
    assert code == 2 and "requires_grad" in err and "UNSAFE" in err and "posix.system" in err


def test_a_payload_in_a_later_uses_location_is_read_and_called_unsafe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # torch looks the key's storage up before it reads the location: the file loads (running the call first)
    canary = tmp_path / "CANARY"
    body = bodies(f"touch {canary}")["location_tag_payload"].replace(text("1"), text("0"), 1)
    path = zip_with(tmp_path / "later_use.pth", body)
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "unsafe global posix.system" in out and "NOT executed here" in out
    assert not canary.exists()
