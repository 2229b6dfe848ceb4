"""``diff --stats`` of two Lightning checkpoints: the model's layers in the table and plot, the optimizer
state and Lightning's own tensors (a callback's best score) apart, and NaN/Inf named where they are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from ckpt_tui.cli.entry import main


def two_epochs(tmp_path: Path) -> tuple[Path, Path]:
    """A real Lightning run (Adam, ModelCheckpoint keeping every epoch): its checkpoints of epochs 0 and 1."""
    pl = pytest.importorskip("pytorch_lightning")
    torch.manual_seed(0)

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))

        def training_step(self, batch: Any, _: int) -> torch.Tensor:
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    saved = tmp_path / "ckpts"
    keep = pl.callbacks.ModelCheckpoint(dirpath=saved, save_top_k=-1, filename="e{epoch}")
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        callbacks=[keep],
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4)
    trainer.fit(Module(), data)
    return saved / "eepoch=0.ckpt", saved / "eepoch=1.ckpt"


def test_the_model_layers_come_alone_and_the_rest_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = two_epochs(tmp_path)
    assert main(["diff", str(first), str(second), "--stats", "--json"]) == 1
    layers = json.loads(capsys.readouterr().out)["layers"]
    roles = {"/".join(map(str, layer["path"])): layer["role"] for layer in layers}
    model = {key for key, role in roles.items() if key.startswith("state_dict/")}
    assert model and all(roles[key] in ("parameter", "buffer", "counter") for key in model)
    others = {key: role for key, role in roles.items() if key not in model}
    assert others and set(others.values()) <= {"optimizer state", "other"}
    assert main(["diff", str(first), str(second), "--stats"]) == 1
    text = capsys.readouterr().out
    # the start all the model's rows share is said once, in the title
    table = text.split("per layer, under state_dict/net. (", 1)[1].split("relative change by layer", 1)[0]
    assert "\n  0.weight " in table and "exp_avg" not in table and "callbacks" not in table
    assert "optimizer state and other tensors (" in text
    assert text.splitlines()[0].startswith(f"per-layer change: {len(model)} layers of the model and ")


def test_nan_or_inf_left_out_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = {"w": torch.ones(4), "score": torch.tensor(float("inf"))}
    b = {"w": torch.ones(4) * 2, "score": torch.tensor(float("inf"))}
    torch.save(a, tmp_path / "a.pth")
    torch.save(b, tmp_path / "b.pth")
    assert main(["diff", str(tmp_path / "a.pth"), str(tmp_path / "b.pth"), "--stats"]) == 1
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert notes == [
        "note: 1 tensor not compared, every value NaN or Inf on a side (score): no change to give, and none left in "
        "the median or the layers that moved"
    ]
