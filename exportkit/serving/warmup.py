"""TF Serving warm-up records (`assets.extra/tf_serving_warmup_requests`).

TF Serving replays these PredictionLog records through the model before it reports AVAILABLE, so the first real
request does not pay for graph initialisation. A record that fails makes the whole version fail to load; that is
why the writer checks the keys and dtypes against the signature instead of trusting the caller.
"""
from __future__ import annotations

import os

import numpy as np

from exportkit.savedmodel.layout import WARMUP, warmup_path
from exportkit.serving.tensors import to_tensor_proto
from exportkit.tfenv import import_tf

MAX_WARMUP_RECORDS = 1000  # TF Serving refuses more (saved_model_warmup_util.cc: kMaxNumRecords)


def _apis():
    from exportkit.savedmodel.protos import serving_apis

    apis = serving_apis()
    return apis.predict_pb2, apis.prediction_log_pb2


def _signature_of(version_dir: str | None, signature_name: str):
    if version_dir is None or not os.path.exists(os.path.join(version_dir, "saved_model.pb")):
        return None
    from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph

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
            request.inputs[key].CopyFrom(to_tensor_proto(arr, dtype=want))
        log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
        records.append(log.SerializeToString())
    return records


def warmup_batch_sizes(batching_parameters: str | None) -> list[int]:
    """The batch sizes TF Serving runs a model at under these BatchingParameters: `allowed_batch_sizes`.

    With batching on, the session is wrapped (saved_model_bundle_factory.cc WrapSessionForBatching) before the
    warm-up is replayed through it (saved_model_bundle_source_adapter.cc RunSavedModelWarmup), and each merged
    batch is padded up to the lowest allowed size >= its size (batching_session.cc MergeInputTensors,
    batching_util.cc RoundToLowestAllowedBatchSize): every allowed size is its own Session::Run shape, compiled
    on first use. A record replays at its own size (saved_model_warmup_util.cc), so only a record of each
    allowed size warms each one (`enable_all_batch_sizes_warmup` does it only for in-graph batch ops)."""
    if not batching_parameters:
        return []
    from exportkit.errors import UsageError
    from exportkit.serving.server.config import read_batching_parameters

    parameters = read_batching_parameters(batching_parameters)
    allowed = list(parameters.allowed_batch_sizes)
    if allowed != sorted(set(allowed)) or (allowed and allowed[0] < 1):
        raise UsageError(f"--batching-parameters {batching_parameters}: allowed_batch_sizes {allowed} must be "
                         f"positive and increasing (batching_session.cc refuses it)", "list them in increasing order")
    if allowed and parameters.HasField("max_batch_size") and allowed[-1] != parameters.max_batch_size.value:
        raise UsageError(f"--batching-parameters {batching_parameters}: Last entry in allowed_batch_sizes must match "
                         f"max_batch_size; last entry was {allowed[-1]}; expected {parameters.max_batch_size.value}",
                         "make the last allowed_batch_sizes entry max_batch_size (TF Serving refuses the model)")
    return allowed


def resized_batches(batches: list[dict], sizes: list[int]) -> list[dict]:
    """`batches` plus one batch of each size in `sizes` they lack: the rows of the largest, repeated in turn."""
    def rows(batch):
        return len(np.asarray(next(iter(batch.values())))) if batch else 0

    have = {rows(b) for b in batches}
    largest = max(batches, key=rows)
    n = rows(largest)
    extra = [{k: np.take(np.asarray(v), np.arange(size) % n, axis=0) for k, v in largest.items()}
             for size in sizes if size not in have and n]
    return list(batches) + extra


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


REPLAYED_LOGS = ("predict_log", "classify_log", "regress_log", "multi_inference_log")


def read_warmup_records(path: str) -> list:
    """The requests of a warm-up file (or of a version dir's assets.extra file), in file order.

    Predict, Classify, Regress and MultiInference requests (the message types tell them apart), as TF Serving
    replays them (saved_model_warmup.cc). Raises ValueError for a record TF Serving refuses (session_run or
    predict_streamed logs, unparsable bytes) or for more than 1000 records.
    """
    _, prediction_log_pb2 = _apis()
    if os.path.isdir(path):
        path = str(warmup_path(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no warm-up file {path}")
    requests = []
    for i, raw in enumerate(_records(path)):
        if i >= MAX_WARMUP_RECORDS:
            raise ValueError(f"{path}: more than {MAX_WARMUP_RECORDS} warm-up records (TF Serving refuses to load)")
        log = prediction_log_pb2.PredictionLog()
        log.ParseFromString(raw)
        kind = log.WhichOneof("log_type")
        if kind not in REPLAYED_LOGS:
            raise ValueError(f"{path}: record {i} is a {kind}; TF Serving replays only "
                             f"{', '.join(REPLAYED_LOGS)} records (Unsupported log_type for warmup)")
        requests.append(getattr(log, kind).request)
    return requests


def _records(path: str):
    """The file's records, read as TF Serving reads them: uncompressed TFRecord, both CRCs checked. By exportkit's
    reader (tf.data's first use cost the server 0.3 s of each load); a damaged file, with TensorFlow loaded (the
    server), is read again by TensorFlow's for its own words (a DataLossError, as TF Serving reports it)."""
    import sys

    from exportkit.inputs.tfrecord import tfrecord_records
    from exportkit.errors import UsageError

    with open(path, "rb") as fh:
        if fh.read(2) == b"\x1f\x8b":
            raise ValueError(f"{path} is GZIP-compressed; TF Serving reads the warm-up file as uncompressed TFRecord")
    try:
        for data in tfrecord_records(path):
            yield data
    except UsageError as err:
        tf = sys.modules.get("tensorflow")
        if tf is not None and hasattr(tf, "data"):
            for _ in tf.data.TFRecordDataset(path):
                pass
        raise ValueError(err.message) from None
