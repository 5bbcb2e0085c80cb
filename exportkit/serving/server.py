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
from exportkit.savedmodel import (DEFAULT_SIGNATURE, ModelLocation, dtype_name, resolve_model_path, shape_list,
                                   signature_names)
from exportkit.serving.client import GRPC_OPTIONS
from exportkit.tfenv import import_tf, quiet_env

ADDRESS_LINE = "exportkit serve: model '{name}' version {version} AVAILABLE at {address}"
ADDRESS_RE = re.compile(r"^exportkit serve: model '(?P<name>.*)' version (?P<version>\d+) AVAILABLE at (?P<address>\S+)\s*$")
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
    def load(self) -> None:
        """Load like TF Serving, then replay warm-up through Predict; any failure = the version failed to load."""
        from exportkit.tf1_loader import Tf1SavedModel

        tf = import_tf()
        started = time.monotonic()
        try:
            self.model = Tf1SavedModel(self.location.version_dir, device=self.device)
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
        """Replay the warm-up records like TF Serving; returns how many were replayed. Predict logs run through
        Predict (Classify/Regress as the Predict they amount to); other kinds (multi_inference) are logged and
        skipped."""
        from exportkit.layout import warmup_path
        from exportkit.serving.warmup import as_predict_request, log_kind, read_warmup_logs

        path = warmup_path(self.location.version_dir)
        if not os.path.exists(path):
            return 0
        try:
            logs = read_warmup_logs(path)
        except ValueError as err:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"invalid warm-up file: {err}") from None
        replayed = 0
        for i, record in enumerate(logs):
            kind = log_kind(record)
            if kind not in ("predict_log", "classify_log", "regress_log"):
                log.info("warm-up record %d is a %s: not replayed (this server has no API for it)", i, kind)
                continue
            try:
                # Classify/Regress records run as the Predict they amount to (this server has no Classify API).
                self.predict(as_predict_request(getattr(record, kind).request), warmup=True)
            except RpcError as err:
                raise RpcError(err.code, f"warm-up record {i} of {path} failed: {err.code.name}: {err.message}") from None
            replayed += 1
        return replayed

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

        from exportkit.serving.warmup import ndarray_to_tensor_proto, tensor_proto_to_ndarray

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
                value = tensor_proto_to_ndarray(proto)
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
            response.outputs[key].CopyFrom(ndarray_to_tensor_proto(np.asarray(value)))
        return response

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
        if self.error:
            entry.status.error_code = self.error[0]
            entry.status.error_message = self.error[1]
        return response

    def close(self) -> None:
        if self.model is not None:
            self.model.close()


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
    Classify = _unimplemented("Classify")
    Regress = _unimplemented("Regress")
    MultiInference = _unimplemented("MultiInference")


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


def serve_command(path: str, port: int = 8500, model_name: str | None = None, device: str = "cpu") -> int:
    """Serve until SIGINT/SIGTERM (exit 0). Load failure: log it, exit 1 (CheckFailed). Bind failure: exit 3."""
    _setup_logging()
    quiet_env()
    if device not in ("cpu", "gpu"):
        raise UsageError(f"--device must be cpu or gpu, got {device!r}", "pass --device cpu or --device gpu")
    if device == "cpu" and "tensorflow" not in sys.modules:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # no GPU memory grabbed by a CPU server
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be 0..65535, got {port}", "pass --port 8500, or --port 0 for a free one")
    location = resolve_model_path(path)
    name = model_name or location.default_name

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    served = ServedModel(location, name, device)
    server = None
    loader = None
    try:
        server, bound = start_grpc(served, port)
        address = f"127.0.0.1:{bound}"
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
            print(ADDRESS_LINE.format(name=name, version=location.version, address=address), flush=True)
            announced = True
        log.info("stopping")
        return 0
    finally:
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
