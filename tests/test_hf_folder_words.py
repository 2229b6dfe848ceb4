"""A Hugging Face folder: ``info`` says it loads as it is with from_pretrained (and what load_state_dict needs
for a tied head), and ``convert --max-shard-size`` writes the model's config beside the shards as
save_pretrained does, so from_pretrained reads the output; without a config, it says so."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ckpt_tui.cli import main

transformers = pytest.importorskip("transformers")


@pytest.fixture
def hf_gpt2(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "hf_gpt2", max_shard_size="100KB")
    return tmp_path / "hf_gpt2"


def test_info_says_from_pretrained_and_what_load_state_dict_needs(
    hf_gpt2: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["info", str(hf_gpt2)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "GPT2LMHeadModel whose body is its .transformer: it loads as it is with from_pretrained" in out
    assert "load_state_dict needs strict=False and then model.tie_weights()" in out


def test_shards_get_the_config_and_from_pretrained_reads_them(
    hf_gpt2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "back"
    assert main(["convert", str(hf_gpt2), "-o", str(out), "--max-shard-size", "100KB"]) == 0
    assert "config.json, generation_config.json copied from the source" in capsys.readouterr().out
    original = transformers.GPT2LMHeadModel.from_pretrained(hf_gpt2)
    reloaded = transformers.GPT2LMHeadModel.from_pretrained(out)
    for key, value in original.state_dict().items():
        assert torch.equal(reloaded.state_dict()[key], value), key


def test_shards_from_a_single_file_say_the_config_is_missing(
    hf_gpt2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    single = tmp_path / "single" / "gpt2.pth"
    single.parent.mkdir()
    assert main(["convert", str(hf_gpt2), "-o", str(single)]) == 0
    capsys.readouterr()
    assert main(["convert", str(single), "-o", str(tmp_path / "shards"), "--max-shard-size", "100KB"]) == 0
    printed = capsys.readouterr().out
    assert "no Hugging Face config.json beside the source" in printed
    assert not (tmp_path / "shards" / "config.json").exists()
