"""``check FOLDER`` accounts for every file in the folder (and its immediate subfolders) that a loader could unpickle,
found by content: one the checkpoint's reader did not read is read for code, and code or doubt is a problem.

Payloads are ``__reduce__`` -> ``os.system('touch CANARY')``; the canary must never appear.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from test_accelerate_folder import FOLDER as ACCELERATE_FOLDER
from test_distributed import run

from ckpt_tui.core.operations.check import check_checkpoint
from ckpt_tui.core.readers.open import open_checkpoint


class Payload:
    """Runs a shell command when unpickled (torch.load(weights_only=False), pickle.load)."""

    def __init__(self, canary: Path) -> None:
        self.canary = canary

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.canary}",))


def _payload(path: Path, canary: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"w": torch.ones(2), "x": Payload(canary)}, path)


@pytest.mark.parametrize("name", ["model_best.pth.tar", "EVIL.PTH", "evil", "optimizer.pt.1", "sub/evil.pth"])
def test_a_payload_under_any_name_beside_a_clean_model_is_a_problem_naming_it(
    tmp_path: Path, capsys: Any, name: str
) -> None:
    folder, canary = tmp_path / "run", tmp_path / "CANARY"
    _shards(folder)
    _payload(folder / name, canary)
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 1
    assert f"[code-beside] {name} (also in the folder" in out and "posix.system" in out
    assert f"also in the folder: {name}: read for code: {name} holds code (posix.system)" in out
    # the real loader refuses it with weights_only=True (weights_only=False would run it)
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(folder / name, weights_only=True)
    assert not canary.exists()


@pytest.mark.parametrize("name", ["model_best.pth.tar", "EVIL.PTH", "evil", "optimizer.pt.1"])
def test_a_payload_under_any_name_beside_a_model_file_is_a_second_checkpoint(
    tmp_path: Path, capsys: Any, name: str
) -> None:
    folder, canary = tmp_path / "run", tmp_path / "CANARY"
    folder.mkdir()
    torch.save({"w": torch.ones(2)}, folder / "model.pth")
    _payload(folder / name, canary)
    code, _, err = run(capsys, "check", str(folder))
    # a checkpoint by content, as model.pth is: two separate checkpoints, never the folder called clean
    assert code == 2
    assert f"{folder}: a folder of 2 separate checkpoints, not one save: open one" in err
    assert not canary.exists()


def test_a_clean_file_beside_is_read_and_named_and_the_folder_stays_clean(tmp_path: Path, capsys: Any) -> None:
    folder = tmp_path / "run"
    _shards(folder)
    torch.save({"step": torch.tensor(3)}, folder / "extra_state")
    (folder / "notes.txt").write_text("trained for 3 epochs\n")
    (folder / "config.json").write_text("{}")
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 0, out
    assert "also in the folder: extra_state: read for code: none" in out


def test_a_file_beside_that_cannot_be_read_is_never_clean(tmp_path: Path, capsys: Any) -> None:
    folder = tmp_path / "run"
    _shards(folder)
    (folder / "broken.bak").write_bytes(b"PK\x03\x04 not a zip at all")
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 1
    assert "[cannot-tell-beside] broken.bak (also in the folder)" in out


def _shards(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"a": torch.ones(2)}, folder / "model-00001-of-00002.safetensors")
    save_file({"b": torch.ones(2)}, folder / "model-00002-of-00002.safetensors")
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    index = {"metadata": {"total_size": 16}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def test_a_sharded_folder_reads_its_other_files_for_code(tmp_path: Path, capsys: Any) -> None:
    folder, canary = tmp_path / "checkpoint-500", tmp_path / "CANARY"
    _shards(folder)
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 0 and "also in the folder" not in out, out  # a plain shard folder: as before
    before = open_checkpoint(folder)
    assert before.format == "sharded" and before.beside == []
    _payload(folder / "optimizer.pt", canary)
    _payload(folder / "rng_state.pth", canary)
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 1
    assert "also in the folder: optimizer.pt, rng_state.pth: read for code: optimizer.pt holds code" in out
    assert not canary.exists()


def test_a_dcp_subfolder_is_read_as_dcp_load_reads_it(tmp_path: Path, capsys: Any) -> None:
    import torch.distributed.checkpoint as dcp

    folder, canary = tmp_path / "state", tmp_path / "CANARY"
    shutil.copytree(ACCELERATE_FOLDER, folder)
    assert check_checkpoint(open_checkpoint(folder)).ok
    dcp.save({"w": torch.ones(2)}, checkpoint_id=str(folder / "optimizer_0"))
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 0, out
    assert "also in the folder: optimizer_0/: read for code: none" in out
    # what Accelerate's FSDP load_state hands to dcp.load: an item that runs code when loaded
    dcp.save({"w": torch.ones(2), "x": Payload(canary)}, checkpoint_id=str(folder / "pytorch_model_fsdp_0"))
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 1
    assert "[code-beside] pytorch_model_fsdp_0/ (also in the folder, DCP folder)" in out
    assert not canary.exists()


def test_a_folder_with_an_index_and_a_whole_file_reads_the_file_from_pretrained_takes(
    tmp_path: Path, capsys: Any
) -> None:
    folder = tmp_path / "both"
    _shards(folder)
    save_file({"a": torch.full((2,), float("nan")), "b": torch.full((2,), 1e30)}, folder / "model.safetensors")
    checkpoint = open_checkpoint(folder)
    assert checkpoint.format == "safetensors" and checkpoint.path.endswith("model.safetensors")
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 1 and "[nan]" in out
    code, out, _ = run(capsys, "info", str(folder))
    assert "loads model.safetensors (it looks for model.safetensors, model.safetensors.index.json," in out
    assert "; model.safetensors.index.json beside it is not what it loads (nor the shards an index names)" in out


def test_a_payload_bin_beside_an_index_is_read_for_code(tmp_path: Path, capsys: Any) -> None:
    folder, canary = tmp_path / "both_bin", tmp_path / "CANARY"
    _shards(folder)
    torch.save({"a": torch.ones(2), "b": torch.ones(2), "x": Payload(canary)}, folder / "pytorch_model.bin")
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 1
    assert "[code-beside] pytorch_model.bin" in out
    assert "loads model.safetensors.index.json (it looks for" in out
    assert "; pytorch_model.bin beside it is not what it loads" in out
    assert not canary.exists()


def test_two_indexes_are_read_as_from_pretrained_picks_and_the_other_is_named(tmp_path: Path, capsys: Any) -> None:
    folder = tmp_path / "two"
    _shards(folder)
    torch.save({"a": torch.ones(2), "b": torch.ones(2)}, folder / "pytorch_model-00001-of-00001.bin")
    weight_map = {"a": "pytorch_model-00001-of-00001.bin", "b": "pytorch_model-00001-of-00001.bin"}
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 0, out
    assert out.startswith(f"{folder / 'model.safetensors.index.json'}: 2 tensors read: OK")
    assert "pytorch_model.bin.index.json beside it" in out
    assert "also in the folder: pytorch_model-00001-of-00001.bin: read for code: none" in out


@pytest.fixture(scope="module")
def trainer_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint-N folder written by transformers' Trainer (tiny GPT-2, two steps on CPU)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=8)

    class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            ids = torch.arange(8) % 32
            return {"input_ids": ids, "labels": ids}

    out = tmp_path_factory.mktemp("trainer")
    args = transformers.TrainingArguments(
        str(out), max_steps=2, save_steps=2, per_device_train_batch_size=2, report_to=[], use_cpu=True
    )
    transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=Tokens()).train()
    return out / "checkpoint-2"


def test_a_clean_trainer_checkpoint_checks_clean(trainer_checkpoint: Path, capsys: Any) -> None:
    code, out, _ = run(capsys, "check", str(trainer_checkpoint))
    assert code == 0, out
    # the folder opens as its weights: the training state beside them is read for code
    assert (
        "also in the folder: optimizer.pt, rng_state.pth, scheduler.pt, training_args.bin: read for code: none "
        "(training_args.bin holds the Trainer's"
    ) in out
    # rng_state.pth holds numpy arrays: data the Trainer's own load allowlists
    assert "rng_state.pth refused" not in out


def test_a_trainer_checkpoint_with_a_sharded_model_checks_clean_and_reads_the_rest(
    trainer_checkpoint: Path, tmp_path: Path, capsys: Any
) -> None:
    import transformers

    folder, canary = tmp_path / "checkpoint-2", tmp_path / "CANARY"
    shutil.copytree(trainer_checkpoint, folder)
    model = transformers.GPT2LMHeadModel.from_pretrained(folder)
    (folder / "model.safetensors").unlink()
    model.save_pretrained(folder, max_shard_size="3KB")
    assert (folder / "model.safetensors.index.json").exists()
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 0, out
    assert (
        "also in the folder: optimizer.pt, rng_state.pth, scheduler.pt, training_args.bin: read for code: none" in out
    )
    _payload(folder / "rng_state.pth", canary)
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 1 and "[code-beside] rng_state.pth" in out
    assert not canary.exists()


@pytest.mark.parametrize("name", ["optimizer.pt", "training_args.bin"])
def test_a_payload_in_a_trainer_checkpoint_is_a_problem(
    trainer_checkpoint: Path, tmp_path: Path, capsys: Any, name: str
) -> None:
    folder, canary = tmp_path / "checkpoint-2", tmp_path / "CANARY"
    shutil.copytree(trainer_checkpoint, folder)
    _payload(folder / name, canary)
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 1 and "posix.system" in out
    assert not canary.exists()


def test_a_linked_subfolder_inside_is_read_and_a_fifo_is_never_waited_on(tmp_path: Path, capsys: Any) -> None:
    folder, canary = tmp_path / "run", tmp_path / "CANARY"
    folder.mkdir()
    torch.save({"w": torch.ones(2)}, folder / "model.pth")
    _payload(folder / "kept" / "evil.pth", canary)
    (folder / "linked").symlink_to("kept")
    os.mkfifo(folder / "pipe")
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 1
    assert "[code-beside] kept/evil.pth" in out
    assert "[cannot-tell-beside] pipe (also in the folder)" in out
    assert not canary.exists()


def test_a_subfolder_linked_from_elsewhere_is_read_as_its_loaders_follow_it(tmp_path: Path, capsys: Any) -> None:
    folder, canary = tmp_path / "run", tmp_path / "CANARY"
    folder.mkdir()
    torch.save({"w": torch.ones(2)}, folder / "model.pth")
    _payload(tmp_path / "elsewhere" / "evil.pth", canary)
    (folder / "linked").symlink_to(tmp_path / "elsewhere")
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 1
    assert "[code-beside] linked/evil.pth" in out
    assert not canary.exists()


@pytest.mark.parametrize(
    ("target", "why"),
    [("..", "a folder holding it (a loop)"), ("/dev", "the kernel's /dev"), ("/proc/self", "the kernel's /proc")],
)
def test_a_link_to_the_kernel_s_folders_or_to_a_folder_holding_it_is_not_followed(
    tmp_path: Path, capsys: Any, target: str, why: str
) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    torch.save({"w": torch.ones(2)}, folder / "model.pth")
    (tmp_path / "train.py").write_text("(S'x'\nios\nmkdir\n")  # (what a scan of the folder above would flag)
    (folder / "up").symlink_to(target)
    code, out, _ = run(capsys, "check", str(folder))
    # (never read: named in the folder's line, never a problem)
    assert code == 0, out
    assert ": OK, no NaN/Inf, no unsafe globals" in out and "[" not in out
    assert "also in the folder: up/: read for code: up/ not read (a link out of the folder to " in out
    assert why in out


def test_broken_links_and_links_to_devices_beside_a_model_are_named_never_a_problem(
    tmp_path: Path, capsys: Any
) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    torch.save({"w": torch.ones(2)}, folder / "model.pth")
    (folder / "gone").symlink_to("/nonexistent/x")
    (folder / "zero").symlink_to("/dev/zero")
    (folder / "a").symlink_to("b")
    (folder / "b").symlink_to("a")
    for name in ("gone", "a"):
        with pytest.raises(OSError):  # torch.load finds nothing there
            torch.load(folder / name, weights_only=False)
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 0, out
    assert "gone not read (a broken link, to /nonexistent/x: nothing to load)" in out
    assert "zero not read (a link out of the folder to /dev/zero: the kernel's /dev, never read)" in out
    assert "a not read (a broken link, to b: nothing to load)" in out


# ---- what the reader cannot read is data only when torch.load fails on it before it could run anything ----


def _model_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    torch.save({"w": torch.ones(2)}, folder / "model.pth")
    return folder


def test_a_protocol_0_pickle_the_reader_cannot_parse_is_cannot_tell(tmp_path: Path, capsys: Any) -> None:
    folder, made = _model_folder(tmp_path), tmp_path / "made"
    # no PROTO, no STOP: pickle runs os.mkdir, then fails at the end of the input
    (folder / "state.bak").write_bytes(f"cos\nmkdir\n(S'{made}'\ntR".encode())
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 1, out
    assert "[cannot-tell-beside] state.bak (also in the folder)" in out
    assert not made.exists()
    with pytest.raises(EOFError):
        torch.load(folder / "state.bak", weights_only=False)
    assert made.is_dir()  # the real loader ran it


def test_a_tar_archive_beside_is_cannot_tell(tmp_path: Path, capsys: Any) -> None:
    import io
    import pickle
    import tarfile

    folder, made = _model_folder(tmp_path), tmp_path / "made"
    data = pickle.dumps(_MakeDir(str(made)), protocol=2)
    with tarfile.open(folder / "old", "w:", format=tarfile.PAX_FORMAT) as tar:
        for member in ("sys_info", "pickle", "storages", "tensors"):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 1, out
    assert "[cannot-tell-beside] old (also in the folder)" in out and "tar archive" in out
    assert not made.exists()
    with pytest.raises(TypeError):  # torch's pre-0.4 tar reader unpickles the members: it ran the payload
        torch.load(folder / "old", weights_only=False)
    assert made.is_dir()


class _MakeDir:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))


def test_text_files_torch_load_fails_on_at_once_stay_data(tmp_path: Path, capsys: Any) -> None:
    folder = _model_folder(tmp_path)
    texts = {
        "notes.txt": "trained for 3 epochs\n",
        "log.csv": "epoch,loss\n1,0.3\n",
        "hparams.yaml": "lr: 0.1\nbatch: 3\n",
        "vocab.txt": "[PAD]\n[UNK]\nthe\n",
        "train.py": "import torch\n",
    }
    for name, text in texts.items():
        (folder / name).write_text(text)
        with pytest.raises(Exception):  # noqa: B017 (each fails its own way, before anything runs)
            torch.load(folder / name, weights_only=False)
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 0, out
    assert "also in the folder" not in out
