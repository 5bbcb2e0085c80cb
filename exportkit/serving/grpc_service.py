"""TF Serving's gRPC services (model_servers/prediction_service_impl.cc, model_service_impl.cc) over a ServerCore:
each RPC maps to its API module; an RpcError becomes the gRPC status."""
from __future__ import annotations

import logging
from concurrent import futures

import grpc

from exportkit.errors import InfraError
from exportkit.serving.classifier import classify
from exportkit.serving.client import GRPC_OPTIONS
from exportkit.serving.metadata import get_model_metadata
from exportkit.serving.model_status import get_model_status
from exportkit.serving.multi_inference import multi_inference
from exportkit.serving.predict import predict
from exportkit.serving.regressor import regress
from exportkit.serving.server_core import ServerCore
from exportkit.serving.status import RpcError
from exportkit.tfenv import import_tf

log = logging.getLogger("exportkit.serve")


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
    """tensorflow.serving.PredictionService (prediction_service_impl.cc)."""

    def __init__(self, core: ServerCore):
        self.core = core

    Predict = _unary(lambda self, request: predict(self.core, request))
    GetModelMetadata = _unary(lambda self, request: get_model_metadata(self.core, request))
    Classify = _unary(lambda self, request: classify(self.core, request))
    Regress = _unary(lambda self, request: regress(self.core, request))
    MultiInference = _unary(lambda self, request: multi_inference(self.core, request))


class ModelServicer:
    """tensorflow.serving.ModelService (model_service_impl.cc)."""

    def __init__(self, core: ServerCore):
        self.core = core

    GetModelStatus = _unary(lambda self, request: get_model_status(self.core, request))
    HandleReloadConfigRequest = _unimplemented("HandleReloadConfigRequest")


def start_grpc(core: ServerCore, port: int, workers: int = 8) -> tuple[grpc.Server, int]:
    """Bind 127.0.0.1:port (0 = a free port) with SO_REUSEPORT off, so a taken port fails instead of sharing."""
    import_tf()
    from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="serve"),
                         options=GRPC_OPTIONS + [("grpc.so_reuseport", 0)])
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionServicer(core), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelServicer(core), server)
    try:
        bound = server.add_insecure_port(f"127.0.0.1:{port}")
    except RuntimeError as err:
        bound = 0
        log.debug("bind failed: %s", err)
    if not bound:
        raise InfraError(f"cannot listen on 127.0.0.1:{port} (port in use?)", "pass another --port, or --port 0 for a free one")
    server.start()
    return server, bound
