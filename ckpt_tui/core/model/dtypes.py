"""torch dtypes by name: element sizes and the legacy typed-storage classes that carry them."""

from __future__ import annotations

# torch dtype name -> (itemsize in bytes, legacy typed-storage class name or None)
DTYPES: dict[str, tuple[int, str | None]] = {
    "float64": (8, "DoubleStorage"),
    "float32": (4, "FloatStorage"),
    "float16": (2, "HalfStorage"),
    "bfloat16": (2, "BFloat16Storage"),
    "int64": (8, "LongStorage"),
    "int32": (4, "IntStorage"),
    "int16": (2, "ShortStorage"),
    "int8": (1, "CharStorage"),
    "uint8": (1, "ByteStorage"),
    "bool": (1, "BoolStorage"),
    "complex128": (16, "ComplexDoubleStorage"),
    "complex64": (8, "ComplexFloatStorage"),
    "complex32": (4, None),
    "qint8": (1, "QInt8Storage"),
    "quint8": (1, "QUInt8Storage"),
    "qint32": (4, "QInt32Storage"),
    "quint4x2": (1, "QUInt4x2Storage"),
    "quint2x4": (1, "QUInt2x4Storage"),
    "float8_e4m3fn": (1, None),
    "float8_e5m2": (1, None),
    "float8_e4m3fnuz": (1, None),
    "float8_e5m2fnuz": (1, None),
    "float8_e8m0fnu": (1, None),
    "uint16": (2, None),
    "uint32": (4, None),
    "uint64": (8, None),
    # read as bytes only (shape, size, verdict); their values are never decoded
    "float4_e2m1fn_x2": (1, None),
    "bits8": (1, None),
    "bits16": (2, None),
    "bits1x8": (1, None),
    "bits2x4": (1, None),
    "bits4x2": (1, None),
    # torch's sub-byte integers (2.7+): a "shell" dtype of one byte per element (element_size 1), that
    # torch.save cannot write but torch.load(weights_only=True) loads from a _rebuild_tensor_v3 naming it
    **{f"{kind}{bits}": (1, None) for kind in ("int", "uint") for bits in range(1, 8)},
}

QUANTIZED_DTYPES = frozenset({"qint8", "quint8", "qint32", "quint4x2", "quint2x4"})
"""The quantized dtypes: torch makes them on the CPU through a quantizer (``_rebuild_qtensor``), never empty on meta."""
STORAGE_CLASS_DTYPES = {cls: name for name, (_, cls) in DTYPES.items() if cls}


def itemsize(dtype: str) -> int:
    """Bytes per element of a torch dtype name."""
    return DTYPES[dtype][0]


QUANT_ZERO_POINT_DTYPES = frozenset({"int64", "int32", "int16", "int8", "uint8"})
QUANT_SCALE_DTYPES = QUANT_ZERO_POINT_DTYPES | {"float64", "float32", "float16", "bfloat16", "bool"}
"""The dtypes of a 0-d tensor torch's ``_empty_affine_quantized`` reads as a per-tensor quantizer's scale (its
``item()``) or zero point (an integer's only: a float or bool tensor is refused)."""
