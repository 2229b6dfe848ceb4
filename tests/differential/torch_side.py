"""The real ``torch.load``, judging generated files in sandboxed children (run as a script).

Reads a JSON list of file paths on stdin and prints one JSON object per line for each:
``{"path", "true": "loads" | "refuses: ..." | "crash: ..." | "timeout", "false": ..., "ran": bool}``.
``true``/``false``: ``torch.load(path, weights_only=True/False, map_location="cpu")``. Each file is
loaded in a child forked from this process (torch imported once, no thread started), with its
folder as working directory, an address-space cap and an alarm; ``ran``: a payload left the canary
(anything new in the folder) under ``weights_only=False``. Only generated files are loaded, and their
payloads only create ``canary`` in their own folder.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import warnings

SECONDS = 20
HEADROOM = 1 << 30
"""Address space a child may add to what ``import torch`` maps."""


def _vm_size() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 4 << 30


def _load(torch: object, path: str, weights_only: bool) -> str:
    try:
        torch.load(path, weights_only=weights_only, map_location="cpu")  # type: ignore[attr-defined]
    except BaseException as exc:  # SystemExit from pip.main too
        return f"refuses: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return "loads"


def _child(torch: object, path: str, cap: int, write: int) -> None:
    """In the forked child: both loads, the answers written to ``write`` as JSON."""
    folder = os.path.dirname(path)
    os.chdir(folder)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    signal.alarm(SECONDS)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    before = set(os.listdir(folder))
    answer = {"true": _load(torch, path, True)}
    os.write(write, json.dumps(answer).encode() + b"\n")
    answer["false"] = _load(torch, path, False)
    answer["ran"] = bool(set(os.listdir(folder)) - before)
    os.write(write, json.dumps(answer).encode() + b"\n")
    os._exit(0)


def judge(torch: object, path: str, cap: int) -> dict[str, object]:
    """Both loads of one file in a forked child; a child killed or silent says so."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            _child(torch, path, cap, write)
        finally:
            os._exit(3)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    lines = b"".join(chunks).splitlines()
    answer: dict[str, object] = {"path": path, "true": None, "false": None, "ran": False}
    if lines:
        answer.update(json.loads(lines[-1]))
    died = _death(status)
    for mode in ("true", "false"):
        if answer[mode] is None:
            answer[mode] = died
    if answer["false"] == died and os.path.isdir(os.path.dirname(path)):
        answer["ran"] = len(os.listdir(os.path.dirname(path))) > 1
    return answer


def _death(status: int) -> str:
    if os.WIFSIGNALED(status):
        signal_number = os.WTERMSIG(status)
        return "timeout" if signal_number == signal.SIGALRM else f"crash: signal {signal_number}"
    return f"crash: exit {os.WEXITSTATUS(status)}"


def main() -> None:
    """Judge every path on stdin."""
    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(1)
    cap = _vm_size() + HEADROOM
    for path in json.load(sys.stdin):
        print(json.dumps(judge(torch, path, cap)), flush=True)


if __name__ == "__main__":
    main()
