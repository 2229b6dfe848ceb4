"""A folder of separate checkpoints (epoch_1.pth, epoch_2.pth, best.pth) is no one checkpoint: info, check,
convert and the browser say so in one line and name a file to open; the folders that are one save
(Accelerate's save_state, rank files) still open whole, a stray text file among rank files left out."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from builders_tui import screen_text, settle

from ckpt_tui.cli import main
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.screens.dialogs import ErrorScreen

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """A training run's checkpoints folder: three epochs, the best one, and a notes file."""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    torch.manual_seed(0)
    for name in ("epoch_1.pth", "epoch_2.pth", "epoch_10.pth", "best.pth"):
        torch.save({"epoch": 1, "model": torch.nn.Linear(2, 2).state_dict()}, folder / name)
    (folder / "notes.txt").write_text("lr 1e-3\n")
    return folder


@pytest.mark.parametrize("command", [["info"], ["check"], ["convert", "-o", "out.pth"]])
def test_a_folder_of_separate_checkpoints_is_one_line_naming_the_best(
    runs: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    args = [command[0], str(runs), *[str(runs.parent / a) if a.endswith(".pth") else a for a in command[1:]]]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        f"ckpt-tui: {runs}: a folder of 4 separate checkpoints, not one save: open one (ckpt-tui {runs}/best.pth)\n"
    )
    assert not (runs.parent / "out.pth").exists()


def test_without_a_best_the_last_epoch_is_named(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (runs / "best.pth").unlink()
    assert main(["info", str(runs)]) == 2
    assert f"open one (ckpt-tui {runs}/epoch_10.pth)" in capsys.readouterr().err


def test_a_stray_text_file_among_them_is_not_the_error(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (runs / "notackpt.pth").write_text("not a checkpoint\n")
    assert main(["info", str(runs)]) == 2
    err = capsys.readouterr().err
    assert "a folder of 4 separate checkpoints" in err and "notackpt" not in err


def test_an_empty_file_among_them_is_neither_counted_nor_named(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (runs / "zzz_epoch_99.pth").write_bytes(b"")
    assert main(["info", str(runs)]) == 2
    err = capsys.readouterr().err
    assert "a folder of 4 separate checkpoints" in err and "zzz_epoch_99" not in err


def test_broken_links_fifos_and_devices_are_never_counted_nor_named(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    (runs / "best.pth").unlink()
    (runs / "zzz_best.pth").symlink_to("/dev/zero")
    (runs / "last.pth").symlink_to("/nonexistent/x.pth")
    os.mkfifo(runs / "latest.pth")
    assert main(["info", str(runs)]) == 2
    err = capsys.readouterr().err
    assert f"a folder of 3 separate checkpoints, not one save: open one (ckpt-tui {runs}/epoch_10.pth)" in err
    # the file named is one ckpt-tui opens
    assert main(["info", str(runs / "epoch_10.pth")]) == 0


def test_one_checkpoint_beside_a_broken_link_and_a_device_opens_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "links"
    folder.mkdir()
    torch.save(torch.nn.Linear(2, 2).state_dict(), folder / "model.pth")
    (folder / "dangling.pth").symlink_to("/nonexistent/x.pth")
    (folder / "zero.pth").symlink_to("/dev/zero")
    assert main(["check", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "dangling.pth not read (a broken link" in out and "zero.pth not read (a link out of the folder" in out
    assert open_checkpoint(folder).path == str(folder / "model.pth")


def test_a_folder_s_one_checkpoint_linked_from_elsewhere_opens_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "links"
    folder.mkdir()
    torch.save(torch.nn.Linear(2, 2).state_dict(), tmp_path / "real.pth")
    (folder / "model.pth").symlink_to(tmp_path / "real.pth")
    (folder / "zero.pth").symlink_to("/dev/zero")
    # torch.load(folder/model.pth) follows the link: so does ckpt-tui, saying where it leads (R10B-13)
    assert main(["info", str(folder)]) == 0
    out = capsys.readouterr().out
    assert f"model.pth -> {tmp_path}/real.pth" in out and "zero.pth not read" in out
    assert open_checkpoint(folder).path == str(folder / "model.pth")


async def test_the_browser_says_it_and_quits_cleanly(runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(runs.parent)
    app = CkptApp("checkpoints")
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, ErrorScreen)
        shown = " ".join(screen_text(app).replace("█", " ").split())
        assert "checkpoints: a folder of 4 separate checkpoints, not one save: open one (the command below)" in shown
        # the command on its own line, whole, and y copies it
        assert "ckpt-tui checkpoints/best.pth" in screen_text(app)
        await pilot.press("q")
        await pilot.pause()


def test_one_save_still_opens_whole() -> None:
    assert open_checkpoint(FIXTURES / "accelerate" / "save_state").format == "folder"
    ddp = open_checkpoint(FIXTURES / "torch_distributed" / "ddp")
    assert sorted(ddp.root) == ["rank0", "rank1", "rank2"]
    # rank files beside a consolidated copy are still the run's save
    assert open_checkpoint(FIXTURES / "torch_distributed" / "dtensor").format == "folder"


def test_a_stray_text_file_in_a_rank_folder_is_left_out_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "ddp"
    shutil.copytree(FIXTURES / "torch_distributed" / "ddp", folder)
    (folder / "notes.pth").write_text("run notes\n")
    checkpoint = open_checkpoint(folder)
    assert sorted(checkpoint.root) == ["rank0", "rank1", "rank2"]
    assert "notes.pth: a text file, not a checkpoint, left out" in checkpoint.notes
    assert main(["info", str(folder)]) == 0
    assert "notes.pth: a text file, not a checkpoint, left out" in capsys.readouterr().out


def test_a_hugging_face_trainer_checkpoint_folder_is_one_save(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=8)

    class Tokens(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            ids = torch.arange(8) % 32
            return {"input_ids": ids, "labels": ids}

    args = transformers.TrainingArguments(
        str(tmp_path / "out"), max_steps=1, save_steps=1, per_device_train_batch_size=2, report_to=[], use_cpu=True
    )
    transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=Tokens()).train()
    checkpoint = open_checkpoint(tmp_path / "out" / "checkpoint-1")
    # one save, opened as from_pretrained reads it (see test_trainer_checkpoint): the weights, the training state beside
    assert checkpoint.path == str(tmp_path / "out" / "checkpoint-1" / "model.safetensors")
    assert (checkpoint.layout or "").startswith("Hugging Face Trainer checkpoint at step 1: weights model.safetensors")
    # (the training state, and training_args.bin, which no loader reads, are read for code beside the weights: see
    # test_folder_files_read_for_code)
    beside = [file.name for file in checkpoint.beside or []]
    assert beside == ["optimizer.pt", "rng_state.pth", "scheduler.pt", "training_args.bin"]


def test_shards_without_an_index_are_one_save(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    folder = tmp_path / "shards"
    folder.mkdir()
    save_file({"a": torch.ones(2)}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({"b": torch.ones(2)}, str(folder / "model-00002-of-00002.safetensors"))
    assert open_checkpoint(folder).format == "folder"


# ---- checkpoint files are found by content, not by name ---------------------------------------------


def _imagenet_folder(tmp_path: Path, names: tuple[str, ...]) -> Path:
    """What PyTorch's ImageNet example leaves: ``checkpoint.pth.tar`` and ``model_best.pth.tar``."""
    folder = tmp_path / "imagenet"
    folder.mkdir()
    for index, name in enumerate(names):
        torch.save({"epoch": index, "state_dict": {"fc.weight": torch.full((2, 2), float(index))}}, folder / name)
    return folder


def test_a_folder_of_pth_tar_files_is_separate_checkpoints_naming_the_best(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _imagenet_folder(tmp_path, ("checkpoint.pth.tar", "model_best.pth.tar"))
    assert main(["check", str(folder)]) == 2
    assert capsys.readouterr().err == (
        f"ckpt-tui: {folder}: a folder of 2 separate checkpoints, not one save: "
        f"open one (ckpt-tui {folder}/model_best.pth.tar)\n"
    )


@pytest.mark.parametrize("name", ["model_best.pth.tar", "weights", "model.PTH", "ckpt.safetensors.bak"])
def test_a_folder_of_one_checkpoint_under_any_name_opens_it(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "one"
    folder.mkdir()
    if "safetensors" in name:
        from safetensors.torch import save_file

        save_file({"fc.weight": torch.ones(2, 2)}, folder / name)
    else:
        torch.save({"fc.weight": torch.ones(2, 2)}, folder / name)
    (folder / "notes").write_text("lr 1e-3\n")
    assert main(["info", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "fc.weight" in out and name in out
    # (torch.load unpickles a safetensors file not named *.safetensors, and fails)
    assert main(["check", str(folder)]) == (1 if "safetensors" in name else 0)


@pytest.mark.parametrize("protocol", [0, 2, 4])
def test_a_plain_pickle_beside_one_checkpoint_is_no_second_checkpoint(
    tmp_path: Path, protocol: int, capsys: pytest.CaptureFixture[str]
) -> None:
    # torch.load refuses a plain pickle ("Invalid magic number"): the folder opens its one save, and the pickle
    # is read for code beside it
    import pickle

    folder = tmp_path / "run"
    folder.mkdir()
    torch.save({"w": torch.ones(2)}, folder / "model.pth")
    (folder / "extra.pkl").write_bytes(pickle.dumps({"classes": ["a", "b"]}, protocol=protocol))
    with pytest.raises(RuntimeError, match="Invalid magic number"):
        torch.load(folder / "extra.pkl", weights_only=False)
    assert main(["check", str(folder)]) == 0
    assert "also in the folder: extra.pkl: read for code: none" in capsys.readouterr().out


def test_a_folder_of_save_folders_names_the_last_to_open(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for step in (500, 1000):
        (tmp_path / "out" / f"checkpoint-{step}").mkdir(parents=True)
        torch.save({"w": torch.ones(2)}, tmp_path / "out" / f"checkpoint-{step}" / "pytorch_model.bin")
    assert main(["info", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "no checkpoint in this folder: 2 folders (checkpoint-1000/, checkpoint-500/)" in error
    assert f"open a save's folder (ckpt-tui {tmp_path / 'out' / 'checkpoint-1000'})" in error


def test_deepspeeds_latest_naming_a_missing_tag_is_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "ds"
    (folder / "global_step2").mkdir(parents=True)
    shutil.copy(
        FIXTURES / "frameworks" / "zero0_bf16" / "global_step2" / "mp_rank_00_model_states.pt", folder / "global_step2"
    )
    (folder / "latest").write_text("global_step9")
    assert main(["info", str(folder)]) == 2
    error = capsys.readouterr().err
    assert "DeepSpeed's latest names 'global_step9', which is not in the folder" in error
    assert f"open a save's folder (ckpt-tui {folder / 'global_step2'})" in error
    assert main(["info", str(folder / "global_step2")]) == 0


def test_a_link_to_the_folders_own_checkpoint_is_no_second_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Lightning's save_last="link" writes last.ckpt as a link to the newest checkpoint
    folder = tmp_path / "run"
    folder.mkdir()
    torch.save({"state_dict": torch.nn.Linear(2, 2).state_dict()}, folder / "epoch=3.ckpt")
    (folder / "last.ckpt").symlink_to("epoch=3.ckpt")
    assert main(["check", str(folder)]) == 0
    assert open_checkpoint(folder).path == str(folder / "epoch=3.ckpt")


def test_a_zero_tag_folder_without_model_states_is_one_broken_save(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "global_step2"
    folder.mkdir()
    for part in (FIXTURES / "deepspeed" / "zero2_fp32" / "global_step2").glob("*_optim_states.pt"):
        shutil.copy(part, folder)
    assert main(["info", str(folder)]) == 2
    error = capsys.readouterr().err
    assert "a DeepSpeed ZeRO save without its *_model_states.pt files (rank 0 did not save?)" in error
    assert "separate checkpoints" not in error
