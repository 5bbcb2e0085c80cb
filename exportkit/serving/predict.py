"""Predict (servables/tensorflow/predict_util.cc): check the request against the signature, run, answer."""
from __future__ import annotations

import grpc
import numpy as np

from exportkit.savedmodel import DEFAULT_SIGNATURE, dtype_name, shape_list, signature_names
from exportkit.serving.status import RpcError, grpc_code
from exportkit.tfenv import import_tf


def predict(core, request):
    """TensorflowPredictor::Predict: the servable the request names, then RunPredict."""
    return run_predict(core.servable_for(request.model_spec), request)


def run_predict(servable, request):
    from tensorflow_serving.apis import predict_pb2

    from exportkit.serving.tensors import to_ndarray, to_tensor_proto

    tf = import_tf()
    signature_name = request.model_spec.signature_name or DEFAULT_SIGNATURE
    signature = servable.model.signatures.get(signature_name)
    if signature is None:
        # TF Serving: FAILED_PRECONDITION (predict_util.cc), not NOT_FOUND.
        raise RpcError(grpc.StatusCode.FAILED_PRECONDITION,
                       f'Serving signature key "{signature_name}" not found. '
                       f"Available: {signature_names(servable.model.signatures)}")

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
        outputs = servable.model.run(signature_name, feed, output_keys=keys or None)
    except tf.errors.OpError as err:
        raise RpcError(grpc_code(err.error_code), err.message) from None
    except Exception as err:  # noqa: BLE001
        raise RpcError(grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}") from None

    response = predict_pb2.PredictResponse()
    response.model_spec.name = servable.name
    response.model_spec.version.value = servable.version
    response.model_spec.signature_name = signature_name
    for key, value in outputs.items():
        response.outputs[key].CopyFrom(to_tensor_proto(np.asarray(value)))
    return response
