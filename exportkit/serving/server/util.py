"""Helpers the tf.Example APIs share (servables/tensorflow/util.cc): the serialized-Example input tensor, one
Session.run over it, the response's ModelSpec, and the type/shape spellings TF Serving's messages use."""
from __future__ import annotations

import time

import grpc
import numpy as np

from exportkit.signature_constants import CLASSIFY_METHOD, DEFAULT_SIGNATURE
from exportkit.serving.server.status import RpcError


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


def timed_run(servable, model_name: str, api: str, feed_names: list[str], arrays: list, fetch_names: list[str]):
    """servable.run, recorded as RecordRuntimeLatency(model, api, "TF1") when monitoring is on (predict_util.cc)."""
    started = time.monotonic()
    values = servable.run(feed_names, arrays, fetch_names)
    if getattr(servable, "metrics", None) is not None:
        servable.metrics.runtime(model_name, api, (time.monotonic() - started) * 1e6)
    return values


def run_examples(servable, input_proto, input_tensors: list[str], output_names: list[str],
                 model_name: str = "", api: str = "") -> tuple[int, dict]:
    """Feed the serialized Examples to every input tensor; fetch `output_names` (tensor names)."""
    examples = serialized_examples(input_proto)
    values = timed_run(servable, model_name, api, list(input_tensors), [examples] * len(input_tensors),
                       list(output_names))
    return len(examples), dict(zip(output_names, values))


def fill_model_spec(spec, servable, signature_name: str, name: str | None = None) -> None:
    """util.cc MakeModelSpec: the request's name, the signature (default when empty), the served version."""
    spec.name = name or servable.name
    spec.signature_name = signature_name or DEFAULT_SIGNATURE
    spec.version.value = servable.version


def signature_text(signature) -> str:
    return str(signature).replace("\n", " ").strip()


def shape_text(value: np.ndarray) -> str:
    return "[" + ",".join(str(d) for d in value.shape) + "]"


def dt_name(value: np.ndarray) -> str:
    return "DT_STRING" if value.dtype == object else "DT_" + {"float64": "DOUBLE", "float32": "FLOAT", "float16": "HALF"}.get(
        value.dtype.name, value.dtype.name.upper())


def run_example_method(servable, request, response, method: str, preprocess, output_names, input_key: str,
                       postprocess):
    """Classify and Regress (classifier.cc, regressor.cc): check the signature, feed the Examples to its one
    input, run once, and turn the outputs into the method's result."""
    name = request.model_spec.signature_name or DEFAULT_SIGNATURE
    signature = servable.model.signatures.get(name)
    if signature is None:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"No signature was found with the name: {name}")
    if servable.method_name_check and signature.method_name != method:  # classifier.cc / regressor.cc
        what = "classification" if method == CLASSIFY_METHOD else "regression"
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                       f"Expected {what} signature method_name to be {method}. Was: {signature.method_name}")
    preprocess(signature)  # TF Serving's default: no method-name check, the structural one instead
    n, values = run_examples(servable, request.input, [signature.inputs[input_key].name], output_names(signature),
                             request.model_spec.name, "Classify" if method == CLASSIFY_METHOD else "Regress")
    fill_model_spec(response.model_spec, servable, request.model_spec.signature_name)
    postprocess(signature, n, values, response.result)
    return response
