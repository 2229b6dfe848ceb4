"""Write screenshots/*.svg from the real app on generated checkpoints.

python scripts/screenshots.py [--out screenshots]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from builders import save_cuda_tagged, training_checkpoint
from builders_tui import layered_checkpoint

from ckpt_tui.tui.app import CkptApp

SIZE = (120, 36)
SIZES = {"layers": (80, 24)}
"""Scenes shown at another size (the layers view at the smallest terminal it is made for)."""
# name -> keys pressed after the file is shown
SCENES: dict[str, list[str]] = {
    "tree": ["j", "j", "l"],
    "stats": ["j", "j", "l", "l", "enter"],
    "strip-prefix-preview": ["j", "j", "p"],
    "save-dialog": ["j", "j", "p", "y", "ctrl+s"],
    "help": ["question_mark"],
    "check-all": ["j", "j", "l", "C"],
    "layers": ["L", "s"],
    "layers-histogram": ["L", "j", "p", "o"],
    "layers-bytes": ["L", "p", "p"],
    "deepspeed-zero": ["l", "l", "l", "enter"],
}
ZERO_FOLDER = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "deepspeed" / "zero2_fp32"
"""A DeepSpeed ZeRO-2 folder written by DeepSpeed itself (scripts/make_deepspeed_fixtures.py)."""


async def shoot(path: Path, name: str, keys: list[str], out: Path) -> None:
    app = CkptApp(str(path))
    async with app.run_test(size=SIZES.get(name, SIZE)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        for key in keys:
            await pilot.press(key)
            await app.workers.wait_for_complete()
            await pilot.pause()
        await pilot.pause(0.3)
        app.save_screenshot(f"{name}.svg", str(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("screenshots"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        path = save_cuda_tagged(training_checkpoint(), Path(folder) / "best_model.pth")
        layered = layered_checkpoint(Path(folder) / "run_0012.pth", count=12)
        for name, keys in SCENES.items():
            source = layered if name.startswith("layers") else ZERO_FOLDER if name == "deepspeed-zero" else path
            asyncio.run(shoot(source, name, keys, args.out.resolve()))
            print(f"wrote {args.out / name}.svg")


if __name__ == "__main__":
    main()
