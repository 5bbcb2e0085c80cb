"""TF Serving's REST API: the server side for `exportkit serve --rest-port`, and a plain urllib client.

Matches tensorflow_serving/model_servers/http_rest_api_handler.cc, http_rest_api_util.cc and util/json_tensor.cc:
the URL patterns, the row (`instances`) and columnar (`inputs`) formats, `{"b64": ...}` for binary strings,
Classify/Regress over JSON Examples, `{"error": "..."}` bodies with TF Serving's HTTP codes, and its float printing
(shortest of `%.6g` that round-trips, else max_digits10), so precision a JSON client loses here it loses there.
The HTTP layer is the standard library's ThreadingHTTPServer (no dependency); this module only maps requests.
"""
from __future__ import annotations

import base64
import itertools
import json
import logging
import math
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import numpy as np

from exportkit.savedmodel import dtype_name

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
# DataTypeString spellings used in TF Serving's messages
_TF_TYPE_NAMES = {"float32": "float", "float64": "double", "float16": "half"}
BYTES_SUFFIX = "_bytes"


def _error(code: grpc.StatusCode, message: str):
    from exportkit.serving.server import RpcError

    return RpcError(code, message)


def _invalid(message: str):
    return _error(grpc.StatusCode.INVALID_ARGUMENT, message)


def _debug(value) -> str:
    text = json.dumps(value, separators=(",", ":"), allow_nan=True)
    return text[:256]


def _json_type(value) -> str:
    if value is None:
        return "Null"
    if isinstance(value, bool):
        return "True" if value else "False"
    return {dict: "Object", list: "Array", str: "String"}.get(type(value), "Number")


# ------------------------------------------------------------------------------------------------ floats
def format_float(value, double: bool = False) -> str:
    """json_tensor.cc WriteDecimal: `%.6g` if it reads back as the same value, else max_digits10; NaN, Infinity."""
    v = float(value)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "-Infinity" if v < 0 else "Infinity"
    cast = float if double else np.float32
    text = "%.6g" % v
    if cast(float(text)) != cast(v):
        text = "%.17g" % v if double else "%.9g" % v
    if "." not in text and "e" not in text:
        text += ".0"
    return text


# ------------------------------------------------------------------------------------------------ JSON -> tensors
def _is_b64(value) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def _b64decode(value) -> bytes:
    try:
        return base64.b64decode(value["b64"], validate=True)
    except (ValueError, TypeError):
        raise _invalid("Unable to base64 decode") from None


def _scalar(value, dtype: str):
    """json_tensor.cc AddValueToTensor: one JSON value checked against the input's dtype."""
    def type_error():
        return _invalid(f"JSON Value: {_debug(value)} Type: {_json_type(value)} is not of expected type: "
                        f"{_TF_TYPE_NAMES.get(dtype, dtype)}")

    is_int = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(value, dict):
        if dtype == "string":
            if not _is_b64(value):
                raise _invalid(f"JSON Value: {_debug(value)} not formatted correctly for base64 data")
            return _b64decode(value)
        raise type_error()
    if dtype in ("float32", "float64"):
        if not (is_int or isinstance(value, float)):
            raise type_error()
        return float(value)
    if dtype in ("int32", "int16", "int8", "uint8"):
        if not is_int or not -2 ** 31 <= value < 2 ** 31:
            raise type_error()
        return value
    if dtype == "int64":
        if not is_int or not -2 ** 63 <= value < 2 ** 63:
            raise type_error()
        return value
    if dtype in ("uint32", "uint64"):
        if not is_int or not 0 <= value < 2 ** (32 if dtype == "uint32" else 64):
            raise type_error()
        return value
    if dtype == "string":
        if not isinstance(value, str):
            raise type_error()
        return value.encode("utf-8")
    if dtype == "bool":
        if not isinstance(value, bool):
            raise type_error()
        return value
    raise _error(grpc.StatusCode.UNIMPLEMENTED,
                 f"Conversion of JSON Value: {_debug(value)} to type: {_TF_TYPE_NAMES.get(dtype, dtype)}")


def _numpy_dtype(dtype: str):
    return object if dtype == "string" else np.dtype(dtype)


_INT_RANGES = {"int8": (-2 ** 31, 2 ** 31), "int16": (-2 ** 31, 2 ** 31), "int32": (-2 ** 31, 2 ** 31),
               "uint8": (-2 ** 31, 2 ** 31), "int64": (-2 ** 63, 2 ** 63), "uint32": (0, 2 ** 32), "uint64": (0, 2 ** 64)}


def _regular_numbers(value, dtype: str) -> np.ndarray | None:
    """The fast path of tensor_from_json: a regular nested list of JSON numbers of the types `_scalar` accepts for
    `dtype`, converted by numpy; None for anything else (the element-wise path then accepts it or says why not)."""
    if dtype not in ("float32", "float64", "bool") and dtype not in _INT_RANGES:
        return None
    try:
        arr = np.array(value)
    except (ValueError, OverflowError):
        return None
    if arr.dtype.kind not in "bif" or arr.size == 0:
        return None
    flat = [value] if arr.ndim == 0 else value
    for _ in range(arr.ndim - 1):
        flat = list(itertools.chain.from_iterable(flat))
    types = set(map(type, flat))
    allowed = {bool} if dtype == "bool" else {int, float} if dtype.startswith("float") else {int}
    if not types <= allowed:
        return None
    if dtype in _INT_RANGES:
        low, high = _INT_RANGES[dtype]
        if not (low <= int(arr.min()) and int(arr.max()) < high):
            return None
    return arr.astype(dtype)


def tensor_from_json(value, dtype: str) -> np.ndarray:
    """json_tensor.cc FillTensorProto: the shape follows the first element at each level; all levels must agree."""
    fast = _regular_numbers(value, dtype)
    if fast is not None:
        return fast
    shape, probe = [], value
    while isinstance(probe, list):
        shape.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    flat = []

    def fill(item, level):
        if not isinstance(item, list):
            if level != len(shape):
                raise _invalid(f"JSON Value: {_debug(item)} found at incorrect level: {level + 1} in the JSON DOM. "
                               f"Expected at level: {len(shape)}")
            flat.append(_scalar(item, dtype))
            return
        if level >= len(shape):
            raise _invalid(f"Encountered list at unexpected level: {level} expected < {len(shape)}")
        if len(item) != shape[level]:
            raise _invalid(f"Encountered list at unexpected size: {len(item)} at level: {level} expected size: "
                           f"{shape[level]}")
        for element in item:
            fill(element, level + 1)

    fill(value, 0)
    out = np.empty(len(flat), dtype=_numpy_dtype(dtype)) if dtype == "string" else None
    if out is not None:
        out[:] = flat
        return out.reshape(shape)
    return np.array(flat, dtype=_numpy_dtype(dtype)).reshape(shape)


def _status_text(err) -> str:
    return f"{err.code.name}: {err.message}"


def inputs_from_instances(instances: list, infomap: dict) -> dict[str, np.ndarray]:
    """json_tensor.cc FillTensorMapFromInstancesList (row format)."""
    def is_object(value):
        return isinstance(value, dict) and not _is_b64(value)

    from exportkit.serving.server import RpcError

    if not is_object(instances[0]) and len(infomap) > 1:
        raise _invalid("instances is a plain list, but expecting list of objects as multiple input tensors required "
                       "as per tensorinfo_map")
    objects = is_object(instances[0])
    names = sorted(infomap)
    rows: dict[str, list] = {}
    for count, element in enumerate(instances):
        if objects:
            if not is_object(element):
                raise _invalid(f"Expecting object but got list at item {count} of input list")
            items = element
        else:
            if is_object(element):
                raise _invalid(f"Expecting value/list but got object at item {count} of input list")
            items = {names[0]: element}
        for name, value in items.items():
            try:
                if name not in infomap:
                    raise _invalid(f"JSON object: does not have named input: {name}")
                tensor = tensor_from_json(value, infomap[name])
                if rows.get(name):
                    first = rows[name][0]
                    if first.size != tensor.size:
                        raise _invalid(f"Expecting tensor size: {first.size} but got: {tensor.size}")
                    if first.shape != tensor.shape:
                        raise _invalid(f"Expecting shape [{','.join(map(str, first.shape))}] but got: "
                                       f"[{','.join(map(str, tensor.shape))}]")
            except RpcError as err:
                key = f" key: {name}" if objects else ""
                raise _invalid(f"Failed to process element: {count}{key} of 'instances' list. Error: "
                               f"{_status_text(err)}") from None
            rows.setdefault(name, []).append(tensor)
        if objects and set(items) != set(names):
            raise _invalid(f"Failed to process element: {count} of 'instances' list. JSON object: {_debug(element)} "
                           f"keys must be equal to: {','.join(names)}")
    return {name: np.stack(values) for name, values in rows.items()}


def inputs_from_columns(inputs, infomap: dict) -> dict[str, np.ndarray]:
    """json_tensor.cc FillTensorMapFromInputsMap (columnar format). Keys not in the signature are ignored."""
    if not isinstance(inputs, dict) or _is_b64(inputs):
        if len(infomap) > 1:
            raise _invalid("inputs is a plain value/list, but expecting an object as multiple input tensors required "
                           "as per tensorinfo_map")
        name = next(iter(infomap))
        return {name: tensor_from_json(inputs, infomap[name])}
    out = {}
    for name in sorted(infomap):
        if name not in inputs:
            raise _invalid(f"Missing named input: {name} in 'inputs' object.")
        out[name] = tensor_from_json(inputs[name], infomap[name])
    return out


def parse_json(body: bytes) -> dict:
    if not body:
        raise _invalid("JSON Parse error: The document is empty")
    try:
        doc = json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise _invalid(f"JSON Parse error: {err}") from None
    if not isinstance(doc, dict):
        raise _invalid(f"JSON Value: {_debug(doc)} Is not object")
    return doc


def _signature_name(doc: dict) -> str:
    name = doc.get("signature_name", "")
    if not isinstance(name, str):
        raise _invalid(f"JSON Value: {_debug(doc)} not formatted correctly. 'signature_name' key must be a string "
                       "value.")
    return name


# ------------------------------------------------------------------------------------------------ tensors -> JSON
def _json_scalar(value, dtype: str, as_bytes: bool) -> str:
    if dtype in ("float32", "float64"):
        return format_float(value, double=dtype == "float64")
    if dtype == "bool":
        return "true" if value else "false"
    if dtype == "string":
        raw = bytes(value)
        if as_bytes:
            return '{"b64": "' + base64.b64encode(raw).decode("ascii") + '"}'
        # TF Serving writes the bytes as they are: not valid UTF-8 stays not valid UTF-8 (see write_json).
        return json.dumps(raw.decode("utf-8", "surrogateescape"), ensure_ascii=False)
    if dtype.startswith(("int", "uint")):
        return str(int(value))
    raise _invalid(f"Failed to write JSON value for tensor type: {_TF_TYPE_NAMES.get(dtype, dtype)}")


def _float_texts(value: np.ndarray, double: bool) -> np.ndarray:
    """format_float over an array at once (the same text for every element)."""
    v = value.astype(np.float64)
    texts = np.char.mod("%.6g", v)
    cast = np.float64 if double else np.float32
    finite = np.isfinite(v)
    reread = np.where(finite, texts, "0").astype(np.float64).astype(cast)
    long = finite & (reread != v.astype(cast))
    if long.any():
        texts = np.where(long, np.char.mod("%.17g" if double else "%.9g", v), texts)
    plain = finite & (np.char.find(texts, ".") < 0) & (np.char.find(texts, "e") < 0)
    texts = np.where(plain, np.char.add(texts, ".0"), texts)
    texts = np.where(np.isnan(v), "NaN", texts)
    return np.where(np.isinf(v), np.where(v < 0, "-Infinity", "Infinity"), texts)


def _json_array(value: np.ndarray, dtype: str, as_bytes: bool) -> str:
    if not isinstance(value, np.ndarray):
        return _json_scalar(value, dtype, as_bytes)
    if value.ndim == 0:
        return _json_scalar(value.item() if dtype != "string" else value[()], dtype, as_bytes)
    if dtype in ("float32", "float64") and value.size:
        return _nested(_float_texts(value, dtype == "float64"))
    return "[" + ", ".join(_json_array(v, dtype, as_bytes) for v in value) + "]"


def _nested(texts: np.ndarray) -> str:
    if texts.ndim == 1:
        return "[" + ", ".join(texts.tolist()) + "]"
    return "[" + ", ".join(_nested(t) for t in texts) + "]"


def _dtype_of(value: np.ndarray) -> str:
    return "string" if value.dtype == object or value.dtype.kind in "SU" else value.dtype.name


def predict_json(outputs: dict[str, np.ndarray], row: bool) -> str:
    """json_tensor.cc MakeRowFormatJsonFromTensors / MakeColumnarFormatJsonFromTensors."""
    if not outputs:
        raise _invalid("Cannot convert empty tensor map to JSON")
    names = sorted(outputs)
    arrays = {n: np.asarray(outputs[n]) for n in names}
    kinds = {n: _dtype_of(a) for n, a in arrays.items()}
    as_bytes = {n: kinds[n] == "string" and n.endswith(BYTES_SUFFIX) for n in names}
    many = len(names) > 1
    if not row:
        parts = {n: _json_array(arrays[n], kinds[n], as_bytes[n]) for n in names}
        body = ("{" + ", ".join(f"{json.dumps(n)}: {parts[n]}" for n in names) + "}") if many else parts[names[0]]
        return '{\n    "outputs": ' + body + "\n}"
    batch = None
    for n in names:
        if arrays[n].ndim == 0:
            raise _invalid(f"Tensor name: {n} has no shape information ")
        if batch is not None and arrays[n].shape[0] != batch:
            raise _invalid(f"Tensor name: {n} has inconsistent batch size: {arrays[n].shape[0]} expecting: {batch}")
        batch = arrays[n].shape[0]
    items = []
    for i in range(batch):
        parts = {n: _json_array(arrays[n][i], kinds[n], as_bytes[n]) for n in names}
        items.append(("{" + ", ".join(f"{json.dumps(n)}: {parts[n]}" for n in names) + "}") if many
                     else parts[names[0]])
    return '{\n    "predictions": [' + ",\n        ".join(items) + "\n    ]\n}"


def classify_json(result) -> str:
    if not result.classifications:
        raise _invalid("Cannot convert empty ClassificationResults to JSON")
    rows = []
    for classifications in result.classifications:
        rows.append("[" + ", ".join(f"[{json.dumps(c.label, ensure_ascii=False)}, {format_float(c.score)}]"
                                    for c in classifications.classes) + "]")
    return '{\n    "results": [' + ",\n        ".join(rows) + "\n    ]\n}"


def regress_json(result) -> str:
    if not result.regressions:
        raise _invalid("Cannot convert empty RegressionResults to JSON")
    return '{\n    "results": [' + ", ".join(format_float(r.value) for r in result.regressions) + "]\n}"


def error_json(message: str) -> str:
    return "{\n    \"error\": " + json.dumps(message, ensure_ascii=False) + "\n}"


# ------------------------------------------------------------------------------------------------ JSON Examples
def example_from_json(value, example) -> None:
    """json_tensor.cc MakeExampleFromJsonObject: strings and b64 -> bytes, JSON doubles -> floats, ints/bools -> int64."""
    if not isinstance(value, dict):
        raise _invalid(f"Example must be JSON object but got JSON {_json_type(value)}")
    for name, content in value.items():
        feature = example.features.feature[name]
        feature.Clear()
        for item in content if isinstance(content, list) else [content]:
            kind = feature.WhichOneof("kind")

            def want(k):
                if kind not in (None, k):
                    shown = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64"}[kind]
                    raise _invalid(f"Unexpected element type in feature: {name} expecting type: {shown}")

            if item is None or isinstance(item, list) or (isinstance(item, dict) and not _is_b64(item)):
                raise _invalid(f"Feature: {name} has element with unexpected JSON type: {_json_type(item)}")
            if isinstance(item, bool):
                want("int64_list")
                feature.int64_list.value.append(1 if item else 0)
            elif isinstance(item, dict):
                want("bytes_list")
                feature.bytes_list.value.append(_b64decode(item))
            elif isinstance(item, str):
                want("bytes_list")
                feature.bytes_list.value.append(item.encode("utf-8"))
            elif isinstance(item, float):
                want("float_list")
                feature.float_list.value.append(item)
            else:
                want("int64_list")
                if item >= 2 ** 63:
                    raise _invalid(f"Feature: {name} has uint64_t element. Only int64_t is supported.")
                feature.int64_list.value.append(item)


def example_to_json(serialized: bytes) -> dict:
    """A serialized tf.Example as the JSON object TF Serving's classify/regress accept (bytes as b64 unless UTF-8)."""
    from exportkit.examples import parse_example

    out = {}
    for name, feature in parse_example(serialized).features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind == "bytes_list":
            values = []
            for raw in feature.bytes_list.value:
                try:
                    values.append(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    values.append({"b64": base64.b64encode(raw).decode("ascii")})
        elif kind == "float_list":
            values = [float(v) for v in feature.float_list.value]
        elif kind == "int64_list":
            values = [int(v) for v in feature.int64_list.value]
        else:
            values = []
        out[name] = values
    return out


def fill_example_input(doc: dict, input_proto) -> None:
    """json_tensor.cc FillClassifyRegressRequestFromJson: optional `context`, required non-empty `examples`."""
    context = "context" in doc
    if context:
        example_from_json(doc["context"], input_proto.example_list_with_context.context)
    if "examples" not in doc:
        raise _invalid(f"JSON Value: {_debug(doc)} When method is classify, key 'examples' is expected and was not "
                       "found")
    if not isinstance(doc["examples"], list):
        raise _invalid(f"JSON Value: {_debug(doc)} Expecting 'examples' value to be an list/array")
    if not doc["examples"]:
        raise _invalid(f"JSON Value: {_debug(doc)} 'examples' value is an empty array")
    target = input_proto.example_list_with_context if context else input_proto.example_list
    for value in doc["examples"]:
        example_from_json(value, target.examples.add())


# ------------------------------------------------------------------------------------------------ the handler
def _model_spec(spec, name: str, version: str | None, label: str | None) -> None:
    spec.name = urllib.parse.unquote(name)
    if version:
        spec.version.value = int(version)
    if label:
        spec.version_label = urllib.parse.unquote(label)


def handle(served, method: str, path: str, body: bytes) -> tuple[int, str]:
    """(HTTP status, JSON body) for one request, like HttpRestApiHandler::ProcessRequest."""
    from exportkit.serving.server import RpcError

    try:
        return 200, _dispatch(served, method, path, body)
    except RpcError as err:
        return HTTP_STATUS.get(err.code.name, 500), error_json(err.message)
    except Exception as err:  # noqa: BLE001 — never a traceback to the client
        log.exception("internal error in REST %s %s", method, path)
        return 500, error_json(f"{type(err).__name__}: {err}")


def _dispatch(served, method: str, path: str, body: bytes) -> str:
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
            response = served.metadata(request)
            signature_map = get_model_metadata_pb2.SignatureDefMap()
            response.metadata["signature_def"].Unpack(signature_map)
            return ('{\n"model_spec":' + json_format.MessageToJson(response.model_spec, **options) +
                    ',\n"metadata": {"signature_def": ' + json_format.MessageToJson(signature_map, **options) + "}\n}\n")
        request = get_model_status_pb2.GetModelStatusRequest()
        _model_spec(request.model_spec, name, version, label)
        return json_format.MessageToJson(served.status(request), **options)
    verb = verb.lower()
    doc = parse_json(body)
    if verb == "predict":
        request = predict_pb2.PredictRequest()
        _model_spec(request.model_spec, name, version, label)
        request.model_spec.signature_name = _signature_name(doc)
        served._check_spec(request.model_spec)
        signature_name = request.model_spec.signature_name or "serving_default"
        signature = served.model.signatures.get(signature_name)
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
        response = served.predict(request)
        return predict_json({k: to_ndarray(v) for k, v in response.outputs.items()}, row)
    request = classification_pb2.ClassificationRequest() if verb == "classify" else regression_pb2.RegressionRequest()
    _model_spec(request.model_spec, name, version, label)
    request.model_spec.signature_name = _signature_name(doc)
    fill_example_input(doc, request.input)
    if verb == "classify":
        return classify_json(served.classify(request).result)
    return regress_json(served.regress(request).result)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    served = None  # set on the per-server subclass

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
            status, text = handle(self.served, method, path, body)
        # surrogateescape: string outputs that are not UTF-8 go out as their raw bytes, as TF Serving sends them.
        payload = text.encode("utf-8", "surrogateescape")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format, *args):  # noqa: A002 — the stdlib's signature
        log.debug("rest: " + format, *args)


def start_rest(served, port: int) -> tuple[ThreadingHTTPServer, int]:
    """Serve the REST API for `served` on 127.0.0.1:port (0 = a free port) in a daemon thread."""
    from exportkit.errors import InfraError

    handler = type("RestHandler", (_Handler,), {"served": served})
    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as err:
        raise InfraError(f"cannot listen on 127.0.0.1:{port} for REST ({err.strerror})",
                         "pass another --rest-port, or 0 for none") from None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True, name="rest").start()
    return server, server.server_address[1]


# ------------------------------------------------------------------------------------------------ the client
class RestClient:
    """A plain urllib client for TF Serving's REST API (any server: binary, embedded)."""

    def __init__(self, address: str, model_name: str, version: int | None = None,
                 signature_name: str = "serving_default", timeout: float = 30.0):
        self.address = address
        self.model_name = model_name
        self.version = version
        self.signature_name = signature_name
        self.timeout = timeout

    def url(self, verb: str = "") -> str:
        path = f"/v1/models/{urllib.parse.quote(self.model_name, safe='')}"
        if self.version is not None:
            path += f"/versions/{int(self.version)}"
        return f"http://{self.address}{path}{verb}"

    def _call(self, url: str, doc: dict | None = None) -> dict:
        from exportkit.serving.client import ServingError

        data = None if doc is None else json.dumps(doc).encode("utf-8")
        request = urllib.request.Request(url, data=data, method="GET" if doc is None else "POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                message = json.loads(raw.decode("utf-8", "replace")).get("error", raw.decode("utf-8", "replace"))
            except ValueError:
                message = raw.decode("utf-8", "replace")
            raise ServingError(f"HTTP {err.code}", message, "REST") from None
        except (urllib.error.URLError, OSError) as err:
            raise ServingError("UNAVAILABLE", f"REST {url}: {getattr(err, 'reason', err)}", "REST") from None
        # A JSON client decodes the body as UTF-8: bytes that are not UTF-8 arrive replaced.
        return json.loads(raw.decode("utf-8", "replace"))

    def status(self) -> dict:
        return self._call(self.url())

    def metadata(self) -> dict:
        return self._call(self.url("/metadata"))

    def predict(self, inputs: dict[str, np.ndarray], output_dtypes: dict[str, str],
                signature_name: str | None = None) -> dict[str, np.ndarray]:
        """Predict in the row format (`instances`) when every input has the batch dimension, else columnar."""
        doc = {"signature_name": signature_name or self.signature_name}
        arrays = {k: np.asarray(v) for k, v in inputs.items()}
        batch = {a.shape[0] if a.ndim else None for a in arrays.values()}
        row = None not in batch and len(batch) == 1
        if row:
            n = batch.pop()
            if len(arrays) == 1:
                only = next(iter(arrays.values()))
                doc["instances"] = [to_json_value(only[i]) for i in range(n)]
            else:
                doc["instances"] = [{k: to_json_value(a[i]) for k, a in arrays.items()} for i in range(n)]
        else:
            doc["inputs"] = {k: to_json_value(a) for k, a in arrays.items()}
        answer = self._call(self.url(":predict"), doc)
        return outputs_from_json(answer, output_dtypes, row)

    def classify(self, examples, signature_name: str | None = None) -> dict[str, np.ndarray]:
        doc = {"signature_name": signature_name or self.signature_name,
               "examples": [example_to_json(bytes(e)) for e in np.asarray(examples, dtype=object).reshape(-1)]}
        results = self._call(self.url(":classify"), doc)["results"]
        k = len(results[0]) if results else 0
        classes = np.empty((len(results), k), dtype=object)
        scores = np.zeros((len(results), k), dtype=np.float32)
        for i, row in enumerate(results):
            for c, (label, score) in enumerate(row):
                classes[i, c] = label.encode("utf-8")
                scores[i, c] = score
        return {"classes": classes, "scores": scores}

    def regress(self, examples, signature_name: str | None = None) -> np.ndarray:
        doc = {"signature_name": signature_name or self.signature_name,
               "examples": [example_to_json(bytes(e)) for e in np.asarray(examples, dtype=object).reshape(-1)]}
        return np.array(self._call(self.url(":regress"), doc)["results"], dtype=np.float32)


def to_json_value(value):
    """An ndarray (or element) as JSON-ready Python values; strings as {"b64": ...} (binary-safe)."""
    if isinstance(value, (bytes, str)):  # before np.asarray: a numpy bytes scalar drops trailing NUL bytes
        raw = value.encode("utf-8") if isinstance(value, str) else value
        return {"b64": base64.b64encode(raw).decode("ascii")}
    arr = np.asarray(value)
    if arr.dtype.kind in "biuf":  # exact values (a float32 reads back as itself), what json.dumps(a.tolist()) sends
        return arr.tolist()
    if arr.dtype.kind == "V":  # bfloat16
        return arr.astype(np.float32).tolist()
    if arr.ndim:
        return [to_json_value(v) for v in arr]
    item = arr[()]
    if isinstance(item, (bytes, np.bytes_, str)):
        return to_json_value(item if isinstance(item, str) else bytes(item))
    if arr.dtype.kind == "f" and arr.dtype.itemsize < 8:
        return float(str(item))  # the shortest text that reads back as the same float32/float16, as clients send
    if arr.dtype.kind == "f" or arr.dtype.kind == "V":
        return float(item)
    if arr.dtype.kind == "b":
        return bool(item)
    return int(item)


def _from_json(value, dtype: str, as_bytes: bool) -> np.ndarray:
    if dtype != "string":
        try:
            return np.asarray(value, dtype=np.dtype(dtype) if dtype != "bfloat16" else np.float32)
        except (TypeError, ValueError, OverflowError):
            return np.asarray(value, dtype=object)

    def convert(v):
        if isinstance(v, list):
            return [convert(x) for x in v]
        if isinstance(v, dict) and "b64" in v:
            return base64.b64decode(v["b64"])
        return v.encode("utf-8") if isinstance(v, str) else v

    converted = convert(value)
    out = np.empty(np.shape(np.asarray(value, dtype=object)) if isinstance(value, list) else (), dtype=object)
    if out.ndim:
        out[...] = np.asarray(converted, dtype=object)
    else:
        out[()] = converted
    return out


def outputs_from_json(answer: dict, output_dtypes: dict[str, str], row: bool) -> dict[str, np.ndarray]:
    """A predict response (`predictions` or `outputs`) as arrays keyed by output name, in the signature's dtypes."""
    names = sorted(output_dtypes)
    if row:
        items = answer["predictions"]
        per_name = {n: [item[n] for item in items] for n in names} if len(names) > 1 else {names[0]: items}
    else:
        body = answer["outputs"]
        per_name = {n: body[n] for n in names} if len(names) > 1 else {names[0]: body}
    return {n: _from_json(v, output_dtypes[n], n.endswith(BYTES_SUFFIX)) for n, v in per_name.items()}
