"""TensorProto <-> ndarray: the one conversion used by the warm-up writer, the gRPC client and the server.

Numeric arrays (one `tensor_content` copy, what `tf.make_tensor_proto` produces too) and strings take paths that
need only the protos, so a client process never imports TensorFlow for them; anything else goes through
TensorFlow's own `make_tensor_proto`/`make_ndarray`.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from exportkit.dtypes import numpy_dtype
from exportkit.tfenv import import_tf

_NUMERIC = {"DT_HALF": "float16", "DT_FLOAT": "float32", "DT_DOUBLE": "float64", "DT_INT8": "int8",
            "DT_INT16": "int16", "DT_INT32": "int32", "DT_INT64": "int64", "DT_UINT8": "uint8", "DT_UINT16": "uint16",
            "DT_UINT32": "uint32", "DT_UINT64": "uint64", "DT_BOOL": "bool", "DT_COMPLEX64": "complex64",
            "DT_COMPLEX128": "complex128", "DT_BFLOAT16": "bfloat16"}
_NP_TO_DT: dict | None = None  # numpy dtype name -> DataType enum, built lazily from the protos


def np_to_datatype() -> dict:
    """{numpy dtype name: DataType enum}. Keyed by name, so no ml_dtypes import (0.6 s) unless a bfloat16 is met."""
    global _NP_TO_DT
    if _NP_TO_DT is None:
        from exportkit.savedmodel.protos import protos

        data_type = protos()["types"].DataType
        _NP_TO_DT = {name: data_type.Value(enum) for enum, name in _NUMERIC.items()}
    return _NP_TO_DT


@functools.cache
def datatype_of(dtype: np.dtype) -> int | None:
    """A numpy dtype's DataType enum (None for strings, objects and dtypes TensorFlow has not), looked up once per
    dtype: np.dtype.name is a Python property (~1.5 us), too slow for every tensor of every Predict."""
    return None if dtype.kind in "OSU" else np_to_datatype().get(dtype.name)


_DT_TO_NP: dict = {}  # DataType enum -> numpy dtype (None: not numeric), filled as enums are met


def _dt_to_np(enum: int) -> np.dtype | None:
    if enum not in _DT_TO_NP:
        name = next((n for n, e in np_to_datatype().items() if e == enum), None)
        _DT_TO_NP[enum] = None if name is None else numpy_dtype(name)
    return _DT_TO_NP[enum]


def _enum(dtype) -> int | None:
    """A DataType enum from an enum, a tf.DType or None."""
    if dtype is None or isinstance(dtype, int):
        return dtype
    return dtype.as_datatype_enum


def to_tensor_proto(array, dtype=None):
    """An ndarray (strings: object array of bytes/str) as a TensorProto.

    `dtype` (a tf.DType or DataType enum) forces the proto dtype, e.g. the signature's.
    """
    from exportkit.savedmodel.protos import protos

    arr = np.asarray(array)
    want = _enum(dtype)
    tensor_pb2 = protos()["tensor"]
    enum = datatype_of(arr.dtype)
    string = protos()["types"].DataType.Value("DT_STRING")
    if enum is not None and want in (None, enum):
        proto = tensor_pb2.TensorProto(dtype=enum, tensor_content=np.ascontiguousarray(arr).tobytes())
    elif arr.dtype.kind in "OSU" and want in (None, string) and all(isinstance(v, (bytes, str)) for v in arr.flat):
        proto = tensor_pb2.TensorProto(dtype=string)
        proto.string_val.extend(v.encode("utf-8") if isinstance(v, str) else v for v in arr.flat)
    else:
        tf = import_tf()
        if arr.dtype.kind == "U":
            arr = arr.astype(object)
        return tf.make_tensor_proto(arr, dtype=dtype, shape=arr.shape)
    proto.tensor_shape.SetInParent()  # present for a scalar too, as TensorFlow writes it (2 bytes that count)
    dims = proto.tensor_shape.dim
    for d in arr.shape:
        dims.add(size=int(d))
    return proto


def to_ndarray(proto) -> np.ndarray:
    """A TensorProto as an ndarray (strings come back as an object array of bytes)."""
    shape = tuple(d.size for d in proto.tensor_shape.dim)
    np_dtype, field = _typed_field(proto.dtype)
    if np_dtype is not None and proto.tensor_content:
        return np.frombuffer(proto.tensor_content, dtype=np_dtype).reshape(shape).copy()
    size = math.prod(shape)  # (np.prod of a tuple: a few microseconds of every Predict answer)
    if field and size:  # typed fields (Tensor::AsProtoField), all elements written
        values = getattr(proto, field)
        per_element = 2 if np_dtype.kind == "c" else 1
        if len(values) == size * per_element:
            if field == "half_val":
                return np.array(values, dtype=np.uint16).view(np_dtype).reshape(shape)
            if per_element == 2:
                flat = np.array(values, dtype=np.float32 if np_dtype.itemsize == 8 else np.float64)
                return (flat[0::2] + 1j * flat[1::2]).astype(np_dtype).reshape(shape)
            return np.array(values, dtype=np_dtype).reshape(shape)
    from exportkit.savedmodel.protos import protos

    if proto.dtype == protos()["types"].DataType.Value("DT_STRING") and len(proto.string_val) == size:
        values = np.empty(size, dtype=object)
        values[:] = list(proto.string_val)
        return values.reshape(shape)
    return import_tf().make_ndarray(proto)


@functools.cache
def _typed_field(enum: int) -> tuple[np.dtype | None, str | None]:
    """A DataType's numpy dtype and its typed repeated field (None, None when numpy has no such dtype): looked up
    once, not by dtype name per answer (np.dtype.name is a Python property)."""
    np_dtype = _dt_to_np(enum)
    return np_dtype, None if np_dtype is None else _PROTO_FIELD.get(np_dtype.name)


# Tensor::AsProtoField: the typed repeated field per dtype (what TF Serving's Predict answers with, kAsProtoField)
_PROTO_FIELD = {"float32": "float_val", "float64": "double_val", "int32": "int_val", "int16": "int_val",
                "int8": "int_val", "uint8": "int_val", "uint16": "int_val", "int64": "int64_val",
                "uint32": "uint32_val", "uint64": "uint64_val", "bool": "bool_val", "float16": "half_val",
                "bfloat16": "half_val", "complex64": "scomplex_val", "complex128": "dcomplex_val"}


def to_field_tensor_proto(array):
    """An ndarray as a TensorProto with its values in the typed field (float_val, int64_val, string_val, ...),
    every element written, as Tensor::AsProtoField does; halves as their 16-bit patterns."""
    from exportkit.savedmodel.protos import protos

    arr = np.asarray(array)
    tensor_pb2 = protos()["tensor"]
    if arr.dtype.kind in "OSU":
        proto = tensor_pb2.TensorProto(dtype=protos()["types"].DataType.Value("DT_STRING"))
        proto.string_val.extend(v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in arr.flat)
    else:
        enum = np_to_datatype().get(arr.dtype.name)
        name = "bfloat16" if arr.dtype.name == "bfloat16" else arr.dtype.name
        if enum is None or name not in _PROTO_FIELD:
            return to_tensor_proto(arr)
        proto = tensor_pb2.TensorProto(dtype=enum)
        flat = arr.reshape(-1)
        if name in ("float16", "bfloat16"):
            values = flat.view(np.uint16).astype(np.int32)
        elif name.startswith("complex"):
            values = np.stack([flat.real, flat.imag], axis=-1).reshape(-1)
        else:
            values = flat
        getattr(proto, _PROTO_FIELD[name]).extend(values.tolist())
    proto.tensor_shape.SetInParent()  # Tensor::AsProtoField writes the shape of a scalar too (serving/messages.py)
    for d in arr.shape:
        proto.tensor_shape.dim.add(size=int(d))
    return proto
