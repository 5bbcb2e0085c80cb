"""Ready-to-send requests per signature (`exportkit inspect --requests DIR`): curl + JSON for REST, JSON for grpcurl.

Values come from the golden record when the SavedModel has one (its first row), else from exportkit's generated
inputs (serialized tf.Example for signatures that parse them). The method name picks the API, as clients do:
`:classify`/`:regress` with JSON Examples, `:predict` in the row format otherwise. The gRPC bodies are the
request protos in protobuf's JSON mapping, which grpcurl reads (`-d @`).
"""
from __future__ import annotations

import base64
import json
import re
import shlex
from pathlib import Path

import numpy as np

from exportkit.serving.messages import CLIENT_MAX_RECEIVE, RECEIVE_OPTION, row_bytes
from exportkit.signature_constants import CLASSIFY_METHOD, REGRESS_METHOD

# TensorProto's typed value field per dtype (tensor.proto)
_VALUE_FIELDS = {"float32": "float_val", "float64": "double_val", "int32": "int_val", "int16": "int_val",
                 "int8": "int_val", "uint8": "int_val", "uint16": "int_val", "int64": "int64_val",
                 "uint32": "uint32_val", "uint64": "uint64_val", "bool": "bool_val", "string": "string_val"}
_DT_NAMES = {"float32": "DT_FLOAT", "float64": "DT_DOUBLE", "float16": "DT_HALF", "string": "DT_STRING",
             "complex64": "DT_COMPLEX64", "complex128": "DT_COMPLEX128"}


def _tensor_json(value: np.ndarray, dtype: str) -> dict:
    """A TensorProto in protobuf's JSON mapping (bytes as base64, int64 as strings)."""
    field = _VALUE_FIELDS.get(dtype)
    shape = {"dim": [{"size": str(d)} for d in np.shape(value)]}
    if field is None:  # half, bfloat16, complex, ...: the raw little-endian bytes, which every TensorProto reader takes
        raw = np.ascontiguousarray(value).tobytes()
        return {"dtype": _DT_NAMES.get(dtype, "DT_" + dtype.upper()), "tensor_shape": shape,
                "tensor_content": base64.b64encode(raw).decode("ascii")}
    flat = np.asarray(value).reshape(-1)
    if dtype == "string":
        values = [base64.b64encode(bytes(v)).decode("ascii") for v in flat]
    elif dtype in ("int64", "uint64"):
        values = [str(int(v)) for v in flat]
    elif dtype == "bool":
        values = [bool(v) for v in flat]
    elif dtype == "float32":
        values = [float(str(v)) for v in flat]  # shortest text that reads back as the same float32
    elif dtype.startswith("float"):
        values = [float(v) for v in flat]
    else:
        values = [int(v) for v in flat]
    return {"dtype": _DT_NAMES.get(dtype, "DT_" + dtype.upper()), "tensor_shape": shape, field: values}


def _example_json(serialized: bytes) -> dict:
    """A tf.Example in protobuf's JSON mapping."""
    from exportkit.tfexample.signatures import parse_example

    out = {}
    for name, feature in parse_example(serialized).features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind == "bytes_list":
            out[name] = {kind: {"value": [base64.b64encode(v).decode("ascii") for v in feature.bytes_list.value]}}
        elif kind == "float_list":
            out[name] = {kind: {"value": [float(v) for v in feature.float_list.value]}}
        elif kind == "int64_list":
            out[name] = {kind: {"value": [str(v) for v in feature.int64_list.value]}}
    return {"features": {"feature": out}}


def _rest_value(value):
    """Row-format JSON value: plain strings when they are UTF-8, {"b64": ...} otherwise."""
    from exportkit.serving.client.rest_client import to_json_value

    arr = np.asarray(value)
    if arr.dtype == object or arr.dtype.kind in "SU":
        def plain(v):
            if isinstance(v, list):
                return [plain(x) for x in v]
            if isinstance(v, dict):
                raw = base64.b64decode(v["b64"])
                try:
                    return raw.decode("utf-8")
                except UnicodeDecodeError:
                    return v
            return v

        return plain(to_json_value(arr))
    return to_json_value(arr)


def request_samples(signature_name: str, signature: dict, batch: dict[str, np.ndarray], model_name: str) -> dict:
    """{"api", "rest_verb", "rest_body", "grpc_method", "grpc_body"} for one signature and a batch of one row."""
    method = signature.get("method")
    spec = {"name": model_name, "signature_name": signature_name}
    if method in (CLASSIFY_METHOD, REGRESS_METHOD):
        from exportkit.serving.json.examples import example_to_json

        examples = [bytes(v) for v in np.asarray(next(iter(batch.values())), dtype=object).reshape(-1)]
        verb = "classify" if method == CLASSIFY_METHOD else "regress"
        return {"api": verb.capitalize(), "rest_verb": verb,
                "rest_body": {"signature_name": signature_name, "examples": [example_to_json(e) for e in examples]},
                "grpc_method": "Classify" if verb == "classify" else "Regress",
                "grpc_body": {"model_spec": spec,
                              "input": {"example_list": {"examples": [_example_json(e) for e in examples]}}}}
    dtypes = {k: v["dtype"] for k, v in signature["inputs"].items()}
    rows = {np.shape(v)[0] for v in batch.values() if np.ndim(v)}
    if len(rows) == 1 and all(np.ndim(v) for v in batch.values()):
        n = rows.pop()
        if len(batch) == 1:
            key, value = next(iter(batch.items()))
            instances = [_rest_value(value[i]) for i in range(n)]
        else:
            instances = [{k: _rest_value(v[i]) for k, v in sorted(batch.items())} for i in range(n)]
        rest_body = {"signature_name": signature_name, "instances": instances}
    else:
        rest_body = {"signature_name": signature_name, "inputs": {k: _rest_value(v) for k, v in sorted(batch.items())}}
    return {"api": "Predict", "rest_verb": "predict", "rest_body": rest_body, "grpc_method": "Predict",
            "grpc_body": {"model_spec": spec,
                          "inputs": {k: _tensor_json(v, dtypes[k]) for k, v in sorted(batch.items())}},
            "answer_row_bytes": row_bytes(signature["outputs"])}


_ADDRESS = re.compile(r"[A-Za-z0-9.:\[\]-]+")  # host:port, [v6]:port: safe inside "${VAR:-default}"


def _file_stem(name: str, taken: set[str]) -> str:
    """A file name part from a signature key: [A-Za-z0-9_.-] only, never hidden or an option (no leading `.`
    or `-`), at most 100 characters, unique among the signatures written."""
    stem = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in name)[:100]
    stem = stem if stem[:1].isalnum() or stem[:1] == "_" else "_" + stem
    unique, n = stem, 1
    while unique in taken:
        n += 1
        unique = f"{stem}_{n}"
    taken.add(unique)
    return unique


def _comment(text: str) -> str:
    """`text` for a one-line shell comment: JSON-quoted, so no newline (or anything else) ends the comment."""
    return json.dumps(text)


_PROTO_MODULES = {"Predict": ("predict_pb2", "PredictRequest"),
                  "Classify": ("classification_pb2", "ClassificationRequest"),
                  "Regress": ("regression_pb2", "RegressionRequest")}


def _receive_limit(sample: dict) -> tuple[int | None, str]:
    """(the receive limit the sample's answer needs, in bytes, or None: a default client's does; a comment line
    on how many rows a default client receives). A row's bytes come from the signature (serving/messages.py)."""
    per_row = sample.get("answer_row_bytes")
    if not per_row:
        return None, ""
    rows = CLIENT_MAX_RECEIVE // per_row
    note = (f"# A row adds at least {per_row:,} bytes to the answer: a default gRPC client (4 MiB) receives at most "
            f"{rows:,} row{'s' if rows != 1 else ''}; raise {RECEIVE_OPTION} for more.\n")
    if per_row < CLIENT_MAX_RECEIVE:
        return None, note
    return -(-(per_row + 2**16) // 2**20) * 2**20, note  # one row, its framing, rounded up to whole MiB


def _python_client(name: str, sample: dict, grpc_json: str, grpc_address: str) -> str:
    """A Python gRPC client for one signature: the request from NAME.grpc.json, the channel option set where the
    answer needs more than a default client receives."""
    module, message = _PROTO_MODULES[sample["grpc_method"]]
    limit, note = _receive_limit(sample)
    options = f'[("{RECEIVE_OPTION}", {limit // 2**20} * 1024 * 1024)]' if limit else "[]"
    return ("#!/usr/bin/env python3\n"
            f"# TF Serving gRPC API, signature {_comment(name)} ({sample['api']}). Needs grpcio and "
            "tensorflow-serving-api.\n"
            + note +
            "import os\n\nimport grpc\nfrom google.protobuf import json_format\n"
            f"from tensorflow_serving.apis import {module}, prediction_service_pb2_grpc\n\n"
            "here = os.path.dirname(os.path.abspath(__file__))\n"
            f"with open(os.path.join(here, {json.dumps(grpc_json)})) as f:\n"
            f"    request = json_format.Parse(f.read(), {module}.{message}())\n"
            f"options = {options}\n"
            f"with grpc.insecure_channel(os.environ.get(\"GRPC_ADDRESS\", {json.dumps(grpc_address)}), "
            "options=options) as channel:\n"
            f"    response = prediction_service_pb2_grpc.PredictionServiceStub(channel).{sample['grpc_method']}("
            "request, timeout=60)\n"
            "print(json_format.MessageToJson(response))\n")


def write_request_samples(out_dir: str | Path, samples: dict[str, dict], model_name: str,
                          rest_address: str = "localhost:8501", grpc_address: str = "localhost:8500") -> list[Path]:
    """NAME.rest.json + NAME.curl.sh, NAME.grpc.json + NAME.grpcurl.sh and NAME.grpc.py per signature; returns the
    paths. An answer bigger than a default gRPC client receives gets grpcurl's -max-msg-sz and the Python
    client's channel option.

    Signature keys and the model name come from the model, which may be anyone's: every value that reaches a
    script is quoted for the shell (shlex.quote) or JSON-quoted inside a comment, and file names are sanitised.
    """
    for address in (rest_address, grpc_address):
        if not _ADDRESS.fullmatch(address):
            raise ValueError(f"not a HOST:PORT address: {address!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written, taken = [], set()
    for name, sample in sorted(samples.items()):
        stem = _file_stem(name, taken)
        rest_json = out / f"{stem}.rest.json"
        rest_json.write_text(json.dumps(sample["rest_body"], indent=2) + "\n")
        path = f"/v1/models/{model_name}:{sample['rest_verb']}"  # not %-encoded: TF Serving matches the raw path
        url = f'"http://${{REST_ADDRESS:-{rest_address}}}"{shlex.quote(path)}'
        curl = out / f"{stem}.curl.sh"
        curl.write_text("#!/bin/sh\n# TF Serving REST API, signature "
                        f"{_comment(name)} ({sample['api']})\ncd \"$(dirname \"$0\")\"\n"
                        f"curl -sS -X POST {url} -H 'Content-Type: application/json' "
                        f"-d @{shlex.quote(rest_json.name)}\n")
        curl.chmod(0o755)
        grpc_json = out / f"{stem}.grpc.json"
        grpc_json.write_text(json.dumps(sample["grpc_body"], indent=2) + "\n")
        grpcurl = out / f"{stem}.grpcurl.sh"
        limit, note = _receive_limit(sample)
        grpcurl.write_text(
            "#!/bin/sh\n# TF Serving gRPC API, signature "
            f"{_comment(name)} ({sample['api']}). TF Serving has no server reflection: point PROTO_ROOT at a checkout\n"
            "# of tensorflow/serving and tensorflow/tensorflow's protos (both under one include root).\n"
            + note.replace(RECEIVE_OPTION, "-max-msg-sz") +
            "cd \"$(dirname \"$0\")\"\n"
            f"grpcurl -plaintext{f' -max-msg-sz {limit}' if limit else ''} -import-path \"${{PROTO_ROOT:-.}}\" "
            f"-proto tensorflow_serving/apis/prediction_service.proto -d @ \"${{GRPC_ADDRESS:-{grpc_address}}}\" "
            f"tensorflow.serving.PredictionService/{sample['grpc_method']} < {shlex.quote(grpc_json.name)}\n")
        grpcurl.chmod(0o755)
        client = out / f"{stem}.grpc.py"
        client.write_text(_python_client(name, sample, grpc_json.name, grpc_address))
        client.chmod(0o755)
        written += [rest_json, curl, grpc_json, grpcurl, client]
    return written
