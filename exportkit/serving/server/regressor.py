"""Regress (servables/tensorflow/regressor.cc): serialized Examples in, one float per Example out."""
from __future__ import annotations

import grpc
import numpy as np

from exportkit.signature_constants import REGRESS_INPUTS, REGRESS_METHOD, REGRESS_OUTPUTS
from exportkit.serving.server.status import RpcError
from exportkit.serving.server.util import dt_name, run_example_method, shape_text, signature_text


def regress(core, request):
    """RunRegress: the servable the request names, then the signature's regression."""
    return run_regress(core.servable_for(request.model_spec), request)


def run_regress(servable, request):
    from tensorflow_serving.apis import regression_pb2

    return run_example_method(servable, request, regression_pb2.RegressionResponse(), REGRESS_METHOD,
                              preprocess_regression, regression_output_names, REGRESS_INPUTS, postprocess_regression)


def preprocess_regression(signature) -> None:
    refusal = regression_refusal(signature.inputs, signature.outputs, signature)
    if refusal:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, refusal)


def regression_refusal(inputs, outputs, signature=None) -> str | None:
    """regressor.cc PreProcessRegression's refusal of a signature with these input and output keys (None: Regress
    answers on it). Given the SignatureDef, the message ends with its text, as the server's does."""
    if len(inputs) != 1:
        return "Expected one input Tensor."
    if len(outputs) != 1:
        return "Expected one output Tensor."
    shown = f": {signature_text(signature)}" if signature else ""
    if REGRESS_INPUTS not in inputs:
        return f"No regression inputs found in SignatureDef{shown}"
    if REGRESS_OUTPUTS not in outputs:
        return f"No regression outputs found in SignatureDef{shown}"
    return None


def regression_output_names(signature) -> list[str]:
    return [signature.outputs[REGRESS_OUTPUTS].name]


def postprocess_regression(signature, n: int, values: dict, result) -> None:
    """regressor.cc PostProcessRegressionResult: one float per example, [batch] or [batch, 1]."""
    value = np.asarray(values[signature.outputs[REGRESS_OUTPUTS].name])
    if not (value.ndim == 1 or (value.ndim == 2 and value.shape[1] == 1)):
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                       f"Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got "
                       f"{shape_text(value)}")
    if value.shape[0] != n:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                       f"Input batch size did not match output batch size: {n} vs. {value.shape[0]}")
    if value.dtype != np.float32:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"Expected output Tensor of DT_FLOAT.  Got: {dt_name(value)}")
    for v in value.reshape(-1):
        result.regressions.add().value = float(v)
