"""Say what an edit drops and when it has nothing to do: an extract names the epoch, the optimizer with its
size and the scheduler it leaves out; a cast to the dtype the weights have is a no-op with a note; a cast
after extracting a dynamic-quantized module writes a file that loads into it."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from ckpt_tui.cli import main
from ckpt_tui.core.edits import tree_edits as edits
from ckpt_tui.core.readers.open import open_checkpoint


def training_checkpoint(tmp_path):
    model = nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 2)
    path = tmp_path / "run.pth"
    state = {"epoch": 7, "model_state_dict": model.state_dict(), "optimizer_state_dict": optimizer.state_dict()}
    torch.save({**state, "scheduler": scheduler.state_dict()}, path)
    return path


def test_extract_says_it_drops_the_epoch_the_optimizer_with_its_size_and_the_scheduler(tmp_path, capsys):
    root = open_checkpoint(str(training_checkpoint(tmp_path))).root
    _, change = edits.extract(root, ("model_state_dict",))
    assert change.notes == [
        'drops epoch = 7, the optimizer state at ckpt["optimizer_state_dict"] (32 elements), '
        'the LR scheduler state at ckpt["scheduler"]'
    ]
    assert main(["convert", str(tmp_path / "run.pth"), "--extract", "model_state_dict", "--dry-run"]) == 0
    assert "drops epoch = 7, the optimizer state" in capsys.readouterr().out


def test_a_cast_to_the_dtype_the_weights_have_is_a_no_op_with_a_note(tmp_path, capsys):
    torch.save({k: v.half() for k, v in nn.Linear(4, 3).state_dict().items()}, tmp_path / "half.pth")
    assert main(["convert", str(tmp_path / "half.pth"), "--dtype", "fp16", "-o", str(tmp_path / "out.pth")]) == 0
    assert "already float16 (2 tensors): nothing to cast" in capsys.readouterr().out
    assert all(v.dtype == torch.float16 for v in torch.load(tmp_path / "out.pth", weights_only=True).values())


def test_a_cast_of_a_dynamic_quantized_module_after_extract_loads_into_it(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
        quantized = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
        torch.save(quantized, tmp_path / "dq.pth")
        out = tmp_path / "dq16.pth"
        assert main(["convert", str(tmp_path / "dq.pth"), "--extract", "auto", "--dtype", "fp16", "-o", str(out)]) == 0
        state = torch.load(out, weights_only=True)
        assert state["0._packed_params._packed_params"][1].dtype == torch.float16
        result = quantized.load_state_dict(state)
    assert not result.missing_keys and not result.unexpected_keys


class Recurrent(nn.Module):
    """A whole module with an LSTM: its ``_flat_weights`` list names each weight a second time."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 8, num_layers=2)
        self.fc = nn.Linear(8, 2)


def test_a_whole_module_with_an_lstm_counts_each_tensor_once(tmp_path, capsys):
    torch.save(Recurrent(), tmp_path / "net.pth")
    assert main(["info", str(tmp_path / "net.pth")]) == 0
    text = capsys.readouterr().out
    assert "  tensors     10 (+8 names for the same tensors)" in text and "float32 10 " in text


def test_every_count_says_what_it_counts_and_they_add_up(tmp_path, capsys):
    path = training_checkpoint(tmp_path)
    assert main(["info", str(path)]) == 0
    text = capsys.readouterr().out
    assert "  elements    15 params (model) + 32 optimizer state" in text
    assert "(root) dict (4) · 8 tensors · 47 elements" in text
    assert "model_state_dict  OrderedDict (2) · 2 tensors · 15 elements" in text


def test_extract_names_every_key_it_drops_past_the_six_it_describes(tmp_path):
    # a Lightning checkpoint's top level: hyper_parameters must not hide behind "and 4 more"
    extra = ["loops", "callbacks", "lr_schedulers", "hparams_name", "hyper_parameters"]
    state = {"state_dict": nn.Linear(2, 2).state_dict(), "epoch": 1, "global_step": 8}
    state |= {"pytorch-lightning_version": "2.6.6", "optimizer_states": [], "legacy": 0}
    state |= {name: {"name": name} for name in extra}
    torch.save(state, tmp_path / "last.ckpt")
    root = open_checkpoint(str(tmp_path / "last.ckpt")).root
    _, change = edits.extract(root, ("state_dict",))
    [note] = change.notes
    assert note.startswith("drops epoch = 1, global_step = 8")
    assert note.endswith(" and 4 more (callbacks, lr_schedulers, hparams_name, hyper_parameters)")
