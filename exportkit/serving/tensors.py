"""TensorProto <-> ndarray: the one conversion used by the warm-up writer, the gRPC client and the server.

Numeric arrays take a fast path (one `tensor_content` copy, what `tf.make_tensor_proto` produces too) because the
client converts every request; everything else goes through TensorFlow's own `make_tensor_proto`/`make_ndarray`.
"""
from __future__ import annotations

import numpy as np

from exportkit.tfenv import import_tf

# numpy dtype -> DataType enum, for the fast path (tensor_content). Built lazily: needs TF's protos.
_NP_TO_DT: dict | None = None


def np_to_datatype() -> dict:
    global _NP_TO_DT
    if _NP_TO_DT is None:
        tf = import_tf()
        table = {}
        for tf_dtype in (tf.float16, tf.float32, tf.float64, tf.int8, tf.int16, tf.int32, tf.int64, tf.uint8,
                         tf.uint16, tf.uint32, tf.uint64, tf.bool, tf.complex64, tf.complex128, tf.bfloat16):
            table[np.dtype(tf_dtype.as_numpy_dtype)] = tf_dtype.as_datatype_enum
        _NP_TO_DT = table
    return _NP_TO_DT


_DT_TO_NP: dict | None = None


def _dt_to_np() -> dict:
    global _DT_TO_NP
    if _DT_TO_NP is None:
        _DT_TO_NP = {v: k for k, v in np_to_datatype().items()}
    return _DT_TO_NP


def to_tensor_proto(array, dtype=None):
    """An ndarray (strings: object array of bytes/str) as a TensorProto.

    Numeric arrays take a fast path (one `tensor_content` copy, what `tf.make_tensor_proto` produces too) because
    the serving client calls this on every request; everything else goes through `tf.make_tensor_proto`.
    `dtype` (a tf.DType or DataType enum) forces the proto dtype, e.g. the signature's.
    """
    tf = import_tf()
    arr = np.asarray(array)
    enum = np_to_datatype().get(arr.dtype) if arr.dtype.kind not in "OSU" else None
    if enum is not None and (dtype is None or tf.as_dtype(dtype).as_datatype_enum == enum):
        from tensorflow.core.framework import tensor_pb2

        proto = tensor_pb2.TensorProto(dtype=enum, tensor_content=np.ascontiguousarray(arr).tobytes())
        dims = proto.tensor_shape.dim
        for d in arr.shape:
            dims.add(size=int(d))
        return proto
    if arr.dtype.kind in "OSU" and dtype is None:
        dtype = tf.string
    if arr.dtype.kind == "U":
        arr = np.vectorize(lambda s: s.encode("utf-8"), otypes=[object])(arr) if arr.size else arr.astype(object)
    return tf.make_tensor_proto(arr, dtype=dtype, shape=arr.shape)


def to_ndarray(proto) -> np.ndarray:
    """A TensorProto as an ndarray (strings come back as an object array of bytes)."""
    tf = import_tf()
    if proto.tensor_content:
        np_dtype = _dt_to_np().get(proto.dtype)
        if np_dtype is not None:
            shape = tuple(d.size for d in proto.tensor_shape.dim)
            return np.frombuffer(proto.tensor_content, dtype=np_dtype).reshape(shape).copy()
    return tf.make_ndarray(proto)
