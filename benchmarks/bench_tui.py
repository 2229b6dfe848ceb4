"""The browser on many keys: time to the tree being shown, then every bound key pressed once, worst first.

    python benchmarks/bench_tui.py [--dir bench-data] [--size-gb 2] [--keys 50000] [--repeat 3]
                                   [--only start|keys] [--size 80x24] [--profile KEY]

``start``: each run is a fresh process, timed from its spawn to the moment its tree is on screen (interpreter
start, imports, reading the file, the first paint; not the exit). torch.load is timed to its exit, which is
when its result is usable.

``keys``: on a ``.safetensors`` and a ``.pth`` of ``--keys`` 16x16 fp32 tensors with ``module.``-prefixed keys
(as ``bench_peers.py`` builds them), one fresh browser per file presses every key bound on the browser once, in
binding order (each alias too: the first press of an action is the one that pays for what it builds), and after
each key waits for the screen to settle (its workers done, the detail panel's stats timer run). A key that opens
a dialog is timed to the dialog, which is then closed (untimed); ``p``'s preview is also answered ``y`` once so
that ``u``/``ctrl+r`` have an edit to undo and redo. Per key it prints:

- ``UI cpu``: CPU seconds on the UI thread (the event loop) from the press to the screen settling;
- ``step``: the longest single step the UI thread ran (CPU), i.e. how long the browser could not answer a key;
- ``wall``: wall seconds from the press to the screen settling, workers included.

On a loaded machine wall time mostly measures the load; judge a key by its UI-thread CPU. ``--profile KEY``
(or ``KEY,KEY``) prints a cProfile of the UI thread during those keys' first press, to stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from collections import OrderedDict
from pathlib import Path

from measure import measure, python_command, table, write_large, write_many

ROOT = Path(__file__).resolve().parent.parent
"""The repository: the browser processes run there, so that they import its ``ckpt_tui``."""

SHOW_TREE = """
import asyncio, sys
from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.widgets.tree_view import CheckpointTree

async def main():
    app = CkptApp(sys.argv[1])
    async with app.run_test(size=(120, 36)) as pilot:
        tree = app.query_one(CheckpointTree)
        while not tree.root.children:
            await pilot.pause(0.01)
        peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM")).split()[1]
        print("shown", peak, flush=True)

asyncio.run(main())
"""

PRESS_KEYS = r"""
import asyncio, asyncio.events, cProfile, gc, io, json, pstats, sys, threading, time

from ckpt_tui.core.runtime import process
from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.bindings import APP_BINDINGS, BROWSER_BINDINGS, TREE_BINDINGS
from ckpt_tui.tui.screens.browser import BrowserScreen
from ckpt_tui.tui.screens.dialogs import ConfirmScreen
from ckpt_tui.tui.widgets.detail import STATS_DELAY

path, width, height, profile_keys = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
SEARCH = "blocks.4321."
QUIT = ("q", "ctrl+q")


class Steps:
    # the longest single step of the event loop (one callback: a message handled, a task resumed)
    longest_cpu = 0.0
    longest_wall = 0.0


original = asyncio.events.Handle._run


def timed_run(self):
    cpu, wall = time.thread_time(), time.perf_counter()
    try:
        return original(self)
    finally:
        Steps.longest_cpu = max(Steps.longest_cpu, time.thread_time() - cpu)
        Steps.longest_wall = max(Steps.longest_wall, time.perf_counter() - wall)


asyncio.events.Handle._run = timed_run


class Collections:
    # garbage collections on the UI thread: when, and how long they took
    seconds = 0.0
    started = 0.0


def collected(phase, info):
    if threading.current_thread() is not threading.main_thread():
        return
    if phase == "start":
        Collections.started = time.thread_time()
    else:
        Collections.seconds += time.thread_time() - Collections.started


gc.callbacks.append(collected)


def key_names():
    names = []
    for binding in [*TREE_BINDINGS, *BROWSER_BINDINGS, *APP_BINDINGS]:
        for name in binding.key.split(","):
            if name not in names and name not in QUIT:
                names.append(name)
    return [*names, *QUIT]


async def settled(pilot):
    app = pilot.app
    await app.workers.wait_for_complete()
    await pilot.pause()
    await app.workers.wait_for_complete()
    await pilot.pause()


async def quiet(pilot):
    # the detail panel computes a tensor's stats after a short rest of the cursor: count them to the key
    await asyncio.sleep(STATS_DELAY + 0.1)
    await settled(pilot)


async def back_to_browser(pilot):
    app = pilot.app
    for _ in range(5):
        if isinstance(app.screen, BrowserScreen):
            search = app.screen.query_one("#search")
            if search.display:
                await pilot.press("escape")
            return
        await pilot.press("n" if isinstance(app.screen, ConfirmScreen) else "escape")
        await settled(pilot)


async def timed(pilot, label, *keys):
    profiler = cProfile.Profile() if label in profile_keys else None
    Steps.longest_cpu = Steps.longest_wall = Collections.seconds = 0.0
    cpu, wall = time.thread_time(), time.perf_counter()
    if profiler:
        profiler.enable()
    for key in keys:
        await pilot.press(key)
    await settled(pilot)
    settled_wall = time.perf_counter() - wall
    await quiet(pilot)
    if profiler:
        profiler.disable()
    used = time.thread_time() - cpu
    shown = type(pilot.app.screen).__name__
    row = {"key": label, "cpu": used, "step": Steps.longest_cpu, "step_wall": Steps.longest_wall}
    row.update({"gc": Collections.seconds, "wall": settled_wall, "screen": shown})
    print(json.dumps(row), flush=True)
    if profiler:
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("cumulative").print_stats("ckpt_tui", 25)
        stats.sort_stats("tottime").print_stats(15)
        print(f"---- {label}", file=sys.stderr)
        print(out.getvalue(), file=sys.stderr, flush=True)


async def main():
    process.collect_less_often()  # as ``python -m ckpt_tui FILE`` runs the browser (cli/entry.py)
    app = CkptApp(path)
    async with app.run_test(size=(width, height)) as pilot:
        start = time.perf_counter()
        while app.session is None or app.browser.summary is None:
            await pilot.pause(0.01)
        await quiet(pilot)
        print(json.dumps({"opened": time.perf_counter() - start}), flush=True)
        for name in key_names():
            if not app.is_running:
                break
            await timed(pilot, name, name)
            if name == "slash":
                app.screen.query_one("#search").value = SEARCH
                await timed(pilot, "slash: enter (search)", "enter")
            elif name == "p" and isinstance(app.screen, ConfirmScreen):
                await timed(pilot, "p: y (apply the strip)", "y")
            if name not in QUIT:
                await back_to_browser(pilot)
            await quiet(pilot)
        if app.is_running:
            await back_to_browser(pilot)


asyncio.run(main())
"""


def until_shown(command: list[str], repeat: int) -> tuple[float, float]:
    """Median seconds from spawning the process to its tree being on screen, and peak RSS (MB) by then."""
    walls, peaks = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("shown"):
                walls.append(time.perf_counter() - start)
                peaks.append(int(line.split()[1]) / 1024)
                break
        process.wait()
    return statistics.median(walls), max(peaks)


def many_files(folder: Path, keys: int) -> list[Path]:
    """``keys`` tensors of 16x16 fp32 named ``module.blocks.N.pM``, as ``bench_peers.py`` builds them, in both
    formats."""
    pth, flat = folder / f"many_{keys}.pth", folder / f"many_{keys}.safetensors"
    if not (pth.exists() and flat.exists()):
        import torch
        from bench_peers import write_safetensors

        torch.manual_seed(0)
        many = OrderedDict((f"module.blocks.{i // 8}.p{i % 8}", torch.randn(16, 16)) for i in range(keys))
        torch.save(many, pth)
        write_safetensors(flat, [(k, v.numpy()) for k, v in many.items()])
    return [flat, pth]


def press_keys(path: Path, size: tuple[int, int], profile: str) -> list[dict[str, object]]:
    """Every bound key pressed once on a fresh browser of ``path``; one dict per key (and one for opening)."""
    command = [*python_command(PRESS_KEYS), str(path), str(size[0]), str(size[1]), profile]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True, cwd=ROOT)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def key_table(results: list[dict[str, object]], budget: float = 0.3) -> str:
    """The keys, worst UI-thread CPU first, with the ones over ``budget`` marked."""
    keys = sorted((r for r in results if "key" in r), key=lambda r: -float(r["cpu"]))  # type: ignore[arg-type]
    lines = [f"{'key':28} {'UI cpu s':>9} {'step s':>8} {'gc s':>6} {'wall s':>8}  screen after"]
    for r in keys:
        over = "  OVER" if float(r["cpu"]) > budget or float(r["step"]) > budget else ""  # type: ignore[arg-type]
        numbers = f"{r['cpu']:9.3f} {r['step']:8.3f} {r['gc']:6.3f} {r['wall']:8.2f}"
        lines.append(f"{r['key']!s:28} {numbers}  {r['screen']}{over}")
    return "\n".join(lines)


def keys_report(args: argparse.Namespace) -> None:
    """Every key on both many-key files."""
    width, height = (int(n) for n in args.size.split("x"))
    for path in many_files(args.dir, args.keys):
        if args.format and path.suffix != "." + args.format:
            continue
        results = press_keys(path, (width, height), args.profile)
        opened = next((r["opened"] for r in results if "opened" in r), 0.0)
        print(f"\n{path.name} at {args.size}: every key pressed once (opened and counted in {opened:.2f} s)")
        print(key_table(results))


def start_report(args: argparse.Namespace) -> None:
    """The tree shown, against torch.load, on a big and a many-key file."""
    large, many = args.dir / f"large_{args.size_gb:g}gb.pth", args.dir / f"many_{args.keys}.pth"
    write_large(large, args.size_gb)
    write_many(many, args.keys)
    for path in (large, many):
        print(f"\n{path.name}: {path.stat().st_size / 1e9:.2f} GB")
        rows = [
            ("ckpt-tui FILE: tree shown", *until_shown([*python_command(SHOW_TREE), str(path)], args.repeat)),
            (
                "torch.load(mmap=True, weights_only=True)",
                *measure(
                    python_command(f"import torch; torch.load({str(path)!r}, mmap=True, weights_only=True)"),
                    args.repeat,
                ),
            ),
        ]
        print(table(rows, "torch.load(mmap=True, weights_only=True)"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path("bench-data"))
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=("start", "keys"))
    parser.add_argument("--size", default="80x24", help="the terminal for the keys (default 80x24)")
    parser.add_argument("--profile", default="", help="keys (a,b,...) whose first press is profiled (UI thread)")
    parser.add_argument("--format", choices=("safetensors", "pth"), help="only this one of the many-key files")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    if args.only != "keys":
        start_report(args)
    if args.only != "start":
        keys_report(args)


if __name__ == "__main__":
    main()
