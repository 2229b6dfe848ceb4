"""Prefix strip: ``ckpt-tui convert --strip-prefix`` against ``cp`` + ``sync`` and the libraries' load + save.

    python benchmarks/bench_convert.py [--dir bench-data] [--size-gb 2] [--keys 50000] [--repeat 3]

Four inputs: a large and a many-tensor file, each as ``.pth`` and as ``.safetensors`` (the
safetensors copies are written once by the ``safetensors`` library). Whole processes, interleaved
(one run of each command per round), every writer followed by ``sync``; medians; the output is
removed after each run.

Then, in this process, where convert's time goes (median of the runs): reading the input (the
readers' share), the edit, and the writer's share (emitting, writing, fsync and verification).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from measure import bench_files, ckpt_tui, measure, python_command, table

TORCH_STRIP = (
    "import torch, sys; sd = torch.load(sys.argv[1], weights_only=True); "
    "m = sd['model'] if 'model' in sd else sd; "
    "torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(m, 'module.'); torch.save(sd, sys.argv[2])"
)
SAFETENSORS_STRIP = (
    "import sys; from safetensors.torch import load_file, save_file; sd = load_file(sys.argv[1]); "
    "save_file({k.removeprefix('module.'): v for k, v in sd.items()}, sys.argv[2], metadata={'format': 'pt'})"
)


def as_safetensors(source: Path) -> Path:
    """The same tensors as a flat ``.safetensors`` (written once, by the safetensors library)."""
    target = source.with_suffix(".safetensors")
    if not target.exists():
        import torch
        from safetensors.torch import save_file

        loaded = torch.load(source, weights_only=True, mmap=True)
        state = loaded.get("model", loaded)
        save_file({k: v.contiguous() for k, v in state.items()}, target, metadata={"format": "pt"})
    return target


def commands(source: Path, out: Path) -> dict[str, list[str]]:
    library = SAFETENSORS_STRIP if source.suffix == ".safetensors" else TORCH_STRIP
    convert = " ".join(ckpt_tui("convert", str(source), "-o", str(out), "--strip-prefix", "module.", "--force"))
    return {
        "cp + sync": ["sh", "-c", f"cp {source} {out} && sync -f {out}"],
        "ckpt-tui convert --strip-prefix module. + sync": ["sh", "-c", f"{convert} > /dev/null && sync -f {out}"],
        "load + save + sync (torch or safetensors)": [
            "sh",
            "-c",
            " ".join(python_command(f'"{library}"')) + f" {source} {out} && sync -f {out}",
        ],
    }


def interleaved(named: dict[str, list[str]], out: Path, repeat: int) -> list[tuple[str, float, float]]:
    """Each command once per round, ``repeat`` rounds: medians of wall time, largest peak RSS."""
    walls: dict[str, list[float]] = {name: [] for name in named}
    peaks: dict[str, float] = dict.fromkeys(named, 0.0)
    for _ in range(repeat):
        for name, command in named.items():
            wall, peak = measure(command, 1)
            walls[name].append(wall)
            peaks[name] = max(peaks[name], peak)
            out.unlink(missing_ok=True)
    return [(name, statistics.median(walls[name]), peaks[name]) for name in named]


WRITER_STEPS = {
    "emit": "  writer: data.pkl emitted",
    "write_pth": "  writer: members written (.pth)",
    "verify_pth": "  writer: read back and verified (.pth)",
}


def phases(source: Path, out: Path, repeat: int) -> dict[str, float]:
    """Median seconds of each part of one convert, run in this process with the GC paused, as the CLI runs it."""
    from ckpt_tui.core.operations.convert import ConvertOptions, apply_options
    from ckpt_tui.core.readers.open import open_checkpoint
    from ckpt_tui.core.runtime import process
    from ckpt_tui.core.writers import save as save_module

    times: dict[str, list[float]] = {"read (readers)": [], "edit": [], "write + fsync + verify (writer)": []}
    steps: dict[str, list[float]] = {name: [] for name in WRITER_STEPS}
    for _ in range(repeat):
        with process.gc_paused(), timed(save_module, steps):
            clock = time.perf_counter()
            checkpoint = open_checkpoint(source)
            mark = _lap(times["read (readers)"], clock)
            root = apply_options(checkpoint.root, ConvertOptions(strip_prefix="module."))[0]
            mark = _lap(times["edit"], mark)
            save_module.save(root, out, force=True, byteorder=checkpoint.byteorder, metadata=checkpoint.metadata)
            _lap(times["write + fsync + verify (writer)"], mark)
        out.unlink()
        del checkpoint, root
    medians = {name: statistics.median(values) for name, values in times.items()}
    medians.update({WRITER_STEPS[name]: statistics.median(values) for name, values in steps.items() if values})
    return medians


@contextlib.contextmanager
def timed(module: Any, steps: dict[str, list[float]]) -> Iterator[None]:
    """Record the seconds of each call of ``module``'s functions named in ``steps`` (put back afterwards)."""
    originals = {name: getattr(module, name) for name in steps}

    def timer(name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return originals[name](*args, **kwargs)
            finally:
                steps[name].append(time.perf_counter() - start)

        return call

    for name in steps:
        setattr(module, name, timer(name))
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(module, name, function)


def _lap(into: list[float], since: float) -> float:
    now = time.perf_counter()
    into.append(now - since)
    return now


def main() -> None:
    args, large, many = bench_files(__doc__)
    inputs: list[Path] = [large, as_safetensors(large), many, as_safetensors(many)]
    for path in inputs:
        out = args.dir / f"converted{path.suffix}"
        print(f"\n{path.name}: {path.stat().st_size / 1e9:.2f} GB")
        rows = interleaved(commands(path, out), out, args.repeat)
        print(table(rows, "cp + sync"))
        convert_wall = rows[1][1]
        print(f"  convert / (cp + sync): {convert_wall / rows[0][1]:.2f}x")
        report(phases(path, out, args.repeat), convert_wall)


def report(parts: dict[str, float], wall: float) -> None:
    """The in-process breakdown; the rest of the whole-process wall time is start-up and imports."""
    for name, seconds in parts.items():
        print(f"  {name:40} {seconds:6.2f} s")
    whole = sum(seconds for name, seconds in parts.items() if name not in WRITER_STEPS.values())
    print(f"  {'start-up, imports, exit':40} {max(0.0, wall - whole):6.2f} s (rest of the wall time)")


if __name__ == "__main__":
    main()
