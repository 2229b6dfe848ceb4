"""A repeated (``expand``, stride-0) view too big to read element by element still gets the first NaN and
Inf position torch gives (``torch.isnan(t).nonzero()[0]``): found in the view without its stride-0
dimensions, at index 0 along them. Generated views (stride-0 dimensions anywhere, transposed and sliced
bases, float64 so that 9M elements are past the element-by-element limit), each against the real torch.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
from pathlib import Path
from typing import Any

import torch

from ckpt_tui.cli import main


def first_position(mask: torch.Tensor) -> list[int] | None:
    """torch's first True position in row-major order (``mask.nonzero()[0]`` without the list of all)."""
    flat = mask.reshape(-1)
    if not bool(flat.any()):
        return None
    at = int(flat.to(torch.uint8).argmax())
    return [int(i) for i in torch.unravel_index(torch.tensor(at), mask.shape)]


def repeated_view(rng: random.Random) -> torch.Tensor:
    """A small base holding a few NaN/±Inf (or none), transposed or sliced, expanded along new dimensions."""
    base = torch.zeros(rng.randint(3, 40), rng.randint(3, 40), dtype=torch.float64)
    for value in rng.choices([float("nan"), float("inf"), -float("inf")], k=rng.randint(0, 4)):
        base[rng.randrange(base.shape[0]), rng.randrange(base.shape[1])] = value
    if rng.random() < 0.4:
        base = base.T
    if rng.random() < 0.4:
        base = base[1:, ::2]
    view = base
    while view.numel() < 9_000_000:
        dim, need = rng.randint(0, view.dim()), -(-9_000_000 // view.numel())
        # (just past 9M elements in all: torch's own isnan over the view stays cheap)
        size = need if need <= 60 else rng.randint(2, 60)
        view = view.unsqueeze(dim).expand(*view.shape[:dim], size, *view.shape[dim:])
    return view


def test_stride0_views_get_torchs_first_positions(tmp_path: Path) -> None:
    rng = random.Random(8)
    views = {f"v{index}": repeated_view(rng) for index in range(14)}
    path = tmp_path / "repeated.pth"
    torch.save(views, path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["check", "--json", str(path)])
    problems: dict[str, Any] = {p["path"][0]: p for p in json.loads(out.getvalue())["problems"] if "path" in p}
    loaded = torch.load(path, weights_only=True)
    seen = 0
    for key, tensor in loaded.items():
        assert 0 in tensor.stride() and tensor.numel() >= 9_000_000
        expected = (first_position(torch.isnan(tensor)), first_position(torch.isinf(tensor)))
        if expected == (None, None):
            assert key not in problems
            continue
        seen += 1
        assert (problems[key]["first_nan"], problems[key]["first_inf"]) == expected, key
        assert problems[key]["nan"] == int(torch.isnan(tensor).sum())
        place = f"first NaN at {expected[0]}" if expected[0] is not None else f"first Inf at {expected[1]}"
        assert place in problems[key]["message"]
    assert seen >= 6 and code == 1
