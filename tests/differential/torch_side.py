"""The real ``torch.load``, judging generated files in sandboxed children (run as a script).

Reads a JSON list of ``[path, payload]`` on stdin and prints one JSON object per line for each:
``{"path", "true": "loads" | "refuses: ..." | "crash: ..." | "timeout", "false": ..., "ran": bool}``.
``true``/``false``: ``torch.load(path, weights_only=True/False, map_location="cpu")``; the second only
for files the generator put a payload in (``"not run"`` for the others: nothing in them can run). Files
are loaded in children forked from this process (torch imported once, no thread started), with the
file's folder as working directory, an address-space cap and an alarm; a file with a payload has a
child of its own. ``ran``: the payload left the canary (anything new in the folder). Only generated
files are loaded, and their payloads only create ``canary`` in their own folder.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import signal
import sys
import warnings

SECONDS = 20
CHUNK = 64
"""Files without a payload loaded by one forked child (a fork of a process holding torch costs more than a load)."""
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


def _one(torch: object, path: str, both: bool) -> dict[str, object]:
    """Both loads of one file (``weights_only=False`` only for files that carry a payload), in its folder."""
    folder = os.path.dirname(path)
    os.chdir(folder)
    before = set(os.listdir(folder))
    signal.alarm(SECONDS)
    answer: dict[str, object] = {"true": _load(torch, path, True), "false": "not run", "ran": False}
    if both:
        answer["false"] = _load(torch, path, False)
        answer["ran"] = bool(set(os.listdir(folder)) - before)
    signal.alarm(0)
    return answer


def _child(torch: object, jobs: list[tuple[str, bool]], cap: int, write: int) -> None:
    """In a forked child: each job's answer, one JSON line each, written to ``write`` as it is known."""
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    for index, (path, both) in enumerate(jobs):
        answer = _one(torch, path, both)
        os.write(write, json.dumps({"index": index, **answer}).encode() + b"\n")
    os._exit(0)


def _run_child(torch: object, jobs: list[tuple[str, bool]], cap: int) -> tuple[list[dict[str, object]], int]:
    """The answers a forked child gave for ``jobs`` (in order, maybe fewer: it died), and how it ended."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            _child(torch, jobs, cap, write)
        finally:
            os._exit(3)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    return [json.loads(line) for line in b"".join(chunks).splitlines()], status


def judge(torch: object, jobs: list[tuple[str, bool]], cap: int) -> list[dict[str, object]]:
    """Each job's answers: files without a payload share a child (one fork per chunk), a file with one has
    its own; a child that dies (a crash, the alarm) fails its current file, and the rest go on in a new one."""
    answers: list[dict[str, object]] = []
    while len(answers) < len(jobs):
        first = len(answers)
        chunk = [jobs[first]]
        if not jobs[first][1]:
            chunk = list(itertools.takewhile(lambda job: not job[1], jobs[first : first + CHUNK]))
        given, status = _run_child(torch, chunk, cap)
        for answer in given:
            answer.pop("index")
            answers.append(answer)
        if len(given) < len(chunk):  # the child died on the file after its last answer
            path, both = jobs[len(answers)]
            died = _death(status)
            ran = both and len(os.listdir(os.path.dirname(path))) > 1
            answers.append({"true": died, "false": died if both else "not run", "ran": ran})
    return [{"path": path, **answer} for (path, _), answer in zip(jobs, answers, strict=True)]


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
    jobs = [(path, both) for path, both in json.load(sys.stdin)]
    for answer in judge(torch, jobs, cap):
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
