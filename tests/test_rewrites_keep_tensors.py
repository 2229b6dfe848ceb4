"""A rewrite never drops what it cannot carry: over every fixture the suite builds or ships, ``convert``
with ``--sanitize``, ``--extract auto``, a cast (``--dtype``) or nothing (a folder consolidated into one file)
writes every tensor of its input (or of the extracted subtree), or refuses in one line.

Tensors are counted by shape (a cast keeps shapes; a sanitized numpy array or a quantized layer's scale adds
tensors, which is allowed): every input shape is in the output as often. What torch's own ``state_dict()``
leaves out of a pickled module (non-persistent buffers, tensors kept as plain attributes other than a
quantized layer's ``_packed_params``) is left out of the count, as it is left out of the file.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_weights_only import every_fixture

from ckpt_tui.cli import main
from ckpt_tui.core.conventions.state_dicts import inner_state_dict
from ckpt_tui.core.errors import CkptError
from ckpt_tui.core.model.tree import MODULE_GROUPS, Opaque, Tensor, get, iter_reachable, non_persistent_buffers
from ckpt_tui.core.readers.open import open_checkpoint

FIXTURES = Path(__file__).parent / "fixtures"
SHIPPED_FOLDERS = [
    *sorted(p for p in (FIXTURES / "deepspeed").iterdir() if p.is_dir()),
    FIXTURES / "accelerate" / "save_state",
    FIXTURES / "torch_distributed" / "dcp_fsdp2",
]
SHIPPED_FILES = sorted(
    p
    for p in FIXTURES.rglob("*")
    if p.is_file() and p.suffix in (".pt", ".pth", ".bin", ".safetensors") and "global_step" not in str(p)
)
REWRITES = {"sanitize": ["--sanitize"], "extract": ["--extract", "auto"], "cast": ["--dtype", "bf16"], "as is": []}


class _QuantizedNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.fc = torch.nn.Linear(4, 3)
        self.register_buffer("steps", torch.zeros(2), persistent=False)


def _quantized_module(folder: Path) -> Path:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = torch.ao.quantization.quantize_dynamic(_QuantizedNet(), {torch.nn.Linear}, dtype=torch.qint8)
    torch.save(model, folder / "quantized_module.pth")
    return folder / "quantized_module.pth"


def _sources() -> dict[str, Callable[[Path], Path]]:
    built: dict[str, Callable[[Path], Path]] = dict(every_fixture())
    built["dynamic-quantized whole module"] = _quantized_module
    for path in [*SHIPPED_FILES, *SHIPPED_FOLDERS]:
        built[f"shipped {path.relative_to(FIXTURES)}"] = lambda folder, path=path: path
    return built


SOURCES = _sources()


def _left_out_by_state_dict(root: Any) -> set[int]:
    """Tensors torch's ``state_dict()`` leaves out of every pickled module below ``root``."""
    out: set[int] = set()
    for _, value, _ in iter_reachable(root):
        if isinstance(value, Opaque) and value.is_module and isinstance(value.state, dict):
            skip = non_persistent_buffers(value.state)
            buffers = value.state.get("_buffers")
            if isinstance(buffers, dict):
                out.update(id(t) for name, t in buffers.items() if name in skip and isinstance(t, Tensor))
            for name, attribute in value.state.items():
                # a quantized layer's packed weights are an attribute that its state_dict() writes
                if name not in MODULE_GROUPS and name != "_packed_params":
                    out.update(id(v) for _, v, _ in iter_reachable(attribute) if isinstance(v, Tensor))
    return out


def _shapes(root: Any, left_out: set[int] = frozenset()) -> Counter[tuple[int, ...]]:  # type: ignore[assignment]
    return Counter(
        tuple(value.shape)
        for _, value, _ in iter_reachable(root)
        if isinstance(value, Tensor) and id(value) not in left_out
    )


def _expected(root: Any, rewrite: str) -> Counter[tuple[int, ...]]:
    """The shapes the output must hold: the input's, or the extracted subtree's."""
    if rewrite == "extract":
        found = () if isinstance(root, Opaque) and root.is_module else inner_state_dict(root)
        root = get(root, found) if found else root
    if rewrite in ("extract", "sanitize") or (isinstance(root, Opaque) and root.is_module):
        return _shapes(root, _left_out_by_state_dict(root))
    return _shapes(root)


def _run(*args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(list(args))
    return code, err.getvalue()


@pytest.mark.parametrize("rewrite", list(REWRITES))
@pytest.mark.parametrize("name", list(SOURCES))
def test_every_tensor_is_written_or_the_rewrite_refuses_in_one_line(tmp_path: Path, name: str, rewrite: str) -> None:
    source = SOURCES[name](tmp_path)
    if rewrite == "as is" and not source.is_dir():
        pytest.skip("consolidation is of folders; a file as it is is covered by the writer's own tests")
    output = tmp_path / "out.pth"
    code, err = _run("convert", str(source), "-o", str(output), *REWRITES[rewrite])
    if code != 0:
        assert code in (1, 2) and err.count("\n") == 1 and "Traceback" not in err, err
        assert not output.exists()
        return
    try:
        expected = _expected(open_checkpoint(source).root, rewrite)
    except CkptError:
        pytest.fail(f"convert wrote {source}, which does not open")
    written = _shapes(open_checkpoint(output).root)
    lost = expected - written
    assert not lost, f"{sum(lost.values())} tensors not written, shapes {list(lost)[:5]}"
