"""ckpt-tui against the tools a user would pick instead, every task side by side in one run.

    python benchmarks/bench_peers.py [--small] [--dir DIR] [--peers DIR] [--repeat 3]

The peers (``sft-cli``; ``ckptkit[all]``) are installed into their own virtual environments under
``--peers`` (default: a folder in the temp dir, kept between runs), each with ``torch==2.13.0``
pinned in the same pip command. A peer that fails to install, or lacks a command, is reported and
its row falls back to the plain-torch alternative. The test files (2 GB ``.safetensors`` and
``.pth`` of 128 MB fp32 tensors; 50,000 tensors of 16x16 fp32 in each format; two 1 GB ``.pth`` of the same
keys for ``diff --stats`` and ``average``) are built in ``--dir`` (default: a temp folder; ``--small`` builds
256 MB, 128 MB and 5,000 tensors for a quick run).

Each row: median wall time of ``--repeat`` rounds, the commands of a row interleaved in each round,
page cache warm (one untimed run of each first), every writer followed by ``sync``. Printed:
ckpt-tui's time and peak RSS, the fastest alternative's time and name, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import venv
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from measure import PROBE

PEERS = {"sft": "sft-cli", "ckptkit": "ckptkit[all]"}
TORCH_PIN = "torch==2.13.0"

TORCH_SCAN = (
    "import sys, torch; sd = torch.load(sys.argv[1], weights_only=True); "
    "sd = sd.get('model', sd) if isinstance(sd, dict) else sd; "
    "bad = [k for k, v in sd.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]; "
    "print(len(sd), 'tensors,', len(bad), 'with NaN/Inf')"
)
TORCH_INFO = (
    "import sys, torch; sd = torch.load(sys.argv[1], weights_only=True, mmap=True); "
    "[print(k, tuple(v.shape), v.dtype) for k, v in sd.items()]"
)
SHARDS_INFO = (
    "import sys, json, os; from safetensors import safe_open; index = sys.argv[1]; "
    "shards = sorted(set(json.load(open(index))['weight_map'].values())); "
    "[[print(k, f.get_slice(k).get_shape(), f.get_slice(k).get_dtype()) for k in f.keys()] "
    "for s in shards for f in [safe_open(os.path.join(os.path.dirname(index), s), 'np')]]"
)
TORCH_LAYER_CHANGE = (
    "import sys, torch; a = torch.load(sys.argv[1], weights_only=True, mmap=True); "
    "b = torch.load(sys.argv[2], weights_only=True, mmap=True); "
    "[print(k, float((a[k].double() - b[k].double()).norm() / a[k].double().norm()), "
    "float(torch.nn.functional.cosine_similarity(a[k].double().flatten(), b[k].double().flatten(), dim=0))) "
    "for k in a if a[k].is_floating_point()]"
)
TORCH_AVERAGE = (
    "import torch, sys, os; a = torch.load(sys.argv[1], weights_only=True, mmap=True); "
    "b = torch.load(sys.argv[2], weights_only=True, mmap=True); "
    "out = {k: ((0.5 * a[k].double() + 0.5 * b[k].double()).to(a[k].dtype) if a[k].is_floating_point() else a[k]) "
    "for k in a}; torch.save(out, sys.argv[3]); f = os.open(sys.argv[3], os.O_RDONLY); os.fsync(f)"
)
NUMPY_ISFINITE = (
    "import mmap, sys, json, struct, numpy as np; f = open(sys.argv[1], 'rb'); "
    "n = struct.unpack('<Q', f.read(8))[0]; m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ); "
    "a = np.frombuffer(m, np.float32, offset=8 + n); step = 16 << 20; "
    "print(all(np.isfinite(a[i:i + step]).all() for i in range(0, a.size, step)))"
)


@dataclass
class Row:
    """One task: ckpt-tui's command and the alternatives', each a shell line; an optional output to remove."""

    task: str
    ours: str
    others: dict[str, str]
    output: Path | None = None
    reference: dict[str, str] = field(default_factory=dict)
    """A lower bound measured beside the row (not a tool a user would run instead), e.g. numpy's isfinite."""


# ---- the files ---------------------------------------------------------------------------------


def write_safetensors(path: Path, tensors: list[tuple[str, object]]) -> None:
    """A flat ``.safetensors`` of fp32 numpy arrays, written tensor by tensor (no library needed)."""
    header: dict[str, object] = {}
    offset = 0
    for name, array in tensors:
        size = array.nbytes  # type: ignore[attr-defined]
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + size]}  # type: ignore[attr-defined]
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(text)) + text)
        for _, array in tensors:
            file.write(array.tobytes())  # type: ignore[attr-defined]


def build_files(folder: Path, gigabytes: float, keys: int) -> dict[str, Path]:
    """The four test files (built once per folder)."""
    import numpy as np
    import torch

    files = {
        "soup_a.pth": folder / "soup_a.pth",
        "soup_b.pth": folder / "soup_b.pth",
        "large.safetensors": folder / "large.safetensors",
        "large.pth": folder / "large.pth",
        "many.safetensors": folder / "many.safetensors",
        "many.pth": folder / "many.pth",
        "library.safetensors": folder / "library.safetensors",
        "shards": folder / "shards" / "model.safetensors.index.json",
    }
    build_soups(files, gigabytes / 2)
    if all(p.exists() for p in files.values()):
        return files
    rng = np.random.default_rng(0)
    count = max(1, round(gigabytes * 1024 / 128))
    large = [(f"module.layers.{i}.weight", rng.random((8192, 4096), dtype=np.float32)) for i in range(count)]
    write_safetensors(files["large.safetensors"], large)
    torch.save(OrderedDict((k, torch.from_numpy(a)) for k, a in large), files["large.pth"])
    del large
    many = OrderedDict((f"module.blocks.{i // 8}.p{i % 8}", torch.randn(16, 16)) for i in range(keys))
    torch.save(many, files["many.pth"])
    write_safetensors(files["many.safetensors"], [(k, v.numpy()) for k, v in many.items()])
    build_library_sets(files, many, keys)
    subprocess.run(["sync"], check=True)
    return files


def build_soups(files: dict[str, Path], gigabytes: float) -> None:
    """Two fp32 state_dicts of the same keys and other values (tensors of 32 MB), for diff --stats and average."""
    import torch

    for seed, name in enumerate(("soup_a.pth", "soup_b.pth")):
        if files[name].exists():
            continue
        torch.manual_seed(seed)
        count = max(1, round(gigabytes * 1024 / 32))
        torch.save({f"layers.{i}.weight": torch.randn(2048, 4096) for i in range(count)}, files[name])


def build_library_sets(files: dict[str, Path], many: OrderedDict[str, Any], keys: int) -> None:
    """The same 50,000 tensors written by the ``safetensors`` library itself (sorted names, its alignment),
    and a Hugging Face set of 4 shards and its index holding 90,000 tensors (an MoE-sized key count)."""
    import torch
    from safetensors.torch import save_file

    save_file(dict(many), str(files["library.safetensors"]), metadata={"format": "pt"})
    folder = files["shards"].parent
    folder.mkdir(exist_ok=True)
    total = keys * 9 // 5  # 90,000 at full size
    names = [f"model.layers.{i // 300}.mlp.experts.{(i // 3) % 100}.w{i % 3}.weight" for i in range(total)]
    weight_map: dict[str, str] = {}
    for shard in range(4):
        part = names[shard::4]
        file = f"model-{shard + 1:05d}-of-00004.safetensors"
        save_file({n: torch.zeros(8, 8) for n in part}, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    index = {"metadata": {"total_size": total * 256}, "weight_map": weight_map}
    files["shards"].write_text(json.dumps(index))


# ---- the peers ---------------------------------------------------------------------------------


def install_peers(folder: Path) -> dict[str, Path]:
    """Each peer's bin folder, installed once; a peer that fails to install is reported and left out."""
    found = {}
    for name, requirement in PEERS.items():
        env = folder / name
        marker = env / "installed"
        if not marker.exists():
            print(f"installing {requirement} with {TORCH_PIN} into {env} ...", flush=True)
            shutil.rmtree(env, ignore_errors=True)
            venv.create(env, with_pip=True)
            done = subprocess.run(
                [str(env / "bin" / "python"), "-m", "pip", "install", "-q", requirement, TORCH_PIN],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                print(f"  {requirement} failed to install: {done.stderr.strip().splitlines()[-1:]}")
                continue
            marker.touch()
        found[name] = env / "bin"
    return found


def has_command(tool: Path, *command: str) -> bool:
    """Whether ``tool command --help`` exits 0 (the command exists)."""
    done = subprocess.run([str(tool), *command, "--help"], capture_output=True)
    return tool.exists() and done.returncode == 0


# ---- timing --------------------------------------------------------------------------------------


def timed(line: str) -> tuple[float, float, int]:
    """Wall seconds, peak RSS (MB) and exit code of one shell line in a fresh process."""
    out = subprocess.run([sys.executable, "-c", PROBE, "sh", "-c", line], capture_output=True, text=True, check=True)
    wall, rss_kb, code = out.stdout.split()
    return float(wall), int(rss_kb) / 1024, int(code)


def run_row(row: Row, repeat: int) -> dict[str, Any]:
    """Median wall of each command (rounds interleaved, one warm-up), ckpt-tui's peak RSS."""
    commands = {"ckpt-tui": row.ours, **row.others, **row.reference}
    walls: dict[str, list[float]] = {name: [] for name in commands}
    peak = 0.0
    for round_ in range(repeat + 1):
        for name, line in commands.items():
            wall, rss, code = timed(line)
            if row.output is not None:
                row.output.unlink(missing_ok=True)
            if code not in (0, 1):  # check exits 1 on findings; anything else is a failure
                raise SystemExit(f"{row.task}: {name} failed ({code}): {line}")
            if round_:
                walls[name].append(wall)
                if name == "ckpt-tui":
                    peak = max(peak, rss)
    medians = {name: statistics.median(w) for name, w in walls.items()}
    best = min(row.others, key=lambda name: medians[name])
    result: dict[str, Any] = {
        "task": row.task,
        "ours": medians["ckpt-tui"],
        "rss": peak,
        "best": best,
        "theirs": medians[best],
    }
    # the first reference is the row's ratio; every one is shown
    result["references"] = [(name, medians[name]) for name in row.reference]
    for name in list(row.reference)[:1]:
        result["reference"], result["reference_s"] = name, medians[name]
    return result


def sh(*parts: str | Path) -> str:
    return " ".join(str(p) for p in parts)


def rows(files: dict[str, Path], tools: dict[str, Path], out: Path) -> list[Row]:
    """Every task of the comparison, with the alternatives that exist."""
    # the checkout this script lives in (its bytecode compiled by measure), whatever is installed
    me = sh(f"PYTHONPATH={shlex.quote(str(Path(__file__).resolve().parent.parent))}", sys.executable, "-m", "ckpt_tui")
    py = sys.executable
    sft = tools.get("sft", Path("/nonexistent")) / "sft"
    kit = tools.get("ckptkit", Path("/nonexistent")) / "ckptkit"
    notes: list[str] = []

    def peer(tool: Path, command: str, line: str) -> dict[str, str]:
        if has_command(tool, command):
            return {f"{tool.name} {command}": line}
        notes.append(f"{tool.name} {command}: not available; plain torch only")
        return {}

    def scan(path: Path) -> dict[str, str]:
        return {"torch.load + isfinite loop": f'{py} -c "{TORCH_SCAN}" {path} > /dev/null'}

    st_out, pth_out = out.with_suffix(".safetensors"), out.with_suffix(".pth")
    isfinite = {"numpy isfinite, same 2 GB": f'{py} -c "{NUMPY_ISFINITE}" {files["large.safetensors"]}'}
    convert = f"{me} convert --strip-prefix module. --force -o"
    soups = f"{files['soup_a.pth']} {files['soup_b.pth']}"
    soup_size = f"{files['soup_a.pth'].stat().st_size / 1e9:.1f} GB"
    table = [
        Row(
            "check, 2 GB .safetensors",
            f"{me} check {files['large.safetensors']} > /dev/null",
            peer(sft, "check", f"{sft} check {files['large.safetensors']} > /dev/null")
            or scan(files["large.safetensors"]),
            reference=isfinite,
        ),
        Row(
            "check, 50,000 tensors .safetensors",
            f"{me} check {files['many.safetensors']} > /dev/null",
            peer(sft, "check", f"{sft} check {files['many.safetensors']} > /dev/null")
            or scan(files["many.safetensors"]),
        ),
        Row(
            "check, 2 GB .pth",
            f"{me} check {files['large.pth']} > /dev/null",
            scan(files["large.pth"]),
            reference=isfinite,
        ),
        Row("check, 50,000 tensors .pth", f"{me} check {files['many.pth']} > /dev/null", scan(files["many.pth"])),
        Row(
            "info, 50,000 tensors .safetensors",
            f"{me} info {files['many.safetensors']} > /dev/null",
            {
                **peer(kit, "info", f"{kit} info {files['many.safetensors']} > /dev/null"),
                **peer(sft, "info", f"{sft} info {files['many.safetensors']} > /dev/null"),
            },
        ),
        Row(
            "info --json, 50,000 tensors .safetensors (written by the library)",
            f"{me} info --json {files['library.safetensors']} > /dev/null",
            {
                **peer(kit, "info", f"{kit} info {files['library.safetensors']} > /dev/null"),
                **peer(sft, "info", f"{sft} info {files['library.safetensors']} > /dev/null"),
            },
        ),
        Row(
            "info, 90,000 tensors in 4 shards",
            f"{me} info {files['shards']} > /dev/null",
            {
                "safetensors safe_open, list every shard": f'{py} -c "{SHARDS_INFO}" {files["shards"]} > /dev/null',
            },
        ),
        Row(
            "info, 2 GB .pth",
            f"{me} info {files['large.pth']} > /dev/null",
            {"torch.load(mmap=True) + list": f'{py} -c "{TORCH_INFO}" {files["large.pth"]} > /dev/null'},
        ),
        Row(
            "info, 50,000 keys .pth",
            f"{me} info {files['many.pth']} > /dev/null",
            {
                **peer(kit, "info", f"{kit} info {files['many.pth']} > /dev/null"),
                "torch.load(mmap=True) + list": f'{py} -c "{TORCH_INFO}" {files["many.pth"]} > /dev/null',
            },
        ),
        Row(
            f"diff --stats, two {soup_size} .pth",
            f"{me} diff --stats {soups} > /dev/null",
            {"torch.load(mmap=True) both + norms": f'{py} -c "{TORCH_LAYER_CHANGE}" {soups} > /dev/null'},
            reference={"cat both files (read once)": f"cat {soups} > /dev/null"},
        ),
        Row(
            f"average (verified, fsynced), two {soup_size} .pth",
            f"{me} average {soups} -o {pth_out} --force > /dev/null",
            {"torch.load both + mean + save + fsync": f'{py} -c "{TORCH_AVERAGE}" {soups} {pth_out}'},
            pth_out,
            reference={
                "cat both files (read once)": f"cat {soups} > /dev/null",
                # what any average must do at least: read both, write 1 GB and put it on disk
                "floor: cat both + cp one + sync": f"cat {soups} > /dev/null && cp {files['soup_a.pth']} {pth_out}"
                f" && sync -f {pth_out}",
            },
        ),
        Row(
            "strip module. + save, 50,000 tensors .safetensors",
            f"{convert} {st_out} {files['many.safetensors']} > /dev/null && sync -f {st_out}",
            peer(
                sft,
                "rename",
                f"{sft} rename {files['many.safetensors']} --sub '^module\\.' --sub '' -o {st_out} > /dev/null "
                f"&& sync -f {st_out}",
            )
            or {"cp + sync": f"cp {files['many.safetensors']} {st_out} && sync -f {st_out}"},
            st_out,
        ),
        Row(
            "strip module. + save, 50,000 tensors .pth",
            f"{convert} {pth_out} {files['many.pth']} > /dev/null && sync -f {pth_out}",
            {"cp + sync": f"cp {files['many.pth']} {pth_out} && sync -f {pth_out}"},
            pth_out,
        ),
        Row(
            "strip module. + save, 2 GB .safetensors",
            f"{convert} {st_out} {files['large.safetensors']} > /dev/null && sync -f {st_out}",
            {"cp + sync": f"cp {files['large.safetensors']} {st_out} && sync -f {st_out}"},
            st_out,
        ),
    ]
    for note in notes:
        print(f"note: {note}")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="256 MB and 5,000 tensors: a quick run")
    parser.add_argument("--dir", type=Path, help="where the test files are built (default: a temp folder)")
    parser.add_argument("--peers", type=Path, default=Path(tempfile.gettempdir()) / "ckpt-tui-peers")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--only", metavar="TEXT", action="append", help="run only the rows whose task contains TEXT (repeatable)"
    )
    args = parser.parse_args()
    # time ckpt-tui as an installed package runs: its bytecode cached when measure was imported (pip
    # compiles the peers' at install); anything else a run imports is cached by its first run
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    size, keys = (0.25, 5000) if args.small else (2.0, 50_000)
    folder = args.dir or Path(tempfile.gettempdir()) / f"ckpt-tui-bench-{'small' if args.small else 'full'}"
    folder.mkdir(parents=True, exist_ok=True)
    print(f"building test files in {folder} ...", flush=True)
    files = build_files(folder, size, keys)
    args.peers.mkdir(parents=True, exist_ok=True)
    tools = install_peers(args.peers)
    out = folder / "out"
    results = []
    for row in rows(files, tools, out):
        if args.only and not any(text in row.task for text in args.only):
            continue
        result = run_row(row, args.repeat)
        results.append(result)
        print(line(result), flush=True)
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"
    print(f"\n{'small' if args.small else 'full-size'} files; ratio: alternative / ckpt-tui (above 1: faster)")
    print(f"load average at the end: {load} ({os.cpu_count()} cores)")
    print("| task | ckpt-tui | peak RSS | fastest alternative | ratio |")
    print("|---|---|---|---|---|")
    for r in results:
        ratio = r["theirs"] / r["ours"]
        shown = "; ".join(f"ckpt-tui / {name}: {r['ours'] / seconds:.2f}x" for name, seconds in r["references"])
        reference = f" ({shown})" if shown else ""
        print(
            f"| {r['task']} | {r['ours']:.2f} s | {r['rss']:.0f} MB | {r['best']}: {r['theirs']:.2f} s | "
            f"{ratio:.2f}x{reference} |"
        )


def line(result: dict[str, Any]) -> str:
    """One row as it is measured."""
    text = (
        f"{result['task']:50} {result['ours']:6.2f} s  vs {result['theirs']:6.2f} s ({result['best']})"
        f"  {result['theirs'] / result['ours']:5.2f}x  RSS {result['rss']:.0f} MB"
    )
    for name, seconds in result["references"]:
        text += f"  [{name}: {seconds:.2f} s]"
    return text


if __name__ == "__main__":
    main()
