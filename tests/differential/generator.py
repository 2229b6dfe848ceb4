"""Files for differential testing: torch zips, legacy files and plain pickles, assembled by hand.

:func:`case` makes file number ``index`` of a run from its seed alone (any worker can make any file).
Each holds a few values drawn from :data:`VALUES` (tensors through every rebuild function with odd but
valid arguments, old-style constructors, BUILD on shared or meta tensors, plain containers, and the
bypass gadgets) written with a random protocol and encoding, inside a zip whose names, order, flags and
records vary, or a legacy file, or a bare pickle. Payloads only ever create ``canary`` in the working
directory. Nothing here imports torch.
"""

from __future__ import annotations

import marshal
import random
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from differential.assemble import Build, Call, G, Pid, Raw, Seq, Shared, Writer

CANARY = "canary"
"""What a payload creates in its working directory (the case's own folder) when torch runs it."""

DTYPES = {  # storage class -> (dtype name, element size)
    "FloatStorage": ("float32", 4),
    "HalfStorage": ("float16", 2),
    "DoubleStorage": ("float64", 8),
    "LongStorage": ("int64", 8),
    "IntStorage": ("int32", 4),
    "ByteStorage": ("uint8", 1),
    "BoolStorage": ("bool", 1),
    "BFloat16Storage": ("bfloat16", 2),
    "ComplexFloatStorage": ("complex64", 8),
}
TENSOR_CLASSES = ["FloatTensor", "DoubleTensor", "LongTensor", "HalfTensor", "ByteTensor", "Tensor"]
RG = [False, False, False, True, 0, 1, None, "yes", 1.0]
"""requires_grad forms: mostly False, then the odd ones torch may or may not take."""


class Dice(random.Random):
    """A random generator with a mood: ``level`` scales how often odd forms are drawn (0: never)."""

    def __init__(self, seed: str) -> None:
        super().__init__(seed)
        self.level = self.choice([0.0, 0.5, 1.0, 1.0, 2.0])

    def odd(self, rate: float) -> bool:
        """True with probability ``rate`` times the mood."""
        return self.random() < rate * self.level

    def roll(self) -> float:
        """A draw in [0, 1) for branches whose low end is odd: higher (rarer odd branches) in a calm mood."""
        return self.random() / self.level if self.level else 1.0


@dataclass
class Case:
    """One generated file: its name in the case folder, its bytes, and what it was made of."""

    name: str
    data: bytes
    kinds: list[str]


class Storages:
    """The storages of one file: persistent ids, and the records (or legacy blobs) behind them."""

    def __init__(self, rng: Dice, legacy: bool) -> None:
        self.rng = rng
        self.legacy = legacy
        self.records: dict[str, bytes] = {}
        self.numels: dict[str, tuple[str, int]] = {}
        self.shared: dict[str, Shared] = {}

    def new(self, numel: int | None = None, storage: str | None = None) -> tuple[Shared, str, int]:
        """A fresh storage: (its id node, its dtype, its element count)."""
        rng = self.rng
        storage = storage or rng.choice(list(DTYPES))
        dtype, size = DTYPES[storage]
        numel = rng.choice([0, 1, 2, 4, 6, 12]) if numel is None else numel
        key = str(len(self.records)) if rng.random() < 0.95 else rng.choice(["k", "00", "x y"])
        if key in self.records:
            key = str(len(self.records))
        data = bytes(rng.getrandbits(8) if dtype != "bool" else rng.getrandbits(1) for _ in range(numel * size))
        self.records[key] = data
        self.numels[key] = (storage, numel)
        location: object = "cpu"
        if rng.odd(0.05):
            location = rng.choice(["cuda:0", "meta", b"cpu", "CPU", "cpu:0", "bogus"])
        pid_numel: object = numel
        if rng.odd(0.03):
            pid_numel = rng.choice([numel + 1, -1, float(numel), None])
        fields: tuple[object, ...] = ("storage", G("torch", storage), key, location, pid_numel)
        if self.legacy:
            fields += (None,)
        if rng.odd(0.03):
            fields = rng.choice([fields[:-1], (*fields, None), (b"storage", *fields[1:]), ("module", *fields[1:])])
        node = self.shared[key] = Shared(Pid(fields))
        return node, dtype, numel


# ---- values ---------------------------------------------------------------------------------------


def _shape(rng: Dice, numel: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A size within ``numel`` elements and its contiguous stride (sometimes odd ones)."""
    options = [(numel,), (1, numel), ()] if numel else [(0,), (2, 0), (0, 3)]
    if numel >= 4 and numel % 2 == 0:
        options += [(2, numel // 2), (numel // 2, 2)]
    size = rng.choice(options)
    if size == () and numel != 1:
        size = (numel,)
    stride = tuple(_contiguous(size))
    roll = rng.roll()
    if roll < 0.05:
        stride = ()
    elif roll < 0.08:
        stride = tuple(-s for s in stride)
    elif roll < 0.1 and size:
        stride = (*stride, 1)
    elif roll < 0.13 and size:
        stride = tuple(0 for _ in stride)
    return size, stride


def _contiguous(size: tuple[int, ...]) -> list[int]:
    stride, step = [], 1
    for n in reversed(size):
        stride.append(step)
        step *= max(n, 1)
    return stride[::-1]


def _seq(rng: Dice, values: tuple[int, ...]) -> object:
    """A size or stride as tuple, list or torch.Size."""
    roll = rng.roll()
    if roll < 0.8:
        return values
    if roll < 0.9:
        return list(values)
    return Call(G("torch", "Size"), (values,))


def _odd(rng: Dice, value: object, others: list[object], rate: float = 0.04) -> object:
    return rng.choice(others) if rng.odd(rate) else value


def tensor_v2(rng: Dice, st: Storages) -> tuple[object, str]:
    """``_rebuild_tensor_v2`` with every argument form."""
    pid, _, numel = st.new()
    size, stride = _shape(rng, numel)
    offset = _odd(rng, 0, [1, -1, numel, True, 0.0, None])
    hooks = _odd(rng, Call(G("collections", "OrderedDict"), ()), [{}, None, [], Call(G("collections", "Counter"), ())])
    grad = rng.choice(RG) if rng.odd(0.3) else False
    args: list[object] = [pid, offset, _seq(rng, size), _seq(rng, stride), grad, hooks]
    roll = rng.roll()
    if roll < 0.15:
        args.append(rng.choice([{}, None, {"conj": True}, {"neg": True}, {"conj": False}, {1: True}, {"x": 1}, []]))
    elif roll < 0.2:
        args = args[: rng.choice([3, 4, 5])]
    elif roll < 0.22:
        args += [None, None]
    return Call(G("torch._utils", "_rebuild_tensor_v2"), tuple(args)), "tensor_v2"


def tensor_v1(rng: Dice, st: Storages) -> tuple[object, str]:
    """``_rebuild_tensor`` (no requires_grad, no hooks), any arity."""
    pid, _, numel = st.new()
    size, stride = _shape(rng, numel)
    args: tuple[object, ...] = (pid, 0, _seq(rng, size), _seq(rng, stride))
    if rng.odd(0.2):
        args = args[: rng.choice([2, 3])] if rng.random() < 0.5 else (*args, False)
    if rng.odd(0.1):
        args = (pid, 0, _seq(rng, size), None)
    return Call(G("torch._utils", "_rebuild_tensor"), args), "tensor_v1"


def tensor_v3(rng: Dice, st: Storages) -> tuple[object, str]:
    """``_rebuild_tensor_v3``: the dtype given apart from the storage (uint16, fp8 ...)."""
    pid, _, numel = st.new(storage="ByteStorage")
    dtype_name = rng.choice(["uint8", "uint16", "float8_e4m3fn", "int8", "bool", "float32", "uint32"])
    size = {"uint8": 1, "int8": 1, "bool": 1, "float8_e4m3fn": 1, "uint16": 2, "float32": 4, "uint32": 4}[dtype_name]
    count = numel // size
    shape, stride = _shape(rng, count)
    args: tuple[object, ...] = (pid, 0, shape, stride, rng.choice(RG) if rng.odd(0.4) else False)
    args += (Call(G("collections", "OrderedDict"), ()), G("torch", dtype_name))
    if rng.odd(0.2):
        args = args[:6] if rng.random() < 0.5 else (*args, rng.choice([{}, {"conj": True}, None]))
    return Call(G("torch._utils", "_rebuild_tensor_v3"), args), "tensor_v3"


def parameter(rng: Dice, st: Storages) -> tuple[object, str]:
    """A Parameter through each of its routes."""
    inner, _ = tensor_v2(rng, st)
    grad = rng.choice([True, False, True, 1, None])
    roll = rng.random()
    if roll < 0.4:
        args: tuple[object, ...] = (inner, grad, Call(G("collections", "OrderedDict"), ()))
        if rng.odd(0.15):
            args = args[: rng.choice([1, 2])] if rng.random() < 0.5 else (*args, None)
        return Call(G("torch._utils", "_rebuild_parameter"), args), "parameter"
    if roll < 0.7:
        state = rng.choice([{}, None, ({}, {}), {"tag": "x"}, {"_is_param": True}, [], ({"a": 1}, None)])
        args = (inner, grad, Call(G("collections", "OrderedDict"), ()), state)
        return Call(G("torch._utils", "_rebuild_parameter_with_state"), args), "parameter_with_state"
    args = rng.choice([(inner,), (inner, grad), (), (inner, grad, None)])
    via = "newobj" if rng.random() < 0.5 else "reduce"
    return Call(G("torch.nn.parameter", "Parameter"), args, via), f"Parameter_{via}"


def old_constructor(rng: Dice, st: Storages) -> tuple[object, str]:
    """``torch.FloatTensor(...)`` with any arguments, through REDUCE or NEWOBJ."""
    cls = G("torch", rng.choice(TENSOR_CLASSES))
    choices: list[tuple[object, ...]] = [(), (3,), ((2, 3),), (2, 3), ([1.0, 2.0],), ("x",), (None,), ([],)]
    pid, _, _ = st.new()
    choices += [(pid,), (Call(G("torch", "Size"), ((2,),)),), (1.5,), (True,), ((),)]
    via = "newobj" if rng.random() < 0.4 else "reduce"
    return Call(cls, rng.choice(choices), via), f"constructor_{via}"


def built_tensor(rng: Dice, st: Storages) -> tuple[object, str]:
    """BUILD on a tensor: legacy ``set_`` states, on a fresh, shared or meta tensor."""
    pid, _, numel = st.new(storage="FloatStorage")
    size, stride = _shape(rng, numel)
    base_roll = rng.random()
    if base_roll < 0.4:
        base: object = Call(G("torch", "FloatTensor"), ())
        what = "build_new"
    elif base_roll < 0.7:
        inner, _ = tensor_v2(rng, st)
        base = Shared(inner)
        what = "build_shared"
    else:
        args = (G("torch", "float32"), size, stride, rng.choice([False, True]))
        base = Call(G("torch._utils", "_rebuild_meta_tensor_no_storage"), args)
        what = "build_meta"
    states: list[object] = [(pid,), (pid, 0, size, stride), (), (pid, 0, size), {}, {"x": 1}, None]
    states += [(pid, 0, list(size), list(stride)), (pid, 1, size, stride), [pid]]
    node = Build(base, rng.choice(states))
    if isinstance(base, Shared):
        return (base, node), what  # the shared tensor, seen before and after BUILD
    return node, what


def reused_tensor(rng: Dice, st: Storages) -> tuple[object, str]:
    """One tensor from the memo used again after BUILD may have changed it: as a grad, as data, as set_'s source."""
    inner, _ = tensor_v2(rng, st)
    shared = Shared(inner)
    pid, _, numel = st.new(storage="FloatStorage")
    size, stride = _shape(rng, numel)
    changes: list[object] = [(), (pid,), (pid, 0, size, stride), (shared,)]
    first: object = Build(shared, rng.choice(changes)) if rng.random() < 0.7 else shared
    other, _ = tensor_v2(rng, st)
    call = other.args if isinstance(other, Call) else ()
    state = rng.choice([{"grad": shared}, {"data": shared}, {"_grad": shared}, {"requires_grad": True}])
    func = G("torch._utils", "_rebuild_tensor_v2")
    uses: list[object] = [
        Call(G("torch._tensor", "_rebuild_from_type_v2"), (func, G("torch", "Tensor"), call, state)),
        Call(G("torch._utils", "_rebuild_parameter"), (shared, True, Call(G("collections", "OrderedDict"), ()))),
        Build(other, (shared,)),
        shared,
    ]
    return (shared, first, rng.choice(uses)), "reused"


def meta_tensor(rng: Dice, st: Storages) -> tuple[object, str]:
    """``_rebuild_meta_tensor_no_storage``."""
    size = rng.choice([(2, 3), (), (0,), (-1,), (4,)])
    stride = tuple(_contiguous(size)) if not rng.odd(0.1) else ()
    dtype = rng.choice(["float32", "int64", "float16"])
    args = (G("torch", dtype), _seq(rng, size), _seq(rng, stride), rng.choice([False, True, 0]))
    return Call(G("torch._utils", "_rebuild_meta_tensor_no_storage"), args), "meta"


def from_type(rng: Dice, st: Storages) -> tuple[object, str]:
    """``_rebuild_from_type_v2(func, type, args, state)``."""
    inner, _ = tensor_v2(rng, st)
    func = G("torch._utils", "_rebuild_tensor_v2")
    call = inner.args if isinstance(inner, Call) else ()
    new_type = rng.choice([G("torch", "Tensor"), G("torch.nn.parameter", "Parameter"), G("torch", "Tensor")])
    state = rng.choice([{}, None, {"x": 1}, ({}, {}), {"requires_grad": False}, {"data": None}])
    return Call(G("torch._tensor", "_rebuild_from_type_v2"), (func, new_type, call, state)), "from_type"


def size_value(rng: Dice, st: Storages) -> tuple[object, str]:
    """``torch.Size``, sometimes with a BUILD state."""
    size = Call(G("torch", "Size"), (rng.choice([(1, 2), (), [3]]),))
    if rng.random() < 0.5:
        return Build(size, rng.choice([{}, None, (), {"a": 1}, ({}, {})])), "size_build"
    return size, "size"


def plain_value(rng: Dice, st: Storages) -> tuple[object, str]:
    """Containers and allowed leaf values."""
    choices: list[object] = [
        1,
        -5,
        1 << 70,
        2.5,
        "text",
        "\udcff",
        True,
        None,
        b"raw",
        (1, "a"),
        [1, [2]],
        {"a": {"b": 1}},
        Call(G("collections", "OrderedDict"), ()),
        Call(G("collections", "OrderedDict"), ([("a", 1)],)),
        Call(G("collections", "Counter"), ({"a": 1},)),
        Call(G("builtins", "set"), ([1, 2],)),
        Call(G("builtins", "complex"), (1.0, 2.0)),
        Call(G("builtins", "bytearray"), (b"ab",)),
        Call(G("torch", "device"), ("cpu",)),
        Call(G("torch", "device"), ("cuda", 0)),
        Call(G("torch.serialization", "_get_layout"), ("torch.strided",)),
        Call(G("_codecs", "encode"), ("abc", "latin1")),
        G("torch", "float32"),
        G("torch", "bfloat16"),
        G("torch", "uint16"),
        Build(Call(G("collections", "OrderedDict"), ()), {"_metadata": {}}),
        Call(G("collections", "OrderedDict"), (), "newobj"),
        Call(G("builtins", "set"), (), "newobj"),
    ]
    return rng.choice(choices), "plain"


# ---- gadgets and opcode tricks (torch must refuse each; weights_only=False runs it) ------------------

_MKDIR = ("posix", "mkdir")
_EXEC = f"open({CANARY!r}, 'w').close()"


def _code_bytes() -> bytes:
    return marshal.dumps(compile(_EXEC, "<payload>", "exec"))


GADGETS: dict[str, Callable[[], object]] = {
    "posix.mkdir": lambda: Call(G(*_MKDIR), (CANARY,)),
    "os.mkdir": lambda: Call(G("os", "mkdir"), (CANARY,)),
    "builtins.exec": lambda: Call(G("builtins", "exec"), (_EXEC,)),
    "builtins.eval": lambda: Call(G("builtins", "eval"), (f"__import__('os').mkdir({CANARY!r})",)),
    "pkgutil.resolve_name": lambda: Call(Call(G("pkgutil", "resolve_name"), ("os:mkdir",)), (CANARY,)),
    "operator.call": lambda: Call(G("operator", "call"), (Call(G("pkgutil", "resolve_name"), ("os:mkdir",)), CANARY)),
    "importlib": lambda: Call(
        Call(G("builtins", "getattr"), (Call(G("importlib", "import_module"), ("os",)), "mkdir")), (CANARY,)
    ),
    "marshal": lambda: Call(G("builtins", "exec"), (Call(G("marshal", "loads"), (_code_bytes(),)),)),
    "pip.main": lambda: Call(G("pip", "main"), (["--log", CANARY, "cache", "dir"],)),
    "typing._eval_type": lambda: Call(
        G("typing", "_eval_type"),
        (Call(G("typing", "ForwardRef"), (f"__import__('os').mkdir({CANARY!r})",)), {}, {}),
    ),
    "dataclasses._create_fn": lambda: Call(Call(G("dataclasses", "_create_fn"), ("f", (), [_EXEC])), ()),
    "subprocess.Popen via NEWOBJ": lambda: Call(G("subprocess", "Popen"), (["mkdir", CANARY],), "newobj"),
    "posix.mkdir via INST": lambda: Call(G(*_MKDIR), (CANARY,), "inst"),
    "posix.mkdir via OBJ": lambda: Call(G(*_MKDIR), (CANARY,), "obj"),
    "posix.mkdir via NEWOBJ_EX": lambda: Call(G(*_MKDIR), (CANARY,), "newobj_ex"),
    "posix.mkdir via STACK_GLOBAL": lambda: Raw(b"\x8c\x05posix\x8c\x05mkdir\x93" + _canary_call()),
    "posix.mkdir via STACK_GLOBAL from the memo": lambda: Raw(_stack_global_payload()),
    "posix.mkdir hidden by POP": lambda: Seq([Raw(_payload_code() + b"0"), 1]),
    "posix.mkdir hidden by POP_MARK": lambda: Seq([Raw(b"(" + _payload_code() + b"1"), 1]),
    "nested pickle.loads": lambda: Call(G("pickle", "loads"), (b"\x80\x02" + _payload_code() + b".",)),
}
"""Stdlib gadgets and opcode tricks: each creates the canary when unpickled for real; torch must refuse each."""
NOT_RUN_BY_PICKLE = frozenset({"posix.mkdir via NEWOBJ_EX", "subprocess.Popen via NEWOBJ"})
"""Gadgets whose code pickle does not reach (NEWOBJ calls only ``__new__``): refused all the same."""


def gadget(rng: Dice, st: Storages) -> tuple[object, str]:
    """One stdlib gadget that creates the canary when unpickled for real."""
    name = rng.choice(sorted(GADGETS))
    return GADGETS[name](), f"gadget {name}"


def _payload_code() -> bytes:
    """A call of ``posix.mkdir('canary')`` as bare opcodes (pushes its result)."""
    text = CANARY.encode()
    return b"cposix\nmkdir\nX" + struct.pack("<I", len(text)) + text + b"\x85R"


def _canary_call() -> bytes:
    """Call the function on the stack with ``(canary,)``."""
    text = CANARY.encode()
    return b"\x8c" + bytes([len(text)]) + text + b"\x85R"


def _stack_global_payload() -> bytes:
    """``posix.mkdir`` named by STACK_GLOBAL from strings kept in the memo, then called."""
    put = [b"r" + struct.pack("<I", 900_000 + i) for i in range(2)]
    get = [b"j" + struct.pack("<I", 900_000 + i) for i in range(2)]
    strings = b"\x8c\x05posix" + put[0] + b"0\x8c\x05mkdir" + put[1] + b"0"
    return strings + get[0] + get[1] + b"\x93" + _canary_call()


def trick(rng: Dice, st: Storages) -> tuple[object, str]:
    """Opcodes torch's loader does not read: DUP, EXT codes, PERSID."""
    name = rng.choice(["dup", "ext1", "ext2", "ext4", "persid"])
    value: object
    if name == "dup":
        value = Raw(_payload_code() + b"20")
    elif name.startswith("ext"):
        code = {"ext1": b"\x82\x01", "ext2": b"\x83\x01\x00", "ext4": b"\x84\x01\x00\x00\x00"}[name]
        value = Seq([Raw(code), 1]) if rng.random() < 0.5 else Raw(code)
    else:
        value = Raw(b"P" + CANARY.encode() + b"\n")
    return value, f"trick {name}"


def gadget_case(name: str) -> Case:
    """One gadget as the only value of a zip checkpoint's ``data.pkl`` (protocol 2)."""
    rng = Dice(name)
    data_pkl = Writer(2, rng, memo_rate=0).dump({"model": GADGETS[name]()})
    members = [(b"archive/data.pkl", data_pkl), (b"archive/byteorder", b"little"), (b"archive/version", b"3\n")]
    return Case("ckpt.pth", zip_bytes(members), [f"gadget {name}"])


VALUES: list[tuple[float, Callable[[Dice, Storages], tuple[object, str]]]] = [
    (0.25, tensor_v2),
    (0.05, tensor_v1),
    (0.05, tensor_v3),
    (0.1, parameter),
    (0.06, old_constructor),
    (0.07, built_tensor),
    (0.05, reused_tensor),
    (0.03, meta_tensor),
    (0.04, from_type),
    (0.04, size_value),
    (0.2, plain_value),
    (0.02, gadget),
    (0.02, trick),
]


def _value(rng: Dice, st: Storages) -> tuple[object, str]:
    roll = rng.random() * sum(w for w, _ in VALUES)
    for weight, make in VALUES:
        roll -= weight
        if roll <= 0:
            return make(rng, st)
    return VALUES[0][1](rng, st)


def _object(rng: Dice, st: Storages) -> tuple[object, list[str]]:
    """The pickled object: a dict (or OrderedDict, list) of a few values."""
    count = rng.choice([1, 1, 2, 3, 4])
    values, kinds = [], []
    for _ in range(count):
        value, kind = _value(rng, st)
        values.append(value)
        kinds.append(kind)
    keys = [f"v{i}" for i in range(count)]
    roll = rng.random()
    if roll < 0.6:
        return dict(zip(keys, values, strict=True)), kinds
    if roll < 0.8:
        pairs = [(k, v) for k, v in zip(keys, values, strict=True)]
        return Call(G("collections", "OrderedDict"), (pairs,)), kinds
    return values, kinds


def _protocol(rng: Dice) -> int:
    other = 4 * rng.level
    return rng.choices([0, 1, 2, 3, 4, 5], weights=[other, other, 100, other, other, other])[0]


def pickle_bytes(rng: Dice, node: object) -> bytes:
    """``node`` as a pickle of a random protocol."""
    protocol = _protocol(rng)
    return Writer(protocol, rng).dump(node, frame=rng.random() < 0.5)


# ---- containers -----------------------------------------------------------------------------------


def case(seed: int, index: int) -> Case:
    """File number ``index`` of the run ``seed``."""
    rng = Dice(f"{seed}:{index}")
    roll = rng.random()
    if roll < 0.75:
        return _zip_case(rng)
    if roll < 0.9:
        return _legacy_case(rng)
    return _pickle_case(rng)


def _pickle_case(rng: Dice) -> Case:
    st = Storages(rng, legacy=False)
    node, kinds = _object(rng, st)
    return Case("ckpt.pkl", pickle_bytes(rng, node), ["pickle", *kinds])


def _zip_case(rng: Dice) -> Case:
    st = Storages(rng, legacy=False)
    node, kinds = _object(rng, st)
    data_pkl = pickle_bytes(rng, node)
    archive = rng.choice(["archive", "archive", "model", "a.b", "x" * 40])
    members: list[tuple[bytes, bytes]] = [(f"{archive}/data.pkl".encode(), data_pkl)]
    members += [(f"{archive}/data/{key}".encode(), data) for key, data in st.records.items()]
    version = rng.choices([b"3\n", b"3", b"2\n", b"+3", b"", b" 3", b"03", b"3\n\n", b"11", b"1"], [70, 5, 5] + [2] * 7)
    version_name = rng.choice([".data/version", ".data/version", "version"])
    if not rng.odd(0.03):
        members.append((f"{archive}/{version_name}".encode(), version[0]))
    if not rng.odd(0.1):
        members.append((f"{archive}/byteorder".encode(), rng.choices([b"little", b"big", b"LITTLE"], [90, 5, 5])[0]))
    if rng.random() < 0.5:
        members.append((f"{archive}/.data/serialization_id".encode(), b"1234567890"))
    kinds = ["zip", *kinds]
    unwritten: dict[bytes, str] = {}
    roll = rng.roll()
    if roll < 0.05:
        members.append((f"{archive}/data/\xff\xfe".encode("latin1"), b"\x00" * 4))
        kinds.append("zip non-utf8 name")
    elif roll < 0.08:
        rng.shuffle(members)
        kinds.append("zip order")
    elif roll < 0.1:
        members.append((f"{archive}/extra.pkl".encode(), _payload_code() + b"."))
        kinds.append("zip extra pickle")
    elif roll < 0.12 and st.records:
        key = rng.choice(list(st.records))
        members = [(n, d[:-1] if n.endswith(f"/data/{key}".encode()) and d else d) for n, d in members]
        kinds.append("zip short record")
    elif roll < 0.2:
        # miniz "extracts" a directory (DOS bit 0x10) or a member of compressed size 0 without writing a
        # byte: torch.load then returns the buffer it allocated, never the bytes on disk
        name, data = rng.choice(members)
        how = rng.choice(["directory bit", "compressed size 0"])
        unwritten[name] = how
        kinds.append(f"zip unwritten {how}{'' if data else ' (empty)'}")
    flags = {name: rng.choices([0, 0x800, 0x8, 0x1], [85, 10, 3, 2])[0] for name, _ in members}
    if rng.odd(0.05):
        name = rng.choice(members)[0]
        flags[name] = rng.choice([0x1, 0x20, 0x40, 0x2])
        kinds.append("zip member flag")
    deflate = rng.random() < 0.1
    return Case("ckpt.pth", zip_bytes(members, flags, deflate, bad_crc=rng.odd(0.02), unwritten=unwritten), kinds)


def zip_bytes(
    members: list[tuple[bytes, bytes]],
    flags: dict[bytes, int] | None = None,
    deflate: bool = False,
    bad_crc: bool = False,
    unwritten: dict[bytes, str] | None = None,
) -> bytes:
    """A zip of ``members`` (names as bytes), each with its general-purpose ``flags``; stored or deflated.
    A member named in ``unwritten`` gets the DOS directory bit, or a compressed size of 0, in the central
    directory (what miniz reads)."""
    out = bytearray()
    central = bytearray()
    for name, data in members:
        flag = (flags or {}).get(name, 0)
        crc = zlib.crc32(data) ^ (1 if bad_crc else 0)
        body = data
        method = 0
        if deflate and len(data) > 8:
            compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
            body = compressor.compress(data) + compressor.flush()
            method = 8
        offset = len(out)
        sizes = (crc, len(body), len(data), len(name))
        header = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, flag, method, 0, 0, *sizes, 0)
        out += header + name + body
        how = (unwritten or {}).get(name)
        external = 0x10 if how == "directory bit" else 0
        central_size = 0 if how == "compressed size 0" else len(body)
        central += struct.pack(
            "<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, flag, method, 0, 0, crc, central_size, len(data), len(name),
            0, 0, 0, 0, external, offset,
        )  # fmt: skip
        central += name
    start = len(out)
    out += central
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(central), start, 0)
    return bytes(out)


LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def _legacy_case(rng: Dice) -> Case:
    st = Storages(rng, legacy=True)
    node, kinds = _object(rng, st)
    head = b"".join(
        Writer(2, rng, memo_rate=0).dump(value)
        for value in (
            LEGACY_MAGIC,
            1001,
            {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}},
        )
    )
    body = pickle_bytes(rng, node)
    keys = list(st.records)
    if rng.odd(0.05) and keys:
        keys = keys[:-1] if rng.random() < 0.5 else [*keys, "missing"]
    tail = Writer(2, rng, memo_rate=0).dump(keys)
    blobs = b""
    for key in keys:
        if key not in st.numels:
            continue
        _, numel = st.numels[key]
        blobs += struct.pack("<q", numel) + st.records[key]
    return Case("ckpt.pt", head + body + tail + blobs, ["legacy", *kinds])
