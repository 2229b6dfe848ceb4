"""A ``.safetensors`` written from a plain safetensors source in whole-list passes (the header from the
columns, the data copied run by run) is byte for byte the file written tensor by tensor, and verified
as strictly: a copy that differs from its source refuses the write.
"""

from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from builders import write_safetensors
from builders_readers import safetensors_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from ckpt_tui.cli import main
from ckpt_tui.core.edits import tree_edits as edits
from ckpt_tui.core.model import byte_source
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.writers import safetensors_out
from ckpt_tui.core.writers.safetensors_out import SafetensorsPlan
from ckpt_tui.core.writers.save import save

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.uint8, torch.bool, torch.float64]


def tensor_of(shape: list[int], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Fixed values (no NaN: compared with torch.equal)."""
    count = 1
    for size in shape:
        count *= size
    return (torch.arange(count, dtype=torch.float64) + seed).reshape(shape).to(dtype)


def written_both_ways(
    source: Path, out: Path, monkeypatch: pytest.MonkeyPatch, prefix: str = "", bulk: bool | None = True
) -> tuple[bytes, bytes]:
    """The output of one strip (or a plain rewrite), as the plan chooses (in bulk where ``bulk``, tensor by
    tensor where not, either where None) and tensor by tensor."""
    checkpoint = open_checkpoint(source)
    root = edits.strip_prefix(checkpoint.root, prefix)[0] if prefix else checkpoint.root
    taken = SafetensorsPlan(root, "little", checkpoint.metadata).source is not None
    assert bulk is None or taken == bulk
    save(root, out, force=True, metadata=checkpoint.metadata)
    bulk = out.read_bytes()
    with monkeypatch.context() as patch:
        patch.setattr(safetensors_out, "_one_plain_source", lambda tensors: None)
        save(root, out, force=True, metadata=checkpoint.metadata)
    return bulk, out.read_bytes()


@settings(
    max_examples=40,
    deadline=timedelta(seconds=20),
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    count=st.integers(1, 40),
    dtypes=st.lists(st.sampled_from(DTYPES), min_size=40, max_size=40),
    shapes=st.lists(st.lists(st.integers(0, 4), max_size=3), min_size=40, max_size=40),
    seed=st.integers(0, 1000),
    metadata=st.sampled_from([None, {"format": "pt"}, {"format": "flax", "é": "x"}]),
)
def test_the_bulk_write_is_the_tensor_by_tensor_write(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    count: int,
    dtypes: list[torch.dtype],
    shapes: list[list[int]],
    seed: int,
    metadata: dict[str, str] | None,
) -> None:
    names = [f"module.{'é' if i % 7 == 3 else ''}b{i // 4}.p{i % 4}" for i in range(count)]
    random.Random(seed).shuffle(names)
    state = {name: tensor_of(shapes[i], dtypes[i], i) for i, name in enumerate(names)}
    # written in the given order (not the library's), so the output's order cuts the data into runs
    header, data, at = {}, b"", 0
    for name, tensor in state.items():
        raw = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        code = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64"}.get(
            tensor.dtype, {torch.uint8: "U8", torch.bool: "BOOL", torch.float64: "F64"}.get(tensor.dtype)
        )
        header[name] = {"dtype": code, "shape": list(tensor.shape), "data_offsets": [at, at + len(raw)]}
        data, at = data + raw, at + len(raw)
    source = tmp_path / "in.safetensors"
    source.write_bytes(safetensors_bytes({"__metadata__": metadata, **header} if metadata else header, data))
    # (a size 0 can give strides the tree does not call row-major: such a file may go tensor by tensor)
    taken = True if all(0 not in shapes[i] for i in range(count)) else None
    bulk, each = written_both_ways(source, tmp_path / "out.safetensors", monkeypatch, "module.", taken)
    assert bulk == each
    loaded = load_file(tmp_path / "out.safetensors")
    assert sorted(loaded) == sorted(name.removeprefix("module.") for name in names)
    for name, tensor in state.items():
        assert torch.equal(loaded[name.removeprefix("module.")], tensor)


def test_a_library_file_is_copied_in_one_kernel_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Names sorted as the library sorts them: the output keeps the source's order, its data is one span."""
    state = {f"module.w{i:03d}": torch.full((64, 64), float(i)) for i in range(100)}  # 1.6 MB of data
    checkpoint = open_checkpoint(write_safetensors(state, tmp_path / "in.safetensors"))
    root, _ = edits.strip_prefix(checkpoint.root, "module.")
    plan = SafetensorsPlan(root, "little", checkpoint.metadata)
    with (tmp_path / "out.safetensors").open("wb") as file:
        written = plan.write(file, None, None)
    assert [copy.size for copy in written.log.copies] == [100 * 64 * 64 * 4]
    assert written.tensors == 100 and not written.items
    bulk, each = written_both_ways(tmp_path / "in.safetensors", tmp_path / "o.safetensors", monkeypatch, "module.")
    assert bulk == each


def test_a_copy_that_differs_from_its_source_refuses_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state = {f"module.w{i}": torch.full((256, 256), float(i)) for i in range(8)}  # 2 MB: kernel copies
    source = write_safetensors(state, tmp_path / "in.safetensors")
    real = byte_source.LocalFile.copy_to

    def bad_copy(self: byte_source.LocalFile, fd: int, offset: int, count: int) -> int:
        done = real(self, fd, offset, count)
        byte_source.os.pwrite(fd, b"\x01", byte_source.os.lseek(fd, 0, 1) - 1)  # the copy's last byte
        return done

    monkeypatch.setattr(byte_source.LocalFile, "copy_to", bad_copy)
    out = tmp_path / "out.safetensors"
    code = main(["convert", str(source), "--strip-prefix", "module.", "-o", str(out)])
    assert code == 2 and "not copied faithfully" in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob("*.tmp*"))


def test_the_verified_line_says_what_was_compared(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = {f"module.w{i}": torch.full((256, 256), float(i)) for i in range(8)}
    source = write_safetensors(state, tmp_path / "in.safetensors")
    assert main(["convert", str(source), "--strip-prefix", "module.", "-o", str(tmp_path / "out.safetensors")]) == 0
    assert "every byte (CRCs; copies compared with the source)" in capsys.readouterr().out
