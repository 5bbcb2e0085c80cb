"""TF Serving's REST API, server side: request routing (model_servers/http_rest_api_handler.cc) and the HTTP
server (http_server.cc), for `exportkit serve --rest_api_port`.

Matches the URL patterns, `{"error": "..."}` bodies with TF Serving's HTTP codes and Classify/Regress over JSON
Examples. The HTTP layer is the standard library's ThreadingHTTPServer (no dependency); this module only maps
requests onto the ServerCore's servables and the APIs in predict/classifier/regressor/metadata/model_status.
"""
from __future__ import annotations

import logging
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from exportkit.savedmodel import dtype_name
from exportkit.serving.classifier import classify
from exportkit.serving.json_tensor import (_debug, _invalid, _signature_name, classify_json, error_json,
                                           fill_example_input, inputs_from_columns, inputs_from_instances, parse_json,
                                           predict_json, regress_json)
from exportkit.serving.metadata import get_model_metadata
from exportkit.serving.model_status import get_model_status
from exportkit.serving.predict import run_predict
from exportkit.serving.regressor import regress
from exportkit.serving.status import RpcError

log = logging.getLogger("exportkit.serve")

PREDICTION_RE = re.compile(
    r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:(classify|regress|predict)", re.I)
STATUS_RE = re.compile(r"/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?", re.I)
HANDLED_RE = re.compile(r"/v1/.*", re.I)

# http_server.cc ToHTTPStatusCode
HTTP_STATUS = {"OK": 200, "CANCELLED": 499, "UNKNOWN": 500, "INVALID_ARGUMENT": 400, "DEADLINE_EXCEEDED": 504,
               "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "PERMISSION_DENIED": 403, "RESOURCE_EXHAUSTED": 429,
               "FAILED_PRECONDITION": 400, "ABORTED": 409, "OUT_OF_RANGE": 400, "UNIMPLEMENTED": 501,
               "INTERNAL": 500, "UNAVAILABLE": 503, "DATA_LOSS": 500, "UNAUTHENTICATED": 401}

# ------------------------------------------------------------------------------------------------ the handler
def _model_spec(spec, name: str, version: str | None, label: str | None) -> None:
    spec.name = urllib.parse.unquote(name)
    if version:
        spec.version.value = int(version)
    if label:
        spec.version_label = urllib.parse.unquote(label)


def handle(core, method: str, path: str, body: bytes) -> tuple[int, str]:
    """(HTTP status, JSON body) for one request, like HttpRestApiHandler::ProcessRequest."""
    try:
        return 200, _dispatch(core, method, path, body)
    except RpcError as err:
        return HTTP_STATUS.get(err.code.name, 500), error_json(err.message)
    except Exception as err:  # noqa: BLE001 — never a traceback to the client
        log.exception("internal error in REST %s %s", method, path)
        return 500, error_json(f"{type(err).__name__}: {err}")


def _dispatch(core, method: str, path: str, body: bytes) -> str:
    from google.protobuf import json_format
    from tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2, get_model_status_pb2,
                                         predict_pb2, regression_pb2)

    malformed = _invalid(f"Malformed request: {method} {path}")
    match = PREDICTION_RE.fullmatch(path) if method == "POST" else STATUS_RE.fullmatch(path) if method == "GET" else None
    if match is None:
        raise malformed
    name, version, label, verb = match.groups()
    if version and label:
        raise _invalid(f"Both model version ({version}) and model version label ({label}) cannot be supplied.")
    options = {"preserving_proto_field_name": True, "indent": 1, "always_print_fields_with_no_presence": True}
    if method == "GET":
        if not name:
            raise _invalid("Missing model name in request.")
        if verb and verb.lower() == "metadata":
            request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
            _model_spec(request.model_spec, name, version, label)
            response = get_model_metadata(core, request)
            signature_map = get_model_metadata_pb2.SignatureDefMap()
            response.metadata["signature_def"].Unpack(signature_map)
            return ('{\n"model_spec":' + json_format.MessageToJson(response.model_spec, **options) +
                    ',\n"metadata": {"signature_def": ' + json_format.MessageToJson(signature_map, **options) + "}\n}\n")
        request = get_model_status_pb2.GetModelStatusRequest()
        _model_spec(request.model_spec, name, version, label)
        return json_format.MessageToJson(get_model_status(core, request), **options)
    verb = verb.lower()
    doc = parse_json(body)
    if verb == "predict":
        request = predict_pb2.PredictRequest()
        _model_spec(request.model_spec, name, version, label)
        request.model_spec.signature_name = _signature_name(doc)
        servable = core.servable_for(request.model_spec)
        signature_name = request.model_spec.signature_name or "serving_default"
        signature = servable.model.signatures.get(signature_name)
        if signature is None:
            raise _invalid(f'Serving signature name: "{signature_name}" not found in signature def')
        infomap = {k: dtype_name(v.dtype) for k, v in signature.inputs.items()}
        if not infomap:
            raise _invalid(f"Failed to get input map for signature: {signature_name or 'DEFAULT'}")
        if "instances" in doc:
            if "inputs" in doc:
                raise _invalid(f"JSON Value: {_debug(doc)} Not formatted correctly expecting only one of 'inputs' or "
                               "'instances' keys to exist ")
            if not isinstance(doc["instances"], list):
                raise _invalid(f"JSON Value: {_debug(doc)} Expecting 'instances' to be an list/array")
            if not doc["instances"]:
                raise _invalid(f"JSON Value: {_debug(doc)} No values in 'instances' array")
            arrays, row = inputs_from_instances(doc["instances"], infomap), True
        elif "inputs" in doc:
            arrays, row = inputs_from_columns(doc["inputs"], infomap), False
        else:
            raise _invalid("Missing 'inputs' or 'instances' key")
        from exportkit.serving.tensors import to_ndarray, to_tensor_proto

        for key, value in arrays.items():
            request.inputs[key].CopyFrom(to_tensor_proto(value, dtype=signature.inputs[key].dtype))
        response = run_predict(servable, request)
        return predict_json({k: to_ndarray(v) for k, v in response.outputs.items()}, row)
    request = classification_pb2.ClassificationRequest() if verb == "classify" else regression_pb2.RegressionRequest()
    _model_spec(request.model_spec, name, version, label)
    request.model_spec.signature_name = _signature_name(doc)
    fill_example_input(doc, request.input)
    if verb == "classify":
        return classify_json(classify(core, request).result)
    return regress_json(regress(core, request).result)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    core = None  # set on the per-server subclass

    def do_GET(self):  # noqa: N802 — the stdlib's naming
        self._answer("GET")

    def do_POST(self):  # noqa: N802
        self._answer("POST")

    def _answer(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        path = urllib.parse.urlsplit(self.path).path
        if not HANDLED_RE.fullmatch(path):
            status, text = 404, ""
        else:
            status, text = handle(self.core, method, path, body)
        # surrogateescape: string outputs that are not UTF-8 go out as their raw bytes, as TF Serving sends them.
        payload = text.encode("utf-8", "surrogateescape")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format, *args):  # noqa: A002 — the stdlib's signature
        log.debug("rest: " + format, *args)


def start_rest(core, port: int) -> tuple[ThreadingHTTPServer, int]:
    """Serve the REST API for `core` on 127.0.0.1:port (0 = a free port) in a daemon thread."""
    from exportkit.errors import InfraError

    handler = type("RestHandler", (_Handler,), {"core": core})
    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as err:
        raise InfraError(f"cannot listen on 127.0.0.1:{port} for REST ({err.strerror})",
                         "pass another --rest-port, or 0 for none") from None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True, name="rest").start()
    return server, server.server_address[1]
