"""One dtype spelling for all of exportkit: numpy-style names ("float32", "bfloat16", "int64", "string").

TensorFlow, Keras, numpy, TF's DataType enum names (DT_FLOAT) and users (`--input-spec x:-1:float`) each spell
dtypes their own way; everything is turned into the canonical name here, once, and compared by name after.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from exportkit.errors import UsageError

HALF_DTYPES = ("float16", "bfloat16")
# Every other spelling of a canonical name: user shorthands, TF's short names, numpy's names for strings.
ALIASES = {"half": "float16", "float": "float32", "double": "float64", "int": "int32", "long": "int64",
           "str": "string", "bytes": "string", "object": "string", "tf.string": "string"}
# The dtypes a signature input may have (what --input-spec accepts).
INPUT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
                          "uint16", "uint32", "uint64", "bool", "string"})
_FLOAT_NAMES = frozenset({"float16", "float32", "float64", "float128", "longdouble", "complex64", "complex128",
                          "bfloat16"})
_ML_DTYPES_PREFIXES = ("float8_", "float6_", "float4_")


def canonical(name: str) -> str:
    """Any spelling (`float`, `DT_HALF`, `DT_INT64_REF`, `str`) as the canonical name."""
    if name.startswith("DT_"):
        name = name[len("DT_"):].lower()
        name = name[: -len("_ref")] if name.endswith("_ref") else name
    return ALIASES.get(name, name)


def name_of(dtype: Any) -> str:
    """A TF/Keras/numpy dtype object, or a string, by its canonical name."""
    return canonical(getattr(dtype, "name", None) or str(dtype))


def name_of_array(arr: np.ndarray) -> str:
    """An array's dtype name, with "string" for S/U arrays and object arrays of bytes/str."""
    dt = arr.dtype
    if dt.kind in "SU":
        return "string"
    if dt.kind == "O":
        return "string" if all(isinstance(x, (bytes, str)) for x in arr.flat) else "object"
    return dt.name


def is_string(name: str) -> bool:
    return canonical(name) == "string"


def is_float(name: str) -> bool:
    """True for every floating/complex dtype name, including bfloat16 and the float8/6/4 types."""
    name = canonical(name)
    return name in _FLOAT_NAMES or name.startswith(_ML_DTYPES_PREFIXES)


def numpy_dtype(name: str) -> np.dtype | None:
    """The numpy dtype for a name; None for "string" (object arrays of bytes)."""
    name = canonical(name)
    if name == "string":
        return None
    if name == "bfloat16" or name.startswith(_ML_DTYPES_PREFIXES) or name in ("int4", "uint4", "int2", "uint2"):
        import ml_dtypes

        try:
            return np.dtype(getattr(ml_dtypes, name))
        except AttributeError:
            raise UsageError(f"unknown dtype {name!r}", "use a numpy/TensorFlow dtype name such as float32, int64 or string") from None
    try:
        return np.dtype(name)
    except TypeError:
        raise UsageError(f"unknown dtype {name!r}", "use a numpy/TensorFlow dtype name such as float32, int64 or string") from None
