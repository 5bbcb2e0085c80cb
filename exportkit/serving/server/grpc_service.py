"""TF Serving's gRPC services (model_servers/prediction_service_impl.cc, model_service_impl.cc) over a ServerCore:
each RPC maps to its API module; an RpcError becomes the gRPC status."""
from __future__ import annotations

import logging
import os
import time
from concurrent import futures

import grpc

from exportkit.errors import InfraError, UsageError
from exportkit.savedmodel.protos import serving_apis
from exportkit.serving.server.classifier import classify
from exportkit.serving.client.grpc_client import GRPC_OPTIONS
from exportkit.serving.server.metadata import get_model_metadata
from exportkit.serving.server.model_status import get_model_status
from exportkit.serving.server.multi_inference import multi_inference
from exportkit.serving.server.predict import predict
from exportkit.serving.server.regressor import regress
from exportkit.serving.server.scope import request_scope
from exportkit.serving.server.server_core import ServerCore
from exportkit.serving.server.status import RpcError

log = logging.getLogger("exportkit.serve")


# prediction_service_impl.cc records request_count/request_latency for these three only
COUNTED_APIS = ("Predict", "Classify", "Regress")


def _unary(api: str, method):
    """Turn RpcError into the gRPC status; anything unexpected into INTERNAL with its type. The client's deadline
    becomes the RunOptions timeout of every Session.run (prediction_service_impl.cc, enforce_session_run_timeout on
    by default); versions the request uses stay loaded until it answers. Counted in the core's metrics."""

    def handler(self, request, context):
        started = time.monotonic()
        status = "OK"
        try:
            with request_scope(context.time_remaining()):
                return method(self, request)
        except RpcError as err:
            status = err.code.name
            context.abort(err.code, err.message)
        except Exception as err:  # noqa: BLE001
            status = "INTERNAL"
            log.exception("internal error in %s", api)
            context.abort(grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}")
        finally:
            if self.core.metrics is not None and api in COUNTED_APIS:
                self.core.metrics.request(_model_name(request), api, "GRPC", status,
                                          (time.monotonic() - started) * 1e6)

    handler.__name__ = api
    return handler


def _model_name(request) -> str:
    if type(request).__name__ == "MultiInferenceRequest":
        return request.tasks[0].model_spec.name if request.tasks else ""
    return request.model_spec.name


def _unimplemented(name: str):
    def handler(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED,
                      f"{name} is not implemented by exportkit serve (it serves Predict, GetModelMetadata, GetModelStatus)")

    return handler


class PredictionServicer:
    """tensorflow.serving.PredictionService (prediction_service_impl.cc)."""

    def __init__(self, core: ServerCore):
        self.core = core

    Predict = _unary("Predict", lambda self, request: predict(self.core, request))
    GetModelMetadata = _unary("GetModelMetadata", lambda self, request: get_model_metadata(self.core, request))
    Classify = _unary("Classify", lambda self, request: classify(self.core, request))
    Regress = _unary("Regress", lambda self, request: regress(self.core, request))
    MultiInference = _unary("MultiInference", lambda self, request: multi_inference(self.core, request))


class ModelServicer:
    """tensorflow.serving.ModelService (model_service_impl.cc)."""

    def __init__(self, core: ServerCore):
        self.core = core

    GetModelStatus = _unary("GetModelStatus", lambda self, request: get_model_status(self.core, request))
    HandleReloadConfigRequest = _unimplemented("HandleReloadConfigRequest")


def channel_arguments(text: str) -> list[tuple[str, object]]:
    """--grpc_channel_arguments "k=v,k2=v2" (server.cc parseGrpcChannelArgs): integer values as integers."""
    out = []
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--grpc_channel_arguments: {item!r} is not key=value",
                             "pass e.g. --grpc_channel_arguments=grpc.max_connection_age_ms=2000")
        out.append((key.strip(), int(value) if value.strip().lstrip("-").isdigit() else value))
    return out


def start_grpc(core: ServerCore, port: int, workers: int = 8, socket_path: str | None = None,
               options: list | None = None) -> tuple[grpc.Server, int]:
    """Bind 127.0.0.1:port (0 = a free port) with SO_REUSEPORT off, so a taken port fails instead of sharing;
    also the Unix socket `socket_path` when given (--grpc_socket_path). `options`: extra channel arguments."""
    apis = serving_apis()  # without importing TensorFlow: the port opens while TensorFlow still loads
    model_service_pb2_grpc, prediction_service_pb2_grpc = apis.model_service_pb2_grpc, apis.prediction_service_pb2_grpc
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="serve"),
                         options=GRPC_OPTIONS + [("grpc.so_reuseport", 0)] + list(options or []))
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionServicer(core), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelServicer(core), server)
    try:
        bound = server.add_insecure_port(f"127.0.0.1:{port}")
    except RuntimeError as err:
        bound = 0
        log.debug("bind failed: %s", err)
    if not bound:
        raise InfraError(f"cannot listen on 127.0.0.1:{port} (port in use?)", "pass another --port, or --port 0 for a free one")
    if socket_path:
        if os.path.exists(socket_path):
            os.unlink(socket_path)  # a socket left by an earlier server, as TF Serving's gRPC replaces it
        try:
            server.add_insecure_port(f"unix:{socket_path}")
        except RuntimeError as err:
            raise InfraError(f"cannot listen on unix:{socket_path} ({err})", "pass a writable --grpc_socket_path") from None
    server.start()
    return server, bound
