"""A file beside a checkpoint that no reader reads is data only when ``torch.load(weights_only=False)`` surely fails
on it before it imports anything. Text often parses as a few pickle opcodes (``hello``: BINGET of a memo entry never
put; ``import torch``: INST with no MARK): the unpickler's stack, marks and memo are followed, so such text is data,
while a pickle that would import stays doubt. Proved by difference against the real unpickler: every input called
"fails" must fail there before any ``find_class``.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from test_distributed import run

from ckpt_tui.core.pickles.pickle_globals import fails_before_calling

TEXTS = {
    "hello.txt": "hello world\n",
    "train.py": "import torch\nprint(1)\n",
    "notes.md": "helpful notes\n",
    "run.sh": "export X=1\n",
    "data.txt": "(1, 2)\n",
    "list.txt": "]\n",
}


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_text_that_parses_as_a_few_opcodes_beside_a_model_is_data(tmp_path: Path, capsys: Any, name: str) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    torch.save({"w": torch.ones(2)}, folder / "model.pth")
    (folder / name).write_text(TEXTS[name])
    with pytest.raises(Exception) as raised:  # (each fails its own way, before any import)
        torch.load(folder / name, weights_only=False)
    assert "Weights only" not in str(raised.value)
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 0, out
    assert "cannot-tell" not in out


def test_a_pickle_that_imports_before_it_fails_stays_doubt(tmp_path: Path, capsys: Any) -> None:
    folder, made = tmp_path / "run", tmp_path / "made"
    folder.mkdir()
    torch.save({"w": torch.ones(2)}, folder / "model.pth")
    # text whose first line imports: INST after a MARK runs os.mkdir, then the unpickler fails on the rest
    (folder / "train.py").write_bytes(f"(S'{made}'\nios\nmkdir\nimport torch\n".encode())
    code, out, _ = run(capsys, "check", str(folder))
    assert code == 1 and "[cannot-tell-beside] train.py" in out
    assert not made.exists()
    with pytest.raises(Exception):  # noqa: B017
        torch.load(folder / "train.py", weights_only=False)
    assert made.is_dir()  # the real loader ran it


ALPHABET = b"()0123456789.\n'\" abcdefghijklmnopqrstuvwxyzIJKLMNPQRSTUVXGhjpqrstu}]N)t\x80\x02\x04" + bytes(
    range(0x85, 0x96)
)
WORDS = [
    *("import", "hello", "from", "def", "class", "# note", "epoch", "loss", "model", "(", ")", "[", "]", "}"),
    *("0", "1", ".", "p0", "g0", "a", "s", "e", "d", "l", "t", "R", "b", "c", "i", "o", "\n", " ", "'x'"),
    *("S'x'\n", "I1\n", "V", "F1.0\n", "L1\n", "cos\nmkdir\n", "ios\nmkdir\n", "\x94", "\x93", "\x85", "\x81"),
]
CHECK = textwrap.dedent(
    """
    import json, pickle, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # (a length field may ask for gigabytes)

    class Imported(Exception):
        pass

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            raise Imported(module, name)

    unsound = []
    for text in json.load(sys.stdin):
        data = text.encode("latin-1")
        try:
            Unpickler(__import__("io").BytesIO(data)).load()
        except Imported:
            unsound.append(text)
        except BaseException:
            pass
        else:
            unsound.append(text)
    print(json.dumps(unsound))
    """
)


def _programs(seed: int, count: int) -> list[bytes]:
    rng = random.Random(seed)
    found = []
    for number in range(count):
        if number % 2:
            found.append(bytes(rng.choice(ALPHABET) for _ in range(rng.randint(1, 24))))
        else:
            found.append("".join(rng.choice(WORDS) for _ in range(rng.randint(1, 10))).encode("latin-1"))
    return found


def test_every_input_said_to_fail_fails_in_the_real_unpickler_before_any_import() -> None:
    programs = _programs(0, 6000)
    claimed = [data for data in programs if fails_before_calling(data, complete=True)]
    done = subprocess.run(
        [sys.executable, "-c", CHECK],
        input=json.dumps([data.decode("latin-1") for data in claimed]),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert json.loads(done.stdout) == []
    # (the stack, marks and memo decide most of them: far more than an undecodable byte alone would)
    assert len(claimed) > 0.8 * len(programs)
    assert fails_before_calling(b"hello world\n", complete=True)
    assert fails_before_calling(b"import torch\nprint(1)\n", complete=True)
    assert not fails_before_calling(b"cos\nsystem\n(S'ls'\ntR.", complete=True)
    assert not fails_before_calling(b"(S'x'\nios\nmkdir\n", complete=True)
