"""A tar archive given as a checkpoint: torch's pre-0.4 tar format (members ``storages``, ``tensors``, ``pickle``,
which ``torch.load`` unpickles) is refused naming the globals those pickles name; any other tar (``tar cf
model.tar model.pth``, a tar of source files), on which torch.load fails before unpickling anything, is said to
be one in a line naming the checkpoint to extract and open; beside a checkpoint it is data."""

from __future__ import annotations

import io
import os
import pickle
import struct
import tarfile
from pathlib import Path
from typing import Any

import pytest
import torch

from ckpt_tui.cli import main


class _MakeDir:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))


def legacy_tar(path: Path, values: bytes = b"\0" * 16, extra: dict[str, Any] | None = None) -> None:
    """A pre-0.4 torch tar, member by member as ``torch.serialization._legacy_load`` reads it: one float32 storage
    of ``values``, one tensor over it, the pickle ``{"w": tensor, **extra}``."""
    storages = io.BytesIO()
    pickle.dump(1, storages, protocol=2)
    pickle.dump(("0", "cpu", torch.FloatStorage), storages, protocol=2)
    storages.write(struct.pack("<q", len(values) // 4) + values)
    pickle.dump([], storages, protocol=2)
    tensors = io.BytesIO()
    pickle.dump(1, tensors, protocol=2)
    pickle.dump((1, "0", torch.FloatTensor), tensors, protocol=2)
    ndim = len(values) // 4
    tensors.write(struct.pack("<i", 1) + b"\0" * 4 + struct.pack("<qqq", ndim, 1, 0))

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> str | None:
            return obj if obj == "1" else None

    main_pickle = io.BytesIO()
    Pickler(main_pickle, protocol=2).dump({"w": "1", **(extra or {})})
    members = {"sys_info": pickle.dumps({}), "pickle": main_pickle, "storages": storages, "tensors": tensors}
    _tar(path, {name: data if isinstance(data, bytes) else data.getvalue() for name, data in members.items()})


def _tar(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("name", ["model.tar", "model.pth.tar"])
def test_a_tar_of_a_checkpoint_names_the_file_to_extract_and_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.chdir(tmp_path)
    torch.save(torch.nn.Linear(2, 2).state_dict(), "model.pth")
    with tarfile.open(name, "w") as tar:
        tar.add("model.pth")
    os.remove("model.pth")
    with pytest.raises(KeyError, match="storages"):  # torch fails before unpickling anything
        torch.load(name, weights_only=False)
    for command in ("info", "check"):
        err = _error(capsys, command, name)
        assert err == (
            f"ckpt-tui: {name}: a tar archive, not a torch checkpoint: torch.load fails on it before unpickling "
            "anything (it has no 'storages' member, which torch's pre-0.4 tar format has); it holds the checkpoint "
            f"model.pth: extract it (tar xf {name} model.pth) and open that (ckpt-tui model.pth)\n"
        )
        assert "UNSAFE" not in err
    # the way forward works
    with tarfile.open(name) as tar:
        tar.extract("model.pth", filter="data")
    assert main(["check", "model.pth"]) == 0


def test_a_tar_of_source_files_says_it_holds_no_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "src.tar"
    code = b"import shutil, os\ndef fresh(d):\n    shutil.rmtree(d, ignore_errors=True); os.makedirs(d)\n"
    _tar(path, {"tt/mk.py": code, "tt/README.md": b"# notes\n"})
    err = _error(capsys, "check", str(path))
    assert "a tar archive, not a torch checkpoint" in err and "it holds 2 files (tt/mk.py, tt/README.md), none a" in err
    assert "UNSAFE" not in err and "global" not in err
    assert main(["check", "--json", str(path)]) == 2
    assert '"answer":"refuses"' in capsys.readouterr().out


def test_a_tar_of_several_checkpoints_names_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    buffers = []
    for _ in range(2):
        buffer = io.BytesIO()
        torch.save({"w": torch.ones(2)}, buffer)
        buffers.append(buffer.getvalue())
    path = tmp_path / "runs.tar"
    _tar(path, {"runs/epoch_1": buffers[0], "runs/epoch_2.pt": buffers[1], "runs/log.txt": b"loss 0.1\n"})
    err = _error(capsys, "info", str(path))
    assert f"it holds 2 checkpoint files (runs/epoch_1, runs/epoch_2.pt): extract them (tar xf {path})" in err


def test_a_pre_0_4_torch_tar_is_refused_naming_the_globals_its_pickles_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clean, evil, made = tmp_path / "clean.tar", tmp_path / "evil.tar", tmp_path / "made"
    legacy_tar(clean, struct.pack("<4f", 0, 1, 2, 3))
    # (the fixture is torch's format: the real loader reads it)
    assert torch.equal(torch.load(clean, weights_only=False)["w"], torch.arange(4.0))
    err = _error(capsys, "info", str(clean))
    assert "torch.load reads it in the pre-0.4 torch tar format, which ckpt-tui does not read\n" in err
    legacy_tar(evil, extra={"x": _MakeDir(str(made))})
    err = _error(capsys, "check", str(evil))
    assert "pre-0.4 torch tar format" in err and "UNSAFE: it names the unsafe global posix.mkdir" in err
    assert not made.exists()
    torch.load(evil, weights_only=False)
    assert made.is_dir()  # the real loader ran it


def test_storage_bytes_between_a_pre_0_4_tars_pickles_are_never_read_as_globals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "old.tar"
    legacy_tar(path, b"cos\nsystem\n(S'x'\ntR.".ljust(24, b" "))
    torch.load(path, weights_only=False)  # floats, nothing run
    err = _error(capsys, "check", str(path))
    assert "pre-0.4 torch tar format" in err and "UNSAFE" not in err


def test_a_plain_tar_beside_a_checkpoint_is_data_and_a_torch_tar_is_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    torch.save({"w": torch.ones(2)}, folder / "model.pth")
    _tar(folder / "src.tar", {"train.py": b"import torch\n"})
    assert main(["check", str(folder)]) == 0, capsys.readouterr()
    assert "src.tar" not in capsys.readouterr().out
    legacy_tar(folder / "old.tar")
    assert main(["check", str(folder)]) == 1
    assert "[cannot-tell-beside] old.tar" in capsys.readouterr().out
