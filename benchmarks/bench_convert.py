"""Prefix strip: ``ckpt-tui convert --strip-prefix`` against ``cp`` and ``torch.load`` + ``torch.save``.

    python benchmarks/bench_convert.py [--dir bench-data] [--size-gb 2] [--keys 50000] [--repeat 3]

Whole processes, measured in the same run; the output is removed after each run.
"""

from __future__ import annotations

from pathlib import Path

from measure import bench_files, ckpt_tui, measure, python_command, table

TORCH_STRIP = (
    "import torch, sys; sd = torch.load(sys.argv[1], weights_only=True); "
    "m = sd['model'] if 'model' in sd else sd; "
    "torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(m, 'module.'); torch.save(sd, sys.argv[2])"
)


def commands(source: Path, out: Path) -> dict[str, list[str]]:
    return {
        "cp": ["sh", "-c", f"cp {source} {out} && sync -f {out}"],
        "ckpt-tui convert --strip-prefix module.": [
            "sh",
            "-c",
            " ".join(ckpt_tui("convert", str(source), "-o", str(out), "--strip-prefix", "module.", "--force"))
            + f" > /dev/null && sync -f {out}",
        ],
        "torch.load + torch.save": [
            "sh",
            "-c",
            " ".join(python_command(f'"{TORCH_STRIP}"')) + f" {source} {out} && sync -f {out}",
        ],
    }


def main() -> None:
    args, large, many = bench_files(__doc__)
    out = args.dir / "converted.pth"
    for path in (large, many):
        print(f"\n{path.name}: {path.stat().st_size / 1e9:.2f} GB")
        rows = []
        for name, command in commands(path, out).items():
            rows.append((name, *measure(command, args.repeat)))
            out.unlink(missing_ok=True)
        print(table(rows, "cp"))


if __name__ == "__main__":
    main()
