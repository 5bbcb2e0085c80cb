"""TF Serving warm-up records (`assets.extra/tf_serving_warmup_requests`) and TensorProto <-> ndarray helpers.

TF Serving replays these PredictionLog records through the model before it reports AVAILABLE, so the first real
request does not pay for graph initialisation. A record that fails makes the whole version fail to load; that is
why the writer checks the keys and dtypes against the signature instead of trusting the caller.
"""
from __future__ import annotations

import os

import numpy as np

from exportkit.layout import WARMUP, warmup_path
from exportkit.tfenv import import_tf

MAX_WARMUP_RECORDS = 1000  # TF Serving refuses more (saved_model_warmup_util.cc: kMaxNumRecords)


def _apis():
    """Import the serving protos after TF (they import TF themselves, loudly)."""
    import_tf()
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    return predict_pb2, prediction_log_pb2


# numpy dtype -> DataType enum, for the fast path (tensor_content). Built lazily: needs TF's protos.
_NP_TO_DT: dict | None = None


def _np_to_dt() -> dict:
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
        _DT_TO_NP = {v: k for k, v in _np_to_dt().items()}
    return _DT_TO_NP


def ndarray_to_tensor_proto(array, dtype=None):
    """An ndarray (strings: object array of bytes/str) as a TensorProto.

    Numeric arrays take a fast path (one `tensor_content` copy, what `tf.make_tensor_proto` produces too) because
    the serving client calls this on every request; everything else goes through `tf.make_tensor_proto`.
    `dtype` (a tf.DType or DataType enum) forces the proto dtype, e.g. the signature's.
    """
    tf = import_tf()
    arr = np.asarray(array)
    enum = _np_to_dt().get(arr.dtype) if arr.dtype.kind not in "OSU" else None
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


def tensor_proto_to_ndarray(proto) -> np.ndarray:
    """A TensorProto as an ndarray (strings come back as an object array of bytes)."""
    tf = import_tf()
    if proto.tensor_content:
        np_dtype = _dt_to_np().get(proto.dtype)
        if np_dtype is not None:
            shape = tuple(d.size for d in proto.tensor_shape.dim)
            return np.frombuffer(proto.tensor_content, dtype=np_dtype).reshape(shape).copy()
    return tf.make_ndarray(proto)


def _signature_of(version_dir: str | None, signature_name: str):
    if version_dir is None or not os.path.exists(os.path.join(version_dir, "saved_model.pb")):
        return None
    from exportkit.savedmodel import read_saved_model_proto, select_meta_graph

    meta_graph = select_meta_graph(read_saved_model_proto(version_dir))
    return meta_graph.signature_def[signature_name] if signature_name in meta_graph.signature_def else None


def write_warmup_records(path: str, model_name: str, signature_name: str,
                         batches: list[dict[str, np.ndarray]], signature_def=None) -> str:
    """Write `batches` as PredictionLog(predict_log.request) records to `path` (a TFRecord file).

    `path` may also be a version directory (the file goes to assets.extra/tf_serving_warmup_requests there).
    Every batch must hold exactly the signature's input keys with the signature's dtypes: the signature is
    `signature_def` if given, else read from the SavedModel at (or next to) `path` when there is one, else the
    keys/dtypes of the first batch must be repeated by all others. Raises ValueError on any mismatch, or if the
    number of records is not in 1..1000 (TF Serving's limit). Returns the file path.
    """
    if os.path.isdir(path):
        path = str(warmup_path(path))
    if signature_def is None:
        parent = os.path.dirname(os.path.abspath(path))
        version_dir = os.path.dirname(parent) if os.path.basename(parent) == WARMUP.parent.name else None
        signature_def = _signature_of(version_dir, signature_name)
    return write_warmup_file(path, warmup_records(model_name, signature_name, batches, signature_def))


def warmup_records(model_name: str, signature_name: str, batches: list[dict[str, np.ndarray]], signature_def=None,
                   method: str = "predict") -> list[bytes]:
    """Serialized PredictionLog records for one signature, checked as `write_warmup_records` describes.

    `method` predict: PredictLog records. classify/regress: ClassifyLog/RegressLog records whose Input holds the
    batch's serialized tf.Example (the signature's one string input) as an example_list, as TF Serving's Classify
    and Regress APIs take them.
    """
    tf = import_tf()
    predict_pb2, prediction_log_pb2 = _apis()
    if not 1 <= len(batches) <= MAX_WARMUP_RECORDS:
        raise ValueError(f"warm-up needs 1..{MAX_WARMUP_RECORDS} records (TF Serving's limit), got {len(batches)}")
    if signature_def is not None:
        expected = {k: tf.as_dtype(v.dtype) for k, v in signature_def.inputs.items()}
    else:
        expected = {k: tf.as_dtype(np.asarray(v).dtype) if np.asarray(v).dtype.kind not in "OSU" else tf.string
                    for k, v in batches[0].items()}

    records = []
    for i, batch in enumerate(batches):
        if set(batch) != set(expected):
            raise ValueError(f"warm-up record {i}: keys {sorted(batch)} != signature inputs {sorted(expected)}")
        if method != "predict":
            records.append(_example_log(model_name, signature_name, method, next(iter(batch.values()))))
            continue
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model_name
        request.model_spec.signature_name = signature_name
        for key, value in batch.items():
            arr = np.asarray(value)
            want = expected[key]
            got = tf.string if arr.dtype.kind in "OSU" else tf.as_dtype(arr.dtype)
            if got != want:
                raise ValueError(f"warm-up record {i}: input '{key}' has dtype {got.name}, signature wants {want.name}")
            request.inputs[key].CopyFrom(ndarray_to_tensor_proto(arr, dtype=want))
        log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
        records.append(log.SerializeToString())
    return records


def _example_log(model_name: str, signature_name: str, method: str, serialized: np.ndarray) -> bytes:
    from tensorflow.core.example import example_pb2
    from tensorflow_serving.apis import classification_pb2, prediction_log_pb2, regression_pb2

    module = classification_pb2 if method == "classify" else regression_pb2
    request = (module.ClassificationRequest if method == "classify" else module.RegressionRequest)()
    request.model_spec.name = model_name
    request.model_spec.signature_name = signature_name
    for raw in np.asarray(serialized, dtype=object).reshape(-1):
        request.input.example_list.examples.add().CopyFrom(example_pb2.Example.FromString(bytes(raw)))
    if method == "classify":
        log = prediction_log_pb2.PredictionLog(classify_log=prediction_log_pb2.ClassifyLog(request=request))
    else:
        log = prediction_log_pb2.PredictionLog(regress_log=prediction_log_pb2.RegressLog(request=request))
    return log.SerializeToString()


def write_warmup_file(path: str, records: list[bytes]) -> str:
    """Write serialized PredictionLog records (of every signature) as the warm-up TFRecord file, atomically."""
    tf = import_tf()
    if os.path.isdir(path):
        path = str(warmup_path(path))
    if not 1 <= len(records) <= MAX_WARMUP_RECORDS:
        raise ValueError(f"warm-up needs 1..{MAX_WARMUP_RECORDS} records (TF Serving's limit), got {len(records)}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with tf.io.TFRecordWriter(tmp) as writer:
        for record in records:
            writer.write(record)
    os.replace(tmp, path)  # a half-written warm-up file would fail the model's load
    return path


def as_predict_request(request, input_key: str = "inputs"):
    """A Classify/Regress request as the equivalent PredictRequest: its Examples serialized into the signature's
    one string input (what TF Serving's Classify and Regress feed the graph). Predict requests pass through."""
    predict_pb2, _ = _apis()
    if isinstance(request, predict_pb2.PredictRequest):
        return request
    examples = np.array([e.SerializeToString() for e in request.input.example_list.examples], dtype=object)
    predict = predict_pb2.PredictRequest()
    predict.model_spec.CopyFrom(request.model_spec)
    predict.inputs[input_key].CopyFrom(ndarray_to_tensor_proto(examples))
    return predict


# Log kinds TF Serving replays during warm-up (saved_model_warmup.cc); anything else fails the model's load.
SERVING_WARMUP_KINDS = ("predict_log", "classify_log", "regress_log", "multi_inference_log", "predict_streamed_log")


def read_warmup_logs(path: str) -> list:
    """Every PredictionLog of a warm-up file (or of a version dir's assets.extra file), in file order.

    Raises ValueError for more than 1000 records or a record of a kind TF Serving does not replay (both make TF
    Serving refuse the version); OSError (FileNotFoundError) when there is no file.
    """
    tf = import_tf()
    _, prediction_log_pb2 = _apis()
    path = os.fspath(warmup_path(path) if os.path.isdir(path) else path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no warm-up file {path}")
    logs = []
    for i, raw in enumerate(tf.data.TFRecordDataset(path).as_numpy_iterator()):
        if i >= MAX_WARMUP_RECORDS:
            raise ValueError(f"{path}: more than {MAX_WARMUP_RECORDS} warm-up records (TF Serving refuses to load)")
        log = prediction_log_pb2.PredictionLog()
        log.ParseFromString(raw)
        kind = log.WhichOneof("log_type")
        if kind not in SERVING_WARMUP_KINDS:
            raise ValueError(f"{path}: record {i} is a {kind or 'PredictionLog without a log'}; TF Serving replays only "
                             f"{', '.join(SERVING_WARMUP_KINDS)}")
        logs.append(log)
    return logs


def log_kind(log) -> str:
    return log.WhichOneof("log_type")


def read_warmup_records(path: str) -> list:
    """The requests of a warm-up file, in file order: PredictRequests, and ClassificationRequests /
    RegressionRequests for classify_log / regress_log records (other kinds are left out)."""
    return [getattr(log, log_kind(log)).request for log in read_warmup_logs(path)
            if log_kind(log) in ("predict_log", "classify_log", "regress_log")]
