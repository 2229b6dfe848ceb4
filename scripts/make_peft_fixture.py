"""Write tests/fixtures/peft: a LoRA'd BertForSequenceClassification (peft, task_type=SEQ_CLS, so the head is
wrapped in modules_to_save) trained 4 steps inside a LightningModule, saved by Lightning's Trainer.

    python scripts/make_peft_fixture.py tests/fixtures/peft    # needs peft, transformers, pytorch_lightning

Files: ``lora_run.ckpt`` (Trainer.save_checkpoint), ``plain.pth`` (a fresh BertForSequenceClassification's
state_dict: the model the user loads into), ``merged.pth`` (``merge_and_unload()`` of the trained model: the
head that trained, and the LoRA'd layers with their fine-tune merged in).
"""

from __future__ import annotations

import sys
from pathlib import Path

import peft
import pytorch_lightning as pl
import torch
import transformers as tf

BERT = {
    "vocab_size": 50,
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 32,
    "num_labels": 3,
}


class Lit(pl.LightningModule):  # type: ignore[misc]
    """The PEFT model held as .model, trained on random labels."""

    def __init__(self) -> None:
        super().__init__()
        base = tf.BertForSequenceClassification(tf.BertConfig(**BERT))
        config = peft.LoraConfig(task_type=peft.TaskType.SEQ_CLS, r=2, target_modules=["query", "value"])
        self.model = peft.get_peft_model(base, config)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        ids, labels = batch
        return self.model(input_ids=ids, labels=labels).loss  # type: ignore[no-any-return]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=5e-2)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randint(0, 50, (16, 8)), torch.randint(0, 3, (16,)))
    lit = Lit()
    trainer = pl.Trainer(
        max_steps=4,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(lit, torch.utils.data.DataLoader(data, batch_size=4))
    trainer.save_checkpoint(out / "lora_run.ckpt")
    torch.manual_seed(1)
    torch.save(tf.BertForSequenceClassification(tf.BertConfig(**BERT)).state_dict(), out / "plain.pth")
    merged = lit.model.merge_and_unload()
    torch.save({k: v.clone() for k, v in merged.state_dict().items()}, out / "merged.pth")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/peft"))
