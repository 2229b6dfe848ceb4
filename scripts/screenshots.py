"""Write screenshots/*.svg from the real app, on checkpoints like the ones people have.

python scripts/screenshots.py [--out screenshots] [--only NAME ...]

Two models are trained for a few real steps on CPU from a random init and saved the way DDP users save
them (``module.`` keys inside a training dict with the optimizer, the scheduler and the epoch):
a ResNet-18 (11.7M parameters, SGD with momentum) and a GPT-2 small (124M parameters, AdamW: a 1.5 GB
file). Everything is written into a temporary folder and removed afterwards; only the SVGs are kept.
Every scene is taken at 80x24 and at 120x40. It takes a few minutes (the GPT-2 file is most of it).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the app of this checkout, whatever ckpt-tui is installed

from ckpt_tui.tui.app import CkptApp  # noqa: E402

SIZES = ((80, 24), (120, 40))
ZERO_FOLDER = ROOT / "tests" / "fixtures" / "deepspeed" / "zero2_fp32"
"""A DeepSpeed ZeRO-2 folder written by DeepSpeed itself (scripts/make_deepspeed_fixtures.py)."""
ZERO = "zero2_fp32"
GPT2 = "gpt2_step3.pth"
NAN_KEY = "module.layer3.1.conv2.weight"
"""Where a NaN is planted in the second epoch's file (the layers view and check-all mark it)."""


# ---- the models: torchvision's ResNet-18 and Hugging Face's GPT-2 key layouts --------------------------------


class BasicBlock(nn.Module):
    """torchvision's ResNet basic block (the same parameter names)."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (self.downsample(x) if self.downsample is not None else x))


class ResNet18(nn.Module):
    """torchvision's resnet18 (11.7M parameters, the same state_dict keys and shapes)."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, inplanes = [], 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers.append(nn.Sequential(BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes)))
            inplanes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Conv1D(nn.Module):
    """GPT-2's linear layer (weight stored [in, out])."""

    def __init__(self, inputs: int, outputs: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(inputs, outputs).normal_(std=0.02))
        self.bias = nn.Parameter(torch.zeros(outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], -1)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = Conv1D(width, 3 * width)
        self.c_proj = Conv1D(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(out.transpose(1, 2).reshape(batch, length, width))


class MLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.c_fc = Conv1D(width, 4 * width)
        self.c_proj = Conv1D(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = MLP(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, vocab: int, positions: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(positions, width)
        self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.01)


class GPT2LMHead(nn.Module):
    """Hugging Face's GPT2LMHeadModel key layout at GPT-2 small's size (124M parameters, lm_head tied to wte)."""

    def __init__(self, vocab: int = 50257, positions: int = 1024, width: int = 768, layers: int = 12) -> None:
        super().__init__()
        self.transformer = Transformer(vocab, positions, width, layers, heads=12)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        body = self.transformer
        x = body.wte(ids) + body.wpe(torch.arange(ids.shape[1]))
        for block in body.h:
            x = block(x)
        return self.lm_head(body.ln_f(x))


# ---- the files ------------------------------------------------------------------------------------------------


def train_resnet(folder: Path) -> dict[str, Path]:
    """A ResNet-18 run as DDP saves it (two epochs' files, one with a planted NaN) and the bare model's file."""
    torch.manual_seed(0)
    model = nn.DataParallel(ResNet18())  # on CPU it only adds the module. prefix, as DDP does
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 30)
    files = {}
    for epoch in (1, 2):
        for _ in range(2):
            images, labels = torch.randn(8, 3, 64, 64), torch.randint(0, 1000, (8,))
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        scheduler.step()
        state = model.state_dict()
        if epoch == 2:  # a diverged step: one NaN in a weight
            state[NAN_KEY] = state[NAN_KEY].clone()
            state[NAN_KEY][0, 0, 0, 0] = math.nan
        checkpoint = {
            "epoch": epoch,
            "arch": "resnet18",
            "model_state_dict": state,
            "optimizer_state_dict": optimizer.state_dict(),
            "scheduler_state_dict": scheduler.state_dict(),
            "best_acc1": 0.0,
        }
        name = "best_model.pth" if epoch == 1 else "epoch_2.pth"
        torch.save(checkpoint, folder / name)
        files[name] = folder / name
    torch.save(ResNet18().state_dict(), folder / "resnet18.pth")  # what the user's model code expects
    files["resnet18.pth"] = folder / "resnet18.pth"
    return files


def train_gpt2(folder: Path) -> Path:
    """A GPT-2 small run after three AdamW steps, saved as a DDP training loop saves it."""
    torch.manual_seed(0)
    model = nn.DataParallel(GPT2LMHead())
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 100))
    for _ in range(3):
        tokens = torch.randint(0, 50257, (2, 33))
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
    path = folder / GPT2
    config = {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50257, "block_size": 1024}
    torch.save(
        {
            "step": 3,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "config": config,
        },
        path,
    )
    return path


# ---- the scenes -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Typed:
    """Text typed into the focused field (a prompt, the search line), then enter; ``@NAME``: the path of a file."""

    text: str


Step = str | Typed


@dataclass(frozen=True)
class Scene:
    """A file, the keys pressed once it is shown, and what it shows."""

    name: str
    source: str
    """The file's name (in the temporary folder), or ``ZERO`` for the DeepSpeed folder."""
    steps: tuple[Step, ...]


SCENES = [
    # the story: a DDP training checkpoint compared with the model it should load into, then the fix
    Scene("compare", "best_model.pth", ("c", Typed("@resnet18.pth"))),
    Scene("fix-preview", "best_model.pth", ("c", Typed("@resnet18.pth"), "f")),
    Scene("tree", "best_model.pth", ("j", "j", "j", "l", *("j",) * 7)),
    # a later epoch with a NaN: every tensor read (C), the cursor on the marked tensor; the layers view
    Scene("check-all", "epoch_2.pth", ("C", "slash", Typed("layer3.1.conv2.weight"))),
    Scene("layers", "epoch_2.pth", ("L", "s")),
    # GPT-2 small: a weight's stats with its histogram, the model grouped by module
    Scene("stats", GPT2, ("slash", Typed("h.0.mlp.c_fc.weight"), "enter")),
    Scene("gpt2-modules", GPT2, ("j", "j", "v", "l", "l", "l", "l", "l", "j", "j", "j", "l")),
    Scene("layers-histogram", GPT2, ("L", "p")),
    Scene("deepspeed-zero", ZERO, ("l", "l", "l", "enter")),
    Scene("help", "best_model.pth", ("question_mark",)),
]


async def shoot(scene: Scene, files: dict[str, Path], size: tuple[int, int], out: Path) -> str:
    """Open the file at ``size``, take the scene's steps, and save the screen."""
    app = CkptApp(str(files[scene.source]))
    async with app.run_test(size=size) as pilot:
        await settled(pilot)
        for step in scene.steps:
            if isinstance(step, Typed):
                text = str(files[step.text[1:]]) if step.text.startswith("@") else step.text
                app.focused.value = text  # type: ignore[union-attr]
                await pilot.press("enter")
            else:
                await pilot.press(step)
            await settled(pilot)
        await pilot.pause(0.3)
        name = f"{scene.name}-{size[0]}x{size[1]}.svg"
        app.save_screenshot(name, str(out))
        return name


async def settled(pilot: Any) -> None:
    """Wait until every worker is done (reading, counting, stats) and the screen is painted."""
    for _ in range(3):
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("screenshots"))
    parser.add_argument("--only", nargs="*", metavar="NAME", help="only these scenes")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    scenes = [scene for scene in SCENES if not args.only or scene.name in args.only]
    out = args.out.resolve()
    with tempfile.TemporaryDirectory() as temp:
        folder = Path(temp)
        started = time.monotonic()
        files = {**train_resnet(folder), ZERO: ZERO_FOLDER}
        if any(scene.source == GPT2 for scene in scenes):
            files[GPT2] = train_gpt2(folder)
        print(f"trained and saved in {time.monotonic() - started:.0f} s")
        # opened by their names from inside the folder: the commands the app shows read as a user's would
        home = os.getcwd()
        os.chdir(folder)
        files = {name: Path(path.name) if path.parent == folder else path for name, path in files.items()}
        for scene in scenes:
            for size in SIZES:
                started = time.monotonic()
                name = asyncio.run(shoot(scene, files, size, out))
                print(f"wrote {args.out / name} ({time.monotonic() - started:.0f} s)")
        os.chdir(home)


if __name__ == "__main__":
    main()
