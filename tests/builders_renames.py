"""Real renamed and wrapped layouts built with torch: the same weights under the names other code
gives them (timm/torchvision-style renames, PEFT/LoRA wrapping as peft names it, EMA copies,
torch.compile inside DataParallel, Hugging Face bodies and tied heads)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch import nn

# ---- renamed modules ----------------------------------------------------------------------


class Attention(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)


class Mlp(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, dim * 2)
        self.fc2 = nn.Linear(dim * 2, dim)


class OldBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim)


class NewBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = Attention(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim)


class OldBackbone(nn.Module):
    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 4, 4)
        self.layers = nn.ModuleList(OldBlock(dim) for _ in range(depth))


class NewEncoder(nn.Module):
    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 4, 4)
        self.blocks = nn.ModuleList(NewBlock(dim) for _ in range(depth))


class OldViT(nn.Module):
    """``backbone.layers.N.attn.qkv``: the names one codebase gives a small ViT."""

    def __init__(self, dim: int = 8, depth: int = 3, classes: int = 5) -> None:
        super().__init__()
        self.backbone = OldBackbone(dim, depth)
        self.head = nn.Linear(dim, classes)


class NewViT(nn.Module):
    """``encoder.blocks.N.attention.qkv``: the same architecture as another codebase names it."""

    def __init__(self, dim: int = 8, depth: int = 3, classes: int = 5) -> None:
        super().__init__()
        self.encoder = NewEncoder(dim, depth)
        self.head = nn.Linear(dim, classes)


class TvBasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, downsample: bool) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        if downsample:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout))


class TvResNet(nn.Module):
    """torchvision's ResNet names: ``conv1``, ``bn1``, ``layer1.0.conv1``, ``downsample.0``, ``fc``."""

    def __init__(self, widths: tuple[int, ...] = (4, 8, 16)) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 7, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        cin = widths[0]
        for index, width in enumerate(widths, 1):
            blocks = [TvBasicBlock(cin, width, cin != width), TvBasicBlock(width, width, False)]
            setattr(self, f"layer{index}", nn.Sequential(*blocks))
            cin = width
        self.fc = nn.Linear(widths[-1], 10)


class StageBlock(nn.Module):
    def __init__(self, cin: int, cout: int, downsample: bool) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        if downsample:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout))


class Stage(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(StageBlock(cin, cout, cin != cout), StageBlock(cout, cout, False))


class StemNet(nn.Module):
    """The same network with timm-like names: ``stem.conv``, ``stages.0.blocks.0.conv1``, ``shortcut``, ``head.fc``."""

    def __init__(self, widths: tuple[int, ...] = (4, 8, 16)) -> None:
        super().__init__()
        stem = OrderedDict(conv=nn.Conv2d(3, widths[0], 7, bias=False), bn=nn.BatchNorm2d(widths[0]))
        self.stem = nn.Sequential(stem)
        stages = []
        cin = widths[0]
        for width in widths:
            stages.append(Stage(cin, width))
            cin = width
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(OrderedDict(fc=nn.Linear(widths[-1], 10)))


# ---- PEFT / LoRA, named the way peft names its wrappers -----------------------------------


class LoraLinear(nn.Module):
    """peft's ``lora.Linear``: the original layer as ``base_layer``, adapters in ModuleDicts by name."""

    def __init__(self, base: nn.Linear, rank: int = 2, adapter: str = "default") -> None:
        super().__init__()
        self.base_layer = base
        self.lora_dropout = nn.ModuleDict({adapter: nn.Identity()})
        self.lora_A = nn.ModuleDict({adapter: nn.Linear(base.in_features, rank, bias=False)})
        self.lora_B = nn.ModuleDict({adapter: nn.Linear(rank, base.out_features, bias=False)})


class LoraModel(nn.Module):
    """peft's ``LoraModel``: holds the wrapped model as ``model``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model


class PeftModel(nn.Module):
    """peft's ``PeftModel``: holds the ``LoraModel`` as ``base_model``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.base_model = LoraModel(model)


def lora_wrapped(model: nn.Module, targets: tuple[str, ...] = ("qkv", "proj")) -> PeftModel:
    """Wrap every Linear named in ``targets`` as peft does, then wrap the model in PeftModel."""
    for _, module in list(model.named_modules()):
        for name, child in list(module.named_children()):
            if name in targets and isinstance(child, nn.Linear):
                setattr(module, name, LoraLinear(child))
    return PeftModel(model)


# ---- EMA ----------------------------------------------------------------------------------


class EmaTrainer(nn.Module):
    """A training wrapper holding the live model as ``model`` and an EMA copy as ``ema``
    (an AveragedModel-like module with ``module`` and ``n_averaged``)."""

    def __init__(self, make: Any) -> None:
        super().__init__()
        self.model = make()
        self.ema = nn.Module()
        self.ema.module = make()
        self.ema.register_buffer("n_averaged", torch.tensor(3))


# ---- Hugging Face style -------------------------------------------------------------------


class TinyGPTBody(nn.Module):
    def __init__(self, vocab: int = 11, dim: int = 6, layers: int = 2) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(16, dim)
        self.h = nn.ModuleList(OldBlock(dim) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)


class TinyGPTLMHead(nn.Module):
    """``transformer.`` body and ``lm_head`` tied to ``transformer.wte``, as GPT-2 is laid out."""

    def __init__(self) -> None:
        super().__init__()
        self.transformer = TinyGPTBody()
        self.lm_head = nn.Linear(6, 11, bias=False)
        self.lm_head.weight = self.transformer.wte.weight


def hf_state_dict_without_tied(model: nn.Module) -> OrderedDict[str, torch.Tensor]:
    """What Hugging Face saves: the tied ``lm_head.weight`` left out."""
    state = model.state_dict()
    del state["lm_head.weight"]
    return state


def seeded(make: Any) -> Any:
    torch.manual_seed(0)
    return make()


# ---- an index shifted by a removed layer -------------------------------------------------------------------


class NetLinLayer(nn.Module):
    """lpips' 1x1 projection: ``model`` is ``Sequential(Dropout, Conv2d)`` with dropout, ``Sequential(Conv2d)``
    without, so every weight moves from ``model.1`` to ``model.0``."""

    def __init__(self, channels: int, use_dropout: bool) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Dropout()] if use_dropout else []
        layers.append(nn.Conv2d(channels, 1, 1, bias=False))
        self.model = nn.Sequential(*layers)


class LinLayers(nn.Module):
    """lpips' five ``linN`` heads (alexnet's channels, two of one width: a listing by name cannot pair them)."""

    def __init__(self, use_dropout: bool = True, channels: tuple[int, ...] = (64, 192, 384, 256, 256)) -> None:
        super().__init__()
        for index, width in enumerate(channels):
            setattr(self, f"lin{index}", NetLinLayer(width, use_dropout))
