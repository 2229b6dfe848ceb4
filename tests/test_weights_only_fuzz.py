"""Differential fuzzing: random opcode programs through torch's own weights-only unpickler and ours.

torch's ``_weights_only_unpickler.Unpickler`` only ever calls allowlisted torch and builtin
functions, so running it in-process on random programs is safe. The two must agree on every
program: accepted by both, or refused by both.
"""

from __future__ import annotations

import io
import os
import struct
import warnings

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpt_tui.core.weights_only.scan import Refusal, WStorage, scan_pickle

LONG = os.environ.get("CKPT_TUI_LONG_FUZZ") == "1"
GLOBALS = [
    b"ccollections\nOrderedDict\n",
    b"cbuiltins\nset\n",
    b"ctorch\nSize\n",
    b"c_codecs\nencode\n",
    b"ctorch\ndevice\n",
    b"cbuiltins\ncomplex\n",
    b"ccollections\nCounter\n",
    b"ccollections\ndefaultdict\n",
    b"cbuiltins\nlist\n",
    b"ctorch\nfloat32\n",
    b"cbuiltins\nbytearray\n",
    b"ctorch.serialization\n_get_layout\n",
    b"ctorch\nFloatStorage\n",
    b"c__builtin__\nset\n",
    b"cos\ngetcwd\n",
]
TEXT = [b"cpu", b"cuda:1", b"a", b"latin1", b"torch.strided", b"1+2j", b"", b"storage"]
OPCODES = [b"(", b"t", b"\x85", b"\x86", b"\x87", b"N", b"\x88", b"\x89", b")", b"]", b"}", b"\x8f"]
OPCODES += [b"R", b"\x81", b"b", b"a", b"e", b"s", b"u", b"0", b"Q", b"\x95", b"\x8c"]

chunk = st.one_of(
    st.sampled_from(GLOBALS),
    st.integers(0, 5).map(lambda n: b"K" + bytes([n])),
    st.integers(0, 70000).map(lambda n: b"J" + struct.pack("<i", n)),
    st.sampled_from(TEXT).map(lambda t: b"X" + struct.pack("<I", len(t)) + t),
    st.sampled_from(TEXT).map(lambda t: b"U" + bytes([len(t)]) + t),
    st.integers(0, 3).map(lambda n: b"q" + bytes([n])),
    st.integers(0, 3).map(lambda n: b"h" + bytes([n])),
    st.sampled_from([0, 1, 1 << 24]).map(lambda n: b"r" + struct.pack("<I", n)),
    st.sampled_from([0, 1, 1 << 24]).map(lambda n: b"j" + struct.pack("<I", n)),
    st.sampled_from(OPCODES),
)
programs = st.lists(chunk, min_size=1, max_size=16).map(lambda chunks: b"\x80\x02" + b"".join(chunks) + b".")


def torch_accepts(data: bytes) -> bool:
    """torch's own weights-only unpickler (no persistent_load: as for a pickle without storages)."""
    from torch import _weights_only_unpickler

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            _weights_only_unpickler.Unpickler(io.BytesIO(data), encoding="utf-8").load()
        except Exception:  # any refusal or failure
            return False
    return True


def no_storage(pid: tuple[object, ...]) -> WStorage:
    raise Refusal("torch's unpickler without a persistent_load refuses every persistent id")


@settings(
    max_examples=20_000 if LONG else 400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=not LONG,
)
@given(programs)
def test_random_programs_accepted_exactly_when_torch_accepts_them(data: bytes) -> None:
    scan = scan_pickle(data, no_storage)
    ours = scan.fatal is None and not scan.refused and not scan.hidden
    assert ours == torch_accepts(data), (data, scan.fatal, dict(scan.refused))
