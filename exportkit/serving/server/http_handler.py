"""TF Serving's REST API, server side: request routing (model_servers/http_rest_api_handler.cc and
http_rest_api_util.cc) and the dispatcher of http_server.cc, for `exportkit serve --rest_api_port`.

URL patterns, `{"error": "..."}` bodies with the HTTP status TF Serving gives each gRPC code, Predict over the JSON
tensor codec, Classify/Regress over JSON Examples, GetModelStatus/GetModelMetadata as proto JSON. The HTTP/1.1
layer (framing, limits, hostile clients) is http_server.py; this module maps requests onto the ServerCore's
servables and the APIs in predict/classifier/regressor/metadata/model_status.
"""
from __future__ import annotations

import logging
import re
import time
import urllib.parse
from dataclasses import dataclass
from typing import Callable

import grpc

from exportkit.savedmodel.reader import dtype_name
from exportkit.serving.server.classifier import classify
from exportkit.serving.server.http_server import HttpServer, Limits, Request, Response, error_response, serve_in_thread
from exportkit.serving.json.decode import fill_predict_request, signature_name
from exportkit.serving.json.encode import classify_json, error_json, predict_json, regress_json
from exportkit.serving.json.examples import fill_example_input
from exportkit.serving.json.fixed import FixedBodyReader, parse_fixed_body
from exportkit.serving.json.parse import parse_json
from exportkit.serving.server.metadata import get_model_metadata
from exportkit.serving.server.model_status import get_model_status
from exportkit.serving.server.predict import run_predict
from exportkit.serving.server.regressor import regress
from exportkit.serving.server.scope import request_scope
from exportkit.serving.server.status import RpcError, invalid_argument

log = logging.getLogger("exportkit.serve")

# http_rest_api_util.cc kPredictionApiGegex / kModelStatusApiRegex, and http_rest_api_util.h's handler path
PREDICTION_RE = re.compile(
    r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:(classify|regress|predict)", re.I)
STATUS_RE = re.compile(r"/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?", re.I)
HANDLED_RE = re.compile(r"/v1/.*", re.I)

# http_server.cc ToHTTPStatusCode
HTTP_STATUS = {"OK": 200, "CANCELLED": 499, "UNKNOWN": 500, "INVALID_ARGUMENT": 400, "DEADLINE_EXCEEDED": 504,
               "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "PERMISSION_DENIED": 403, "RESOURCE_EXHAUSTED": 429,
               "FAILED_PRECONDITION": 400, "ABORTED": 409, "OUT_OF_RANGE": 400, "UNIMPLEMENTED": 501,
               "INTERNAL": 500, "UNAVAILABLE": 503, "DATA_LOSS": 500, "UNAUTHENTICATED": 401}


# ------------------------------------------------------------------------------------------------ the URL
@dataclass(frozen=True)
class ModelInfo:
    """What the URL names (ParseModelInfo): verb is predict/classify/regress (POST), "metadata" or "" (GET)."""
    name: str
    version: int | None
    label: str | None
    verb: str


def parse_model_info(method: str, path: str) -> ModelInfo:
    """http_rest_api_util.cc ParseModelInfo + the "Malformed request" default of ProcessRequest: everything that
    can be refused from the URL alone, before the body is read."""
    pattern = PREDICTION_RE if method == "POST" else STATUS_RE if method == "GET" else None
    match = pattern.fullmatch(path) if pattern else None
    if match is None:
        raise invalid_argument(f"Malformed request: {method} {path}")
    name, version, label, verb = match.groups()
    number = None
    if version:
        number = int(version)
        if number >= 2 ** 63:  # absl::SimpleAtoi into an int64_t
            raise invalid_argument(f"Failed to convert version: {version} to numeric.")
    return ModelInfo(urllib.parse.unquote(name or ""), number, urllib.parse.unquote(label) if label else None,
                     (verb or "").lower())


def _model_spec(spec, info: ModelInfo) -> None:
    """http_rest_api_util.cc FillModelSpecWithNameVersionAndLabel."""
    spec.name = info.name
    if info.version is not None:
        spec.version.value = info.version
    if info.label is not None:
        spec.version_label = info.label


# ------------------------------------------------------------------------------------------------ the handler
def handle(core, method: str, path: str, body: bytes, timeout_in_ms: int = 0,
           reader: FixedBodyReader | None = None) -> tuple[int, str]:
    """(HTTP status, JSON body) for one request, like HttpRestApiHandler::ProcessRequest. `timeout_in_ms`
    (--rest_api_timeout_in_ms) is every Session.run's RunOptions timeout (http_rest_api_handler.cc); `reader`, the
    body's if it was read as it arrived. Counted as http_server.cc does: the URL's model name and verb ("" for GET),
    entrypoint REST."""
    started = time.monotonic()
    model_name = verb = ""
    status = "OK"
    try:
        info = parse_model_info(method, path)
        model_name, verb = info.name, info.verb if method == "POST" else ""
        with request_scope(timeout_in_ms / 1000):
            return 200, _dispatch(core, info, method, body, reader)
    except RpcError as err:
        status = err.code.name
        return HTTP_STATUS.get(err.code.name, 500), error_json(err.message)
    except Exception as err:  # noqa: BLE001 — never a traceback to the client
        status = "INTERNAL"
        log.exception("internal error in REST %s %s", method, path)
        return 500, error_json(f"{type(err).__name__}: {err}")
    finally:
        if core.metrics is not None:
            core.metrics.request(model_name, verb, "REST", status, (time.monotonic() - started) * 1e6)


def _dispatch(core, info: ModelInfo, method: str, body: bytes, reader: FixedBodyReader | None) -> str:
    if method == "GET":
        if not info.name:
            raise invalid_argument("Missing model name in request.")
        return _metadata(core, info) if info.verb == "metadata" else _status(core, info)
    if info.verb == "predict":
        return _predict(core, info, body, reader)
    doc = parse_json(body)
    from tensorflow_serving.apis import classification_pb2, regression_pb2

    request = classification_pb2.ClassificationRequest() if info.verb == "classify" else \
        regression_pb2.RegressionRequest()
    _model_spec(request.model_spec, info)
    request.model_spec.signature_name = signature_name(doc)
    fill_example_input(doc, request.input)
    if info.verb == "classify":
        return classify_json(classify(core, request).result)
    return regress_json(regress(core, request).result)


def _predict(core, info: ModelInfo, body: bytes, reader: FixedBodyReader | None) -> str:
    """ProcessPredictRequest: the signature's input map (GetInfoMap), the JSON codec, Predict, JSON again. A body in
    the fixed-width layout (json_tensor.FixedBody) has its array read by numpy; it takes the ordinary path wherever
    its answer could differ from the ordinary one's (another input map), so every refusal keeps its words."""
    from tensorflow_serving.apis import predict_pb2

    from exportkit.serving.tensors import to_ndarray, to_tensor_proto

    fixed = reader.body(body) if reader else parse_fixed_body(body)
    doc = fixed.doc if fixed else parse_json(body)
    request = predict_pb2.PredictRequest()
    _model_spec(request.model_spec, info)
    request.model_spec.signature_name = signature_name(doc)
    servable = core.servable_for(request.model_spec)
    name = request.model_spec.signature_name or "serving_default"
    signature = servable.model.signatures.get(name)
    if signature is None:
        raise invalid_argument(f'Serving signature name: "{name}" not found in signature def')
    infomap = {k: dtype_name(v.dtype) for k, v in signature.inputs.items()}
    arrays, row = (fixed.inputs(infomap) if fixed else None), True
    if arrays is None:
        doc = parse_json(body) if fixed else doc
        arrays, row = fill_predict_request(doc, infomap, request.model_spec.signature_name)
    for key, value in arrays.items():
        request.inputs[key].CopyFrom(to_tensor_proto(value, dtype=signature.inputs[key].dtype))
    response = run_predict(servable, request)
    return predict_json({k: to_ndarray(v) for k, v in response.outputs.items()}, row)


def _status(core, info: ModelInfo) -> str:
    from google.protobuf import json_format
    from tensorflow_serving.apis import get_model_status_pb2

    request = get_model_status_pb2.GetModelStatusRequest()
    _model_spec(request.model_spec, info)
    return json_format.MessageToJson(get_model_status(core, request), **_PROTO_JSON)


def _metadata(core, info: ModelInfo) -> str:
    """http_rest_api_util.cc ToJsonString(GetModelMetadataResponse): model_spec and the unpacked SignatureDefMap."""
    from google.protobuf import json_format
    from tensorflow_serving.apis import get_model_metadata_pb2

    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    _model_spec(request.model_spec, info)
    response = get_model_metadata(core, request)
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    response.metadata["signature_def"].Unpack(signature_map)
    return ('{\n"model_spec":' + json_format.MessageToJson(response.model_spec, **_PROTO_JSON) +
            ',\n"metadata": {"signature_def": ' + json_format.MessageToJson(signature_map, **_PROTO_JSON) + "}\n}\n")


_PROTO_JSON = {"preserving_proto_field_name": True, "indent": 1, "always_print_fields_with_no_presence": True}


# ------------------------------------------------------------------------------------------------ the dispatcher
class RestApiHandler:
    """http_server.cc RestApiRequestDispatcher: exact paths registered in `routes` first (TF Serving's Prometheus
    page), then every path under /v1/ to the REST API; anything else is 404."""

    def __init__(self, core, routes: dict[str, Callable[[Request], Response]] | None = None, timeout_in_ms: int = 0):
        self.core = core
        self.routes = dict(routes or {})
        self.timeout_in_ms = timeout_in_ms

    def check(self, method: str, target: str) -> Response | None:
        path = urllib.parse.urlsplit(target).path
        if path in self.routes:
            return None
        if not HANDLED_RE.fullmatch(path):
            return error_response(404, f"Not found: {path}")
        if method == "OPTIONS":
            return None
        try:
            parse_model_info(method, path)
        except RpcError as err:
            return error_response(HTTP_STATUS[err.code.name], err.message)
        return None

    def reader(self, method: str, target: str, headers: dict[str, str]) -> FixedBodyReader | None:
        """A Predict body is read as it arrives, in case it is in json_tensor's fixed-width layout."""
        path = urllib.parse.urlsplit(target).path
        if method != "POST" or path in self.routes or not path.lower().endswith(":predict"):
            return None
        return FixedBodyReader(int(headers["content-length"]))

    def __call__(self, request: Request) -> Response:
        path = urllib.parse.urlsplit(request.target).path
        if path in self.routes:
            return self.routes[path](request)
        if request.method == "OPTIONS":
            # A CORS preflight: OK with an http(s) Origin, else FAILED_PRECONDITION (TF Serving sends that 400
            # with an empty body; here it carries the message as every other error does).
            if re.search("https?://", request.headers.get("origin", "")):
                return Response(200, b"", None)
            return error_response(HTTP_STATUS[grpc.StatusCode.FAILED_PRECONDITION.name],
                                  "Origin header is missing in CORS preflight")
        status, text = handle(self.core, request.method, path, request.body, self.timeout_in_ms, request.reader)
        # surrogateescape: string outputs that are not UTF-8 go out as their raw bytes, as TF Serving sends them.
        return Response(status, text.encode("utf-8", "surrogateescape"))


def start_rest(core, port: int, routes: dict[str, Callable[[Request], Response]] | None = None,
               limits: Limits = Limits(), timeout_in_ms: int = 0) -> tuple[HttpServer, int]:
    """Serve the REST API for `core` on 127.0.0.1:port (0 = a free port) in a daemon thread. `routes`: extra exact
    paths (e.g. a monitoring page) answered before the API; `timeout_in_ms`: --rest_api_timeout_in_ms (0 = none).
    The server has `shutdown()` and `server_close()`."""
    from exportkit.errors import InfraError

    try:
        server = serve_in_thread(RestApiHandler(core, routes, timeout_in_ms), port, limits)
    except OSError as err:
        raise InfraError(f"cannot listen on 127.0.0.1:{port} for REST ({err.strerror})",
                         "pass another --rest-port, or 0 for none") from None
    return server, server.server_address[1]
