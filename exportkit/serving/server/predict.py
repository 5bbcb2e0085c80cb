"""Predict (servables/tensorflow/predict_util.cc): check the request against the signature, run, answer."""
from __future__ import annotations

import grpc
import numpy as np

from exportkit.savedmodel.signature_defs import signature_names
from exportkit.signature_constants import CLASSIFY_METHOD, DEFAULT_SIGNATURE, PREDICT_METHOD, REGRESS_METHOD
from exportkit.serving.server.status import RpcError
from exportkit.serving.server.util import fill_model_spec, timed_run


def predict(core, request):
    """TensorflowPredictor::Predict: the servable the request names, then RunPredict."""
    return run_predict(core.servable_for(request.model_spec), request)


def run_predict(servable, request):
    from tensorflow_serving.apis import predict_pb2

    from exportkit.serving.tensors import to_field_tensor_proto, to_ndarray

    signature_name = request.model_spec.signature_name or DEFAULT_SIGNATURE
    signature = servable.model.signatures.get(signature_name)
    if signature is None:
        # TF Serving: FAILED_PRECONDITION (predict_util.cc), not NOT_FOUND; its text, then what there is.
        raise RpcError(grpc.StatusCode.FAILED_PRECONDITION,
                       f'Serving signature key "{signature_name}" not found. '
                       f"Available: {signature_names(servable.model.signatures)}")

    if servable.method_name_check and signature.method_name not in (PREDICT_METHOD, CLASSIFY_METHOD, REGRESS_METHOD):
        raise RpcError(grpc.StatusCode.INTERNAL,  # predict_util.cc VerifySignature
                       f"Expected prediction signature method_name to be one of {{{PREDICT_METHOD}, "
                       f"{CLASSIFY_METHOD}, {REGRESS_METHOD}}}. Was: {signature.method_name}")
    sent, expected = set(request.inputs), set(signature.inputs)
    # VerifyRequestInputsSize: names are checked by count only when the signature has defaults.
    if len(sent) > len(expected) or (len(sent) < len(expected) and not signature.defaults):
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                       f"input size does not match signature: {len(sent)}!={len(expected)} "
                       f"len({{{','.join(sorted(sent))}}}) != len({{{','.join(sorted(expected))}}}). "
                       f"Sent extra: {{{','.join(sorted(sent - expected))}}}. "
                       f"Missing but required: {{{','.join(sorted(expected - sent))}}}.")
    feed_names, arrays = [], []
    for key in sorted(sent):
        if key not in signature.inputs:  # saved_model::GetInputValues (tensorflow/cc/saved_model/util.cc)
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"input tensor alias not found in signature: {key}. Inputs expected to be in the set "
                           f"{{{','.join(sorted(expected))}}}.")
        try:
            value = to_ndarray(request.inputs[key])
        except Exception as err:  # noqa: BLE001 — a malformed TensorProto is the caller's fault
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"tensor parsing error: {key}: {err}") from None
        # No shape or dtype check against the TensorInfo: TF Serving feeds the tensor and the session decides
        # (predict_util.cc PreProcessPrediction checks names and count only).
        feed_names.append(signature.inputs[key].name)
        arrays.append(value)
    for key, default in signature.defaults.items():
        if key not in sent:
            feed_names.append(signature.inputs[key].name)
            arrays.append(to_ndarray(default))

    keys = list(request.output_filter)
    for key in keys:
        if key not in signature.outputs:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"output tensor alias not found in signature: {key} Outputs expected to be in the set "
                           f"{{{','.join(sorted(signature.outputs))}}}.")
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"duplicate output tensor alias: {dup}")
    keys = keys or list(signature.outputs)
    values = timed_run(servable, request.model_spec.name, "Predict", feed_names, arrays,
                       [signature.outputs[k].name for k in keys])

    response = predict_pb2.PredictResponse()
    fill_model_spec(response.model_spec, servable, signature_name, name=request.model_spec.name)
    for key, value in zip(keys, values):
        response.outputs[key].CopyFrom(to_field_tensor_proto(np.asarray(value)))
    return response
