"""How big TF Serving's gRPC messages are, and who refuses them: the serialized size of a request and of its answer
computed from the arrays (protobuf's wire format, no proto built, so a 2 GB answer costs no copy), and the limits.

* TF Serving's server sends and accepts messages up to INT32_MAX bytes: `builder.SetMaxMessageSize(
  std::numeric_limits<int32_t>::max())` in model_servers/server.cc (`--grpc_channel_arguments` can change it).
  Its REST API has no message limit (only gzip bodies inflate to at most 100 MB: net_http's gzip_zlib.h).
* A gRPC client created with default options receives at most 4 MiB (`GRPC_DEFAULT_MAX_RECV_MESSAGE_LENGTH` in
  grpc's channel_arg_names.h) and sends without limit (`GRPC_DEFAULT_MAX_SEND_MESSAGE_LENGTH` is -1): a larger
  answer is RESOURCE_EXHAUSTED "Received message larger than max" on the client, though the server sent it.
* Predict answers with `Tensor::AsProtoField` (typed repeated fields: float_val, int64_val, ...;
  servables/tensorflow/predict_util.cc, the default unless `--enable_serialization_as_tensor_content`); clients
  build requests with `tf.make_tensor_proto` (tensor_content for numbers, string_val for strings), as exportkit's
  client does. Classify and Regress answer a Class/Regression message per example (classifier.cc, regressor.cc).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SERVER_MAX_MESSAGE = 2**31 - 1  # INT32_MAX: model_servers/server.cc SetMaxMessageSize
CLIENT_MAX_RECEIVE = 4 * 2**20  # GRPC_DEFAULT_MAX_RECV_MESSAGE_LENGTH (the client's max send is -1: no limit)
RECEIVE_OPTION = "grpc.max_receive_message_length"

# TensorProto (tensor.proto): field number and wire width of each dtype's typed field (None: varints)
_FIELDS = {"float32": (5, 4), "float64": (6, 8), "int32": (7, None), "int16": (7, None), "int8": (7, None),
           "uint8": (7, None), "uint16": (7, None), "complex64": (9, 8), "int64": (10, None), "bool": (11, 1),
           "complex128": (12, 16), "float16": (13, None), "bfloat16": (13, None), "uint32": (16, None),
           "uint64": (17, None)}
_STRING_VAL, _TENSOR_CONTENT = 8, 4
_VARINT_STEPS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)


def _varint(n: int) -> int:
    return max(1, (int(n).bit_length() + 6) // 7)


def _tag(field: int) -> int:
    return _varint(field << 3)


def _bytes_field(field: int, n: int) -> int:
    """A length-delimited field (bytes, string, message, packed values) of n bytes."""
    return _tag(field) + _varint(n) + n


def _varint_lengths(values) -> np.ndarray:
    """The varint length of each of `values` (a negative one as 64-bit two's complement: 10 bytes)."""
    values = np.asarray(values)
    wide = values.astype(np.uint64) if values.dtype.kind == "u" else values.astype(np.int64).view(np.uint64)
    return np.searchsorted(_VARINT_STEPS, wide, side="right") + 1


def _varints(values) -> int:
    return int(_varint_lengths(values).sum())


def _byte_length(v) -> int:
    """A string element's length in bytes (str as UTF-8, as TensorFlow encodes it)."""
    return len(v) if isinstance(v, (bytes, bytearray)) else len(str(v).encode("utf-8"))


def _strings(values: np.ndarray) -> int:
    """Bytes of a repeated bytes field (string_val): tag, length and bytes per element."""
    lengths = np.fromiter((_byte_length(v) for v in values.reshape(-1)), dtype=np.int64, count=values.size)
    return int(lengths.sum()) + _varints(lengths) + values.size * _tag(_STRING_VAL)


def tensor_bytes(array, content: bool = False) -> int:
    """The serialized size of `array` as a TensorProto: typed fields as Tensor::AsProtoField writes them (what
    Predict answers), or with `content` numbers as tensor_content (what clients send); strings in string_val."""
    arr = np.asarray(array)
    dims = sum(_bytes_field(2, _tag(1) + _varint(d) if d else 0) for d in arr.shape)
    size = 2 + _bytes_field(2, dims)  # dtype (every DataType enum is one byte) and the shape (present, if empty)
    if arr.dtype.kind in "OSU":
        return size + _strings(arr)
    if content:
        return size + (_bytes_field(_TENSOR_CONTENT, arr.nbytes) if arr.size else 0)
    field, width = _FIELDS.get(arr.dtype.name, (None, None))
    if field is None:  # a dtype without a typed field: AsProtoField has none either
        return size + (_bytes_field(_TENSOR_CONTENT, arr.nbytes) if arr.size else 0)
    if arr.dtype.name in ("float16", "bfloat16"):
        arr = arr.view(np.uint16)  # half_val holds the 16-bit patterns
    payload = arr.size * width if width else _varints(arr)
    return size + (_bytes_field(field, payload) if payload else 0)


@dataclass(frozen=True)
class ModelSpec:
    """What a message's ModelSpec holds (its size counts: a few bytes)."""

    name: str
    signature_name: str
    version: int | None = None

    def bytes(self) -> int:
        size = _bytes_field(1, len(self.name.encode())) if self.name else 0
        if self.version is not None:
            size += _bytes_field(2, _tag(1) + _varint(self.version) if self.version else 0)
        return size + (_bytes_field(3, len(self.signature_name.encode())) if self.signature_name else 0)


def _tensor_map(field: int, tensors: dict, content: bool) -> int:
    """A map<string, TensorProto> field: one entry (key, value) per tensor."""
    return sum(_bytes_field(field, _bytes_field(1, len(key.encode())) + _bytes_field(2, tensor_bytes(v, content)))
               for key, v in tensors.items())


def _examples(values) -> int:
    """Input{example_list{examples}}: the serialized Examples as a list of messages."""
    listed = sum(_bytes_field(1, _byte_length(v)) for v in np.asarray(values, dtype=object).reshape(-1))
    return _bytes_field(1, listed)


def request_bytes(api: str, inputs: dict[str, np.ndarray], spec: ModelSpec) -> int:
    """A PredictRequest (tensor_content, as tf.make_tensor_proto builds it), or a Classification/RegressionRequest
    over the serialized Examples of the one input."""
    if api in ("Classify", "Regress"):
        return _bytes_field(1, spec.bytes()) + _bytes_field(2, _examples(next(iter(inputs.values()))))
    return _bytes_field(1, spec.bytes()) + _tensor_map(2, inputs, content=True)


def response_bytes(api: str, outputs: dict[str, np.ndarray], spec: ModelSpec) -> int:
    """The answer TF Serving sends: PredictResponse (AsProtoField), ClassificationResponse (a Class{label, score}
    per example and class) or RegressionResponse (a Regression{value} per example)."""
    if api == "Classify":
        result = _classifications(outputs.get("classes"), outputs.get("scores"))
    elif api == "Regress":
        values = np.asarray(outputs["outputs"], dtype=np.float32).reshape(-1)
        nonzero = int(np.count_nonzero(values.view(np.uint32)))  # proto3 leaves out 0.0 (not -0.0)
        result = values.size * _bytes_field(1, 0) + nonzero * (_tag(1) + 4)  # Regression{value}, 0 or 5 bytes
    else:
        return _tensor_map(1, outputs, content=False) + _bytes_field(2, spec.bytes())
    return _bytes_field(1, result) + _bytes_field(2, spec.bytes())


def _classifications(classes, scores) -> int:
    """ClassificationResult: per example a Classifications{classes: Class{label, score}} per class."""
    shape = np.shape(scores if scores is not None else classes)
    n, k = (shape[0], shape[1] if len(shape) > 1 else 1) if shape else (0, 0)
    labels = np.zeros((n, k), np.int64) if classes is None else np.fromiter(
        (_byte_length(v) for v in np.asarray(classes, dtype=object).reshape(-1)), np.int64, n * k).reshape(n, k)
    label_bytes = np.where(labels > 0, _tag(1) + labels + _varint_lengths(labels), 0)
    score_bytes = 0 if scores is None else np.where(
        np.asarray(scores, dtype=np.float32).reshape(n, k).view(np.uint32) != 0, _tag(2) + 4, 0)
    per_class = label_bytes + score_bytes
    per_class_fields = _tag(1) + per_class + _varint_lengths(per_class)  # Classifications.classes entries
    per_example = per_class_fields.sum(axis=1)
    return int((_tag(1) + per_example + _varint_lengths(per_example)).sum())


def row_bytes(outputs: dict[str, dict]) -> int | None:
    """At least how many bytes a row adds to a Predict answer, from the signature's outputs ({key: {"dtype",
    "shape"}}) alone: exact for fixed-width values (floats, bools), a varint counted as one byte and a string as
    its framing (two). None when an output's rank or a dim other than the batch is unknown."""
    total = 0
    for t in outputs.values():
        shape, dtype = t.get("shape"), t.get("dtype")
        if shape is None or any(d < 0 for d in shape[1:]) or dtype not in (*_FIELDS, "string"):
            return None
        total += math.prod(shape[1:]) * (2 if dtype == "string" else _FIELDS[dtype][1] or 1)
    return total


def rows_within(limit: int, fixed: int, per_row: float) -> int | None:
    """The most rows whose message stays within `limit` bytes (None: no row size to go by)."""
    if per_row <= 0:
        return None
    return max(0, math.floor((limit - fixed) / per_row))
