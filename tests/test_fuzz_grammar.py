"""Grammar-based fuzzing: hypothesis writes random pickle *programs*, not mutations of valid files.

A program is built from a grammar of pickle expressions (each pushes one value): scalars, strings
with control characters and Rich markup, globals (known, unknown, dotted, torch-looking), tuples,
lists, dicts, sets, REDUCE/NEWOBJ/BUILD on any of them, persistent ids, memo PUT/GET with any index,
and torch's tensor rebuilds over persistent-id storages. Now and then raw opcodes are spliced in.

Each program is read as a plain pickle, as ``data.pkl`` of a torch zip (with a few records), and as
the object pickle of the legacy format, then taken through everything ckpt-tui does with a file:
``info``, ``info --json``, ``check`` (values, weights_only verdict), ``diff`` with itself and
``convert`` to ``.pth`` and ``.safetensors``. The invariant: each finishes with exit 0, 1 or 2 (a
CkptError becomes exit 2), never another exception, within a time and memory bound.

The normal run is small and deterministic. ``python -m pytest tests/test_fuzz_grammar.py --long``
runs 20,000 programs with a random seed; its last run found nothing (20,000 programs).
"""

from __future__ import annotations

import contextlib
import io
import os
import resource
import signal
import struct
from collections.abc import Iterator
from pathlib import Path

from builders_readers import legacy_bytes, torch_zip_members, write_zip
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpt_tui.cli import main

LONG = os.environ.get("CKPT_TUI_LONG_FUZZ") == "1"
SECONDS_PER_PROGRAM = 60
RECORD = bytes(range(64))

# ---- the grammar ---------------------------------------------------------------------------------


def unicode_op(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) < 256:
        return b"\x8c" + bytes([len(raw)]) + raw
    return b"X" + struct.pack("<I", len(raw)) + raw


def global_op(module: str, name: str) -> bytes:
    return unicode_op(module) + unicode_op(name) + b"\x93"


MODULES = st.sampled_from(
    [
        "torch",
        "torch._utils",
        "torch.nn.parameter",
        "torch.serialization",
        "torch.distributed.checkpoint.metadata",
        "torch.distributed.checkpoint.filesystem",
        "torch.distributed._shard.sharded_tensor",
        "__torch__",
        "__torch__.torch.classes",
        "collections",
        "builtins",
        "argparse",
        "datetime",
        "numpy.core.multiarray",
        "numpy",
        "os",
        "posix",
        "copyreg",
        "_codecs",
    ]
)
NAMES = st.sampled_from(
    [
        "_rebuild_tensor_v2",
        "_rebuild_tensor",
        "_rebuild_parameter",
        "_rebuild_parameter_with_state",
        "_rebuild_from_type_v2",
        "_rebuild_qtensor",
        "_rebuild_sparse_tensor",
        "_rebuild_meta_tensor_no_storage",
        "_get_layout",
        "OrderedDict",
        "Parameter",
        "FloatStorage",
        "HalfStorage",
        "LongStorage",
        "UntypedStorage",
        "Size",
        "device",
        "float32",
        "bfloat16",
        "strided",
        "sparse_coo",
        "per_tensor_affine",
        "set",
        "frozenset",
        "getattr",
        "eval",
        "system",
        "os.system",
        "OrderedDict.fromkeys",
        "Namespace",
        "datetime",
        "_reconstruct",
        "scalar",
        "dtype",
        "ndarray",
        "_reconstructor",
        "encode",
        "object",
        "TensorStorageMetadata",
        "Metadata",
        "x.y.z",
    ]
)
TEXT = st.one_of(
    st.text(alphabet=st.sampled_from([*"ab.0_/[]@=()\x1b\x07\x9b\n\t é", "\ud800"]), max_size=12),
    st.sampled_from(["[/data/imagenet]", "[@click=app.quit]", "module.", "\x1b]0;pwned\x07", "cpu\x1b[8m"]),
)
INT = st.one_of(
    st.integers(-3, 300),
    st.sampled_from([2**31 - 1, 2**31, 2**63 - 1, 2**63, -(2**63), 2**64, 10**20]),
)


def int_op(value: int) -> bytes:
    if 0 <= value < 256:
        return b"K" + bytes([value])
    if -(2**31) <= value < 2**31:
        return b"J" + struct.pack("<i", value)
    raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


SCALARS = st.one_of(
    INT.map(int_op),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda f: b"G" + struct.pack(">d", f)),
    TEXT.map(unicode_op),
    st.binary(max_size=8).map(lambda b: b"C" + bytes([len(b)]) + b),
    st.sampled_from([b"N", b"\x88", b"\x89", b")", b"]", b"}", b"\x8f"]),
    st.tuples(MODULES, NAMES).map(lambda mn: global_op(*mn)),
    st.integers(0, 20).map(lambda i: b"h" + bytes([i])),  # BINGET of a memo slot (maybe empty)
    st.sampled_from([b"j\xff\xff\xff\x7f", b"r\x00\x00\x00\x10"]),  # LONG_BINGET far away
)


def _tuple(items: list[bytes]) -> bytes:
    if len(items) <= 3:
        return b"".join(items) + [b")", b"\x85", b"\x86", b"\x87"][len(items)]
    return b"(" + b"".join(items) + b"t"


def _list(items: list[bytes]) -> bytes:
    return b"](" + b"".join(items) + b"e"


def _dict(items: list[bytes]) -> bytes:
    if len(items) % 2:
        items = items[:-1]
    return b"}(" + b"".join(items) + b"u"


def _set(items: list[bytes]) -> bytes:
    return b"\x8f(" + b"".join(items) + b"\x90"


def _call(parts: tuple[bytes, list[bytes]]) -> bytes:
    return parts[0] + _tuple(parts[1]) + b"R"


def _newobj(parts: tuple[bytes, list[bytes]]) -> bytes:
    return parts[0] + _tuple(parts[1]) + b"\x81"


def _build(parts: tuple[bytes, bytes]) -> bytes:
    return parts[0] + parts[1] + b"b"


def _memo(parts: tuple[bytes, int]) -> bytes:
    return parts[0] + b"q" + bytes([parts[1]])


def _persid(items: list[bytes]) -> bytes:
    return _tuple(items) + b"Q"


def storage_pid(key: str, storage: str, numel: int) -> bytes:
    return _persid(
        [unicode_op("storage"), global_op("torch", storage), unicode_op(key), unicode_op("cpu"), int_op(numel)]
    )


TENSORS = st.builds(
    lambda storage, key, numel, offset, size, stride, extra: _call(
        (
            global_op("torch._utils", "_rebuild_tensor_v2"),
            [
                storage_pid(key, storage, numel),
                int_op(offset),
                _tuple([int_op(v) for v in size]),
                _tuple([int_op(v) for v in stride]),
                b"\x89",
                extra,
            ],
        )
    ),
    st.sampled_from(["FloatStorage", "HalfStorage", "LongStorage", "BFloat16Storage", "ByteStorage"]),
    st.sampled_from(["0", "1", "2", "3", "9", "../x"]),
    st.one_of(st.integers(0, 20), INT),
    st.one_of(st.integers(0, 4), INT),
    st.lists(st.one_of(st.integers(0, 5), INT), max_size=3),
    st.lists(st.one_of(st.integers(-2, 5), INT), max_size=3),
    st.sampled_from([global_op("collections", "OrderedDict") + b")R", b"}", b"N", b"K\x01"]),
)


def expressions() -> st.SearchStrategy[bytes]:
    """A pickle expression: opcodes that push exactly one value when they are well formed."""
    leaves = st.one_of(SCALARS, TENSORS)
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4).map(_tuple),
            st.lists(inner, max_size=4).map(_list),
            st.lists(inner, max_size=6).map(_dict),
            st.lists(inner, max_size=3).map(_set),
            st.tuples(inner, st.lists(inner, max_size=3)).map(_call),
            st.tuples(inner, st.lists(inner, max_size=2)).map(_newobj),
            st.tuples(inner, inner).map(_build),
            st.tuples(inner, st.integers(0, 20)).map(_memo),
            st.lists(inner, max_size=5).map(_persid),
            st.tuples(inner, inner).map(lambda p: p[0] + b"2" + p[1] + b"0"),  # DUP, then POP
        ),
        max_leaves=25,
    )


NOISE = st.sampled_from([b"(", b"0", b"1", b"2", b"s", b"u", b"e", b"a", b"t", b"R", b"b", b"\x94", b"\x95", b"."])


@st.composite
def programs(draw: st.DrawFn) -> bytes:
    """PROTO, a top-level dict of expressions (or any expression), STOP; sometimes with noise spliced in."""
    protocol = draw(st.sampled_from([2, 2, 4, 5, 0]))
    head = b"\x80" + bytes([protocol]) if protocol else b""
    items = draw(st.lists(st.tuples(TEXT.map(unicode_op), expressions()), max_size=5))
    body = b"}(" + b"".join(key + value for key, value in items) + b"u" if draw(st.booleans()) else draw(expressions())
    program = bytearray(head + body + b".")
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(program)))
        program[at:at] = draw(NOISE)
    return bytes(program)


# ---- running a program ---------------------------------------------------------------------------


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    def expire(*_: object) -> None:
        raise TimeoutError(f"a fuzzed file took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run(*argv: str) -> int:
    """One CLI command; output is captured (it is not what is tested)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(list(argv))
    assert code in (0, 1, 2), f"{argv[0]} exited {code}"
    return code


def containers(program: bytes, folder: Path) -> list[Path]:
    plain = folder / "plain.pkl"
    plain.write_bytes(program)
    records = {key: RECORD for key in ("0", "1", "2", "3")}
    zipped = write_zip(folder / "zipped.pth", torch_zip_members(program, records))
    legacy = folder / "legacy.pth"
    legacy.write_bytes(legacy_bytes(program, ["0", "1"], [(16, RECORD), (16, RECORD)]))
    return [plain, zipped, legacy]


def exercise(program: bytes, folder: Path) -> None:
    before = peak_rss()
    for path in containers(program, folder):
        with deadline(SECONDS_PER_PROGRAM):
            if run("info", str(path)) == 2:
                continue
            run("info", "--json", str(path))
            run("check", str(path))
            run("diff", str(path), str(path))
            for name in ("out.pth", "out.safetensors"):
                out = folder / name
                run("convert", str(path), "-o", str(out), "--force")
                with contextlib.suppress(FileNotFoundError):
                    out.unlink()
    assert peak_rss() - before < 2 << 30, "a fuzzed file made the process grow by over 2 GB"


@settings(
    max_examples=20_000 if LONG else 150,
    derandomize=not LONG,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(program=programs())
def test_random_pickle_programs_give_a_verdict_or_one_line(program: bytes, tmp_path: Path) -> None:
    folder = tmp_path / "fuzz"
    folder.mkdir(exist_ok=True)
    exercise(program, folder)


def test_the_grammar_writes_programs_that_read(tmp_path: Path) -> None:
    """The grammar is not all noise: well-formed programs with tensors open and convert."""
    program = (
        b"\x80\x02}("
        + unicode_op("w")
        + _call(
            (
                global_op("torch._utils", "_rebuild_tensor_v2"),
                [
                    storage_pid("0", "FloatStorage", 16),
                    int_op(0),
                    _tuple([int_op(4)]),
                    _tuple([int_op(1)]),
                    b"\x89",
                    b"}",
                ],
            )
        )
        + b"u."
    )
    zipped = containers(program, tmp_path)[1]
    assert run("info", str(zipped)) == 0
    assert run("convert", str(zipped), "-o", str(tmp_path / "out.safetensors")) == 0
