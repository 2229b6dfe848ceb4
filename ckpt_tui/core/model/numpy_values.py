"""numpy values as pickled, read from the recorded nodes without numpy: what an array or a scalar is.

``np.ndarray`` pickles as ``numpy._core.multiarray._reconstruct(ndarray, (0,), b'b')`` filled by BUILD with
``(version, shape, dtype, fortran, data)``; a numpy scalar as ``numpy._core.multiarray.scalar(dtype, data)``;
a dtype as ``numpy.dtype(code, False, True)`` filled with ``(3, byteorder, ...)`` (numpy < 2 names the
module ``numpy.core``). The browser, ``info`` and ``--sanitize`` all read them here.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

from ckpt_tui.core.model.tree import Opaque, is_global_ref

NUMPY_DTYPES = {
    "b1": "bool",
    "i1": "int8",
    "u1": "uint8",
    "i2": "int16",
    "u2": "uint16",
    "i4": "int32",
    "u4": "uint32",
    "i8": "int64",
    "u8": "uint64",
    "f2": "float16",
    "f4": "float32",
    "f8": "float64",
    "c8": "complex64",
    "c16": "complex128",
}
"""numpy dtype codes (``numpy.dtype(code)`` as pickled) -> dtype names (numpy's, which are torch's)."""
SCALAR_FORMATS = {"b1": "?", "i1": "b", "u1": "B", "i2": "h", "u2": "H", "i4": "i", "u4": "I", "i8": "q", "u8": "Q"}
SCALAR_FORMATS |= {"f2": "e", "f4": "f", "f8": "d"}
"""numpy dtype codes -> ``struct`` formats (complex: two of its float's)."""
_COMPLEX_PARTS = {"c8": "f", "c16": "d"}
RECONSTRUCT = frozenset({"numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct"})
SCALAR = frozenset({"numpy._core.multiarray.scalar", "numpy.core.multiarray.scalar"})
SHOWN_VALUES = 8
"""The most values a tree line shows of an array (more: its dtype and shape only)."""


class NotNumpy(ValueError):
    """A node named as a numpy value whose arguments or state numpy does not write (the message says what)."""


@dataclass(frozen=True)
class NumpyValue:
    """A pickled numpy array (``shape`` a tuple) or scalar (``shape`` None): its dtype's name, and its
    values (row-major, at most the limit asked for; None: not read, too many or of a dtype read as bytes)."""

    dtype: str
    shape: tuple[int, ...] | None
    values: tuple[Any, ...] | None

    @property
    def type_name(self) -> str:
        """``numpy.ndarray``, ``numpy.float64``: the type numpy gives it back as."""
        return "numpy.ndarray" if self.shape is not None else f"numpy.{self.dtype}"

    def text(self) -> str:
        """``ndarray float32 [3] = [0.485, 0.456, 0.406]``, ``numpy float64 = 0.93``: what a tree line says."""
        if self.shape is None:
            shown = _value_text(self.values[0], self.dtype) if self.values else "?"
            return f"numpy {self.dtype} = {shown}"
        head = f"ndarray {self.dtype} [{', '.join(map(str, self.shape))}]"
        return head if self.values is None else f"{head} = {self.values_text()}"

    def values_text(self) -> str:
        """The values, nested as the shape is (``[[1, 2], [3, 4]]``); ``-`` where they are not read."""
        if self.values is None:
            return "-"
        if self.shape is None:
            return _value_text(self.values[0], self.dtype)
        return _nested(list(self.values), self.shape, self.dtype)


def numpy_value(value: Any, limit: int = SHOWN_VALUES) -> NumpyValue | None:
    """What ``value`` is, if it is a numpy array or scalar as numpy pickles them (None: not one, or one whose
    parts numpy does not write); an array's values only when it holds at most ``limit``."""
    if not isinstance(value, Opaque):
        return None
    try:
        if value.global_name in RECONSTRUCT and value.args and _is_ndarray(value.args[0]):
            return _array(value, limit)
        if value.global_name in SCALAR:
            code = dtype_code(value.args[0] if value.args else None)[0]
            return NumpyValue(NUMPY_DTYPES.get(code, code), None, (scalar_of(value),))
    except (ValueError, TypeError, OverflowError, struct.error):  # NotNumpy, and text data that is not latin-1
        return None
    return None


def _is_ndarray(cls: Any) -> bool:
    return is_global_ref(cls) and cls.global_name == "numpy.ndarray"


def _array(value: Opaque, limit: int) -> NumpyValue:
    shape, code, order, fortran, raw = array_state(value)
    name = NUMPY_DTYPES.get(code, code)
    count = math.prod(shape)
    if count > limit or not isinstance(raw, bytes):
        return NumpyValue(name, shape, None)
    flat = _decode(raw, code, order, count)
    if flat is not None and fortran and len(shape) > 1:
        flat = _row_major(flat, shape)
    return NumpyValue(name, shape, None if flat is None else tuple(flat))


def array_state(value: Opaque) -> tuple[tuple[int, ...], str, str, bool, Any]:
    """An array's shape, dtype code, byte order, Fortran flag and data (bytes, or what numpy pickled for an
    object array), from its BUILD state ``(version, shape, dtype, fortran, data)``."""
    state = value.state
    if not (isinstance(state, tuple) and len(state) == 5):
        raise NotNumpy("a numpy array with a state numpy does not write")
    _, shape, dtype, fortran, raw = state
    code, order = dtype_code(dtype)
    if not isinstance(shape, tuple) or not all(type(n) is int and n >= 0 for n in shape):
        raise NotNumpy("a numpy array with a malformed shape")
    return shape, code, order, bool(fortran), raw_bytes(raw)


def dtype_code(dtype: Any) -> tuple[str, str]:
    """The code (``f4``) and byte order (``<``, ``>``, ``|``) of a pickled ``numpy.dtype``."""
    if not (isinstance(dtype, Opaque) and dtype.global_name == "numpy.dtype" and dtype.args):
        raise NotNumpy("a numpy value without a dtype")
    code = str(dtype.args[0])
    state = dtype.state
    order = state[1] if isinstance(state, tuple) and len(state) > 1 and isinstance(state[1], str) else "<"
    if isinstance(state, tuple) and len(state) > 3 and state[3] is not None:
        raise NotNumpy(f"a numpy structured dtype {code!r}")
    return code, order


def raw_bytes(raw: Any) -> Any:
    """Array data as bytes: protocol 2 pickles ``b""`` as ``builtins.bytes()``, and text data as latin-1."""
    if isinstance(raw, Opaque) and raw.global_name == "builtins.bytes" and not raw.args and raw.state is None:
        return b""
    if isinstance(raw, str):
        return raw.encode("latin1")
    return raw


def scalar_of(value: Opaque) -> bool | int | float | complex:
    """The Python value of a pickled numpy scalar ``scalar(dtype, data)``."""
    raw = raw_bytes(value.args[1]) if len(value.args) == 2 else None
    if not isinstance(raw, bytes):
        raise NotNumpy("a numpy scalar without its bytes")
    code, order = dtype_code(value.args[0])
    found = _decode(raw, code, order, 1)
    if found is None or code[:1] in ("U", "S"):
        raise NotNumpy(f"a numpy scalar of dtype {code!r}")
    scalar: bool | int | float | complex = found[0]
    return scalar


def _decode(raw: bytes, code: str, order: str, count: int) -> list[Any] | None:
    """``count`` values of dtype ``code`` from ``raw`` (None: a dtype not read here, or bytes of another size)."""
    endian = ">" if order == ">" else "<"
    if code in SCALAR_FORMATS:
        fmt = f"{endian}{count}{SCALAR_FORMATS[code]}"
        return list(struct.unpack(fmt, raw)) if struct.calcsize(fmt) == len(raw) else None
    if code in _COMPLEX_PARTS:
        fmt = f"{endian}{2 * count}{_COMPLEX_PARTS[code]}"
        if struct.calcsize(fmt) != len(raw):
            return None
        parts = struct.unpack(fmt, raw)
        return [complex(parts[i], parts[i + 1]) for i in range(0, len(parts), 2)]
    if code[:1] in ("U", "S") and code[1:].isdigit() and count and len(raw) == count * _width(code):
        width = _width(code)
        items = [raw[i * width : (i + 1) * width] for i in range(count)]
        if code[0] == "S":
            return [item.rstrip(b"\0") for item in items]
        encoding = "utf-32-be" if order == ">" else "utf-32-le"
        return [item.decode(encoding, "replace").rstrip("\0") for item in items]
    return None


def _width(code: str) -> int:
    """Bytes per item of a string dtype: ``U5`` holds 5 UTF-32 characters, ``S5`` 5 bytes."""
    return int(code[1:]) * (4 if code[0] == "U" else 1)


def _row_major(flat: list[Any], shape: tuple[int, ...]) -> list[Any]:
    """Values stored in Fortran order, in row-major order."""
    strides, step = [], 1
    for n in shape:  # Fortran: the first index moves fastest
        strides.append(step)
        step *= n
    out = []
    for index in range(len(flat)):
        offset, rest = 0, index
        for n, stride in zip(reversed(shape), reversed(strides), strict=True):
            rest, i = divmod(rest, n)
            offset += i * stride
        out.append(flat[offset])
    return out


def _nested(flat: list[Any], shape: tuple[int, ...], dtype: str) -> str:
    if not shape:
        return _value_text(flat[0], dtype)
    size = len(flat) // shape[0] if shape[0] else 0
    rows = [_nested(flat[i * size : (i + 1) * size], shape[1:], dtype) for i in range(shape[0])]
    return "[" + ", ".join(rows) + "]"


_FLOAT_FORMATS = {"float16": "<e", "float32": "<f"}


def _value_text(value: Any, dtype: str) -> str:
    """A value as numpy prints it: the shortest digits that give back the same float16/float32."""
    if isinstance(value, float) and dtype in _FLOAT_FORMATS and math.isfinite(value):
        packed = struct.pack(_FLOAT_FORMATS[dtype], value)
        for digits in range(1, 10):
            text = f"{value:.{digits}g}"
            if struct.pack(_FLOAT_FORMATS[dtype], float(text)) == packed:
                return text
    if isinstance(value, complex) and dtype == "complex64":
        real, imag = _value_text(value.real, "float32"), _value_text(value.imag, "float32")
        return f"({real}{'' if imag.startswith('-') else '+'}{imag}j)"
    return repr(value)
