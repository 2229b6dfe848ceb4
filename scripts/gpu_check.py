"""Checks that need a real GPU: files saved on cuda:0, device remaps, TorchScript on cuda, loads onto cuda:0.

    PYTHONPATH=. python3 scripts/gpu_check.py     (on a machine with CUDA; exits 0 when every check passes)

Each check runs ckpt-tui's CLI in a child (``python -m ckpt_tui``) and the real ``torch.load`` here.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

FAILED: list[str] = []


def cli(*args: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "ckpt_tui", *args], capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def expect(name: str, ok: bool, detail: str = "") -> None:
    print(("PASS " if ok else "FAIL ") + name + (f": {detail}" if detail and not ok else ""))
    if not ok:
        FAILED.append(name)


def same(a: dict, b: dict, device: str) -> bool:
    return a.keys() == b.keys() and all(
        v.device.type == torch.device(device).type and torch.equal(v.cpu(), b[k].cpu()) for k, v in a.items()
    )


def _tensors(value: object) -> list[torch.Tensor]:
    """Every tensor in a nested dict/list, as torch holds them."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def main() -> int:
    assert torch.cuda.is_available(), "no CUDA device"
    print("torch", torch.__version__, torch.cuda.get_device_name(0))
    tmp = Path(tempfile.mkdtemp())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 4)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 16, device="cuda")).sum().backward()
    opt.step()
    bare = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ckpt = {
        "model_state_dict": {"module." + k: v for k, v in bare.items()},
        "optimizer_state_dict": opt.state_dict(),
        "epoch": 3,
    }
    gpu = tmp / "gpu.pth"
    torch.save(ckpt, gpu)

    # A file saved on a real GPU: shown on cuda:0, and the verdict agrees with torch.load(weights_only=True).
    code, out = cli("info", "--json", str(gpu))
    info = json.loads(out) if code == 0 else {}
    saved = collections.Counter(str(v.device) for v in _tensors(ckpt))
    expect("info's devices are the saved ones", info.get("devices") == dict(saved), f"{info.get('devices')} vs {saved}")
    code, out = cli("check", "--json", str(gpu))
    torch.load(gpu, weights_only=True)
    expect("check of a GPU-saved file passes", code == 0, out[-400:])

    # Remap cuda:0 -> cpu with the fix: the loaded file is on cpu, bit-equal, a bare state_dict.
    cpu_out = tmp / "cpu.pth"
    code, out = cli(
        "convert", str(gpu), "-o", str(cpu_out), "--extract", "auto", "--strip-prefix", "auto", "--map-location", "cpu"
    )
    loaded = torch.load(cpu_out, weights_only=True) if code == 0 else {}
    expect("remap to cpu loads on cpu, equal", code == 0 and same(loaded, bare, "cpu"), out[-400:])

    # Remap cpu -> cuda:0: torch.load puts every tensor on the GPU, equal.
    cuda_out = tmp / "cuda.pth"
    code, out = cli("convert", str(cpu_out), "-o", str(cuda_out), "--map-location", "cuda:0")
    loaded = torch.load(cuda_out, weights_only=True) if code == 0 else {}
    expect("remap to cuda:0 loads on cuda:0, equal", code == 0 and same(loaded, bare, "cuda"), out[-400:])

    # Strict load into the model on the GPU.
    fresh = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 4)).cuda()
    result = fresh.load_state_dict(torch.load(cuda_out, weights_only=True), strict=True)
    expect("strict load on cuda", not result.missing_keys and not result.unexpected_keys)

    # safetensors output of a GPU file, loaded onto cuda:0 by the library.
    st_out = tmp / "gpu.safetensors"
    code, out = cli("convert", str(gpu), "-o", str(st_out), "--extract", "auto", "--strip-prefix", "auto")
    try:
        from safetensors.torch import load_file

        st = load_file(str(st_out), device="cuda:0") if code == 0 else {}
        expect("safetensors of a GPU file loads on cuda:0, equal", code == 0 and same(st, bare, "cuda"), out[-400:])
    except ImportError:
        print("SKIP safetensors (not installed)")

    # TorchScript, fp16, saved on cuda: check's verdict is what torch.load(weights_only=True) does with it.
    scripted = torch.jit.script(model.half().eval())
    ts = tmp / "scripted.pt"
    torch.jit.save(scripted, ts)
    torch.jit.load(ts)
    try:
        torch.load(ts, weights_only=True)
        truth = "loads"
    except Exception:  # torch refuses TorchScript archives with weights_only=True
        truth = "refuses"
    code, out = cli("check", "--json", str(ts))
    answer = json.loads(out).get("weights_only", {}).get("answer") if out.startswith("{") else None
    expect(f"TorchScript fp16 on cuda: verdict {answer} where torch {truth}", answer == truth, out[-600:])
    code, out = cli("info", str(ts))
    expect("TorchScript fp16 on cuda: info opens it", code == 0 and "cuda:0" in out, out[-400:])

    print(f"{len(FAILED)} failed" if FAILED else "all GPU checks passed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
