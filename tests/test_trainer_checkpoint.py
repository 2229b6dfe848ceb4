"""A Hugging Face Trainer's ``checkpoint-N`` folder opens as ``from_pretrained`` reads it: the model's weights are
the tree (one file, shards, or pytorch_model.bin), and the layout line and notes name the training state that
``Trainer(resume_from_checkpoint=...)`` reads beside them; check, convert and diff work on the weights, and
``training_args.bin`` (a pickle torch.load refuses with weights_only) is said to be no part of loading them.

The folder is written by transformers' own Trainer (a tiny GPT-2, two steps on CPU, saved at step 2)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from test_distributed import run

from ckpt_tui.core.readers.open import open_checkpoint

transformers = pytest.importorskip("transformers")

STEPS = 2


class _Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = (torch.arange(8) + index) % 32
        return {"input_ids": ids, "labels": ids}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint-2 folder the Trainer saves after two steps, with save_steps=2."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=32, n_positions=16)
    out = tmp_path_factory.mktemp("trainer")
    args = transformers.TrainingArguments(
        str(out), max_steps=STEPS, save_steps=STEPS, per_device_train_batch_size=2, report_to=[], use_cpu=True
    )
    transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=_Tokens()).train()
    folder = out / f"checkpoint-{STEPS}"
    names = {p.name for p in folder.iterdir()}
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"} <= names
    assert "training_args.bin" in names
    return folder


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    """What from_pretrained loads from the folder (the tied LM head is the input embedding, saved once)."""
    model = transformers.GPT2LMHeadModel.from_pretrained(folder)
    return {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}


def test_the_folder_opens_as_the_weights_from_pretrained_loads(saved: Path) -> None:
    checkpoint = open_checkpoint(str(saved))
    assert checkpoint.path == str(saved / "model.safetensors")
    assert sorted(checkpoint.root) == sorted(_weights(saved))


def test_info_names_the_training_state_beside_the_weights(saved: Path, capsys: Any) -> None:
    code, out, _ = run(capsys, "info", str(saved))
    assert code == 0, out
    lines = {line.split(None, 1)[0]: line.split(None, 1)[1] for line in out.splitlines()[1:8]}
    assert lines["layout"] == (
        f"Hugging Face Trainer checkpoint at step {STEPS}: weights model.safetensors; training state beside them "
        "(optimizer, RNG states, LR scheduler, trainer state)"
    )
    assert lines["elements"] == "1272 params (model)"
    assert (
        f"Trainer(resume_from_checkpoint={saved}) also reads optimizer.pt (optimizer), rng_state.pth (RNG states), "
        f"scheduler.pt (LR scheduler), trainer_state.json (trainer state at step {STEPS})"
    ) in out
    # the training state is named once, never among the folder's other files nor as the tree's keys
    assert "other files: config.json, generation_config.json\n" in out
    assert "saved together" not in out and 'ckpt["model"]' not in out


def test_check_reads_the_weights_and_says_training_args_is_not_needed(saved: Path, capsys: Any) -> None:
    code, out, _ = run(capsys, "check", str(saved))
    assert code == 0, out
    assert out.startswith(f"{saved / 'model.safetensors'}: 16 tensors read: OK")
    assert "Trainer(resume_from_checkpoint=" in out
    beside = next(line for line in out.splitlines() if line.startswith("also in the folder:"))
    assert beside.startswith("also in the folder: optimizer.pt, rng_state.pth, scheduler.pt, training_args.bin: ")
    assert "read for code: none" in beside
    assert "which torch.load(weights_only=True) refuses; read by no loader, not needed to load the weights" in beside
    # what the note says of training_args.bin is what torch does with it
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(saved / "training_args.bin", weights_only=True)


def test_convert_writes_the_weights_from_pretrained_loads(saved: Path, tmp_path: Path, capsys: Any) -> None:
    code, _, err = run(capsys, "convert", str(saved), "-o", str(tmp_path / "weights.pth"))
    assert code == 0, err
    written = torch.load(tmp_path / "weights.pth", weights_only=True)
    expected = _weights(saved)
    assert sorted(written) == sorted(expected) and all(torch.equal(written[k], expected[k]) for k in expected)


def test_shards_or_pytorch_model_bin_in_the_folder_open_to_the_same_weights(
    saved: Path, tmp_path: Path, capsys: Any
) -> None:
    model = transformers.GPT2LMHeadModel.from_pretrained(saved)
    sharded, bin_folder = tmp_path / "checkpoint-sharded", tmp_path / "checkpoint-bin"
    for folder in (sharded, bin_folder):
        shutil.copytree(saved, folder, ignore=shutil.ignore_patterns("model.safetensors"))
    model.save_pretrained(tmp_path / "shards", max_shard_size="2KB")
    for shard in (tmp_path / "shards").glob("model*"):
        shutil.copy(shard, sharded)
    # what transformers 4's Trainer saved: torch.save of the state_dict, the tied head left out
    torch.save(_weights(saved), bin_folder / "pytorch_model.bin")
    for folder, weights in ((sharded, "model.safetensors.index.json"), (bin_folder, "pytorch_model.bin")):
        code, out, _ = run(capsys, "diff", str(folder), str(saved))
        assert code == 0 and out.startswith("identical: 16 tensors"), out
        code, out, _ = run(capsys, "info", str(folder), "--depth", "0")
        assert f"layout      Hugging Face Trainer checkpoint at step {STEPS}: weights {weights};" in out


def test_a_hostile_trainer_state_or_config_is_no_traceback(saved: Path, tmp_path: Path, capsys: Any) -> None:
    folder = tmp_path / "checkpoint-7"
    shutil.copytree(saved, folder)
    nested = "[" * 100_000 + "]" * 100_000
    (folder / "trainer_state.json").write_text(nested)
    (folder / "config.json").write_text(nested)
    code, out, err = run(capsys, "info", str(folder), "--depth", "0")
    assert code == 0 and "Traceback" not in err, err
    # the step is then the folder's number
    assert "layout      Hugging Face Trainer checkpoint at step 7: weights model.safetensors;" in out
    code, _, err = run(capsys, "convert", str(folder), "-o", str(tmp_path / "out"))
    assert code == 0 and "Traceback" not in err, err


# ---- a run with deepspeed=: DeepSpeed's own save beside the weights (a committed fixture: the real Trainer and
# DeepSpeed wrote it, scripts/make_trainer_deepspeed_fixture.py) ----------------------------------------------

WITH_DEEPSPEED = Path(__file__).parent / "fixtures" / "frameworks" / "trainer_deepspeed" / "checkpoint-2"


def test_a_deepspeed_run_checkpoint_opens_as_the_trainers(capsys: Any) -> None:
    """``checkpoint-2/`` of a Trainer run with ``deepspeed=`` is one save of one tool: it opens as the weights
    ``from_pretrained`` takes, with DeepSpeed's engine state named beside them (was refused as "two saves")."""
    from ckpt_tui.cli import main

    checkpoint = open_checkpoint(str(WITH_DEEPSPEED))
    assert checkpoint.path == str(WITH_DEEPSPEED / "model.safetensors")
    assert "DeepSpeed engine state" in (checkpoint.layout or "")
    assert main(["info", str(WITH_DEEPSPEED)]) == 0
    said = capsys.readouterr().out
    assert "global_step2 (DeepSpeed engine state)" in said and "Trainer checkpoint at step 2" in said, said
    expected = transformers.GPT2LMHeadModel.from_pretrained(WITH_DEEPSPEED).state_dict()
    for key, tensor in checkpoint.root.items():
        assert tensor.shape == tuple(expected[key].shape), key
    # DeepSpeed's save alone still opens by its own path
    assert open_checkpoint(str(WITH_DEEPSPEED / "global_step2")).format == "deepspeed"
