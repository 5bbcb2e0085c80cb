"""PredictionLog records (tensorflow_serving/apis/prediction_log.proto) as data: what TF Serving's warm-up file
holds and what TFX's BulkInferrer writes (each record a request and, from BulkInferrer, the response).

A log is replayed through one signature as TF Serving would answer it: a PredictLog's request tensors are the
signature's inputs; a ClassifyLog's, RegressLog's or MultiInferenceLog's tf.Examples are the serialized-Example
input of a classify/regress signature (servables/tensorflow/util.cc: with a context, the context's bytes before
each Example's). A logged response becomes the outputs of the runtime `logged`, decoded the way TF Serving encodes
them (classifier.cc: [batch, classes] `classes` strings and `scores` floats; regressor.cc: one float per Example;
predict: the output tensors).

A log TF Serving would refuse, or that asks for another model or signature, is skipped, and the reason counted.
"""
from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from google.protobuf.message import DecodeError

from exportkit.errors import UsageError
from exportkit.signature_constants import (CLASSIFY_CLASSES, CLASSIFY_METHOD, CLASSIFY_SCORES, DEFAULT_SIGNATURE,
                                           REGRESS_METHOD, REGRESS_OUTPUTS)

LOGGED = "logged"  # the runtime of the answers the logs carry (what the deployed model said)
LOG_KINDS = ("predict_log", "classify_log", "regress_log", "multi_inference_log")
_DT_STRING = 7  # tensorflow/core/framework/types.proto


@functools.cache
def _prediction_log():
    from exportkit.savedmodel.protos import serving_apis

    return serving_apis().prediction_log_pb2.PredictionLog


def is_prediction_log(record: bytes) -> bool:
    """True if `record` parses as a PredictionLog that holds a log (a tf.Example parses, but sets no log type)."""
    try:
        return _prediction_log().FromString(record).WhichOneof("log_type") is not None
    except DecodeError:
        return False


def signature_of(record: bytes) -> str | None:
    """The signature a log's request names (TF Serving's default when it names none); None for other logs."""
    log = _prediction_log().FromString(record)
    kind = log.WhichOneof("log_type")
    if kind not in LOG_KINDS:
        return None
    request = getattr(log, kind).request
    spec = request.tasks[0].model_spec if kind == "multi_inference_log" and request.tasks else request.model_spec
    return spec.signature_name or DEFAULT_SIGNATURE


@dataclass
class Replayed:
    """One log as the signature's inputs (rows along the batch dimension) and, if it carried one, its response."""

    inputs: dict[str, np.ndarray]
    rows: int
    logged: dict[str, np.ndarray] | None = None
    examples: np.ndarray | None = None  # the request's serialized tf.Examples (for --label), when it has them


@dataclass
class LogReplayer:
    """Logs -> Replayed for one signature of one model (`model_name` None: any name)."""

    signature_name: str
    signature: dict  # savedmodel.signatures_of's form
    signatures: dict  # every signature of the model, to tell "not in the model" from "another signature"
    model_name: str | None = None
    skipped: Counter = field(default_factory=Counter)
    responses: bool = True  # decode logged responses (verify's `logged` runtime); a diff compares the versions only

    def __post_init__(self):
        inputs, outputs = self.signature["inputs"], self.signature["outputs"]
        self.example_input = next(iter(inputs)) if len(inputs) == 1 and next(iter(inputs.values()))["dtype"] == "string" \
            else None
        self.method = self.signature.get("method") or ""
        # TF Serving's refusals, as its server words them (the serving modules import grpc: only replays need them)
        from exportkit.serving.server.classifier import classification_refusal
        from exportkit.serving.server.regressor import regression_refusal

        self._classify_problem = classification_refusal(inputs, outputs)
        self._regress_problem = regression_refusal(inputs, outputs)

    def example_values(self, records: list[bytes]) -> tuple[list[bytes], list[int]] | None:
        """replay's most common case for a batch of records, without its objects: PredictLogs (without a response,
        unless `responses` is off) whose request sends the signature's one string input as a vector of n >= 1
        `string_val`s. Their values, in order, and each record's n; None when any record is something else (each
        is then replayed). 1M logs: ~3 s here, 23 s through replay."""
        parse, key, name, model = _prediction_log().FromString, self.example_input, self.signature_name, self.model_name
        values, counts = [], []
        for record in records:
            try:
                log = parse(record)
            except DecodeError:
                return None
            if not log.HasField("predict_log"):
                return None
            entry = log.predict_log
            request = entry.request
            spec = request.model_spec
            if ((spec.signature_name or DEFAULT_SIGNATURE) != name or (self.responses and entry.HasField("response"))
                    or (model and spec.name and spec.name != model)):
                return None
            inputs = request.inputs
            tensor = inputs.get(key) if len(inputs) == 1 else None
            if tensor is None or tensor.dtype != _DT_STRING:
                return None
            dims, sent = tensor.tensor_shape.dim, tensor.string_val
            n = len(sent)
            if len(dims) != 1 or n != dims[0].size or not n:
                return None
            values += sent
            counts.append(n)
        return values, counts

    def replay(self, record: bytes, where=lambda: "?") -> Replayed | None:
        """The log's request (and response) for the signature, or None (skipped: the reason is counted).
        `where()` names the record (FILE:INDEX) in errors."""
        try:
            log = _prediction_log().FromString(record)
        except DecodeError:
            raise UsageError(f"record {where()} is not a serialized PredictionLog",
                             "every record of a PredictionLog file must be one (do not mix them with tf.Examples)") \
                from None
        kind = log.WhichOneof("log_type")
        if kind not in LOG_KINDS:
            return self._skip(f"{kind or 'empty'} records are not replayed (TF Serving: Unsupported log_type)")
        entry = getattr(log, kind)
        if kind == "multi_inference_log":
            return self._multi_inference(entry)
        spec = entry.request.model_spec
        problem = self._other(spec, {"predict_log": "predict", "classify_log": "classify",
                                     "regress_log": "regress"}[kind])
        if problem:
            return self._skip(problem)
        if kind == "predict_log":
            return self._predict(entry)
        problem = self._classify_problem if kind == "classify_log" else self._regress_problem
        if problem:
            return self._skip(problem)
        examples = _examples(entry.request.input)
        if examples is None:
            return self._skip("Input is empty.")
        logged = None
        if self.responses and entry.HasField("response"):
            logged = (self._classifications(entry.response.result.classifications, len(examples))
                      if kind == "classify_log" else self._regressions(entry.response.result.regressions, len(examples)))
        return Replayed({self.example_input: examples}, len(examples), logged, examples)

    # -- the requests -----------------------------------------------------------------------------------------

    def _predict(self, entry) -> Replayed | None:
        from exportkit.serving.tensors import to_ndarray

        request, wanted = entry.request, set(self.signature["inputs"])
        sent = set(request.inputs)
        if sent != wanted:  # predict_util.cc: names and count only
            return self._skip(f"input size does not match signature: Sent extra: {{{','.join(sorted(sent - wanted))}}}. "
                              f"Missing but required: {{{','.join(sorted(wanted - sent))}}}.")
        inputs = {k: to_ndarray(request.inputs[k]) for k in sorted(sent)}
        rows = {v.shape[0] if v.ndim else None for v in inputs.values()}
        if len(rows) != 1 or None in rows:
            return self._skip("the request's tensors share no batch dimension (replayed requests are batched)")
        (n,) = rows
        logged = None
        if self.responses and entry.HasField("response") and entry.response.outputs:
            logged = {k: to_ndarray(v) for k, v in entry.response.outputs.items() if k in self.signature["outputs"]}
        examples = inputs[self.example_input] if self.example_input else None
        return Replayed(inputs, n, logged, examples)

    def _multi_inference(self, entry) -> Replayed | None:
        request = entry.request
        tasks = [t for t in request.tasks if (t.model_spec.signature_name or DEFAULT_SIGNATURE) == self.signature_name]
        if not request.tasks:
            return self._skip("Must specify at least one target to fetch or execute.")
        if not tasks:
            return self._skip(self._other(request.tasks[0].model_spec, "multi_inference") or "no task for the signature")
        task = tasks[0]
        problem = self._other(task.model_spec, "multi_inference")
        if problem:
            return self._skip(problem)
        if task.method_name not in (CLASSIFY_METHOD, REGRESS_METHOD):
            return self._skip(f"Unsupported signature method_name: {task.method_name}")
        problem = self._classify_problem if task.method_name == CLASSIFY_METHOD else self._regress_problem
        if problem:
            return self._skip(problem)
        examples = _examples(request.input)
        if examples is None:
            return self._skip("Input is empty.")
        logged = None
        position = list(request.tasks).index(task)
        if self.responses and entry.HasField("response") and len(entry.response.results) > position:
            result = entry.response.results[position]
            logged = (self._classifications(result.classification_result.classifications, len(examples))
                      if task.method_name == CLASSIFY_METHOD
                      else self._regressions(result.regression_result.regressions, len(examples)))
        return Replayed({self.example_input: examples}, len(examples), logged, examples)

    def _other(self, spec, api: str) -> str | None:
        """Why TF Serving would not send this request to the signature replayed (None: it would)."""
        if self.model_name and spec.name and spec.name != self.model_name:
            version = spec.version.value if spec.HasField("version") else None
            return (f"Servable not found for request: Specific({spec.name}, {version})" if version is not None
                    else f"Servable not found for request: Latest({spec.name})")  # core/basic_manager.cc
        name = spec.signature_name or DEFAULT_SIGNATURE
        if name == self.signature_name:
            return None
        if name not in self.signatures:
            return {"predict": f'Serving signature key "{name}" not found.',  # predict_util.cc
                    "multi_inference": f"Requested signature not found in model graph: {name}"}.get(
                api, f"No signature was found with the name: {name}")  # classifier.cc, regressor.cc
        return f"signature {name!r} (replayed: {self.signature_name!r}; pass --signature {name} for those)"

    # -- the responses ----------------------------------------------------------------------------------------

    def _classifications(self, classifications, n: int) -> dict[str, np.ndarray] | None:
        if len(classifications) != n:
            return None  # a response of another size answers another request: nothing to compare
        k = len(classifications[0].classes) if n else 0
        if any(len(c.classes) != k for c in classifications):
            return None
        logged = {}
        outputs = self.signature["outputs"]
        if CLASSIFY_SCORES in outputs:
            logged[CLASSIFY_SCORES] = np.array([[c.score for c in row.classes] for row in classifications],
                                               dtype=np.float32).reshape(n, k)
        if CLASSIFY_CLASSES in outputs:
            classes = np.empty((n, k), dtype=object)
            for i, row in enumerate(classifications):
                classes[i, :] = [c.label.encode("utf-8") for c in row.classes]
            logged[CLASSIFY_CLASSES] = classes
        return logged

    def _regressions(self, regressions, n: int) -> dict[str, np.ndarray] | None:
        if len(regressions) != n:
            return None
        values = np.array([r.value for r in regressions], dtype=np.float32)
        shape = self.signature["outputs"][REGRESS_OUTPUTS].get("shape")
        return {REGRESS_OUTPUTS: values.reshape(n, 1) if shape is not None and len(shape) == 2 else values}

    def skipped_text(self) -> str:
        """The skipped logs as `N x reason; ...` (empty when none was skipped)."""
        return "; ".join(f"{n} x {why}" for why, n in sorted(self.skipped.items()))

    def _skip(self, reason: str) -> None:
        self.skipped[reason] += 1
        return None


def _examples(input_proto) -> np.ndarray | None:
    """Input{example_list | example_list_with_context} as the serialized-Example tensor TF Serving feeds."""
    # Imported here: the serving modules import grpc (0.03-0.08 s), which verify --data on tf.Example never needs.
    from exportkit.serving.server.status import RpcError
    from exportkit.serving.server.util import serialized_examples

    try:
        return serialized_examples(input_proto)
    except RpcError:
        return None
