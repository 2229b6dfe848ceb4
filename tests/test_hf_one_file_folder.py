"""A Hugging Face model folder holding ONE weights file (``save_pretrained`` unsharded) opens as that file, as
``from_pretrained`` picks it, exactly like the sharded folder opens as its index: same keys, same values, so diff
says identical and check --against fits; info names the file taken, why, and the folder's other files. A folder
that holds no checkpoint (wheels, text) says what it holds instead.

The folders are written by transformers itself (a tiny BERT: 2 layers, hidden 32), PEFT and diffusers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_tui import loaded, screen_text
from range_server import RangeServer
from test_distributed import run
from test_remote import hub, root_of  # noqa: F401  (the local Hub fixture)
from test_remote_servers import Server, stdlib  # noqa: F401  (the served-folder fixture)

from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.tui.app import CkptApp

transformers = pytest.importorskip("transformers")

ORDER = "it looks for model.safetensors, model.safetensors.index.json, pytorch_model.bin, pytorch_model.bin.index.json"


def _bert() -> Any:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=100,
        max_position_embeddings=32,
    )
    return transformers.BertModel(config)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same model saved the standard ways: sharded (index + 5 shards), one model.safetensors, and one
    pytorch_model.bin; each with its config.json and a tokenizer's files beside it."""
    root = tmp_path_factory.mktemp("hf")
    model = _bert()
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world"]) + "\n")
    tokenizer = transformers.BertTokenizer(str(vocab))
    out = {name: root / name for name in ("sharded", "one", "bin")}
    model.save_pretrained(out["sharded"], max_shard_size="20KB")
    model.save_pretrained(out["one"])
    # transformers 5 writes safetensors whatever safe_serialization says; a pytorch_model.bin folder is what
    # transformers 4 wrote (torch.save of the state_dict beside config.json), which from_pretrained still reads
    model.config.save_pretrained(out["bin"])
    torch.save(model.state_dict(), out["bin"] / "pytorch_model.bin")
    for folder in out.values():
        tokenizer.save_pretrained(folder)
    assert (out["sharded"] / "model.safetensors.index.json").exists()
    assert sorted(p.name for p in out["one"].glob("*.safetensors")) == ["model.safetensors"]
    return out


def test_from_pretrained_reads_each_folder_to_the_same_weights(folders: dict[str, Path]) -> None:
    # the fixtures are what the real loader reads: the three folders hold one model
    states = [transformers.BertModel.from_pretrained(folder).state_dict() for folder in folders.values()]
    assert all(torch.equal(states[0][k], state[k]) for state in states[1:] for k in states[0])


@pytest.mark.parametrize(
    "name, chosen, fmt", [("one", "model.safetensors", "safetensors"), ("bin", "pytorch_model.bin", "zip")]
)
def test_a_one_file_folder_opens_as_that_file_with_the_sharded_folder_s_keys(
    folders: dict[str, Path], name: str, chosen: str, fmt: str
) -> None:
    checkpoint = open_checkpoint(str(folders[name]))
    assert checkpoint.format == fmt and checkpoint.path == str(folders[name] / chosen)
    sharded = open_checkpoint(str(folders["sharded"]))
    assert sorted(checkpoint.root) == sorted(sharded.root)
    assert sorted(checkpoint.root) == sorted(transformers.BertModel.from_pretrained(folders[name]).state_dict())


@pytest.mark.parametrize("name", ["one", "bin"])
def test_diff_of_the_sharded_and_the_one_file_folder_is_identical(
    folders: dict[str, Path], capsys: Any, name: str
) -> None:
    code, out, _ = run(capsys, "diff", str(folders["sharded"]), str(folders[name]))
    assert code == 0, out
    assert out.startswith("identical: 39 tensors bit-for-bit equal")


@pytest.mark.parametrize("name", ["one", "bin"])
def test_check_of_the_one_file_folder_against_the_sharded_one_fits(
    folders: dict[str, Path], capsys: Any, name: str
) -> None:
    code, out, _ = run(capsys, "check", str(folders[name]), "--against", str(folders["sharded"]))
    assert code == 0, out
    assert out.startswith("OK: 39/39 reference keys found")
    code, out, _ = run(capsys, "check", str(folders["sharded"]), "--against", str(folders[name]))
    assert code == 0 and out.startswith("OK: 39/39"), out


def test_info_names_the_file_taken_why_and_the_other_files(folders: dict[str, Path], capsys: Any) -> None:
    code, out, _ = run(capsys, "info", str(folders["one"]))
    assert code == 0
    assert out.startswith(f"{folders['one'] / 'model.safetensors'}\n  format      safetensors,")
    note = next(line for line in out.splitlines() if "loads model.safetensors" in line)
    assert note.strip() == (
        f"note        from_pretrained({folders['one']}) loads model.safetensors ({ORDER}, in that order); "
        "other files: config.json, tokenizer.json, tokenizer_config.json"
    )
    # no nesting under the file's name, so no finding that the weights lie under ckpt["model"]
    assert "ckpt[" not in out and "saved together" not in out
    code, out, _ = run(capsys, "info", str(folders["sharded"]))
    assert f"from_pretrained({folders['sharded']}) loads model.safetensors.index.json ({ORDER}" in out


def _loads_as(folder: Path, reference: Path, capsys: Any) -> None:
    """from_pretrained(folder) gives the weights of ``reference``, and ckpt-tui reads the folder as those too."""
    loaded_weights = transformers.BertModel.from_pretrained(folder).state_dict()
    expected = transformers.BertModel.from_pretrained(reference).state_dict()
    assert all(torch.equal(loaded_weights[k], expected[k]) for k in expected)
    code, out, _ = run(capsys, "diff", str(folder), str(reference))
    assert code == 0 and out.startswith("identical: 39 tensors"), out


def test_a_folder_with_both_files_takes_model_safetensors_and_names_the_other(
    folders: dict[str, Path], tmp_path: Path, capsys: Any
) -> None:
    folder = tmp_path / "both"
    shutil.copytree(folders["one"], folder)
    # another model's weights as pytorch_model.bin: from_pretrained takes model.safetensors all the same
    other = _bert()
    torch.nn.init.ones_(other.pooler.dense.weight)
    torch.save(other.state_dict(), folder / "pytorch_model.bin")
    _loads_as(folder, folders["one"], capsys)
    assert open_checkpoint(str(folder)).path == str(folder / "model.safetensors")
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 0, out
    assert "loads model.safetensors (" in out and "; pytorch_model.bin beside it is not what it loads;" in out
    # pytorch_model.bin is still read for code, as every file beside a checkpoint is
    assert "also in the folder: pytorch_model.bin: read for code: none" in out


def test_the_file_config_json_names_is_taken_first(folders: dict[str, Path], tmp_path: Path, capsys: Any) -> None:
    folder = tmp_path / "named"
    shutil.copytree(folders["one"], folder)
    (folder / "model.safetensors").rename(folder / "custom.safetensors")
    # another model's weights under the usual name: config.json's transformers_weights wins over it
    other = _bert()
    torch.nn.init.ones_(other.pooler.dense.weight)
    other.save_pretrained(tmp_path / "other")
    shutil.copy(tmp_path / "other" / "model.safetensors", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "transformers_weights": "custom.safetensors"}))
    _loads_as(folder, folders["one"], capsys)
    code, out, _ = run(capsys, "info", str(folder))
    assert code == 0
    assert f"from_pretrained({folder}) loads custom.safetensors (config.json names it in transformers_weights);" in out
    assert "model.safetensors beside it is not what it loads" in out


def test_save_model_s_folder_with_training_args_opens_as_its_model(
    folders: dict[str, Path], tmp_path: Path, capsys: Any
) -> None:
    folder = tmp_path / "final"
    shutil.copytree(folders["one"], folder)
    # what Trainer.save_model writes beside the model: torch.save(self.args)
    torch.save(transformers.TrainingArguments(str(tmp_path / "run"), report_to=[]), folder / "training_args.bin")
    checkpoint = open_checkpoint(str(folder))
    assert checkpoint.format == "safetensors" and len(checkpoint.root) == 39
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 0, out
    assert "also in the folder: training_args.bin: read for code: none" in out


def test_convert_of_the_folder_writes_the_model_from_pretrained_reads(
    folders: dict[str, Path], tmp_path: Path, capsys: Any
) -> None:
    code, _, err = run(capsys, "convert", str(folders["one"]), "-o", str(tmp_path / "out"), "--max-shard-size", "20KB")
    assert code == 0, err
    loaded_back = transformers.BertModel.from_pretrained(tmp_path / "out").state_dict()
    original = transformers.BertModel.from_pretrained(folders["one"]).state_dict()
    assert all(torch.equal(original[k], loaded_back[k]) for k in original)
    code, _, err = run(capsys, "convert", str(folders["bin"]), "-o", str(tmp_path / "flat.pth"))
    assert code == 0, err
    written = torch.load(tmp_path / "flat.pth", weights_only=True)
    assert sorted(written) == sorted(original) and all(torch.equal(original[k], written[k]) for k in original)


async def test_the_browser_opens_the_folder_as_its_weights_file(folders: dict[str, Path]) -> None:
    app = CkptApp(str(folders["one"]))
    async with app.run_test(size=(80, 24)) as pilot:
        tree = await loaded(pilot)
        assert len(tree.root.children) == 39
        shown = screen_text(app)
        assert "embeddings." in shown and "model dict" not in shown


def test_a_peft_adapter_folder_opens_as_its_adapter_file(tmp_path: Path, capsys: Any) -> None:
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_bert(), peft.LoraConfig(r=2, target_modules=["query", "value"]))
    model.save_pretrained(tmp_path / "adapter")
    checkpoint = open_checkpoint(str(tmp_path / "adapter"))
    assert checkpoint.path == str(tmp_path / "adapter" / "adapter_model.safetensors")
    assert all("lora_" in key for key in checkpoint.root) and len(checkpoint.root) == 8
    code, out, _ = run(capsys, "info", str(tmp_path / "adapter"))
    assert code == 0
    assert f"PeftModel.from_pretrained({tmp_path / 'adapter'}) loads adapter_model.safetensors (it looks for" in out


def test_a_one_file_folder_s_url_opens_as_its_file(folders: dict[str, Path], stdlib: Server) -> None:  # noqa: F811
    shutil.copytree(folders["one"], stdlib.root / "bert")
    remote = open_checkpoint(f"{stdlib.url}/bert/")
    assert remote.format == "safetensors"
    assert sorted(remote.root) == sorted(open_checkpoint(str(folders["sharded"])).root)


def test_a_one_file_hub_repo_opens_as_its_file(folders: dict[str, Path], hub: RangeServer, capsys: Any) -> None:  # noqa: F811
    shutil.copytree(folders["one"], root_of(hub) / "org" / "bert")
    assert open_checkpoint("hf://org/bert").format == "safetensors"
    code, out, _ = run(capsys, "diff", "hf://org/bert", str(folders["sharded"]))
    assert code == 0 and out.startswith("identical: 39 tensors"), out


# ---- a folder that holds no checkpoint ---------------------------------------------------------------


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real wheel, built by setuptools (a zip archive with no data.pkl)."""
    project = tmp_path_factory.mktemp("project")
    (project / "tinypkg").mkdir()
    (project / "tinypkg" / "__init__.py").write_text("x = 1\n")
    (project / "pyproject.toml").write_text(
        '[project]\nname = "tinypkg"\nversion = "0.1"\n'
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
    )
    out = tmp_path_factory.mktemp("dist")
    build = f"import setuptools.build_meta as b; print(b.build_wheel({str(out)!r}))"
    name = subprocess.run([sys.executable, "-c", build], cwd=project, check=True, capture_output=True, text=True)
    return out / name.stdout.strip().splitlines()[-1]


def test_a_folder_of_wheels_says_it_holds_no_checkpoint(wheel: Path, tmp_path: Path, capsys: Any) -> None:
    folder = tmp_path / "pkgs"
    folder.mkdir()
    for name in (
        "lpips-0.1.4-py3-none-any.whl",
        "facenet_pytorch-2.6.0-py3-none-any.whl",
        "silero_vad-6.2.3-py3-none-any.whl",
    ):
        shutil.copy(wheel, folder / name)
    for command in ("info", "check"):
        code, _, err = run(capsys, command, str(folder))
        assert code == 2
        holds = "3 zip archives that are not torch checkpoints (.whl)"
        assert err == f"ckpt-tui: {folder}: no checkpoint in this folder: {holds}\n"
    # what torch.load says of one of them: not a checkpoint either
    with pytest.raises(RuntimeError):
        torch.load(folder / "lpips-0.1.4-py3-none-any.whl", weights_only=False)


def test_a_wheel_among_checkpoints_is_not_counted(wheel: Path, tmp_path: Path, capsys: Any) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    for name in ("epoch_1.pth", "epoch_2.pth"):
        torch.save({"w": torch.ones(2)}, folder / name)
    shutil.copy(wheel, folder / "tinypkg-0.1-py3-none-any.whl")
    shutil.copy(wheel, folder / "weights.pt")  # named as a checkpoint, a zip all the same
    code, _, err = run(capsys, "info", str(folder))
    assert code == 2
    example = f"ckpt-tui {folder}/epoch_2.pth"
    assert err == f"ckpt-tui: {folder}: a folder of 2 separate checkpoints, not one save: open one ({example})\n"


def test_a_wheel_beside_a_model_is_data(folders: dict[str, Path], wheel: Path, tmp_path: Path, capsys: Any) -> None:
    folder = tmp_path / "bert"
    shutil.copytree(folders["one"], folder)
    shutil.copy(wheel, folder)
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 0, out
    assert "cannot tell" not in out


def test_a_folder_of_one_saved_file_opens_that_file(tmp_path: Path, capsys: Any) -> None:
    torch.save({"step": 3}, tmp_path / "scheduler.bin")
    code, out, _ = run(capsys, "info", str(tmp_path))
    assert code == 0
    assert "the folder's one checkpoint, scheduler.bin, opened as that file" in out
    # the same tree, keys and paths as the file opened by its path
    assert run(capsys, "diff", str(tmp_path), str(tmp_path / "scheduler.bin"))[0] == 0


def test_a_folder_of_text_files_named_pth_says_what_it_holds(tmp_path: Path, capsys: Any) -> None:
    for name in ("a.pth", "b.pth", "README.md"):
        (tmp_path / name).write_text("notes\n")
    code, _, err = run(capsys, "info", str(tmp_path))
    assert code == 2
    assert err == f"ckpt-tui: {tmp_path}: no checkpoint in this folder: 3 text files (README.md, a.pth, b.pth)\n"


def test_a_diffusers_folder_opens_as_from_pretrained_picks_its_file(tmp_path: Path, capsys: Any) -> None:
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(
        sample_size=8,
        in_channels=1,
        out_channels=1,
        layers_per_block=1,
        block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"),
        norm_num_groups=4,
    )
    unet.save_pretrained(tmp_path / "one")
    unet.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "diffusion_pytorch_model.safetensors.index.json").exists()
    one = open_checkpoint(str(tmp_path / "one"))
    assert one.path == str(tmp_path / "one" / "diffusion_pytorch_model.safetensors")
    assert sorted(one.root) == sorted(unet.state_dict())
    code, out, _ = run(capsys, "diff", str(tmp_path / "one"), str(tmp_path / "sharded"))
    assert code == 0 and out.startswith("identical:"), out
    code, out, _ = run(capsys, "info", str(tmp_path / "one"))
    assert f"diffusers' from_pretrained({tmp_path / 'one'}) loads diffusion_pytorch_model.safetensors (" in out
    # beside its index, diffusers takes the index: another model's whole file there is passed over
    torch.nn.init.ones_(unet.conv_out.weight)
    unet.save_pretrained(tmp_path / "other")
    shutil.copy(tmp_path / "other" / "diffusion_pytorch_model.safetensors", tmp_path / "sharded")
    loaded_weights = diffusers.UNet2DModel.from_pretrained(tmp_path / "sharded").state_dict()
    assert not torch.equal(loaded_weights["conv_out.weight"], unet.state_dict()["conv_out.weight"])
    code, out, _ = run(capsys, "diff", str(tmp_path / "sharded"), str(tmp_path / "one"))
    assert code == 0 and out.startswith("identical:"), out
