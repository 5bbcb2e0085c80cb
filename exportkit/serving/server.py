"""`exportkit serve`: TF Serving's gRPC API (PredictionService, ModelService) over the TF1-style loader.

For machines without the `tensorflow_model_server` binary. It loads the SavedModel the way TF Serving does
(MetaGraph + Session, no user Python imported), replays the warm-up records before reporting AVAILABLE, and
answers with TF Serving's status codes, so a client or a check that passes here behaves the same against the
real server. It is a stand-in, not TF Serving: reports must say which server answered.

Lifecycle: bind 127.0.0.1 -> status LOADING -> load + warm-up -> AVAILABLE, then print exactly one line
(`ADDRESS_LINE`) on stdout. A load failure sets END with the error, logs it and exits 1. SIGINT/SIGTERM (or, when
EXPORTKIT_SERVE_WATCH_STDIN=1, EOF on stdin: the launcher died) stop the server with exit 0.
"""
from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading
import time
from concurrent import futures

import grpc
import numpy as np

from exportkit.errors import CheckFailed, InfraError, UsageError
from exportkit.savedmodel import (CLASSIFY_CLASSES, CLASSIFY_INPUTS, CLASSIFY_METHOD, CLASSIFY_SCORES, DEFAULT_SIGNATURE,
                                  REGRESS_INPUTS, REGRESS_METHOD, REGRESS_OUTPUTS, ModelLocation, dtype_name,
                                  resolve_model_path, shape_list, signature_names)
from exportkit.serving.client import GRPC_OPTIONS
from exportkit.tfenv import import_tf, quiet_env

ADDRESS_LINE = "exportkit serve: model '{name}' version {version} AVAILABLE at {address}"
REST_SUFFIX = " rest {rest_address}"
ADDRESS_RE = re.compile(r"^exportkit serve: model '(?P<name>.*)' version (?P<version>\d+) AVAILABLE at (?P<address>\S+)"
                        r"(?: rest (?P<rest>\S+))?\s*$")
WATCH_STDIN_ENV = "EXPORTKIT_SERVE_WATCH_STDIN"

log = logging.getLogger("exportkit.serve")


# --------------------------------------------------------------------------------------------------- the model
class RpcError(Exception):
    """A gRPC status to answer with (code: grpc.StatusCode)."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def _grpc_code(tf_code: int) -> grpc.StatusCode:
    """TensorFlow's error codes are gRPC's codes (same numbers)."""
    for code in grpc.StatusCode:
        if code.value[0] == tf_code:
            return code
    return grpc.StatusCode.UNKNOWN


class ServedModel:
    """One loaded version and its state; all RPC logic lives here (the servicers only translate errors)."""

    def __init__(self, location: ModelLocation, name: str, device: str):
        self.location = location
        self.name = name
        self.version = location.version
        self.device = device
        self.state = "LOADING"
        self.error: tuple[int, str] | None = None  # (tf error code, message) when END
        self.model = None

    # -- loading ------------------------------------------------------------------------------------------------
    def load(self, model=None) -> None:
        """Load like TF Serving, then replay warm-up through Predict; any failure = the version failed to load.
        `model`: a Tf1SavedModel already loaded from this version (verify's worker shares its session's load)."""
        from exportkit.tf1_loader import Tf1SavedModel

        tf = import_tf()
        started = time.monotonic()
        try:
            if model is None:
                from exportkit.compat.oplibs import load_for_worker

                load_for_worker(self.location.version_dir)  # the ops the stock server links; --op-library
            self.model = model or Tf1SavedModel(self.location.version_dir, device=self.device)
            count = self._warm_up()
        except RpcError as err:
            self._fail(err.code.value[0], err.message)
            return
        except tf.errors.OpError as err:
            self._fail(err.error_code, f"{type(err).__name__}: {err.message}")
            return
        except Exception as err:  # noqa: BLE001 — anything else is a load failure too, reported with its type
            self._fail(2, f"{type(err).__name__}: {err}")
            return
        self.state = "AVAILABLE"
        log.info("model '%s' version %d loaded in %.2fs (%d warm-up record(s) replayed)",
                 self.name, self.version, time.monotonic() - started, count)

    def _fail(self, code: int, message: str) -> None:
        self.error = (code, message)
        self.state = "END"

    def _warm_up(self) -> int:
        """Replay the warm-up records like TF Serving, each through its own API; returns how many."""
        from exportkit.layout import warmup_path
        from exportkit.serving.warmup import read_warmup_records

        path = warmup_path(self.location.version_dir)
        if not os.path.exists(path):
            return 0
        try:
            requests = read_warmup_records(path)
        except ValueError as err:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"invalid warm-up file: {err}") from None
        for i, request in enumerate(requests):
            try:
                self.call(request, warmup=True)
            except RpcError as err:
                raise RpcError(err.code, f"warm-up record {i} of {path} failed: {err.code.name}: {err.message}") from None
        return len(requests)

    # -- model_spec -------------------------------------------------------------------------------------------
    def _check_spec(self, spec) -> None:
        """NOT_FOUND for another model name, version or label, like ServerCore::GetServableHandle."""
        wanted = f"Specific({spec.name}, {spec.version.value})" if spec.HasField("version") else f"Latest({spec.name})"
        if spec.name != self.name or (spec.HasField("version") and spec.version.value != self.version):
            raise RpcError(grpc.StatusCode.NOT_FOUND,
                           f"Servable not found for request: {wanted} (served: model '{self.name}' version {self.version})")
        if spec.WhichOneof("version_choice") == "version_label":
            raise RpcError(grpc.StatusCode.NOT_FOUND,
                           f"Unrecognized servable version label: {spec.version_label} (no labels are configured)")
        if self.state == "LOADING":
            raise RpcError(grpc.StatusCode.UNAVAILABLE, f"model '{self.name}' version {self.version} is still loading")
        if self.state != "AVAILABLE":
            raise RpcError(grpc.StatusCode.NOT_FOUND,
                           f"Servable not found for request: {wanted} (version {self.version} failed to load)")

    # -- Predict ----------------------------------------------------------------------------------------------
    def predict(self, request, warmup: bool = False):
        from tensorflow_serving.apis import predict_pb2

        from exportkit.serving.tensors import to_ndarray, to_tensor_proto

        tf = import_tf()
        if not warmup:
            self._check_spec(request.model_spec)
        signature_name = request.model_spec.signature_name or DEFAULT_SIGNATURE
        signature = self.model.signatures.get(signature_name)
        if signature is None:
            # TF Serving: FAILED_PRECONDITION (predict_util.cc), not NOT_FOUND.
            raise RpcError(grpc.StatusCode.FAILED_PRECONDITION,
                           f'Serving signature key "{signature_name}" not found. '
                           f"Available: {signature_names(self.model.signatures)}")

        sent, expected = set(request.inputs), set(signature.inputs)
        missing = expected - sent - set(signature.defaults)
        extra = sent - expected
        if missing or extra:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"input keys do not match signature '{signature_name}': "
                           f"sent {{{','.join(sorted(sent))}}}, expected {{{','.join(sorted(expected))}}}. "
                           f"Sent extra: {{{','.join(sorted(extra))}}}. Missing but required: {{{','.join(sorted(missing))}}}.")

        feed = {}
        for key in sorted(sent):
            info, proto = signature.inputs[key], request.inputs[key]
            if proto.dtype != info.dtype:
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"input '{key}': expected dtype {dtype_name(info.dtype)}, got {dtype_name(proto.dtype)}")
            try:
                value = to_ndarray(proto)
            except Exception as err:  # noqa: BLE001 — a malformed TensorProto is the caller's fault
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"input '{key}': malformed TensorProto: {err}") from None
            want = shape_list(info.tensor_shape)
            if want is not None and (len(want) != value.ndim or any(w >= 0 and w != g for w, g in zip(want, value.shape))):
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"input '{key}': expected shape {want} (-1 = any size), got {list(value.shape)}")
            feed[key] = value

        keys = list(request.output_filter)
        for key in keys:
            if key not in signature.outputs:
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"output tensor alias not found in signature: {key} Outputs expected to be in the set "
                               f"{{{','.join(sorted(signature.outputs))}}}.")
        if len(set(keys)) != len(keys):
            dup = next(k for k in keys if keys.count(k) > 1)
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"duplicate output tensor alias: {dup}")

        try:
            outputs = self.model.run(signature_name, feed, output_keys=keys or None)
        except tf.errors.OpError as err:
            raise RpcError(_grpc_code(err.error_code), err.message) from None
        except Exception as err:  # noqa: BLE001
            raise RpcError(grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}") from None

        response = predict_pb2.PredictResponse()
        response.model_spec.name = self.name
        response.model_spec.version.value = self.version
        response.model_spec.signature_name = signature_name
        for key, value in outputs.items():
            response.outputs[key].CopyFrom(to_tensor_proto(np.asarray(value)))
        return response

    def call(self, request, warmup: bool = False):
        """Answer any PredictionService request by its type (warm-up records hold all four kinds)."""
        kind = type(request).__name__
        handler = {"PredictRequest": self.predict, "ClassificationRequest": self.classify,
                   "RegressionRequest": self.regress, "MultiInferenceRequest": self.multi_inference}.get(kind)
        if handler is None:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"Unsupported request type for warmup: {kind}")
        return handler(request, warmup=warmup)

    # -- Classify, Regress, MultiInference (classifier.cc, regressor.cc, multi_inference.cc) ---------------------
    def _example_signature(self, model_spec, check):
        name = model_spec.signature_name or DEFAULT_SIGNATURE
        signature = self.model.signatures.get(name)
        if signature is None:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"No signature was found with the name: {name}")
        check(signature)  # TF Serving's default: no method-name check, the structural one instead
        return name, signature

    def _run_examples(self, input_proto, input_tensors: list[str], output_names: list[str]) -> tuple[int, dict]:
        """Feed the serialized Examples to every input tensor; fetch `output_names` (tensor names)."""
        tf = import_tf()
        examples = serialized_examples(input_proto)
        feed = {tensor: examples for tensor in input_tensors}
        try:
            values = self.model.session.run(output_names, feed_dict=feed)
        except tf.errors.OpError as err:
            raise RpcError(_grpc_code(err.error_code), err.message) from None
        return len(examples), dict(zip(output_names, values))

    def classify(self, request, warmup: bool = False):
        from tensorflow_serving.apis import classification_pb2

        return self._example_method(request, warmup, classification_pb2.ClassificationResponse(),
                                    preprocess_classification, classification_output_names,
                                    CLASSIFY_INPUTS, postprocess_classification)

    def regress(self, request, warmup: bool = False):
        from tensorflow_serving.apis import regression_pb2

        return self._example_method(request, warmup, regression_pb2.RegressionResponse(), preprocess_regression,
                                    lambda signature: [signature.outputs[REGRESS_OUTPUTS].name],
                                    REGRESS_INPUTS, postprocess_regression)

    def _example_method(self, request, warmup, response, preprocess, output_names, input_key, postprocess):
        """Classify and Regress (classifier.cc, regressor.cc): check the signature, feed the Examples to its one
        input, run once, and turn the outputs into the method's result."""
        if not warmup:
            self._check_spec(request.model_spec)
        _, signature = self._example_signature(request.model_spec, preprocess)
        n, values = self._run_examples(request.input, [signature.inputs[input_key].name], output_names(signature))
        self._model_spec(response.model_spec, request.model_spec.signature_name)
        postprocess(signature, n, values, response.result)
        return response

    def multi_inference(self, request, warmup: bool = False):
        """One Session.run for every task (same Examples fed to each task's input tensor), like multi_inference.cc."""
        from tensorflow_serving.apis import inference_pb2

        if not warmup:
            from tensorflow_serving.apis import model_pb2

            self._check_spec(request.tasks[0].model_spec if request.tasks else model_pb2.ModelSpec())
        model_name, seen, inputs, outputs, tasks = "", set(), set(), set(), []
        for task in request.tasks:
            if not task.model_spec.name:
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "Found ModelSpec with an empty model name.")
            if model_name and task.model_spec.name != model_name:
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                               "All ModelSpecs in a MultiInferenceRequest must access the same model name.")
            model_name = task.model_spec.name
            name = task.model_spec.signature_name or DEFAULT_SIGNATURE
            if name in seen:
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"Duplicate evaluation of signature: {name}")
            seen.add(name)
            signature = self.model.signatures.get(name)
            if signature is None:
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"Requested signature not found in model graph: {name}")
            if task.method_name == CLASSIFY_METHOD:
                preprocess_classification(signature)
                inputs.add(signature.inputs[CLASSIFY_INPUTS].name)
                outputs.update(classification_output_names(signature))
            elif task.method_name == REGRESS_METHOD:
                preprocess_regression(signature)
                inputs.add(signature.inputs[REGRESS_INPUTS].name)
                outputs.add(signature.outputs[REGRESS_OUTPUTS].name)
            else:
                raise RpcError(grpc.StatusCode.UNIMPLEMENTED, f"Unsupported signature method_name: {task.method_name}")
            tasks.append((task, signature))
        if not tasks:  # TF Serving then runs a Session with nothing to fetch, which TensorFlow refuses
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "Must specify at least one target to fetch or execute.")
        n, values = self._run_examples(request.input, sorted(inputs), sorted(outputs))
        response = inference_pb2.MultiInferenceResponse()
        for task, signature in tasks:
            result = response.results.add()
            if task.method_name == CLASSIFY_METHOD:
                postprocess_classification(signature, n, values, result.classification_result)
            else:
                postprocess_regression(signature, n, values, result.regression_result)
            self._model_spec(result.model_spec, task.model_spec.signature_name, name=task.model_spec.name)
        return response

    def _model_spec(self, spec, signature_name: str, name: str | None = None) -> None:
        """util.cc MakeModelSpec: the request's name, the signature (default when empty), the served version."""
        spec.name = name or self.name
        spec.signature_name = signature_name or DEFAULT_SIGNATURE
        spec.version.value = self.version

    # -- metadata and status ----------------------------------------------------------------------------------
    def metadata(self, request):
        """Like get_model_metadata_impl.cc: SignatureDefMap packed into metadata['signature_def']."""
        from tensorflow_serving.apis import get_model_metadata_pb2

        if not request.HasField("model_spec"):
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
        if not request.metadata_field:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "GetModelMetadataRequest must specify at least one metadata_field")
        for field in request.metadata_field:
            if field != "signature_def":
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"Metadata field {field} is not supported")
        self._check_spec(request.model_spec)
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        for key, value in self.model.signatures.items():
            signature_map.signature_def[key].CopyFrom(value)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = self.name
        response.model_spec.version.value = self.version
        response.metadata["signature_def"].Pack(signature_map)
        return response

    def status(self, request):
        """Like get_model_status_impl.cc (one version only: the served one)."""
        from tensorflow_serving.apis import get_model_status_pb2

        if not request.HasField("model_spec"):
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
        spec = request.model_spec
        if spec.name != self.name:
            raise RpcError(grpc.StatusCode.NOT_FOUND, f"Could not find any versions of model {spec.name}")
        if spec.HasField("version") and spec.version.value != self.version:
            raise RpcError(grpc.StatusCode.NOT_FOUND, f"Could not find version {spec.version.value} of model {spec.name}")
        response = get_model_status_pb2.GetModelStatusResponse()
        entry = response.model_version_status.add()
        entry.version = self.version
        entry.state = get_model_status_pb2.ModelVersionStatus.State.Value(self.state)
        entry.status.SetInParent()  # error_code OK, as TF Serving always reports it
        if self.error:
            entry.status.error_code = self.error[0]
            entry.status.error_message = self.error[1]
        return response

    def close(self) -> None:
        if self.model is not None:
            self.model.close()


# --------------------------------------------------------------------------------------------------- tf.Example APIs


def serialized_examples(input_proto) -> np.ndarray:
    """Input{example_list | example_list_with_context} as the [n] string tensor TF Serving feeds (util.cc):
    with a context, each element is the context's bytes followed by the example's (a proto merge when parsed)."""
    kind = input_proto.WhichOneof("kind")
    if kind == "example_list":
        values = [e.SerializeToString() for e in input_proto.example_list.examples]
    elif kind == "example_list_with_context":
        context = input_proto.example_list_with_context.context.SerializeToString()
        values = [context + e.SerializeToString() for e in input_proto.example_list_with_context.examples]
    else:
        values = []
    if not values:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "Input is empty.")
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _signature_text(signature) -> str:
    return str(signature).replace("\n", " ").strip()


def preprocess_classification(signature) -> None:
    if len(signature.inputs) != 1:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "Expected one input Tensor.")
    if len(signature.outputs) not in (1, 2):
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                       f"Expected one or two output Tensors, found {len(signature.outputs)}")
    if CLASSIFY_INPUTS not in signature.inputs:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                       f"No classification inputs found in SignatureDef: {_signature_text(signature)}")
    if CLASSIFY_CLASSES not in signature.outputs and CLASSIFY_SCORES not in signature.outputs:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                       'Expected classification signature outputs to contain at least one of "classes" or "scores". '
                       f"Signature was: {_signature_text(signature)}")


def classification_output_names(signature) -> list[str]:
    return [signature.outputs[k].name for k in (CLASSIFY_CLASSES, CLASSIFY_SCORES) if k in signature.outputs]


def preprocess_regression(signature) -> None:
    if len(signature.inputs) != 1:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "Expected one input Tensor.")
    if len(signature.outputs) != 1:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "Expected one output Tensor.")
    if REGRESS_INPUTS not in signature.inputs:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                       f"No regression inputs found in SignatureDef: {_signature_text(signature)}")
    if REGRESS_OUTPUTS not in signature.outputs:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                       f"No regression outputs found in SignatureDef: {_signature_text(signature)}")


def _shape_text(value: np.ndarray) -> str:
    return "[" + ",".join(str(d) for d in value.shape) + "]"


def postprocess_classification(signature, n: int, values: dict, result) -> None:
    """classifier.cc PostProcessClassificationResult: [batch, num_classes] string classes / float scores."""
    classes = values.get(signature.outputs[CLASSIFY_CLASSES].name) if CLASSIFY_CLASSES in signature.outputs else None
    scores = values.get(signature.outputs[CLASSIFY_SCORES].name) if CLASSIFY_SCORES in signature.outputs else None
    for what, value, dtype in (("classes", classes, "DT_STRING"), ("scores", scores, "DT_FLOAT")):
        if value is None:
            continue
        value = np.asarray(value)
        if value.ndim != 2:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"Expected Tensor shape: [batch_size num_classes] but got {_shape_text(value)}")
        ok = value.dtype == object if what == "classes" else value.dtype == np.float32
        if not ok:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"Expected {what} Tensor of {dtype}. Got: {_dt_name(value)}")
        if value.shape[0] != n:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"Expected {what} output batch size of {n}. Got: {value.shape[0]}")
    if classes is not None and scores is not None and classes.shape[1] != scores.shape[1]:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                       f"Tensors class and score should match in dim_size(1). Got {classes.shape[1]} vs. {scores.shape[1]}")
    num_classes = (classes if classes is not None else scores).shape[1]
    for i in range(n):
        row = result.classifications.add()
        for c in range(num_classes):
            cl = row.classes.add()
            if classes is not None:
                cl.label = bytes(classes[i, c]).decode("utf-8", "replace")
            if scores is not None:
                cl.score = float(scores[i, c])


def postprocess_regression(signature, n: int, values: dict, result) -> None:
    """regressor.cc PostProcessRegressionResult: one float per example, [batch] or [batch, 1]."""
    value = np.asarray(values[signature.outputs[REGRESS_OUTPUTS].name])
    if not (value.ndim == 1 or (value.ndim == 2 and value.shape[1] == 1)):
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                       f"Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got "
                       f"{_shape_text(value)}")
    if value.shape[0] != n:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                       f"Input batch size did not match output batch size: {n} vs. {value.shape[0]}")
    if value.dtype != np.float32:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"Expected output Tensor of DT_FLOAT.  Got: {_dt_name(value)}")
    for v in value.reshape(-1):
        result.regressions.add().value = float(v)


def _dt_name(value: np.ndarray) -> str:
    return "DT_STRING" if value.dtype == object else "DT_" + {"float64": "DOUBLE", "float32": "FLOAT", "float16": "HALF"}.get(
        value.dtype.name, value.dtype.name.upper())


# --------------------------------------------------------------------------------------------------- gRPC glue
def _unary(method):
    """Turn RpcError into the gRPC status; anything unexpected into INTERNAL with its type."""

    def handler(self, request, context):
        try:
            return method(self, request)
        except RpcError as err:
            context.abort(err.code, err.message)
        except Exception as err:  # noqa: BLE001
            log.exception("internal error in %s", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}")

    handler.__name__ = method.__name__
    return handler


def _unimplemented(name: str):
    def handler(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED,
                      f"{name} is not implemented by exportkit serve (it serves Predict, GetModelMetadata, GetModelStatus)")

    return handler


class PredictionServicer:
    """tensorflow.serving.PredictionService."""

    def __init__(self, served: ServedModel):
        self.served = served

    Predict = _unary(lambda self, request: self.served.predict(request))
    GetModelMetadata = _unary(lambda self, request: self.served.metadata(request))
    Classify = _unary(lambda self, request: self.served.classify(request))
    Regress = _unary(lambda self, request: self.served.regress(request))
    MultiInference = _unary(lambda self, request: self.served.multi_inference(request))


class ModelServicer:
    """tensorflow.serving.ModelService."""

    def __init__(self, served: ServedModel):
        self.served = served

    GetModelStatus = _unary(lambda self, request: self.served.status(request))
    HandleReloadConfigRequest = _unimplemented("HandleReloadConfigRequest")


def start_grpc(served: ServedModel, port: int, workers: int = 8) -> tuple[grpc.Server, int]:
    """Bind 127.0.0.1:port (0 = a free port) with SO_REUSEPORT off, so a taken port fails instead of sharing."""
    import_tf()
    from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="serve"),
                         options=GRPC_OPTIONS + [("grpc.so_reuseport", 0)])
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionServicer(served), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelServicer(served), server)
    try:
        bound = server.add_insecure_port(f"127.0.0.1:{port}")
    except RuntimeError as err:
        bound = 0
        log.debug("bind failed: %s", err)
    if not bound:
        raise InfraError(f"cannot listen on 127.0.0.1:{port} (port in use?)", "pass another --port, or --port 0 for a free one")
    server.start()
    return server, bound


# --------------------------------------------------------------------------------------------------- the command
def _setup_logging() -> None:
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("exportkit serve: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def _watch_stdin(stop: threading.Event) -> None:
    """The launcher keeps our stdin open; EOF means it is gone, so do not outlive it."""
    try:
        while os.read(0, 4096):  # raw fd: a daemon thread blocked in a buffered read aborts the exit
            pass
    except (OSError, ValueError):
        pass
    log.info("stdin closed (launcher gone): stopping")
    stop.set()


def serve_command(path: str, port: int = 8500, model_name: str | None = None, device: str = "cpu",
                  rest_port: int = 0) -> int:
    """Serve until SIGINT/SIGTERM (exit 0). Load failure: log it, exit 1 (CheckFailed). Bind failure: exit 3."""
    _setup_logging()
    quiet_env()
    if device not in ("cpu", "gpu"):
        raise UsageError(f"--device must be cpu or gpu, got {device!r}", "pass --device cpu or --device gpu")
    if device == "cpu" and "tensorflow" not in sys.modules:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # no GPU memory grabbed by a CPU server
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be 0..65535, got {port}", "pass --port 8500, or --port 0 for a free one")
    if not 0 <= rest_port <= 65535:
        raise UsageError(f"--rest-port must be 0..65535 (0 = no REST), got {rest_port}",
                         "pass --rest-port 8501, or leave it out for no REST API")
    location = resolve_model_path(path)
    name = model_name or location.default_name

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    served = ServedModel(location, name, device)
    server = rest = None
    loader = None
    try:
        server, bound = start_grpc(served, port)
        address = f"127.0.0.1:{bound}"
        line = ADDRESS_LINE.format(name=name, version=location.version, address=address)
        if rest_port:
            from exportkit.serving.rest import start_rest

            rest, rest_bound = start_rest(served, rest_port)
            line += REST_SUFFIX.format(rest_address=f"127.0.0.1:{rest_bound}")
            log.info("REST API on 127.0.0.1:%d", rest_bound)
        log.info("listening on %s; loading model '%s' version %d from %s", address, name, location.version,
                 location.version_dir)
        if os.environ.get(WATCH_STDIN_ENV) == "1":
            threading.Thread(target=_watch_stdin, args=(stop,), daemon=True, name="stdin-watch").start()
        loader = threading.Thread(target=served.load, daemon=True, name="load")
        loader.start()
        announced = False
        while not stop.wait(0.05):
            if announced or loader.is_alive():
                continue
            if served.state == "END":
                code, message = served.error
                log.error("model '%s' version %d failed to load: %s", name, location.version, message)
                raise CheckFailed(f"model '{name}' version {location.version} failed to load: {message}",
                                  "run `exportkit inspect` on the version directory; check custom ops and the warm-up file")
            print(line, flush=True)
            announced = True
        log.info("stopping")
        return 0
    finally:
        if rest is not None:
            rest.shutdown()
            rest.server_close()
        if server is not None:
            server.stop(grace=2).wait(5)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if loader is not None and loader.is_alive():
            # Stopped mid-load: TF's C++ load cannot be interrupted, and tearing down the interpreter under it may
            # crash. Leave now; the exit code is still 0 for a requested stop.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0 if stop.is_set() else 1)
        served.close()
