"""Compare a sanitized file with its source using real torch, in a fresh process.

Reads a JSON list of ``{"source": ..., "output": ...}`` on stdin. The output must load with
``torch.load(weights_only=True)``. The source (our own test fixture, so trusted) is loaded with
``weights_only=False``, with stand-ins for the test's throwaway ``ghost_*`` modules. Every tensor and
numpy array in the source must be in the output at the same path: tensors bit-equal, arrays equal
by value and dtype. Prints a JSON list of ``{"loads": bool, "error": str, "compared": int, "mismatches": [...]}``.
"""

from __future__ import annotations

import enum
import json
import pickle
import sys
import types
import warnings
from typing import Any


def _ghost_modules() -> None:
    """The classes the test fixtures saved from modules that exist only while saving."""
    import torch

    models = types.ModuleType("ghost_models")

    class GhostNet(torch.nn.Module):
        pass

    GhostNet.__module__ = "ghost_models"
    models.GhostNet = GhostNet  # type: ignore[attr-defined]
    config = types.ModuleType("ghost_config")

    class Config:
        pass

    Config.__module__ = "ghost_config"
    config.Config = Config  # type: ignore[attr-defined]
    enums = types.ModuleType("ghost_enums")
    phase = enum.Enum("Phase", {"WARMUP": 1, "MAIN": 2})  # type: ignore[misc]
    phase.__module__ = "ghost_enums"
    enums.Phase = phase  # type: ignore[attr-defined]
    sys.modules.update({"ghost_models": models, "ghost_config": config, "ghost_enums": enums})


def _flatten(value: Any, path: str, out: dict[str, Any], seen: set[int]) -> None:
    """Tensors and numpy arrays by ``/``-joined path, through containers, namespaces, modules and configs."""
    import numpy as np
    import torch

    if isinstance(value, (torch.Tensor, np.ndarray)):
        out[path] = value
        return
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, torch.nn.Module):
        for key, item in value.state_dict().items():
            out[f"{path}/{key}"] = item
        return
    if type(value).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        value = OmegaConf.to_container(value)
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        items = vars(value).items()
    else:
        return
    for key, item in items:
        _flatten(item, f"{path}/{key}", out, seen)


def _same(source: Any, output: Any) -> str | None:
    """None when equal (tensors bit for bit, arrays by value and dtype), else what differs."""
    import numpy as np
    import torch

    if not isinstance(output, torch.Tensor):
        return f"not a tensor in the output ({type(output).__name__})"
    if isinstance(source, np.ndarray):
        got = output.numpy()
        if got.dtype != source.dtype or got.shape != source.shape or not np.array_equal(got, source, equal_nan=True):
            return f"array differs: {source.dtype}{source.shape} vs {got.dtype}{got.shape}"
        return None
    if source.dtype != output.dtype or source.shape != output.shape:
        return f"{source.dtype}{tuple(source.shape)} vs {output.dtype}{tuple(output.shape)}"
    if source.is_quantized or source.is_sparse or source.layout != torch.strided or source.device.type == "meta":
        return None if str(source) == str(output) else "values differ"
    a = source.resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)
    b = output.resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)
    return None if torch.equal(a, b) else "bytes differ"


def main() -> None:
    """Run every comparison on stdin."""
    import torch

    warnings.simplefilter("ignore")
    _ghost_modules()
    results = []
    for job in json.load(sys.stdin):
        try:
            output = torch.load(job["output"], weights_only=True, map_location="cpu")
        except Exception as exc:  # the verdict is the exception's existence
            results.append({"loads": False, "error": f"{type(exc).__name__}: {exc}", "compared": 0, "mismatches": []})
            continue
        if not job.get("compare", True):
            results.append({"loads": True, "error": "", "compared": 0, "mismatches": []})
            continue
        with open(job["source"], "rb") as file:  # a file object: no routing by name
            try:
                source = torch.load(file, weights_only=False, map_location="cpu")
            except RuntimeError:  # a plain pickle (our own fixture): read as pickle reads it
                file.seek(0)
                source = pickle.load(file)
        expected: dict[str, Any] = {}
        got: dict[str, Any] = {}
        _flatten(source, "", expected, set())
        _flatten(output, "", got, set())
        mismatches = []
        for path, value in expected.items():
            if path not in got:
                mismatches.append(f"{path}: missing from the output")
                continue
            problem = _same(value, got[path])
            if problem:
                mismatches.append(f"{path}: {problem}")
        results.append({"loads": True, "error": "", "compared": len(expected), "mismatches": mismatches})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
