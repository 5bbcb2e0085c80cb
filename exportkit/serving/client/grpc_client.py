"""A thin client for TF Serving's gRPC API (the official stubs), for any server: real binary, remote, embedded.

Every call has a deadline. Errors come back as `ServingError` carrying the gRPC status code name and message,
so reports can say exactly what the server answered. Only `wait_available` retries (UNAVAILABLE while a server
starts up); everything else fails on the first error. `predict` adds little over a bare stub call: one fast
TensorProto fill per input, one `np.frombuffer` per output.
"""
from __future__ import annotations

import time
from typing import Callable

import grpc
import numpy as np

from exportkit.errors import CheckFailed, ExportkitError, InfraError
from exportkit.serving.tensors import datatype_of, to_ndarray, to_tensor_proto
from exportkit.savedmodel.protos import serving_apis
from exportkit.signature_constants import DEFAULT_SIGNATURE

GRPC_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
_RETRY_WHILE_STARTING = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class ServingError(Exception):
    """The server answered with an error status (`code`: e.g. "INVALID_ARGUMENT") or never became AVAILABLE."""

    def __init__(self, code: str, message: str, rpc: str | None = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.rpc = rpc


class ModelLoadFailed(ServingError):
    """GetModelStatus says the version ended (END) with an error: the model failed to load."""


# Statuses that say the server or the network failed, not the model.
INFRA_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "RESOURCE_EXHAUSTED"})


def as_exportkit_error(err: ServingError, what: str, remedy: str | None = None) -> ExportkitError:
    """The one rule for server errors: transport and capacity failures are infrastructure (exit 3), every
    other status is the model's failure (exit 1)."""
    kind = InfraError if err.code in INFRA_CODES else CheckFailed
    return kind(f"{what} failed: {err.code}: {err.message}", remedy)


def _error(err: grpc.RpcError, rpc: str) -> ServingError:
    code = err.code() if hasattr(err, "code") else None
    details = err.details() if hasattr(err, "details") else str(err)
    return ServingError(code.name if code else "UNKNOWN", details or "", rpc)


def fill_input(input_proto, examples, context: bytes | None = None) -> None:
    """tensorflow.serving.Input from serialized tf.Examples: example_list, or example_list_with_context."""
    target = input_proto.example_list_with_context if context is not None else input_proto.example_list
    if context is not None:
        target.context.ParseFromString(bytes(context))
    for raw in np.asarray(examples, dtype=object).reshape(-1):
        target.examples.add().ParseFromString(bytes(raw))


def classification_arrays(result) -> dict[str, np.ndarray]:
    """A ClassificationResult as the classify signature's tensors: classes [n, k] (bytes), scores [n, k] float32."""
    rows = list(result.classifications)
    k = len(rows[0].classes) if rows else 0
    classes = np.empty((len(rows), k), dtype=object)
    scores = np.zeros((len(rows), k), dtype=np.float32)
    for i, row in enumerate(rows):
        for c, cl in enumerate(row.classes):
            classes[i, c] = cl.label.encode("utf-8") if isinstance(cl.label, str) else bytes(cl.label)
            scores[i, c] = cl.score
    return {"classes": classes, "scores": scores}


class ServingClient:
    """Talks to one model (name, optional version, signature) at `address` ("host:port")."""

    def __init__(self, address: str, model_name: str, version: int | None = None,
                 signature_name: str = DEFAULT_SIGNATURE, timeout: float = 30.0):
        apis = serving_apis()
        model_pb2, predict_pb2 = apis.model_pb2, apis.predict_pb2
        model_service_pb2_grpc, prediction_service_pb2_grpc = apis.model_service_pb2_grpc, apis.prediction_service_pb2_grpc

        self.address = address
        self.model_name = model_name
        self.version = version
        self.signature_name = signature_name
        self.timeout = timeout
        self._channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        prediction = prediction_service_pb2_grpc.PredictionServiceStub(self._channel)
        self._predict = prediction.Predict
        self._calls = {"PredictRequest": prediction.Predict, "ClassificationRequest": prediction.Classify,
                       "RegressionRequest": prediction.Regress, "MultiInferenceRequest": prediction.MultiInference}
        self._metadata = prediction.GetModelMetadata
        self._status = model_service_pb2_grpc.ModelServiceStub(self._channel).GetModelStatus
        self._PredictRequest = predict_pb2.PredictRequest
        spec = model_pb2.ModelSpec(name=model_name, signature_name=signature_name)
        if version is not None:
            spec.version.value = int(version)
        self._spec = spec

    # -- status -------------------------------------------------------------------------------------------------
    def status(self, timeout: float | None = None):
        """The raw GetModelStatusResponse for this model (and version, if one was given)."""
        get_model_status_pb2 = serving_apis().get_model_status_pb2

        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = self.model_name
        if self.version is not None:
            request.model_spec.version.value = int(self.version)
        try:
            return self._status(request, timeout=timeout or self.timeout)
        except grpc.RpcError as err:
            raise _error(err, "GetModelStatus") from None

    def wait_available(self, deadline_seconds: float = 60.0, check: Callable[[], None] | None = None) -> int:
        """Poll GetModelStatus (with backoff) until the version is AVAILABLE; return that version.

        Retries UNAVAILABLE (server not listening yet) until the deadline; raises ModelLoadFailed with the
        server's error message on END, ServingError("DEADLINE_EXCEEDED") on timeout, ServingError for any other
        status (e.g. NOT_FOUND: wrong model name). `check` is called each round; a launcher uses it to raise as
        soon as its server process died.
        """
        get_model_status_pb2 = serving_apis().get_model_status_pb2

        states = get_model_status_pb2.ModelVersionStatus.State
        end = time.monotonic() + deadline_seconds
        delay, last = 0.05, "no answer yet"
        while True:
            if check is not None:
                check()
            remaining = end - time.monotonic()
            if remaining <= 0:
                raise ServingError("DEADLINE_EXCEEDED",
                                   f"model '{self.model_name}' not AVAILABLE at {self.address} after "
                                   f"{deadline_seconds:g}s (last: {last})", "GetModelStatus")
            try:
                response = self.status(timeout=max(0.2, min(self.timeout, remaining, 5.0)))
            except ServingError as err:
                if err.code not in {c.name for c in _RETRY_WHILE_STARTING}:
                    raise
                last = f"{err.code}: {err.message}"
            else:
                entries = list(response.model_version_status)
                available = [e.version for e in entries if e.state == states.AVAILABLE]
                if available:
                    return max(available)
                failed = [e for e in entries if e.state == states.END]
                if entries and len(failed) == len(entries):
                    worst = max(failed, key=lambda e: e.version)
                    raise ModelLoadFailed("END", f"model '{self.model_name}' version {worst.version} failed to load: "
                                                 f"{worst.status.error_message or 'no error message'}", "GetModelStatus")
                last = ", ".join(f"version {e.version} {states.Name(e.state)}" for e in entries) or "no versions"
            time.sleep(max(0.0, min(delay, end - time.monotonic())))
            delay = min(delay * 1.5, 1.0)

    # -- metadata -----------------------------------------------------------------------------------------------
    def metadata(self) -> dict:
        """{signature_name: SignatureDef} from GetModelMetadata(metadata_field=["signature_def"])."""
        get_model_metadata_pb2 = serving_apis().get_model_metadata_pb2

        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        request.model_spec.name = self.model_name
        if self.version is not None:
            request.model_spec.version.value = int(self.version)
        try:
            response = self._metadata(request, timeout=self.timeout)
        except grpc.RpcError as err:
            raise _error(err, "GetModelMetadata") from None
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        if "signature_def" not in response.metadata or not response.metadata["signature_def"].Unpack(signature_map):
            raise ServingError("INVALID_RESPONSE", "GetModelMetadata answered without a SignatureDefMap in "
                                                   "metadata['signature_def']", "GetModelMetadata")
        return dict(signature_map.signature_def)

    # -- predict ------------------------------------------------------------------------------------------------
    def make_request(self, inputs: dict[str, np.ndarray], output_filter: list[str] | None = None,
                     signature_name: str | None = None):
        request = self._PredictRequest()
        request.model_spec.CopyFrom(self._spec)
        if signature_name is not None:
            request.model_spec.signature_name = signature_name
        for key, value in inputs.items():
            arr = np.asarray(value)
            proto = request.inputs[key]
            enum = datatype_of(arr.dtype)
            if enum is not None:  # fast path: fill in place, no intermediate proto
                proto.dtype = enum
                proto.tensor_content = np.ascontiguousarray(arr).tobytes()
                proto.tensor_shape.SetInParent()  # a scalar's too, as tf.make_tensor_proto writes it
                dims = proto.tensor_shape.dim
                for d in arr.shape:
                    dims.add(size=d)
            else:
                proto.CopyFrom(to_tensor_proto(arr))
        if output_filter:
            request.output_filter.extend(output_filter)
        return request

    def predict_request(self, request):
        """Send a ready PredictRequest as is; return the raw PredictResponse."""
        try:
            return self._predict(request, timeout=self.timeout)
        except grpc.RpcError as err:
            raise _error(err, "Predict") from None

    def predict(self, inputs: dict[str, np.ndarray], output_filter: list[str] | None = None,
                signature_name: str | None = None) -> dict[str, np.ndarray]:
        """Predict on this model/signature; outputs keyed by signature output name."""
        response = self.predict_request(self.make_request(inputs, output_filter, signature_name))
        return {key: to_ndarray(proto) for key, proto in response.outputs.items()}

    # -- Classify, Regress, MultiInference and any ready request -------------------------------------------------
    def call(self, request):
        """Send a ready Predict/Classification/Regression/MultiInference request as is; return the raw response."""
        kind = type(request).__name__
        rpc = self._calls.get(kind)
        if rpc is None:
            raise TypeError(f"not a PredictionService request: {kind}")
        try:
            return rpc(request, timeout=self.timeout)
        except grpc.RpcError as err:
            raise _error(err, kind.replace("Request", "").replace("Classification", "Classify")
                         .replace("Regression", "Regress")) from None

    def example_request(self, kind: str, examples, signature_name: str | None = None, context: bytes | None = None):
        """A ClassificationRequest (kind "classify") or RegressionRequest ("regress") over serialized Examples."""
        classification_pb2, regression_pb2 = serving_apis().classification_pb2, serving_apis().regression_pb2

        request = (classification_pb2.ClassificationRequest() if kind == "classify"
                   else regression_pb2.RegressionRequest())
        request.model_spec.CopyFrom(self._spec)
        if signature_name is not None:
            request.model_spec.signature_name = signature_name
        fill_input(request.input, examples, context)
        return request

    def classify(self, examples, signature_name: str | None = None) -> dict[str, np.ndarray]:
        """Classify serialized Examples: {"classes": [n, k] bytes, "scores": [n, k] float32} (what the result has)."""
        response = self.call(self.example_request("classify", examples, signature_name))
        return classification_arrays(response.result)

    def regress(self, examples, signature_name: str | None = None) -> np.ndarray:
        """Regress serialized Examples: one float32 per example."""
        response = self.call(self.example_request("regress", examples, signature_name))
        return np.array([r.value for r in response.result.regressions], dtype=np.float32)

    # -- lifetime -------------------------------------------------------------------------------------------------
    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "ServingClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
